//! Running a plan: every configuration on every target, repeated, summarized into rows.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::measure::{self, Config, LockMode, Target, TaskKind, Workload};
use crate::result::{Meta, Metric, Report, Row, Skipped, Summary};

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
    /// The modes to measure, by name (from [`Workload::modes`]); a workload whose
    /// mode is fixed ignores it.
    pub modes: Vec<&'static str>,
    /// Lock/unlock pairs per task (lockperf).
    pub iterations: Option<u64>,
    /// Measured interval (herd, lock1, lock2, pipebench, opensock, dup1, loop, wakeup).
    pub duration: Duration,
    /// Sizes (lockmany: locks held, one configuration each; inodes: files per task;
    /// loop: devices at boot); empty for workloads without one.
    pub sizes: Vec<u64>,
    /// Where kernel targets run, instead of a fresh tmpfs directory (`--dir`).
    pub dir: Option<PathBuf>,
    /// The targets these configurations run on, when only some of the plan's; `None`: all.
    pub targets: Option<Vec<Target>>,
    /// The clustered servers' lease TTL (cluster).
    pub lease_ttl: Duration,
}

impl Scale {
    /// The defaults of `vfscale bench WORKLOAD`, the upstream benchmarks' own where they fit.
    pub fn default_for(w: Workload) -> Scale {
        let base = Scale {
            tasks: vec![1],
            modes: w.modes().to_vec(),
            iterations: None,
            duration: Duration::from_secs(1),
            sizes: Vec::new(),
            dir: None,
            targets: None,
            lease_ttl: crate::measure::cluster::DEFAULT_LEASE_TTL,
        };
        match w {
            Workload::Herd => Scale {
                tasks: vec![2, 20, 100, 1000],
                ..base
            },
            Workload::Lock1 | Workload::Lock2 => Scale {
                tasks: vec![1, 2, 4],
                duration: Duration::from_millis(500),
                ..base
            },
            // Guzik's pipebench ran 16 threads for 10 s; 1 s per run is enough for a stable rate.
            Workload::Pipebench | Workload::Opensock | Workload::Dup1 => Scale {
                tasks: vec![1, 2, 4, 16],
                ..base
            },
            Workload::Lockmany => Scale {
                tasks: vec![1],
                sizes: vec![10, 100, 1_000, 10_000, 100_000],
                ..base
            },
            Workload::Inodes => Scale {
                tasks: vec![1, 2],
                sizes: vec![200_000],
                // Not `evict` (the 1,000,000-inode point): only with --mode evict.
                modes: crate::measure::inodes::PHASES.to_vec(),
                ..base
            },
            // Tatashin's boot had 69 devices; half a second per run keeps the whole bench
            // (6 modes x 4 task counts x 3 targets x 5 runs) to a few minutes.
            Workload::Loop => Scale {
                tasks: vec![1, 2, 8, 64],
                sizes: vec![69],
                duration: Duration::from_millis(500),
                ..base
            },
            // A ring of 2 is the wake-up itself; of 1,000, the wake-up of a cold process.
            Workload::Wakeup => Scale {
                tasks: vec![2, 1000],
                ..base
            },
            // Two servers; 3 s: ping_pong's three one-second readings after its first.
            Workload::Cluster => Scale {
                tasks: vec![2],
                duration: Duration::from_secs(3),
                ..base
            },
            _ => Scale {
                tasks: vec![128],
                duration: Duration::ZERO,
                ..base
            },
        }
    }
}

