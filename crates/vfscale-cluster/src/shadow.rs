//! The shadow: what this member's clients hold at remote homes, kept in `vfscale-locks`
//! contexts of their own (by the clients' local ids), so that a new home can be sent
//! exactly the locks to re-create (reclaim) and a close with nothing held there costs
//! no round trip.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use vfscale_locks::{FileLockContext, LockManager, OwnerId, OwnerKey};

use crate::homes::context_for;

use crate::InodeId;

/// One inode's shadow: its locks and the home they are held at.
pub(crate) struct ShadowInode {
    pub ctx: Arc<FileLockContext>,
    /// The home's node name and token, as last used or announced by a reclaim.
    pub home: Mutex<(String, i64)>,
    /// Bumped (under the table's mutex) each time a call takes it to add a lock, so
    /// a prune can tell that none was added since it looked.
    taken: AtomicU64,
}

/// Every inode's shadow. Lock order: `map` → a shadow's `home` mutex; a context is
/// locked with the map's mutex not held.
pub(crate) struct ShadowTable {
    mgr: Arc<LockManager>,
    map: Mutex<HashMap<InodeId, Arc<ShadowInode>>>,
}

impl ShadowTable {
    pub fn new() -> ShadowTable {
        ShadowTable {
            mgr: LockManager::new(),
            map: Mutex::new(HashMap::new()),
        }
    }

    pub fn get(&self, ino: InodeId) -> Option<Arc<ShadowInode>> {
        self.map.lock().get(&ino).cloned()
    }

    /// The shadow of `ino`, made when missing, at home `node`/`token`.
    pub fn entry(&self, ino: InodeId, node: &str, token: i64) -> Arc<ShadowInode> {
        let mut m = self.map.lock();
        let s = m.entry(ino).or_insert_with(|| {
            Arc::new(ShadowInode {
                ctx: context_for(&self.mgr, ino),
                home: Mutex::new((node.to_string(), token)),
                taken: AtomicU64::new(0),
            })
        });
        s.taken.fetch_add(1, Ordering::Relaxed);
        let s = s.clone();
        {
            let mut h = s.home.lock();
            if h.1 <= token {
                *h = (node.to_string(), token);
            }
        }
        s
    }

    /// Takes `ino`'s shadow out (its locks move to a home here).
    pub fn take(&self, ino: InodeId) -> Option<Arc<ShadowInode>> {
        self.map.lock().remove(&ino)
    }

    /// Drops the shadows that hold nothing; returns how many. Locks are added only by
    /// a holder of the `Arc` [`ShadowTable::entry`] gave out, after it bumped `taken`
    /// under the map's mutex: a shadow no such call held at the first look (no other
    /// reference), found empty, whose `taken` did not move by the second, stayed empty.
    pub fn prune_empty(&self) -> usize {
        let seen: Vec<(InodeId, Arc<ShadowInode>, u64)> = self
            .map
            .lock()
            .iter()
            .filter(|(_, s)| Arc::strong_count(s) == 1)
            .map(|(i, s)| (*i, s.clone(), s.taken.load(Ordering::Relaxed)))
            .collect();
        let empty: Vec<_> = seen
            .into_iter()
            .filter(|(_, s, _)| s.ctx.held_locks().is_empty())
            .collect();
        if empty.is_empty() {
            return 0;
        }
        let mut n = 0;
        {
            let mut m = self.map.lock();
            for (ino, s, taken) in &empty {
                if m.get(ino)
                    .is_some_and(|x| Arc::ptr_eq(x, s) && x.taken.load(Ordering::Relaxed) == *taken)
                {
                    m.remove(ino);
                    n += 1;
                }
            }
        }
        drop(empty);
        self.mgr.forget_dropped_contexts();
        n
    }

    /// Whether `ino`'s shadow holds any lock.
    pub fn holds_any(&self, ino: InodeId) -> bool {
        self.get(ino).is_some_and(|s| !s.ctx.held_locks().is_empty())
    }

    /// Takes every shadow out.
    pub fn drain(&self) -> Vec<(InodeId, Arc<ShadowInode>)> {
        self.map.lock().drain().collect()
    }

    /// The inodes whose shadow is homed at `node` (or at any home, with `None`), empty
    /// ones too: a call answered by the old home just before it went may still add to
    /// one, and its locks must then be reclaimed at the next home.
    pub fn homed_at(&self, node: Option<&str>) -> Vec<InodeId> {
        self.map
            .lock()
            .iter()
            .filter(|(_, s)| node.is_none_or(|n| s.home.lock().0 == n))
            .map(|(i, _)| *i)
            .collect()
    }

    /// Whether POSIX owner `owner` holds anything in `ino`'s shadow.
    pub fn posix_holds(&self, ino: InodeId, owner: u64) -> bool {
        self.get(ino).is_some_and(|s| {
            s.ctx
                .held_locks()
                .iter()
                .any(|l| l.owner == OwnerKey::Process(OwnerId(owner)))
        })
    }

    /// Whether open file `file` holds anything (OFD or flock) in `ino`'s shadow.
    pub fn file_holds(&self, ino: InodeId, file: u64) -> bool {
        self.get(ino).is_some_and(|s| {
            s.ctx
                .held_locks()
                .iter()
                .any(|l| l.owner == OwnerKey::File(vfscale_locks::FileId(file)))
        })
    }
}
