//! Tatashin's 2021 loop devices: a lock per device instead of one control lock.
//!
//! Two lines: the locks (the boot's lock wait against the prepatch design at 2, 8 and 64
//! tasks, and control-lock acquisitions per open/close and configure/clear), and the
//! speed (the open/close storm on own devices from 1 to 2 tasks, block I/O against
//! `pread` on the backing file).

use super::{metric, skip_reason, task_counts, Finding, Status, Targets};
use crate::experiment::Experiment;
use crate::measure::Target;
use crate::result::{Metric, Report};
use crate::stats::Ratio;
use crate::units::{self, Unit};

const W: &str = "loop";
const EXPERIMENT: Experiment = Experiment::LoopLock;

/// The experiment's lines (none when the run has no loop rows).
pub fn findings(report: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Some(f) = locks(report) {
        out.push(f);
    }
    if let Some(f) = speed(report) {
        out.push(f);
    }
    if out.is_empty() {
        if let Some(why) = skip_reason(report, W, Target::Library) {
            out.push(Finding {
                experiment: EXPERIMENT,
                text: "loop devices on the library".into(),
                status: Status::Skipped(why),
            });
        }
    }
    out
}

/// A counter per operation: `0`, `2`, `1.83`.
fn plain(x: f64) -> String {
    let s = units::format(x, Unit::Plain);
    match s.strip_suffix(".00") {
        Some(whole) => whole.to_string(),
        None => s,
    }
}

fn mean(report: &Report, target: Target, mode: &str, n: usize, m: &Metric) -> Option<f64> {
    metric(report, W, target, mode, n, m).map(|s| s.mean)
}

/// Boot lock wait (library ≤ 1/10 of prepatch at 2, 8 and 64 tasks, prepatch's > 0) and
/// control-lock acquisitions per operation (0 for open/close and configure/clear on the
/// library, ≥ 1 prepatch).
fn locks(report: &Report) -> Option<Finding> {
    let wait = Metric::LOCK_WAIT_SEC;
    let mut t = Targets::new();
    let mut parts = Vec::new();
    let boot_tasks: Vec<usize> = task_counts(report, W, Target::Library, "boot")
        .into_iter()
        .filter(|n| mean(report, Target::LibraryPrepatch, "boot", *n, wait).is_some())
        .collect();
    if !boot_tasks.is_empty() {
        let (mut lib, mut pre) = (Vec::new(), Vec::new());
        for &n in &boot_tasks {
            let (Some(l), Some(p)) = (
                mean(report, Target::Library, "boot", n, wait),
                mean(report, Target::LibraryPrepatch, "boot", n, wait),
            ) else {
                continue;
            };
            lib.push(units::format(l, Unit::Seconds));
            pre.push(units::format(p, Unit::Seconds));
            if [2, 8, 64].contains(&n) {
                t.check(p > 0.0, format!("prepatch boot wait 0 at {n} tasks"));
                t.check(
                    l <= p / 10.0,
                    format!("boot wait at {n} tasks above 1/10 of prepatch's"),
                );
            }
        }
        let devices = mean(report, Target::Library, "boot", boot_tasks[0], Metric::DEVICES).unwrap_or(0.0);
        if lib.iter().all(|l| l == "0 s") {
            lib = vec!["0 s".to_string()];
        }
        parts.push(format!(
            "boot, {devices} devices × {} tasks: lock wait/boot {} (prepatch {})",
            slashed(&boot_tasks),
            slashed(&lib),
            slashed(&pre)
        ));
    }
    let ctl = Metric::CTL_LOCK_ACQUISITIONS_PER_OP;
    let mut acq = Vec::new();
    for (mode, what) in [("open-close", "open-close"), ("configure", "configure")] {
        let counts = task_counts(report, W, Target::Library, mode);
        let lib: Vec<f64> = counts
            .iter()
            .filter_map(|&n| mean(report, Target::Library, mode, n, ctl))
            .collect();
        if lib.is_empty() {
            continue;
        }
        let lib_max = lib.iter().copied().fold(0.0, f64::max);
        t.check(lib_max == 0.0, format!("{what} takes the control lock"));
        let pre: Vec<f64> = task_counts(report, W, Target::LibraryPrepatch, mode)
            .iter()
            .filter_map(|&n| mean(report, Target::LibraryPrepatch, mode, n, ctl))
            .collect();
        let mut s = format!("{what} {}", plain(lib_max));
        if let Some(p) = pre.iter().copied().reduce(f64::min) {
            t.check(p >= 1.0, format!("prepatch {what} under 1 control lock per op"));
            s.push_str(&format!(" (prepatch {})", plain(p)));
        }
        acq.push(s);
    }
    if !acq.is_empty() {
        parts.push(format!("ctl-lock/op {}", acq.join(", ")));
    }
    finding("loop", parts, t)
}

/// The line of `parts`, or none.
fn finding(prefix: &str, parts: Vec<String>, t: Targets) -> Option<Finding> {
    if parts.is_empty() {
        return None;
    }
    Some(Finding {
        experiment: EXPERIMENT,
        text: format!("{prefix} {}", parts.join("; ")),
        status: t.status(),
    })
}

/// `1/2/8/64`.
fn slashed<T: ToString>(v: impl IntoIterator<Item = T>) -> String {
    v.into_iter().map(|x| x.to_string()).collect::<Vec<_>>().join("/")
}