impl Scale {
    /// The scale of workload `w` in `vfscale run` (`quick`: `vfscale run --quick`):
    /// every workload, all its targets, about seven minutes in all on 2 cores (under a
    /// minute quick). The lockperf workloads do the same total work at every task count
    /// (1M lock/unlock pairs, split across the tasks), so the 1- and 2-task runs are long
    /// enough to compare; `vfscale bench` keeps lockperf's own per-task counts.
    pub fn for_run(w: Workload, quick: bool) -> Vec<Scale> {
        let mut s = Scale::default_for(w);
        if quick {
            s.tasks.retain(|&t| t <= 100);
        }
        let ms = |full: u64, q: u64| Duration::from_millis(if quick { q } else { full });
        match w {
            Workload::Herd if quick => s.duration = ms(750, 100),
            // The herd's fairness targets are set at 1,000 contenders over 3 s (a 0.75 s
            // window is too short for every one of 1,000 waiters to reach the head of the
            // queue); the flat ratio 1000/20 compares the 1,000 herd with the 20 herd, so
            // both run 3 s (the same transients on both sides); 2 and 100 keep 0.75 s.
            Workload::Herd => {
                let long = |t: usize| t == 20 || t >= 1000;
                let big = s.tasks.iter().copied().filter(|&t| long(t)).collect::<Vec<_>>();
                s.tasks.retain(|&t| !long(t));
                s.duration = ms(750, 100);
                let mut out = vec![s.clone()];
                if !big.is_empty() {
                    out.push(Scale {
                        tasks: big,
                        duration: Duration::from_secs(3),
                        ..s
                    });
                }
                return out;
            }
            Workload::Lock1 | Workload::Lock2 => s.duration = ms(250, 50),
            // The wake-up itself, beside the figures that pay it: under a second.
            Workload::Wakeup => {
                s.tasks = vec![2];
                s.duration = ms(100, 50);
            }
            // The short line: one ping_pong reading, the shortest lease (failover then
            // takes about 3 s); about 7 s a run, under 30 s with etcd's start at 3 runs.
            // Quick leaves failover out (it waits out a lease): about 3 s a run.
            Workload::Cluster => {
                s.duration = ms(1000, 500);
                s.lease_ttl = crate::measure::cluster::MIN_LEASE_TTL;
                if quick {
                    s.modes.retain(|m| *m != "failover");
                }
            }
            // 3 workloads x 4 thread counts x 3 targets x 3 runs x 0.2 s: about 25 s.
            Workload::Pipebench | Workload::Opensock | Workload::Dup1 => s.duration = ms(200, 30),
            // The kernel at 10,000 held takes about a second to set up (and to release,
            // OFD); a set+unset there is ~0.5 ms: 0.2 s per run gives hundreds of pairs.
            Workload::Lockmany => {
                s.sizes = if quick {
                    vec![10, 1_000]
                } else {
                    vec![10, 1_000, 10_000]
                };
                s.duration = ms(200, 30);
            }
            // 30,000 files per task (3,000 quick), kernel-ext4 10,000 (not in quick): its
            // own loop device, mkfs, mount and drop_caches per run, and ~45k creates/s,
            // make it most of the part's time. At 10,000 files for every target (as
            // once tried) an in-memory target's phase lasted 1–3 ms, and its 2-task ratios
            // moved ±50–150% from run to run on this 2-core VM: a scheduler tick is a
            // third of such a phase. About 35 s on 2 cores in all.
            Workload::Inodes => {
                let ext4 = Scale {
                    sizes: vec![10_000],
                    targets: Some(vec![Target::KernelExt4]),
                    ..s.clone()
                };
                let rest = Scale {
                    sizes: vec![if quick { 3_000 } else { 30_000 }],
                    targets: Some(
                        Target::ALL
                            .into_iter()
                            .filter(|t| *t != Target::KernelExt4)
                            .collect(),
                    ),
                    ..s
                };
                return if quick { vec![rest] } else { vec![rest, ext4] };
            }
            // Boot at the upstream benchmark's 69 devices and the task counts its targets name; the
            // other modes at 1 and 2 tasks (quick: the ones the headline needs). A kernel
            // run also adds and removes its devices (a removal waits ~50 ms).
            Workload::Loop => {
                let scale = |tasks: &[usize], modes: &[&'static str], millis: u64| Scale {
                    tasks: tasks.to_vec(),
                    modes: modes.to_vec(),
                    duration: Duration::from_millis(millis),
                    ..s.clone()
                };
                return if quick {
                    vec![
                        scale(&[2], &["boot"], 30),
                        scale(&[1, 2], &["open-close"], 30),
                        scale(&[1], &["configure"], 30),
                        // io's target is a ratio of two rates a few % apart: 30 ms phases
                        // put it within noise of the 90% line; 200 ms costs 0.6 s.
                        scale(&[1], &["io"], 200),
                    ]
                } else {
                    vec![
                        scale(&[1, 2, 8, 64], &["boot"], 150),
                        scale(
                            &[1, 2],
                            &["open-close", "open-close-same", "configure", "churn", "io"],
                            200,
                        ),
                    ]
                };
            }
            _ => {
                let total_pairs: u64 = if quick { 20_000 } else { 1_000_000 };
                return [1, 2, 128]
                    .into_iter()
                    .map(|tasks| Scale {
                        tasks: vec![tasks],
                        iterations: Some((total_pairs / tasks as u64).max(if quick { 100 } else { 2_000 })),
                        ..s.clone()
                    })
                    .collect();
            }
        }
        vec![s]
    }
}

