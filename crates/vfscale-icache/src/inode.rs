//! `struct inode`, its state bits, and the reference types (`InodeRef` = one `i_count`,
//! `NewInode` = the loader's `I_NEW` duty).

use std::fmt;
use std::ops::Deref;
use std::ptr::NonNull;

use crate::superblock::SbInner;
use crate::sync::{AtomicPtr, AtomicU32, ILock, ILockGuard, Ordering};
use crate::SuperOperations;

/// `I_NEW`: being loaded; lookups wait until the loader ends the load.
pub(crate) const I_NEW: u32 = 1 << 0;
/// `I_CREATING`: inserted by `insert_inode_locked`; lookups give up on it.
pub(crate) const I_CREATING: u32 = 1 << 1;
/// `I_REFERENCED`: used since it went on the LRU (second chance).
pub(crate) const I_REFERENCED: u32 = 1 << 2;
/// `I_FREEING`: being evicted.
pub(crate) const I_FREEING: u32 = 1 << 3;
/// `I_WILL_FREE`: about to be evicted, written back first.
pub(crate) const I_WILL_FREE: u32 = 1 << 4;
/// `I_CLEAR`: `->evict_inode` is done (`clear_inode`).
pub(crate) const I_CLEAR: u32 = 1 << 5;
/// `I_DONTCACHE`: evict at the last `iput`.
pub(crate) const I_DONTCACHE: u32 = 1 << 6;
/// The bits Linux keeps in `i_state`.
pub(crate) const LINUX_STATE: u32 = (1 << 7) - 1;
/// Bookkeeping, not Linux bits: on its hash chain (`!inode_unhashed`).
pub(crate) const HASHED: u32 = 1 << 8;
/// On an LRU list (`!list_empty(&inode->i_lru)`).
pub(crate) const ON_LRU: u32 = 1 << 9;
/// Someone registered in the wait table for this inode.
pub(crate) const WAITERS: u32 = 1 << 10;
/// Was hashed once (an inode is never hashed twice: a lock-free walker may be on it).
pub(crate) const WAS_HASHED: u32 = 1 << 11;
/// `make_bad_inode` (`iget_failed`).
pub(crate) const BAD: u32 = 1 << 12;
/// Evicted (`I_FREEING | I_CLEAR`, unhashed, `->destroy_inode` done) and parked in an
/// outbox: its removal from another CPU's superblock list or LRU shard waits for a batch
/// (crate docs, "Batched removal"). Already counted out of `nr_unused`, even while it is
/// still linked on an LRU (`ON_LRU`): whoever unlinks it then leaves the counter alone.
pub(crate) const PARKED: u32 = 1 << 13;

/// `i_state` flags as Linux names them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct InodeFlags(u32);

impl InodeFlags {
    /// `I_NEW`.
    pub const NEW: InodeFlags = InodeFlags(I_NEW);
    /// `I_CREATING`.
    pub const CREATING: InodeFlags = InodeFlags(I_CREATING);
    /// `I_REFERENCED`.
    pub const REFERENCED: InodeFlags = InodeFlags(I_REFERENCED);
    /// `I_FREEING`.
    pub const FREEING: InodeFlags = InodeFlags(I_FREEING);
    /// `I_WILL_FREE`.
    pub const WILL_FREE: InodeFlags = InodeFlags(I_WILL_FREE);
    /// `I_CLEAR`.
    pub const CLEAR: InodeFlags = InodeFlags(I_CLEAR);
    /// `I_DONTCACHE`.
    pub const DONTCACHE: InodeFlags = InodeFlags(I_DONTCACHE);

