//! The inode table: FUSE node ids ↔ source inodes, with the kernel's lookup counts.
//!
//! This module is the one boundary behind which the table lives, so that it can become
//! `vfscale-icache` (issue 9) without touching the rest of the server. What it provides
//! is what the server needs from an inode cache:
//!
//! * **Identity.** An inode is keyed by its source identity `(st_dev, st_ino)`, shared by
//!   every connection (mountpoint): whichever mountpoint a file is reached through, it is
//!   one [`Inode`], with one lock context. Its node id is the same on every connection.
//! * **Lookup counts.** Every reply that hands the kernel a node id (lookup, create,
//!   mkdir, mknod, symlink, link) counts one lookup on that connection; `forget` takes
//!   them back. Counts are kept per connection so that one mountpoint going away
//!   (unmount) drops exactly its own references.
//! * **Eviction.** An inode leaves the table when no connection holds a lookup and no
//!   handle is open on it ([`InodeTable::try_evict`]). The open count matters because
//!   `RELEASE` is sent in the background and may arrive after `FORGET`: the lock context
//!   must outlive the handles whose locks it holds.
//! * **Coalesced lookups.** Concurrent lookups of one inode end in one [`Inode`]: the
//!   key is learnt by opening and `stat`ing the name (the load), and insertion is
//!   insert-if-absent under the shard lock, so the thread that loses the race drops its
//!   descriptor and takes the winner's inode.
//!
//! # Locks
//!
//! The table is split into [`SHARDS`] shards, each a mutex over two maps (id → inode,
//! key → inode). A node id is the source inode number where it can be (so `st_ino`
//! through the mount is the source's), else a made-up id that carries its shard in its
//! low bits; either way an inode's id and key hash to the same shard, so both maps of one
//! inode are under one lock and no lock or counter is shared by all inodes.
//! Lookup counts are atomics; they are *incremented* only under the shard lock, which
//! makes the eviction check (all counts zero, re-checked under the lock) final.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;
use vfscale_locks::{FileLockContext, LockManager, OwnerId};

/// Number of shards (a power of two); a node id's low bits name its shard.
pub const SHARDS: usize = 64;
const SHARD_BITS: u32 = SHARDS.trailing_zeros();

/// The FUSE node id of the root (`FUSE_ROOT_ID`).
pub const ROOT_ID: u64 = 1;

/// A source inode's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BackingKey {
    /// `st_dev` of the source file.
    pub dev: u64,
    /// `st_ino` of the source file.
    pub ino: u64,
}

fn mix(x: u64) -> usize {
    // Inode numbers are dense, so their low bits spread well already; fold in some
    // higher ones.
    ((x ^ (x >> 17)) as usize) & (SHARDS - 1)
}

/// Node ids with this bit are made up (a source inode whose number cannot serve: it is
/// on another device than the source root, or is 1 or has this bit); the others are the
/// source inode number, so `st_ino` through the mount is the source's and matches the
/// `d_ino` of directory entries.
const SYNTHETIC: u64 = 1 << 63;

/// What kind of file an inode is (it never changes for one `(st_dev, st_ino)`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A device node, FIFO or socket.
    Special,
}

impl Kind {
    /// The kind for a `st_mode`.
    pub fn from_mode(mode: u32) -> Kind {
        match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            _ => Kind::Special,
        }
    }
}

/// One source inode the kernel knows about.
pub struct Inode {
    /// Its FUSE node id (the same on every connection), also its `st_ino` through the
    /// mount.
    pub id: u64,
    /// Its source identity.
    pub key: BackingKey,
    /// Its kind.
    pub kind: Kind,
    /// An `O_PATH` descriptor of the source inode: every operation on it starts here.
    fd: OwnedFd,
    /// Lookups held by each connection's kernel.
    lookups: Box<[AtomicU64]>,
    /// Open handles on this inode (all connections).
    open: AtomicU64,
    /// The inode's lock context, made on first use.
    locks: OnceLock<Arc<FileLockContext>>,
    /// Per connection, the kernel passthrough backing file registered for this inode
    /// while a handle uses it (the kernel wants one per inode).
    pub backing: Box<[Mutex<Weak<fuser::BackingId>>]>,
    /// For each POSIX lock owner that set a lock through a handle of this inode, the
    /// number of open handles it used (see `locks.rs`, release).
    pub lock_owners: Mutex<HashMap<OwnerId, u32>>,
}

