//! The library targets of the lock workloads: the same workloads against vfscale,
//! threads acting as the owners; and, for lockperf's file-per-task workloads, the
//! control that shares nothing ([`run_partitioned`]).
//!
//! `prepatch` switches back the kernel change each workload reproduces, and nothing
//! else: one global lock for the lockperf and will-it-scale workloads (before Jeff
//! Layton's 2013 per-inode lock), wake-everyone for the herd (before NeilBrown's 2018
//! wait tree).
//!
//! The herd reports the kernel target's metrics (see `locks_kernel.rs`) with the same
//! definitions, its workers released at once by one futex wake as the kernel's are by
//! their go pipe; waits are recorded for every acquisition that had to wait and for one
//! in 64 of those that did not (reading the clock twice would cost half an
//! acquisition), weighted accordingly.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfscale_conformance::harness::{Counter, StartGate};

use vfscale_locks::{
    AccessMode, ContextLock, FcntlCmd, FileLockContext, Flock, FlockOp, InodeKey, LockManager, LockType,
    OpenFile, Process, Settings, WakeMode,
};

use super::herd_metrics::{herd_fairness, WaitHistogram};
use super::{Config, LockMode, Sample, Skip, TaskKind, Workload};

/// Worker threads are small: a herd has 1,000 of them.
const STACK: usize = 128 * 1024;
/// How long all worker threads may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The settings for `cfg`'s workload.
pub fn settings(workload: Workload, prepatch: bool) -> Settings {
    match (prepatch, workload) {
        (false, _) => Settings::default(),
        (true, Workload::Herd) => Settings {
            wake: WakeMode::All,
            ..Settings::default()
        },
        (true, _) => Settings {
            context_lock: ContextLock::Global,
            ..Settings::default()
        },
    }
}

/// Measures `cfg` once against the library.
pub fn run(cfg: &Config, prepatch: bool) -> Result<Sample, Skip> {
    let mgr = LockManager::with_settings(settings(cfg.workload, prepatch));
    match cfg.workload {
        Workload::Herd => herd(&mgr, cfg),
        Workload::Lock1 | Workload::Lock2 => will_it_scale(&mgr, cfg),
        _ => lockperf(std::slice::from_ref(&mgr), cfg),
    }
}

/// Measures `cfg` once on the control that shares nothing (`partitioned`): the
/// library's lockperf loop with each task's file in a lock manager of its own, so that
/// no structure of the lock system is shared between tasks. Its N/1 ratio is how far
/// this machine lets tasks that share nothing scale, measured in the same run as the
/// library's. Only for the workloads where each task has its own file.
pub fn run_partitioned(cfg: &Config) -> Result<Sample, Skip> {
    match cfg.workload.lockperf() {
        Some((_, false)) => {
            let managers: Vec<_> = (0..cfg.tasks)
                .map(|_| LockManager::with_settings(Settings::default()))
                .collect();
            lockperf(&managers, cfg)
        }
        _ => Err(Skip(format!(
            "{} has no partitioned target: its tasks share a file",
            cfg.workload.name()
        ))),
    }
}

fn inode(mgr: &Arc<LockManager>, ino: u64) -> Arc<FileLockContext> {
    FileLockContext::new(
        mgr,
        InodeKey {
            major: 0,
            minor: 0,
            ino,
        },
    )
}

/// Task `i`'s owner and open file description.
fn owner(i: usize) -> (Process, OpenFile) {
    (
        Process::new(i as u32 + 1),
        OpenFile::new(i as u64 + 1, AccessMode::ReadWrite),
    )
}

/// Takes (`lock`) or drops the whole-file exclusive lock of `mode`, waiting if needed.
fn whole_file(ctx: &Arc<FileLockContext>, mode: LockMode, who: Process, f: OpenFile, lock: bool) {
    let ty = if lock { LockType::Write } else { LockType::Unlock };
    let r = match mode {
        LockMode::Flock => ctx.flock(
            who,
            f,
            if lock { FlockOp::Exclusive } else { FlockOp::Unlock },
            false,
        ),
        LockMode::Ofd => ctx.fcntl(who, f, FcntlCmd::OfdSetLkW, &mut Flock::new(ty, 0, 0)),
        LockMode::Posix => ctx.fcntl(who, f, FcntlCmd::SetLkW, &mut Flock::new(ty, 0, 0)),
    };
    // Nothing here can fail: one lock per owner, no cycles, no interrupts.
    debug_assert_eq!(r, Ok(()));
}

