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
//! * **By handle or by descriptor.** Where the source makes lasting file handles (see
//!   [`HandleMode`]), an inode keeps its handle, and its `O_PATH` descriptor lives in
//!   the descriptor cache (`fdcache.rs`), opened again by handle, relative to the one
//!   descriptor the table keeps of SOURCE's root, when the cache has let it go. An inode
//!   reached on another mount than the root's, and every inode where handles cannot be
//!   used, keeps a descriptor of its own instead.
//! * **Coalesced lookups (`I_NEW`).** A lookup learns the identity by opening and
//!   `stat`ing the name, then calls `iget5_locked`: the first task to miss inserts the
//!   inode `I_NEW`, fills it (its handle, its descriptor admitted to the cache; or its
//!   own descriptor) and unlocks it; every other task looking up the same inode
//!   meanwhile waits for that load and takes the same inode.
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
//!   object: the source file's descriptors, its own and its cached one (a file unlinked
//!   meanwhile keeps its space while it is open; by descriptor, each counts against
//!   [`crate::Server::fd_budget`], which counts cached inodes) and the lock context.
//!   What is left for the grace period is memory.
//! * **Small.** A walk caches every inode it meets, so what an inode keeps is kept to
//!   about 200 bytes: the handle inline up to 12 bytes, lookup counts inline for one or
//!   two connections, and what only an opened or locked inode needs (lock context, lock
//!   owners, passthrough backing files) made at its first open or lock.
//!
//! # Evictable fields
//!
//! The opened-or-locked part (with the lock context) is `Evictable`: set once, read
//! through `&Inode`, taken out through `&Inode` by `evict_inode` (the descriptor slot is
//! a lock of its own, emptied there). That is sound by this module's invariant:
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
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;
use vfscale_icache::{Iget, InodeCache, InodeRef, Settings, SuperBlock, SuperOperations};
use vfscale_locks::{FileLockContext, LockManager, OwnerId};

use crate::fdcache::{CachedFd, FdCache, FdKey, FdSlot};
use crate::handle_ino::HandleIno;
use crate::sys::FileHandle;

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
    fds: Arc<FdCache>,
    /// The table's count of descriptors inodes keep of their own.
    own_fds: Arc<AtomicU64>,
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
        if inode.data().fd.unpin().is_some() {
            self.own_fds.fetch_sub(1, Ordering::Relaxed);
        }
        // Its cached descriptor too: the node id may name another inode next.
        self.fds.remove(FdKey::Inode(inode.data().id));
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

/// A value set while its inode is `I_NEW` and read-only afterwards: what a lookup learns
/// while it loads the inode. No lock and no `Once`: `vfscale-icache`'s `I_NEW` hand-off
/// orders the set before every read (a lookup that finds the inode `I_NEW` waits for
/// `unlock_new_inode`, whose release its wake-up acquires).
struct LoadCell<T>(UnsafeCell<Option<T>>);

// SAFETY: the one write happens before every read (see the type's docs and `set`).
unsafe impl<T: Send + Sync> Sync for LoadCell<T> {}

impl<T> LoadCell<T> {
    /// The value, if the loader set one.
    fn get(&self) -> Option<&T> {
        // SAFETY: reads happen after the only write (the type's docs).
        unsafe { (*self.0.get()).as_ref() }
    }

