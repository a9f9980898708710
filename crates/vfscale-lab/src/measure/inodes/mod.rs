//! The `inodes` workload: the inode cache experiment, after the benchmark of Dave
//! Chinner's 2023 "vfs: inode cache scalability improvements". Each of N tasks
//! creates F files in its own directory, walks them (readdir + stat of each), chmods
//! each, and unlinks each, every phase timed on its own; plus a cold walk before the
//! unlink: the inode cache is dropped, then every task walks every task's directory in
//! the same order, so tasks meet on the same misses and every load goes through the
//! `I_NEW` path.
//!
//! Targets: `kernel` (real system calls on a private tmpfs directory, or `--dir`; its cold
//! walk is skipped: tmpfs pins its inodes), `kernel-ext4` (ext4 on a loop device the lab
//! sets up and tears down; its cold walk drops the kernel's caches), and a small
//! in-memory filesystem (`fs.rs`) on five inode tables: `library` (vfscale-icache),
//! `library-prepatch` (every mechanism of the inode cache change switched back),
//! `rwlock-hashmap`, `dashmap`, `moka` (`tables.rs`); and a control on a sixth,
//! `partitioned`: a table per task, so that tasks in their own directories share
//! nothing. No filesystem could use it (its inodes are reached by their creator only);
//! its N/1 ratios show, in the same run, how far this machine lets tasks that share
//! nothing scale (on a shared 2-vCPU guest not 2: each vCPU's speed changes on its own,
//! and a 2-task phase lasts as long as its slower task).
//!
//! Metrics per phase (`phase/metric`): `ops_per_sec`, the rate while every task runs
//! (first start to first end, over the operations all tasks completed by then: will-it-
//! scale's throughput at N tasks, see `Span`), and `span_ops_per_sec`, every operation
//! over first start to last end (the same with one task); for the in-memory targets whose
//! locks can be counted, `global_lock_acquisitions_per_op` (locks every task shares: the
//! icache's global settings, the one `RwLock`; the filesystem's own tables add none:
//! directories are per task and the "disk" is read without locks) and
//! `shard_lock_acquisitions_per_op` (per-chain/per-CPU/per-shard/per-directory locks);
//! on `cold-walk` also `loads_per_distinct_inode`. For every target, how the tasks spent
//! the phase (`Span`): `on_cpu` (their CPU time over their time) and, with more than one
//! task, `task_time_spread` (the slowest task's time over the fastest's). A 2-task phase
//! lasts as long as its slower task, so a short 2/1 ratio with a spread well above 1 and
//! `on_cpu` at 1 is tasks running at different speeds, not waiting for each other.
//!
//! Not a default phase: `--mode evict` ([`million`]), the 1,000,000-inode point
//! (`--files` = inodes cached in all; bytes of bookkeeping per cached inode and
//! `evict_inodes` time per inode), `library` and `library-prepatch` only.
//!
//! # How a run is measured (the same for every target)
//!
//! A phase at the default 200,000 files per task lasts 30–150 ms, so what the process did
//! before it shows. Run consecutively in one process, a target's figures depended on the
//! runs and targets before it: a process's first run paid the kernel's page faults for
//! its whole heap, `readdir`'s megabyte buffers came from fresh `mmap`s until glibc's
//! dynamic mmap threshold rose, and later targets inherited the heap that earlier ones
//! (moka's, prepatch's fragmentation) left. So each run ([`run`]) is,
//! for every target alike:
//!
//! 1. a fresh child process forked from the lab (which runs no pass itself), so no run
//!    inherits another run's or target's heap; its [`Sample`] comes back over a pipe;
//! 2. in it, glibc keeps its heap: no trimming back to the kernel, and a fixed 32 MiB
//!    mmap threshold instead of the dynamic one (`mallopt`);
//! 3. one untimed warm-up pass of the same configuration ([`WARMUP_PASSES`], every phase,
//!    as `hyperfine --warmup` runs a command before timing it). It warms the process, not
//!    the data: the heap grows to what the configuration needs and the kernel has
//!    faulted it in, code, allocator free lists and (kernel targets) slab caches are in
//!    their steady state. Its files are unlinked, its tables dropped, its threads joined
//!    (a joined thread has handed its malloc arena back for the next pass's threads);
//! 4. the measured pass, on a fresh filesystem and table, which runs on the memory the
//!    warm-up left: at 200,000 files no page fault in walk and chmod on any target; what
//!    faults remain are the target's own (its hash table's first touch in create).
//!
//! Each task's `readdir` copies into one buffer it keeps (as a program reuses its
//! `getdents` buffer), sized and touched before the phases. `bench` interleaves the
//! runs (run 1 of every target at every task count and size, then run 2, ...), so a
//! drift of the machine (another job starting) falls on every target and task count
//! alike, and the headline compares them run by run (paired). The evict point ([`million`])
//! runs in a fresh child of its own without a warm-up (its bytes are the heap's growth
//! from a fresh process).

