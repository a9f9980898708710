//! Running a plan: every configuration on every target, repeated, summarized into rows.

use std::collections::BTreeMap;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::measure::{self, Config, LockMode, Target, TaskKind, Workload};
use crate::result::{Meta, Report, Row, Skipped, Summary};

/// What to measure: configurations × targets, each `runs` times.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The configurations, in report order.
    pub configs: Vec<Config>,
    /// The targets each configuration runs on.
    pub targets: Vec<Target>,
    /// Repetitions of each (configuration, target).
    pub runs: usize,
}

/// Scale knobs of a workload's plan.
#[derive(Clone, Debug)]
pub struct Scale {
    /// Task counts.
    pub tasks: Vec<usize>,
    /// Lock modes (herd; the descriptor-table workloads ignore theirs).
    pub modes: Vec<LockMode>,
    /// Lock/unlock pairs per task (lockperf).
    pub iterations: Option<u64>,
    /// Measured interval (herd, lock1, lock2, pipebench, opensock, dup1).
    pub duration: Duration,
}

impl Scale {
    /// The defaults of `vfscale bench WORKLOAD`, the seeds' own where they fit.
    pub fn default_for(w: Workload) -> Scale {
        match w {
            Workload::Herd => Scale {
                tasks: vec![2, 20, 100, 1000],
                modes: LockMode::ALL.to_vec(),
                iterations: None,
                duration: Duration::from_secs(1),
            },
            Workload::Lock1 | Workload::Lock2 => Scale {
                tasks: vec![1, 2, 4],
                modes: vec![LockMode::Posix],
                iterations: None,
                duration: Duration::from_millis(500),
            },
            // Seed 001 ran 16 threads for 10 s; 1 s per run is enough for a stable rate.
            Workload::Pipebench | Workload::Opensock | Workload::Dup1 => Scale {
                tasks: vec![1, 2, 4, 16],
                modes: vec![LockMode::Posix],
                iterations: None,
                duration: Duration::from_secs(1),
            },
            _ => Scale {
                tasks: vec![128],
                modes: vec![w.lockperf().expect("lockperf").0],
                iterations: None,
                duration: Duration::ZERO,
            },
        }
    }
}

/// The configurations of workload `w` at `scale`.
pub fn configs(w: Workload, scale: &Scale) -> Vec<Config> {
    let iterations = scale.iterations.unwrap_or(match w {
        // lockperf: 10k on the shared file, 20k on private files (seed 000).
        Workload::Posix01 | Workload::Flock01 => 10_000,
        _ => 20_000,
    });
    let mut out = Vec::new();
    let kinds: &[TaskKind] = match w {
        Workload::Lock1 | Workload::Lock2 => &[TaskKind::Processes, TaskKind::Threads],
        Workload::Pipebench | Workload::Opensock | Workload::Dup1 => &[TaskKind::Threads],
        _ => &[TaskKind::Processes],
    };
    let modes: Vec<LockMode> = match w.lockperf() {
        Some((m, _)) => vec![m],
        None => scale.modes.clone(),
    };
    for &mode in &modes {
        for &kind in kinds {
            for &tasks in &scale.tasks {
                out.push(Config {
                    workload: w,
                    tasks,
                    mode,
                    kind,
                    iterations,
                    duration: scale.duration,
                });
            }
        }
    }
    out
}

/// Runs the plan, showing progress on stderr unless `quiet`.
pub fn execute(plan: &Plan, meta: Meta, quiet: bool) -> Report {
    let total = (plan.configs.len() * plan.targets.len() * plan.runs) as u64;
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(total)
    };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let mut results = Vec::new();
    let mut skipped: Vec<Skipped> = Vec::new();
    // Each family's kernel target has its own check, made once.
    let lock_kernel = measure::kernel::available();
    let fd_kernel = measure::fd_kernel::available();
    for cfg in &plan.configs {
        for &target in &plan.targets {
            bar.set_message(format!(
                "{} {} {} x{}",
                cfg.workload.name(),
                target.name(),
                cfg.mode_label(),
                cfg.tasks
            ));
            let skip = |reason: String, skipped: &mut Vec<Skipped>| {
                if !skipped.iter().any(|s| {
                    s.workload == cfg.workload.name() && s.target == target.name() && s.reason == reason
                }) {
                    skipped.push(Skipped {
                        workload: cfg.workload.name().into(),
                        target: target.name().into(),
                        reason,
                    });
                }
            };
            let kernel_ok = if cfg.workload.is_fd_table() {
                &fd_kernel
            } else {
                &lock_kernel
            };
            if let (Target::Kernel, Err(why)) = (target, kernel_ok) {
                skip(why.to_string(), &mut skipped);
                bar.inc(plan.runs as u64);
                continue;
            }
            let mut samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
            for _ in 0..plan.runs {
                match measure::run_once(target, cfg) {
                    Ok(s) => {
                        for (k, v) in s {
                            samples.entry(k).or_default().push(v);
                        }
                    }
                    Err(why) => skip(why.to_string(), &mut skipped),
                }
                bar.inc(1);
            }
            if samples.is_empty() {
                continue;
            }
            results.push(Row {
                workload: cfg.workload.name().into(),
                target: target.name().into(),
                mode: cfg.mode_label().into(),
                tasks: cfg.tasks,
                metrics: samples
                    .iter()
                    .map(|(k, v)| (k.clone(), Summary::of(k, v)))
                    .collect(),
            });
        }
    }
    bar.finish_and_clear();
    Report {
        meta,
        results,
        skipped,
    }
}
