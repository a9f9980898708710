//! Measurement: the workloads that reproduce each upstream kernel change, run against
//! each target.
//!
//! A workload run produces one [`Sample`]: metric name → value, for one repetition. The
//! caller repeats it and summarizes (see `crate::stats`). How workers start together,
//! where their files go and the limits raised for them is
//! `vfscale_conformance::harness`, shared with the kernel runners.
//!
//! | workloads | kernel target | library targets |
//! |---|---|---|
//! | lockperf, herd, will-it-scale lock1/lock2 | `locks_kernel.rs` | `locks_library.rs` (and the `partitioned` control of posix02/flock02) |
//! | the herd's waits and fairness, both targets | `herd_metrics.rs` | |
//! | lockmany | `lockmany.rs` | `lockmany.rs` |
//! | pipebench, opensock, dup1 | `fd_kernel.rs` | `fd_library.rs` |
//! | inodes | `inodes/kernel.rs` | `inodes/fs.rs` on `inodes/tables.rs`; the evict point `inodes/million.rs` |
//! | loop | `loop_dev/sys.rs` (kernel) | `loop_dev/sys.rs` (library), driven by `loop_dev/mod.rs` |
//! | cluster | `cluster/` (vfscalefs servers on one etcd) | |
//! | wakeup (a control: what a wake-up costs here) | `wakeup.rs` | |
//!
//! A workload that sets the machine up (loop devices, an etcd cluster and mounts) undoes
//! it on `SIGINT`/`SIGTERM`/`SIGHUP` before the signal ends the process: `interrupt.rs`.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use vfscale_conformance::harness::Outcome;

pub mod cluster;
pub mod fd_kernel;
pub mod fd_library;
mod herd_metrics;
pub mod inodes;
pub mod interrupt;
pub mod lockmany;
pub mod locks_kernel;
pub mod locks_library;
pub mod loop_dev;
mod sample;
pub mod wakeup;

pub use sample::Sample;

/// Tests that start child processes (fork, or programs such as `mkfs`) hold this, so a
/// test that checks no child is left is not confused by another test's child.
#[cfg(test)]
pub(crate) static CHILD_PROCESSES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// [`CHILD_PROCESSES`], held.
#[cfg(test)]
pub(crate) fn child_processes() -> std::sync::MutexGuard<'static, ()> {
    CHILD_PROCESSES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where kernel targets make their scratch directories unless `--dir` names another;
/// it must be tmpfs.
pub const SHM_DIR: &str = "/dev/shm";

/// Which system a workload runs against. Each workload names the targets it has
/// ([`Workload::targets`]); a target that a workload does not have is refused by `bench`
/// and left out by `run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// Real processes and system calls on files in a fresh tmpfs directory (or `--dir`).
    Kernel,
    /// Real system calls on ext4 on a loop device the lab sets up and tears down (inodes).
    KernelExt4,
    /// vfscale with the kernel change switched back (the design before the patch).
    LibraryPrepatch,
    /// vfscale-locks with `LockIndex::List`, Linux's one list per inode (lockmany).
    LibraryList,
    /// The inode workload's filesystem on `RwLock<HashMap>` (the virtiofsd/libfuse
    /// pattern).
    RwlockHashmap,
    /// The inode workload's filesystem on `dashmap`.
    Dashmap,
    /// The inode workload's filesystem on `moka` (`get_with` coalesces loads).
    Moka,
    /// A control, not a design to pick: the same work with nothing shared between
    /// tasks. The inode workload's filesystem on one `RwLock<HashMap>` per task, holding
    /// that task's files (tasks work in their own directories); lockperf's file-per-task
    /// workloads (posix02, flock02) with each task's file in a lock manager of its own.
    /// Its N/1 ratios are how far this machine lets tasks that share nothing scale,
    /// measured in the same run as the others.
    Partitioned,
    /// vfscale with the upstream designs; threads act as the owners.
    Library,
}

impl Target {
    /// All targets, in report order: the kernel first, the alternatives, vfscale last.
    pub const ALL: [Target; 9] = [
        Target::Kernel,
        Target::KernelExt4,
        Target::LibraryPrepatch,
        Target::LibraryList,
        Target::RwlockHashmap,
        Target::Dashmap,
        Target::Moka,
        Target::Partitioned,
        Target::Library,
    ];

