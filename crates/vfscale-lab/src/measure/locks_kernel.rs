//! The kernel target: the lock workloads as real processes (or threads) making real
//! `fcntl(2)` and `flock(2)` calls on files in a fresh directory on tmpfs (`/dev/shm`), or
//! in the directory `--dir` names (any filesystem: a FUSE mount, say).
//!
//! # What each workload does
//!
//! * **posix01, posix02, flock01, flock02** (lockperf): `tasks` forked processes. In 01
//!   they all open the same file, in 02 each opens its own. Each does `iterations` pairs
//!   of lock and unlock — posix: `fcntl(F_SETLKW)` whole-file `F_WRLCK` then `F_UNLCK`;
//!   flock: `flock(LOCK_EX)` then `flock(LOCK_UN)` — and times its own loop with
//!   `CLOCK_MONOTONIC`. `total_lock_seconds` is the sum of the loop times (lockperf's
//!   "mean time" is this total, per run), `lock_unlock_ns` that total per pair, and
//!   `ops_per_sec` all pairs over the wall time from the go signal until the last loop
//!   ended.
//! * **herd** (the wait tree's test): `tasks` forked processes contend for one whole-file exclusive
//!   lock on a 0-byte file, in `cfg.mode`: `flock(LOCK_EX)`, `F_OFD_SETLKW` or `F_SETLKW`
//!   (each process opens the file itself, so each has its own open file description and
//!   is its own POSIX owner). Each loops lock → count += 1 → unlock until the stop flag
//!   is set. After `duration` the parent snapshots the counters and sets the flag;
//!   workers then finish (one blocked in a lock call gets it as the others release and
//!   exit). `acquisitions_per_sec` is the snapshot's sum over the measured interval;
//!   `min_per_worker`, `median_per_worker`, `mean_per_worker` and `max_per_worker` are
//!   taken over the snapshot, as is `jain_index` (Jain's fairness index, (Σx)²/(n·Σx²):
//!   1 when every worker got as many, 1/n when one got them all);
//!   `wait_p50_sec`/`wait_p99_sec`/`wait_max_sec` are the wait from the lock call to the
//!   grant over every acquisition until the stop flag (each worker times each call with
//!   the TSC, or `CLOCK_MONOTONIC` where the TSC is not constant, into its own
//!   histogram in shared memory, 1/16 resolution, merged after the run); and
//!   `context_switches_per_acquisition` the workers' voluntary + involuntary context
//!   switches (from each child's `wait4` rusage, so over their whole life: start-up,
//!   which is an open, one pipe write and one pipe read, and the drain after stop, are
//!   included) over the snapshot's acquisitions.
//! * **lock1, lock2** (will-it-scale): 1-byte `F_WRLCK` with `F_SETLK` then `F_UNLCK`,
//!   repeated for `duration`; lock1: each task its own file, byte 0; lock2: all tasks one
//!   file, task `i` byte `i` (no conflicts, one inode). Processes: forked children, each
//!   its own open and its own POSIX owner. Threads: threads of the calling process (one
//!   POSIX owner), each with its own open file description. `ops_per_sec` counts
//!   lock+unlock *pairs* (will-it-scale itself counts each call, twice as many).
//!
//! # Mechanics
//!
//! Processes are a [`Team`] of the harness: forked workers behind a pipe barrier, each
//! with a slot in shared memory (counter, loop time, errno), killed and reaped on every
//! path; what each does after the go signal is a `LockWork`, which runs after `fork`
//! and so makes only async-signal-safe system calls. Threads start behind a
//! [`StartGate`]. Files live in a [`ScratchDir`], removed with them.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use libc::{c_char, c_int};
use vfscale_conformance::harness::{
    self, errno, mono_ns, raise_nofile, Counter, ForkedWork, ScratchDir, SharedArray, StartGate, Team,
    WorkFailed, Worker,
};

use super::herd_metrics::{herd_fairness, WaitHistogram};
use super::{Config, LockMode, Sample, Skip, TaskKind, Workload, SHM_DIR};

