//! `vfscale icache replay|check`: inode-cache scenarios (docs/scenarios/icache.md)
//! replayed against vfscale-icache, against the reference model of fs/inode.c, or both.
//! The kernel's inode cache cannot be driven from userspace: the model is the reference.
//!
//! Only result lines go to stdout (`replay`); messages go to stderr.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use vfscale_conformance::icache::{library, reference, render_results, Scenario};

use crate::corpus::{self, read};

/// `vfscale icache ...`.
#[derive(Debug, Subcommand)]
pub enum IcacheCommand {
    /// Replay one inode-cache scenario (JSON Lines) and print one result line per step.
    ///
    /// A scenario is one JSON step per line: iget, ilookup, new_inode, insert_locked,
    /// unlock_new, discard_new, iget_failed, ihold, iput (with hold_evict), finish_evict,
    /// unhash, set_nlink/drop_nlink/clear_nlink, dontcache, prune, umount, state, lru,
    /// stats. The format, with an example to start from, is docs/scenarios/icache.md in
    /// the repository; the corpus is in scenarios/icache/.
    Replay(IcacheReplayArgs),
    /// Replay every `*.jsonl` scenario under a directory against the library and the
    /// model of fs/inode.c, compare both with the recorded `X.expected` beside it, and
    /// report the ones that differ (exit 1).
    ///
    /// The format: docs/scenarios/icache.md in the repository.
    Check(IcacheCheckArgs),
}

/// Where an inode-cache scenario is replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum IcacheAgainst {
    /// vfscale-icache.
    Library,
    /// The reference model written from fs/inode.c.
    Model,
    /// Both, comparing their results; exits 1 when they differ.
    Both,
}

/// `vfscale icache replay`.
#[derive(Debug, Args)]
pub struct IcacheReplayArgs {
    /// The scenario file.
    pub file: PathBuf,
    /// Replay against the library, the model, or both.
    #[arg(long, value_enum, default_value_t = IcacheAgainst::Library)]
    pub against: IcacheAgainst,
}

/// `vfscale icache check`.
#[derive(Debug, Args)]
pub struct IcacheCheckArgs {
    /// A directory of scenarios (searched recursively) or scenario files.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

/// Runs `vfscale icache ...`.
pub fn run(c: IcacheCommand) -> Result<ExitCode, String> {
    match c {
        IcacheCommand::Replay(a) => replay(&a),
        IcacheCommand::Check(a) => check(&a.paths),
    }
}

/// Both replays of `text`: results, or the scenario's error.
fn both(text: &str) -> (Result<String, String>, Result<String, String>) {
    match Scenario::parse(text) {
        Err(e) => (Err(e.to_string()), Err(e.to_string())),
        Ok(s) => (
            library::replay(&s)
                .map(|r| render_results(&r))
                .map_err(|e| e.to_string()),
            reference::replay(&s)
                .map(|r| render_results(&r))
                .map_err(|e| e.to_string()),
        ),
    }
}

fn replay(a: &IcacheReplayArgs) -> Result<ExitCode, String> {
    let text = read(&a.file)?;
    let at = |e: String| format!("{}: {e}", a.file.display());
    let one = |lib: bool| -> Result<String, String> {
        let s = Scenario::parse(&text).map_err(|e| at(e.to_string()))?;
        let r = if lib {
            library::replay(&s)
        } else {
            reference::replay(&s)
        };
        r.map(|r| render_results(&r)).map_err(|e| at(e.to_string()))
    };
    match a.against {
        IcacheAgainst::Library => print!("{}", one(true)?),
        IcacheAgainst::Model => print!("{}", one(false)?),
        IcacheAgainst::Both => {
            let (lib, model) = both(&text);
            let (lib, model) = (lib.map_err(at)?, model.map_err(at)?);
            return Ok(corpus::report_both(&a.file, &lib, &model, "model", |l, m| {
                first_difference(l, m, "model")
            }));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Renders a replay as the corpus records it: the results, or `error: MESSAGE`.
fn as_recorded(r: Result<String, String>) -> String {
    r.unwrap_or_else(|e| format!("error: {e}\n"))
}

fn first_difference(a: &str, b: &str, what: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}:\n  library: {x}\n  {what:<8} {y}", i + 1);
        }
    }
    format!(
        "the library printed {} lines, the {what} {}",
        a.lines().count(),
        b.lines().count()
    )
}

fn check(paths: &[PathBuf]) -> Result<ExitCode, String> {
    let files = corpus::scenario_files(paths)?;
    corpus::check(&files, |f| {
        let text = read(f)?;
        let (lib, model) = both(&text);
        let (lib, model) = (as_recorded(lib), as_recorded(model));
        let exp_path = f.with_extension("expected");
        let problem = if lib != model {
            Some(format!(
                "library and model differ at {}",
                first_difference(&lib, &model, "model:")
            ))
        } else if let Ok(exp) = std::fs::read_to_string(&exp_path) {
            (lib != exp).then(|| {
                format!(
                    "differs from {} at {}",
                    exp_path.display(),
                    first_difference(&lib, &exp, "expected:")
                )
            })
        } else {
            eprintln!("{}: no .expected; library and model agree", f.display());
            None
        };
        Ok(problem)
    })
}
