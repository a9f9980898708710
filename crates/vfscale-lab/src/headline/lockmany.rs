//! Issue 12's `lockmany` experiment: one line per lock family, at 10,000 locks held
//! (else the most the run measured on the library), with the targets where they
//! apply: at 10,000 held the library's set+unset and test are ≥ 100× faster than the
//! kernel's and within 2× of its own time at 10 held, and a held lock costs the library
//! ≤ 128 bytes.

use super::{show, skip_reason, Finding, Ratio, Status, Targets};
use crate::export::units::{self, Unit};
use crate::result::{Report, Summary};

/// The held counts measured for `mode` on `target`, sorted.
fn held_counts(report: &Report, target: &str, mode: &str) -> Vec<u64> {
    let mut v: Vec<u64> = report
        .results
        .iter()
        .filter(|r| r.workload == "lockmany" && r.target == target && r.mode == mode)
        .filter_map(|r| r.held)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn get<'a>(report: &'a Report, target: &str, mode: &str, held: u64, m: &str) -> Option<&'a Summary> {
    report
        .results
        .iter()
        .find(|r| r.workload == "lockmany" && r.target == target && r.mode == mode && r.held == Some(held))?
        .metrics
        .get(m)
}

/// The experiment's lines.
pub fn findings(report: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    for mode in ["ofd", "posix"] {
        let counts = held_counts(report, "library", mode);
        let Some(&h) = counts.iter().find(|&&c| c == 10_000).or(counts.last()) else {
            continue;
        };
        let mut t = Targets::new();
        let mut parts = Vec::new();
        for (m, what) in [("set_unset_ns", "set+unset"), ("getlk_ns", "test")] {
            let Some(lib) = get(report, "library", mode, h, m) else {
                continue;
            };
            let mut part = format!("{what} {}", show(m, lib));
            if let Some(k) = get(report, "kernel", mode, h, m) {
                let r = Ratio::of(m, k, lib);
                part.push_str(&format!(" (kernel {} = {})", show(m, k), r.text()));
                if h == 10_000 {
                    t.check_ratio(&r, 100.0, true, &format!("{what} kernel/library"));
                }
            }
            if let Some(small) = counts.first().filter(|&&s| s < h) {
                if let Some(l0) = get(report, "library", mode, *small, m) {
                    let r = Ratio::of(m, lib, l0);
                    part.push_str(&format!(", {} its {small}-held time", r.text()));
                    if h == 10_000 && *small <= 10 {
                        t.check_ratio(&r, 2.0, false, &format!("{what} at {h}/at {small}"));
                    }
                }
            }
            parts.push(part);
        }
        if parts.is_empty() {
            continue;
        }
        let mut text = format!("lockmany {mode}, {h} held: library {}", parts.join("; "));
        if let Some(b) = get(report, "library", mode, h, "bytes_per_lock") {
            text.push_str(&format!("; {}/lock", units::format(b.mean, Unit::Bytes)));
            if let Some(k) = get(report, "kernel", mode, h, "bytes_per_lock") {
                text.push_str(&format!(" (kernel {})", units::format(k.mean, Unit::Bytes)));
            }
            t.check(
                b.mean <= 128.0,
                format!("{} per lock (target ≤ 128 B)", units::format(b.mean, Unit::Bytes)),
            );
        }
        let mut status = t.status();
        if get(report, "kernel", mode, h, "set_unset_ns").is_none() {
            if let Some(why) = skip_reason(report, "lockmany", "kernel") {
                if status == Status::Info {
                    status = Status::Skipped(format!("kernel: {why}"));
                }
            }
        }
        out.push(Finding {
            seed: "issue 12",
            text,
            status,
        });
    }
    out
}