/// Scratch directories are `<SHM_DIR>/<DIR_PREFIX>.<pid>.<n>`.
const DIR_PREFIX: &str = "vfscale-kernel";
/// How long all worker threads may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long workers of a timed workload may take to exit after the stop flag.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a lockperf run may take in all.
const LOCKPERF_TIMEOUT: Duration = Duration::from_secs(600);
/// Stack size of the worker threads of the threads shape.
const THREAD_STACK: usize = 64 * 1024;

/// Measures `cfg` once against the running kernel.
pub fn run(cfg: &Config) -> Result<Sample, Skip> {
    if cfg.tasks == 0 {
        return Err(Skip("no tasks: tasks must be at least 1".into()));
    }
    match cfg.workload {
        Workload::Herd => herd(cfg),
        Workload::Lock1 | Workload::Lock2 => match cfg.kind {
            TaskKind::Processes => will_it_scale_processes(cfg),
            TaskKind::Threads => will_it_scale_threads(cfg),
        },
        Workload::Posix01 | Workload::Posix02 | Workload::Flock01 | Workload::Flock02 => lockperf(cfg),
        Workload::Pipebench | Workload::Opensock | Workload::Dup1 => super::fd_kernel::run(cfg),
        w => Err(Skip(format!("{} has its own module", w.name()))),
    }
}

/// Whether the kernel target can run here: `/dev/shm` is a writable tmpfs directory, the
/// three lock families work on a file there, and `fork` works. `Err` says why not.
pub fn available() -> Result<(), Skip> {
    harness::check_tmpfs(Path::new(SHM_DIR))?;
    let dir = scratch_dir(None)?;
    let probe = dir.create_file("probe")?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(probe)
        .map_err(|e| Skip(format!("cannot open a file in {}: {e}", dir.path().display())))?;
    let fd = file.as_raw_fd();
    for (what, lock, unlock) in [
        (
            "flock",
            probe_flock(fd, libc::LOCK_EX | libc::LOCK_NB),
            probe_flock(fd, libc::LOCK_UN),
        ),
        (
            "F_SETLK",
            probe_fcntl(fd, libc::F_SETLK, libc::F_WRLCK),
            probe_fcntl(fd, libc::F_SETLK, libc::F_UNLCK),
        ),
        (
            "F_OFD_SETLK",
            probe_fcntl(fd, libc::F_OFD_SETLK, libc::F_WRLCK),
            probe_fcntl(fd, libc::F_OFD_SETLK, libc::F_UNLCK),
        ),
    ] {
        if let Err(e) = lock.and(unlock) {
            return Err(Skip(format!(
                "{what} does not work on {}: {e}",
                dir.path().display()
            )));
        }
    }
    Ok(harness::probe_fork()?)
}