    /// Whether every flag of `other` is set.
    pub fn contains(self, other: InodeFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether no flag is set.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The Linux names of the flags set, sorted (`["I_FREEING", "I_NEW"]`).
    pub fn names(self) -> Vec<&'static str> {
        let mut v: Vec<&'static str> = [
            (I_NEW, "I_NEW"),
            (I_CREATING, "I_CREATING"),
            (I_REFERENCED, "I_REFERENCED"),
            (I_FREEING, "I_FREEING"),
            (I_WILL_FREE, "I_WILL_FREE"),
            (I_CLEAR, "I_CLEAR"),
            (I_DONTCACHE, "I_DONTCACHE"),
        ]
        .iter()
        .filter(|(b, _)| self.0 & b != 0)
        .map(|(_, n)| *n)
        .collect();
        v.sort_unstable();
        v
    }
}

impl fmt::Debug for InodeFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.names().join("|"))
    }
}

/// A snapshot of an inode's bookkeeping (racy unless the caller excludes concurrent
/// changes; what `/proc` or a debugger would show).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InodeState {
    /// `i_state`.
    pub flags: InodeFlags,
    /// `i_count`.
    pub count: u32,
    /// `i_nlink`.
    pub nlink: u32,
    /// On its hash chain.
    pub hashed: bool,
    /// On its superblock's LRU.
    pub on_lru: bool,
}

/// One cached inode: Linux's `struct inode` bookkeeping around the filesystem's own data.
///
/// Reached through an [`InodeRef`] (a counted reference), a [`NewInode`] (the loader's
/// guard), or a callback of [`crate::SuperBlock::find_inode_nowait`]. Every accessor here
/// is lock-free, so a `->drop_inode` may call them.
///
/// Layout (`repr(C)`): what a lookup and a hit's `iput` touch comes first, in order (the
/// chain walk's `i_sb`, `hashval`, `i_ino`, `i_hash`; then `i_state`, `i_count`, `i_lock`,
/// `i_nlink` for `->drop_inode`), the filesystem's data right after it, so that a cached
/// lookup + `stat` + `iput` touches the fewest cache lines (a walk of a cache larger than
/// the CPU's caches is bound by those misses); the list links, used on insert, evict and
/// LRU moves only, go last.
#[repr(C)]
pub struct Inode<F: SuperOperations> {
    /// `i_sb`: not counted; the superblock outlives its inodes (see the crate's "Lifetimes").
    pub(crate) sb: NonNull<SbInner<F>>,
    pub(crate) hashval: u64,
    pub(crate) ino: u64,
    /// `i_hash`: next on the chain; written under the chain lock, read lock-free.
    pub(crate) hash_next: AtomicPtr<Inode<F>>,
    pub(crate) state: AtomicU32,
    pub(crate) count: AtomicU32,
    /// `i_lock`: protects `state` writes and the 1 -> 0 and 0 -> 1 transitions of `count`.
    pub(crate) i_lock: ILock,
    pub(crate) nlink: AtomicU32,
    pub(crate) data: F::Data,
    /// The LRU shard it is on (`i_lru`'s list: low 16 bits; written under that shard's
    /// lock and `i_lock`, read by its evictor before taking it) and its superblock list
    /// shard (`i_sb_list`'s list: high 16 bits; written once, by `inode_sb_list_add`
    /// while only its creator can reach it as a reference holder, before any LRU use).
    /// One word, so that with the four-byte `sb_index` the inode is 8 bytes smaller (88
    /// bytes with 16 bytes of data: a 96-byte heap block instead of 112). Shard counts are
    /// at most 2^16 (`Settings::shard_count`).
    pub(crate) shards: AtomicU32,
    /// `i_sb_list`: the index in its shard; written under that shard's lock.
    pub(crate) sb_index: AtomicU32,
    /// `i_lru`: its links in its LRU shard's list (`list_lru_one`): written and read only
    /// under that LRU shard's lock (Relaxed atomics: the lock orders them; they are
    /// atomics only so that `Inode` stays `Sync` without unsafe).
    pub(crate) lru_prev: AtomicPtr<Inode<F>>,
    pub(crate) lru_next: AtomicPtr<Inode<F>>,
}

