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
//! * **herd** (seed 003): `tasks` forked processes contend for one whole-file exclusive
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
//! Shared state between the parent and its children is an anonymous `MAP_SHARED`
//! mapping: a header (go and stop flags) and one 128-byte slot per worker (counter, loop
//! time, errno). Children start behind a barrier: each writes one byte to a status pipe
//! when ready and blocks reading a go pipe, which the parent closes to start them all at
//! once. The status pipe's write end stays open in every child until it exits, so its
//! end-of-file tells the parent that all have exited. Everything created — children, the
//! mapping, descriptors, the scratch directory — is owned by a guard that kills, reaps,
//! unmaps, closes and removes on every path.
//!
//! The caller may be multi-threaded, so after `fork` a child makes only async-signal-safe
//! system calls on data prepared before `fork`: no allocation, no locks, no std I/O, no
//! panics (see `child_main`). Children die with the forking thread
//! (`PR_SET_PDEATHSIG`), which outlives them.

use std::ffi::CString;
use std::fmt::Write as _;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use libc::{c_char, c_int, pid_t};

use super::gate::{Gate, GateState, Padded};
use super::library::{herd_fairness, WaitHistogram};
use super::{Config, LockMode, Sample, Skip, TaskKind, Workload, SHM_DIR};

/// Scratch directories are `<SHM_DIR>/<DIR_PREFIX>.<pid>.<n>`.
const DIR_PREFIX: &str = "vfscale-kernel";
/// How long all workers may take to start and report ready.
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
    check_tmpfs(Path::new(SHM_DIR))?;
    let dir = ScratchDir::new()?;
    dir.create_file("probe")?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dir.path.join("probe"))
        .map_err(|e| Skip(format!("cannot open a file in {}: {e}", dir.path.display())))?;
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
                dir.path.display()
            )));
        }
    }
    let mut children = Children::with_capacity(1);
    // SAFETY: the child only calls `_exit`.
    match unsafe { libc::fork() } {
        -1 => return Err(Skip(format!("fork failed: {}", std::io::Error::last_os_error()))),
        0 => child_exit(0),
        pid => children.push(pid),
    }
    let (status, _) = children.reap(0)?;
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        return Err(Skip(format!(
            "a forked probe child ended with status {status:#x}"
        )));
    }
    Ok(())
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
    let dir = ScratchDir::in_dir(cfg.dir.as_deref())?;
    let paths = dir.create_files(if shared { 1 } else { cfg.tasks })?;
    let work = Work::Lockperf {
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

/// Seed 003's herd.
///
/// Each worker also times every lock call (see [`HerdClock`]) and records the wait in
/// its own histogram in shared memory ([`HerdWaits`]), which the parent merges after
/// the workers have exited. Calls that end after the stop flag are not recorded.
fn herd(cfg: &Config) -> Result<Sample, Skip> {
    check_duration(cfg)?;
    let dir = ScratchDir::in_dir(cfg.dir.as_deref())?;
    let paths = dir.create_files(1)?;
    let clock = HerdClock::detect();
    // Before the team, so that it is unmapped only after every worker is reaped.
    let waits = WaitsMap::new(cfg.tasks)?;
    let mode = cfg.mode;
    let mut team = Team::spawn(cfg.tasks, |i| {
        (
            paths_for(&paths, i),
            Work::Herd {
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

/// An anonymous shared mapping of `n` [`HerdWaits`], all zero at first.
struct WaitsMap {
    base: *mut libc::c_void,
    len: usize,
    n: usize,
}

impl WaitsMap {
    fn new(n: usize) -> Result<WaitsMap, Skip> {
        let len = n.max(1) * std::mem::size_of::<HerdWaits>();
        // SAFETY: a fresh anonymous mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Skip(format!(
                "cannot map {len} bytes of shared memory: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(WaitsMap { base, len, n })
    }

    /// Worker `i`'s waits; the pointer is valid while `self` lives.
    fn get(&self, i: usize) -> *const HerdWaits {
        assert!(i < self.n, "worker {i} of {}", self.n);
        // SAFETY: entry `i < n` lies inside the mapping (page-aligned, so aligned for
        // the atomics; zero is a valid value of each).
        unsafe { (self.base as *const HerdWaits).add(i) }
    }
}

impl Drop for WaitsMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; callers keep no reference
        // past `self` (workers are reaped before it drops).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// will-it-scale lock1/lock2 as forked processes.
fn will_it_scale_processes(cfg: &Config) -> Result<Sample, Skip> {
    check_duration(cfg)?;
    let shared = cfg.workload == Workload::Lock2;
    let dir = ScratchDir::in_dir(cfg.dir.as_deref())?;
    let paths = dir.create_files(if shared { 1 } else { cfg.tasks })?;
    let mut team = Team::spawn(cfg.tasks, |i| {
        let byte = if shared { i as i64 } else { 0 };
        (paths_for(&paths, i), Work::ByteLock { byte })
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
    let dir = ScratchDir::in_dir(cfg.dir.as_deref())?;
    ensure_nofile(cfg.tasks as u64 + 64)?;
    dir.create_files(if shared { 1 } else { cfg.tasks })?;
    // Each thread its own open file description, as each will-it-scale task opens.
    let files = (0..cfg.tasks)
        .map(|i| {
            let p = dir.path.join(file_name(if shared { 0 } else { i }));
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&p)
                .map_err(|e| Skip(format!("cannot open {}: {e}", p.display())))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let counts: Vec<Padded> = (0..cfg.tasks).map(|_| Padded::default()).collect();
    let stop = AtomicBool::new(false);
    let failure = AtomicI32::new(0);
    let gate = Gate::default();
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
        gate.wait_ready(cfg.tasks, START_TIMEOUT).map_err(Skip)?;
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

/// The calling thread's `errno`.
fn errno() -> c_int {
    // SAFETY: `__errno_location` returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() }
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

/// `CLOCK_MONOTONIC` in nanoseconds (one clock for all processes).
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass; it is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    // Wrapping: this also runs in children, which must not panic.
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

// ---------------------------------------------------------------------------------------
// Shared memory between the parent and the children.
// ---------------------------------------------------------------------------------------

/// The run's flags.
#[repr(C, align(128))]
struct Header {
    /// Set (1) by the parent just before it opens the barrier; a child woken without it
    /// exits (the parent went away or gave up).
    go: AtomicU32,
    /// Set (1) by the parent to end a timed workload.
    stop: AtomicU32,
}

/// One worker's slot; 128 bytes so that neighbours share neither a cache line nor an
/// adjacent-line prefetch pair.
#[repr(C, align(128))]
struct Slot {
    /// Herd: acquisitions; will-it-scale: lock/unlock pairs; lockperf: pairs done.
    count: AtomicU64,
    /// lockperf: the time spent in the loop.
    loop_ns: AtomicU64,
    /// lockperf: `CLOCK_MONOTONIC` when the loop ended.
    end_ns: AtomicU64,
    /// The stage that failed ([`STAGES`] index + 1), 0 if none.
    stage: AtomicU32,
    /// The errno of the failure.
    errno: AtomicI32,
}

/// An anonymous shared mapping of a [`Header`] and `n` [`Slot`]s, all zero at first.
struct Shared {
    base: *mut libc::c_void,
    len: usize,
    n: usize,
}

impl Shared {
    fn new(n: usize) -> Result<Shared, Skip> {
        let len = std::mem::size_of::<Header>() + n * std::mem::size_of::<Slot>();
        // SAFETY: a fresh anonymous mapping; no existing memory is touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Skip(format!(
                "cannot map {len} bytes of shared memory: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(Shared { base, len, n })
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping starts with a Header (page-aligned, zero = valid atomics)
        // and lives as long as `self`.
        unsafe { &*(self.base as *const Header) }
    }

    fn slot(&self, i: usize) -> &Slot {
        assert!(i < self.n, "slot {i} of {}", self.n);
        // SAFETY: slot `i < n` lies inside the mapping, suitably aligned.
        unsafe {
            &*(self.base as *const u8)
                .add(std::mem::size_of::<Header>())
                .cast::<Slot>()
                .add(i)
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no reference outlives `self`.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

// ---------------------------------------------------------------------------------------
// The child side. Everything from here to the parent side runs after fork: only
// async-signal-safe system calls on data prepared before fork, no allocation, no panics.
// ---------------------------------------------------------------------------------------

/// The child's go pipe (read end) and status pipe (write end) are placed at these
/// numbers; every other inherited descriptor is closed.
const GO_FD: c_int = 0;
const STATUS_FD: c_int = 1;

/// What a failing child reports, by index + 1 in `Slot::stage`.
const STAGES: [&str; 7] = [
    "prctl(PR_SET_PDEATHSIG)",
    "placing its pipes (dup2)",
    "close_range",
    "open",
    "waiting for the go signal",
    "the lock call",
    "the unlock call",
];
const STAGE_PDEATHSIG: u32 = 1;
const STAGE_FDS: u32 = 2;
const STAGE_CLOSE: u32 = 3;
const STAGE_OPEN: u32 = 4;
const STAGE_GO: u32 = 5;
const STAGE_LOCK: u32 = 6;
const STAGE_UNLOCK: u32 = 7;

/// What a child does after the go signal.
#[derive(Clone, Copy)]
enum Work {
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

/// Everything a child needs, prepared before `fork`.
struct ChildSpec {
    parent: pid_t,
    go_r: c_int,
    status_w: c_int,
    path: *const c_char,
    header: *const Header,
    slot: *const Slot,
    work: Work,
}

/// Ends the child without running anything of the parent's (`_exit`, not `exit`).
fn child_exit(status: c_int) -> ! {
    // SAFETY: `_exit` is async-signal-safe.
    unsafe { libc::_exit(status) }
}

/// Records the failure in the slot, tells the parent, and exits.
fn child_fail(slot: &Slot, status_fd: c_int, stage: u32, err: c_int) -> ! {
    slot.errno.store(err, Ordering::Relaxed);
    slot.stage.store(stage, Ordering::Release);
    // SAFETY: a one-byte write from a static.
    unsafe { libc::write(status_fd, b"E".as_ptr().cast(), 1) };
    child_exit(1)
}

/// A worker's life: set up, report ready, wait for go, work, exit. Never returns.
fn child_main(s: &ChildSpec) -> ! {
    // SAFETY: the mapping outlives the child (it is inherited and never unmapped here).
    let (hdr, slot) = unsafe { (&*s.header, &*s.slot) };
    // SAFETY: plain system calls on integers.
    unsafe {
        // Die with the parent (strictly: the forking thread, which waits for us), or a
        // worker could be left looping or blocked forever.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
            child_fail(slot, s.status_w, STAGE_PDEATHSIG, errno());
        }
        if libc::getppid() != s.parent {
            child_exit(2);
        }
        // Move both pipe ends above the fixed numbers first, so placing one cannot
        // overwrite the other, then place them.
        let go = libc::fcntl(s.go_r, libc::F_DUPFD, STATUS_FD + 1);
        let status = libc::fcntl(s.status_w, libc::F_DUPFD, STATUS_FD + 1);
        if go < 0 || status < 0 {
            child_fail(slot, s.status_w, STAGE_FDS, errno());
        }
        if libc::dup2(go, GO_FD) != GO_FD || libc::dup2(status, STATUS_FD) != STATUS_FD {
            child_fail(slot, s.status_w, STAGE_FDS, errno());
        }
        // Everything else goes: above all the go pipe's write end (or the barrier never
        // opens) and the status pipe's read end; also other workers' files.
        if libc::syscall(
            libc::SYS_close_range,
            (STATUS_FD + 1) as libc::c_uint,
            libc::c_uint::MAX,
            0,
        ) != 0
        {
            child_fail(slot, STATUS_FD, STAGE_CLOSE, errno());
        }
        let fd = libc::open(s.path, libc::O_RDWR);
        if fd < 0 {
            child_fail(slot, STATUS_FD, STAGE_OPEN, errno());
        }
        libc::write(STATUS_FD, b"R".as_ptr().cast(), 1);
        // The barrier: the parent closes the go pipe's write end.
        let mut byte = 0u8;
        loop {
            match libc::read(GO_FD, (&mut byte as *mut u8).cast(), 1) {
                0 => break,
                n if n < 0 && errno() == libc::EINTR => {}
                n if n < 0 => child_fail(slot, STATUS_FD, STAGE_GO, errno()),
                _ => {}
            }
        }
        if hdr.go.load(Ordering::Acquire) == 0 {
            child_exit(0);
        }
        child_work(fd, s.work, hdr, slot)
    }
}

/// The measured part of a worker.
fn child_work(fd: c_int, work: Work, hdr: &Header, slot: &Slot) -> ! {
    match work {
        Work::Lockperf { mode, iterations } => {
            let start = mono_ns();
            for _ in 0..iterations {
                let e = whole_file(fd, mode, true);
                if e != 0 {
                    child_fail(slot, STATUS_FD, STAGE_LOCK, e);
                }
                let e = whole_file(fd, mode, false);
                if e != 0 {
                    child_fail(slot, STATUS_FD, STAGE_UNLOCK, e);
                }
            }
            let end = mono_ns();
            slot.count.store(iterations, Ordering::Relaxed);
            slot.loop_ns.store(end.saturating_sub(start), Ordering::Relaxed);
            slot.end_ns.store(end, Ordering::Relaxed);
        }
        Work::Herd { mode, waits, clock } => {
            // SAFETY: null, or this worker's entry of a mapping that outlives it.
            let waits = unsafe { waits.as_ref() };
            let mut n = 0u64;
            while hdr.stop.load(Ordering::Relaxed) == 0 {
                let t0 = clock.now();
                let e = whole_file(fd, mode, true);
                let t1 = clock.now();
                if e != 0 {
                    child_fail(slot, STATUS_FD, STAGE_LOCK, e);
                }
                n = n.wrapping_add(1);
                slot.count.store(n, Ordering::Relaxed);
                if let Some(w) = waits {
                    if hdr.stop.load(Ordering::Relaxed) == 0 {
                        w.record(t1.wrapping_sub(t0));
                    }
                }
                let e = whole_file(fd, mode, false);
                if e != 0 {
                    child_fail(slot, STATUS_FD, STAGE_UNLOCK, e);
                }
            }
        }
        Work::ByteLock { byte } => {
            let mut n = 0u64;
            while hdr.stop.load(Ordering::Relaxed) == 0 {
                let e = byte_lock(fd, byte);
                if e != 0 {
                    child_fail(slot, STATUS_FD, STAGE_LOCK, e);
                }
                n = n.wrapping_add(1);
                slot.count.store(n, Ordering::Relaxed);
            }
        }
    }
    child_exit(0)
}

// ---------------------------------------------------------------------------------------
// The parent side.
// ---------------------------------------------------------------------------------------

/// Forked children not yet reaped; dropping kills (`SIGKILL`) and reaps them.
struct Children {
    pids: Vec<pid_t>,
}

impl Children {
    fn with_capacity(n: usize) -> Children {
        Children {
            pids: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, pid: pid_t) {
        self.pids.push(pid);
    }

    /// Waits for child `index` (blocking) and forgets it: its wait status and rusage.
    fn reap(&mut self, index: usize) -> Result<(c_int, libc::rusage), Skip> {
        let pid = self.pids[index];
        // SAFETY: all-zero is a valid rusage.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let mut status = 0;
        loop {
            // SAFETY: wait4 writes into the two locals.
            let r = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
            if r == pid {
                self.pids[index] = 0;
                return Ok((status, ru));
            }
            let e = errno();
            if e != libc::EINTR {
                return Err(Skip(format!(
                    "waiting for worker {pid}: {}",
                    std::io::Error::from_raw_os_error(e)
                )));
            }
        }
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for &pid in self.pids.iter().filter(|&&p| p > 0) {
            // SAFETY: `pid` is our unreaped child, so it cannot have been reused.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        for &pid in self.pids.iter().filter(|&&p| p > 0) {
            let mut status = 0;
            // SAFETY: waits for our own child; the status goes into a local.
            while unsafe { libc::waitpid(pid, &mut status, 0) } < 0 && errno() == libc::EINTR {}
        }
        self.pids.clear();
    }
}

/// A team of forked workers with their pipes and shared slots. Fields drop in order:
/// children are killed and reaped first.
struct Team {
    children: Children,
    go_w: Option<OwnedFd>,
    status_r: OwnedFd,
    shared: Shared,
    tasks: usize,
}

fn pipe() -> Result<(OwnedFd, OwnedFd), Skip> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Skip(format!("pipe2: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: both are fresh descriptors that nothing else owns.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

impl Team {
    /// Forks `tasks` workers; worker `i` opens the file `spec(i).0` and does `spec(i).1`.
    /// They wait at the barrier until [`Team::go`].
    fn spawn(tasks: usize, spec: impl Fn(usize) -> (*const c_char, Work)) -> Result<Team, Skip> {
        let shared = Shared::new(tasks)?;
        let (go_r, go_w) = pipe()?;
        let (status_r, status_w) = pipe()?;
        let mut team = Team {
            children: Children::with_capacity(tasks),
            go_w: Some(go_w),
            status_r,
            shared,
            tasks,
        };
        // SAFETY: getpid has no preconditions.
        let parent = unsafe { libc::getpid() };
        for i in 0..tasks {
            let (path, work) = spec(i);
            let child = ChildSpec {
                parent,
                go_r: go_r.as_raw_fd(),
                status_w: status_w.as_raw_fd(),
                path,
                header: team.shared.header(),
                slot: team.shared.slot(i),
                work,
            };
            // SAFETY: the child runs only `child_main`, which makes async-signal-safe
            // system calls on `child` (a copy in its own memory) and never returns.
            match unsafe { libc::fork() } {
                -1 => {
                    return Err(Skip(format!(
                        "fork failed after {i} of {tasks} workers: {}",
                        std::io::Error::last_os_error()
                    )))
                }
                0 => child_main(&child),
                pid => team.children.push(pid),
            }
        }
        // The children hold the status pipe's write end until they exit; the parent's
        // copy goes so that end-of-file means "all exited".
        drop(status_w);
        drop(go_r);
        Ok(team)
    }

    fn slot(&self, i: usize) -> &Slot {
        self.shared.slot(i)
    }

    /// The first worker that reported a failure, as a reason.
    fn failure(&self) -> Option<Skip> {
        (0..self.tasks).find_map(|i| {
            let slot = self.slot(i);
            match slot.stage.load(Ordering::Acquire) {
                0 => None,
                stage => Some(Skip(format!(
                    "worker {i}: {} failed: {}",
                    STAGES.get(stage as usize - 1).copied().unwrap_or("?"),
                    std::io::Error::from_raw_os_error(slot.errno.load(Ordering::Relaxed))
                ))),
            }
        })
    }

    /// Reads the status pipe until `want` ready bytes (Some) or end-of-file (None) or the
    /// timeout. Returns the ready bytes seen; any error byte is an error.
    fn read_status(&self, want: Option<usize>, timeout: Duration, what: &str) -> Result<usize, Skip> {
        let deadline = Instant::now() + timeout;
        let mut ready = 0;
        let mut buf = [0u8; 4096];
        loop {
            if want.is_some_and(|w| ready >= w) {
                return Ok(ready);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Skip(format!(
                    "workers did not {what} within {timeout:?} ({ready} of {} ready)",
                    self.tasks
                )));
            }
            let mut pfd = libc::pollfd {
                fd: self.status_r.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, 60_000) as c_int;
            // SAFETY: poll on one pollfd we own.
            let r = unsafe { libc::poll(&mut pfd, 1, ms) };
            if r < 0 && errno() != libc::EINTR {
                return Err(Skip(format!("poll: {}", std::io::Error::last_os_error())));
            }
            if r <= 0 {
                continue;
            }
            // SAFETY: reads into a local buffer of the given size.
            let n = unsafe { libc::read(self.status_r.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            match n {
                0 => {
                    return match want {
                        None => Ok(ready),
                        Some(_) => Err(self.failure().unwrap_or_else(|| {
                            Skip(format!(
                                "workers exited before all were ready ({ready} of {})",
                                self.tasks
                            ))
                        })),
                    }
                }
                n if n < 0 => {
                    if errno() != libc::EINTR {
                        return Err(Skip(format!(
                            "reading the status pipe: {}",
                            std::io::Error::last_os_error()
                        )));
                    }
                }
                n => {
                    let got = &buf[..n as usize];
                    if got.contains(&b'E') {
                        return Err(self
                            .failure()
                            .unwrap_or_else(|| Skip("a worker failed without saying why".into())));
                    }
                    ready += got.iter().filter(|&&b| b == b'R').count();
                }
            }
        }
    }

    /// Waits until every worker is at the barrier.
    fn wait_ready(&mut self) -> Result<(), Skip> {
        self.read_status(Some(self.tasks), START_TIMEOUT, "start")
            .map(|_| ())
    }

    /// Opens the barrier; returns the time it did.
    fn go(&mut self) -> u64 {
        self.shared.header().go.store(1, Ordering::Release);
        let t0 = mono_ns();
        self.go_w = None;
        t0
    }

    /// Tells the workers of a timed workload to finish.
    fn stop(&self) {
        self.shared.header().stop.store(1, Ordering::Release);
    }

    /// Waits until every worker has exited (within `timeout`), reaps them all and checks
    /// they succeeded; their rusage, in worker order.
    fn finish(&mut self, timeout: Duration) -> Result<Vec<libc::rusage>, Skip> {
        self.read_status(None, timeout, "exit")?;
        let mut usage = Vec::with_capacity(self.tasks);
        let mut bad = None;
        for i in 0..self.children.pids.len() {
            let (status, ru) = self.children.reap(i)?;
            if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) && bad.is_none() {
                bad = Some((i, status));
            }
            usage.push(ru);
        }
        if let Some((i, status)) = bad {
            return Err(self.failure().unwrap_or_else(|| {
                let mut why = format!("worker {i} ended with wait status {status:#x}");
                if libc::WIFSIGNALED(status) {
                    let _ = write!(why, " (signal {})", libc::WTERMSIG(status));
                }
                Skip(why)
            }));
        }
        Ok(usage)
    }
}

/// A fresh scratch directory under `/dev/shm` (or `--dir`), removed with everything in
/// it on drop.
struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    fn new() -> Result<ScratchDir, Skip> {
        Self::in_dir(None)
    }

    /// A fresh directory in `dir` (`--dir`: any filesystem, a FUSE mount say), or under
    /// `/dev/shm` when `None`.
    fn in_dir(dir: Option<&Path>) -> Result<ScratchDir, Skip> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = dir.unwrap_or(Path::new(SHM_DIR));
        let mut last = None;
        for _ in 0..100 {
            let path = base.join(format!(
                "{DIR_PREFIX}.{}.{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(ScratchDir { path }),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => {
                    return Err(Skip(format!(
                        "cannot create a directory in {}: {e}",
                        base.display()
                    )))
                }
            }
        }
        Err(Skip(format!(
            "cannot create a fresh directory in {}: {last:?}",
            base.display()
        )))
    }

    /// Creates the empty file `name`; its path as a C string.
    fn create_file(&self, name: &str) -> Result<CString, Skip> {
        let path = self.path.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Skip(format!("cannot create {}: {e}", path.display())))?;
        CString::new(path.as_os_str().as_bytes()).map_err(|e| Skip(format!("bad path: {e}")))
    }

    /// Creates `n` empty files `f0`, `f1`, ...
    fn create_files(&self, n: usize) -> Result<Vec<CString>, Skip> {
        (0..n).map(|i| self.create_file(&file_name(i))).collect()
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// `dir` must be a tmpfs directory we can write in.
fn check_tmpfs(dir: &Path) -> Result<(), Skip> {
    let c = CString::new(dir.as_os_str().as_bytes()).map_err(|e| Skip(format!("bad path: {e}")))?;
    // SAFETY: all-zero is a valid statfs; statfs writes into it.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a pointer to a local.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(Skip(format!(
            "{}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        )));
    }
    if st.f_type != libc::TMPFS_MAGIC {
        return Err(Skip(format!(
            "{} is not tmpfs (filesystem magic {:#x})",
            dir.display(),
            st.f_type
        )));
    }
    Ok(())
}

/// Raises the soft `RLIMIT_NOFILE` to at least `n` if the hard limit allows.
fn ensure_nofile(n: u64) -> Result<(), Skip> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the local.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return Err(Skip(format!("getrlimit: {}", std::io::Error::last_os_error())));
    }
    if rl.rlim_cur >= n {
        return Ok(());
    }
    if rl.rlim_max < n {
        return Err(Skip(format!(
            "{n} open files needed, hard limit is {}",
            rl.rlim_max
        )));
    }
    rl.rlim_cur = n;
    // SAFETY: setrlimit reads the local.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) } != 0 {
        return Err(Skip(format!(
            "setrlimit(RLIMIT_NOFILE, {n}): {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The threads shape's start barrier.
// ---------------------------------------------------------------------------------------

/// On drop: aborts the gate if still closed and sets the stop flag, so that every worker
/// thread ends.
struct Release<'a> {
    gate: &'a Gate,
    stop: &'a AtomicBool,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.gate.set(GateState::Aborted);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

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
        let got: Vec<&str> = s.keys().map(String::as_str).collect();
        let mut want = keys.to_vec();
        want.sort_unstable();
        assert_eq!(got, want, "{what}");
        for (k, v) in s {
            assert!(v.is_finite() && *v >= 0.0, "{what}: {k} = {v}");
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
        let dir = ScratchDir::new().unwrap();
        let paths = dir.create_files(1).unwrap();
        let missing = CString::new(dir.path.join("missing").as_os_str().as_bytes()).unwrap();
        let result = Team::spawn(6, |i| {
            let p = if i == 3 {
                missing.as_ptr()
            } else {
                paths[0].as_ptr()
            };
            (
                p,
                Work::Herd {
                    mode: LockMode::Flock,
                    waits: std::ptr::null(),
                    clock: HerdClock::Monotonic,
                },
            )
        })
        .and_then(|mut team| team.wait_ready());
        let why = result.expect_err("a worker could not open its file");
        assert!(why.0.contains("worker 3: open failed"), "{why}");
        drop(dir);
        assert_nothing_left();
        // A team dropped while its workers run is killed and reaped too.
        let dir = ScratchDir::new().unwrap();
        let paths = dir.create_files(1).unwrap();
        let mut team = Team::spawn(4, |i| (paths[0].as_ptr(), Work::ByteLock { byte: i as i64 })).unwrap();
        team.wait_ready().unwrap();
        team.go();
        std::thread::sleep(Duration::from_millis(20));
        drop(team);
        drop(dir);
        assert_nothing_left();
    }
}