impl std::fmt::Debug for Inode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inode")
            .field("id", &self.id)
            .field("key", &self.key)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl Inode {
    fn new(id: u64, key: BackingKey, kind: Kind, fd: OwnedFd, conns: usize) -> Inode {
        Inode {
            id,
            key,
            kind,
            fd,
            lookups: (0..conns).map(|_| AtomicU64::new(0)).collect(),
            open: AtomicU64::new(0),
            locks: OnceLock::new(),
            backing: (0..conns).map(|_| Mutex::new(Weak::new())).collect(),
            lock_owners: Mutex::new(HashMap::new()),
        }
    }

    /// The `O_PATH` descriptor of the source inode.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The inode's lock context, made on first use and keyed by the source identity.
    pub fn lock_context(&self, mgr: &Arc<LockManager>) -> &Arc<FileLockContext> {
        self.locks.get_or_init(|| {
            let key = vfscale_locks::InodeKey {
                major: libc::major(self.key.dev),
                minor: libc::minor(self.key.dev),
                ino: self.key.ino,
            };
            FileLockContext::new(mgr, key)
        })
    }

    /// The lock context if one was made (no lock was ever asked for otherwise).
    pub fn lock_context_if_any(&self) -> Option<&Arc<FileLockContext>> {
        self.locks.get()
    }

    /// A handle was opened on this inode.
    pub fn open_inc(&self) {
        self.open.fetch_add(1, Ordering::AcqRel);
    }

    /// A handle was released; true when none remains.
    pub fn open_dec(&self) -> bool {
        self.open.fetch_sub(1, Ordering::AcqRel) == 1
    }

    fn total_lookups(&self) -> u64 {
        self.lookups.iter().map(|c| c.load(Ordering::Acquire)).sum()
    }

    fn idle(&self) -> bool {
        self.open.load(Ordering::Acquire) == 0 && self.total_lookups() == 0
    }

    /// Lookups held by connection `conn` (tests and statistics).
    pub fn lookups(&self, conn: usize) -> u64 {
        self.lookups[conn].load(Ordering::Acquire)
    }
}

#[derive(Default)]
struct Shard {
    by_id: HashMap<u64, Arc<Inode>>,
    by_key: HashMap<BackingKey, Arc<Inode>>,
    next: u64,
}

/// Cache-line aligned, so that two shards' locks never share a line.
#[repr(align(128))]
struct Padded(Mutex<Shard>);

/// The table.
pub struct InodeTable {
    shards: Box<[Padded]>,
    root: Arc<Inode>,
    root_dev: u64,
    conns: usize,
}

/// Table counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Inodes in the table, the root included.
    pub inodes: usize,
}

impl InodeTable {
    /// A table for `conns` connections whose root is the source directory `root_fd`.
    pub fn new(root_fd: OwnedFd, conns: usize) -> std::io::Result<InodeTable> {
        let st = crate::sys::stat_fd(root_fd.as_fd())?;
        let key = BackingKey {
            dev: st.st_dev,
            ino: st.st_ino,
        };
        let root = Arc::new(Inode::new(ROOT_ID, key, Kind::Dir, root_fd, conns));
        let shards: Box<[Padded]> = (0..SHARDS)
            .map(|_| Padded(Mutex::new(Shard::default())))
            .collect();
        let t = InodeTable {
            shards,
            root,
            root_dev: st.st_dev,
            conns,
        };
        t.shards[t.key_shard(&key)]
            .0
            .lock()
            .by_key
            .insert(key, t.root.clone());
        Ok(t)
    }

    /// Whether `key` gets its inode number as node id.
    fn natural(&self, key: &BackingKey) -> bool {
        key.dev == self.root_dev && key.ino != ROOT_ID && key.ino & SYNTHETIC == 0 && key.ino != 0
    }

