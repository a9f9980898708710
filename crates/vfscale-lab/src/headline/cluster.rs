//! The `cluster` experiment (several servers, one lock space on etcd): one line with
//! each measured mode's figures and its targets:
//!
//! * uncontended: a clustered server's rate ≥ 0.9× one server's without `--cluster`,
//!   with 0 < etcd requests per lock ≤ 0.01 (the inode is homed once, then every lock
//!   is local);
//! * pingpong: `ping_pong` across two servers ≥ 5× one client's serial etcd
//!   compare-and-swap rate, and ≥ 5,000 locks/s;
//! * failover: every run's waiter granted within the lease TTL + 1 s of the holder's
//!   server's death.

use super::{metric, skip_reason, Finding, Status, Targets};
use crate::experiment::Experiment;
use crate::measure::Target;
use crate::result::{Metric, Report, Summary};
use crate::units::{self, Unit};

const WORKLOAD: &str = "cluster";
const SERVERS: usize = 2;

/// `uncontended_ratio` at least this.
pub const MIN_UNCONTENDED_RATIO: f64 = 0.9;
/// `etcd_txns_per_lock` at most this (and above 0) in uncontended.
pub const MAX_TXNS_PER_LOCK: f64 = 0.01;
/// `locks_per_sec` at least this many times `etcd_txn_per_sec`.
pub const MIN_OVER_ETCD: f64 = 5.0;
/// `locks_per_sec` at least this (past the DLM's published 3,000/s).
pub const MIN_PINGPONG_RATE: f64 = 5_000.0;
/// `failover_sec` at most `lease_ttl_sec` plus this.
pub const FAILOVER_SLACK_SEC: f64 = 1.0;

fn get<'a>(report: &'a Report, mode: &str, name: &str) -> Option<&'a Summary> {
    metric(
        report,
        WORKLOAD,
        Target::Kernel,
        mode,
        SERVERS,
        &Metric::from(name),
    )
}

fn plain(x: f64) -> String {
    units::format(x, Unit::Plain)
}

