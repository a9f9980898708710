//! Measurement: the workloads of the seeds, run against each target.
//!
//! A workload run produces one [`Sample`]: metric name → value, for one repetition. The
//! caller repeats it and summarizes (see `crate::stats`).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

pub mod fd_kernel;
pub mod fd_library;
mod gate;
pub mod kernel;
pub mod library;

/// One repetition's measurements, by metric name.
pub type Sample = BTreeMap<String, f64>;

/// Which system a workload runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// Real processes and system calls on files in a fresh tmpfs directory.
    Kernel,
    /// vfscale with the seeds' designs; threads act as the owners.
    Library,
    /// vfscale with the seed's "base" setting.
    LibraryPrepatch,
}

impl Target {
    /// All targets, in report order.
    pub const ALL: [Target; 3] = [Target::Kernel, Target::Library, Target::LibraryPrepatch];

    /// The name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            Target::Kernel => "kernel",
            Target::Library => "library",
            Target::LibraryPrepatch => "library-prepatch",
        }
    }

    /// Parses [`Target::name`].
    pub fn from_name(s: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == s)
    }
}

/// The lock family a workload uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LockMode {
    /// `flock(2)`, `LOCK_EX`.
    Flock,
    /// `F_OFD_SETLKW`, whole file, `F_WRLCK`.
    Ofd,
    /// `F_SETLKW`, whole file, `F_WRLCK`.
    Posix,
}

impl LockMode {
    /// All modes.
    pub const ALL: [LockMode; 3] = [LockMode::Flock, LockMode::Ofd, LockMode::Posix];

    /// The name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            LockMode::Flock => "flock",
            LockMode::Ofd => "ofd",
            LockMode::Posix => "posix",
        }
    }

    /// Parses [`LockMode::name`].
    pub fn from_name(s: &str) -> Option<LockMode> {
        LockMode::ALL.into_iter().find(|m| m.name() == s)
    }
}

/// Whether tasks are processes or threads of one process (will-it-scale's two shapes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaskKind {
    /// Each task is its own process (its own POSIX lock owner).
    Processes,
    /// All tasks are threads of one process (one POSIX lock owner).
    Threads,
}

impl TaskKind {
    /// The name used in results.
    pub fn name(self) -> &'static str {
        match self {
            TaskKind::Processes => "processes",
            TaskKind::Threads => "threads",
        }
    }
}

/// The workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Workload {
    /// lockperf posix01: N tasks lock and unlock one file's whole-file POSIX write lock K times.
    Posix01,
    /// lockperf posix02: as posix01, each task on its own file.
    Posix02,
    /// lockperf flock01: N tasks `LOCK_EX`/`LOCK_UN` one file K times.
    Flock01,
    /// lockperf flock02: as flock01, each task on its own file.
    Flock02,
    /// Seed 003's test: N contenders for one whole-file lock on a 0-byte file.
    Herd,
    /// will-it-scale lock1: each task a 1-byte write lock on its own file.
    Lock1,
    /// will-it-scale lock2: all tasks 1-byte write locks on one file, each its own byte.
    Lock2,
    /// Seed 001, Mateusz Guzik's pipebench: each thread creates a pipe and closes both ends.
    Pipebench,
    /// Seed 001, Eric Dumazet's opensock: each thread closes one of its own random
    /// descriptors and creates a socket.
    Opensock,
    /// will-it-scale dup1: each thread `dup`s one shared descriptor and closes the copy.
    Dup1,
}

impl Workload {
    /// All workloads, in report order.
    pub const ALL: [Workload; 10] = [
        Workload::Posix01,
        Workload::Posix02,
        Workload::Flock01,
        Workload::Flock02,
        Workload::Herd,
        Workload::Lock1,
        Workload::Lock2,
        Workload::Pipebench,
        Workload::Opensock,
        Workload::Dup1,
    ];

    /// The name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Posix01 => "posix01",
            Workload::Posix02 => "posix02",
            Workload::Flock01 => "flock01",
            Workload::Flock02 => "flock02",
            Workload::Herd => "herd",
            Workload::Lock1 => "lock1",
            Workload::Lock2 => "lock2",
            Workload::Pipebench => "pipebench",
            Workload::Opensock => "opensock",
            Workload::Dup1 => "dup1",
        }
    }

    /// Parses [`Workload::name`].
    pub fn from_name(s: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == s)
    }

    /// The lockperf workloads' lock family and sharing: (mode, one shared file).
    pub fn lockperf(self) -> Option<(LockMode, bool)> {
        match self {
            Workload::Posix01 => Some((LockMode::Posix, true)),
            Workload::Posix02 => Some((LockMode::Posix, false)),
            Workload::Flock01 => Some((LockMode::Flock, true)),
            Workload::Flock02 => Some((LockMode::Flock, false)),
            _ => None,
        }
    }

    /// Whether the workload exercises the descriptor table (seed 001) rather than locks.
    pub fn is_fd_table(self) -> bool {
        matches!(self, Workload::Pipebench | Workload::Opensock | Workload::Dup1)
    }
}

/// One configuration to measure once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// The workload.
    pub workload: Workload,
    /// Number of tasks.
    pub tasks: usize,
    /// Lock family (herd), or the lockperf workload's own.
    pub mode: LockMode,
    /// Processes or threads (lock1, lock2); always threads for pipebench, opensock, dup1.
    pub kind: TaskKind,
    /// Lock/unlock pairs per task (lockperf workloads).
    pub iterations: u64,
    /// How long a timed workload runs (herd, lock1, lock2, pipebench, opensock, dup1).
    pub duration: Duration,
}

impl Config {
    /// The `mode` column of a result row.
    pub fn mode_label(&self) -> &'static str {
        match self.workload {
            Workload::Lock1 | Workload::Lock2 => self.kind.name(),
            w if w.is_fd_table() => self.kind.name(),
            _ => self.mode.name(),
        }
    }
}

/// Why a configuration could not be measured on a target here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skip(pub String);

impl fmt::Display for Skip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Measures `cfg` once on `target`.
pub fn run_once(target: Target, cfg: &Config) -> Result<Sample, Skip> {
    if cfg.workload.is_fd_table() {
        return match target {
            Target::Kernel => fd_kernel::run(cfg),
            Target::Library => fd_library::run(cfg, false),
            Target::LibraryPrepatch => fd_library::run(cfg, true),
        };
    }
    match target {
        Target::Kernel => kernel::run(cfg),
        Target::Library => library::run(cfg, false),
        Target::LibraryPrepatch => library::run(cfg, true),
    }
}
