//! The lock listing: every held lock and every waiter, as data and as `/proc/locks`.
//!
//! Listing costs the lock holders nothing on their fast path: a context joins a per-CPU
//! shard once, the first time it holds a lock, and the listing walks the shards and
//! takes each live context's lock in turn (`locks_start` walks `file_lock_list` the same
//! way, per CPU).

use std::fmt::Write as _;

use crate::context::{Inner, NodeId};
use crate::lock::{FileLock, LockKind};
use crate::manager::LockManager;
use crate::{FileLockContext, InodeKey, LockType, OFFSET_MAX};

/// One record in the listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockRecord {
    /// POSIX, OFD or flock.
    pub kind: LockKind,
    /// Read or write.
    pub ty: LockType,
    /// The pid shown: the owner's pid, -1 for OFD records.
    pub pid: i32,
    /// The inode.
    pub inode: InodeKey,
    /// First byte.
    pub start: i64,
    /// Last byte (inclusive), `OFFSET_MAX` to end of file.
    pub end: i64,
}

/// A held lock with the requests waiting on it, depth first, each with its depth
/// (1 for a direct waiter).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockListing {
    /// The held lock.
    pub lock: LockRecord,
    /// Its waiters, depth first, as `(depth, record)`.
    pub waiters: Vec<(usize, LockRecord)>,
}

fn record(fl: &FileLock, inode: InodeKey) -> LockRecord {
    LockRecord {
        kind: fl.kind,
        ty: fl.ty,
        pid: if fl.kind == LockKind::Ofd { -1 } else { fl.pid.0 },
        inode,
        start: fl.start,
        end: fl.end,
    }
}

fn collect(inner: &Inner, inode: InodeKey, out: &mut Vec<LockListing>) {
    for &id in inner.posix_in_list_order().iter().chain(inner.flock.iter()) {
        let mut waiters = Vec::new();
        // Depth-first over the tree: (node, depth) pairs, children in order.
        let mut stack: Vec<(NodeId, usize)> = inner.children(id).iter().rev().map(|&c| (c, 1)).collect();
        while let Some((n, d)) = stack.pop() {
            waiters.push((d, record(&inner.node(n).fl, inode)));
            stack.extend(inner.children(n).iter().rev().map(|&c| (c, d + 1)));
        }
        out.push(LockListing {
            lock: record(&inner.node(id).fl, inode),
            waiters,
        });
    }
}

/// Renders one record in `lock_get_status`'s format, without the `id: ` prefix.
fn render_record(f: &mut String, r: &LockRecord) {
    match r.kind {
        LockKind::Posix => f.push_str("POSIX  ADVISORY  "),
        LockKind::Ofd => f.push_str("OFDLCK ADVISORY  "),
        LockKind::Flock => f.push_str("FLOCK  ADVISORY  "),
    }
    f.push_str(match r.ty {
        LockType::Write => "WRITE ",
        LockType::Read => "READ  ",
        LockType::Unlock => "UNLCK ",
    });
    let _ = write!(
        f,
        "{} {:02x}:{:02x}:{} ",
        r.pid, r.inode.major, r.inode.minor, r.inode.ino
    );
    if r.kind == LockKind::Flock {
        f.push_str("0 EOF\n");
    } else if r.end == OFFSET_MAX {
        let _ = writeln!(f, "{} EOF", r.start);
    } else {
        let _ = writeln!(f, "{} {}", r.start, r.end);
    }
}

/// Renders a listing exactly as `/proc/locks` does: one numbered line per held lock,
/// its waiters after it as `-> ` lines indented one space per level below the first.
///
/// ```
/// use vfscale_locks::*;
/// let mgr = LockManager::new();
/// let inode = FileLockContext::new(&mgr, InodeKey { major: 0, minor: 0x1b, ino: 12 });
/// inode.flock(Process::new(7), OpenFile::new(1, AccessMode::Read), FlockOp::Exclusive, true).unwrap();
/// assert_eq!(render_proc_locks(&mgr.locks_listing()), "1: FLOCK  ADVISORY  WRITE 7 00:1b:12 0 EOF\n");
/// ```
pub fn render_proc_locks(listing: &[LockListing]) -> String {
    let mut f = String::new();
    for (i, l) in listing.iter().enumerate() {
        let id = i + 1;
        let _ = write!(f, "{id}: ");
        render_record(&mut f, &l.lock);
        for (depth, w) in &l.waiters {
            let _ = write!(f, "{id}: {:>width$}", "-> ", width = depth - 1 + 3);
            render_record(&mut f, w);
        }
    }
    f
}

impl FileLockContext {
    /// Every lock held on this inode (POSIX and OFD locks in list order, then flock
    /// locks), each with its owner: what a caller needs to take the same locks again
    /// elsewhere (a lock service that moves an inode's locks to another server).
    /// Waiting requests are not included. Under the inode's lock.
    ///
    /// ```
    /// use vfscale_locks::*;
    /// let mgr = LockManager::new();
    /// let inode = FileLockContext::new(&mgr, InodeKey::default());
    /// let f = OpenFile::new(9, AccessMode::ReadWrite);
    /// inode.fcntl(Process::new(1), f, FcntlCmd::SetLk, &mut Flock::new(LockType::Read, 0, 10)).unwrap();
    /// inode.flock(Process::new(1), f, FlockOp::Exclusive, true).unwrap();
    /// let held = inode.held_locks();
    /// assert_eq!(held.len(), 2);
    /// assert_eq!((held[0].owner, held[0].start, held[0].end), (OwnerKey::Process(OwnerId(1)), 0, 9));
    /// assert_eq!((held[1].kind, held[1].owner), (LockKind::Flock, OwnerKey::File(FileId(9))));
    /// ```
    pub fn held_locks(&self) -> Vec<FileLock> {
        let _big = self.mgr.big_lock();
        let inner = self.inner.lock();
        inner
            .posix_in_list_order()
            .iter()
            .chain(inner.flock.iter())
            .map(|&id| inner.node(id).fl)
            .collect()
    }
}

impl LockManager {
    /// Every held lock and its waiters, context by context.
    pub fn locks_listing(&self) -> Vec<LockListing> {
        let mut out = Vec::new();
        for ctx in self.listing_contexts() {
            let inner = ctx.inner.lock();
            collect(&inner, ctx.key(), &mut out);
        }
        out
    }

    /// The listing in `/proc/locks` format.
    pub fn proc_locks(&self) -> String {
        render_proc_locks(&self.locks_listing())
    }
}