mod fs;
mod kernel;
pub mod million;
mod tables;

use vfscale_conformance::harness::StartGate;

use super::{Config, Sample, Skip, Target};

/// A phase's measured interval and how the tasks spent it, recorded by the tasks themselves
/// (the driver may be scheduled late after the start barrier opens, and a short phase may
/// be over by then).
///
/// Its rate is taken while every task runs: from the first task's start to the first
/// task's end, over the operations all tasks completed by then (each task counts its own,
/// [`Span::tick`], on a cache line of its own; the first task to end adds them up). That is
/// will-it-scale's throughput at N tasks (a fixed interval with every task busy), taken
/// inside a phase of fixed work. The span, first start to last end, also ends with a tail
/// in which the faster tasks are done and the rest run alone: on this 2-vCPU guest a
/// task's speed changes by up to 2× for hundreds of milliseconds at a time, independently
/// per vCPU, so the tail made a 2-task phase as slow as its slower CPU, and `partitioned`,
/// which shares nothing, read 1.3–2.1 from set to set. The span's rate is reported too
/// (`span_ops_per_sec`). With one task the two are the same.
pub(super) struct Span {
    state: std::sync::Mutex<SpanState>,
    done: Box<[Done]>,
}

/// One task's operations done in the current phase, on cache lines of its own (128: x86's
/// adjacent-line prefetch pairs lines).
#[derive(Default)]
#[repr(align(128))]
struct Done(std::sync::atomic::AtomicU64);

#[derive(Default)]
struct SpanState {
    /// First start, last end.
    bounds: Option<(std::time::Instant, std::time::Instant)>,
    /// The first task's end, and every task's operations done by then.
    first_end: Option<(std::time::Instant, u64)>,
    /// Each task's (wall, CPU) seconds.
    tasks: Vec<(f64, f64)>,
}

/// A task's start of a phase: wall clock and the thread's CPU time ([`Span::start`]).
pub(super) struct TaskStart {
    wall: std::time::Instant,
    cpu: f64,
}

/// A phase as [`Span::take`] gives it.
#[derive(Debug, PartialEq)]
pub(super) struct Taken {
    /// First task's start to last task's end, in seconds (0 when no task ran).
    pub secs: f64,
    /// First task's start to first task's end, in seconds, and the operations all tasks
    /// completed in it (0 when no task ran).
    pub window_secs: f64,
    pub window_ops: u64,
    /// The slowest task's time over the fastest's (1 when they took as long; with one
    /// task, 1). A 2-task phase lasts as long as its slower task, so this is how much of
    /// a short N/1 ratio is tasks that ran at different speeds rather than waited.
    pub spread: f64,
    /// The tasks' CPU time over their time (1: on a CPU all along; less: they slept or
    /// were preempted).
    pub on_cpu: f64,
}

