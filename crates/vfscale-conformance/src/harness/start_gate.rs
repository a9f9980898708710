//! The start gate of a team of threads: workers arrive and wait; the driver opens the
//! gate once all are there (the measured interval starts), or aborts it (workers return
//! without working).
//!
//! Opening wakes every sleeping worker with one `FUTEX_WAKE`, so they become runnable at
//! once, as forked workers do when their go pipe closes, and not one by one through a
//! mutex (a condvar or `std::sync::Barrier`) while the first ones already run. Workers
//! that must all be running on a CPU when the gate opens spin instead
//! ([`StartGate::arrive_and_spin`]).

use std::io;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The gate's states, in its futex word.
const CLOSED: u32 = 0;
const OPEN: u32 = 1;
const ABORTED: u32 = 2;

/// A one-shot start gate; see the module documentation.
#[derive(Debug, Default)]
pub struct StartGate {
    state: AtomicU32,
    arrived: AtomicUsize,
}

impl StartGate {
    /// A closed gate nobody has arrived at.
    pub fn new() -> StartGate {
        StartGate::default()
    }

    /// Counts the caller as arrived and sleeps until the gate opens (`true`) or is
    /// aborted (`false`).
    pub fn arrive_and_wait(&self) -> bool {
        self.arrived.fetch_add(1, Ordering::SeqCst);
        loop {
            match self.state.load(Ordering::Acquire) {
                CLOSED => futex_wait(&self.state, CLOSED),
                s => return s == OPEN,
            }
        }
    }

    /// Counts the caller as arrived and spins (yielding now and then, so that the driver
    /// gets a CPU) until the gate opens (`true`) or is aborted (`false`): every spinning
    /// worker is on a CPU when it opens.
    pub fn arrive_and_spin(&self) -> bool {
        self.arrived.fetch_add(1, Ordering::AcqRel);
        let mut spins = 0u32;
        loop {
            match self.state.load(Ordering::Acquire) {
                CLOSED => {
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(64) {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
                s => return s == OPEN,
            }
        }
    }

    /// How many workers have arrived.
    pub fn arrived(&self) -> usize {
        self.arrived.load(Ordering::Acquire)
    }

    /// Waits (looking every millisecond) until `n` workers arrived, or says why not
    /// within `timeout`.
    pub fn wait_arrived(&self, n: usize, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        while self.arrived() < n {
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "threads did not start within {timeout:?} ({} of {n})",
                        self.arrived()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Yields until `n` workers arrived: for workers that spin, which must not wait a
    /// millisecond for the driver.
    pub fn yield_until_arrived(&self, n: usize) {
        while self.arrived() < n {
            std::thread::yield_now();
        }
    }

    /// Opens the gate if it is still closed.
    pub fn open(&self) {
        self.set(OPEN);
    }

    /// Aborts the gate if it is still closed: waiting workers return `false`.
    pub fn abort(&self) {
        self.set(ABORTED);
    }

    /// Whether the gate was opened.
    pub fn is_open(&self) -> bool {
        self.state.load(Ordering::Acquire) == OPEN
    }

    fn set(&self, to: u32) {
        if self
            .state
            .compare_exchange(CLOSED, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            futex_wake_all(&self.state);
        }
    }
}

/// Sleeps while `word` holds `expected` (or until a spurious wake-up).
fn futex_wait(word: &AtomicU32, expected: u32) {
    // SAFETY: FUTEX_WAIT on a live, aligned u32 that outlives the call; it returns at
    // once if the word no longer holds `expected`.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            std::ptr::null::<libc::timespec>(),
        )
    };
}

/// Wakes every thread sleeping on `word`.
fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a live, aligned u32; wakes every waiter.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No worker passes the gate before it opens, and every worker passes once it is
    /// open; an aborted gate lets them return without passing.
    #[test]
    fn the_gate_holds_every_worker_until_it_opens_or_aborts() {
        for abort in [false, true] {
            for spin in [false, true] {
                let gate = StartGate::new();
                let passed = AtomicUsize::new(0);
                std::thread::scope(|s| {
                    for _ in 0..3 {
                        s.spawn(|| {
                            let open = if spin {
                                gate.arrive_and_spin()
                            } else {
                                gate.arrive_and_wait()
                            };
                            if open {
                                passed.fetch_add(1, Ordering::SeqCst);
                            }
                        });
                    }
                    gate.wait_arrived(3, Duration::from_secs(60)).unwrap();
                    std::thread::sleep(Duration::from_millis(5));
                    assert_eq!(passed.load(Ordering::SeqCst), 0);
                    if abort {
                        gate.abort();
                    } else {
                        gate.open();
                    }
                });
                assert_eq!(passed.load(Ordering::SeqCst), if abort { 0 } else { 3 });
                assert_eq!(gate.is_open(), !abort);
            }
        }
    }

    #[test]
    fn waiting_for_arrivals_times_out() {
        let gate = StartGate::new();
        let e = gate.wait_arrived(1, Duration::from_millis(5)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }
}
