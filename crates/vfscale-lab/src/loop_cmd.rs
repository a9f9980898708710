//! `vfscale loop replay|check`: loop scenarios (docs/scenarios/loop.md) replayed against
//! the library, the running kernel's `/dev/loop*`, or both.
//!
//! Only result lines go to stdout; everything else goes to stderr. `SIGINT` and
//! `SIGTERM` during a kernel replay stop it before its next step, and the kernel runner
//! restores the machine (devices 0-7, unbound and fresh) before the command exits.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use vfscale_conformance::loop_dev::{kernel, library, render_results, CtlLock, Scenario, Settings};

use crate::cli::Against;
use crate::corpus::{self, first_difference, read};

/// `vfscale loop ...`.
#[derive(Debug, Subcommand)]
pub enum LoopCommand {
    /// Replay one loop scenario (JSON Lines) and print one result line per step.
    ///
    /// A scenario is one JSON step per line: backing files, device handles (open,
    /// close), the loop ioctls (configure, set_fd, change_fd, clr_fd, set_status64,
    /// get_status64, set_capacity, set_block_size, set_direct_io), size/block_size/ro
    /// queries, read/write/fsync through the device, and the registry (ctl_add,
    /// ctl_remove, ctl_get_free, list). The format, with an example to start from, is
    /// docs/scenarios/loop.md in the repository; the corpus is in scenarios/loop/.
    ///
    /// The kernel target needs root and /dev/loop-control, and the machine in the
    /// starting state (loop0-loop7 only, unbound); it holds an exclusive flock on
    /// /dev/loop-control and restores that state afterwards, also on error or Ctrl-C.
    Replay(LoopReplayArgs),
    /// Replay every `*.jsonl` scenario under a directory against the library, compare
    /// with the recorded `X.expected` beside it and, where the kernel target can run,
    /// with the kernel; report the ones that differ.
    ///
    /// The format: docs/scenarios/loop.md in the repository.
    Check(LoopCheckArgs),
}

/// `vfscale loop replay`.
#[derive(Debug, Args)]
pub struct LoopReplayArgs {
    /// The scenario file.
    pub file: PathBuf,
    /// Replay against the library, the kernel, or both (exit 1 when they differ).
    #[arg(long, value_enum, default_value_t = Against::Library)]
    pub against: Against,
    /// The library's control lock: per-device (Tatashin, 2021) or global (before it).
    #[arg(long, default_value = "per-device", value_parser = ["per-device", "global"])]
    pub ctl_lock: String,
}

/// `vfscale loop check`.
#[derive(Debug, Args)]
pub struct LoopCheckArgs {
    /// A directory of scenarios (searched recursively) or scenario files.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

/// Runs a `vfscale loop` command.
pub fn run(c: LoopCommand) -> Result<ExitCode, String> {
    kernel::install_signal_handlers();
    match c {
        LoopCommand::Replay(a) => replay(&a),
        LoopCommand::Check(a) => check(&a.paths),
    }
}

fn parse(path: &Path) -> Result<Scenario, String> {
    let text = read(path)?;
    Scenario::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn on_library(scn: &Scenario, settings: Settings, path: &Path) -> Result<String, String> {
    library::replay_with(scn, settings)
        .map(|r| render_results(&r))
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn on_kernel(scn: &Scenario, path: &Path) -> Result<String, String> {
    let r = kernel::replay(scn).map_err(|e| format!("{}: {e}", path.display()));
    if kernel::stop_requested() {
        return Err("interrupted; the loop devices were restored to the starting state".into());
    }
    r.map(|r| render_results(&r))
}

fn replay(a: &LoopReplayArgs) -> Result<ExitCode, String> {
    let scn = parse(&a.file)?;
    let settings = Settings {
        ctl_lock: if a.ctl_lock == "global" {
            CtlLock::Global
        } else {
            CtlLock::PerDevice
        },
        ..Settings::default()
    };
    let kernel_ok =
        || kernel::available().map_err(|why| format!("SKIP: the kernel target cannot run here: {why}"));
    match a.against {
        Against::Library => print!("{}", on_library(&scn, settings, &a.file)?),
        Against::Kernel => {
            kernel_ok()?;
            print!("{}", on_kernel(&scn, &a.file)?);
        }
        Against::Both => {
            let lib = on_library(&scn, settings, &a.file)?;
            kernel_ok()?;
            let ker = on_kernel(&scn, &a.file)?;
            return Ok(corpus::report_both(
                &a.file,
                &lib,
                &ker,
                "kernel",
                first_difference,
            ));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn check(paths: &[PathBuf]) -> Result<ExitCode, String> {
    let files = corpus::scenario_files(paths)?;
    let live = match kernel::available() {
        Ok(()) => true,
        Err(why) => {
            eprintln!("SKIP: the kernel target cannot run here ({why}); comparing with the recordings only");
            false
        }
    };
    corpus::check(&files, |f| {
        let scn = parse(f)?;
        let lib = on_library(&scn, Settings::default(), f)?;
        let mut problems = Vec::new();
        if let Ok(exp) = std::fs::read_to_string(f.with_extension("expected")) {
            if exp != lib {
                problems.push(format!("the recording: {}", first_difference(&lib, &exp)));
            }
        }
        if live {
            let ker = on_kernel(&scn, f)?;
            if ker != lib {
                problems.push(format!("the kernel: {}", first_difference(&lib, &ker)));
            }
        }
        Ok((!problems.is_empty()).then(|| problems.join("; ")))
    })
}
