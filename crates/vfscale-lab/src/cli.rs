//! The command-line interface.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// vfscale: Linux VFS object managers in userspace, and a lab that reproduces the
/// kernel's scalability experiments.
#[derive(Debug, Parser)]
#[command(name = "vfscale", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// File locks: replay lock scenarios against the library or the kernel.
    #[command(subcommand)]
    Locks(LocksCommand),
}

/// `vfscale locks ...`.
#[derive(Debug, Subcommand)]
pub enum LocksCommand {
    /// Replay one lock scenario (JSON Lines) and print one result line per step.
    Replay(ReplayArgs),
    /// Replay every `*.jsonl` scenario under a directory against both the library and
    /// the kernel and report the ones whose results differ.
    Check(CheckArgs),
}

/// Where a scenario is replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Against {
    /// The vfscale library.
    Library,
    /// The running kernel: real child processes on a fresh tmpfs directory.
    Kernel,
    /// Both, comparing their results; exits 1 when they differ.
    Both,
}

/// How the library wakes waiters (seed 003's experiment setting).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Wake {
    /// The wait tree (patched).
    Tree,
    /// Wake every waiter (base).
    All,
}

/// `vfscale locks replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The scenario file.
    pub file: PathBuf,
    /// Replay against the library, the kernel, or both.
    #[arg(long, value_enum, default_value_t = Against::Library)]
    pub against: Against,
    /// The library's wake setting.
    #[arg(long, value_enum, default_value_t = Wake::Tree)]
    pub wake: Wake,
}

/// `vfscale locks check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// A directory of scenarios (searched recursively) or scenario files.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// The library's wake setting.
    #[arg(long, value_enum, default_value_t = Wake::Tree)]
    pub wake: Wake,
}