// SAFETY: `sb` is the only field that is not `Send + Sync` by itself: a pointer to a
// superblock whose shared state is atomics, locks and the filesystem's `Send + Sync`
// operations, alive as long as the inode is (see `Inode::sb`); the rest is atomics, locks
// and `Send + Sync` data.
unsafe impl<F: SuperOperations> Send for Inode<F> {}
// SAFETY: as above: `&Inode` only reads `sb` and gives `&SbInner`, which is `Sync`.
unsafe impl<F: SuperOperations> Sync for Inode<F> {}

impl<F: SuperOperations> Inode<F> {
    /// `i_sb`.
    pub(crate) fn sb(&self) -> &SbInner<F> {
        // SAFETY: a superblock is freed only after every inode it allocated went through
        // `destroy_inode` (its per-shard live counts sum to 0) and then a grace period
        // (crate docs, "Lifetimes"). Whoever holds `&Inode` holds a reference, a list lock,
        // the eviction duty, or is pinned with the inode reached from a chain; the first
        // three exclude `destroy_inode` having run; a pinned walker dereferences `sb` only
        // after comparing it equal to a superblock it holds a handle to.
        unsafe { self.sb.as_ref() }
    }

    /// `i_ino`.
    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// The hash value it was looked up by (`i_ino` unless `iget5_locked` said otherwise).
    pub fn hashval(&self) -> u64 {
        self.hashval
    }

    /// The filesystem's data (`alloc_inode`'s or `iget5_locked`'s `set`).
    pub fn data(&self) -> &F::Data {
        &self.data
    }

    /// The filesystem operations of its superblock.
    pub fn sb_ops(&self) -> &F {
        &self.sb().ops
    }

    /// The superblock's device number (as [`crate::SuperBlock::dev`]).
    pub fn sb_dev(&self) -> u64 {
        self.sb().dev
    }

    /// `i_nlink`.
    pub fn nlink(&self) -> u32 {
        self.nlink.load(Ordering::Acquire)
    }

    /// `set_nlink`.
    pub fn set_nlink(&self, n: u32) {
        self.nlink.store(n, Ordering::Release);
    }

    /// `inc_nlink`.
    pub fn inc_nlink(&self) {
        self.nlink.fetch_add(1, Ordering::AcqRel);
    }

    /// `drop_nlink`.
    ///
    /// # Panics
    /// At `nlink` 0 (Linux `WARN_ON` and underflows; here the caller's bug stops).
    pub fn drop_nlink(&self) {
        let r = self
            .nlink
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        if r.is_err() {
            panic!("drop_nlink: {} has nlink 0", self.name());
        }
    }

    /// `clear_nlink`.
    pub fn clear_nlink(&self) {
        self.nlink.store(0, Ordering::Release);
    }

    /// `!inode_unhashed(inode)`.
    pub fn is_hashed(&self) -> bool {
        self.state.load(Ordering::Acquire) & HASHED != 0
    }

    /// Whether `iget_failed` made it bad (`is_bad_inode`).
    pub fn is_bad(&self) -> bool {
        self.state.load(Ordering::Acquire) & BAD != 0
    }

    /// A snapshot of the bookkeeping.
    pub fn state(&self) -> InodeState {
        let s = self.state.load(Ordering::Acquire);
        InodeState {
            flags: InodeFlags(s & LINUX_STATE),
            count: self.count.load(Ordering::Acquire),
            nlink: self.nlink(),
            hashed: s & HASHED != 0,
            on_lru: s & ON_LRU != 0,
        }
    }

    /// `d_mark_dontcache`'s part on the inode: evict it at its last `iput`.
    pub fn mark_dontcache(&self) {
        let _g = self.i_lock.lock();
        self.set_bits(I_DONTCACHE);
    }

    /// `remove_inode_hash`: lookups no longer find it.
    pub fn remove_inode_hash(&self) {
        crate::hash_table::remove_inode_hash(self);
    }

