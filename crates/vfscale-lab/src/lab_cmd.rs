//! `vfscale run`, `vfscale bench` and `vfscale compare`.

use std::process::ExitCode;
use std::time::Duration;

use vfscale_lab::bench::{self, Plan, Scale};
use vfscale_lab::measure::{Target, Workload};
use vfscale_lab::{compare as cmp, export, meta};

use crate::cli::{BenchArgs, CompareArgs, RunArgs};

fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

/// The plan of `vfscale run`: every workload at [`Scale::for_run`], on all its targets
/// (`--quick`: all but `kernel-ext4`).
fn run_plan(runs: usize, quick: bool) -> Plan {
    let configs = Workload::ALL
        .into_iter()
        .flat_map(|w| {
            Scale::for_run(w, quick)
                .into_iter()
                .flat_map(move |s| bench::configs(w, &s))
        })
        .collect();
    Plan {
        configs,
        // A first look leaves out ext4 on a loop device: its set-up (loop device, mkfs,
        // mount, drop_caches) alone takes longer than the quick run's inode budget.
        targets: Target::ALL
            .into_iter()
            .filter(|t| !(quick && *t == Target::KernelExt4))
            .collect(),
        runs,
    }
}

/// `vfscale run`.
pub fn run(a: &RunArgs) -> Result<ExitCode, String> {
    let plan = run_plan(a.runs as usize, a.quick);
    let report = bench::execute(&plan, meta::collect(&command_line()), false);
    if a.verbose {
        print!("{}", export::summary::render_verbose(&report));
    } else if a.quick {
        print!("{}", export::summary::render_quick(&report));
    } else {
        print!("{}", export::summary::render(&report));
    }
    export::write_all(&report, &a.out).map_err(|e| format!("--out {}: {e}", a.out.display()))?;
    println!(
        "Full report: {}/report.html (and report.md, results.json, results.csv)",
        a.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// `vfscale bench`.
pub fn bench(a: &BenchArgs) -> Result<ExitCode, String> {
    let w = a.workload;
    let mut s = Scale::default_for(w);
    if !a.tasks.is_empty() {
        s.tasks = a.tasks.clone();
    }
    if !a.mode.is_empty() {
        s.modes = a
            .mode
            .iter()
            .map(|m| {
                w.modes()
                    .iter()
                    .copied()
                    .find(|k| k == m)
                    .ok_or_else(|| format!("--mode {m}: {} has modes {}", w.name(), w.modes().join(", ")))
            })
            .collect::<Result<_, _>>()?;
    }
    if let Some(d) = a.duration {
        s.duration = Duration::from_secs_f64(d);
    }
    let only = |flag: &str, applies: bool, to: &str| -> Result<(), String> {
        if applies {
            Ok(())
        } else {
            Err(format!("{flag} applies to {to}, not {}", w.name()))
        }
    };
    if a.iterations.is_some() {
        only(
            "--iterations",
            w.lockperf().is_some(),
            "posix01/02 and flock01/02",
        )?;
        s.iterations = a.iterations;
    }
    if !a.files.is_empty() {
        only("--files", w == Workload::Inodes, "inodes")?;
        s.sizes = a.files.clone();
    }
    if !a.held.is_empty() {
        only("--held", w == Workload::Lockmany, "lockmany")?;
        s.sizes = a.held.clone();
    }
    if let Some(d) = a.devices {
        only("--devices", w == Workload::Loop, "loop")?;
        s.sizes = vec![d];
    }
    if w == Workload::Cluster && (!a.tasks.is_empty() || a.dir.is_some()) {
        return Err("cluster sets up its own servers and processes: no --tasks or --dir".into());
    }
    if w == Workload::Wakeup && a.dir.is_some() {
        return Err("wakeup touches no file: no --dir".into());
    }
    if let Some(ttl) = a.lease_ttl {
        only("--lease-ttl", w == Workload::Cluster, "cluster")?;
        s.lease_ttl = Duration::from_secs(ttl);
    }
    if let Some(dir) = &a.dir {
        if !dir.is_dir() {
            return Err(format!("--dir {}: not a directory", dir.display()));
        }
        s.dir = Some(dir.clone());
    }
    let targets = if a.target.is_empty() {
        w.targets().to_vec()
    } else {
        for t in &a.target {
            if !w.targets().contains(t) {
                let names: Vec<_> = w.targets().iter().map(|t| t.name()).collect();
                return Err(format!(
                    "--target {}: {} has targets {}",
                    t.name(),
                    w.name(),
                    names.join(", ")
                ));
            }
        }
        dedup(&a.target)
    };
    let plan = Plan {
        configs: bench::configs(w, &s),
        targets,
        runs: a.runs as usize,
    };
    let report = bench::execute(&plan, meta::collect(&command_line()), a.json);
    if a.json {
        println!("{}", export::json::to_string(&report));
    } else {
        print!("{}", export::summary::render_verbose(&report));
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
