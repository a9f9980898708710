//! What a run found, one line per experiment, before any table: the answer to the
//! question its upstream kernel change raised, with its targets checked.
//!
//! Each experiment has its own module reading a [`Report`] and returning [`Finding`]s;
//! nothing here measures. A finding states the figures (ratios in `×`, with their error),
//! and its [`Status`] says whether the experiment's targets were met, missed (and which),
//! could not be judged because a difference is not significant, or could not run.

use crate::experiment::Experiment;
use crate::measure::Target;
use crate::result::{Metric, Report, Row, Summary};
use crate::stats::Ratio;
use crate::units;

mod cluster;
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
    out.extend(cluster::findings(report));
    out
}

// ---------------------------------------------------------------------------------------
// What the experiment modules share

/// The row of one configuration.
pub fn row<'a>(
    report: &'a Report,
    workload: &str,
    target: Target,
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
    target: Target,
    mode: &str,
    tasks: usize,
    name: &Metric,
) -> Option<&'a Summary> {
    row(report, workload, target, mode, tasks)?.metrics.get(name)
}

/// The task counts measured for `workload` in `mode` on `target`, sorted.
pub fn task_counts(report: &Report, workload: &str, target: Target, mode: &str) -> Vec<usize> {
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
pub fn skip_reason(report: &Report, workload: &str, target: Target) -> Option<String> {
    report
        .skipped
        .iter()
        .find(|s| s.workload == workload && s.target == target)
        .map(|s| s.reason.clone())
}

/// A metric's mean in its unit: `12.6 M/s`.
pub fn show(name: &Metric, s: &Summary) -> String {
    units::format(s.mean, name.unit())
}

/// The control that shares nothing, where a workload has one: each task its own table
/// (inodes) or its own lock manager (lockperf's file-per-task workloads), measured in the
/// same run as `library`.
pub const CONTROL: Target = Target::Partitioned;

/// A scaling target: `library`'s rate at N tasks is at least this share of the
/// control's. Judging against a control measured in the same run, rather than against a
/// fixed N/1 ratio, keeps the machine out of the verdict: two shared vCPUs give tasks that
/// share nothing anywhere from 1.4× to 2.2×.
pub const MIN_OF_CONTROL: f64 = 0.85;

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
    /// ([`Ratio::against_bound`]); for a bound of 1 it is `r`'s own `p`, which already tests
    /// the difference from 1 (paired, where the caller paired the runs).
    pub fn check_ratio(&mut self, r: &Ratio, bound: f64, above: bool, what: &str) {
        self.any = true;
        let r = &if bound == 1.0 { *r } else { r.against_bound(bound) };
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
