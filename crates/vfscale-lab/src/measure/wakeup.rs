//! The wake-up control: what waking a sleeping process costs on this machine.
//!
//! Not a design to pick but a price under every figure taken through a FUSE mount: a
//! request over `/dev/fuse` wakes a server thread and its reply wakes the client, and a
//! grant to a parked lock waiter wakes that waiter. Where the woken task lands on an idle
//! CPU, a virtual machine's halted vCPU must be woken by an inter-processor interrupt,
//! which can cost ten times a context switch; a transport that serves the request on the
//! client's CPU (FUSE over io_uring) saves that wake-up. Read the transport's ratios with
//! this one.
//!
//! `tasks` forked processes (at least 2) pass one token around a ring. Each sleeps in
//! `FUTEX_WAIT` on its own word in shared memory until its predecessor sets the word and
//! wakes it, counts, and does the same for its successor, so one process runs at a time
//! and a hand-off is one wake-up and one context switch (across two CPUs, a successor
//! that has not yet gone to sleep finds the token set and does not sleep: fewer):
//!
//! * `one-cpu`: every process pinned to the first CPU this process may use;
//! * `two-cpus`: processes pinned alternately to the first two, so a hand-off wakes the
//!   other CPU, idle since the hand-off before (an even number of tasks).
//!
//! `handoffs_per_sec` over the measured interval (after a warm-up of two rounds of the
//! ring, by when every worker runs where it is pinned), `handoff_ns` its inverse, and
//! `context_switches_per_handoff` from the workers' rusage over their whole life.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use libc::c_int;
use vfscale_conformance::harness::{
    errno, mono_ns, probe_fork, ForkedWork, SharedArray, Team, WorkFailed, Worker,
};

use super::{Config, Sample, Skip};

/// The modes: where the ring's processes run.
pub const MODES: [&str; 2] = ["one-cpu", "two-cpus"];

/// How long the workers may take to exit after the stop flag: the token goes round once
/// more (50 ms for 1,000 processes across two CPUs here); a ring stalled by a worker
/// killed from outside is killed after this.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the warm-up may take before the run is given up.
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the ring can run here: `fork` works.
pub fn available() -> Result<(), Skip> {
    Ok(probe_fork()?)
}

