//! `vfscale run`, `vfscale bench` and `vfscale compare`.

use std::process::ExitCode;
use std::time::Duration;

use vfscale_lab::bench::{self, Plan, Scale};
use vfscale_lab::measure::{Target, Workload};
use vfscale_lab::result::Report;
use vfscale_lab::{compare as cmp, export, meta};

use crate::cli::{BenchArgs, CompareArgs, RunArgs};

fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// The scale of `vfscale run`: every workload, all targets, small enough to finish in
/// about three minutes on 2 cores. The lockperf workloads do the same total work at
/// every task count (1M lock/unlock pairs, split across the tasks), so the 1- and 2-task
/// runs are long enough to compare; `vfscale bench` keeps the seed's per-task counts.
fn run_plan(runs: usize, quick: bool) -> Plan {
    let total_pairs: u64 = if quick { 20_000 } else { 1_000_000 };
    let mut configs = Vec::new();
    for w in Workload::ALL {
        let mut s = Scale::default_for(w);
        if quick {
            s.tasks.retain(|&t| t <= 100);
        }
        match w {
            Workload::Herd => s.duration = Duration::from_millis(if quick { 100 } else { 750 }),
            Workload::Lock1 | Workload::Lock2 => {
                s.duration = Duration::from_millis(if quick { 50 } else { 250 })
            }
            // 3 workloads x 4 thread counts x 3 targets x 3 runs x 0.2 s: about 25 s.
            Workload::Pipebench | Workload::Opensock | Workload::Dup1 => {
                s.duration = Duration::from_millis(if quick { 30 } else { 200 })
            }
            _ => {
                for tasks in [1, 2, 128] {
                    let mut one = s.clone();
                    one.tasks = vec![tasks];
                    one.iterations = Some((total_pairs / tasks as u64).max(if quick { 100 } else { 2_000 }));
                    configs.extend(bench::configs(w, &one));
                }
                continue;
            }
        }
        configs.extend(bench::configs(w, &s));
    }
    Plan {
        configs,
        targets: Target::ALL.to_vec(),
        runs,
    }
}

/// Prints the tables of a report on stdout.
fn print_tables(report: &Report) {
    print!("{}", export::markdown::render(report));
}

/// `vfscale run`.
pub fn run(a: &RunArgs) -> Result<ExitCode, String> {
    let plan = run_plan(a.runs as usize, a.quick);
    let report = bench::execute(&plan, meta::collect(&command_line()), false);
    print_tables(&report);
    export::write_all(&report, &a.out).map_err(|e| format!("--out {}: {e}", a.out.display()))?;
    eprintln!("report written to {}/", a.out.display());
    Ok(ExitCode::SUCCESS)
}

/// `vfscale bench`.
pub fn bench(a: &BenchArgs) -> Result<ExitCode, String> {
    let mut s = Scale::default_for(a.workload);
    if !a.tasks.is_empty() {
        s.tasks = a.tasks.clone();
    }
    if !a.mode.is_empty() {
        if a.workload != Workload::Herd {
            return Err(format!(
                "--mode applies to herd only; {} has its own",
                a.workload.name()
            ));
        }
        s.modes = a.mode.clone();
    }
    if let Some(d) = a.duration {
        s.duration = Duration::from_secs_f64(d);
    }
    if a.iterations.is_some() {
        if a.workload.lockperf().is_none() {
            return Err(format!(
                "--iterations applies to posix01/02 and flock01/02, not {}",
                a.workload.name()
            ));
        }
        s.iterations = a.iterations;
    }
    let plan = Plan {
        configs: bench::configs(a.workload, &s),
        targets: dedup(&a.target),
        runs: a.runs as usize,
    };
    let report = bench::execute(&plan, meta::collect(&command_line()), a.json);
    if a.json {
        println!("{}", export::json::to_string(&report));
    } else {
        print_tables(&report);
    }
    Ok(ExitCode::SUCCESS)
}

fn dedup(targets: &[Target]) -> Vec<Target> {
    let mut t = targets.to_vec();
    t.sort();
    t.dedup();
    t
}

/// `vfscale compare`.
pub fn compare(a: &CompareArgs) -> Result<ExitCode, String> {
    let load = |p: &std::path::Path| cmp::load(p).map_err(|e| format!("{}: {e}", p.display()));
    let (ra, rb) = (load(&a.a)?, load(&a.b)?);
    print!("{}", cmp::render_comparison(&cmp::compare(&ra, &rb)));
    Ok(ExitCode::SUCCESS)
}
