//! loom models of the dispatch gate (a pool of threads serving a queue that only a
//! blocking read takes from, as `/dev/fuse` is) and of the shared waiter. Run with
//! `RUSTFLAGS="--cfg vfscale_loom" cargo test -p vfscale-sync --test loom --release`.
#![cfg(vfscale_loom)]

use loom::sync::{Arc, Condvar, Mutex};
use std::collections::VecDeque;
use vfscale_sync::{DispatchGate, Interrupter, Precedence, WaitOutcome, Waiter};

/// A request of the model: `Waits` blocks its server until `Frees` has been served.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Req {
    Waits,
    Frees,
    Quick,
}

/// The queue (a blocking read, like `/dev/fuse`) and what the requests wait on, under
/// one lock and one condition variable to keep the model small.
#[derive(Default)]
struct State {
    queue: VecDeque<Req>,
    closed: bool,
    freed: bool,
    served: usize,
}

#[derive(Default)]
struct World {
    state: Mutex<State>,
    changed: Condvar,
}

impl World {
    /// The blocking read: a request, or None once the queue is closed.
    fn read(&self) -> Option<Req> {
        let mut s = self.state.lock().unwrap();
        loop {
            if let Some(r) = s.queue.pop_front() {
                return Some(r);
            }
            if s.closed {
                return None;
            }
            s = self.changed.wait(s).unwrap();
        }
    }

    fn push(&self, r: Req) {
        self.state.lock().unwrap().queue.push_back(r);
        self.changed.notify_all();
    }

    fn serve(&self, r: Req) {
        let mut s = self.state.lock().unwrap();
        match r {
            Req::Waits => {
                while !s.freed {
                    s = self.changed.wait(s).unwrap();
                }
            }
            Req::Frees => s.freed = true,
            Req::Quick => {}
        }
        s.served += 1;
        drop(s);
        self.changed.notify_all();
    }

    fn wait_served(&self, n: usize) {
        let mut s = self.state.lock().unwrap();
        while s.served < n {
            s = self.changed.wait(s).unwrap();
        }
    }

    fn close(&self) {
        self.state.lock().unwrap().closed = true;
        self.changed.notify_all();
    }
}

/// One dispatch thread: the loop fuser runs with a gate. `busy` says what every read
/// reports (false is the case that parks the most); `fails`: the thread's first read
/// fails, and it leaves the pool.
fn worker(gate: Arc<DispatchGate>, world: Arc<World>, me: usize, busy: bool, fails: bool) {
    let mut last_busy = false;
    loop {
        if !gate.before_read(me, last_busy) {
            return;
        }
        if fails {
            gate.leave();
            return;
        }
        let Some(r) = world.read() else {
            gate.close();
            return;
        };
        last_busy = busy;
        gate.after_read(r != Req::Quick, busy);
        world.serve(r);
    }
}

fn run(requests: &[Req], threads: usize, busy: bool) {
    run_failing(requests, threads, busy, usize::MAX)
}

/// As [`run`], thread `failing`'s first read failing.
fn run_failing(requests: &[Req], threads: usize, busy: bool, failing: usize) {
    let gate = Arc::new(DispatchGate::new(threads));
    let world = Arc::new(World::default());
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (g, w) = (gate.clone(), world.clone());
            loom::thread::spawn(move || worker(g, w, t, busy, t == failing))
        })
        .collect();
    for r in requests {
        world.push(*r);
    }
    world.wait_served(requests.len());
    world.close();
    for h in hs {
        h.join().unwrap();
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.check(f);
}

/// A request that blocks until a later one is served never stalls the pool: a spare
/// is woken to read the later one (loom reports a deadlock otherwise).
#[test]
fn a_blocking_request_lets_a_spare_read() {
    model(|| run(&[Req::Waits, Req::Frees], 2, false));
}

/// Requests that never block, from a stream, are all served, whoever parks.
#[test]
fn quick_requests_are_all_served() {
    model(|| run(&[Req::Quick, Req::Quick], 2, false));
}

