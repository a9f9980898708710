//! Locks lost with a lease, or whose unlock never reached their home: the (inode,
//! owner) pairs whose next lock calls answer `EIO`, as the Linux NFS client answers for
//! a lost lock, until the owner lets go of the file (close for a POSIX owner, last
//! close for an open file), whose close is then sent to the home whatever the shadow
//! holds.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use vfscale_locks::{FileLock, OwnerKey};

use crate::request::LockOwner;
use crate::InodeId;

/// The lost pairs, by the member's own ids. `any` lets the lock path skip the set
/// with one load while nothing is lost (the usual case).
#[derive(Default)]
pub(crate) struct LostSet {
    any: AtomicBool,
    set: Mutex<HashSet<(InodeId, LockOwner)>>,
}

impl LostSet {
    pub fn add(&self, ino: InodeId, who: LockOwner) {
        let mut s = self.set.lock();
        s.insert((ino, who));
        self.any.store(true, Ordering::Release);
    }

    /// Every owner of `locks` (held on `ino`, by this member's own ids) lost them.
    pub fn add_held(&self, ino: InodeId, locks: &[FileLock]) {
        for l in locks {
            self.add(
                ino,
                match l.owner {
                    OwnerKey::Process(o) => LockOwner::Posix(o.0),
                    OwnerKey::File(f) => LockOwner::File(f.0),
                },
            );
        }
    }

    /// Whether `who`'s locks on `ino` were lost.
    #[inline]
    pub fn contains(&self, ino: InodeId, who: LockOwner) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        self.set.lock().contains(&(ino, who))
    }

    /// The owner let go of the file: its calls are served again. Whether it was lost.
    pub fn clear(&self, ino: InodeId, who: LockOwner) -> bool {
        if !self.any.load(Ordering::Acquire) {
            return false;
        }
        let mut s = self.set.lock();
        let was = s.remove(&(ino, who));
        if s.is_empty() {
            self.any.store(false, Ordering::Release);
        }
        was
    }

    pub fn len(&self) -> usize {
        self.set.lock().len()
    }
}
