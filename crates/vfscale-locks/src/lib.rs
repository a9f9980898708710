//! Linux `fs/locks.c` in userspace: POSIX record locks, OFD locks and `flock(2)` locks
//! with Linux's semantics to the errno and the byte, and the scalability designs of the
//! kernel's lock rework (per-inode locking, a blocked-request tree).
//!
//! The caller owns its inodes, processes and open file descriptions. It embeds one
//! [`FileLockContext`] per inode and shares one [`LockManager`] for what is global.
//! Owners are opaque keys it chooses: a [`Process`] owns POSIX locks, an [`OpenFile`]
//! owns OFD and flock locks.
//!
//! ```
//! use vfscale_locks::*;
//! let mgr = LockManager::new();
//! let inode = FileLockContext::new(&mgr, InodeKey { major: 0, minor: 27, ino: 12 });
//! let (p1, p2) = (Process::new(100), Process::new(200));
//! let f1 = OpenFile::new(1, AccessMode::ReadWrite);
//! let f2 = OpenFile::new(2, AccessMode::ReadWrite);
//!
//! // p1 locks bytes 0..10 and 10..20: one owner's touching locks of one type merge.
//! inode.fcntl(p1, f1, FcntlCmd::SetLk, &mut Flock::new(LockType::Write, 0, 10)).unwrap();
//! inode.fcntl(p1, f1, FcntlCmd::SetLk, &mut Flock::new(LockType::Write, 10, 10)).unwrap();
//! let mut probe = Flock::new(LockType::Read, 15, 1);
//! inode.fcntl(p2, f2, FcntlCmd::GetLk, &mut probe).unwrap();
//! assert_eq!((probe.l_start, probe.l_len, probe.l_pid), (0, 20, 100));
//!
//! // p2 waits; closing any descriptor of p1 drops p1's locks and grants p2's.
//! let pending = inode.fcntl_lock(p2, f2, FcntlCmd::SetLkW, &mut Flock::new(LockType::Write, 5, 1)).unwrap().unwrap();
//! inode.posix_remove_owner(p1);
//! pending.wait().unwrap();
//! assert_eq!(mgr.proc_locks(), "1: POSIX  ADVISORY  WRITE 200 00:1b:12 5 5\n");
//! ```
//!
//! # Invariants
//!
//! * An inode's POSIX list holds POSIX and OFD locks. One owner's locks never overlap,
//!   never touch when of one type (they merge), are adjacent in the list and sorted by
//!   start; a new owner's locks go at the end. `F_GETLK` reports the first conflicting
//!   lock in that order, as Linux does.
//! * **The index** ([`LockIndex::Tree`], the default; this library's own, not a kernel
//!   change). The list is kept as two indexes over the same records: a hash table from
//!   each owner to its own AVL tree by start, threaded through the records (the run the
//!   merge walk visits, found in O(1) and walked in O(log k) of that owner's k locks),
//!   and a B+ tree by start with 15-entry leaves and 31-child branches (seven and sixteen
//!   aligned cache lines) in arrays of their own (augmented per child with the greatest
//!   end, over all locks and over write locks) for conflict searches; a node whose keys
//!   are evenly spaced (locks on fixed-size records, pages, slots) is stepped by
//!   interpolation, checked, instead of a count over its keys. List order is a key: every
//!   record carries its owner run's sequence number (32 bits, renumbered in order when
//!   exhausted), given when the run starts at the end of the list, so "first in list
//!   order" is the least (run, start). A record is in both indexes exactly while it is
//!   a granted POSIX or OFD lock, and its range never changes while it is in them.
//!   [`LockIndex::List`] keeps Linux's list; the two give the same results, listing
//!   and counters (tested call by call).
//! * **Records**: one 64-byte, line-aligned slot per lock (index links, then the
//!   range, owner, file and pid), so a conflict check reads one cache line; a record's
//!   wait-tree links (present only while someone waits) sit in a side table.
//! * The flock list holds at most one lock per open file description.
//! * **The wait tree** of fs/locks.c (NeilBrown's 2018 "locks: avoid thundering-herd
//!   wake-ups"). Every blocked request hangs under a granted lock or
//!   under another blocked request (`blocker`):
//!   1. a request conflicts with its blocker and with every record above it;
//!   2. siblings never conflict with each other, so an unlock wakes only a set of
//!      requests that could all be granted together: the direct waiters of the lock
//!      that changed;
//!   3. a woken request keeps its own waiters; if it is granted they wait on its new
//!      lock, if it sleeps again or gives up they are woken, because "conflicts with" is
//!      not transitive: they conflict with it, but perhaps not with its new blocker
//!      (the (0,2)/(1,2)/(2,2) case of NeilBrown's patch).
//!   4. the insert descent may jump over a *run* (`chain.rs`): waiters each the only
//!      child of the one before, of one kind, type and range, with counted owners; a
//!      request that conflicts with a member and shares no owner with the run would
//!      descend through all of them, so it goes straight to the run's tail. The tree is
//!      exactly the plain walk's (checked beside it under `cfg(test)`/debug). A
//!      re-blocked request's re-check skips a run the same way when every member would
//!      stay (for POSIX, one first-conflict lookup and one deadlock-detector walk decide
//!      for every member), checked against the member-by-member re-check likewise.
//! * Waiters are woken after every lock is dropped ([`WakeList`-style batching](crate)).
//! * **Fairness** (this library's own). An owner that unlocks and locks again usually beats the
//!   waiter it woke (barging, as in Linux: that is the throughput). So that every wait
//!   is bounded, an inode works in turns of half a millisecond: at the first change
//!   after a turn ends, the request that has waited longest among those woken and not
//!   yet retried — if its owner blocks in [`PendingLock::wait`] and it can be granted —
//!   is granted on its owner's behalf (the schedule where the woken task runs first),
//!   and that owner's turn begins; waiters its unlocks wake hold back their retry until
//!   the turn ends. Requests driven by `poll_complete` or `.await` (as replays are) are
//!   never handed the lock and never hold back: their results do not depend on time.
//!   A request's state: *blocked* (in a tree) → *woken* (detached, on the inode's ready
//!   list) → retried by its owner (granted, blocked again, or failed) or *handed off*
//!   (granted under the inode lock, result left in its wait cell for the owner).
//! * **Deadlock detection** covers process-owned POSIX requests only. A request that
//!   blocks on a process-owned POSIX record enters the blocked hash, keyed by its owner;
//!   the detector follows owner → newest blocked request → root of its tree → that
//!   root's owner, at most [`MAX_DEADLK_ITERATIONS`] + 1 hops, as Linux does.
//! * **Scalability** (Jeff Layton's 2013 "locks: scalability improvements for file
//!   locking": the per-inode lock and the hashed blocked list). Lock and unlock on
//!   different inodes share no lock and write no shared cache line: `blocked_lock` is taken
//!   only when a process-owned POSIX request blocks, leaves the hash, or is checked for
//!   deadlock; the listing shards are touched once per context lifetime and when someone
//!   lists.
//!
//! # Lock order
//!
//! The global lock (only with [`ContextLock::Global`]) → an inode's `flc_lock` →
//! `blocked_lock` → a listing shard → a wait cell's leaf locks (its waiter's state,
//! `link`). The
//! deadlock detector reads other inodes' trees only through waiters' `link` mirrors,
//! never through their `flc_lock`, so no path takes two inode locks.
//!
//! # Experiment settings
//!
//! [`Settings`] switch one mechanism each, so the lab can run a kernel change against
//! what came before it in one process: [`WakeMode::All`] wakes every waiter (before the
//! wait tree, NeilBrown 2018), [`ContextLock::Global`] serializes all inodes on one lock
//! (before the per-inode lock, Jeff Layton 2013), [`LockIndex::List`] walks Linux's list
//! instead of the index.
//!
//! # Cost and memory
//!
//! [`ContextStats::lock_checks`] and [`ContextStats::index_nodes`] count the work of
//! the POSIX/OFD searches, so a test can show what a call costs without timing it;
//! [`FileLockContext::memory`] reports the bytes an inode's locks occupy (about 110 per
//! held lock with either setting).
//!
//! # Where to find what
//!
//! | concept | file |
//! |---|---|
//! | the system calls: `fcntl(2)`, `flock(2)`, close, owners and files | `fcntl.rs` |
//! | lock records and the conflict rules (`posix_locks_conflict` & co.) | `lock.rs` |
//! | ABI types (`struct flock`, commands, lock types), errors | `types.rs`, `errno.rs` |
//! | one inode's context, its counters, what `flc_lock` protects | `context.rs` |
//! | the record store (arena of line-sized records, wait-link side table) | `context/records.rs` |
//! | the wait trees: insert, wake, re-examine a woken request's waiters | `context/wait_tree.rs` |
//! | the jump over a run of like waiters | `chain.rs` |
//! | fairness: the hand-off, the owners' turns, the clock | `context/fairness.rs` |
//! | POSIX/OFD requests: entry points, conflict search, `F_GETLK` | `context/posix.rs` |
//! | the POSIX update over Linux's list / over the index | `context/posix_list.rs`, `context/posix_tree.rs` |
//! | flock requests | `context/flock.rs` |
//! | the index: owner table, run keys (list order), conflict search | `index.rs` |
//! | each owner's AVL tree by start | `index/owner_tree.rs` |
//! | the B+ interval tree by start | `start_tree.rs`, `start_tree/nodes.rs` |
//! | its overlap scan, and the scan's AVX2 counts | `start_tree/scan.rs`, `start_tree/avx2.rs` |
//! | a blocked request's wait cell, the detector's link, [`WakeList`-style waking](crate) | `wait_cell.rs` |
//! | a request that waits: block, deadline, interrupt, `.await` | `pending.rs` |
//! | what is global: blocked hash, deadlock detection, settings, listing shards | `manager.rs` |
//! | `/proc/locks`; the held locks with their owners ([`FileLockContext::held_locks`]) | `listing.rs` |
//! | the wait-for edges, for deadlock detection across managers ([`PosixWaitEdge`]) | `manager.rs` |
//! | the synchronization primitives (std, loom, shuttle) and the shared waiter | `sync.rs` (`vfscale-sync`) |

#![warn(missing_docs)]

mod chain;
mod context;
mod errno;
mod fcntl;
mod index;
mod listing;
mod lock;
mod manager;
mod pending;
mod start_tree;
pub(crate) mod sync;
mod types;
mod wait_cell;

pub use context::{ContextMemory, ContextStats, FileLockContext};
pub use errno::Errno;
pub use fcntl::{flock_to_posix_range, OpenFile, Process};
pub use listing::{render_proc_locks, LockListing, LockRecord};
pub use lock::{FileLock, LockKind, OwnerKey};
pub use manager::{
    ContextLock, LockIndex, LockManager, ManagerStats, PosixWaitEdge, PosixWaitId, Settings, WakeMode,
    MAX_DEADLK_ITERATIONS,
};
pub use pending::PendingLock;
pub use types::*;
pub use vfscale_sync::Interrupter;