    /// `igrab`: a reference, unless the inode is being freed.
    pub fn igrab(&self) -> Option<InodeRef<F>> {
        let _g = self.i_lock.lock();
        if self.state.load(Ordering::Relaxed) & (I_FREEING | I_WILL_FREE) != 0 {
            return None;
        }
        Some(self.iget_locked_ref())
    }

    /// "sb 3 ino 5", for messages.
    pub(crate) fn name(&self) -> String {
        format!("inode {} of sb {}", self.ino, self.sb().dev)
    }

    /// `__iget`: the caller holds `i_lock`.
    pub(crate) fn iget_locked_ref(&self) -> InodeRef<F> {
        debug_assert!(self.i_lock.is_locked());
        self.count.fetch_add(1, Ordering::Relaxed);
        InodeRef {
            ptr: NonNull::from(self),
        }
    }

    /// The LRU shard it is (or was last) on.
    pub(crate) fn lru_shard(&self) -> usize {
        (self.shards.load(Ordering::Relaxed) & 0xffff) as usize
    }

    /// Sets the LRU shard; the caller holds that shard's lock and `i_lock` (the other
    /// half of the word is written only before the inode can be on an LRU).
    pub(crate) fn set_lru_shard(&self, shard: u32) {
        let w = self.shards.load(Ordering::Relaxed);
        self.shards
            .store((w & !0xffff) | (shard & 0xffff), Ordering::Relaxed);
    }

    /// Its superblock list shard and its LRU shard (as [`Self::sb_shard`] and
    /// [`Self::lru_shard`]), from one load.
    pub(crate) fn shards(&self) -> (usize, usize) {
        let w = self.shards.load(Ordering::Relaxed);
        ((w >> 16) as usize, (w & 0xffff) as usize)
    }

    /// The superblock list shard it is on.
    pub(crate) fn sb_shard(&self) -> usize {
        (self.shards.load(Ordering::Relaxed) >> 16) as usize
    }

    /// Sets the superblock list shard: once, in `inode_sb_list_add`, before the inode can
    /// be on an LRU (its creator holds a reference until then).
    pub(crate) fn set_sb_shard(&self, shard: u32) {
        let w = self.shards.load(Ordering::Relaxed);
        self.shards.store((w & 0xffff) | (shard << 16), Ordering::Relaxed);
    }

    /// Sets bits of `state`; the caller holds `i_lock`.
    pub(crate) fn set_bits(&self, b: u32) {
        debug_assert!(self.i_lock.is_locked());
        let s = self.state.load(Ordering::Relaxed);
        self.state.store(s | b, Ordering::Release);
    }

    /// Clears bits of `state`; the caller holds `i_lock`.
    pub(crate) fn clear_bits(&self, b: u32) {
        debug_assert!(self.i_lock.is_locked());
        let s = self.state.load(Ordering::Relaxed);
        self.state.store(s & !b, Ordering::Release);
    }

    /// Clears `WAITERS` and says whether it was set; the caller holds `i_lock` and wakes
    /// the address after dropping it.
    pub(crate) fn take_waiters(&self) -> bool {
        let s = self.state.load(Ordering::Relaxed);
        if s & WAITERS != 0 {
            self.state.store(s & !WAITERS, Ordering::Release);
            true
        } else {
            false
        }
    }

    pub(crate) fn addr(&self) -> usize {
        self as *const Self as usize
    }

    pub(crate) fn lock(&self) -> ILockGuard<'_> {
        self.i_lock.lock()
    }

    /// Ends `I_NEW` (and `I_CREATING` when `creating`), waking the waiters.
    fn end_new(&self, what: &str, clear: u32) {
        let w = {
            let _g = self.i_lock.lock();
            if self.state.load(Ordering::Relaxed) & I_NEW == 0 {
                drop(_g);
                panic!("{what}: {} is not I_NEW", self.name());
            }
            self.clear_bits(clear);
            self.take_waiters()
        };
        if w {
            self.sb().cache.waits.wake_all(self.addr());
        }
    }
}

