//! The vfscale lab: measure → results → statistics → headline → export, as hyperfine
//! splits it. Each stage reads only the stages before it; the `vfscale` binary is a
//! thin front over these modules.
//!
//! Where to find what:
//!
//! | concept                                                  | file                   |
//! |----------------------------------------------------------|------------------------|
//! | the workloads, targets and how one run is measured       | `measure/`             |
//! | one repetition's measurements, skips apart               | `measure/sample.rs`    |
//! | undoing a workload's set-up on SIGINT/SIGTERM/SIGHUP     | `measure/interrupt.rs` |
//! | several vfscalefs servers on etcd (the cluster workload) | `measure/cluster/`     |
//! | plans, repetitions and the interleaving of runs          | `bench.rs`             |
//! | the result model: rows, [`result::Metric`], units        | `result.rs`            |
//! | statistics: means, intervals, t-tests, [`stats::Ratio`]  | `stats.rs`             |
//! | the experiments, named by their upstream change          | `experiment.rs`        |
//! | what a run found, targets checked                        | `headline/`            |
//! | numbers for people (SI prefixes, units)                  | `units.rs`             |
//! | results.json/csv, report.md/html, plots, stdout          | `export/`              |
//! | `vfscale compare` of two results.json                    | `compare.rs`           |
//! | the machine a run ran on                                 | `meta.rs`              |

#![warn(missing_docs)]

pub mod bench;
pub mod compare;
pub mod experiment;
pub mod export;
pub mod headline;
pub mod measure;
pub mod meta;
pub mod result;
pub mod stats;
pub mod units;