/// The experiment's line, or why it could not run.
pub fn findings(report: &Report) -> Vec<Finding> {
    let line = |text: String, status: Status| Finding {
        experiment: Experiment::Cluster,
        text,
        status,
    };
    let ran = report.results.iter().any(|r| r.workload == WORKLOAD);
    if !ran {
        return skip_reason(report, WORKLOAD, Target::Kernel)
            .map(|why| vec![line("not measured".into(), Status::Skipped(why))])
            .unwrap_or_default();
    }
    let mut t = Targets::new();
    let mut parts = Vec::new();
    if let (Some(r), Some(x)) = (
        get(report, "uncontended", "uncontended_ratio"),
        get(report, "uncontended", "etcd_txns_per_lock"),
    ) {
        parts.push(format!(
            "uncontended {} of one server without --cluster, {} etcd requests per lock",
            units::format_ratio(r.mean),
            plain(x.mean)
        ));
        t.check(
            r.mean >= MIN_UNCONTENDED_RATIO,
            format!(
                "uncontended {} (target ≥ {})",
                units::format_ratio(r.mean),
                units::format_ratio(MIN_UNCONTENDED_RATIO)
            ),
        );
        t.check(
            x.min > 0.0 && x.max <= MAX_TXNS_PER_LOCK,
            format!(
                "etcd requests per lock {}..{} (target in (0, {MAX_TXNS_PER_LOCK}])",
                plain(x.min),
                plain(x.max)
            ),
        );
    }
    if let (Some(l), Some(e)) = (
        get(report, "pingpong", "locks_per_sec"),
        get(report, "pingpong", "etcd_txn_per_sec"),
    ) {
        let over = l.mean / e.mean;
        parts.push(format!(
            "ping_pong through {SERVERS} servers {} = {} etcd's serial compare-and-swap {}",
            units::format(l.mean, Unit::Rate),
            units::format_ratio(over),
            units::format(e.mean, Unit::Rate)
        ));
        t.check(
            over >= MIN_OVER_ETCD,
            format!(
                "ping_pong {} etcd's rate (target ≥ {})",
                units::format_ratio(over),
                units::format_ratio(MIN_OVER_ETCD)
            ),
        );
        t.check(
            l.mean >= MIN_PINGPONG_RATE,
            format!(
                "ping_pong {} (target ≥ {})",
                units::format(l.mean, Unit::Rate),
                units::format(MIN_PINGPONG_RATE, Unit::Rate)
            ),
        );
    }
    if let (Some(f), Some(ttl)) = (
        get(report, "failover", "failover_sec"),
        get(report, "failover", "lease_ttl_sec"),
    ) {
        parts.push(format!(
            "failover {} (at most {}) with a {} lease",
            units::format(f.mean, Unit::Seconds),
            units::format(f.max, Unit::Seconds),
            units::format(ttl.mean, Unit::Seconds)
        ));
        t.check(
            f.max <= ttl.mean + FAILOVER_SLACK_SEC,
            format!(
                "failover {} (target ≤ lease + {FAILOVER_SLACK_SEC} s)",
                units::format(f.max, Unit::Seconds)
            ),
        );
    }
    // A mode that was asked for but failed says why, and misses its targets.
    for s in report.skipped.iter().filter(|s| s.workload == WORKLOAD) {
        t.check(false, s.reason.clone());
    }
    vec![line(parts.join("; "), t.status())]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::headline::test_report;
    use crate::result::{Row, Skipped};

    fn row(mode: &str, metrics: &[(&str, &[f64])]) -> Row {
        let mut r = Row::new(WORKLOAD, Target::Kernel, mode, SERVERS);
        for (name, v) in metrics {
            r.metrics.insert(Metric::from(*name), Summary::of(*name, v));
        }
        r
    }

    fn good() -> Vec<Row> {
        vec![
            row(
                "uncontended",
                &[
                    ("uncontended_ratio", &[0.95, 0.97]),
                    ("etcd_txns_per_lock", &[2e-5, 3e-5]),
                ],
            ),
            row(
                "pingpong",
                &[
                    ("locks_per_sec", &[12_000.0, 13_000.0]),
                    ("etcd_txn_per_sec", &[900.0, 880.0]),
                ],
            ),
            row(
                "failover",
                &[("failover_sec", &[5.4, 5.6]), ("lease_ttl_sec", &[5.0, 5.0])],
            ),
        ]
    }

    #[test]
    fn every_target_met_is_one_checked_line() {
        let f = findings(&test_report(good()));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].status, Status::Met, "{}", f[0].line());
        let l = f[0].line();
        assert!(
            l.contains("uncontended") && l.contains("ping_pong") && l.contains("failover"),
            "{l}"
        );
    }

    #[test]
    fn each_target_can_miss() {
        let cases: [(&str, &str, &[f64], &str); 5] = [
            ("uncontended", "uncontended_ratio", &[0.5, 0.6], "uncontended"),
            (
                "uncontended",
                "etcd_txns_per_lock",
                &[0.0, 0.0],
                "etcd requests per lock",
            ),
            ("pingpong", "locks_per_sec", &[3_000.0, 3_100.0], "ping_pong"),
            ("pingpong", "etcd_txn_per_sec", &[5_000.0, 5_000.0], "etcd's rate"),
            ("failover", "failover_sec", &[5.0, 6.5], "failover"),
        ];
        for (mode, name, v, what) in cases {
            let mut rows = good();
            let r = rows.iter_mut().find(|r| r.mode == mode).unwrap();
            r.metrics.insert(Metric::from(name), Summary::of(name, v));
            let f = findings(&test_report(rows));
            match &f[0].status {
                Status::Missed(m) => assert!(m.iter().any(|x| x.contains(what)), "{name}: {m:?}"),
                s => panic!("{name}: {s:?}"),
            }
        }
    }

    #[test]
    fn a_failed_mode_misses_and_a_skipped_run_says_why() {
        let mut r = test_report(good());
        r.skipped.push(Skipped {
            workload: WORKLOAD.into(),
            target: Target::Kernel,
            reason: "failover: the waiter was not granted".into(),
        });
        assert!(matches!(&findings(&r)[0].status, Status::Missed(m) if m[0].contains("failover:")));
        let mut r = test_report(Vec::new());
        assert!(findings(&r).is_empty());
        r.skipped.push(Skipped {
            workload: WORKLOAD.into(),
            target: Target::Kernel,
            reason: "needs root".into(),
        });
        assert_eq!(findings(&r)[0].status, Status::Skipped("needs root".into()));
    }
}
