//! The command-line interface.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use vfscale_lab::measure::{Target, Workload};

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
    /// Run every experiment (about seven minutes on 2 cores; --quick: under one),
    /// print what it found — a headline per experiment, then summary tables — and write
    /// the full report to a directory.
    Run(RunArgs),
    /// Measure one workload: `vfscale bench herd --tasks 2,20 --mode flock --runs 3`.
    Bench(BenchArgs),
    /// Compare two `--json` results: ratio with its error, Welch's t-test, and a mark on
    /// changes that are significant and larger than the noise.
    Compare(CompareArgs),
    /// File locks: replay lock scenarios against the library or the kernel.
    ///
    /// The format: docs/scenarios/locks.md in the repository.
    #[command(subcommand)]
    Locks(LocksCommand),
    /// Descriptor tables: replay descriptor scenarios against the library or the kernel.
    ///
    /// The format: docs/scenarios/fd.md in the repository.
    #[command(subcommand)]
    Fd(FdCommand),
    /// Loop devices: replay loop scenarios against the library or the kernel.
    ///
    /// The format: docs/scenarios/loop.md in the repository.
    #[command(subcommand)]
    Loop(crate::loop_cmd::LoopCommand),
    /// Inode cache: replay inode-cache scenarios against the library and the reference
    /// model of fs/inode.c.
    ///
    /// The format: docs/scenarios/icache.md in the repository.
    #[command(subcommand)]
    Icache(crate::icache_cmd::IcacheCommand),
}

/// `vfscale locks ...`.
#[derive(Debug, Subcommand)]
pub enum LocksCommand {
    /// Replay one lock scenario (JSON Lines) and print one result line per step.
    ///
    /// A scenario is one JSON step per line: open, dup, close, exit, fcntl (F_SETLK,
    /// F_SETLKW, F_GETLK and the F_OFD_ ones), flock, interrupt. The format, with an
    /// example to start from, is docs/scenarios/locks.md in the repository; the corpus
    /// in scenarios/locks/ has 71 more.
    Replay(ReplayArgs),
    /// Replay every `*.jsonl` scenario under a directory against both the library and
    /// the kernel and report the ones whose results differ.
    Check(CheckArgs),
}

/// `vfscale fd ...`.
#[derive(Debug, Subcommand)]
pub enum FdCommand {
    /// Replay one descriptor scenario (JSON Lines) and print one result line per step.
    ///
    /// The format, with an example to start from, is docs/scenarios/fd.md in the
    /// repository; the corpus is in scenarios/fd/.
    Replay(FdReplayArgs),
    /// Replay every `*.jsonl` scenario under a directory against both the library and the
    /// kernel and report the ones whose results differ.
    Check(FdCheckArgs),
}

/// `vfscale fd replay`.
#[derive(Debug, Args)]
pub struct FdReplayArgs {
    /// The scenario file.
    pub file: PathBuf,
    /// Replay against the library, the kernel, or both.
    #[arg(long, value_enum, default_value_t = Against::Library)]
    pub against: Against,
    /// The kernel runner's helper program (default: `vfscale-fd-child` next to `vfscale`).
    #[arg(long)]
    pub child: Option<PathBuf>,
}

/// `vfscale fd check`.
#[derive(Debug, Args)]
pub struct FdCheckArgs {
    /// A directory of scenarios (searched recursively) or scenario files.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// The kernel runner's helper program (default: `vfscale-fd-child` next to `vfscale`).
    #[arg(long)]
    pub child: Option<PathBuf>,
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

/// How the library wakes waiters (the herd's setting: NeilBrown's 2018 wait tree, or before it).
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
    /// The kernel target's directory, instead of a fresh one under /dev/shm (any
    /// mounted filesystem). Repeated: all show the same files (the first directory, and
    /// mounts of it or of its source), and the scenario's processes, in the order they
    /// start, take the directories in turn (process i on directory i mod n). Unless
    /// --one-lock-space, a mixed replay: the first is a source directory and the others
    /// mounts that mirror their locks on it; with --against both its results must then
    /// agree with the library's except for pids and, in an F_GETLK on the first
    /// directory, a lock held by the server for the processes on the others.
    #[arg(long = "dir", value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// The repeated --dir directories share one lock space (one directory given twice,
    /// bind mounts, the mounts of servers of one cluster): the results must be one
    /// directory's, compared exactly.
    #[arg(long)]
    pub one_lock_space: bool,
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
    /// The kernel target's directory, instead of a fresh one under /dev/shm per scenario
    /// (any mounted filesystem, e.g. a FUSE mount). Repeated, mixed replays as with
    /// `locks replay --dir`: the first is the source, the others show its files; a
    /// scenario a mixed replay cannot judge (a cycle, OFD or `interrupt` steps) is
    /// listed as skipped, with why (unless --one-lock-space).
    #[arg(long = "dir", value_name = "DIR")]
    pub dirs: Vec<PathBuf>,
    /// The repeated --dir directories share one lock space, as with `locks replay
    /// --one-lock-space`: every scenario is judged, exactly.
    #[arg(long)]
    pub one_lock_space: bool,
}

fn parse_workload(s: &str) -> Result<Workload, String> {
    Workload::from_name(s).ok_or_else(|| {
        let all: Vec<_> = Workload::ALL.iter().map(|w| w.name()).collect();
        format!("unknown workload {s:?}; expected one of {}", all.join(", "))
    })
}

fn parse_target(s: &str) -> Result<Target, String> {
    Target::from_name(s).ok_or_else(|| {
        let all: Vec<_> = Target::ALL.iter().map(|t| t.name()).collect();
        format!("unknown target {s:?}; expected one of {}", all.join(", "))
    })
}