/// The configurations of workload `w` at `scale`, in report order.
pub fn configs(w: Workload, scale: &Scale) -> Vec<Config> {
    let iterations = scale.iterations.unwrap_or(match w {
        // lockperf: 10k on the shared file, 20k on private files (lockperf's defaults).
        Workload::Posix01 | Workload::Flock01 => 10_000,
        _ => 20_000,
    });
    let kinds: &[TaskKind] = match w {
        Workload::Lock1 | Workload::Lock2 => &[TaskKind::Processes, TaskKind::Threads],
        Workload::Pipebench | Workload::Opensock | Workload::Dup1 => &[TaskKind::Threads],
        _ => &[TaskKind::Processes],
    };
    // What one configuration varies over: a lock family, a mode, or all selected modes at once.
    let variants: Vec<(LockMode, Vec<&'static str>)> = match w {
        _ if w.lockperf().is_some() => vec![(w.lockperf().expect("lockperf").0, Vec::new())],
        Workload::Herd | Workload::Lockmany => scale
            .modes
            .iter()
            .filter_map(|m| LockMode::from_name(m))
            .map(|m| (m, Vec::new()))
            .collect(),
        // One inodes run goes through the selected phases in order (each needs the ones
        // before it), so it measures them all at once.
        Workload::Inodes => vec![(LockMode::Posix, scale.modes.clone())],
        Workload::Loop | Workload::Wakeup => {
            scale.modes.iter().map(|m| (LockMode::Posix, vec![*m])).collect()
        }
        // One cluster run measures every selected mode on the rig it keeps.
        Workload::Cluster => vec![(LockMode::Posix, scale.modes.clone())],
        _ => vec![(LockMode::Posix, Vec::new())],
    };
    let sizes: Vec<u64> = if scale.sizes.is_empty() {
        vec![0]
    } else {
        scale.sizes.clone()
    };
    let mut out = Vec::new();
    for (mode, modes) in &variants {
        for &kind in kinds {
            for &size in &sizes {
                for &tasks in &scale.tasks {
                    out.push(Config {
                        workload: w,
                        tasks,
                        mode: *mode,
                        kind,
                        modes: modes.clone(),
                        iterations,
                        duration: scale.duration,
                        size,
                        dir: scale.dir.clone(),
                        targets: scale.targets.clone(),
                        lease_ttl: scale.lease_ttl,
                    });
                }
            }
        }
    }
    out
}

/// Whether `w`'s runs are interleaved: the workloads whose targets are ratios between
/// rows (inodes: task counts and targets; herd: 1,000 contenders over 20; lockmany:
/// 10,000 held over 10; wakeup: across two CPUs over one) take their configurations and
/// targets run by run (run 1 of every (configuration, target), then run 2 of each, ...),
/// so a drift of the machine (another job starting) falls on both sides of a ratio
/// alike, and run i of two rows can be compared as a pair
/// ([`crate::stats::Ratio::paired`]). A shared 2-core machine moved the herd's 1000/20
/// ratio by ±15% between runs taken unit by unit.
pub fn interleaved(w: Workload) -> bool {
    matches!(
        w,
        Workload::Inodes | Workload::Herd | Workload::Lockmany | Workload::Wakeup
    )
}

/// The order of the runs of `units` (a group's (configuration, target) pairs), `runs`
/// each: run by run when `w` is [`interleaved`], else unit by unit.
fn run_order<T: Copy>(w: Workload, units: &[T], runs: usize) -> Vec<T> {
    if interleaved(w) {
        (0..runs).flat_map(|_| units.iter().copied()).collect()
    } else {
        units.iter().flat_map(|&t| std::iter::repeat_n(t, runs)).collect()
    }
}

/// Lists `reason` as why `target` skipped (part of) `cfg`'s workload, once.
fn note_skip(skipped: &mut Vec<Skipped>, cfg: &Config, target: Target, reason: String) {
    if !skipped
        .iter()
        .any(|s| s.workload == cfg.workload.name() && s.target == target && s.reason == reason)
    {
        skipped.push(Skipped {
            workload: cfg.workload.name().into(),
            target,
            reason,
        });
    }
}

/// Whether `cfg` runs on `target` (when the plan names it): its workload has the target,
/// and the configuration is not limited to others.
fn runs_on(cfg: &Config, target: Target) -> bool {
    cfg.workload.targets().contains(&target) && cfg.targets.as_ref().is_none_or(|only| only.contains(&target))
}

