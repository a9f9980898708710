//! What a run found, one line per experiment, before any table: the answer to the
//! question its upstream kernel change raised, with its targets checked.
//!
//! Each experiment has its own module reading a [`Report`] and returning [`Finding`]s;
//! nothing here measures. A finding states the figures (ratios in `×`, with their error),
//! and its [`Status`] says whether the experiment's targets were met, missed (and which),
//! could not be judged because a difference is not significant, or could not run.

use crate::compare;
use crate::experiment::Experiment;
use crate::export::units::{self, Unit};
use crate::result::{Report, Row, Summary};

mod fd;
mod inodes;
mod lockmany;
mod locks;
mod loop_dev;

/// How a finding stands against its targets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// Every target of the line is met.
    Met,
    /// These targets are missed.
    Missed(Vec<String>),
    /// A difference the line depends on is not significant (p ≥ 0.05).
    NotSignificant(Vec<String>),
    /// The line reports figures without a target.
    Info,
    /// The experiment (or the part of it the line needs) could not run here.
    Skipped(String),
}

impl Status {
    /// The mark printed before the line.
    pub fn mark(&self) -> &'static str {
        match self {
            Status::Met => "✓",
            Status::Missed(_) => "✗",
            Status::NotSignificant(_) => "~",
            Status::Info => "·",
            Status::Skipped(_) => "–",
        }
    }

    /// What follows the line: the missed targets, the insignificant differences, or why
    /// it was skipped.
    pub fn note(&self) -> Option<String> {
        match self {
            Status::Missed(v) => Some(format!("missed: {}", v.join("; "))),
            Status::NotSignificant(v) => Some(format!("not significant: {}", v.join("; "))),
            Status::Skipped(why) => Some(format!("skipped: {why}")),
            Status::Met | Status::Info => None,
        }
    }
}

/// One line of the headline.
#[derive(Clone, Debug, PartialEq)]
pub struct Finding {
    /// The experiment the line belongs to.
    pub experiment: Experiment,
    /// The line: `herd flock, 1000 contenders: library 25.9× kernel (± 4.1), ...`.
    pub text: String,
    /// How it stands.
    pub status: Status,
}

impl Finding {
    /// The finding as one line of text: mark, experiment, text and the status note.
    pub fn line(&self) -> String {
        let mut s = format!(
            "{} {}: {}",
            self.status.mark(),
            self.experiment.label(),
            self.text
        );
        if let Some(note) = self.status.note() {
            s.push_str(" — ");
            s.push_str(&note);
        }
        s
    }
}

/// The legend of the marks.
pub const LEGEND: &str = "✓ targets met, ✗ missed, ~ not significant, · no target, – skipped";

/// Every finding of `report`, in [`Experiment::ALL`]'s order.
pub fn findings(report: &Report) -> Vec<Finding> {
    let mut out = Vec::new();
    out.extend(locks::lockperf(report));
    out.extend(fd::findings(report));
    out.extend(inodes::findings(report));
    out.extend(locks::herd(report));
    out.extend(loop_dev::findings(report));
    out.extend(lockmany::findings(report));
    out
}

// ---------------------------------------------------------------------------------------
// What the experiment modules share

/// The row of one configuration.
pub fn row<'a>(
    report: &'a Report,
    workload: &str,
    target: &str,
    mode: &str,
    tasks: usize,
) -> Option<&'a Row> {
    report
        .results
        .iter()
        .find(|r| r.workload == workload && r.target == target && r.mode == mode && r.tasks == tasks)
}

/// A metric of one configuration.
pub fn metric<'a>(
    report: &'a Report,
    workload: &str,
    target: &str,
    mode: &str,
    tasks: usize,
    name: &str,
) -> Option<&'a Summary> {
    row(report, workload, target, mode, tasks)?.metrics.get(name)
}

