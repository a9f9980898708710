//! The descriptor table, after Guzik's 2015 lock-free `fd_install` (pipebench,
//! opensock, dup1).

use super::{metric, task_counts, Finding, Targets};
use crate::experiment::Experiment;
use crate::measure::Target;
use crate::result::{Metric, Report};
use crate::stats::Ratio;
use crate::units::{self, Unit};

/// One line: pipebench against the kernel at every thread count (≥ 5×), and
/// the table-lock counters (exactly 1 per install, 0 per lookup; 2 per install before
/// the upstream change).
pub fn findings(report: &Report) -> Vec<Finding> {
    let rate = Metric::OPS_PER_SEC;
    let counts = task_counts(report, "pipebench", Target::Library, "threads");
    if counts.is_empty() {
        return Vec::new();
    }
    let mut t = Targets::new();
    let mut ratios = Vec::new();
    for &n in &counts {
        let (Some(lib), Some(ker)) = (
            metric(report, "pipebench", Target::Library, "threads", n, rate),
            metric(report, "pipebench", Target::Kernel, "threads", n, rate),
        ) else {
            continue;
        };
        let r = Ratio::unpaired(rate, lib, ker);
        ratios.push(units::format_ratio(r.value));
        t.check_ratio(&r, 5.0, true, &format!("{n} threads"));
    }
    let threads: Vec<String> = counts.iter().map(|n| n.to_string()).collect();
    let mut text = if ratios.is_empty() {
        "pipebench: library only".to_string()
    } else {
        format!(
            "pipebench, {} threads: library {} the kernel's rate",
            threads.join("/"),
            ratios.join(", ")
        )
    };
    let n = *counts.last().expect("not empty");
    let c = |target, m| metric(report, "pipebench", target, "threads", n, m).map(|s| s.mean);
    if let (Some(inst), Some(look)) = (
        c(Target::Library, Metric::TABLE_LOCK_ACQUISITIONS_PER_INSTALL),
        c(Target::Library, Metric::TABLE_LOCK_ACQUISITIONS_PER_LOOKUP),
    ) {
        text.push_str(&format!(
            "; table-lock acquisitions per install {}, per lookup {}",
            units::format(inst, Unit::Plain),
            units::format(look, Unit::Plain)
        ));
        if let Some(pre) = c(
            Target::LibraryPrepatch,
            Metric::TABLE_LOCK_ACQUISITIONS_PER_INSTALL,
        ) {
            text.push_str(&format!(
                " (prepatch {} per install)",
                units::format(pre, Unit::Plain)
            ));
        }
        t.check(
            (inst - 1.0).abs() < 0.01,
            "table-lock acquisitions per install not 1",
        );
        t.check(look == 0.0, "table-lock acquisitions per lookup not 0");
    }
    vec![Finding {
        experiment: Experiment::FdInstall,
        text,
        status: t.status(),
    }]
}
