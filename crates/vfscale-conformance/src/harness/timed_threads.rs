//! A timed team of threads: each worker sets up, waits at a [`StartGate`], then repeats
//! one operation, counting in its own cache-line-padded [`Counter`], until the driver
//! ends the measured interval.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::StartGate;

/// Worker stack size.
const STACK: usize = 256 * 1024;
/// How long all workers may take to set up and reach the start gate.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// One counter per worker thread, on its own cache lines, so counting is not itself a
/// shared write.
#[repr(align(128))]
#[derive(Debug, Default)]
pub struct Counter(pub AtomicU64);

/// The result of [`drive`].
#[derive(Debug)]
pub struct Outcome<S, B> {
    /// Each worker's state after it stopped, for the caller to clean up.
    pub states: Vec<S>,
    /// What `before_go` returned (taken after every worker set up, before the gate opened).
    pub before_go: B,
    /// Ops counted when the measured interval ended.
    pub ops_in_interval: u64,
    /// Ops done in all, once every worker stopped.
    pub ops_total: u64,
    /// The measured interval.
    pub interval: Duration,
}

/// Runs `tasks` worker threads: each calls `setup(i)`, waits at a start gate, then
/// repeats `step` (one op), counting ops in its own [`Counter`], until the stop flag.
/// The caller's thread waits until every worker is at the gate, calls `before_go`, opens
/// the gate, sleeps `duration`, snapshots the counters and sets the flag. A setup or step
/// error, a thread that cannot be started or a start timeout is an error; then `cleanup`
/// runs on every state there is. On success the states are returned, not cleaned up, so
/// the caller can read counters before cleaning up.
pub fn drive<S: Send, B>(
    tasks: usize,
    duration: Duration,
    setup: impl Fn(usize) -> Result<S, String> + Sync,
    step: impl Fn(&mut S) -> Result<(), String> + Sync,
    before_go: impl FnOnce() -> B,
    cleanup: impl Fn(S),
) -> io::Result<Outcome<S, B>> {
    let counts: Vec<Counter> = (0..tasks).map(|_| Counter::default()).collect();
    let stop = AtomicBool::new(false);
    let failure: Mutex<Option<String>> = Mutex::new(None);
    let fail = |why: String| {
        let mut f = failure.lock().unwrap_or_else(|e| e.into_inner());
        f.get_or_insert(why);
    };
    let gate = StartGate::new();
    let (results, measured) = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(tasks);
        for (i, count) in counts.iter().enumerate() {
            let (setup, step, stop, fail, gate) = (&setup, &step, &stop, &fail, &gate);
            let spawned = std::thread::Builder::new()
                .stack_size(STACK)
                .spawn_scoped(s, move || {
                    let mut st = setup(i).map_err(|e| fail(format!("worker {i}: {e}"))).ok();
                    if !gate.arrive_and_wait() {
                        return (st, 0);
                    }
                    let Some(state) = st.as_mut() else {
                        return (st, 0);
                    };
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        if let Err(e) = step(state) {
                            fail(format!("worker {i}: {e}"));
                            stop.store(true, Ordering::Relaxed);
                            break;
                        }
                        n += 1;
                        count.0.store(n, Ordering::Relaxed);
                    }
                    (st, n)
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    fail(format!("cannot start thread {i} of {tasks}: {e}"));
                    break;
                }
            }
        }
        let mut measured = None;
        if handles.len() == tasks {
            match gate.wait_arrived(tasks, START_TIMEOUT) {
                Err(why) => fail(why.to_string()),
                Ok(()) if failure.lock().unwrap_or_else(|e| e.into_inner()).is_none() => {
                    let b = before_go();
                    let t0 = Instant::now();
                    gate.open();
                    std::thread::sleep(duration);
                    let ops: u64 = counts.iter().map(|c| c.0.load(Ordering::Relaxed)).sum();
                    measured = Some((b, ops, t0.elapsed()));
                }
                Ok(()) => {}
            }
        }
        stop.store(true, Ordering::Relaxed);
        gate.abort();
        let results: Vec<(Option<S>, u64)> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect();
        (results, measured)
    });
    let ops_total = results.iter().map(|r| r.1).sum();
    let states: Vec<S> = results.into_iter().filter_map(|r| r.0).collect();
    let failed = failure.into_inner().unwrap_or_else(|e| e.into_inner());
    match (failed, measured) {
        (None, Some((before_go, ops_in_interval, interval))) => Ok(Outcome {
            states,
            before_go,
            ops_in_interval,
            ops_total,
            interval,
        }),
        (why, _) => {
            states.into_iter().for_each(cleanup);
            Err(io::Error::other(
                why.unwrap_or_else(|| "the workers did not start".into()),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_worker_counts_in_the_interval() {
        let out = drive(3, Duration::from_millis(10), Ok, |_| Ok(()), || 7, |_| {}).unwrap();
        assert_eq!(out.states, [0, 1, 2]);
        assert_eq!(out.before_go, 7);
        assert!(out.ops_in_interval > 0 && out.ops_in_interval <= out.ops_total);
        assert!(out.interval >= Duration::from_millis(10));
    }

    #[test]
    fn failures_are_errors_and_states_are_cleaned_up() {
        let cleaned = AtomicU64::new(0);
        let r = drive(
            4,
            Duration::from_millis(10),
            |i| if i == 2 { Err("no".into()) } else { Ok(i) },
            |_| Ok(()),
            || (),
            |_| {
                cleaned.fetch_add(1, Ordering::Relaxed);
            },
        );
        let why = r.expect_err("setup failed");
        assert!(why.to_string().contains("worker 2: no"), "{why}");
        assert_eq!(cleaned.load(Ordering::Relaxed), 3);
        let r = drive(
            2,
            Duration::from_millis(10),
            |_| Ok(()),
            |_| Err("bad step".into()),
            || (),
            |_| {},
        );
        assert!(r.expect_err("step failed").to_string().contains("bad step"));
    }
}