/// Spawns `n` workers running `body(i)`; returns their results in order.
fn spawn_all<T: Send + 'static>(
    n: usize,
    body: impl Fn(usize) -> T + Send + Sync + 'static,
) -> Result<Vec<std::thread::JoinHandle<T>>, Skip> {
    let body = Arc::new(body);
    (0..n)
        .map(|i| {
            let body = body.clone();
            std::thread::Builder::new()
                .stack_size(STACK)
                .spawn(move || body(i))
                .map_err(|e| Skip(format!("cannot start {n} threads: {e}")))
        })
        .collect()
}

fn join_all<T>(hs: Vec<std::thread::JoinHandle<T>>) -> Vec<T> {
    hs.into_iter()
        .map(|h| h.join().expect("worker panicked"))
        .collect()
}

/// Opens `gate` once all `hs.len()` workers arrived; if they do not within the start
/// timeout, sets `stop`, aborts the gate, joins the workers and says why.
fn open_when_arrived<T>(
    gate: &StartGate,
    stop: &AtomicBool,
    hs: &mut Vec<std::thread::JoinHandle<T>>,
) -> Result<(), Skip> {
    if let Err(e) = gate.wait_arrived(hs.len(), START_TIMEOUT) {
        stop.store(true, Ordering::Relaxed);
        gate.abort();
        join_all(std::mem::take(hs));
        return Err(e.into());
    }
    gate.open();
    Ok(())
}

/// Blocked-hash and global-lock acquisitions, the shared locks of the lock system.
fn shared_lock_acquisitions(mgr: &LockManager) -> u64 {
    let s = mgr.stats();
    s.blocked_lock_acquisitions + s.global_lock_acquisitions
}

/// lockperf posix01/02, flock01/02: each task locks and unlocks `iterations` times and
/// times its own loop. File `i` lives in `managers[i % managers.len()]`: one manager
/// for all, or (the control) one per task.
fn lockperf(managers: &[Arc<LockManager>], cfg: &Config) -> Result<Sample, Skip> {
    let (mode, shared) = cfg.workload.lockperf().expect("a lockperf workload");
    let files: Arc<Vec<_>> = Arc::new(
        (0..if shared { 1 } else { cfg.tasks })
            .map(|i| inode(&managers[i % managers.len()], i as u64))
            .collect(),
    );
    let go = Arc::new(StartGate::new());
    let iterations = cfg.iterations;
    let (f2, g2) = (files.clone(), go.clone());
    let mut hs = spawn_all(cfg.tasks, move |i| {
        let ctx = &f2[if shared { 0 } else { i }];
        let (who, f) = owner(i);
        if !g2.arrive_and_wait() {
            return None;
        }
        let t = Instant::now();
        for _ in 0..iterations {
            whole_file(ctx, mode, who, f, true);
            whole_file(ctx, mode, who, f, false);
        }
        Some((t, Instant::now()))
    })?;
    open_when_arrived(&go, &AtomicBool::new(false), &mut hs)?;
    let done: Vec<_> = join_all(hs).into_iter().flatten().collect();
    // The interval runs from the first task's start to the last task's end, each stamped
    // by the task itself.
    let first = done.iter().map(|d| d.0).min().expect("at least one task");
    let last = done.iter().map(|d| d.1).max().expect("at least one task");
    let total: f64 = done.iter().map(|d| (d.1 - d.0).as_secs_f64()).sum();
    let ops = (cfg.tasks as u64 * iterations) as f64;
    let mut s = Sample::new();
    s.insert("total_lock_seconds".into(), total);
    s.insert("lock_unlock_ns".into(), total / ops * 1e9);
    s.insert("ops_per_sec".into(), ops / (last - first).as_secs_f64().max(1e-9));
    let shared_locks: u64 = managers.iter().map(|m| shared_lock_acquisitions(m)).sum();
    s.insert(
        "global_lock_acquisitions_per_op".into(),
        shared_locks as f64 / ops,
    );
    Ok(s)
}

