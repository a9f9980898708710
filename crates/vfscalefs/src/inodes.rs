//! The inode table: FUSE node ids ↔ source inodes, on `vfscale-icache`.
//!
//! This module is the one boundary between the server and its inode cache. Each source
//! inode the kernel knows is one `vfscale-icache` inode of one superblock, whose data
//! ([`Inode`]) is what the server keeps per inode:
//!
//! * **Identity.** The cache is hashed by node id and tested on the source identity
//!   `(st_dev, st_ino)`, shared by every connection (mountpoint): whichever mountpoint a
//!   file is reached through, it is one inode with one lock context and the same node id.
//!   The node id is the source inode number where it can be (so `st_ino` through the
//!   mount is the source's and matches readdir's `d_ino`); a source inode on another
//!   device than the source root, or numbered 1 or with the top bit set, gets a made-up
//!   id (top bit set, a hash of its identity; two identities hashing alike would be
//!   refused with `EIO`, a chance of about one in 2^62 per pair).
//! * **Coalesced lookups (`I_NEW`).** A lookup learns the identity by opening and
//!   `stat`ing the name, then calls `iget5_locked`: the first task to miss inserts the
//!   inode `I_NEW`, fills it (its `O_PATH` descriptor) and unlocks it; every other task
//!   looking up the same inode meanwhile waits for that load and takes the same inode,
//!   dropping its own descriptor.
//! * **Lookup counts and forget.** Every reply that hands the kernel a node id (lookup,
//!   create, mkdir, mknod, symlink, link, and each entry of `READDIRPLUS` but `.` and
//!   `..`) counts one lookup on that connection; `forget`
//!   takes them back. While any connection holds a lookup the inode is *pinned*: it keeps
//!   one reference of its own. Counts are per connection, so one mountpoint going away
//!   drops exactly its own.
//! * **Eviction when the kernel forgets.** `drop_inode` always says "evict": an inode
//!   leaves the cache at its last `iput`, that is when no connection holds a lookup (the
//!   pin is gone) and nothing else holds a reference. Open handles hold one, so an inode
//!   (and its lock context, with the locks taken through the handle) outlives a `FORGET`
//!   that arrives before the handle's `RELEASE` (`RELEASE` is sent in the background).
//! * **Resources go at eviction, memory later.** `vfscale-icache` runs
//!   `evict_inode` when the inode leaves the cache (no reference left, and none can be
//!   taken: lookups of its key wait for the eviction) but frees its memory, and so drops
//!   its [`Inode`], a grace period later, in per-thread batches of 32 (lock-free lookups
//!   may still be comparing its `id` and `key`): in an idle server, never. As Linux
//!   filesystems release their private resources in `->evict_inode` and leave only the
//!   memory to RCU, [`Ops::evict_inode`] takes out what holds an OS resource or another
//!   object: the source file's `O_PATH` descriptor (a file unlinked meanwhile keeps its
//!   space while it is open, and every descriptor counts against
//!   [`crate::Server::fd_budget`], which counts cached inodes) and the lock context.
//!   What is left for the grace period is memory.
//!
//! # Evictable fields
//!
//! The descriptor and the lock context are `Evictable`: set once, read through `&Inode`,
//! taken out through `&Inode` by `evict_inode`. That is sound by this module's invariant:
//! **every `&Inode` outside this module is borrowed from a counted reference** (a
//! [`Node`], or the cache's `InodeRef`, whose `Deref` and `data()` borrow from it); the
//! uncounted ones exist only here, in the lock-free lookups' key tests (which read `id`
//! and `key`, never an evictable field) and in the [`Ops`] hooks. `evict_inode` runs with
//! the inode's count at 0, ordered after every reference's end (the last `iput` evicts
//! after its Acquire decrement under `i_lock`, every earlier `iput` being a Release
//! decrement; an umount's `evict_inodes` reads the count under `i_lock`), and no
//! reference can be taken after it (lookups of its key wait for the eviction,
//! `for_each_inode` passes over it): every borrow of an evictable field has ended before
//! it, and none can start after it.
//!
//! # Locks
//!
//! The cache's own (per-chain hash locks, per-CPU lists; lookups take none). Per inode,
//! `pin` serializes the lookup-count transitions that pin and unpin it; an unpinned
//! reference is dropped after `pin` is released.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;
use vfscale_icache::{Iget, InodeCache, InodeRef, Settings, SuperBlock, SuperOperations};
use vfscale_locks::{FileLockContext, LockManager, OwnerId};

