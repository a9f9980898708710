//! The seam between the lock service and what the cluster must agree on: who is alive,
//! which member is home for which inode, and the wait-for edges that deadlock detection
//! across members needs. [`crate::etcd::EtcdDirectory`] is the implementation (etcd);
//! tests of the lock service may use an in-memory one.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::broadcast;

use crate::{ClusterError, DirectoryEvent, Home, InodeId, Member, PublishedEdge, WaitEdge};

/// A boxed future, as the directory's calls return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Counters of a directory (machine-independent; the lab divides them by locks taken).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirectoryStats {
    /// etcd transactions and writes made (claims, wait-graph publications, registration),
    /// not counting lease keep-alives and watches.
    pub etcd_txns: u64,
    /// Claims that made this member an inode's home.
    pub claims_won: u64,
    /// Claims that found another home.
    pub claims_lost: u64,
    /// Wait-graph publications committed.
    pub wait_publications: u64,
    /// Times this member fenced itself.
    pub fences: u64,
}

/// A cycle the wait graph closes, with the member that published each edge, so that the
/// caller can check the edges of other members are still current before it answers
/// `EDEADLK`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitCycle {
    /// The new edge of the caller that closes the cycle.
    pub closing: WaitEdge,
    /// The other edges of the cycle, in walk order from `closing.blocker`.
    pub path: Vec<PublishedEdge>,
}

/// What the lock service needs agreed. Every call is answered from the cluster's shared
/// state (or from a cache a watch keeps current, where the doc says so).
pub trait Directory: Send + Sync + 'static {
    /// This member, with its current lease.
    fn me(&self) -> Member;

    /// The lease TTL this member was started with.
    fn lease_ttl(&self) -> Duration;

    /// The home of `ino`: the current one, or this member when `ino` has none (claimed
    /// under this member's lease; the winner of a race is the home). `Err(Fenced)` while
    /// this member is fenced.
    fn home(&self, ino: InodeId) -> BoxFuture<'_, Result<Home, ClusterError>>;

    /// The home of `ino` as the watch last saw it, with no round trip; `None` when none
    /// is known. Once it stopped showing a claim (deleted), it never shows it again.
    fn cached_home(&self, ino: InodeId) -> Option<Home>;

    /// Whether the watch still shows this member's claim of `ino` under `token`, fenced
    /// or not ([`Directory::cached_home`] hides this member's claims while it is
    /// fenced, which says nothing of whether the key is gone).
    fn claim_shown(&self, ino: InodeId, token: i64) -> bool;

    /// Gives back this member's home of `ino` claimed under `token`: deletes the
    /// ownership key if its create revision is still `token` (a newer claim is never
    /// deleted), so that the other members learn `HomeGone` and the next lock claims it
    /// anew. `Ok` once no key with that token is left (deleted now, or gone before);
    /// `Err(Fenced)` while fenced (the key goes with the lease); another error when the
    /// directory did not answer in time (the caller tries again later). The caller must
    /// have stopped serving the inode under that token.
    fn give_back(&self, ino: InodeId, token: i64) -> BoxFuture<'_, Result<(), ClusterError>>;

    /// The live members, as the watch last saw them (this member included).
    fn members(&self) -> Vec<Member>;

    /// Events from now on: members gone, homes gone, fencing and rejoining.
    fn events(&self) -> broadcast::Receiver<DirectoryEvent>;

    /// Whether this member is fenced now: its own clock says its lease may have expired
    /// (the last renewal that succeeded was sent more than TTL minus a margin ago). Cheap
    /// (an atomic load and a clock read); checked before every grant.
    fn fenced(&self) -> bool;

    /// Replaces this member's published wait-for edges with `current`, unless one of
    /// `new` (a subset of `current`) closes a cycle with the edges other members have
    /// published. Serialised cluster-wide (compare-and-swap on one version key), so of
    /// two edges that close one cycle, the one committed second sees the first. Returns
    /// the cycles found (nothing was published then), or an empty list once published.
    fn publish_waits(
        &self,
        current: Vec<WaitEdge>,
        new: Vec<WaitEdge>,
    ) -> BoxFuture<'_, Result<Vec<WaitCycle>, ClusterError>>;

    /// Counters.
    fn stats(&self) -> DirectoryStats;
}
