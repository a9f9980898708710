//! The library target: the same workloads against vfscale, threads acting as the owners.
//!
//! `prepatch` switches on the setting of the seed each workload comes from, and nothing
//! else: seed 000's one global lock for the lockperf and will-it-scale workloads, seed
//! 003's wake-everyone for the herd.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use vfscale_locks::{
    AccessMode, ContextLock, FcntlCmd, FileLockContext, Flock, FlockOp, InodeKey, LockManager, LockType,
    OpenFile, Process, Settings, WakeMode,
};

use super::{Config, LockMode, Sample, Skip, TaskKind, Workload};

/// Worker threads are small: a herd has 1,000 of them.
const STACK: usize = 128 * 1024;

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
        _ => lockperf(&mgr, cfg),
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

/// Blocked-hash and global-lock acquisitions, the shared locks of the lock system.
fn shared_lock_acquisitions(mgr: &LockManager) -> u64 {
    let s = mgr.stats();
    s.blocked_lock_acquisitions + s.global_lock_acquisitions
}

/// lockperf posix01/02, flock01/02: each task locks and unlocks `iterations` times and
/// times its own loop.
fn lockperf(mgr: &Arc<LockManager>, cfg: &Config) -> Result<Sample, Skip> {
    let (mode, shared) = cfg.workload.lockperf().expect("a lockperf workload");
    let files: Arc<Vec<_>> = Arc::new(
        (0..if shared { 1 } else { cfg.tasks })
            .map(|i| inode(mgr, i as u64))
            .collect(),
    );
    let go = Arc::new(Barrier::new(cfg.tasks + 1));
    let iterations = cfg.iterations;
    let (f2, g2) = (files.clone(), go.clone());
    let hs = spawn_all(cfg.tasks, move |i| {
        let ctx = &f2[if shared { 0 } else { i }];
        let (who, f) = owner(i);
        g2.wait();
        let t = Instant::now();
        for _ in 0..iterations {
            whole_file(ctx, mode, who, f, true);
            whole_file(ctx, mode, who, f, false);
        }
        (t, Instant::now())
    })?;
    go.wait();
    let done = join_all(hs);
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
    s.insert(
        "global_lock_acquisitions_per_op".into(),
        shared_lock_acquisitions(mgr) as f64 / ops,
    );
    Ok(s)
}

/// One cache line per worker counter, so counting is not itself a shared write.
#[repr(align(128))]
#[derive(Default)]
struct Slot(AtomicU64);

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

/// Seed 003's herd: `tasks` owners contend for one whole-file exclusive lock.
fn herd(mgr: &Arc<LockManager>, cfg: &Config) -> Result<Sample, Skip> {
    let ctx = inode(mgr, 0);
    let counts: Arc<Vec<Slot>> = Arc::new((0..cfg.tasks).map(|_| Slot::default()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let go = Arc::new(Barrier::new(cfg.tasks + 1));
    let mode = cfg.mode;
    let (c2, k2, s2, g2) = (ctx.clone(), counts.clone(), stop.clone(), go.clone());
    let hs = spawn_all(cfg.tasks, move |i| {
        let (who, f) = owner(i);
        g2.wait();
        let cs = thread_context_switches();
        while !s2.load(Ordering::Relaxed) {
            whole_file(&c2, mode, who, f, true);
            k2[i].0.fetch_add(1, Ordering::Relaxed);
            whole_file(&c2, mode, who, f, false);
        }
        thread_context_switches() - cs
    })?;
    go.wait();
    let (st0, sh0) = (ctx.stats(), shared_lock_acquisitions(mgr));
    let start = Instant::now();
    std::thread::sleep(cfg.duration);
    let snapshot: Vec<u64> = counts.iter().map(|c| c.0.load(Ordering::Relaxed)).collect();
    let elapsed = start.elapsed();
    let (st1, sh1) = (ctx.stats(), shared_lock_acquisitions(mgr));
    stop.store(true, Ordering::Relaxed);
    let switches: u64 = join_all(hs).into_iter().sum();
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
    s.insert(
        "min_per_worker".into(),
        *snapshot.iter().min().unwrap_or(&0) as f64,
    );
    s.insert(
        "max_per_worker".into(),
        *snapshot.iter().max().unwrap_or(&0) as f64,
    );
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
    Ok(s)
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
    let counts: Arc<Vec<Slot>> = Arc::new((0..cfg.tasks).map(|_| Slot::default()).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let go = Arc::new(Barrier::new(cfg.tasks + 1));
    let kind = cfg.kind;
    let (f2, k2, s2, g2) = (files.clone(), counts.clone(), stop.clone(), go.clone());
    let hs = spawn_all(cfg.tasks, move |i| {
        let ctx = &f2[if shared { 0 } else { i }];
        let (mut who, f) = owner(i);
        if kind == TaskKind::Threads {
            who = Process::new(1);
        }
        let byte = if shared { i as i64 } else { 0 };
        g2.wait();
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
    go.wait();
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

    #[test]
    fn herd_wakes_about_once_per_acquisition_with_the_tree() {
        for mode in LockMode::ALL {
            let s = run(&cfg(Workload::Herd, 50, mode), false).unwrap();
            assert!(s["acquisitions_per_sec"] > 0.0);
            assert!(s["min_per_worker"] <= s["max_per_worker"]);
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