fn parse_tasks(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=10_000).contains(&n) => Ok(n),
        _ => Err(format!("{s:?} is not a task count from 1 to 10000")),
    }
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(x) if x > 0.0 && x <= 3600.0 => Ok(x),
        _ => Err(format!("{s:?} is not a number of seconds in (0, 3600]")),
    }
}

/// `vfscale run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Where to write results.json, results.csv, report.md and report.html.
    #[arg(long, default_value = "vfscale-report")]
    pub out: std::path::PathBuf,
    /// Repetitions of each configuration.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: u32,
    /// A first look in under a minute: fewer tasks, shorter runs, same report.
    #[arg(long)]
    pub quick: bool,
    /// Print every table in full (every metric, mean ± sd) after the headline, instead
    /// of the summary.
    #[arg(long, short)]
    pub verbose: bool,
}

/// The workloads, for `vfscale bench --help`.
const WORKLOADS_HELP: &str = "Workloads:
  posix01, posix02    lockperf, per-inode file locks (Layton, 2013): whole-file POSIX
                      lock/unlock (01: one file, 02: a file each)
  flock01, flock02    lockperf, per-inode file locks (Layton, 2013): flock/unlock
                      (01: one file, 02: a file each)
  herd                wait tree of fs/locks.c (NeilBrown, 2018): N contenders for one
                      lock; modes flock, ofd, posix
  lock1, lock2        will-it-scale: 1-byte locks (1: a file each, 2: one file)
  lockmany            many locks held on one file (--held), the O(log n) index Linux
                      lacks; modes ofd, posix
  pipebench, opensock lock-free fd_install (Guzik, 2015): descriptor allocation and install
  dup1                will-it-scale dup1
  inodes              inode cache scalability (Chinner, 2023): create, walk, cold-walk,
                      chmod, unlink (--files per task); each run is a fresh child
                      process: an untimed warm-up pass, then the measured pass;
                      targets and task counts take turns run by run;
                      --mode evict: --files N,... inodes cached in all, bytes of
                      bookkeeping per inode and evict_inodes ns per inode (library only)
  loop                per-device loop lock (Tatashin, 2021): boot, open-close,
                      open-close-same, configure, churn, io
  cluster             several vfscalefs servers, one lock space on a 3-member etcd
                      it starts (root, /dev/fuse, etcd; ping_pong from Debian ctdb):
                      uncontended (lock/unlock through a clustered server over one
                      without --cluster, and etcd requests per lock), pingpong
                      (ping_pong FILE 3 through two servers, and one client's serial
                      etcd compare-and-swap rate), failover (a holder's server is
                      killed: time to the waiter's grant); --duration, --lease-ttl;
                      the vfscalefs next to vfscale, or $VFSCALEFS
  wakeup              a control: a token passed around a ring of N processes, each
                      hand-off one futex wake-up, all on one CPU (one-cpu) or on two
                      in turn (two-cpus, even N); a request over /dev/fuse pays up
                      to two; --duration

Targets: kernel (real system calls; run as root where a workload needs it), kernel-ext4,
library (vfscale), library-prepatch (vfscale with the design before the upstream change),
library-list, rwlock-hashmap, dashmap, moka (what a Rust user would pick instead),
partitioned (inodes' control: a table per task, nothing shared; how far this machine lets
such tasks scale).
Each workload has its own set; without --target every one of them runs.";

/// `vfscale bench`.
#[derive(Debug, Args)]
#[command(after_help = WORKLOADS_HELP)]
pub struct BenchArgs {
    /// The workload (see the list below).
    #[arg(value_parser = parse_workload)]
    pub workload: Workload,
    /// Targets, comma-separated (default: every target the workload has).
    #[arg(long, value_delimiter = ',', value_parser = parse_target)]
    pub target: Vec<Target>,
    /// Task counts, comma-separated (default: the workload's own).
    #[arg(long, value_delimiter = ',', value_parser = parse_tasks)]
    pub tasks: Vec<usize>,
    /// Modes, comma-separated (default: all of the workload's).
    #[arg(long, value_delimiter = ',')]
    pub mode: Vec<String>,
    /// Repetitions of each configuration.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub runs: u32,
    /// Measured interval of the timed workloads (herd, lock1, lock2, pipebench,
    /// opensock, dup1, loop, wakeup; cluster: per mode, ping_pong's readings), in seconds.
    #[arg(long, value_parser = parse_seconds, allow_negative_numbers = true)]
    pub duration: Option<f64>,
    /// Lock/unlock pairs per task of the lockperf workloads.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub iterations: Option<u64>,
    /// Files per task (inodes), comma-separated for several sizes; with --mode evict,
    /// inodes cached in all (e.g. 1000000,4000000: linearity is judged among sizes
    /// beyond twice the last-level cache).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub files: Vec<u64>,
    /// Locks held on the file, comma-separated (lockmany).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub held: Vec<u64>,
    /// Devices set up at boot (loop).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    pub devices: Option<u64>,
    /// The clustered servers' lease TTL in seconds (cluster; default 5).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(2..=3600))]
    pub lease_ttl: Option<u64>,
    /// Run the kernel targets in this directory (any mounted filesystem) instead of a
    /// fresh tmpfs directory; rows then name its filesystem in `fs`.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print one JSON document on stdout instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// `vfscale compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The baseline (`vfscale bench ... --json` or a run's results.json).
    pub a: std::path::PathBuf,
    /// The result to compare with it.
    pub b: std::path::PathBuf,
}