/// Adds one to a counter that only the calling task writes (during a phase): a plain store,
/// no read-modify-write on a line that nobody else writes.
#[inline]
pub(super) fn bump(c: &std::sync::atomic::AtomicU64) {
    use std::sync::atomic::Ordering;
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// The calling thread's CPU time, in seconds (`CLOCK_THREAD_CPUTIME_ID`: up to date for
/// the running thread, unlike `/proc/thread-self/schedstat`).
fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

impl Span {
    /// A span for phases of `tasks` tasks (numbered from 0).
    pub(super) fn new(tasks: usize) -> Span {
        Span {
            state: Default::default(),
            done: (0..tasks).map(|_| Done::default()).collect(),
        }
    }

    /// Task `t` completed one more operation: a store to its own line (it alone writes
    /// it during a phase), no read-modify-write.
    #[inline]
    pub(super) fn tick(&self, t: usize) {
        bump(&self.done[t].0);
    }

    /// The operations every task completed so far.
    fn done(&self) -> u64 {
        self.done
            .iter()
            .map(|d| d.0.load(std::sync::atomic::Ordering::Relaxed))
            .sum()
    }

    /// The calling task starts its part of the phase.
    pub(super) fn start() -> TaskStart {
        let cpu = thread_cpu_secs();
        TaskStart {
            wall: std::time::Instant::now(),
            cpu,
        }
    }

    /// The calling task, which started at `s`, ends its part.
    pub(super) fn record(&self, s: TaskStart) {
        let end = std::time::Instant::now();
        let cpu = thread_cpu_secs() - s.cpu;
        self.record_at(s.wall, end, cpu);
    }

    /// A task ran from `a` to `b`, `cpu` seconds of it on a CPU. The first to end adds up
    /// the tasks' operations (under the lock, so that no later end does it first).
    fn record_at(&self, a: std::time::Instant, b: std::time::Instant, cpu: f64) {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if g.first_end.is_none() {
            g.first_end = Some((b, self.done()));
        }
        g.bounds = Some(match g.bounds {
            None => (a, b),
            Some((x, y)) => (x.min(a), y.max(b)),
        });
        g.tasks.push(((b - a).as_secs_f64(), cpu));
    }

    /// The phase, and a fresh span for the next.
    pub(super) fn take(&self) -> Taken {
        let g = std::mem::take(&mut *self.state.lock().unwrap_or_else(|e| e.into_inner()));
        for d in self.done.iter() {
            d.0.store(0, std::sync::atomic::Ordering::Relaxed);
        }
        let secs = g.bounds.map_or(0.0, |(a, b)| (b - a).as_secs_f64());
        let (window_secs, window_ops) = match (g.bounds, g.first_end) {
            (Some((a, _)), Some((e, n))) => ((e - a).as_secs_f64(), n),
            _ => (0.0, 0),
        };
        let (lo, hi, wall, cpu) = g.tasks.iter().fold(
            (f64::INFINITY, 0.0f64, 0.0, 0.0),
            |(lo, hi, wall, cpu), &(w, c)| (lo.min(w), hi.max(w), wall + w, cpu + c),
        );
        Taken {
            secs,
            window_secs,
            window_ops,
            spread: if lo > 0.0 && lo.is_finite() { hi / lo } else { 1.0 },
            on_cpu: if wall > 0.0 { (cpu / wall).min(1.0) } else { 1.0 },
        }
    }

    /// Ends `phase` ([`Span::take`]), whose tasks completed `ops` operations in all: adds
    /// to `s`, as metrics of mode `phase`, its `ops_per_sec` (while every task ran), its
    /// `span_ops_per_sec` (`ops` over first start to last end), its `on_cpu` and, with more
    /// than one task, its `task_time_spread`.
    pub(super) fn finish(&self, phase: &str, tasks: usize, ops: u64, s: &mut Sample) {
        let t = self.take();
        if tasks > 1 {
            s.insert_in(phase, "task_time_spread".into(), t.spread);
        }
        s.insert_in(phase, "on_cpu".into(), t.on_cpu);
        s.insert_in(
            phase,
            "ops_per_sec".into(),
            t.window_ops as f64 / t.window_secs.max(1e-9),
        );
        s.insert_in(phase, "span_ops_per_sec".into(), ops as f64 / t.secs.max(1e-9));
    }
}

/// Where each phase starts, one gate per phase: the tasks spin at it
/// ([`StartGate::arrive_and_spin`], yielding now and then, so that the driver gets a
/// CPU) until the driver opens it ([`open_phase`]), which it does once every task is
/// spinning, so that every task is running when the phase starts. The tasks reach it
/// from a futex barrier, which wakes its sleepers one after the other: the last could
/// start a millisecond late, longer than a short phase's difference between 1 and 2
/// tasks.
pub(super) fn phase_gates() -> Vec<StartGate> {
    PHASES.iter().map(|_| StartGate::new()).collect()
}

/// The driver opens a phase's gate once all `tasks` tasks spin at it.
pub(super) fn open_phase(gate: &StartGate, tasks: usize) {
    gate.yield_until_arrived(tasks);
    gate.open();
}

/// The phases, in the order one run performs them (the cold walk needs the files, so it
/// runs before the unlink).
pub const PHASES: [&str; 5] = ["create", "walk", "chmod", "cold-walk", "unlink"];

/// Whether `target` can run this workload here.
pub fn available(target: Target) -> Result<(), Skip> {
    match target {
        Target::Kernel => kernel::available(),
        Target::KernelExt4 => kernel::available_ext4(),
        Target::Library
        | Target::LibraryPrepatch
        | Target::RwlockHashmap
        | Target::Dashmap
        | Target::Moka
        | Target::Partitioned => Ok(()),
        t => Err(Skip(format!("inodes has no {} target", t.name()))),
    }
}

/// Measures `cfg` once on `target`: every selected phase (all when none is), in a fresh
/// child process after a warm-up pass (see the module docs).
pub fn run(target: Target, cfg: &Config) -> Result<Sample, Skip> {
    let phases: Vec<&'static str> = if cfg.modes.is_empty() {
        PHASES.to_vec()
    } else {
        PHASES.iter().copied().filter(|p| cfg.modes.contains(p)).collect()
    };
    let files = cfg.size.max(1);
    let tasks = cfg.tasks.max(1);
    let mut s = Sample::new();
    if cfg.modes.contains(&million::MODE) {
        match child::run(|| million::run(target, tasks, files)) {
            Ok(m) => s.extend(m),
            // With other phases selected, they still run; the point is listed skipped.
            Err(Skip(why)) if !phases.is_empty() => s.skip(why),
            Err(e) => return Err(e),
        }
        if phases.is_empty() {
            return Ok(s);
        }
    }
    let dir = cfg.dir.clone();
    let selected = phases.clone();
    let mut m = child::run(move || {
        child::keep_heap();
        match target {
            Target::Kernel => kernel::run(tasks, files, &phases, dir.as_deref(), WARMUP_PASSES),
            Target::KernelExt4 => kernel::run_ext4(tasks, files, &phases, WARMUP_PASSES),
            t => fs::run(t, tasks, files, WARMUP_PASSES),
        }
    })?;
    // A phase that did not run because another was not selected is not reported.
    m.retain_modes(|mode| selected.contains(&mode));
    s.extend(m);
    Ok(s)
}

