//! The inodes homed at this member: their `vfscale-locks` contexts (under global ids)
//! and which other members' owners used them, in a sharded table the lock path reads
//! with one shared lock; and what tells an idle inode (to give back) from one in use.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    /// The lease this member claimed it under.
    pub lease: i64,
    pub ctx: Arc<FileLockContext>,
    /// Other members' owners and files seen here, by node.
    pub peers: Mutex<HashMap<String, PeerUse>>,
    /// Calls that hold it outside the table's lock ([`Pinned`]): waits, calls past a
    /// claim, peers' calls, closes. Raised only under the shard's lock.
    users: AtomicUsize,
    /// Used since the last sweep for idle inodes.
    used: AtomicBool,
}

impl HomeInode {
    /// A new home state, counted as used (a claim is a use).
    pub fn new(ino: InodeId, token: i64, lease: i64, ctx: Arc<FileLockContext>) -> HomeInode {
        HomeInode {
            ino,
            token,
            lease,
            ctx,
            peers: Mutex::new(HashMap::new()),
            users: AtomicUsize::new(0),
            used: AtomicBool::new(true),
        }
    }

    /// Marks it used; a load first, so the steady state writes no shared line.
    #[inline]
    pub fn touch(&self) {
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
    }

    /// Holds it for a call past the shard's lock. Only under that lock (inside
    /// [`HomeTable::with`] or by [`HomeTable::pin`]), so that a give-back, which
    /// checks `users` under the write lock, sees every pin.
    pub fn pin(self: &Arc<Self>) -> Pinned {
        self.users.fetch_add(1, Ordering::AcqRel);
        self.touch();
        Pinned(self.clone())
    }

    /// Whether nothing is held, waited for or in progress here, and nothing was since
    /// the last sweep. Under the shard's write lock, no pin can be taken meanwhile.
    fn is_idle(&self) -> bool {
        if self.users.load(Ordering::Acquire) != 0 || self.used.load(Ordering::Relaxed) {
            return false;
        }
        let m = self.ctx.memory();
        m.posix_locks == 0 && m.flock_locks == 0 && m.requests == 0
    }

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

/// A home state held by a call outside the table's lock: a give-back leaves it alone
/// until dropped.
pub(crate) struct Pinned(Arc<HomeInode>);

impl Pinned {
    /// The home state itself.
    pub fn home(&self) -> &Arc<HomeInode> {
        &self.0
    }
}

impl Deref for Pinned {
    type Target = HomeInode;

    fn deref(&self) -> &HomeInode {
        &self.0
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // The end of a call is a use: the idle time counts from here.
        self.0.touch();
        self.0.users.fetch_sub(1, Ordering::AcqRel);
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
    /// is touched; the inode counts as used); `None` when `ino` is not homed here.
    #[inline]
    pub fn with<R>(&self, ino: InodeId, f: impl FnOnce(&Arc<HomeInode>) -> R) -> Option<R> {
        let s = self.shard(ino).read();
        s.get(&ino).map(|hi| {
            hi.touch();
            f(hi)
        })
    }

    /// `ino`'s home state, pinned for a call.
    pub fn pin(&self, ino: InodeId) -> Option<Pinned> {
        self.shard(ino).read().get(&ino).map(HomeInode::pin)
    }

    /// Inserts `hi` if its inode has no home state here and `ok` holds (run under the
    /// shard's write lock); else the token of the state it has (`None`: `ok` refused).
    pub fn insert_new(&self, hi: Arc<HomeInode>, ok: impl FnOnce() -> bool) -> Result<(), Option<i64>> {
        let mut s = self.shard(hi.ino).write();
        if let Some(h) = s.get(&hi.ino) {
            return Err(Some(h.token));
        }
        if !ok() {
            return Err(None);
        }
        s.insert(hi.ino, hi);
        Ok(())
    }

    /// Removes `ino` if its token is `token`.
    pub fn remove_token(&self, ino: InodeId, token: i64) -> Option<Arc<HomeInode>> {
        let mut s = self.shard(ino).write();
        match s.get(&ino) {
            Some(h) if h.token == token => s.remove(&ino),
            _ => None,
        }
    }

    /// The inodes not used since the last call of this (which marks the others
    /// unused) and not pinned now: the candidates for a give-back.
    pub fn unused_since_last_look(&self) -> Vec<Arc<HomeInode>> {
        let mut out = Vec::new();
        for s in self.shards.iter() {
            for hi in s.read().values() {
                if !hi.used.swap(false, Ordering::Relaxed) && hi.users.load(Ordering::Acquire) == 0 {
                    out.push(hi.clone());
                }
            }
        }
        out
    }

    /// Takes `hi` out if it is still in the table and idle, checked under its shard's
    /// write lock, so no lock call can come between the check and the removal. `mark`
    /// runs under that lock too, before anyone can look for the inode again; it may
    /// refuse (`false`: the inode stays).
    pub fn take_idle(&self, hi: &Arc<HomeInode>, mark: impl FnOnce() -> bool) -> bool {
        let mut s = self.shard(hi.ino).write();
        match s.get(&hi.ino) {
            Some(h) if Arc::ptr_eq(h, hi) && h.is_idle() && mark() => {
                s.remove(&hi.ino);
                true
            }
            _ => false,
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