    /// The name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            Target::Kernel => "kernel",
            Target::KernelExt4 => "kernel-ext4",
            Target::LibraryPrepatch => "library-prepatch",
            Target::LibraryList => "library-list",
            Target::RwlockHashmap => "rwlock-hashmap",
            Target::Dashmap => "dashmap",
            Target::Moka => "moka",
            Target::Partitioned => "partitioned",
            Target::Library => "library",
        }
    }

    /// Parses [`Target::name`].
    pub fn from_name(s: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == s)
    }

    /// Whether the target is the running kernel (its rows carry the filesystem they ran
    /// on, and userspace cannot count its locks).
    pub fn is_kernel(self) -> bool {
        matches!(self, Target::Kernel | Target::KernelExt4)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
    /// The wait tree's test (NeilBrown's 2018 "locks: avoid thundering-herd wake-ups"):
    /// N contenders for one whole-file lock on a 0-byte file.
    Herd,
    /// will-it-scale lock1: each task a 1-byte write lock on its own file.
    Lock1,
    /// will-it-scale lock2: all tasks 1-byte write locks on one file, each its own byte.
    Lock2,
    /// Many locks held on one file: set, unset and test one more.
    Lockmany,
    /// Mateusz Guzik's pipebench (lock-free `fd_install`, 2015): each thread creates a pipe and closes both ends.
    Pipebench,
    /// Eric Dumazet's opensock (lock-free `fd_install`, 2015): each thread closes one of its own random
    /// descriptors and creates a socket.
    Opensock,
    /// will-it-scale dup1: each thread `dup`s one shared descriptor and closes the copy.
    Dup1,
    /// Dave Chinner's inode cache benchmark (2023): create, walk, chmod, unlink and a cold
    /// walk of F files per task.
    Inodes,
    /// The loop device lock (Pasha Tatashin, 2021): loop devices at boot, open/close storms, configure, churn and block I/O.
    Loop,
    /// Several vfscalefs servers, one lock space on etcd: the uncontended lock, Samba's
    /// `ping_pong` across two servers, and failover when a server dies.
    Cluster,
    /// A control under every figure through FUSE: one token passed around a ring of N
    /// processes, each hand-off one wake-up, on one CPU or across two.
    Wakeup,
}