    fn key_shard(&self, key: &BackingKey) -> usize {
        if self.natural(key) {
            mix(key.ino)
        } else {
            mix(key.ino ^ key.dev.rotate_left(29))
        }
    }

    fn id_shard(id: u64) -> usize {
        if id & SYNTHETIC != 0 {
            (id as usize) & (SHARDS - 1)
        } else {
            mix(id)
        }
    }

    /// Number of connections the table counts lookups for.
    pub fn connections(&self) -> usize {
        self.conns
    }

    /// The root inode.
    pub fn root(&self) -> &Arc<Inode> {
        &self.root
    }

    /// The inode with node id `id`, if the table has it.
    pub fn get(&self, id: u64) -> Option<Arc<Inode>> {
        if id == ROOT_ID {
            return Some(self.root.clone());
        }
        self.shards[Self::id_shard(id)].0.lock().by_id.get(&id).cloned()
    }

    /// Counts one lookup of the inode `fd` refers to (its `stat` is `st`) on connection
    /// `conn`: the existing inode if the table has one with that identity (and `fd` is
    /// dropped), else a new one that keeps `fd`.
    pub fn lookup(&self, conn: usize, fd: OwnedFd, st: &libc::stat64) -> Arc<Inode> {
        let key = BackingKey {
            dev: st.st_dev,
            ino: st.st_ino,
        };
        let idx = self.key_shard(&key);
        let mut s = self.shards[idx].0.lock();
        if let Some(i) = s.by_key.get(&key) {
            i.lookups[conn].fetch_add(1, Ordering::AcqRel);
            return i.clone();
        }
        let id = if self.natural(&key) {
            key.ino
        } else {
            s.next += 1;
            SYNTHETIC | (s.next << SHARD_BITS) | idx as u64
        };
        let inode = Arc::new(Inode::new(id, key, Kind::from_mode(st.st_mode), fd, self.conns));
        inode.lookups[conn].store(1, Ordering::Release);
        s.by_id.insert(id, inode.clone());
        s.by_key.insert(key, inode.clone());
        inode
    }

    /// `FORGET`: connection `conn`'s kernel drops `n` lookups of node `id`.
    pub fn forget(&self, conn: usize, id: u64, n: u64) {
        let Some(inode) = self.get(id) else { return };
        let c = &inode.lookups[conn];
        let mut cur = c.load(Ordering::Acquire);
        loop {
            let new = cur.saturating_sub(n);
            match c.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(v) => cur = v,
            }
        }
        self.try_evict(&inode);
    }

    /// Removes `inode` from the table if no connection looks it up and no handle is
    /// open on it (checked again under its shard lock). The root stays.
    pub fn try_evict(&self, inode: &Arc<Inode>) {
        if inode.id == ROOT_ID || !inode.idle() {
            return;
        }
        let mut s = self.shards[self.key_shard(&inode.key)].0.lock();
        if !inode.idle() {
            return;
        }
        if s.by_id.get(&inode.id).is_some_and(|i| Arc::ptr_eq(i, inode)) {
            s.by_id.remove(&inode.id);
            s.by_key.remove(&inode.key);
        }
    }

    /// A connection ended: its kernel's lookups are gone. Evicts what nobody holds.
    pub fn drop_connection(&self, conn: usize) {
        for shard in self.shards.iter() {
            let mut s = shard.0.lock();
            for i in s.by_id.values() {
                i.lookups[conn].store(0, Ordering::Release);
            }
            s.by_id.retain(|_, i| !i.idle());
            let Shard { by_id, by_key, .. } = &mut *s;
            by_key.retain(|_, i| i.id == ROOT_ID || by_id.contains_key(&i.id));
        }
        self.root.lookups[conn].store(0, Ordering::Release);
    }

    /// Counters.
    pub fn stats(&self) -> TableStats {
        let inodes = self.shards.iter().map(|s| s.0.lock().by_id.len()).sum::<usize>() + 1;
        TableStats { inodes }
    }
}