/// Untimed passes of the whole configuration before the measured one, in the same child
/// process (see the module docs).
pub const WARMUP_PASSES: usize = 1;

/// A run in a fresh child process.
mod child {
    use std::io::{Read, Write};
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::{Duration, Instant};

    use crate::measure::{Sample, Skip};

    /// How long a child may take before it is killed and the run skipped: far beyond any
    /// run (200,000 files per task take a few seconds), so only a hung child meets it.
    const DEADLINE: Duration = Duration::from_secs(1800);

    /// glibc keeps the heap: no trimming of freed memory back to the kernel, and one
    /// fixed mmap threshold (32 MiB, glibc's largest) instead of the dynamic one, so the
    /// warm-up's memory serves the measured pass whatever the target's allocation sizes.
    pub(super) fn keep_heap() {
        #[cfg(target_env = "gnu")]
        // SAFETY: mallopt only sets the allocator's parameters.
        unsafe {
            libc::mallopt(libc::M_TRIM_THRESHOLD, -1);
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        }
    }

    /// Runs `f` in a forked child and returns what it returned. A panic in the child
    /// panics here with its message (as if `f` had run here); a child killed by a signal
    /// panics too; a child still running after [`DEADLINE`] is killed and the run skipped.
    ///
    /// The child runs ordinary Rust (it allocates and spawns threads), which is sound
    /// after `fork` as long as no lock it needs was held by another thread of the parent
    /// at the fork: glibc's allocator resets its own locks in the child, `bench` has no
    /// other thread, and the tests that fork hold `CHILD_PROCESSES`.
    pub(super) fn run<F>(f: F) -> Result<Sample, Skip>
    where
        F: FnOnce() -> Result<Sample, Skip>,
    {
        let mut p = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the local array.
        if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(Skip(format!("pipe: {}", std::io::Error::last_os_error())));
        }
        // SAFETY: both descriptors were just created and are owned here alone.
        let (r, w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        // SAFETY: the child runs `child_main`, which never returns (see above for why
        // what it runs is safe after fork).
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(Skip(format!("fork: {}", std::io::Error::last_os_error())));
        }
        if pid == 0 {
            drop(r);
            child_main(w, f);
        }
        drop(w);
        let out = read_until_eof(r, pid);
        let mut status = 0;
        // SAFETY: reaping our own child.
        while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {}
        let out = out?;
        if libc::WIFSIGNALED(status) {
            panic!(
                "an inodes run's child process was killed by signal {}",
                libc::WTERMSIG(status)
            );
        }
        decode(&out)
    }

    /// The child's life: prepare, run `f`, send its result, `_exit` (no atexit handlers,
    /// no destructors of the parent's objects).
    fn child_main<F>(w: OwnedFd, f: F) -> !
    where
        F: FnOnce() -> Result<Sample, Skip>,
    {
        // SAFETY: prctl on integers: the child dies with the thread that forked it.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
        let msg = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(Ok(s)) => {
                let mut m = String::from("O");
                for (mode, k, v) in s.metrics() {
                    let mode = mode.unwrap_or(OWN_MODE);
                    m.push_str(&format!(
                        "{:016x} {mode} {}\n",
                        v.to_bits(),
                        k.name().replace('\n', " ")
                    ));
                }
                for why in s.skipped() {
                    m.push_str(&format!("{SKIP_LINE}{}\n", why.replace('\n', " ")));
                }
                m
            }
            Ok(Err(Skip(why))) => format!("S{why}"),
            Err(p) => {
                let why = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".into());
                format!("P{why}")
            }
        };
        let mut w = std::fs::File::from(w);
        let ok = w.write_all(msg.as_bytes()).is_ok();
        // SAFETY: _exit ends the child at once.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) }
    }

    /// Everything the child writes, until it closes the pipe (exits).
    fn read_until_eof(r: OwnedFd, pid: libc::pid_t) -> Result<Vec<u8>, Skip> {
        let start = Instant::now();
        let mut out = Vec::new();
        let mut f = std::fs::File::from(r);
        let mut buf = [0u8; 4096];
        loop {
            let left = DEADLINE.saturating_sub(start.elapsed());
            let mut pfd = libc::pollfd {
                fd: f.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().min(i32::MAX as u128) as i32;
            // SAFETY: poll on one local pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n == 0 {
                // SAFETY: killing our own child; the caller reaps it.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return Err(Skip(format!(
                    "an inodes run gave no result in {} s",
                    DEADLINE.as_secs()
                )));
            }
            if n < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(Skip(format!("poll: {}", std::io::Error::last_os_error())));
            }
            match f.read(&mut buf) {
                Ok(0) => return Ok(out),
                Ok(k) => out.extend_from_slice(&buf[..k]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Skip(format!("reading a run's result: {e}"))),
            }
        }
    }

    /// The mode field of a metric of the configuration's own mode.
    const OWN_MODE: &str = "-";

    /// How a line naming a part of the run that was skipped starts.
    const SKIP_LINE: &str = "skip ";

    /// The child's message: `O` and one `bits mode metric` line per metric ([`OWN_MODE`]
    /// for the own mode) and one [`SKIP_LINE`] line per part skipped, `S` and why the run
    /// was skipped, or `P` and a panic's message.
    fn decode(out: &[u8]) -> Result<Sample, Skip> {
        let text = String::from_utf8_lossy(out);
        let mut chars = text.chars();
        match chars.next() {
            Some('O') => {
                let mut s = Sample::new();
                for l in chars.as_str().lines() {
                    if let Some(why) = l.strip_prefix(SKIP_LINE) {
                        s.skip(why.to_string());
                        continue;
                    }
                    let Some((bits, rest)) = l.split_once(' ') else {
                        continue;
                    };
                    let (Some((mode, k)), Ok(bits)) = (rest.split_once(' '), u64::from_str_radix(bits, 16))
                    else {
                        continue;
                    };
                    let v = f64::from_bits(bits);
                    match mode {
                        OWN_MODE => s.insert(k.into(), v),
                        mode => s.insert_in(mode, k.into(), v),
                    }
                }
                Ok(s)
            }
            Some('S') => Err(Skip(chars.as_str().to_string())),
            Some('P') => panic!("an inodes run panicked in its child process: {}", chars.as_str()),
            _ => panic!("an inodes run's child process ended without a result"),
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn results_skips_and_panics_come_back() {
            let _g = crate::measure::child_processes();
            let sent = || {
                let mut s = Sample::new();
                s.insert("c d".into(), -3e300);
                s.insert_in("walk", "ops_per_sec".into(), 0.1);
                s.skip("cold-walk: why".into());
                s
            };
            assert_eq!(run(|| Ok(sent())).unwrap(), sent());
            // The child's own pid: not ours.
            let pid = || {
                let mut s = Sample::new();
                s.insert("pid".into(), std::process::id() as f64);
                Ok(s)
            };
            let s = run(pid).unwrap();
            assert_ne!(s["pid"], std::process::id() as f64);
            assert_eq!(run(|| Err(Skip("why\nnot".into()))), Err(Skip("why\nnot".into())));
            let p = std::panic::catch_unwind(|| run(|| panic!("boom {}", 7)));
            let msg = p.unwrap_err().downcast::<String>().unwrap();
            assert!(msg.contains("boom 7"), "{msg}");
            let mut status = 0;
            // SAFETY: waitpid with a local status.
            let left = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            assert_eq!(left, -1, "a child is left");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::Workload;

    /// No task passes a phase's gate before the driver opens it, and every task passes
    /// each gate once it is open, phase after phase.
    #[test]
    fn the_start_gate_holds_every_task_until_it_opens() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let gates = phase_gates();
        let opened = AtomicUsize::new(0);
        let passed = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for (k, gate) in gates.iter().enumerate().take(4) {
                        assert!(gate.arrive_and_spin());
                        assert!(
                            opened.load(Ordering::SeqCst) > k,
                            "passed phase {k} before it opened"
                        );
                        passed.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
            for (k, gate) in gates.iter().enumerate().take(4) {
                std::thread::sleep(std::time::Duration::from_millis(5));
                assert_eq!(
                    passed.load(Ordering::SeqCst),
                    3 * k,
                    "a task ran ahead of phase {k}"
                );
                opened.store(k + 1, Ordering::SeqCst);
                open_phase(gate, 3);
                while passed.load(Ordering::SeqCst) < 3 * (k + 1) {
                    std::thread::yield_now();
                }
            }
        });
    }

    /// The span is first start to last end; the rate's window is first start to first
    /// end, with the operations every task had done by then; the spread is the slowest
    /// task over the fastest, and on-CPU time is summed over the tasks.
    #[test]
    fn a_span_reports_its_window_spread_and_time_on_a_cpu() {
        use std::time::{Duration, Instant};
        let span = Span::new(2);
        let t0 = Instant::now();
        (0..40).for_each(|_| span.tick(0));
        (0..30).for_each(|_| span.tick(1));
        span.record_at(t0, t0 + Duration::from_millis(40), 0.040);
        // Task 1 goes on alone: its last operations are not the window's.
        (0..10).for_each(|_| span.tick(1));
        span.record_at(
            t0 + Duration::from_millis(10),
            t0 + Duration::from_millis(70),
            0.030,
        );
        let t = span.take();
        assert!((t.secs - 0.070).abs() < 1e-9, "{t:?}");
        assert!((t.window_secs - 0.040).abs() < 1e-9, "{t:?}");
        assert_eq!(t.window_ops, 70, "{t:?}");
        assert!((t.spread - 1.5).abs() < 1e-9, "{t:?}");
        assert!((t.on_cpu - 0.7).abs() < 1e-9, "{t:?}");
        // Taken: the next phase starts afresh, its counts too.
        assert_eq!(
            span.take(),
            Taken {
                secs: 0.0,
                window_secs: 0.0,
                window_ops: 0,
                spread: 1.0,
                on_cpu: 1.0
            }
        );
        span.tick(1);
        span.record_at(t0, t0 + Duration::from_millis(5), 0.005);
        assert_eq!(span.take().window_ops, 1);
        // `finish`: the window's rate and the span's, both in the sample.
        (0..40).for_each(|_| span.tick(0));
        span.record_at(t0, t0 + Duration::from_millis(40), 0.040);
        span.record_at(t0, t0 + Duration::from_millis(80), 0.080);
        let mut s = Sample::new();
        span.finish("walk", 2, 80, &mut s);
        assert!(
            (s.get_in("walk", "ops_per_sec").unwrap() - 1000.0).abs() < 1e-6,
            "{s:?}"
        );
        assert!(
            (s.get_in("walk", "span_ops_per_sec").unwrap() - 1000.0).abs() < 1e-6,
            "{s:?}"
        );
        assert!(
            (s.get_in("walk", "task_time_spread").unwrap() - 2.0).abs() < 1e-9,
            "{s:?}"
        );
        // A real task: on a CPU nearly all along while it spins.
        let s = Span::start();
        let until = Instant::now() + Duration::from_millis(20);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        span.record(s);
        let t = span.take();
        assert!(t.secs >= 0.020 && t.spread == 1.0, "{t:?}");
        assert!(t.on_cpu > 0.0 && t.on_cpu <= 1.0, "{t:?}");
    }

    fn cfg(tasks: usize, files: u64) -> Config {
        let mut c = Config::new(Workload::Inodes, tasks);
        c.size = files;
        c
    }

    #[test]
    fn library_counts_no_global_lock_and_loads_once() {
        let _g = crate::measure::child_processes();
        let s = run(Target::Library, &cfg(2, 300)).unwrap();
        for p in PHASES {
            assert!(s.get_in(p, "ops_per_sec").unwrap() > 0.0, "{p}");
            assert_eq!(
                s.get_in(p, "global_lock_acquisitions_per_op").unwrap(),
                0.0,
                "{p}"
            );
        }
        assert_eq!(s.get_in("cold-walk", "loads_per_distinct_inode").unwrap(), 1.0);
    }

    #[test]
    fn prepatch_takes_a_global_lock_every_op() {
        let _g = crate::measure::child_processes();
        let s = run(Target::LibraryPrepatch, &cfg(2, 200)).unwrap();
        for p in PHASES {
            assert!(
                s.get_in(p, "global_lock_acquisitions_per_op").unwrap() >= 1.0,
                "{p}"
            );
        }
        assert_eq!(s.get_in("cold-walk", "loads_per_distinct_inode").unwrap(), 1.0);
    }

    #[test]
    fn alternatives_run_every_phase() {
        let _g = crate::measure::child_processes();
        for t in [
            Target::RwlockHashmap,
            Target::Dashmap,
            Target::Moka,
            Target::Partitioned,
        ] {
            let s = run(t, &cfg(2, 200)).unwrap();
            for p in PHASES {
                assert!(s.get_in(p, "ops_per_sec").unwrap() > 0.0, "{} {p}", t.name());
            }
            assert!(
                s.get_in("cold-walk", "loads_per_distinct_inode").unwrap() >= 1.0,
                "{}",
                t.name()
            );
        }
        let s = run(Target::RwlockHashmap, &cfg(1, 100)).unwrap();
        assert!(s.get_in("walk", "global_lock_acquisitions_per_op").unwrap() >= 1.0);
    }

    /// The control shares no lock: a task's own directory and partition only (1 lock per
    /// file, plus the directory's, per op), and one partition per task at the cold walk
    /// (every inode is loaded by both tasks: nothing coalesces loads).
    #[test]
    fn the_control_takes_only_its_tasks_own_locks() {
        let _g = crate::measure::child_processes();
        let s = run(Target::Partitioned, &cfg(2, 300)).unwrap();
        for p in PHASES {
            assert_eq!(
                s.get_in(p, "global_lock_acquisitions_per_op").unwrap(),
                0.0,
                "{p}"
            );
        }
        // walk: 300 lookups and one readdir per task.
        let walk = s.get_in("walk", "shard_lock_acquisitions_per_op").unwrap();
        assert!((walk - (1.0 + 1.0 / 300.0)).abs() < 1e-9, "{walk}");
        assert!(s.get_in("cold-walk", "loads_per_distinct_inode").unwrap() >= 1.0);
    }

    /// With one task the rate's window is the whole phase, so `ops_per_sec` equals
    /// `span_ops_per_sec` exactly only if every operation ticked once (a phase that
    /// missed its ticks, or ticked twice, differs).
    #[test]
    fn one_task_ticks_every_operation_once() {
        let _g = crate::measure::child_processes();
        for t in [Target::Library, Target::Dashmap, Target::Partitioned] {
            let s = run(t, &cfg(1, 120)).unwrap();
            for p in PHASES {
                let (w, sp) = (
                    s.get_in(p, "ops_per_sec").unwrap(),
                    s.get_in(p, "span_ops_per_sec").unwrap(),
                );
                assert!(w > 0.0 && w == sp, "{} {p}: {w} against {sp}", t.name());
            }
        }
    }

    #[test]
    fn selected_phases_only() {
        let _g = crate::measure::child_processes();
        let mut c = cfg(1, 50);
        c.modes = vec!["create", "cold-walk"];
        let s = run(Target::Library, &c).unwrap();
        assert!(
            s.get_in("create", "ops_per_sec").is_some() && s.get_in("cold-walk", "ops_per_sec").is_some()
        );
        assert!(s.get_in("walk", "ops_per_sec").is_none() && s.get_in("unlink", "ops_per_sec").is_none());
    }

    #[test]
    fn kernel_tmpfs_phases_or_skip() {
        let _g = crate::measure::child_processes();
        if let Err(Skip(why)) = available(Target::Kernel) {
            eprintln!("SKIP: {why}");
            return;
        }
        let s = run(Target::Kernel, &cfg(2, 100)).unwrap();
        for p in ["create", "walk", "chmod", "unlink"] {
            assert!(s.get_in(p, "ops_per_sec").unwrap() > 0.0, "{p}");
        }
        assert!(s.skipped().iter().any(|k| k.starts_with("cold-walk")), "{s:?}");
        // One task: every system call ticked once (see one_task_ticks_every_operation_once).
        let s = run(Target::Kernel, &cfg(1, 100)).unwrap();
        for p in ["create", "walk", "chmod", "unlink"] {
            let (w, sp) = (
                s.get_in(p, "ops_per_sec").unwrap(),
                s.get_in(p, "span_ops_per_sec").unwrap(),
            );
            assert!(w > 0.0 && w == sp, "{p}: {w} against {sp}");
        }
    }

    #[test]
    fn kernel_ext4_cold_walk_or_skip() {
        let _g = crate::measure::child_processes();
        if let Err(Skip(why)) = available(Target::KernelExt4) {
            eprintln!("SKIP: {why}");
            return;
        }
        let s = run(Target::KernelExt4, &cfg(2, 100)).unwrap();
        for p in PHASES {
            assert!(s.get_in(p, "ops_per_sec").unwrap() > 0.0, "{p}");
        }
    }
}
