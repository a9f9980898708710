//! The shadow: what this member's clients hold at remote homes, kept in `vfscale-locks`
//! contexts of their own (by the clients' local ids), so that a new home can be sent
//! exactly the locks to re-create (reclaim) and a close with nothing held there costs
//! no round trip.

use std::collections::HashMap;
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
}

/// Every inode's shadow. Lock order: `map` → a context's own locks.
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
            })
        });
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

    /// Takes every shadow out.
    pub fn drain(&self) -> Vec<(InodeId, Arc<ShadowInode>)> {
        self.map.lock().drain().collect()
    }

    /// The inodes whose shadow holds locks at `node` (or at any home, with `None`).
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
