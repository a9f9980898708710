//! `vfscale locks replay` and `vfscale locks check`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use vfscale_locks::scenario::{kernel, library, render_results, Scenario};
use vfscale_locks::{Settings, WakeMode};

use crate::cli::{Against, CheckArgs, ReplayArgs, Wake};

fn settings(w: Wake) -> Settings {
    Settings {
        wake: match w {
            Wake::Tree => WakeMode::Tree,
            Wake::All => WakeMode::All,
        },
        ..Settings::default()
    }
}

fn load(path: &Path) -> Result<Scenario, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    Scenario::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn run_library(path: &Path, scn: &Scenario, w: Wake) -> Result<String, String> {
    library::replay_with(scn, settings(w))
        .map(|r| render_results(&r))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn run_kernel(path: &Path, scn: &Scenario) -> Result<String, String> {
    kernel::available().map_err(|why| format!("the kernel target cannot run here: {why}"))?;
    kernel::replay(scn)
        .map(|r| render_results(&r))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The first line where two result streams differ, for a report.
fn first_difference(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("step {i}:\n  library: {x}\n  kernel:  {y}");
        }
    }
    format!(
        "the library printed {} lines, the kernel {}",
        a.lines().count(),
        b.lines().count()
    )
}

/// `vfscale locks replay FILE [--against library|kernel|both]`.
pub fn replay(a: &ReplayArgs) -> Result<ExitCode, String> {
    let scn = load(&a.file)?;
    match a.against {
        Against::Library => print!("{}", run_library(&a.file, &scn, a.wake)?),
        Against::Kernel => print!("{}", run_kernel(&a.file, &scn)?),
        Against::Both => {
            let lib = run_library(&a.file, &scn, a.wake)?;
            let ker = run_kernel(&a.file, &scn)?;
            print!("{lib}");
            if lib != ker {
                eprintln!(
                    "{}: results differ at {}",
                    a.file.display(),
                    first_difference(&lib, &ker)
                );
                return Ok(ExitCode::from(1));
            }
            eprintln!("{}: library and kernel agree", a.file.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for e in entries {
            if e.is_dir() || e.extension().is_some_and(|x| x == "jsonl") {
                collect(&e, out)?;
            }
        }
    } else {
        out.push(path.to_path_buf());
    }
    Ok(())
}

/// `vfscale locks check PATH...`.
pub fn check(a: &CheckArgs) -> Result<ExitCode, String> {
    let mut files = Vec::new();
    for p in &a.paths {
        collect(p, &mut files)?;
    }
    if files.is_empty() {
        return Err("no *.jsonl scenarios found".into());
    }
    kernel::available().map_err(|why| format!("the kernel target cannot run here: {why}"))?;
    let (mut same, mut differ) = (0, 0);
    for f in &files {
        let scn = load(f)?;
        let lib = run_library(f, &scn, a.wake)?;
        let ker = run_kernel(f, &scn)?;
        if lib == ker {
            same += 1;
            println!("same    {}", f.display());
        } else {
            differ += 1;
            println!("DIFFER  {}: {}", f.display(), first_difference(&lib, &ker));
        }
    }
    println!("{same} agree, {differ} differ, of {} scenarios", files.len());
    Ok(if differ == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
