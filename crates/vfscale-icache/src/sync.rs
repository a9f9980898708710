//! The synchronization primitives this crate runs on: `vfscale-sync`'s (parking_lot and
//! std normally, loom under `--cfg vfscale_loom`, shuttle under `--cfg vfscale_shuttle`),
//! plus the wait step of a spin loop (the hash chains' bit locks).

pub use vfscale_sync::*;

/// `atomic::fence` of the backend: loom models `fence(SeqCst)` exactly but treats `SeqCst`
/// loads, stores and read-modify-writes as `AcqRel` (its README), so a store-buffering
/// (Dekker) hand-off that loom must check is written with fences.
#[cfg(vfscale_loom)]
pub(crate) use loom::sync::atomic::fence;
#[cfg(all(vfscale_shuttle, not(vfscale_loom)))]
pub(crate) use shuttle::sync::atomic::fence;
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
pub(crate) use std::sync::atomic::fence;

/// One step of waiting for a bit spinlock to be released: a short exponential spin with
/// `spin_loop`, then yielding the CPU (a userspace lock holder can be preempted, unlike
/// Linux's, which disables preemption). Under loom and shuttle: the scheduler's yield, so
/// the models see the spinning thread give way.
pub(crate) struct SpinWait {
    #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
    backoff: crossbeam_utils::Backoff,
}

impl SpinWait {
    pub(crate) fn new() -> Self {
        SpinWait {
            #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
            backoff: crossbeam_utils::Backoff::new(),
        }
    }

    pub(crate) fn wait(&self) {
        #[cfg(vfscale_loom)]
        loom::thread::yield_now();
        #[cfg(all(vfscale_shuttle, not(vfscale_loom)))]
        shuttle::thread::yield_now();
        #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
        self.backoff.snooze();
    }
}