/// Runs the plan, showing progress on stderr unless `quiet`.
pub fn execute(plan: &Plan, meta: Meta, quiet: bool) -> Report {
    let total = plan
        .configs
        .iter()
        .map(|c| plan.targets.iter().filter(|t| runs_on(c, **t)).count() * plan.runs)
        .sum::<usize>() as u64;
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
    // Each (workload, target) is checked once, the first time it comes up.
    let mut availability: BTreeMap<(Workload, Target), Result<(), measure::Skip>> = BTreeMap::new();
    let mut first = 0;
    while first < plan.configs.len() {
        // A group of configurations whose runs are ordered together: one configuration,
        // or every consecutive configuration of an interleaved workload.
        let w = plan.configs[first].workload;
        let mut end = first + 1;
        if interleaved(w) {
            while end < plan.configs.len() && plan.configs[end].workload == w {
                end += 1;
            }
        }
        let group = &plan.configs[first..end];
        first = end;
        // The (configuration, target) pairs that run here, in report order.
        let mut live: Vec<(usize, Target)> = Vec::new();
        for (c, cfg) in group.iter().enumerate() {
            for &target in &plan.targets {
                if !runs_on(cfg, target) {
                    continue;
                }
                let ok = availability
                    .entry((cfg.workload, target))
                    .or_insert_with(|| measure::available(cfg.workload, target));
                if let Err(why) = ok {
                    note_skip(&mut skipped, cfg, target, why.to_string());
                    bar.inc(plan.runs as u64);
                    continue;
                }
                live.push((c, target));
            }
        }
        // Per (configuration, target): mode → metric name → samples.
        type Samples = BTreeMap<String, BTreeMap<Metric, Vec<f64>>>;
        let mut by_unit: BTreeMap<(usize, Target), Samples> = BTreeMap::new();
        for (c, target) in run_order(w, &live, plan.runs) {
            let cfg = &group[c];
            bar.set_message(format!(
                "{} {} {} x{}",
                cfg.workload.name(),
                target.name(),
                cfg.mode_label(),
                cfg.tasks
            ));
            let samples = by_unit.entry((c, target)).or_default();
            match measure::run_once(target, cfg) {
                Ok(s) => {
                    for why in s.skipped() {
                        note_skip(&mut skipped, cfg, target, why.clone());
                    }
                    for (mode, metric, v) in s.metrics() {
                        samples
                            .entry(mode.unwrap_or(cfg.mode_label()).to_string())
                            .or_default()
                            .entry(metric.clone())
                            .or_default()
                            .push(v);
                    }
                }
                Err(why) => note_skip(&mut skipped, cfg, target, why.to_string()),
            }
            bar.inc(1);
        }
        measure::finish(w);
        for (c, target) in live {
            let cfg = &group[c];
            let samples = by_unit.remove(&(c, target)).unwrap_or_default();
            let fs = match target {
                Target::Kernel if cfg.workload == Workload::Cluster => Some(measure::cluster::FS.to_string()),
                // The ring touches no file.
                Target::Kernel if cfg.workload == Workload::Wakeup => None,
                Target::Kernel => Some(crate::meta::filesystem_of(
                    cfg.dir
                        .as_deref()
                        .unwrap_or(std::path::Path::new(measure::SHM_DIR)),
                )),
                Target::KernelExt4 => Some("ext4 loop".to_string()),
                _ => None,
            };
            // Rows in the order the workload lists its modes.
            let mut modes: Vec<String> = samples.keys().cloned().collect();
            let order = cfg.workload.modes();
            modes.sort_by_key(|m| order.iter().position(|o| o == m).unwrap_or(usize::MAX));
            for mode in modes {
                let metrics = &samples[&mode];
                let mut row = Row::new(cfg.workload.name(), target, &mode, cfg.tasks);
                match cfg.workload {
                    Workload::Lockmany => row.held = Some(cfg.size),
                    Workload::Inodes => row.files = Some(cfg.size),
                    _ => {}
                }
                row.fs = fs.clone();
                row.metrics = metrics
                    .iter()
                    .map(|(k, v)| (k.clone(), Summary::of(k.name(), v)))
                    .collect();
                results.push(row);
            }
        }
    }
    bar.finish_and_clear();
    Report {
        meta,
        results,
        skipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_gives_in_memory_inodes_targets_longer_phases_than_ext4() {
        let cfgs: Vec<Config> = Scale::for_run(Workload::Inodes, false)
            .iter()
            .flat_map(|s| configs(Workload::Inodes, s))
            .collect();
        // Every target at 1 and 2 tasks, ext4 at 10,000 files, all others at 30,000.
        for t in Workload::Inodes.targets() {
            let sizes: Vec<(u64, usize)> = cfgs
                .iter()
                .filter(|c| runs_on(c, *t))
                .map(|c| (c.size, c.tasks))
                .collect();
            let files = if *t == Target::KernelExt4 { 10_000 } else { 30_000 };
            assert_eq!(sizes, [(files, 1), (files, 2)], "{}", t.name());
        }
        // Quick leaves ext4 out altogether.
        let quick: Vec<Config> = Scale::for_run(Workload::Inodes, true)
            .iter()
            .flat_map(|s| configs(Workload::Inodes, s))
            .collect();
        assert!(quick
            .iter()
            .all(|c| !runs_on(c, Target::KernelExt4) && c.size == 3_000));
        assert!(quick.iter().any(|c| runs_on(c, Target::Library)));
    }

    #[test]
    fn run_gives_the_cluster_a_short_line() {
        for quick in [false, true] {
            let cfgs: Vec<Config> = Scale::for_run(Workload::Cluster, quick)
                .iter()
                .flat_map(|s| configs(Workload::Cluster, s))
                .collect();
            // One configuration measures the modes on one rig, with the shortest lease.
            assert_eq!(cfgs.len(), 1);
            let c = &cfgs[0];
            assert_eq!(c.lease_ttl, crate::measure::cluster::MIN_LEASE_TTL);
            assert!(c.duration <= Duration::from_secs(1));
            let want: &[&str] = if quick {
                &["uncontended", "pingpong"]
            } else {
                &["uncontended", "pingpong", "failover"]
            };
            assert_eq!(c.modes, want);
            assert_eq!(c.mode_label(), "all");
        }
        // `bench cluster` keeps the servers' own lease and every mode.
        let s = Scale::default_for(Workload::Cluster);
        assert_eq!(s.lease_ttl, crate::measure::cluster::DEFAULT_LEASE_TTL);
        assert_eq!(s.modes, crate::measure::cluster::MODES);
    }

    #[test]
    fn ratio_workloads_take_their_targets_run_by_run() {
        use Target::*;
        let t = [LibraryPrepatch, Dashmap, Library];
        assert_eq!(
            run_order(Workload::Inodes, &t, 2),
            [
                LibraryPrepatch,
                Dashmap,
                Library,
                LibraryPrepatch,
                Dashmap,
                Library
            ]
        );
        assert_eq!(
            run_order(Workload::Inodes, &[(0, Library), (1, Library)], 2),
            [(0, Library), (1, Library), (0, Library), (1, Library)]
        );
        // The other ratio workloads run by run too; the rest unit by unit.
        for w in [Workload::Herd, Workload::Lockmany] {
            assert_eq!(
                run_order(w, &[(20, Library), (1000, Library)], 2),
                [(20, Library), (1000, Library), (20, Library), (1000, Library)]
            );
        }
        assert_eq!(
            run_order(Workload::Posix01, &t, 2),
            [
                LibraryPrepatch,
                LibraryPrepatch,
                Dashmap,
                Dashmap,
                Library,
                Library
            ]
        );
    }

    #[test]
    fn interleaved_runs_still_give_one_row_per_target_and_phase() {
        let _g = crate::measure::child_processes();
        let scale = Scale {
            tasks: vec![1, 2],
            sizes: vec![50],
            ..Scale::default_for(Workload::Inodes)
        };
        let plan = Plan {
            configs: configs(Workload::Inodes, &scale),
            targets: vec![Target::Dashmap, Target::Library],
            runs: 3,
        };
        let r = execute(&plan, crate::meta::collect("test"), true);
        let rows: Vec<(&str, &str)> = r
            .results
            .iter()
            .map(|r| (r.target.name(), r.mode.as_str()))
            .collect();
        let phases = ["create", "walk", "cold-walk", "chmod", "unlink"];
        let want: Vec<(&str, &str)> = ["dashmap", "library"]
            .into_iter()
            .flat_map(|t| phases.map(|p| (t, p)))
            .collect();
        let want: Vec<(&str, &str)> = want.iter().chain(&want).copied().collect();
        assert_eq!(rows, want);
        let tasks: Vec<usize> = r.results.iter().map(|r| r.tasks).collect();
        assert_eq!(tasks, [[1; 10], [2; 10]].concat());
        for row in &r.results {
            assert_eq!(row.metrics["ops_per_sec"].n, 3, "{} {}", row.target, row.mode);
        }
    }
}