fn probe_flock(fd: c_int, op: c_int) -> std::io::Result<()> {
    // SAFETY: plain system call on a descriptor we own.
    if unsafe { libc::flock(fd, op) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn probe_fcntl(fd: c_int, cmd: c_int, ty: c_int) -> std::io::Result<()> {
    let mut fl = flock_struct(ty, 0, 0);
    // SAFETY: plain system call with a pointer to a local struct.
    if unsafe { libc::fcntl(fd, cmd, &mut fl as *mut libc::flock) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

// ---------------------------------------------------------------------------------------
// The workloads.
// ---------------------------------------------------------------------------------------

/// lockperf posix01/02, flock01/02.
fn lockperf(cfg: &Config) -> Result<Sample, Skip> {
    let Some((mode, shared)) = cfg.workload.lockperf() else {
        return Err(Skip(format!(
            "{} is not a lockperf workload",
            cfg.workload.name()
        )));
    };
    if cfg.iterations == 0 {
        return Err(Skip("no iterations: iterations must be at least 1".into()));
    }
    let dir = scratch_dir(cfg.dir.as_deref())?;
    let paths = create_files(&dir, if shared { 1 } else { cfg.tasks })?;
    let work = LockWork::Lockperf {
        mode,
        iterations: cfg.iterations,
    };
    let mut team = Team::spawn(cfg.tasks, |i| (paths_for(&paths, i), work))?;
    team.wait_ready()?;
    let t0 = team.go();
    team.finish(LOCKPERF_TIMEOUT)?;
    let total_ns: u64 = (0..cfg.tasks)
        .map(|i| team.slot(i).loop_ns.load(Ordering::Relaxed))
        .sum();
    let last_end = (0..cfg.tasks)
        .map(|i| team.slot(i).end_ns.load(Ordering::Relaxed))
        .max()
        .unwrap_or(t0);
    let wall = last_end.saturating_sub(t0) as f64 / 1e9;
    let total = total_ns as f64 / 1e9;
    let pairs = cfg.tasks as f64 * cfg.iterations as f64;
    if total <= 0.0 || wall <= 0.0 {
        return Err(Skip(format!(
            "no measurable time: total {total} s, wall {wall} s"
        )));
    }
    let mut s = Sample::new();
    s.insert("total_lock_seconds".into(), total);
    s.insert("lock_unlock_ns".into(), total / pairs * 1e9);
    s.insert("ops_per_sec".into(), pairs / wall);
    Ok(s)
}

/// The herd (the wait tree's test).
///
/// Each worker also times every lock call (see [`HerdClock`]) and records the wait in
/// its own histogram in shared memory ([`HerdWaits`]), which the parent merges after
/// the workers have exited. Calls that end after the stop flag are not recorded.
fn herd(cfg: &Config) -> Result<Sample, Skip> {
    check_duration(cfg)?;
    let dir = scratch_dir(cfg.dir.as_deref())?;
    let paths = create_files(&dir, 1)?;
    let clock = HerdClock::detect();
    // Before the team, so that it is unmapped only after every worker is reaped.
    // SAFETY: zero is a valid HerdWaits (atomics), aligned to 8 bytes.
    let waits = unsafe { SharedArray::<HerdWaits>::new(cfg.tasks)? };
    let mode = cfg.mode;
    let mut team = Team::spawn(cfg.tasks, |i| {
        (
            paths_for(&paths, i),
            LockWork::Herd {
                mode,
                waits: waits.get(i),
                clock,
            },
        )
    })?;
    team.wait_ready()?;
    let t0 = team.go();
    let c0 = clock.now();
    std::thread::sleep(cfg.duration);
    let snapshot: Vec<u64> = (0..cfg.tasks)
        .map(|i| team.slot(i).count.load(Ordering::Relaxed))
        .collect();
    let t1 = mono_ns();
    let c1 = clock.now();
    team.stop();
    let usage = team.finish(DRAIN_TIMEOUT)?;
    let interval = t1.saturating_sub(t0) as f64 / 1e9;
    let acquired: u64 = snapshot.iter().sum();
    if acquired == 0 || interval <= 0.0 {
        return Err(Skip(format!(
            "no acquisitions in the measured interval ({interval} s)"
        )));
    }
    let switches: u64 = usage
        .iter()
        .map(|ru| (ru.ru_nvcsw.max(0) + ru.ru_nivcsw.max(0)) as u64)
        .sum();
    let mut hist = WaitHistogram::new();
    for i in 0..cfg.tasks {
        // SAFETY: every worker has exited (`finish`), so nothing writes the mapping.
        let w = unsafe { &*waits.get(i) };
        for (b, c) in w.counts.iter().enumerate() {
            hist.add_bucket(b, c.load(Ordering::Relaxed) as u64);
        }
        hist.set_max(w.max.load(Ordering::Relaxed));
    }
    let mut s = Sample::new();
    s.insert("acquisitions_per_sec".into(), acquired as f64 / interval);
    herd_fairness(
        &mut s,
        &snapshot,
        &hist,
        clock.seconds_per_tick(t1 - t0, c1.wrapping_sub(c0)),
    );
    s.insert(
        "context_switches_per_acquisition".into(),
        switches as f64 / acquired as f64,
    );
    Ok(s)
}

/// The clock herd workers time their lock calls with. The TSC where it ticks at one
/// rate in every CPU state and on every CPU (x86-64 with `constant_tsc` and
/// `nonstop_tsc`): reading it costs a third of a `clock_gettime` here, a few percent of
/// a kernel lock call; its rate is measured against `CLOCK_MONOTONIC` over the run.
/// Elsewhere `CLOCK_MONOTONIC` itself, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HerdClock {
    Tsc,
    Monotonic,
}

impl HerdClock {
    fn detect() -> HerdClock {
        if !cfg!(target_arch = "x86_64") {
            return HerdClock::Monotonic;
        }
        let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let flags = flags.lines().find(|l| l.starts_with("flags")).unwrap_or("");
        let has = |f: &str| flags.split_whitespace().any(|x| x == f);
        if has("constant_tsc") && has("nonstop_tsc") {
            HerdClock::Tsc
        } else {
            HerdClock::Monotonic
        }
    }

    /// Now, in ticks. Async-signal-safe (runs in the workers).
    fn now(self) -> u64 {
        match self {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: RDTSC reads a counter; it has no memory effects.
            HerdClock::Tsc => unsafe { core::arch::x86_64::_rdtsc() },
            _ => mono_ns(),
        }
    }

    /// Seconds per tick, from `ns` nanoseconds of `CLOCK_MONOTONIC` that took `ticks`.
    fn seconds_per_tick(self, ns: u64, ticks: u64) -> f64 {
        match self {
            HerdClock::Tsc if ticks > 0 => ns as f64 / 1e9 / ticks as f64,
            _ => 1e-9,
        }
    }
}

/// One herd worker's waits in the shared mapping: a histogram of clock ticks (buckets
/// of [`WaitHistogram`]) and the longest wait. Written by that worker only.
#[repr(C)]
struct HerdWaits {
    max: AtomicU64,
    counts: [AtomicU32; WaitHistogram::BUCKETS],
}

impl HerdWaits {
    /// Records a wait of `ticks`. Runs in a worker: no allocation, no panic.
    fn record(&self, ticks: u64) {
        if let Some(c) = self.counts.get(WaitHistogram::bucket(ticks)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
        if ticks > self.max.load(Ordering::Relaxed) {
            self.max.store(ticks, Ordering::Relaxed);
        }
    }
}

/// will-it-scale lock1/lock2 as forked processes.
fn will_it_scale_processes(cfg: &Config) -> Result<Sample, Skip> {
    check_duration(cfg)?;
    let shared = cfg.workload == Workload::Lock2;
    let dir = scratch_dir(cfg.dir.as_deref())?;
    let paths = create_files(&dir, if shared { 1 } else { cfg.tasks })?;
    let mut team = Team::spawn(cfg.tasks, |i| {
        let byte = if shared { i as i64 } else { 0 };
        (paths_for(&paths, i), LockWork::ByteLock { byte })
    })?;
    team.wait_ready()?;
    let t0 = team.go();
    std::thread::sleep(cfg.duration);
    let pairs: u64 = (0..cfg.tasks)
        .map(|i| team.slot(i).count.load(Ordering::Relaxed))
        .sum();
    let t1 = mono_ns();
    team.stop();
    team.finish(DRAIN_TIMEOUT)?;
    ops_sample(pairs, t1.saturating_sub(t0))
}

/// will-it-scale lock1/lock2 as threads of this process.
fn will_it_scale_threads(cfg: &Config) -> Result<Sample, Skip> {
    check_duration(cfg)?;
    let shared = cfg.workload == Workload::Lock2;
    let dir = scratch_dir(cfg.dir.as_deref())?;
    raise_nofile(cfg.tasks as u64 + 64)?;
    create_files(&dir, if shared { 1 } else { cfg.tasks })?;
    // Each thread its own open file description, as each will-it-scale task opens.
    let files = (0..cfg.tasks)
        .map(|i| {
            let p = dir.path().join(file_name(if shared { 0 } else { i }));
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&p)
                .map_err(|e| Skip(format!("cannot open {}: {e}", p.display())))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let counts: Vec<Counter> = (0..cfg.tasks).map(|_| Counter::default()).collect();
    let stop = AtomicBool::new(false);
    let failure = AtomicI32::new(0);
    let gate = StartGate::new();
    let (pairs, interval) = std::thread::scope(|s| -> Result<(u64, u64), Skip> {
        // Whatever happens below, the workers are released and stopped before the scope
        // joins them.
        let _release = Release {
            gate: &gate,
            stop: &stop,
        };
        for (i, file) in files.iter().enumerate() {
            let (fd, count, stop, failure, gate) = (file.as_raw_fd(), &counts[i], &stop, &failure, &gate);
            let byte = if shared { i as i64 } else { 0 };
            std::thread::Builder::new()
                .stack_size(THREAD_STACK)
                .spawn_scoped(s, move || {
                    if !gate.arrive_and_wait() {
                        return;
                    }
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let e = byte_lock(fd, byte);
                        if e != 0 {
                            failure.store(e, Ordering::Relaxed);
                            stop.store(true, Ordering::Relaxed);
                            return;
                        }
                        n += 1;
                        count.0.store(n, Ordering::Relaxed);
                    }
                })
                .map_err(|e| Skip(format!("cannot start thread {i} of {}: {e}", cfg.tasks)))?;
        }
        gate.wait_arrived(cfg.tasks, START_TIMEOUT)?;
        let t0 = mono_ns();
        gate.open();
        std::thread::sleep(cfg.duration);
        let pairs: u64 = counts.iter().map(|c| c.0.load(Ordering::Relaxed)).sum();
        let t1 = mono_ns();
        Ok((pairs, t1.saturating_sub(t0)))
    })?;
    match failure.load(Ordering::Relaxed) {
        0 => ops_sample(pairs, interval),
        e => Err(Skip(format!(
            "a worker thread's fcntl(F_SETLK) failed: {}",
            std::io::Error::from_raw_os_error(e)
        ))),
    }
}

fn check_duration(cfg: &Config) -> Result<(), Skip> {
    if cfg.duration.is_zero() {
        return Err(Skip(
            "no duration: a timed workload needs a duration above 0".into(),
        ));
    }
    Ok(())
}

fn ops_sample(pairs: u64, interval_ns: u64) -> Result<Sample, Skip> {
    if pairs == 0 || interval_ns == 0 {
        return Err(Skip(format!(
            "no lock/unlock pairs in the measured interval ({interval_ns} ns)"
        )));
    }
    let mut s = Sample::new();
    s.insert("ops_per_sec".into(), pairs as f64 / (interval_ns as f64 / 1e9));
    Ok(s)
}

/// Task `i`'s file among `paths`: its own, or the one shared file.
fn paths_for(paths: &[CString], i: usize) -> *const c_char {
    paths
        .get(i)
        .or_else(|| paths.first())
        .map_or(std::ptr::null(), |p| p.as_ptr())
}

fn file_name(i: usize) -> String {
    format!("f{i}")
}

/// A fresh scratch directory in `dir` (`--dir`: any filesystem, a FUSE mount say), or
/// under `/dev/shm` when `None`.
fn scratch_dir(dir: Option<&Path>) -> Result<ScratchDir, Skip> {
    Ok(ScratchDir::create(dir.unwrap_or(Path::new(SHM_DIR)), DIR_PREFIX)?)
}

/// Creates `n` empty files `f0`, `f1`, ... in `dir`; their paths as C strings.
fn create_files(dir: &ScratchDir, n: usize) -> Result<Vec<CString>, Skip> {
    (0..n)
        .map(|i| {
            let path = dir.create_file(&file_name(i))?;
            CString::new(path.as_os_str().as_bytes()).map_err(|e| Skip(format!("bad path: {e}")))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// Lock calls, shared by children and threads: system calls only, 0 or the errno.
// ---------------------------------------------------------------------------------------

/// A `struct flock` for `[start, start + len)` (`len` 0: to the end of the file) with
/// `l_pid` 0, as the OFD commands require.
fn flock_struct(ty: c_int, start: i64, len: i64) -> libc::flock {
    // SAFETY: all-zero is a valid `struct flock`.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    fl
}

/// Takes (`lock`) or drops the whole-file exclusive lock of `mode`, waiting if needed.
fn whole_file(fd: c_int, mode: LockMode, lock: bool) -> c_int {
    loop {
        let r = match mode {
            // SAFETY: plain system call.
            LockMode::Flock => unsafe { libc::flock(fd, if lock { libc::LOCK_EX } else { libc::LOCK_UN }) },
            LockMode::Ofd | LockMode::Posix => {
                let cmd = if mode == LockMode::Ofd {
                    libc::F_OFD_SETLKW
                } else {
                    libc::F_SETLKW
                };
                let mut fl = flock_struct(if lock { libc::F_WRLCK } else { libc::F_UNLCK }, 0, 0);
                // SAFETY: plain system call with a pointer to a local struct.
                unsafe { libc::fcntl(fd, cmd, &mut fl as *mut libc::flock) }
            }
        };
        if r == 0 {
            return 0;
        }
        match errno() {
            libc::EINTR => {}
            e => return e,
        }
    }
}

/// One will-it-scale pair: `F_SETLK` 1-byte `F_WRLCK` at `byte`, then `F_UNLCK`.
fn byte_lock(fd: c_int, byte: i64) -> c_int {
    for ty in [libc::F_WRLCK, libc::F_UNLCK] {
        let mut fl = flock_struct(ty, byte, 1);
        // SAFETY: plain system call with a pointer to a local struct.
        if unsafe { libc::fcntl(fd, libc::F_SETLK, &mut fl as *mut libc::flock) } != 0 {
            return errno();
        }
    }
    0
}

// ---------------------------------------------------------------------------------------
// What a forked worker does. Runs after fork: only async-signal-safe system calls, no
// allocation, no panics.
// ---------------------------------------------------------------------------------------

/// What a forked worker does after the go signal.
#[derive(Clone, Copy)]
enum LockWork {
    /// lockperf: `iterations` whole-file lock/unlock pairs, timed.
    Lockperf { mode: LockMode, iterations: u64 },
    /// herd: whole-file lock, count, unlock until stop; each lock call timed with `clock`
    /// into `waits` (none if null).
    Herd {
        mode: LockMode,
        waits: *const HerdWaits,
        clock: HerdClock,
    },
    /// will-it-scale: `F_SETLK` 1-byte lock/unlock at `byte` until stop.
    ByteLock { byte: i64 },
}

/// [`LockWork::STAGES`] indices.
const LOCK_CALL: WorkFailed = WorkFailed { stage: 0, errno: 0 };
const UNLOCK_CALL: WorkFailed = WorkFailed { stage: 1, errno: 0 };

/// `Err` of `stage` with `errno` unless `errno` is 0.
fn check(stage: WorkFailed, errno: c_int) -> Result<(), WorkFailed> {
    match errno {
        0 => Ok(()),
        errno => Err(WorkFailed { errno, ..stage }),
    }
}

impl ForkedWork for LockWork {
    const STAGES: &'static [&'static str] = &["the lock call", "the unlock call"];

    fn run(self, fd: c_int, worker: &Worker<'_>) -> Result<(), WorkFailed> {
        let slot = worker.slot;
        match self {
            LockWork::Lockperf { mode, iterations } => {
                let start = mono_ns();
                for _ in 0..iterations {
                    check(LOCK_CALL, whole_file(fd, mode, true))?;
                    check(UNLOCK_CALL, whole_file(fd, mode, false))?;
                }
                let end = mono_ns();
                slot.count.store(iterations, Ordering::Relaxed);
                slot.loop_ns.store(end.saturating_sub(start), Ordering::Relaxed);
                slot.end_ns.store(end, Ordering::Relaxed);
            }
            LockWork::Herd { mode, waits, clock } => {
                // SAFETY: null, or this worker's entry of a mapping that outlives it.
                let waits = unsafe { waits.as_ref() };
                let mut n = 0u64;
                while !worker.stop_requested() {
                    let t0 = clock.now();
                    let e = whole_file(fd, mode, true);
                    let t1 = clock.now();
                    check(LOCK_CALL, e)?;
                    n = n.wrapping_add(1);
                    slot.count.store(n, Ordering::Relaxed);
                    if let Some(w) = waits {
                        if !worker.stop_requested() {
                            w.record(t1.wrapping_sub(t0));
                        }
                    }
                    check(UNLOCK_CALL, whole_file(fd, mode, false))?;
                }
            }
            LockWork::ByteLock { byte } => {
                let mut n = 0u64;
                while !worker.stop_requested() {
                    check(LOCK_CALL, byte_lock(fd, byte))?;
                    n = n.wrapping_add(1);
                    slot.count.store(n, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The threads shape's clean-up.
// ---------------------------------------------------------------------------------------

/// On drop: aborts the gate if still closed and sets the stop flag, so that every worker
/// thread ends.
struct Release<'a> {
    gate: &'a StartGate,
    stop: &'a AtomicBool,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.gate.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::time::Instant;

    use super::*;

    /// The tests fork and check that no child is left, so they run one at a time, and
    /// not beside another module's test that starts processes.
    fn serial() -> std::sync::MutexGuard<'static, ()> {
        crate::measure::child_processes()
    }

    /// `available()`, or prints why not and says to skip.
    fn skip_unless_available() -> bool {
        match available() {
            Ok(()) => false,
            Err(why) => {
                let _ = std::io::stderr().write_all(format!("SKIP: {why}\n").as_bytes());
                true
            }
        }
    }

    fn cfg(workload: Workload, tasks: usize) -> Config {
        Config {
            workload,
            tasks,
            mode: LockMode::Posix,
            kind: TaskKind::Processes,
            iterations: 2_000,
            duration: Duration::from_millis(200),
            modes: Vec::new(),
            size: 0,
            dir: None,
            targets: None,
            lease_ttl: crate::measure::cluster::DEFAULT_LEASE_TTL,
        }
    }

    /// No child left to reap, no scratch directory of this process left.
    fn assert_nothing_left() {
        let mut status = 0;
        // SAFETY: waitpid with a local status.
        let r = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        assert_eq!((r, errno()), (-1, libc::ECHILD), "a child is left");
        let mine = format!("{DIR_PREFIX}.{}.", std::process::id());
        let left: Vec<_> = std::fs::read_dir(SHM_DIR)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(&mine))
            .map(|e| e.path())
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }

    fn assert_metrics(s: &Sample, keys: &[&str], what: &str) {
        let got: Vec<&str> = s.keys().map(crate::result::Metric::name).collect();
        let mut want = keys.to_vec();
        want.sort_unstable();
        assert_eq!(got, want, "{what}");
        for (_, k, v) in s.metrics() {
            assert!(v.is_finite() && v >= 0.0, "{what}: {k} = {v}");
        }
    }

    #[test]
    fn available_cleans_up() {
        let _g = serial();
        if skip_unless_available() {
            return;
        }
        assert_nothing_left();
    }

    #[test]
    fn lockperf_workloads_report_time_and_throughput() {
        let _g = serial();
        if skip_unless_available() {
            return;
        }
        for w in [
            Workload::Posix01,
            Workload::Posix02,
            Workload::Flock01,
            Workload::Flock02,
        ] {
            let s = run(&cfg(w, 3)).unwrap_or_else(|e| panic!("{w:?}: {e}"));
            assert_metrics(
                &s,
                &["total_lock_seconds", "lock_unlock_ns", "ops_per_sec"],
                w.name(),
            );
            assert!(
                s["total_lock_seconds"] > 0.0 && s["ops_per_sec"] > 0.0,
                "{w:?}: {s:?}"
            );
            let per_pair = s["total_lock_seconds"] / 6_000.0 * 1e9;
            assert!(
                (s["lock_unlock_ns"] - per_pair).abs() < 1e-6 * per_pair,
                "{w:?}: {s:?}"
            );
            assert_nothing_left();
        }
    }

    #[test]
    fn herd_of_20_in_each_mode() {
        let _g = serial();
        if skip_unless_available() {
            return;
        }
        for mode in LockMode::ALL {
            let mut c = cfg(Workload::Herd, 20);
            c.mode = mode;
            let t = Instant::now();
            let s = run(&c).unwrap_or_else(|e| panic!("{mode:?}: {e}"));
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{mode:?} took {:?}",
                t.elapsed()
            );
            assert_metrics(
                &s,
                &[
                    "acquisitions_per_sec",
                    "min_per_worker",
                    "max_per_worker",
                    "mean_per_worker",
                    "median_per_worker",
                    "jain_index",
                    "wait_p50_sec",
                    "wait_p99_sec",
                    "wait_max_sec",
                    "context_switches_per_acquisition",
                ],
                mode.name(),
            );
            assert!(s["acquisitions_per_sec"] > 0.0, "{mode:?}: {s:?}");
            assert!(s["min_per_worker"] <= s["median_per_worker"], "{mode:?}: {s:?}");
            assert!(s["median_per_worker"] <= s["max_per_worker"], "{mode:?}: {s:?}");
            assert!(
                s["jain_index"] > 0.0 && s["jain_index"] <= 1.0 + 1e-9,
                "{mode:?}: {s:?}"
            );
            assert!(s["wait_p50_sec"] <= s["wait_p99_sec"], "{mode:?}: {s:?}");
            assert!(s["wait_p99_sec"] <= s["wait_max_sec"], "{mode:?}: {s:?}");
            // A kernel lock call takes at least 100 ns, and none here waits a minute.
            assert!(
                s["wait_max_sec"] > 1e-7 && s["wait_max_sec"] < 60.0,
                "{mode:?}: {s:?}"
            );
            assert!(s["max_per_worker"] > 0.0, "{mode:?}: {s:?}");
            assert_nothing_left();
        }
    }

    #[test]
    fn herd_of_300_starts_and_drains_quickly() {
        let _g = serial();
        if skip_unless_available() {
            return;
        }
        let mut c = cfg(Workload::Herd, 300);
        c.mode = LockMode::Posix;
        let t = Instant::now();
        let s = run(&c).unwrap_or_else(|e| panic!("{e}"));
        assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
        assert!(s["acquisitions_per_sec"] > 0.0, "{s:?}");
        assert_nothing_left();
    }

    #[test]
    fn will_it_scale_as_processes_and_threads() {
        let _g = serial();
        if skip_unless_available() {
            return;
        }
        for w in [Workload::Lock1, Workload::Lock2] {
            for kind in [TaskKind::Processes, TaskKind::Threads] {
                let mut c = cfg(w, 3);
                c.kind = kind;
                let s = run(&c).unwrap_or_else(|e| panic!("{w:?} {kind:?}: {e}"));
                assert_metrics(&s, &["ops_per_sec"], w.name());
                assert!(s["ops_per_sec"] > 0.0, "{w:?} {kind:?}: {s:?}");
                assert_nothing_left();
            }
        }
    }

    #[test]
    fn bad_configurations_are_skipped_without_residue() {
        let _g = serial();
        if skip_unless_available() {
            return;
        }
        let mut c = cfg(Workload::Herd, 0);
        assert!(run(&c).is_err());
        c.tasks = 2;
        c.duration = Duration::ZERO;
        assert!(run(&c).is_err());
        let mut c = cfg(Workload::Posix01, 2);
        c.iterations = 0;
        assert!(run(&c).is_err());
        assert_nothing_left();
    }

    #[test]
    fn a_failing_worker_is_a_skip_and_everyone_is_cleaned_up() {
        let _g = serial();
        if skip_unless_available() {
            return;
        }
        // Worker 3 of 6 cannot open its file; the others are already at the barrier or
        // on their way there, and must be killed and reaped.
        let dir = scratch_dir(None).unwrap();
        let paths = create_files(&dir, 1).unwrap();
        let missing = CString::new(dir.path().join("missing").as_os_str().as_bytes()).unwrap();
        let result = Team::spawn(6, |i| {
            let p = if i == 3 {
                missing.as_ptr()
            } else {
                paths[0].as_ptr()
            };
            (
                p,
                LockWork::Herd {
                    mode: LockMode::Flock,
                    waits: std::ptr::null(),
                    clock: HerdClock::Monotonic,
                },
            )
        })
        .and_then(|mut team| team.wait_ready());
        let why = result.expect_err("a worker could not open its file");
        assert!(why.to_string().contains("worker 3: open failed"), "{why}");
        drop(dir);
        assert_nothing_left();
        // A team dropped while its workers run is killed and reaped too.
        let dir = scratch_dir(None).unwrap();
        let paths = create_files(&dir, 1).unwrap();
        let mut team =
            Team::spawn(4, |i| (paths[0].as_ptr(), LockWork::ByteLock { byte: i as i64 })).unwrap();
        team.wait_ready().unwrap();
        team.go();
        std::thread::sleep(Duration::from_millis(20));
        drop(team);
        drop(dir);
        assert_nothing_left();
    }
}
