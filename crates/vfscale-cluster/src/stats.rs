//! The service's counters: what it did locally, for peers, and when members failed.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::DirectoryStats;

/// A snapshot of the service's counters (and its directory's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClusterStats {
    /// Calls served by this member as the home, for its own clients.
    pub local_calls: u64,
    /// Calls sent to a remote home (each one request; re-sends after a home moved count
    /// again).
    pub remote_calls: u64,
    /// Calls this member served as the home for other members.
    pub served_for_peers: u64,
    /// Locks re-sent to a new home (by this member) or applied from other members'
    /// reclaims (at this member).
    pub reclaimed: u64,
    /// Waits answered `EDEADLK` for a cycle across members.
    pub deadlocks_across: u64,
    /// Lock calls answered `EIO` because their owner's locks were lost with a lease.
    pub lost_eio: u64,
    /// Inodes this member became the home of.
    pub homes_claimed: u64,
    /// Inodes homed here now.
    pub homes_now: u64,
    /// Inodes this member gave back after they were idle (out of its table, their
    /// ownership key deleted).
    pub homes_given_back: u64,
    /// Shadows of remote inodes dropped because they held nothing.
    pub shadows_pruned: u64,
    /// Calls waiting in this member's wait trees now (its clients' and peers').
    pub waiting_now: u64,
    /// Owners of dead members whose locks this member dropped as their home.
    pub dead_owners_dropped: u64,
    /// Wait-graph publications this member asked for.
    pub wait_publications: u64,
    /// Cycles the directory reported that a member refuted (a published edge was no
    /// longer a wait): no `EDEADLK` was answered.
    pub cycles_unconfirmed: u64,
    /// The directory's counters.
    pub directory: DirectoryStats,
}

/// Stripes of a counter bumped on the lock path by many threads at once.
const STRIPES: usize = 16;

/// One stripe, alone on its two cache lines (adjacent-line prefetch).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Stripe(AtomicU64);

/// A counter the lock path bumps from every thread: each thread adds to its own
/// stripe, so threads locking different inodes write no common cache line.
#[derive(Debug, Default)]
pub(crate) struct Striped {
    stripes: [Stripe; STRIPES],
}

thread_local! {
    /// This thread's stripe, given out round-robin on first use (`usize::MAX`: none yet).
    static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The next stripe to give out.
static NEXT_STRIPE: AtomicU64 = AtomicU64::new(0);

impl Striped {
    #[inline]
    pub fn bump(&self) {
        let mut i = STRIPE.get();
        if i == usize::MAX {
            i = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed) as usize % STRIPES;
            STRIPE.set(i);
        }
        self.stripes[i].0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn sum(&self) -> u64 {
        self.stripes.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

/// The live counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub local_calls: Striped,
    pub remote_calls: AtomicU64,
    pub served_for_peers: AtomicU64,
    pub reclaimed: AtomicU64,
    pub deadlocks_across: AtomicU64,
    pub lost_eio: AtomicU64,
    pub homes_claimed: AtomicU64,
    pub homes_given_back: AtomicU64,
    pub shadows_pruned: AtomicU64,
    pub dead_owners_dropped: AtomicU64,
    pub wait_publications: AtomicU64,
    pub cycles_unconfirmed: AtomicU64,
}

impl Counters {
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self, homes_now: u64, waiting_now: u64, directory: DirectoryStats) -> ClusterStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ClusterStats {
            local_calls: self.local_calls.sum(),
            remote_calls: g(&self.remote_calls),
            served_for_peers: g(&self.served_for_peers),
            reclaimed: g(&self.reclaimed),
            deadlocks_across: g(&self.deadlocks_across),
            lost_eio: g(&self.lost_eio),
            homes_claimed: g(&self.homes_claimed),
            homes_now,
            homes_given_back: g(&self.homes_given_back),
            shadows_pruned: g(&self.shadows_pruned),
            waiting_now,
            dead_owners_dropped: g(&self.dead_owners_dropped),
            wait_publications: g(&self.wait_publications),
            cycles_unconfirmed: g(&self.cycles_unconfirmed),
            directory,
        }
    }
}
