//! Lock counters for the lab: sharded by CPU so that counting never makes a shared
//! written cache line (each shard is its own 128-byte line).

use std::time::Instant;

use crate::sync::{current_cpu, AtomicU64, Mutex, MutexGuard, Ordering};

const SHARDS: usize = if cfg!(any(vfscale_loom, vfscale_shuttle)) {
    2
} else {
    16
};

#[repr(align(128))]
#[derive(Default)]
struct Shard {
    ctl_acq: AtomicU64,
    dev_acq: AtomicU64,
    validate_acq: AtomicU64,
    ctl_wait_ns: AtomicU64,
    dev_wait_ns: AtomicU64,
}

/// Which lock an acquisition counts for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LockKind {
    /// `loop_ctl_mutex`.
    Ctl,
    /// A device's `lo_mutex`.
    Dev,
    /// `loop_validate_mutex`.
    Validate,
}

/// The counters of one registry.
pub(crate) struct Stats {
    shards: Box<[Shard]>,
}

impl Stats {
    pub(crate) fn new() -> Stats {
        Stats {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }

    fn shard(&self) -> &Shard {
        &self.shards[current_cpu() % SHARDS]
    }

    /// Locks `m`, counting the acquisition and, when the mutex looked taken, the time
    /// spent waiting for it.
    pub(crate) fn lock<'a, T>(&self, kind: LockKind, m: &'a Mutex<T>) -> MutexGuard<'a, T> {
        let s = self.shard();
        let (acq, wait) = match kind {
            LockKind::Ctl => (&s.ctl_acq, Some(&s.ctl_wait_ns)),
            LockKind::Dev => (&s.dev_acq, Some(&s.dev_wait_ns)),
            LockKind::Validate => (&s.validate_acq, None),
        };
        acq.fetch_add(1, Ordering::Relaxed);
        match wait {
            Some(w) if m.is_locked() => {
                let t = Instant::now();
                let g = m.lock();
                w.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                g
            }
            _ => m.lock(),
        }
    }

    pub(crate) fn snapshot(&self) -> LoopStats {
        let mut out = LoopStats::default();
        for s in self.shards.iter() {
            out.ctl_lock_acquisitions += s.ctl_acq.load(Ordering::Relaxed);
            out.device_lock_acquisitions += s.dev_acq.load(Ordering::Relaxed);
            out.validate_lock_acquisitions += s.validate_acq.load(Ordering::Relaxed);
            out.ctl_lock_wait_ns += s.ctl_wait_ns.load(Ordering::Relaxed);
            out.device_lock_wait_ns += s.dev_wait_ns.load(Ordering::Relaxed);
        }
        out
    }
}

/// Lock counters of a registry since it was made (see [`crate::LoopControl::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoopStats {
    /// Acquisitions of the control lock (`loop_ctl_mutex`).
    pub ctl_lock_acquisitions: u64,
    /// Acquisitions of device locks (`lo_mutex`).
    pub device_lock_acquisitions: u64,
    /// Acquisitions of the loop-on-loop validation lock (`loop_validate_mutex`).
    pub validate_lock_acquisitions: u64,
    /// Total time spent waiting for the control lock, in nanoseconds.
    pub ctl_lock_wait_ns: u64,
    /// Total time spent waiting for device locks, in nanoseconds.
    pub device_lock_wait_ns: u64,
}

impl LoopStats {
    /// The counts from `earlier` to `self`.
    pub fn since(&self, earlier: &LoopStats) -> LoopStats {
        LoopStats {
            ctl_lock_acquisitions: self.ctl_lock_acquisitions - earlier.ctl_lock_acquisitions,
            device_lock_acquisitions: self.device_lock_acquisitions - earlier.device_lock_acquisitions,
            validate_lock_acquisitions: self.validate_lock_acquisitions - earlier.validate_lock_acquisitions,
            ctl_lock_wait_ns: self.ctl_lock_wait_ns - earlier.ctl_lock_wait_ns,
            device_lock_wait_ns: self.device_lock_wait_ns - earlier.device_lock_wait_ns,
        }
    }
}
