//! A start gate for timed workloads: workers arrive and wait; the driver opens the gate
//! when all are ready (the measured interval starts), or aborts it (workers return
//! without working). Shared by the kernel and library targets.

use std::sync::atomic::AtomicU64;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// One counter per worker thread, on its own cache lines.
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct Padded(pub AtomicU64);

/// Where a gate is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum GateState {
    /// Workers wait.
    #[default]
    Closed,
    /// Workers run.
    Open,
    /// Workers return without working.
    Aborted,
}

/// The gate: how many workers arrived, and its state.
#[derive(Default)]
pub(crate) struct Gate {
    state: Mutex<(usize, GateState)>,
    changed: Condvar,
}

impl Gate {
    /// Counts the caller as arrived and waits; `true` if opened, `false` if aborted.
    pub fn arrive_and_wait(&self) -> bool {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        g.0 += 1;
        self.changed.notify_all();
        while g.1 == GateState::Closed {
            g = self.changed.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        g.1 == GateState::Open
    }

    /// Waits until `n` workers arrived, or says why not within `timeout`.
    pub fn wait_ready(&self, n: usize, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        while g.0 < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "threads did not start within {timeout:?} ({} of {n})",
                    g.0
                ));
            }
            g = self
                .changed
                .wait_timeout(g, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    /// Opens or aborts the gate if it is still closed.
    pub fn set(&self, to: GateState) {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if g.1 == GateState::Closed {
            g.1 = to;
        }
        self.changed.notify_all();
    }

    /// Opens the gate.
    pub fn open(&self) {
        self.set(GateState::Open);
    }
}