/// Measures `cfg`'s one mode (`cfg.modes[0]`) once.
pub fn run(cfg: &Config) -> Result<Sample, Skip> {
    let mode = cfg.modes.first().copied().unwrap_or(MODES[0]);
    let n = cfg.tasks;
    if n < 2 {
        return Err(Skip(format!("a ring needs at least 2 tasks (got {n})")));
    }
    if cfg.duration.is_zero() {
        return Err(Skip("no duration: the ring runs for --duration".into()));
    }
    let cpus = allowed_cpus()?;
    let sets: Vec<libc::cpu_set_t> = match mode {
        "one-cpu" => vec![cpu_set(cpus[0])],
        "two-cpus" if cpus.len() < 2 => {
            return Err(Skip(format!(
                "two-cpus needs two CPUs; this process may use only CPU {}",
                cpus[0]
            )))
        }
        "two-cpus" if !n.is_multiple_of(2) => {
            return Err(Skip(format!(
                "two-cpus needs an even number of tasks, so that every hand-off crosses (got {n})"
            )))
        }
        "two-cpus" => vec![cpu_set(cpus[0]), cpu_set(cpus[1])],
        other => return Err(Skip(format!("no wakeup mode {other:?}"))),
    };
    // SAFETY: zero is a valid Token (an atomic), aligned to 128 bytes at most.
    let tokens = unsafe { SharedArray::<Token>::new(n)? };
    let mut team = Team::spawn(n, |i| {
        (
            c"/dev/null".as_ptr(),
            RingWork {
                cpu: sets[i % sets.len()],
                me: tokens.get(i),
                next: tokens.get((i + 1) % n),
            },
        )
    })?;
    team.wait_ready()?;
    team.go();
    // SAFETY: the mapping lives until after the team is reaped.
    pass(unsafe { &*tokens.get(0) }).map_err(|e| Skip(format!("futex wake: errno {e}")))?;
    let handoffs =
        |team: &Team<RingWork>| -> u64 { (0..n).map(|i| team.slot(i).count.load(Ordering::Relaxed)).sum() };
    let warm = std::time::Instant::now();
    while handoffs(&team) < 2 * n as u64 {
        if warm.elapsed() > WARM_UP_TIMEOUT {
            return Err(Skip(format!(
                "the token went round fewer than twice in {WARM_UP_TIMEOUT:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let (h0, t0) = (handoffs(&team), mono_ns());
    std::thread::sleep(cfg.duration);
    let (h1, t1) = (handoffs(&team), mono_ns());
    team.stop();
    let usage = team.finish(DRAIN_TIMEOUT)?;
    let secs = t1.saturating_sub(t0) as f64 / 1e9;
    let done = h1.saturating_sub(h0);
    if done == 0 || secs <= 0.0 {
        return Err(Skip(format!("no hand-offs in the measured interval ({secs} s)")));
    }
    let total = handoffs(&team);
    let switches: u64 = usage
        .iter()
        .map(|ru| (ru.ru_nvcsw.max(0) + ru.ru_nivcsw.max(0)) as u64)
        .sum();
    let rate = done as f64 / secs;
    let mut s = Sample::new();
    s.insert("handoffs_per_sec".into(), rate);
    s.insert("handoff_ns".into(), 1e9 / rate);
    s.insert(
        "context_switches_per_handoff".into(),
        switches as f64 / total.max(1) as f64,
    );
    Ok(s)
}

/// The CPUs this process may run on, in order (at least one).
fn allowed_cpus() -> Result<Vec<usize>, Skip> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map_err(|e| Skip(format!("sched_getaffinity: {e}")))?;
    let cpus: Vec<usize> = (0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect();
    if cpus.is_empty() {
        return Err(Skip("sched_getaffinity gave no CPU".into()));
    }
    Ok(cpus)
}

/// The set of `cpu` alone.
fn cpu_set(cpu: usize) -> libc::cpu_set_t {
    // SAFETY: an all-zero cpu_set_t is the empty set; CPU_SET stays inside it because
    // `cpu` came from a CpuSet of the same size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        set
    }
}

/// One ring worker's futex word: 1 while the token waits for it. 128 bytes, so that
/// neighbours share no cache line (nor an adjacent-line prefetch pair).
#[repr(C, align(128))]
struct Token {
    word: AtomicU32,
}

/// Hands the token to `to`: sets its word, then wakes it. The errno on failure.
fn pass(to: &Token) -> Result<(), c_int> {
    to.word.store(1, Ordering::Release);
    // SAFETY: FUTEX_WAKE on a live, aligned u32 of a shared mapping (not private: the
    // waiter is another process).
    let r = unsafe { libc::syscall(libc::SYS_futex, to.word.as_ptr(), libc::FUTEX_WAKE, 1) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(())
    }
}

/// What a ring worker does after the go signal. Runs after fork: only async-signal-safe
/// system calls, no allocation, no panics.
#[derive(Clone, Copy)]
struct RingWork {
    /// Where the worker runs.
    cpu: libc::cpu_set_t,
    /// Its own token, and its successor's, in a [`SharedArray`] that outlives it.
    me: *const Token,
    next: *const Token,
}

const PIN: WorkFailed = WorkFailed { stage: 0, errno: 0 };
const WAIT: WorkFailed = WorkFailed { stage: 1, errno: 0 };
const WAKE: WorkFailed = WorkFailed { stage: 2, errno: 0 };

impl ForkedWork for RingWork {
    const STAGES: &'static [&'static str] = &["sched_setaffinity", "the futex wait", "the futex wake"];

    fn run(self, _fd: c_int, worker: &Worker<'_>) -> Result<(), WorkFailed> {
        // SAFETY: sched_setaffinity reads a whole cpu_set_t of this worker's own.
        if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.cpu) } != 0 {
            return Err(WorkFailed {
                errno: errno(),
                ..PIN
            });
        }
        // SAFETY: both tokens live in a mapping the parent unmaps only after reaping us.
        let (me, next) = unsafe { (&*self.me, &*self.next) };
        let mut count = 0u64;
        loop {
            while me.word.load(Ordering::Acquire) == 0 {
                // SAFETY: FUTEX_WAIT on a live, aligned u32 of a shared mapping; it
                // returns at once unless the word is still 0.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_futex,
                        me.word.as_ptr(),
                        libc::FUTEX_WAIT,
                        0,
                        std::ptr::null::<libc::timespec>(),
                    )
                };
                if r < 0 && !matches!(errno(), libc::EAGAIN | libc::EINTR) {
                    return Err(WorkFailed {
                        errno: errno(),
                        ..WAIT
                    });
                }
            }
            me.word.store(0, Ordering::Relaxed);
            // Once stopped, each worker passes the token on once more and exits, so the
            // token reaches every one of them.
            let stop = worker.stop_requested();
            if !stop {
                count += 1;
                worker.slot.count.store(count, Ordering::Relaxed);
            }
            pass(next).map_err(|e| WorkFailed { errno: e, ..WAKE })?;
            if stop {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::Workload;

    fn cfg(tasks: usize, mode: &'static str) -> Config {
        Config {
            modes: vec![mode],
            duration: Duration::from_millis(100),
            ..Config::new(Workload::Wakeup, tasks)
        }
    }

    #[test]
    fn a_ring_hands_the_token_on_with_one_switch_each() {
        let _g = crate::measure::child_processes();
        if available().is_err() {
            eprintln!("SKIP: fork does not work here");
            return;
        }
        for tasks in [2, 40] {
            let s = run(&cfg(tasks, "one-cpu")).expect("one-cpu");
            let rate = s.get("handoffs_per_sec").unwrap();
            assert!(rate > 100.0, "{tasks} tasks: {rate} hand-offs/s");
            // Every hand-off puts its worker to sleep; start-up and exit add a few.
            let cs = s.get("context_switches_per_handoff").unwrap();
            assert!(
                (0.9..3.0).contains(&cs),
                "{tasks} tasks: {cs} switches per hand-off"
            );
        }
        match allowed_cpus().unwrap().len() {
            1 => eprintln!("SKIP: two-cpus needs two CPUs"),
            _ => {
                let s = run(&cfg(2, "two-cpus")).expect("two-cpus");
                assert!(s.get("handoffs_per_sec").unwrap() > 100.0);
                // Most hand-offs put a worker to sleep: the token is waited for, not spun on.
                let cs = s.get("context_switches_per_handoff").unwrap();
                assert!((0.2..3.0).contains(&cs), "two-cpus: {cs} switches per hand-off");
            }
        }
    }

    #[test]
    fn bad_rings_are_refused() {
        let _g = crate::measure::child_processes();
        assert!(run(&cfg(1, "one-cpu")).unwrap_err().0.contains("at least 2"));
        if allowed_cpus().unwrap().len() >= 2 {
            assert!(run(&cfg(3, "two-cpus")).unwrap_err().0.contains("even number"));
        }
        assert!(run(&cfg(2, "three-cpus"))
            .unwrap_err()
            .0
            .contains("no wakeup mode"));
        let no_time = Config {
            duration: Duration::ZERO,
            ..cfg(2, "one-cpu")
        };
        assert!(run(&no_time).unwrap_err().0.contains("duration"));
    }
}