/// The task counts measured for `workload` in `mode` on `target`, sorted.
pub fn task_counts(report: &Report, workload: &str, target: &str, mode: &str) -> Vec<usize> {
    let mut v: Vec<usize> = report
        .results
        .iter()
        .filter(|r| r.workload == workload && r.target == target && r.mode == mode)
        .map(|r| r.tasks)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Why `workload` did not run on `target`, if it was skipped.
pub fn skip_reason(report: &Report, workload: &str, target: &str) -> Option<String> {
    report
        .skipped
        .iter()
        .find(|s| s.workload == workload && s.target == target)
        .map(|s| s.reason.clone())
}

/// `a / b` of one metric, with its error and whether the two differ significantly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ratio {
    /// `ā / b̄`.
    pub value: f64,
    /// Its propagated standard error.
    pub error: f64,
    /// Welch's two-sided p-value (NaN with fewer than two samples a side).
    pub p: f64,
}

impl Ratio {
    /// `a / b`, compared on metric `name`.
    pub fn of(name: &str, a: &Summary, b: &Summary) -> Ratio {
        let c = compare::compare_metric("", name, b, a);
        Ratio {
            value: c.ratio,
            error: c.ratio_error,
            p: c.p_value,
        }
    }

    /// Whether the difference is significant (p < 0.05; a single sample a side is
    /// taken at face value).
    pub fn significant(&self) -> bool {
        self.p.is_nan() || self.p < compare::SIGNIFICANCE
    }

    /// `25.9× (± 4.1)`.
    pub fn text(&self) -> String {
        if self.error.is_finite() && self.error > 0.0 {
            format!(
                "{} (± {})",
                units::format_ratio(self.value),
                units::plain(self.error, units::ERROR_DIGITS)
            )
        } else {
            units::format_ratio(self.value)
        }
    }
}

/// `a / b` of two rows' metrics paired run by run: `bench` interleaves the runs of the
/// workloads whose targets are ratios between rows (inodes, herd, lockmany: run i of
/// every configuration and target, one after the other), so run i of `a` and of `b`
/// saw the same state of the machine, and the ratio of each pair cancels a drift both saw
/// (on a shared 2-core machine another job's load moved every target's rates by up to
/// ×2 from one run to the next, burying a 10–20% difference in an unpaired test). The
/// value is the geometric mean of the per-run ratios; `error` its standard error
/// (first order from the logs' spread); `p` a two-sided one-sample t-test of the mean log
/// ratio against 0. `None` unless both sides have the same number (≥ 2) of positive
/// samples; the caller then compares the means unpaired ([`Ratio::of`]).
pub fn paired(a: &Summary, b: &Summary) -> Option<Ratio> {
    let n = a.samples.len();
    if n < 2
        || b.samples.len() != n
        || a.samples
            .iter()
            .chain(&b.samples)
            .any(|x| !x.is_finite() || *x <= 0.0)
    {
        return None;
    }
    let logs: Vec<f64> = a
        .samples
        .iter()
        .zip(&b.samples)
        .map(|(x, y)| (x / y).ln())
        .collect();
    let m = crate::stats::mean(&logs);
    let se = crate::stats::stddev(&logs) / (n as f64).sqrt();
    let value = m.exp();
    let p = if se > 0.0 {
        let t = statrs::distribution::StudentsT::new(0.0, 1.0, (n - 1) as f64).ok()?;
        use statrs::distribution::ContinuousCDF;
        (2.0 * t.sf((m / se).abs())).min(1.0)
    } else if m == 0.0 {
        1.0
    } else {
        0.0
    };
    Some(Ratio {
        value,
        error: value * se,
        p,
    })
}

impl Ratio {
    /// `a / b` paired run by run where the rows allow it ([`paired`]), else compared
    /// unpaired ([`Ratio::of`]).
    pub fn paired_or_of(name: &str, a: &Summary, b: &Summary) -> Ratio {
        paired(a, b).unwrap_or_else(|| Ratio::of(name, a, b))
    }
}

/// A metric's mean in its unit: `12.6 M/s`.
pub fn show(name: &str, s: &Summary) -> String {
    units::format(s.mean, Unit::of(name))
}

/// Collects the targets of one line and gives its [`Status`].
#[derive(Debug, Default)]
pub struct Targets {
    missed: Vec<String>,
    insignificant: Vec<String>,
    any: bool,
}

impl Targets {
    /// No targets yet.
    pub fn new() -> Targets {
        Targets::default()
    }