impl<F: SuperOperations> fmt::Debug for Inode<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inode")
            .field("sb", &self.sb().dev)
            .field("ino", &self.ino)
            .field("state", &self.state())
            .finish()
    }
}

/// One counted reference (`i_count`) to a cached inode: `Clone` is `ihold`, `Drop` is
/// `iput` (the last one runs `iput_final`).
pub struct InodeRef<F: SuperOperations> {
    pub(crate) ptr: NonNull<Inode<F>>,
}

// SAFETY: an `InodeRef` is a counted pointer to an `Inode`, whose shared state is atomics
// and locks; the data is `Send + Sync` by the trait's bounds.
unsafe impl<F: SuperOperations> Send for InodeRef<F> {}
// SAFETY: as above: `&InodeRef` only gives `&Inode`.
unsafe impl<F: SuperOperations> Sync for InodeRef<F> {}

impl<F: SuperOperations> Deref for InodeRef<F> {
    type Target = Inode<F>;
    fn deref(&self) -> &Inode<F> {
        // SAFETY: the reference holds one `i_count`; an inode is evicted and freed only at
        // count 0, so it is alive while `self` is.
        unsafe { self.ptr.as_ref() }
    }
}

impl<F: SuperOperations> Clone for InodeRef<F> {
    /// `ihold`.
    fn clone(&self) -> Self {
        self.count.fetch_add(1, Ordering::Relaxed);
        InodeRef { ptr: self.ptr }
    }
}

impl<F: SuperOperations> Drop for InodeRef<F> {
    /// `iput`.
    fn drop(&mut self) {
        crate::iput::iput(self.ptr);
    }
}

impl<F: SuperOperations> fmt::Debug for InodeRef<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl<F: SuperOperations> PartialEq for InodeRef<F> {
    /// The same inode object.
    fn eq(&self, other: &Self) -> bool {
        self.ptr == other.ptr
    }
}

impl<F: SuperOperations> Eq for InodeRef<F> {}

impl<F: SuperOperations> InodeRef<F> {
    /// `ihold`: one more reference (same as `clone`).
    pub fn ihold(&self) -> InodeRef<F> {
        self.clone()
    }

    /// `unlock_new_inode` through any reference (prefer [`NewInode::unlock_new_inode`]).
    ///
    /// # Panics
    /// If the inode is not `I_NEW` (Linux `WARN_ON`).
    pub fn unlock_new_inode(&self) {
        self.end_new("unlock_new_inode", I_NEW | I_CREATING);
    }

    /// `discard_new_inode` through any reference: clears `I_NEW` (not `I_CREATING`),
    /// wakes the waiters (they take the inode), then puts this reference.
    ///
    /// # Panics
    /// If the inode is not `I_NEW`.
    pub fn discard_new_inode(self) {
        self.end_new("discard_new_inode", I_NEW);
        drop(self);
    }

    /// `iget_failed`: `make_bad_inode` (unhash), `unlock_new_inode`, `iput`. Waiters find
    /// it unhashed, put it and look again.
    ///
    /// # Panics
    /// If the inode is not `I_NEW`.
    pub fn iget_failed(self) {
        if self.state.load(Ordering::Acquire) & I_NEW == 0 {
            panic!("iget_failed: {} is not I_NEW", self.name());
        }
        {
            let _g = self.lock();
            self.set_bits(BAD);
        }
        self.remove_inode_hash();
        self.end_new("iget_failed", I_NEW | I_CREATING);
        drop(self);
    }
}