impl Workload {
    /// All workloads, in report order.
    pub const ALL: [Workload; 15] = [
        Workload::Posix01,
        Workload::Posix02,
        Workload::Flock01,
        Workload::Flock02,
        Workload::Herd,
        Workload::Lock1,
        Workload::Lock2,
        Workload::Lockmany,
        Workload::Pipebench,
        Workload::Opensock,
        Workload::Dup1,
        Workload::Inodes,
        Workload::Loop,
        Workload::Cluster,
        Workload::Wakeup,
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
            Workload::Lockmany => "lockmany",
            Workload::Pipebench => "pipebench",
            Workload::Opensock => "opensock",
            Workload::Dup1 => "dup1",
            Workload::Inodes => "inodes",
            Workload::Loop => "loop",
            Workload::Cluster => "cluster",
            Workload::Wakeup => "wakeup",
        }
    }

    /// Parses [`Workload::name`].
    pub fn from_name(s: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == s)
    }

    /// One line for `--help`: what the workload measures.
    pub fn about(self) -> &'static str {
        match self {
            Workload::Posix01 => "lockperf, per-inode file locks (Layton, 2013): N tasks lock/unlock one file's whole-file POSIX lock",
            Workload::Posix02 => "lockperf, per-inode file locks (Layton, 2013): as posix01, each task its own file",
            Workload::Flock01 => "lockperf, per-inode file locks (Layton, 2013): N tasks flock/unlock one file",
            Workload::Flock02 => "lockperf, per-inode file locks (Layton, 2013): as flock01, each task its own file",
            Workload::Herd => "wait tree of fs/locks.c (NeilBrown, 2018): N contenders for one whole-file lock (flock, ofd, posix)",
            Workload::Lock1 => "will-it-scale lock1: 1-byte lock, each task its own file",
            Workload::Lock2 => "will-it-scale lock2: 1-byte locks, all tasks one file",
            Workload::Lockmany => {
                "many locks on one file: H held; set/unset and test one more (ofd, posix)"
            }
            Workload::Pipebench => "lock-free fd_install (Guzik, 2015): each thread creates a pipe and closes both ends",
            Workload::Opensock => {
                "lock-free fd_install (Guzik, 2015): each thread closes a random descriptor of its own and opens a socket"
            }
            Workload::Dup1 => "will-it-scale dup1: dup one shared descriptor and close the copy",
            Workload::Inodes => "inode cache scalability (Chinner, 2023): create, walk, chmod, unlink and a cold walk of F files per task",
            Workload::Loop => "per-device loop lock (Tatashin, 2021): loop devices at boot, open/close, configure, churn, block I/O",
            Workload::Cluster => "several vfscalefs servers, one lock space on etcd: uncontended lock, ping_pong across servers, failover",
            Workload::Wakeup => "a control: what waking a sleeping process costs here, on one CPU or across two (a request over /dev/fuse pays up to two)",
        }
    }

    /// The targets the workload has, in report order.
    pub fn targets(self) -> &'static [Target] {
        use Target::*;
        match self {
            Workload::Lockmany => &[Kernel, LibraryList, Library],
            Workload::Inodes => &[
                Kernel,
                KernelExt4,
                LibraryPrepatch,
                RwlockHashmap,
                Dashmap,
                Moka,
                Partitioned,
                Library,
            ],
            Workload::Posix02 | Workload::Flock02 => &[Kernel, LibraryPrepatch, Partitioned, Library],
            Workload::Cluster | Workload::Wakeup => &[Kernel],
            _ => &[Kernel, LibraryPrepatch, Library],
        }
    }

    /// The modes `--mode` may select (the first of a lock workload's is its own); every
    /// mode runs when none is selected.
    pub fn modes(self) -> &'static [&'static str] {
        match self {
            Workload::Herd => &["flock", "ofd", "posix"],
            Workload::Lockmany => &["ofd", "posix"],
            // `evict` (the 1,000,000-inode point) runs only when selected: see Scale.
            Workload::Inodes => &["create", "walk", "cold-walk", "chmod", "unlink", "evict"],
            Workload::Loop => &[
                "boot",
                "open-close",
                "open-close-same",
                "configure",
                "churn",
                "io",
            ],
            Workload::Lock1 | Workload::Lock2 => &["processes", "threads"],
            Workload::Pipebench | Workload::Opensock | Workload::Dup1 => &["threads"],
            Workload::Posix01 | Workload::Posix02 => &["posix"],
            Workload::Flock01 | Workload::Flock02 => &["flock"],
            Workload::Cluster => &cluster::MODES,
            Workload::Wakeup => &wakeup::MODES,
        }
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

    /// Whether the workload exercises the descriptor table rather than locks.
    pub fn is_fd_table(self) -> bool {
        matches!(self, Workload::Pipebench | Workload::Opensock | Workload::Dup1)
    }
}

/// One configuration to measure once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The workload.
    pub workload: Workload,
    /// Number of tasks.
    pub tasks: usize,
    /// Lock family (herd, lockmany), or the lockperf workload's own.
    pub mode: LockMode,
    /// Processes or threads (lock1, lock2); always threads for pipebench, opensock, dup1.
    pub kind: TaskKind,
    /// The modes this configuration measures, for workloads whose modes are not lock
    /// families (inodes: phases, loop: modes). One run may measure several: it then
    /// returns its metrics per mode ([`Sample::insert_in`]). Empty for the others.
    pub modes: Vec<&'static str>,
    /// Lock/unlock pairs per task (lockperf workloads).
    pub iterations: u64,
    /// How long a timed workload runs (herd, lock1, lock2, pipebench, opensock, dup1, loop).
    pub duration: Duration,
    /// The workload's size: files per task (inodes), locks held (lockmany), devices
    /// (loop boot); 0 for the others.
    pub size: u64,
    /// Where kernel targets run (`--dir`): a directory on any mounted filesystem; `None`
    /// for a fresh tmpfs directory under `/dev/shm`.
    pub dir: Option<PathBuf>,
    /// The targets this configuration runs on, when only some of the plan's (`vfscale
    /// run` gives `kernel-ext4`'s inodes runs fewer files than the others'); `None`: all.
    pub targets: Option<Vec<Target>>,
    /// The clustered servers' lease TTL (cluster).
    pub lease_ttl: Duration,
}

