//! The inodes homed at this member: their `vfscale-locks` contexts (under global ids)
//! and which other members' owners used them, in a sharded table the lock path reads
//! with one shared lock.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use vfscale_locks::{FileId, FileLockContext, InodeKey, LockManager, OwnerId, Pid, Process};

use crate::InodeId;

/// A `vfscale-locks` context for `ino` (a home's or a shadow's).
pub(crate) fn context_for(mgr: &Arc<LockManager>, ino: InodeId) -> Arc<FileLockContext> {
    FileLockContext::new(
        mgr,
        InodeKey {
            major: 0,
            minor: 0,
            ino: ino.0,
        },
    )
}

/// One other member's owners and files that used an inode homed here: dropped when
/// that member's lease ends.
#[derive(Default)]
pub(crate) struct PeerUse {
    pub lease: i64,
    pub owners: HashSet<u64>,
    pub files: HashSet<u64>,
}

/// An inode homed here.
pub(crate) struct HomeInode {
    pub ino: InodeId,
    /// The fencing token of this member's claim.
    pub token: i64,
    pub ctx: Arc<FileLockContext>,
    /// Other members' owners and files seen here, by node.
    pub peers: Mutex<HashMap<String, PeerUse>>,
}

impl HomeInode {
    /// Remembers that `node` (under `lease`) used owner `owner` and file `file` here.
    pub fn note_peer(&self, node: &str, lease: i64, owner: Option<u64>, file: Option<u64>) {
        let mut p = self.peers.lock();
        let u = match p.get_mut(node) {
            Some(u) => u,
            None => p.entry(node.to_string()).or_default(),
        };
        if u.lease != lease {
            // A member that rejoined: its old ids are gone with its old lease.
            *u = PeerUse {
                lease,
                ..PeerUse::default()
            };
        }
        if let Some(o) = owner {
            u.owners.insert(o);
        }
        if let Some(f) = file {
            u.files.insert(f);
        }
    }

    /// The other members (node, lease) seen here.
    pub fn peer_leases(&self) -> Vec<(String, i64)> {
        self.peers
            .lock()
            .iter()
            .map(|(n, u)| (n.clone(), u.lease))
            .collect()
    }

    /// Drops every lock of `node`'s owners and files (under `lease`); returns how many
    /// owners and files were dropped.
    pub fn drop_peer(&self, node: &str, lease: i64) -> usize {
        let gone = {
            let mut p = self.peers.lock();
            match p.get(node) {
                Some(u) if u.lease == lease => p.remove(node),
                _ => None,
            }
        };
        let Some(u) = gone else {
            return 0;
        };
        for &o in &u.owners {
            self.ctx.posix_remove_owner(Process {
                owner: OwnerId(o),
                pid: Pid(0),
            });
        }
        for &f in &u.files {
            self.ctx.file_remove(FileId(f));
        }
        u.owners.len() + u.files.len()
    }

    /// `node`'s POSIX owner `id` (`posix`) or open file `id` let go of everything here
    /// (a close). Owner and file ids are separate name spaces: one number may be both.
    pub fn forget_peer_id(&self, node: &str, posix: bool, id: u64) {
        if let Some(u) = self.peers.lock().get_mut(node) {
            if posix {
                u.owners.remove(&id);
            } else {
                u.files.remove(&id);
            }
        }
    }

    /// Whether the POSIX owner (`posix`) or open file `id` belongs to another member.
    pub fn is_peer_id(&self, posix: bool, id: u64) -> bool {
        self.peers.lock().values().any(|u| {
            if posix {
                u.owners.contains(&id)
            } else {
                u.files.contains(&id)
            }
        })
    }
}

const SHARDS: usize = 64;

/// Hashes an inode number with one multiply (SipHash cost as much as the rest of the
/// lookup): inode numbers are not chosen by an adversary of this table.
#[derive(Default, Clone, Copy)]
pub(crate) struct InoHasher(u64);

impl std::hash::Hasher for InoHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// One shard of the home table.
type Shard = RwLock<HashMap<InodeId, Arc<HomeInode>, BuildHasherDefault<InoHasher>>>;

/// Inode → its home state here. Sharded so that lock calls on different inodes from
/// different threads share no lock word.
pub(crate) struct HomeTable {
    shards: Box<[Shard]>,
}

impl HomeTable {
    pub fn new() -> HomeTable {
        HomeTable {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::default())).collect(),
        }
    }

    #[inline]
    fn shard(&self, ino: InodeId) -> &Shard {
        // Inode numbers are dense: their low bits spread well.
        &self.shards[(ino.0 as usize) & (SHARDS - 1)]
    }

    /// Runs `f` on `ino`'s home state, with its shard read-locked (no reference count
    /// is touched); `None` when `ino` is not homed here.
    #[inline]
    pub fn with<R>(&self, ino: InodeId, f: impl FnOnce(&Arc<HomeInode>) -> R) -> Option<R> {
        let s = self.shard(ino).read();
        s.get(&ino).map(f)
    }

    pub fn get(&self, ino: InodeId) -> Option<Arc<HomeInode>> {
        self.shard(ino).read().get(&ino).cloned()
    }

    pub fn insert(&self, hi: Arc<HomeInode>) {
        self.shard(hi.ino).write().insert(hi.ino, hi);
    }

    /// Removes `ino` if its token is `token`.
    pub fn remove_token(&self, ino: InodeId, token: i64) -> Option<Arc<HomeInode>> {
        let mut s = self.shard(ino).write();
        match s.get(&ino) {
            Some(h) if h.token == token => s.remove(&ino),
            _ => None,
        }
    }

    /// Every inode homed here.
    pub fn all(&self) -> Vec<Arc<HomeInode>> {
        self.shards
            .iter()
            .flat_map(|s| s.read().values().cloned().collect::<Vec<_>>())
            .collect()
    }

    /// Takes every inode out.
    pub fn drain(&self) -> Vec<Arc<HomeInode>> {
        self.shards
            .iter()
            .flat_map(|s| s.write().drain().map(|(_, v)| v).collect::<Vec<_>>())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }
}
