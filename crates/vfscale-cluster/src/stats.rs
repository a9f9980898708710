//! The service's counters: what it did locally, for peers, and when members failed.

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
    /// Owners of dead members whose locks this member dropped as their home.
    pub dead_owners_dropped: u64,
    /// Wait-graph publications this member asked for.
    pub wait_publications: u64,
    /// The directory's counters.
    pub directory: DirectoryStats,
}

/// The live counters.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub local_calls: AtomicU64,
    pub remote_calls: AtomicU64,
    pub served_for_peers: AtomicU64,
    pub reclaimed: AtomicU64,
    pub deadlocks_across: AtomicU64,
    pub lost_eio: AtomicU64,
    pub homes_claimed: AtomicU64,
    pub dead_owners_dropped: AtomicU64,
    pub wait_publications: AtomicU64,
}

impl Counters {
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub fn snapshot(&self, homes_now: u64, directory: DirectoryStats) -> ClusterStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ClusterStats {
            local_calls: g(&self.local_calls),
            remote_calls: g(&self.remote_calls),
            served_for_peers: g(&self.served_for_peers),
            reclaimed: g(&self.reclaimed),
            deadlocks_across: g(&self.deadlocks_across),
            lost_eio: g(&self.lost_eio),
            homes_claimed: g(&self.homes_claimed),
            homes_now,
            dead_owners_dropped: g(&self.dead_owners_dropped),
            wait_publications: g(&self.wait_publications),
            directory,
        }
    }
}