/// Context switches of the calling thread so far (voluntary + involuntary).
fn thread_context_switches() -> u64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a full rusage into the pointer we pass, which points to
    // writable memory of the right size; RUSAGE_THREAD concerns only this thread.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr()) };
    if r != 0 {
        return 0;
    }
    // SAFETY: getrusage returned 0, so it initialized the struct.
    let ru = unsafe { ru.assume_init() };
    (ru.ru_nvcsw + ru.ru_nivcsw) as u64
}

/// Takes the whole-file exclusive lock of `mode`, waiting if needed; `Some` with the
/// time the request went to sleep if it had to wait.
fn whole_file_lock_waited(
    ctx: &Arc<FileLockContext>,
    mode: LockMode,
    who: Process,
    f: OpenFile,
) -> Option<Instant> {
    let r = match mode {
        LockMode::Flock => ctx.flock_waited(who, f, FlockOp::Exclusive, false),
        LockMode::Ofd => ctx.fcntl_waited(
            who,
            f,
            FcntlCmd::OfdSetLkW,
            &mut Flock::new(LockType::Write, 0, 0),
        ),
        LockMode::Posix => ctx.fcntl_waited(who, f, FcntlCmd::SetLkW, &mut Flock::new(LockType::Write, 0, 0)),
    };
    // Nothing here can fail: one lock per owner, no cycles, no interrupts.
    debug_assert!(r.is_ok(), "{r:?}");
    r.ok().flatten()
}

/// An acquisition that did not wait is timed one in this many (and counts this many
/// times): reading the clock twice costs about half an acquisition here.
const HERD_SAMPLE: u32 = 64;