/// Reads that find the queue busy keep more readers; still no request is left unread.
#[test]
fn busy_reads_keep_readers_and_lose_nothing() {
    model(|| run(&[Req::Waits, Req::Frees], 2, true));
}

/// A thread that fails leaves the pool; the others still read every request, a blocking
/// one included.
#[test]
fn a_failing_thread_leaves_and_the_others_read() {
    model(|| run_failing(&[Req::Waits, Req::Frees], 3, false, 0));
}

/// A wake-up is never lost, whether it comes before the waiter sleeps or after (loom
/// reports a deadlock otherwise).
#[test]
fn a_wake_up_ends_a_blocking_wait() {
    model(|| {
        let w = vfscale_sync::Arc::new(Waiter::new(Precedence::WakeUp, ()));
        let w2 = w.clone();
        let h = loom::thread::spawn(move || w2.wake());
        assert_eq!(w.wait(None), WaitOutcome::Woken);
        h.join().unwrap();
    });
}

/// A wake-up racing an interrupt ends the wait either way; once both arrived, the
/// waiter's precedence decides, and a rearm clears only the wake-up.
#[test]
fn a_wake_up_and_an_interrupt_end_the_wait_by_precedence() {
    for precedence in [Precedence::WakeUp, Precedence::Interrupt] {
        model(move || {
            let w = vfscale_sync::Arc::new(Waiter::new(precedence, ()));
            let int = Interrupter::new(&w);
            let w2 = w.clone();
            let a = loom::thread::spawn(move || w2.wake());
            let b = loom::thread::spawn(move || int.interrupt());
            let out = w.wait(None);
            assert_ne!(out, WaitOutcome::TimedOut);
            a.join().unwrap();
            b.join().unwrap();
            let both = match precedence {
                Precedence::WakeUp => WaitOutcome::Woken,
                Precedence::Interrupt => WaitOutcome::Interrupted,
            };
            assert_eq!(w.poll(None), Some(both));
            w.rearm();
            assert!(!w.is_woken());
            assert_eq!(w.wait(None), WaitOutcome::Interrupted);
        });
    }
}

/// A waker that a test thread sleeps on, as an executor's would.
#[derive(Default)]
struct Signal {
    woken: Mutex<bool>,
    cv: Condvar,
}

impl Signal {
    fn wait(&self) {
        let mut woken = self.woken.lock().unwrap();
        while !*woken {
            woken = self.cv.wait(woken).unwrap();
        }
        *woken = false;
    }
}

impl std::task::Wake for Signal {
    fn wake(self: std::sync::Arc<Self>) {
        *self.woken.lock().unwrap() = true;
        self.cv.notify_all();
    }
}

/// A future that registered its waker is woken: the wake-up either comes before the
/// poll, which sees it, or after, and calls the waker (loom reports a deadlock if it
/// is lost).
#[test]
fn a_polled_wait_is_woken_through_its_waker() {
    model(|| {
        let w = vfscale_sync::Arc::new(Waiter::new(Precedence::Interrupt, ()));
        let w2 = w.clone();
        let h = loom::thread::spawn(move || w2.wake());
        let signal = std::sync::Arc::new(Signal::default());
        let waker = std::task::Waker::from(signal.clone());
        let out = loop {
            if let Some(o) = w.poll(Some(&waker)) {
                break o;
            }
            signal.wait();
        };
        assert_eq!(out, WaitOutcome::Woken);
        h.join().unwrap();
    });
}

/// The user's state under the waiter's lock, written and followed by a wake-up, is
/// seen by the waiter that the wake-up ends.
#[test]
fn state_written_before_a_wake_up_is_seen_by_the_waiter() {
    model(|| {
        let w = vfscale_sync::Arc::new(Waiter::new(Precedence::WakeUp, None::<u32>));
        let w2 = w.clone();
        let h = loom::thread::spawn(move || {
            *w2.lock() = Some(7);
            w2.wake();
        });
        let mut g = w.lock();
        assert_eq!(g.wait(None), WaitOutcome::Woken);
        assert_eq!(*g, Some(7));
        drop(g);
        h.join().unwrap();
    });
}