    /// Sets the value.
    ///
    /// # Safety
    /// The inode is `I_NEW` and this is its loader: no other thread can reach it yet.
    unsafe fn set(&self, v: T) {
        // SAFETY: exclusive by the contract.
        unsafe { *self.0.get() = Some(v) };
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
    /// Open handles on it (see [`InodeTable::keep_if_open`]).
    opens: AtomicU32,
    /// A directory where files locked through the mount live: its entries are answered
    /// with no cache time (see `Server::grant_coherence`).
    lock_dir: AtomicBool,
    /// A file whose directory was marked `lock_dir` already.
    lock_dir_marked: AtomicBool,
    /// Its source descriptor: one it keeps for itself, closed at eviction (the root's,
    /// the mount descriptor handles are opened against; every inode's when inodes are
    /// kept by descriptor; one reached on another mount than the root's; one whose file
    /// was unlinked through the mount while open, which its handle no longer opens), or
    /// else its `O_PATH` descriptor in the descriptor cache.
    fd: FdSlot,
    /// The source file's handle when inodes are kept by handle.
    handle: LoadCell<FileHandle>,
    /// Lookups held by each connection's kernel.
    lookups: Lookups,
    /// The inode's own reference while any connection holds a lookup.
    pin: Mutex<Option<InodeRef<Ops>>>,
    /// What only an inode that is opened or locked needs, made then, dropped at
    /// eviction: most inodes of a walk are never opened.
    used: Evictable<Box<InodeUse>>,
}

/// The part of an inode made at its first open or lock.
struct InodeUse {
    /// The inode's lock context, made on first use.
    locks: OnceLock<Arc<FileLockContext>>,
    /// For each POSIX lock owner that set a lock through a handle of this inode, the
    /// number of open handles it used (see `locks.rs`, release).
    lock_owners: Mutex<HashMap<OwnerId, u32>>,
    /// Per connection, the kernel passthrough backing file registered for this inode
    /// while a handle uses it (the kernel wants one per inode).
    backing: Box<[Mutex<Weak<fuser::BackingId>>]>,
    /// The clients' locks held on the source (`mirror.rs`), made at the first lock.
    mirror: OnceLock<crate::mirror::Mirror>,
    /// Under `--cluster`, the source file as each connection's caches hold it, made at
    /// the first grant (`cluster.rs`).
    views: OnceLock<Box<crate::mirror::SourceViews>>,
}

/// Lookup counts, one per connection, inline for the usual one or two.
enum Lookups {
    Inline([AtomicU64; 2]),
    Heap(Box<[AtomicU64]>),
}

impl std::ops::Deref for Lookups {
    type Target = [AtomicU64];
    fn deref(&self) -> &[AtomicU64] {
        match self {
            Lookups::Inline(a) => a,
            Lookups::Heap(b) => b,
        }
    }
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
            opens: AtomicU32::new(0),
            lock_dir: AtomicBool::new(false),
            lock_dir_marked: AtomicBool::new(false),
            fd: FdSlot::default(),
            handle: LoadCell(UnsafeCell::new(None)),
            lookups: if conns <= 2 {
                Lookups::Inline([AtomicU64::new(0), AtomicU64::new(0)])
            } else {
                Lookups::Heap((0..conns).map(|_| AtomicU64::new(0)).collect())
            },
            pin: Mutex::new(None),
            used: Evictable::new(),
        }
    }

    /// The part made at first open or lock (made now if it was not).
    fn used(&self) -> &InodeUse {
        self.used.get_or_init(|| {
            Box::new(InodeUse {
                locks: OnceLock::new(),
                lock_owners: Mutex::new(HashMap::new()),
                backing: (0..self.lookups.len()).map(|_| Mutex::new(Weak::new())).collect(),
                mirror: OnceLock::new(),
                views: OnceLock::new(),
            })
        })
    }

    /// The passthrough backing file slot of connection `conn`.
    pub fn backing(&self, conn: usize) -> &Mutex<Weak<fuser::BackingId>> {
        &self.used().backing[conn]
    }

    /// For each POSIX lock owner that set a lock through a handle of this inode, the
    /// number of open handles it used (see `locks.rs`, release).
    pub fn lock_owners(&self) -> &Mutex<HashMap<OwnerId, u32>> {
        &self.used().lock_owners
    }

    /// One more open handle on the inode.
    pub fn open_started(&self) {
        self.opens.fetch_add(1, Ordering::AcqRel);
    }

    /// An open handle on the inode went.
    pub fn open_ended(&self) {
        self.opens.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether files locked through the mount live in this directory.
    pub fn is_lock_dir(&self) -> bool {
        self.lock_dir.load(Ordering::Relaxed)
    }

    /// Files locked through the mount live in this directory; true the first time.
    pub fn mark_lock_dir(&self) -> bool {
        !self.lock_dir.swap(true, Ordering::Relaxed)
    }

    /// Whether this file's directory is to be marked (true the first time only).
    pub fn first_lock_grant(&self) -> bool {
        !self.lock_dir_marked.swap(true, Ordering::Relaxed)
    }

    /// Whether a handle is open on the inode.
    pub fn is_open(&self) -> bool {
        self.opens.load(Ordering::Acquire) > 0
    }

    /// Whether the inode keeps a descriptor of its own (see the field).
    pub fn has_own_fd(&self) -> bool {
        self.fd.is_pinned()
    }

    /// The inode's lock context, made on first use and keyed by the source identity.
    pub fn lock_context(&self, mgr: &Arc<LockManager>) -> &Arc<FileLockContext> {
        self.used().locks.get_or_init(|| {
            let key = vfscale_locks::InodeKey {
                major: libc::major(self.key.dev),
                minor: libc::minor(self.key.dev),
                ino: self.key.ino,
            };
            FileLockContext::new(mgr, key)
        })
    }

    /// The inode's mirror on the source, made by `make` at first use.
    pub fn source_mirror(&self, make: impl FnOnce() -> crate::mirror::Mirror) -> &crate::mirror::Mirror {
        self.used().mirror.get_or_init(make)
    }

    /// The inode's mirror on the source, if one was made.
    pub fn source_mirror_if_any(&self) -> Option<&crate::mirror::Mirror> {
        self.used.get()?.mirror.get()
    }

    /// The source file as each connection's caches hold it (`--cluster`'s grants; a
    /// mirror keeps its own), made at first use.
    pub fn grant_views(&self) -> &crate::mirror::SourceViews {
        self.used().views.get_or_init(Default::default)
    }

    /// The connections' views of the source file, if a grant made them.
    pub fn grant_views_if_any(&self) -> Option<&crate::mirror::SourceViews> {
        self.used.get()?.views.get().map(|v| &**v)
    }

    /// The lock context if one was made (no lock was ever asked for otherwise).
    pub fn lock_context_if_any(&self) -> Option<&Arc<FileLockContext>> {
        self.used.get()?.locks.get()
    }

    /// Gives up what the inode holds besides memory: its descriptor, its lock context and
    /// its mirror's descriptions (the lock owners' counts and the backing-file `Weak`s
    /// are memory only).
    ///
    /// # Safety
    /// The inode is being evicted: no borrow of its evictable fields is alive or can
    /// start (the module docs, "Evictable fields").
    unsafe fn release(&self) {
        // SAFETY: by the contract.
        drop(unsafe { self.used.take() });
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

/// How the table keeps its inodes: `-o inode_handles=`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HandleMode {
    /// By file handle where the source has them, else by descriptor (said at mount).
    #[default]
    Prefer,
    /// By file handle, or refuse to serve.
    Mandatory,
    /// By descriptor: one `O_PATH` descriptor per cached inode.
    Never,
}

/// Where a looked-up inode's identity comes from.
pub enum Found<'a> {
    /// An `O_PATH` descriptor of it, opened by name (kept or cached if the inode is new).
    Path(OwnedFd),
    /// A file just opened (created) with a client's flags: the handle is taken from it,
    /// and it is never kept as the inode's descriptor.
    Opened(BorrowedFd<'a>),
    /// Its file handle, made on the root's mount (see [`InodeTable::handle_mount`]).
    Handle(FileHandle),
}

/// The table.
pub struct InodeTable {
    cache: InodeCache<Ops>,
    sb: SuperBlock<Ops>,
    root: Node,
    root_dev: u64,
    conns: usize,
    fds: Arc<FdCache>,
    /// The root's mount id when inodes are kept by handle.
    by_handle: Option<i32>,
    /// The root opened for reading: `open_by_handle_at` wants a descriptor of the
    /// filesystem that is not `O_PATH`.
    /// It is the root's own descriptor too.
    mount_fd: Option<Arc<CachedFd>>,
    /// Why inodes are kept by descriptor, when they are.
    why_not: Option<String>,
    /// Where the source's handles carry the inode number, when inodes are kept by handle.
    handle_ino: Option<HandleIno>,
    /// Descriptors inodes keep of their own, shared with [`Ops`].
    own_fds: Arc<AtomicU64>,
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
    /// A table for `conns` connections whose root is the source directory `root_fd`,
    /// keeping inodes as `mode` asks (by handle only if the source makes handles and the
    /// server may open them), their descriptors in `fds`.
    pub fn new(
        root_fd: OwnedFd,
        conns: usize,
        mode: HandleMode,
        fds: Arc<FdCache>,
    ) -> io::Result<InodeTable> {
        let st = crate::sys::stat_fd(root_fd.as_fd())?;
        let key = BackingKey {
            dev: st.st_dev,
            ino: st.st_ino,
        };
        let (by_handle, mount_fd, why_not, handle_ino) = match mode {
            HandleMode::Never => (None, None, Some("inode_handles=never".to_owned()), None),
            HandleMode::Prefer | HandleMode::Mandatory => match probe_handles(root_fd.as_fd(), key) {
                Ok((mount_id, mount_fd, root_handle)) => (
                    Some(mount_id),
                    Some(CachedFd::pinned(mount_fd)),
                    None,
                    Some(HandleIno::new(&root_handle, st.st_ino)),
                ),
                Err(why) if mode == HandleMode::Mandatory => {
                    return Err(io::Error::other(format!("inode_handles=mandatory: {why}")))
                }
                Err(why) => (None, None, Some(why), None),
            },
        };
        // 2^20 chains (8 MiB): about one inode a chain at a million cached. A lookup of a
        // new name walks its chain three times, each a cache miss per inode passed.
        let cache = InodeCache::new(Settings {
            hash_bits: 20,
            ..Settings::default()
        });
        let own_fds = Arc::new(AtomicU64::new(0));
        let sb = cache.mount(Ops {
            conns,
            fds: fds.clone(),
            own_fds: own_fds.clone(),
        });
        let root = match sb.iget5_locked(
            ROOT_ID,
            move |i| i.data().key == key,
            move || (ROOT_ID, Inode::new(ROOT_ID, key, Kind::Dir, conns)),
        ) {
            Some(Iget::New(n)) => {
                let own = match &mount_fd {
                    Some(m) => m.clone(),
                    None => CachedFd::pinned(root_fd),
                };
                let _ = n.data().fd.pin(own);
                own_fds.fetch_add(1, Ordering::Relaxed);
                Node(n.unlock_new_inode())
            }
            _ => return Err(io::Error::other("the root inode is already cached")),
        };
        Ok(InodeTable {
            cache,
            sb,
            root,
            root_dev: st.st_dev,
            conns,
            fds,
            by_handle,
            mount_fd,
            why_not,
            handle_ino,
            own_fds,
        })
    }

    /// Whether inodes are kept by file handle (else each holds a descriptor).
    pub fn by_handle(&self) -> bool {
        self.by_handle.is_some()
    }

    /// The mount id a handle must come from to be kept ([`Found::Handle`]), when inodes
    /// are kept by handle.
    pub fn handle_mount(&self) -> Option<i32> {
        self.by_handle
    }

    /// Where the source's handles carry the inode number, when inodes are kept by handle.
    pub fn handle_ino(&self) -> Option<&HandleIno> {
        self.handle_ino.as_ref()
    }

    /// Why inodes are kept by descriptor, when they are.
    pub fn why_not_by_handle(&self) -> Option<&str> {
        self.why_not.as_deref()
    }

    /// The descriptor cache.
    pub fn fd_cache(&self) -> &FdCache {
        &self.fds
    }

    /// Number of connections the table counts lookups for.
    pub fn connections(&self) -> usize {
        self.conns
    }

    /// The root inode.
    pub fn root(&self) -> &Node {
        &self.root
    }

    /// An `O_PATH` descriptor of `inode`: its own, or the cached one, or one opened by
    /// its handle. `ESTALE` when the source file is gone.
    pub fn fd(&self, inode: &Inode) -> io::Result<Arc<CachedFd>> {
        self.fds.get_or_open(FdKey::Inode(inode.id), &inode.fd, || {
            self.open_by_handle(inode, libc::O_PATH)
        })
    }

    /// Opens `inode`'s source file anew with `flags` (an open's, never creating or
    /// truncating): through its own descriptor, else by its handle.
    pub fn open(&self, inode: &Inode, flags: i32) -> io::Result<OwnedFd> {
        match inode.fd.pinned() {
            Some(fd) => crate::sys::reopen(fd.as_fd(), flags),
            None => self.open_by_handle(inode, flags),
        }
    }

    /// `open_by_handle_at`, checked to have opened the inode's own source identity: a
    /// handle names one inode for as long as it lives, and the check makes sure of it
    /// (another file is `ESTALE`, never served).
    fn open_by_handle(&self, inode: &Inode, flags: i32) -> io::Result<OwnedFd> {
        let stale = || io::Error::from_raw_os_error(libc::ESTALE);
        let h = inode.handle.get().ok_or_else(stale)?;
        let fd = crate::sys::open_by_handle(self.mount_fd.as_ref().ok_or_else(stale)?.as_fd(), h, flags)?;
        let st = crate::sys::stat_fd(fd.as_fd())?;
        if (st.st_dev, st.st_ino) != (inode.key.dev, inode.key.ino) {
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
        Ok(fd)
    }

    /// The source file of `inode` lost its last name through the mount: if it is open,
    /// it keeps `fd` as a descriptor of its own (its handle will not open it any more,
    /// and an open file must keep working).
    pub fn keep_if_open(&self, inode: &Inode, fd: OwnedFd) {
        if inode.opens.load(Ordering::Acquire) > 0 {
            self.pin(inode, fd);
        }
    }

    /// As [`InodeTable::keep_if_open`], for an inode a client's kernel still holds, open
    /// or not: a client may open it again (an `O_PATH` descriptor through
    /// `/proc/self/fd`), and its handle no longer opens it. The kernel forgets an
    /// unlinked inode nobody uses at once, so this costs a descriptor only while one does.
    pub fn keep_if_held(&self, inode: &Inode, fd: OwnedFd) {
        if inode.opens.load(Ordering::Acquire) > 0 || inode.total_lookups() > 0 {
            self.pin(inode, fd);
        }
    }

    /// `inode` keeps `fd` as its own descriptor (unless it has one), counted in
    /// [`InodeTable::own_fds`] until its eviction.
    fn pin(&self, inode: &Inode, fd: OwnedFd) {
        if inode.fd.pin(CachedFd::pinned(fd)) {
            self.own_fds.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Descriptors inodes keep of their own (see [`Inode::has_own_fd`]).
    pub fn own_fds(&self) -> u64 {
        self.own_fds.load(Ordering::Relaxed)
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

    /// The cached inode of source identity `st`, without counting a lookup.
    pub fn peek(&self, st: &libc::stat64) -> Option<Node> {
        let key = BackingKey {
            dev: st.st_dev,
            ino: st.st_ino,
        };
        let id = self.id_for(&key);
        if id == ROOT_ID {
            return Some(self.root.clone());
        }
        self.sb.ilookup5(id, move |i| i.data().key == key).map(Node)
    }

    /// Counts one lookup, on connection `conn`, of the inode `found` refers to (its
    /// `stat` is `st`): the cached inode if there is one, else a new one loaded from
    /// `found`. Concurrent lookups of one inode wait for its load (`I_NEW`).
    pub fn lookup(&self, conn: usize, found: Found<'_>, st: &libc::stat64) -> io::Result<Node> {
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
            Some(Iget::Cached(r)) => {
                let node = Node(r);
                // A descriptor opened by name is as good as one opened by handle.
                if let Found::Path(fd) = found {
                    if node.handle.get().is_some() && node.fd.get().is_none() {
                        self.fds.admit(FdKey::Inode(id), &node.fd, fd);
                    }
                }
                node
            }
            Some(Iget::New(n)) => {
                if id & SYNTHETIC != 0
                    && self
                        .sb
                        .ilookup5(id, move |i| i.data().id == id && i.data().key != key)
                        .is_some()
                {
                    n.iget_failed();
                    return Err(io::Error::other("node id collision"));
                }
                if let Err(e) = self.load(n.data(), found) {
                    n.iget_failed();
                    return Err(e);
                }
                Node(n.unlock_new_inode())
            }
            None => return Err(io::Error::from_raw_os_error(libc::EAGAIN)),
        };
        Self::count_lookup(conn, &node);
        Ok(node)
    }

    /// Fills a new (`I_NEW`) inode: its handle, with its descriptor admitted to the
    /// cache, or a descriptor of its own where it has no handle the root's mount opens.
    fn load(&self, inode: &Inode, found: Found<'_>) -> io::Result<()> {
        let file = match &found {
            Found::Path(fd) => fd.as_fd(),
            Found::Opened(fd) => *fd,
            Found::Handle(h) => {
                // SAFETY: `load` runs on an I_NEW inode, before its unlock.
                unsafe { inode.handle.set(h.clone()) };
                return Ok(());
            }
        };
        if let Some(root_mount) = self.by_handle {
            if let Ok((h, mount)) = crate::sys::handle_of(file) {
                if mount == root_mount {
                    // SAFETY: `load` runs on an I_NEW inode, before its unlock.
                    unsafe { inode.handle.set(h) };
                    if let Found::Path(fd) = found {
                        self.fds.admit(FdKey::Inode(inode.id), &inode.fd, fd);
                    }
                    return Ok(());
                }
            }
        }
        let own = match found {
            Found::Path(fd) => fd,
            Found::Opened(fd) => crate::sys::reopen(fd, libc::O_PATH)?,
            Found::Handle(_) => unreachable!("a handle is kept above"),
        };
        self.pin(inode, own);
        Ok(())
    }

    /// Counts one lookup, on connection `conn`, of the inode with identity `st` if the
    /// cache already has it, without a descriptor (a lookup's first try, and the
    /// budget-short path of `READDIRPLUS`, see `fs.rs`). `None` when it is not cached.
    pub fn lookup_cached(&self, conn: usize, st: &libc::stat64) -> Option<Node> {
        let node = self.peek(st)?;
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

/// Whether inodes of the source can be kept by handle: the root makes a handle, and
/// opening it gives the root back. The root's mount id and the descriptor to open
/// handles against, or why not.
fn probe_handles(root: BorrowedFd<'_>, key: BackingKey) -> Result<(i32, OwnedFd, FileHandle), String> {
    // FUSE makes handles, but (without the server's export support, which cannot be
    // asked) they open only inodes its kernel still caches: a cached descriptor let go
    // would turn a live file stale.
    if nix::sys::statfs::fstatfs(root)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::FUSE_SUPER_MAGIC)
    {
        return Err("a FUSE source's handles open only the inodes its kernel caches".to_owned());
    }
    let (h, mount) = crate::sys::handle_of(root).map_err(|e| match e.raw_os_error() {
        Some(libc::EOPNOTSUPP) => "the source filesystem makes no file handles".to_owned(),
        _ => format!("name_to_handle_at: {e}"),
    })?;
    let mount_fd = crate::sys::reopen(root, libc::O_RDONLY | libc::O_DIRECTORY)
        .map_err(|e| format!("opening the source: {e}"))?;
    let fd = crate::sys::open_by_handle(mount_fd.as_fd(), &h, libc::O_PATH).map_err(|e| {
        match e.raw_os_error() {
            Some(libc::EPERM) => "open_by_handle_at needs CAP_DAC_READ_SEARCH (run as root)".to_owned(),
            Some(libc::EOPNOTSUPP) => "the source filesystem does not open file handles".to_owned(),
            _ => format!("open_by_handle_at: {e}"),
        }
    })?;
    let st = crate::sys::stat_fd(fd.as_fd()).map_err(|e| format!("stat: {e}"))?;
    if (st.st_dev, st.st_ino) != (key.dev, key.ino) {
        return Err("the root's handle opens another inode".to_owned());
    }
    Ok((mount, mount_fd, h))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    fn table(dir: &std::path::Path, conns: usize, mode: HandleMode) -> InodeTable {
        let root = crate::sys::open_root(dir).unwrap();
        InodeTable::new(root, conns, mode, Arc::new(FdCache::new(64))).unwrap()
    }

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
        let table = Arc::new(table(&d, 2, HandleMode::Never));
        let ids: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|t| {
                    let (table, d) = (&table, &d);
                    s.spawn(move || {
                        let (fd, st) = open(d, "f");
                        table.lookup(t % 2, Found::Path(fd), &st).unwrap().id
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
        drop(table.lookup(1, Found::Path(fd), &st).unwrap());
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
        let table = table(&d, 1, HandleMode::Never);
        let (fd, st) = open(&d, "f");
        let node = table.lookup(0, Found::Path(fd), &st).unwrap();
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