/// The FUSE node id of the root (`FUSE_ROOT_ID`).
pub const ROOT_ID: u64 = 1;

/// Made-up node ids have this bit (see the module docs).
const SYNTHETIC: u64 = 1 << 63;

/// A source inode's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BackingKey {
    /// `st_dev` of the source file.
    pub dev: u64,
    /// `st_ino` of the source file.
    pub ino: u64,
}

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

/// The superblock operations of the source: every last `iput` evicts.
pub struct Ops {
    conns: usize,
}

impl SuperOperations for Ops {
    type Data = Inode;

    fn alloc_inode(&self, ino: u64) -> Inode {
        // Only iget5_locked (with its own `set`) makes inodes here.
        Inode::new(ino, BackingKey { dev: 0, ino }, Kind::Special, self.conns)
    }

    fn drop_inode(&self, _inode: &vfscale_icache::Inode<Self>) -> bool {
        // The kernel has forgotten it and no handle is open: evict now, keep no LRU.
        true
    }

    /// Releases the inode's descriptor, lock context and the rest now (see the module
    /// docs): its memory goes a grace period later.
    fn evict_inode(&self, inode: &vfscale_icache::Inode<Self>) {
        // SAFETY: the inode is I_FREEING: its count is 0 (ordered after every
        // reference's end) and no reference can be taken any more, so by the module's
        // invariant ("Evictable fields") no borrow of its evictable fields is alive or
        // can start.
        unsafe { inode.data().release() };
    }
}

/// A value an inode owns until its eviction (see the module docs, "Evictable fields"):
/// set once, read through `&self`, taken out through `&self` by [`Ops::evict_inode`].
struct Evictable<T>(UnsafeCell<OnceLock<T>>);

// SAFETY: every access but `take` is a shared access to the `OnceLock`, which is `Sync`
// for `T: Send + Sync`; `take`, the one exclusive access, overlaps no other access by its
// contract.
unsafe impl<T: Send + Sync> Sync for Evictable<T> {}

impl<T> Evictable<T> {
    fn new() -> Self {
        Evictable(UnsafeCell::new(OnceLock::new()))
    }

    fn cell(&self) -> &OnceLock<T> {
        // SAFETY: a shared access; `take` (the only `&mut`) overlaps none (its contract).
        unsafe { &*self.0.get() }
    }

    /// The value, if set and not taken.
    fn get(&self) -> Option<&T> {
        self.cell().get()
    }

    /// Sets the value if it is not set (else gives `v` back).
    fn set(&self, v: T) -> Result<(), T> {
        self.cell().set(v)
    }

    /// The value, made by `f` if not set.
    fn get_or_init(&self, f: impl FnOnce() -> T) -> &T {
        self.cell().get_or_init(f)
    }

    /// Takes the value out.
    ///
    /// # Safety
    /// No other access to the cell may overlap this call, and no reference that
    /// [`Evictable::get`] or [`Evictable::get_or_init`] returned may be alive: for an
    /// inode's field, it is being evicted (the module docs, "Evictable fields").
    unsafe fn take(&self) -> Option<T> {
        // SAFETY: exclusive by the contract.
        unsafe { (*self.0.get()).take() }
    }
}

