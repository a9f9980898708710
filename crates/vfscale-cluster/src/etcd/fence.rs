//! Self-fencing: this member's own estimate of whether its lease may have expired.
//!
//! etcd extends a lease from when it *receives* a renewal, which is after this member
//! *sent* it; so a renewal sent at `t` keeps the lease alive until at least `t + TTL`
//! on etcd's side. Counting from the send time, with a margin for clock rates and the
//! time etcd takes to expire keys, this member stops trusting its lease before any other
//! member can claim what it holds. The clock is `CLOCK_MONOTONIC`, which keeps counting
//! while the process is stopped (SIGSTOP), so a thawed member sees at once that it is
//! fenced.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Nanoseconds of `CLOCK_MONOTONIC`.
pub(crate) fn now_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own; CLOCK_MONOTONIC always exists
    // on Linux, so it cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The margin kept below the TTL: max(TTL / 5, 500 ms).
pub(crate) fn margin(ttl: Duration) -> Duration {
    (ttl / 5).max(Duration::from_millis(500))
}

/// When the last successful renewal was sent, and whether the lease is known lost.
pub(crate) struct FenceClock {
    /// `now_nanos()` when the last renewal that etcd acknowledged was sent.
    last_ok_sent: AtomicU64,
    /// Set when the lease is known gone or the clock ran out; cleared only by a rejoin.
    lost: AtomicBool,
    /// TTL minus the margin, in nanoseconds.
    limit: u64,
}

impl FenceClock {
    /// A clock that is fenced until the first lease is granted.
    pub(crate) fn new(ttl: Duration) -> FenceClock {
        let limit = ttl.saturating_sub(margin(ttl));
        FenceClock {
            last_ok_sent: AtomicU64::new(0),
            lost: AtomicBool::new(true),
            limit: limit.as_nanos() as u64,
        }
    }

    /// Whether this member must not grant: cheap (one load, one clock read).
    pub(crate) fn fenced(&self) -> bool {
        self.lost.load(Ordering::Acquire)
            || now_nanos().saturating_sub(self.last_ok_sent.load(Ordering::Acquire)) > self.limit
    }

    /// How long until the clock fences this member, if no renewal succeeds meanwhile.
    pub(crate) fn until_deadline(&self) -> Duration {
        let deadline = self
            .last_ok_sent
            .load(Ordering::Acquire)
            .saturating_add(self.limit);
        Duration::from_nanos(deadline.saturating_sub(now_nanos()))
    }

    /// A renewal sent at `sent` was acknowledged (a late answer never moves it back).
    pub(crate) fn renewed(&self, sent: u64) {
        self.last_ok_sent.fetch_max(sent, Ordering::AcqRel);
    }

    /// The lease is gone or untrusted: fenced until [`FenceClock::rejoined`].
    pub(crate) fn set_lost(&self) {
        self.lost.store(true, Ordering::Release);
    }

    /// A new lease was granted by a request sent at `sent`.
    pub(crate) fn rejoined(&self, sent: u64) {
        self.last_ok_sent.store(sent, Ordering::Release);
        self.lost.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenced_until_granted_then_after_ttl_minus_margin() {
        let ttl = Duration::from_secs(2);
        assert_eq!(margin(ttl), Duration::from_millis(500));
        assert_eq!(margin(Duration::from_secs(10)), Duration::from_secs(2));
        let c = FenceClock::new(ttl);
        assert!(c.fenced(), "no lease yet");
        let now = now_nanos();
        c.rejoined(now);
        assert!(!c.fenced());
        assert!(c.until_deadline() <= Duration::from_millis(1500));
        // A renewal sent 1.6 s ago is past TTL - margin = 1.5 s.
        c.rejoined(now - 1_600_000_000);
        assert!(c.fenced());
        c.renewed(now);
        assert!(!c.fenced());
        c.renewed(now - 1_600_000_000);
        assert!(!c.fenced(), "a late answer does not move the clock back");
        c.set_lost();
        assert!(c.fenced());
    }
}