/// The open/close storm on own devices from 1 to 2 tasks (≥ 1.8×, the kernel's beside
/// it) and reads through the library at ≥ 90% of `pread` on the backing file.
fn speed(report: &Report) -> Option<Finding> {
    let rate = Metric::OPS_PER_SEC;
    let mut t = Targets::new();
    let mut parts = Vec::new();
    let scaling = |target: Target| {
        let (one, two) = (
            metric(report, W, target, "open-close", 1, rate)?,
            metric(report, W, target, "open-close", 2, rate)?,
        );
        Some(Ratio::unpaired(rate, two, one))
    };
    if let Some(r) = scaling(Target::Library) {
        t.check(
            r.value >= 1.8,
            format!("2 tasks/1 task {} (target ≥ 1.8×)", units::format_ratio(r.value)),
        );
        let mut s = format!("open-close 1→2 tasks {}", units::format_ratio_paren(&r));
        if let Some(k) = scaling(Target::Kernel) {
            s.push_str(&format!(" (kernel {})", units::format_ratio(k.value)));
        }
        parts.push(s);
    }
    let io: Vec<(usize, f64)> = task_counts(report, W, Target::Library, "io")
        .into_iter()
        .filter_map(|n| {
            let dev = mean(report, Target::Library, "io", n, rate)?;
            let direct = mean(report, Target::Library, "io", n, Metric::DIRECT_OPS_PER_SEC)?;
            Some((n, dev / direct))
        })
        .collect();
    if !io.is_empty() {
        for &(n, r) in &io {
            t.check(
                r >= 0.9,
                format!("io at {n} tasks {:.1}% of pread (target ≥ 90%)", r * 100.0),
            );
        }
        parts.push(format!(
            "io {} of pread at {} tasks",
            slashed(io.iter().map(|(_, r)| format!("{:.1}%", r * 100.0))),
            slashed(io.iter().map(|(n, _)| n))
        ));
    }
    finding("loop library:", parts, t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::{Meta, Metric, Row, Summary};

    fn meta() -> Meta {
        Meta {
            nproc: 2,
            kernel: String::new(),
            commit: String::new(),
            date: String::new(),
            command: String::new(),
        }
    }

    /// Adds metrics to the row of (target, mode, tasks), making it if needed.
    fn put(rows: &mut Vec<Row>, target: Target, mode: &str, tasks: usize, metrics: &[(&Metric, &[f64])]) {
        let i = match rows
            .iter()
            .position(|r| r.target == target && r.mode == mode && r.tasks == tasks)
        {
            Some(i) => i,
            None => {
                rows.push(Row::new(W, target, mode, tasks));
                rows.len() - 1
            }
        };
        for (k, v) in metrics {
            rows[i].metrics.insert(k.to_string().into(), Summary::of(k, v));
        }
    }

    fn report(lib_wait: f64, two_tasks: f64, io: f64) -> Report {
        let mut rows = Vec::new();
        for n in [2, 8, 64] {
            put(
                &mut rows,
                Target::Library,
                "boot",
                n,
                &[(Metric::LOCK_WAIT_SEC, &[lib_wait]), (Metric::DEVICES, &[69.0])],
            );
            put(
                &mut rows,
                Target::LibraryPrepatch,
                "boot",
                n,
                &[(Metric::LOCK_WAIT_SEC, &[1e-3])],
            );
        }
        for mode in ["open-close", "configure"] {
            put(
                &mut rows,
                Target::Library,
                mode,
                1,
                &[(Metric::CTL_LOCK_ACQUISITIONS_PER_OP, &[0.0])],
            );
            put(
                &mut rows,
                Target::LibraryPrepatch,
                mode,
                1,
                &[(Metric::CTL_LOCK_ACQUISITIONS_PER_OP, &[2.0])],
            );
        }
        put(
            &mut rows,
            Target::Library,
            "open-close",
            1,
            &[(Metric::OPS_PER_SEC, &[1e6, 1e6])],
        );
        put(
            &mut rows,
            Target::Library,
            "open-close",
            2,
            &[(Metric::OPS_PER_SEC, &[two_tasks, two_tasks])],
        );
        put(
            &mut rows,
            Target::Library,
            "io",
            1,
            &[
                (Metric::OPS_PER_SEC, &[io * 1e6]),
                (Metric::DIRECT_OPS_PER_SEC, &[1e6]),
            ],
        );
        Report {
            meta: meta(),
            results: rows,
            skipped: Vec::new(),
        }
    }

    #[test]
    fn the_targets_are_checked() {
        let f = findings(&report(0.0, 1.9e6, 0.95));
        assert_eq!(f.len(), 2, "{f:?}");
        assert_eq!(f[0].status, Status::Met, "{}", f[0].line());
        assert_eq!(f[1].status, Status::Met, "{}", f[1].line());
        assert!(
            f[0].text.contains("boot, 69 devices × 2/8/64 tasks"),
            "{}",
            f[0].text
        );
        assert!(
            f[0].text.contains("ctl-lock/op open-close 0 (prepatch 2)"),
            "{}",
            f[0].text
        );

        let f = findings(&report(1e-3, 1.2e6, 0.5));
        let Status::Missed(m) = &f[0].status else {
            panic!("{}", f[0].line())
        };
        assert_eq!(m.len(), 3, "{m:?}");
        let Status::Missed(m) = &f[1].status else {
            panic!("{}", f[1].line())
        };
        assert_eq!(m.len(), 2, "{m:?}");
    }

    #[test]
    fn no_rows_no_lines() {
        let empty = Report {
            meta: meta(),
            results: Vec::new(),
            skipped: Vec::new(),
        };
        assert!(findings(&empty).is_empty());
    }
}