/// The herd: `tasks` owners contend for one whole-file exclusive lock.
///
/// Each worker also records its waits from request to grant in its own histogram,
/// merged after the run: every acquisition that had to wait (from the call, or from when
/// its request went to sleep, to the grant), and one in [`HERD_SAMPLE`] of those that
/// did not (weighted by [`HERD_SAMPLE`]), so that the clock costs the loop next to
/// nothing. Acquisitions after the stop flag are not recorded.
fn herd(mgr: &Arc<LockManager>, cfg: &Config) -> Result<Sample, Skip> {
    let ctx = inode(mgr, 0);
    let counts: Arc<Vec<Counter>> = Arc::new((0..cfg.tasks).map(|_| Counter::default()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    // Opening wakes every worker with one futex wake, as the kernel target's go pipe
    // does: they become runnable at once, not one by one while the first hold the lock.
    let go = Arc::new(StartGate::new());
    let mode = cfg.mode;
    let (c2, k2, s2, g2) = (ctx.clone(), counts.clone(), stop.clone(), go.clone());
    let mut hs = spawn_all(cfg.tasks, move |i| {
        let (who, f) = owner(i);
        let mut waits = WaitHistogram::new();
        g2.arrive_and_wait();
        let cs = thread_context_switches();
        let mut k = 0u32;
        while !s2.load(Ordering::Relaxed) {
            let t0 = k.is_multiple_of(HERD_SAMPLE).then(Instant::now);
            k = k.wrapping_add(1);
            let slept = whole_file_lock_waited(&c2, mode, who, f);
            k2[i].0.fetch_add(1, Ordering::Relaxed);
            if !s2.load(Ordering::Relaxed) {
                match (slept, t0) {
                    (Some(b), t0) => waits.record(nanos(t0.unwrap_or(b).elapsed()), 1),
                    (None, Some(t0)) => waits.record(nanos(t0.elapsed()), HERD_SAMPLE as u64),
                    (None, None) => {}
                }
            }
            whole_file(&c2, mode, who, f, false);
        }
        (thread_context_switches() - cs, waits)
    })?;
    open_when_arrived(&go, &stop, &mut hs)?;
    let (st0, sh0) = (ctx.stats(), shared_lock_acquisitions(mgr));
    let start = Instant::now();
    std::thread::sleep(cfg.duration);
    let snapshot: Vec<u64> = counts.iter().map(|c| c.0.load(Ordering::Relaxed)).collect();
    let elapsed = start.elapsed();
    let (st1, sh1) = (ctx.stats(), shared_lock_acquisitions(mgr));
    stop.store(true, Ordering::Relaxed);
    let mut switches = 0;
    let mut waits = WaitHistogram::new();
    for (cs, w) in join_all(hs) {
        switches += cs;
        waits.merge(&w);
    }
    let acquired: u64 = snapshot.iter().sum();
    let total = counts
        .iter()
        .map(|c| c.0.load(Ordering::Relaxed))
        .sum::<u64>()
        .max(1);
    let grants = (st1.grants - st0.grants).max(1);
    let mut s = Sample::new();
    s.insert(
        "acquisitions_per_sec".into(),
        acquired as f64 / elapsed.as_secs_f64(),
    );
    herd_fairness(&mut s, &snapshot, &waits, 1e-9);
    s.insert(
        "context_switches_per_acquisition".into(),
        switches as f64 / total as f64,
    );
    s.insert(
        "wakeups_per_acquisition".into(),
        (st1.wakeups - st0.wakeups) as f64 / grants as f64,
    );
    s.insert(
        "global_lock_acquisitions_per_op".into(),
        (sh1 - sh0) as f64 / grants as f64,
    );
    // Wait-tree records visited per request put to sleep (machine-independent).
    s.insert(
        "wait_nodes_per_block".into(),
        (st1.wait_nodes - st0.wait_nodes) as f64 / (st1.blocks - st0.blocks).max(1) as f64,
    );
    Ok(s)
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// will-it-scale lock1 (own file) and lock2 (one file, own byte): 1-byte write lock and
/// unlock with `F_SETLK`, as processes (one owner each) or threads (one owner).
fn will_it_scale(mgr: &Arc<LockManager>, cfg: &Config) -> Result<Sample, Skip> {
    let shared = cfg.workload == Workload::Lock2;
    let files: Arc<Vec<_>> = Arc::new(
        (0..if shared { 1 } else { cfg.tasks })
            .map(|i| inode(mgr, i as u64))
            .collect(),
    );
    let counts: Arc<Vec<Counter>> = Arc::new((0..cfg.tasks).map(|_| Counter::default()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let go = Arc::new(StartGate::new());
    let kind = cfg.kind;
    let (f2, k2, s2, g2) = (files.clone(), counts.clone(), stop.clone(), go.clone());
    let mut hs = spawn_all(cfg.tasks, move |i| {
        let ctx = &f2[if shared { 0 } else { i }];
        let (mut who, f) = owner(i);
        if kind == TaskKind::Threads {
            who = Process::new(1);
        }
        let byte = if shared { i as i64 } else { 0 };
        if !g2.arrive_and_wait() {
            return;
        }
        let mut n = 0u64;
        while !s2.load(Ordering::Relaxed) {
            for _ in 0..64 {
                let _ = ctx.fcntl(who, f, FcntlCmd::SetLk, &mut Flock::new(LockType::Write, byte, 1));
                let _ = ctx.fcntl(
                    who,
                    f,
                    FcntlCmd::SetLk,
                    &mut Flock::new(LockType::Unlock, byte, 1),
                );
            }
            n += 64;
            k2[i].0.store(n, Ordering::Relaxed);
        }
    })?;
    open_when_arrived(&go, &stop, &mut hs)?;
    let sh0 = shared_lock_acquisitions(mgr);
    let start = Instant::now();
    std::thread::sleep(cfg.duration);
    let ops: u64 = counts.iter().map(|c| c.0.load(Ordering::Relaxed)).sum();
    let elapsed = start.elapsed();
    let sh1 = shared_lock_acquisitions(mgr);
    stop.store(true, Ordering::Relaxed);
    join_all(hs);
    let mut s = Sample::new();
    s.insert("ops_per_sec".into(), ops as f64 / elapsed.as_secs_f64());
    s.insert(
        "global_lock_acquisitions_per_op".into(),
        (sh1 - sh0) as f64 / ops.max(1) as f64 / 2.0,
    );
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cfg(workload: Workload, tasks: usize, mode: LockMode) -> Config {
        Config {
            workload,
            tasks,
            mode,
            kind: TaskKind::Processes,
            iterations: 200,
            duration: Duration::from_millis(100),
            modes: Vec::new(),
            size: 0,
            dir: None,
            targets: None,
            lease_ttl: crate::measure::cluster::DEFAULT_LEASE_TTL,
        }
    }

    #[test]
    fn lockperf_reports_time_and_throughput() {
        for w in [
            Workload::Posix01,
            Workload::Posix02,
            Workload::Flock01,
            Workload::Flock02,
        ] {
            for prepatch in [false, true] {
                let s = run(&cfg(w, 4, LockMode::Posix), prepatch).unwrap();
                assert!(s["total_lock_seconds"] > 0.0 && s["ops_per_sec"] > 0.0, "{w:?}");
                let shared = s["global_lock_acquisitions_per_op"];
                if prepatch {
                    // Two calls per op, each under the global lock.
                    assert!(shared >= 2.0, "{w:?}: {shared}");
                } else if matches!(w, Workload::Posix02 | Workload::Flock02 | Workload::Flock01) {
                    assert_eq!(shared, 0.0, "{w:?}: no waiting POSIX request, no shared lock");
                }
            }
        }
    }

    /// The control runs the same loop and reports the same metrics, with no shared lock
    /// taken; it has no workload whose tasks share a file.
    #[test]
    fn the_control_shares_nothing() {
        for w in [Workload::Posix02, Workload::Flock02] {
            let s = run_partitioned(&cfg(w, 4, LockMode::Posix)).unwrap();
            let library = run(&cfg(w, 4, LockMode::Posix), false).unwrap();
            assert_eq!(
                s.keys().collect::<Vec<_>>(),
                library.keys().collect::<Vec<_>>(),
                "{w:?}"
            );
            assert!(s["total_lock_seconds"] > 0.0 && s["ops_per_sec"] > 0.0, "{w:?}");
            assert_eq!(s["global_lock_acquisitions_per_op"], 0.0, "{w:?}");
        }
        for w in [
            Workload::Posix01,
            Workload::Flock01,
            Workload::Herd,
            Workload::Lock1,
        ] {
            assert!(run_partitioned(&cfg(w, 2, LockMode::Posix)).is_err(), "{w:?}");
        }
    }

    #[test]
    fn herd_wakes_about_once_per_acquisition_with_the_tree() {
        for mode in LockMode::ALL {
            let s = run(&cfg(Workload::Herd, 50, mode), false).unwrap();
            assert!(s["acquisitions_per_sec"] > 0.0);
            assert!(s["min_per_worker"] <= s["median_per_worker"]);
            assert!(s["median_per_worker"] <= s["max_per_worker"]);
            assert!(s["jain_index"] > 0.0 && s["jain_index"] <= 1.0 + 1e-9);
            assert!(s["wait_p50_sec"] <= s["wait_p99_sec"]);
            assert!(s["wait_p99_sec"] <= s["wait_max_sec"]);
            assert!(s["wait_max_sec"] > 0.0 && s["wait_max_sec"] < 60.0);
            assert!(
                s["wakeups_per_acquisition"] <= 1.1,
                "{mode:?}: {}",
                s["wakeups_per_acquisition"]
            );
        }
    }

    #[test]
    fn will_it_scale_shapes_run_as_processes_and_threads() {
        for w in [Workload::Lock1, Workload::Lock2] {
            for kind in [TaskKind::Processes, TaskKind::Threads] {
                let mut c = cfg(w, 3, LockMode::Posix);
                c.kind = kind;
                let s = run(&c, false).unwrap();
                assert!(s["ops_per_sec"] > 0.0);
                assert_eq!(s["global_lock_acquisitions_per_op"], 0.0);
            }
        }
    }
}