    /// A target: `met` or else `what` is recorded as missed.
    pub fn check(&mut self, met: bool, what: impl Into<String>) {
        self.any = true;
        if !met {
            self.missed.push(what.into());
        }
    }

    /// A target on a ratio that must exceed (`above`) or stay under a bound and be
    /// significant; a ratio on the right side whose distance from the bound is not
    /// significant is recorded as such. Significance is taken against the bound
    /// ([`against_bound`]); for a bound of 1 it is `r`'s own `p`, which already tests
    /// the difference from 1 (paired, where the caller paired the runs).
    pub fn check_ratio(&mut self, r: &Ratio, bound: f64, above: bool, what: &str) {
        self.any = true;
        let r = &if bound == 1.0 {
            *r
        } else {
            against_bound(*r, bound)
        };
        let on_side = if above { r.value >= bound } else { r.value <= bound };
        if !on_side {
            self.missed.push(format!(
                "{what} {} (target {} {})",
                units::format_ratio(r.value),
                if above { "≥" } else { "≤" },
                units::format_ratio(bound)
            ));
        } else if !r.significant() {
            self.insignificant
                .push(format!("{what} (p = {})", units::format_p(r.p)));
        }
    }

    /// The status of the line.
    pub fn status(self) -> Status {
        if !self.missed.is_empty() {
            Status::Missed(self.missed)
        } else if !self.insignificant.is_empty() {
            Status::NotSignificant(self.insignificant)
        } else if self.any {
            Status::Met
        } else {
            Status::Info
        }
    }
}

/// A report of `results` on a 2-CPU machine, for the headline tests.
#[cfg(test)]
pub(crate) fn test_report(results: Vec<Row>) -> Report {
    Report {
        meta: crate::result::Meta {
            nproc: 2,
            kernel: String::new(),
            commit: String::new(),
            date: String::new(),
            command: String::new(),
        },
        results,
        skipped: Vec::new(),
    }
}

/// `r` with its p-value taken against `bound` instead of against 1: a two-sided z-test of
/// the ratio's distance to the bound in units of its propagated error (normal
/// approximation), so a ratio that clears the bound by less than its noise is not
/// called significant, and one on the right side by more than its noise is, however
/// close to 1 it is. Every bound of a target is judged this way (`Ratio`'s own `p`
/// tests the difference from 1, which says nothing about a bound of 2 or 100). Why not
/// the mean ratio alone: at 200,000 files an inodes phase lasts 30–150 ms and a 1-task
/// run on a shared 2-core machine varies by 10–45%, so a mean ratio of 1.85 from five
/// runs each side can sit well within noise of 1.8. A single sample a side (no error)
/// is taken at face value, as [`Ratio::significant`] does.
pub fn against_bound(r: Ratio, bound: f64) -> Ratio {
    let p = if r.error.is_finite() && r.error > 0.0 && r.value.is_finite() {
        let z = (r.value - bound) / r.error;
        statrs::function::erf::erfc(z.abs() / std::f64::consts::SQRT_2)
    } else {
        f64::NAN
    };
    Ratio { p, ..r }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(samples: &[f64]) -> Summary {
        Summary::of("ops_per_sec", samples)
    }

    #[test]
    fn paired_runs_cancel_a_drift_both_saw() {
        // The machine's load halves both targets' rates in runs 3 and 4; a is 10% faster
        // in every run. Unpaired, the drift buries it; paired, it is plain.
        let a = summary(&[11.0, 11.0, 5.5, 5.5, 11.0]);
        let b = summary(&[10.0, 10.0, 5.0, 5.0, 10.0]);
        assert!(Ratio::of("ops_per_sec", &a, &b).p > 0.05);
        let r = paired(&a, &b).unwrap();
        assert!((r.value - 1.1).abs() < 1e-9 && r.p == 0.0, "{r:?}");
        // Noise that is not shared stays noise.
        let r = paired(
            &summary(&[11.0, 9.0, 10.5, 9.5]),
            &summary(&[10.0, 10.0, 10.0, 10.0]),
        )
        .unwrap();
        assert!(r.p > 0.05, "{r:?}");
        // Different run counts: no pairing.
        assert!(paired(&summary(&[1.0, 2.0]), &summary(&[1.0, 2.0, 3.0])).is_none());
    }
}
