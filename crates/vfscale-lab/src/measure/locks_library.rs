//! The library target: the same workloads against vfscale, threads acting as the owners.
//!
//! `prepatch` switches on the setting of the seed each workload comes from, and nothing
//! else: seed 000's one global lock for the lockperf and will-it-scale workloads, seed
//! 003's wake-everyone for the herd.
//!
//! The herd reports the kernel target's metrics (see `kernel.rs`) with the same
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
/// times its own loop.
fn lockperf(mgr: &Arc<LockManager>, cfg: &Config) -> Result<Sample, Skip> {
    let (mode, shared) = cfg.workload.lockperf().expect("a lockperf workload");
    let files: Arc<Vec<_>> = Arc::new(
        (0..if shared { 1 } else { cfg.tasks })
            .map(|i| inode(mgr, i as u64))
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
    s.insert(
        "global_lock_acquisitions_per_op".into(),
        shared_lock_acquisitions(mgr) as f64 / ops,
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

/// Seed 003's herd: `tasks` owners contend for one whole-file exclusive lock.
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

/// Waits in a log-linear histogram: exact below 32 units, then 16 buckets per power of
/// two (a value is known within 1/16 of itself). Counts are weights, so sampled values
/// can stand for several.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct WaitHistogram {
    counts: Vec<u64>,
    max: u64,
}

impl WaitHistogram {
    /// Buckets: 32 exact ones, then 16 for each power of two from 2^5 to 2^42.
    pub(super) const BUCKETS: usize = 32 + 38 * 16;

    pub(super) fn new() -> WaitHistogram {
        WaitHistogram {
            counts: vec![0; Self::BUCKETS],
            max: 0,
        }
    }

    /// The bucket of `v` (values past 2^43 share the last one).
    pub(super) fn bucket(v: u64) -> usize {
        if v < 32 {
            return v as usize;
        }
        let e = 63 - v.leading_zeros() as usize;
        let sub = ((v >> (e - 4)) & 15) as usize;
        (32 + (e - 5) * 16 + sub).min(Self::BUCKETS - 1)
    }

    /// The middle of bucket `b`.
    pub(super) fn value(b: usize) -> f64 {
        if b < 32 {
            return b as f64;
        }
        let e = (b - 32) / 16 + 5;
        let sub = ((b - 32) % 16) as u64;
        let width = 1u64 << (e - 4);
        ((16 + sub) * width) as f64 + width as f64 / 2.0
    }

    pub(super) fn record(&mut self, v: u64, weight: u64) {
        self.counts[Self::bucket(v)] += weight;
        self.max = self.max.max(v);
    }

    /// Adds `weight` values in bucket `b`, the largest being at least `max`.
    pub(super) fn add_bucket(&mut self, b: usize, weight: u64) {
        self.counts[b] += weight;
    }

    pub(super) fn set_max(&mut self, max: u64) {
        self.max = self.max.max(max);
    }

    pub(super) fn merge(&mut self, other: &WaitHistogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.max = self.max.max(other.max);
    }

    /// The value below which a fraction `q` of the weight lies (a bucket's middle, and
    /// never above the largest value seen); 0 when empty.
    pub(super) fn quantile(&self, q: f64) -> f64 {
        let total: u64 = self.counts.iter().sum();
        if total == 0 {
            return 0.0;
        }
        let want = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Self::value(b).min(self.max as f64);
            }
        }
        self.max as f64
    }
}

/// The herd's per-worker fairness metrics, from the acquisitions each worker made in
/// the measured interval and the waits from request to grant (`waits`, in units of
/// `unit` seconds): minimum, median, mean and maximum per worker, Jain's fairness index
/// `(Σx)² / (n Σx²)` (1 when all are equal, 1/n when one worker does everything), and
/// the wait's 50th and 99th percentiles and maximum.
pub(super) fn herd_fairness(s: &mut Sample, counts: &[u64], waits: &WaitHistogram, unit: f64) {
    let n = counts.len().max(1) as f64;
    let mut sorted = counts.to_vec();
    sorted.sort_unstable();
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64) * (c as f64)).sum();
    let median = match sorted.len() {
        0 => 0.0,
        l if l % 2 == 1 => sorted[l / 2] as f64,
        l => (sorted[l / 2 - 1] + sorted[l / 2]) as f64 / 2.0,
    };
    s.insert(
        "min_per_worker".into(),
        sorted.first().copied().unwrap_or(0) as f64,
    );
    s.insert(
        "max_per_worker".into(),
        sorted.last().copied().unwrap_or(0) as f64,
    );
    s.insert("mean_per_worker".into(), sum / n);
    s.insert("median_per_worker".into(), median);
    s.insert(
        "jain_index".into(),
        if squares > 0.0 {
            sum * sum / (n * squares)
        } else {
            0.0
        },
    );
    s.insert("wait_p50_sec".into(), waits.quantile(0.5) * unit);
    s.insert("wait_p99_sec".into(), waits.quantile(0.99) * unit);
    s.insert("wait_max_sec".into(), waits.max as f64 * unit);
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
    fn wait_histogram_buckets_and_quantiles() {
        // Every value lands in a bucket whose middle is within 1/16 of it.
        for v in [0u64, 1, 31, 32, 33, 100, 1_000, 123_456, 7_000_000_000, 1 << 42] {
            let mid = WaitHistogram::value(WaitHistogram::bucket(v));
            assert!((mid - v as f64).abs() <= v as f64 / 16.0 + 0.5, "{v}: {mid}");
        }
        let mut h = WaitHistogram::new();
        for v in 1..=100u64 {
            h.record(v * 1000, 1);
        }
        let p50 = h.quantile(0.5);
        assert!((p50 - 50_000.0).abs() <= 50_000.0 / 16.0, "{p50}");
        assert!(h.quantile(0.99) <= 100_000.0);
        // Weights count: one value standing for 99 pulls the median to it.
        let mut w = WaitHistogram::new();
        w.record(10, 99);
        w.record(1_000_000, 1);
        assert_eq!(w.quantile(0.5), 10.0);
        assert_eq!(
            w.quantile(1.0),
            1_000_000f64.min(WaitHistogram::value(WaitHistogram::bucket(1_000_000)))
        );
    }

    #[test]
    fn fairness_metrics_of_equal_and_skewed_shares() {
        let h = WaitHistogram::new();
        let mut s = Sample::new();
        herd_fairness(&mut s, &[10, 10, 10, 10], &h, 1e-9);
        assert_eq!(
            (s["jain_index"], s["median_per_worker"], s["mean_per_worker"]),
            (1.0, 10.0, 10.0)
        );
        herd_fairness(&mut s, &[40, 0, 0, 0], &h, 1e-9);
        assert_eq!(
            (s["jain_index"], s["min_per_worker"], s["median_per_worker"]),
            (0.25, 0.0, 0.0)
        );
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