/// What the server keeps per source inode (the cache inode's data).
pub struct Inode {
    /// Its FUSE node id (the same on every connection), also its `st_ino` through the
    /// mount.
    pub id: u64,
    /// Its source identity.
    pub key: BackingKey,
    /// Its kind.
    pub kind: Kind,
    /// An `O_PATH` descriptor of the source inode, set while the inode is `I_NEW`, closed
    /// at eviction.
    fd: Evictable<OwnedFd>,
    /// Lookups held by each connection's kernel.
    lookups: Box<[AtomicU64]>,
    /// The inode's own reference while any connection holds a lookup.
    pin: Mutex<Option<InodeRef<Ops>>>,
    /// The inode's lock context, made on first use, dropped at eviction.
    locks: Evictable<Arc<FileLockContext>>,
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
    fn new(id: u64, key: BackingKey, kind: Kind, conns: usize) -> Inode {
        Inode {
            id,
            key,
            kind,
            fd: Evictable::new(),
            lookups: (0..conns).map(|_| AtomicU64::new(0)).collect(),
            pin: Mutex::new(None),
            locks: Evictable::new(),
            backing: (0..conns).map(|_| Mutex::new(Weak::new())).collect(),
            lock_owners: Mutex::new(HashMap::new()),
        }
    }

    /// The `O_PATH` descriptor of the source inode.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd
            .get()
            .expect("an inode is loaded before it is handed out")
            .as_fd()
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

    /// Gives up what the inode holds besides memory: its descriptor and its lock context
    /// (the lock owners' counts and the backing-file `Weak`s are memory only).
    ///
    /// # Safety
    /// The inode is being evicted: no borrow of its evictable fields is alive or can
    /// start (the module docs, "Evictable fields").
    unsafe fn release(&self) {
        // SAFETY: by the contract.
        drop(unsafe { (self.fd.take(), self.locks.take()) });
    }

    fn total_lookups(&self) -> u64 {
        self.lookups.iter().map(|c| c.load(Ordering::Acquire)).sum()
    }

    /// Lookups held by connection `conn` (tests and statistics).
    pub fn lookups(&self, conn: usize) -> u64 {
        self.lookups[conn].load(Ordering::Acquire)
    }
}

/// A reference to an inode (`ihold` on clone, `iput` on drop).
#[derive(Clone)]
pub struct Node(InodeRef<Ops>);