/// The loader's guard of an `I_NEW` inode (what `iget_locked` returns with `I_NEW` set, or
/// `insert_inode_locked` leaves): fill the inode through its data, then end the load.
/// Every other task that finds the inode waits until then.
///
/// Dropping the guard is Linux's error path, `iget_failed`: the inode is unhashed and the
/// waiters look again (one of them becomes the loader).
pub struct NewInode<F: SuperOperations> {
    r: Option<InodeRef<F>>,
}

impl<F: SuperOperations> NewInode<F> {
    pub(crate) fn new(r: InodeRef<F>) -> Self {
        NewInode { r: Some(r) }
    }

    fn take(mut self) -> InodeRef<F> {
        self.r
            .take()
            .expect("a NewInode holds its reference until consumed")
    }

    /// `unlock_new_inode`: the inode is ready; waiters take it.
    pub fn unlock_new_inode(self) -> InodeRef<F> {
        let r = self.take();
        r.unlock_new_inode();
        r
    }

    /// `discard_new_inode`: the inode stays hashed and the waiters take it; this reference
    /// is put.
    pub fn discard_new_inode(self) {
        self.take().discard_new_inode();
    }

    /// `iget_failed`: unhash, wake, put.
    pub fn iget_failed(self) {
        self.take().iget_failed();
    }

    /// `ihold`: another reference (the inode is still `I_NEW`).
    pub fn ihold(&self) -> InodeRef<F> {
        self.r.as_ref().expect("held").clone()
    }

    /// The reference, with the duty to end `I_NEW` through it (or another reference):
    /// for callers that cannot keep the guard, such as a scenario runner.
    pub fn into_inner(self) -> InodeRef<F> {
        self.take()
    }
}

impl<F: SuperOperations> Deref for NewInode<F> {
    type Target = Inode<F>;
    fn deref(&self) -> &Inode<F> {
        self.r.as_ref().expect("held")
    }
}

impl<F: SuperOperations> Drop for NewInode<F> {
    fn drop(&mut self) {
        if let Some(r) = self.r.take() {
            r.iget_failed();
        }
    }
}

impl<F: SuperOperations> fmt::Debug for NewInode<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("NewInode").field(&**self).finish()
    }
}

/// What `iget_locked` gives: the cached inode, or a new one to fill.
pub enum Iget<F: SuperOperations> {
    /// Found in the cache (waited for its load if it was `I_NEW`).
    Cached(InodeRef<F>),
    /// Not cached: inserted `I_NEW`; the caller loads it and ends the load.
    New(NewInode<F>),
}

impl<F: SuperOperations> fmt::Debug for Iget<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Iget::Cached(r) => f.debug_tuple("Cached").field(r).finish(),
            Iget::New(n) => f.debug_tuple("New").field(n).finish(),
        }
    }
}

impl<F: SuperOperations> Iget<F> {
    /// Whether the caller must load the inode.
    pub fn is_new(&self) -> bool {
        matches!(self, Iget::New(_))
    }

    /// The inode either way.
    pub fn inode(&self) -> &Inode<F> {
        match self {
            Iget::Cached(r) => r,
            Iget::New(n) => n,
        }
    }
}

/// A pointer to an inode kept by a list that a lock protects.
pub(crate) struct InodePtr<F: SuperOperations>(pub(crate) NonNull<Inode<F>>);

// SAFETY: the pointee is `Sync` (atomics, locks, `Send + Sync` data); the pointer is only
// dereferenced under the lock of the list that holds it, while the inode is on that list.
unsafe impl<F: SuperOperations> Send for InodePtr<F> {}

impl<F: SuperOperations> Clone for InodePtr<F> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<F: SuperOperations> Copy for InodePtr<F> {}

impl<F: SuperOperations> InodePtr<F> {
    /// # Safety
    /// The inode is alive: the caller holds the lock of a list it is on, a reference, or
    /// is the one evicting it.
    pub(crate) unsafe fn get<'a>(self) -> &'a Inode<F> {
        // SAFETY: by the caller's contract.
        unsafe { self.0.as_ref() }
    }
}