impl Config {
    /// A configuration of `workload` with `tasks` tasks and every other field at its
    /// neutral value (the workload's first lock mode, processes, nothing selected).
    pub fn new(workload: Workload, tasks: usize) -> Config {
        let mode = workload.lockperf().map_or(LockMode::Flock, |(m, _)| m);
        Config {
            workload,
            tasks,
            mode,
            kind: TaskKind::Processes,
            modes: Vec::new(),
            iterations: 0,
            duration: Duration::ZERO,
            size: 0,
            dir: None,
            targets: None,
            lease_ttl: cluster::DEFAULT_LEASE_TTL,
        }
    }

    /// The `mode` column of a result row (a run measuring several modes labels its rows
    /// itself, see [`run_once`]).
    pub fn mode_label(&self) -> &'static str {
        match self.workload {
            Workload::Lock1 | Workload::Lock2 => self.kind.name(),
            w if w.is_fd_table() => self.kind.name(),
            _ if self.modes.len() == 1 => self.modes[0],
            Workload::Inodes | Workload::Loop | Workload::Cluster => "all",
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

/// A harness error (its message says what failed and where) is a reason to skip.
impl From<std::io::Error> for Skip {
    fn from(e: std::io::Error) -> Skip {
        Skip(e.to_string())
    }
}

/// `ops_per_sec` of a timed thread team, over its measured interval.
pub(crate) fn rate_sample<S, B>(out: &Outcome<S, B>) -> Result<Sample, Skip> {
    let secs = out.interval.as_secs_f64();
    if out.ops_in_interval == 0 || secs <= 0.0 {
        return Err(Skip(format!("no operations in the measured interval ({secs} s)")));
    }
    let mut s = Sample::new();
    s.insert("ops_per_sec".into(), out.ops_in_interval as f64 / secs);
    Ok(s)
}

/// Whether `target` can run `workload` here: checked once per run, before measuring.
pub fn available(workload: Workload, target: Target) -> Result<(), Skip> {
    if !workload.targets().contains(&target) {
        return Err(Skip(format!(
            "{} has no {} target",
            workload.name(),
            target.name()
        )));
    }
    match workload {
        Workload::Inodes => inodes::available(target),
        Workload::Loop => loop_dev::available(target),
        Workload::Lockmany => lockmany::available(target),
        Workload::Cluster => cluster::available(target),
        Workload::Wakeup => wakeup::available(),
        w if w.is_fd_table() => match target {
            Target::Kernel => fd_kernel::available(),
            _ => Ok(()),
        },
        _ => match target {
            Target::Kernel => locks_kernel::available(),
            _ => Ok(()),
        },
    }
}

/// Releases what `workload`'s runs kept between repetitions (lockmany's set-ups, the
/// cluster's etcd and servers): its runs are over.
pub fn finish(workload: Workload) {
    match workload {
        Workload::Lockmany => lockmany::release(),
        Workload::Cluster => cluster::release(),
        _ => {}
    }
}

/// Measures `cfg` once on `target`. A run that measures several modes (inodes phases)
/// returns its metrics per mode ([`Sample::insert_in`]); the caller makes a row per mode.
pub fn run_once(target: Target, cfg: &Config) -> Result<Sample, Skip> {
    match cfg.workload {
        Workload::Inodes => return inodes::run(target, cfg),
        Workload::Loop => return loop_dev::run(target, cfg),
        Workload::Lockmany => return lockmany::run(target, cfg),
        Workload::Cluster => return cluster::run(cfg),
        Workload::Wakeup => return wakeup::run(cfg),
        _ => {}
    }
    if cfg.workload.is_fd_table() {
        return match target {
            Target::Kernel => fd_kernel::run(cfg),
            Target::Library => fd_library::run(cfg, false),
            Target::LibraryPrepatch => fd_library::run(cfg, true),
            t => Err(Skip(format!(
                "{} has no {} target",
                cfg.workload.name(),
                t.name()
            ))),
        };
    }
    match target {
        Target::Kernel => locks_kernel::run(cfg),
        Target::Library => locks_library::run(cfg, false),
        Target::LibraryPrepatch => locks_library::run(cfg, true),
        Target::Partitioned => locks_library::run_partitioned(cfg),
        t => Err(Skip(format!(
            "{} has no {} target",
            cfg.workload.name(),
            t.name()
        ))),
    }
}