impl std::ops::Deref for Node {
    type Target = Inode;
    fn deref(&self) -> &Inode {
        self.0.data()
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

/// The table.
pub struct InodeTable {
    cache: InodeCache<Ops>,
    sb: SuperBlock<Ops>,
    root: Node,
    root_dev: u64,
    conns: usize,
}

/// Table counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Inodes on the superblock's lists (loaded, not evicted), the root included.
    pub inodes: u64,
    /// Lookups the kernels hold, summed over inodes and connections (0 once every
    /// connection has forgotten everything but the root, whose lookups are implicit).
    pub lookups: u64,
}

fn mix(key: &BackingKey) -> u64 {
    // splitmix64 of the identity, for made-up ids.
    let mut z = key.ino ^ key.dev.rotate_left(32) ^ 0x9E37_79B9_7F4A_7C15;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl InodeTable {
    /// A table for `conns` connections whose root is the source directory `root_fd`.
    pub fn new(root_fd: OwnedFd, conns: usize) -> std::io::Result<InodeTable> {
        let st = crate::sys::stat_fd(root_fd.as_fd())?;
        let key = BackingKey {
            dev: st.st_dev,
            ino: st.st_ino,
        };
        let cache = InodeCache::new(Settings::default());
        let sb = cache.mount(Ops { conns });
        let root = match sb.iget5_locked(
            ROOT_ID,
            move |i| i.data().key == key,
            move || (ROOT_ID, Inode::new(ROOT_ID, key, Kind::Dir, conns)),
        ) {
            Some(Iget::New(n)) => {
                let _ = n.data().fd.set(root_fd);
                Node(n.unlock_new_inode())
            }
            _ => return Err(std::io::Error::other("the root inode is already cached")),
        };
        Ok(InodeTable {
            cache,
            sb,
            root,
            root_dev: st.st_dev,
            conns,
        })
    }

    /// Number of connections the table counts lookups for.
    pub fn connections(&self) -> usize {
        self.conns
    }

    /// The root inode.
    pub fn root(&self) -> &Node {
        &self.root
    }

    /// The node id of a source identity.
    fn id_for(&self, key: &BackingKey) -> u64 {
        if *key == self.root.key {
            ROOT_ID
        } else if key.dev == self.root_dev && key.ino > ROOT_ID && key.ino & SYNTHETIC == 0 {
            key.ino
        } else {
            SYNTHETIC | (mix(key) >> 1)
        }
    }

    /// The inode with node id `id`, if the cache has it (lock-free lookup).
    pub fn get(&self, id: u64) -> Option<Node> {
        if id == ROOT_ID {
            return Some(self.root.clone());
        }
        self.sb.ilookup5(id, move |i| i.data().id == id).map(Node)
    }

    /// Counts one lookup, on connection `conn`, of the inode `fd` refers to (its `stat`
    /// is `st`): the cached inode if there is one (and `fd` is dropped), else a new one
    /// loaded with `fd`. Concurrent lookups of one inode wait for its load (`I_NEW`).
    pub fn lookup(&self, conn: usize, fd: OwnedFd, st: &libc::stat64) -> std::io::Result<Node> {
        let key = BackingKey {
            dev: st.st_dev,
            ino: st.st_ino,
        };
        let id = self.id_for(&key);
        let kind = Kind::from_mode(st.st_mode);
        let conns = self.conns;
        let got = self.sb.iget5_locked(
            id,
            move |i| i.data().key == key,
            move || (id, Inode::new(id, key, kind, conns)),
        );
        let node = match got {
            Some(Iget::Cached(r)) => Node(r),
            Some(Iget::New(n)) => {
                if id & SYNTHETIC != 0
                    && self
                        .sb
                        .ilookup5(id, move |i| i.data().id == id && i.data().key != key)
                        .is_some()
                {
                    n.iget_failed();
                    return Err(std::io::Error::other("node id collision"));
                }
                let _ = n.data().fd.set(fd);
                Node(n.unlock_new_inode())
            }
            None => return Err(std::io::Error::from_raw_os_error(libc::EAGAIN)),
        };
        Self::count_lookup(conn, &node);
        Ok(node)
    }

    /// Counts one lookup, on connection `conn`, of the inode with identity `st` if the
    /// cache already has it, without a descriptor: the budget-short path of
    /// `READDIRPLUS` (see `fs.rs`). `None` when the inode is not cached.
    pub fn lookup_cached(&self, conn: usize, st: &libc::stat64) -> Option<Node> {
        let key = BackingKey {
            dev: st.st_dev,
            ino: st.st_ino,
        };
        let id = self.id_for(&key);
        let node = if id == ROOT_ID {
            self.root.clone()
        } else {
            Node(self.sb.ilookup5(id, move |i| i.data().key == key)?)
        };
        Self::count_lookup(conn, &node);
        Some(node)
    }

    /// One more lookup of `node` held by connection `conn`'s kernel; the first one of
    /// all connections pins the inode.
    fn count_lookup(conn: usize, node: &Node) {
        let mut pin = node.pin.lock();
        node.lookups[conn].fetch_add(1, Ordering::AcqRel);
        if pin.is_none() && node.id != ROOT_ID {
            *pin = Some(node.0.clone());
        }
    }

    /// `FORGET`: connection `conn`'s kernel drops `n` lookups of node `id`.
    pub fn forget(&self, conn: usize, id: u64, n: u64) {
        let Some(node) = self.get(id) else { return };
        let unpinned = {
            let mut pin = node.pin.lock();
            let c = &node.lookups[conn];
            let cur = c.load(Ordering::Acquire);
            c.store(cur.saturating_sub(n), Ordering::Release);
            if node.total_lookups() == 0 {
                pin.take()
            } else {
                None
            }
        };
        drop(unpinned); // iput: evicts if nothing else holds the inode
    }

    /// A connection ended: its kernel's lookups are gone.
    pub fn drop_connection(&self, conn: usize) {
        let mut all = Vec::new();
        self.sb.for_each_inode(|r| all.push(r.clone()));
        let mut unpinned = Vec::new();
        for r in &all {
            let d = r.data();
            let mut pin = d.pin.lock();
            d.lookups[conn].store(0, Ordering::Release);
            if d.total_lookups() == 0 {
                unpinned.extend(pin.take());
            }
        }
        drop(unpinned);
        drop(all);
    }

    /// Inodes in the cache, the root included (cheap: per-CPU counters).
    pub fn nr_inodes(&self) -> u64 {
        self.cache.stats().nr_inodes
    }

    /// Counters (walks the table for the lookup sum).
    pub fn stats(&self) -> TableStats {
        let mut lookups = 0;
        self.sb.for_each_inode(|r| lookups += r.data().total_lookups());
        TableStats {
            inodes: self.sb.nr_inodes() as u64,
            lookups,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    fn open(dir: &std::path::Path, name: &str) -> (OwnedFd, libc::stat64) {
        let root = crate::sys::open_root(dir).unwrap();
        let fd = crate::sys::openat_beneath(
            root.as_fd(),
            &CString::new(name).unwrap(),
            libc::O_PATH | libc::O_NOFOLLOW,
            0,
        )
        .unwrap();
        let st = crate::sys::stat_fd(fd.as_fd()).unwrap();
        (fd, st)
    }

    /// Concurrent lookups of one file end in one inode, counted per connection; the
    /// inode is evicted when every connection has forgotten it and no reference (an open
    /// handle's) is left, not before.
    #[test]
    fn lookups_coalesce_and_forget_evicts() {
        let d = std::env::temp_dir().join(format!("vfscalefs-inodes-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("f"), b"x").unwrap();
        let table = Arc::new(InodeTable::new(crate::sys::open_root(&d).unwrap(), 2).unwrap());
        let ids: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|t| {
                    let (table, d) = (&table, &d);
                    s.spawn(move || {
                        let (fd, st) = open(d, "f");
                        table.lookup(t % 2, fd, &st).unwrap().id
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let (_, st) = open(&d, "f");
        assert!(
            ids.iter().all(|&i| i == st.st_ino),
            "one inode, its node id the source ino: {ids:?}"
        );
        assert_eq!(table.stats().inodes, 2, "the root and the file");
        let node = table.get(st.st_ino).unwrap();
        assert_eq!((node.lookups(0), node.lookups(1)), (4, 4));
        table.forget(0, st.st_ino, 4);
        assert!(table.get(st.st_ino).is_some(), "connection 1 still holds it");
        // An open handle's reference keeps it past the last forget.
        table.forget(1, st.st_ino, 4);
        assert!(table.get(st.st_ino).is_some(), "a reference is still held");
        drop(node);
        assert!(
            table.get(st.st_ino).is_none(),
            "forgotten by all and unreferenced: evicted"
        );
        assert_eq!(table.stats().inodes, 1);
        // Looked up again: a fresh inode, and a connection's end drops its lookups.
        let (fd, st) = open(&d, "f");
        drop(table.lookup(1, fd, &st).unwrap());
        assert!(table.get(st.st_ino).is_some());
        table.drop_connection(1);
        assert!(table.get(st.st_ino).is_none());
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Eviction gives the inode's descriptor and lock context up at once, though its
    /// memory (the cache's inode with its `Inode`) goes a grace period later, in a batch
    /// that this thread never hands over here.
    #[test]
    fn eviction_releases_the_descriptor_and_the_lock_context() {
        let d = std::env::temp_dir().join(format!("vfscalefs-evict-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("f"), vec![1u8; 1 << 16]).unwrap();
        let deleted = format!("{} (deleted)", d.join("f").display());
        let held = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|t| t.to_string_lossy() == deleted)
                .count()
        };
        let table = InodeTable::new(crate::sys::open_root(&d).unwrap(), 1).unwrap();
        let (fd, st) = open(&d, "f");
        let node = table.lookup(0, fd, &st).unwrap();
        let mgr = LockManager::new();
        let ctx = node.lock_context(&mgr).clone();
        assert_eq!(Arc::strong_count(&ctx), 2);
        std::fs::remove_file(d.join("f")).unwrap();
        assert_eq!(held(), 1, "the inode's descriptor of the unlinked file");
        drop(node);
        table.forget(0, st.st_ino, 1);
        assert!(table.get(st.st_ino).is_none(), "evicted");
        assert_eq!(held(), 0, "the evicted inode closed its descriptor");
        assert_eq!(
            Arc::strong_count(&ctx),
            1,
            "the evicted inode dropped its lock context"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
