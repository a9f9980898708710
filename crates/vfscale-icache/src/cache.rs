//! The cache: hash table, superblock lists, LRU, counters; lookups, `iput` and eviction.
//! Function names follow `fs/inode.c`.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI64, AtomicU64 as StdAtomicU64, AtomicUsize as StdAtomicUsize};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use crossbeam_utils::CachePadded;

use crate::epoch::{reclaim_due, Domain, Guard};
use crate::inode::*;
use crate::sync::{
    fence, AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, ILock, ILockGuard, Mutex, MutexGuard, Ordering,
    ShardGuard, ShardMutex, SpinWait,
};
use crate::wait::{WaitOutcome, WaitTable, Waiter};
use crate::{CacheStats, HashLock, Lookup, Lru, SbList, Settings, SuperOperations};

/// A pointer to an inode kept by a list that a lock protects.
pub(crate) struct InodePtr<F: SuperOperations>(NonNull<Inode<F>>);

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
    unsafe fn get<'a>(self) -> &'a Inode<F> {
        // SAFETY: by the caller's contract.
        unsafe { self.0.as_ref() }
    }
}

/// The shard a thread uses for per-CPU structures: its slot ([`thread_slot`], the lowest
/// free one when it first asks, kept until it exits) modulo the shard count. Linux
/// indexes per-CPU data by the current CPU; in userspace a thread may migrate at any time
/// and asking the kernel (`sched_getcpu`) on every operation costs more than it saves,
/// while a fixed slot per thread spreads threads over the shards just as well (live
/// threads have dense slots, so no two share a shard while threads ≤ shards).
///
/// Under the models: the model thread's index (loom's and shuttle's thread ids count from
/// 0, the main thread, in spawn order, the same in every execution), so the models'
/// threads use different shards (two under the models: the main thread and the second
/// spawned one share shard 0, the first spawned one has shard 1) and exercise the
/// cross-shard paths (an inode on another thread's LRU shard; `live` and the counters
/// summed over shards). A process-wide counter would hand a thread another shard in
/// each execution, which a model checker must not see.
///
/// (Normal builds compute it in [`CacheInner::counters`], from the one slot lookup that
/// gives the counters too.)
#[cfg(any(vfscale_loom, vfscale_shuttle))]
fn shard_hint() -> usize {
    #[cfg(vfscale_loom)]
    {
        // loom's `ThreadId` shows its index only through `Debug` ("ThreadId(3)").
        let id = format!("{:?}", loom::thread::current().id());
        id.trim_start_matches("ThreadId(")
            .trim_end_matches(')')
            .parse()
            .expect("loom ThreadId(n)")
    }
    #[cfg(all(vfscale_shuttle, not(vfscale_loom)))]
    {
        usize::from(shuttle::thread::current().id())
    }
}

/// The calling thread's slot: an index no other live thread has, the lowest free one
/// when the thread first asks (so live threads have dense slots, and consecutive ones
/// fall on different shards), given back when the thread exits. `None` once this
/// thread's slot was given back (in its other thread-local destructors).
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
#[inline]
fn thread_slot() -> Option<usize> {
    use std::sync::Mutex as StdMutex;
    /// Slots in use are `0..next` minus `free`.
    struct Pool {
        next: usize,
        free: Vec<usize>,
    }
    static POOL: StdMutex<Pool> = StdMutex::new(Pool {
        next: 0,
        free: Vec::new(),
    });
    struct Slot(usize);
    impl Slot {
        fn claim() -> Slot {
            let mut p = POOL.lock().unwrap_or_else(|e| e.into_inner());
            let lowest = p.free.iter().enumerate().min_by_key(|(_, v)| **v).map(|(i, _)| i);
            Slot(match lowest {
                Some(i) => p.free.swap_remove(i),
                None => {
                    p.next += 1;
                    p.next - 1
                }
            })
        }
    }
    impl Drop for Slot {
        fn drop(&mut self) {
            let _ = CACHED.try_with(|c| c.set(GONE));
            // The pool's lock orders this thread's last counter stores before the next
            // owner's first load of the slot.
            POOL.lock().unwrap_or_else(|e| e.into_inner()).free.push(self.0);
        }
    }
    // The slot, cached where a read is one thread-local load (no lazy-init or
    // destructor state to check): `usize::MAX` before the claim, [`GONE`] after the
    // release.
    thread_local!(static CACHED: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) });
    const GONE: usize = usize::MAX - 1;
    thread_local!(static SLOT: Slot = Slot::claim());
    let v = CACHED.with(|c| c.get());
    if v < GONE {
        return Some(v);
    }
    if v == GONE {
        return None;
    }
    let v = SLOT.try_with(|s| s.0).ok()?;
    CACHED.with(|c| c.set(v));
    Some(v)
}

/// One hash chain (`hlist_bl_head`): one word, the first inode's address with the chain's
/// lock in bit 0 (a bit spinlock; inodes are at least 8-aligned, so bit 0 of an address is
/// free). Lock-free readers mask the bit off.
struct Bucket<F: SuperOperations> {
    head: AtomicUsize,
    _inode: PhantomData<fn() -> F>,
}

/// Bit 0 of a chain head: `hlist_bl_lock`.
const CHAIN_LOCK: usize = 1;

impl<F: SuperOperations> Bucket<F> {
    fn new() -> Self {
        Bucket {
            head: AtomicUsize::new(0),
            _inode: PhantomData,
        }
    }

    /// `hlist_bl_first`: the first inode (lock bit masked off).
    fn first(&self, o: Ordering) -> *mut Inode<F> {
        (self.head.load(o) & !CHAIN_LOCK) as *mut Inode<F>
    }

    /// Sets the first inode, keeping the lock bit; the caller holds the chain's lock (or
    /// `inode_hash_lock`, with which the bit is never set). Release: a lock-free walker
    /// that loads the pointer sees what was written before.
    fn set_first(&self, p: *mut Inode<F>) {
        let bit = self.head.load(Ordering::Relaxed) & CHAIN_LOCK;
        debug_assert!(p as usize & CHAIN_LOCK == 0);
        self.head.store(p as usize | bit, Ordering::Release);
    }

    /// `hlist_bl_lock` (`bit_spin_lock(0, ..)`): set bit 0, Acquire; while another holds
    /// it, wait reading (no writes to the line) and try again.
    ///
    /// The bit is set by a compare-exchange of the word seen free, not by `fetch_or`
    /// (Linux's `test_and_set_bit_lock`): a `fetch_or` that finds the bit taken still
    /// writes the word, and that write races the holder's plain store of a new first
    /// inode (`set_first`); the C++ model orders them (the failed RMW reads the holder's
    /// lock and precedes its store), but loom's modification order does not, and the
    /// model then loses the store (`loom_bitlock` below caught it). A failed
    /// compare-exchange writes nothing, so the waiter never dirties the holder's line.
    fn lock(&self) {
        let w = SpinWait::new();
        loop {
            let cur = self.head.load(Ordering::Relaxed);
            if cur & CHAIN_LOCK == 0
                && self
                    .head
                    .compare_exchange_weak(cur, cur | CHAIN_LOCK, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            w.wait();
        }
    }

    /// `hlist_bl_unlock` (`__bit_spin_unlock`): clear bit 0 with a plain Release store of
    /// the word, not a locked read-modify-write: while the bit is set nobody else writes
    /// the word (a locker's compare-exchange of a word seen free fails without writing,
    /// and only the holder sets the first inode), so the word read here is the current
    /// one. One locked instruction less per chain-lock hold (insert, load, eviction);
    /// `loom_bitlock` checks that both lockers' links survive.
    fn unlock(&self) {
        let cur = self.head.load(Ordering::Relaxed);
        debug_assert!(cur & CHAIN_LOCK != 0, "hash chain unlocked twice");
        self.head.store(cur & !CHAIN_LOCK, Ordering::Release);
    }

    /// A hint to load the chain head's cache line (no effect on the models, or off
    /// x86-64).
    #[inline]
    fn prefetch(&self) {
        #[cfg(all(target_arch = "x86_64", not(any(vfscale_loom, vfscale_shuttle))))]
        // SAFETY: a prefetch is a hint: it never faults and changes no memory; the
        // address is our own live head word anyway.
        #[allow(unused_unsafe)]
        unsafe {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            _mm_prefetch::<_MM_HINT_T0>(&self.head as *const AtomicUsize as *const i8);
        }
    }

    /// Whether someone holds the chain's bit lock (for `debug_assert!`s).
    fn is_locked(&self) -> bool {
        self.head.load(Ordering::Relaxed) & CHAIN_LOCK != 0
    }
}

/// What holds a chain for insert and remove: its bit lock, or `inode_hash_lock`.
enum HashGuard<'a, F: SuperOperations> {
    Global(#[allow(dead_code)] MutexGuard<'a, ()>),
    Chain(&'a Bucket<F>),
}

impl<F: SuperOperations> Drop for HashGuard<'_, F> {
    fn drop(&mut self) {
        if let HashGuard::Chain(b) = self {
            b.unlock();
        }
    }
}

/// The counters of `/proc/sys/fs/inode-nr` and the lock and wait counts.
#[derive(Clone, Copy)]
enum Ctr {
    NrInodes,
    NrUnused,
    GlobalLocks,
    ChainLocks,
    SbShardLocks,
    LruShardLocks,
    Loads,
    NewWaitsSpun,
    NewWaitsSlept,
    OutboxLocks,
}

const NR_CTRS: usize = 10;

/// One thread's (or, under the models, one shard's) counters, on their own cache lines.
#[derive(Default)]
struct Counters([AtomicI64; NR_CTRS]);

impl Counters {
    fn get(&self, k: Ctr) -> i64 {
        self.0[k as usize].load(Ordering::Relaxed)
    }
}

/// The counters the calling thread adds to: its own slot (`own`: no other thread writes
/// it, so an add is a plain load and store, no locked read-modify-write), or a shared
/// one (atomic adds); with the slot's index (its live-inode count's too) and the
/// thread's shard (`shard_hint`). Taken once per operation and passed
/// down (what `this_cpu_ptr` is to Linux): each lookup reads the thread's slot again.
struct CpuCounters<'a> {
    c: &'a Counters,
    own: bool,
    slot: usize,
    shard: usize,
}

impl CpuCounters<'_> {
    #[inline]
    fn add(&self, k: Ctr, d: i64) {
        let a = &self.c.0[k as usize];
        if self.own {
            a.store(a.load(Ordering::Relaxed).wrapping_add(d), Ordering::Relaxed);
        } else {
            a.fetch_add(d, Ordering::Relaxed);
        }
    }
}

/// How many counter slots a cache has.
fn counter_slots(shards: usize) -> usize {
    #[cfg(any(vfscale_loom, vfscale_shuttle))]
    {
        shards
    }
    #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
    {
        let _ = shards;
        OWN_SLOTS + 1
    }
}

/// Counter slots owned by one thread each (normal builds): a thread claims the lowest
/// free slot the first time it counts and gives it back when it exits, so the slot's
/// counters have a single writer. Threads beyond this many share one more slot, with
/// atomic adds.
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
const OWN_SLOTS: usize = 64;

/// What every superblock of one cache shares: the inode hash table and the counters.
pub(crate) struct CacheInner<F: SuperOperations> {
    settings: Settings,
    shards: usize,
    buckets: Box<[Bucket<F>]>,
    hash_shift: u32,
    /// `inode_hash_lock` (only with [`HashLock::Global`]).
    global_hash_lock: Mutex<()>,
    /// [`OWN_SLOTS`] thread-owned slots and a shared one (normal builds); one shared
    /// slot per shard under the models.
    counters: Box<[CachePadded<Counters>]>,
    pub(crate) waits: WaitTable,
    domain: Domain,
    next_dev: StdAtomicU64,
}

impl<F: SuperOperations> CacheInner<F> {
    #[inline]
    fn counters(&self) -> CpuCounters<'_> {
        #[cfg(any(vfscale_loom, vfscale_shuttle))]
        {
            let shard = shard_hint() & (self.shards - 1);
            CpuCounters {
                c: &self.counters[shard],
                own: false,
                slot: shard,
                shard,
            }
        }
        #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
        {
            let t = thread_slot();
            // `shard_hint` of normal builds: the slot modulo the shard count; a thread
            // whose slot is gone (it is exiting) may use any shard.
            let shard = t.unwrap_or(0) & (self.shards - 1);
            let (slot, own) = match t {
                Some(i) if i < OWN_SLOTS => (i, true),
                _ => (OWN_SLOTS, false),
            };
            CpuCounters {
                c: &self.counters[slot],
                own,
                slot,
                shard,
            }
        }
    }

    fn bucket(&self, sb: &SbInner<F>, hashval: u64) -> &Bucket<F> {
        // `hash()` of fs/inode.c: mix the superblock in, multiply, keep the top bits.
        let h = (hashval ^ sb.dev.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let i = if self.hash_shift >= 64 {
            0
        } else {
            (h >> self.hash_shift) as usize
        };
        &self.buckets[i]
    }

    /// The lock that protects `b`'s chain for insert and remove: the chain's own, or
    /// `inode_hash_lock`.
    fn hash_lock<'a>(&'a self, b: &'a Bucket<F>) -> HashGuard<'a, F> {
        self.hash_lock_with(&self.counters(), b)
    }

    /// [`CacheInner::hash_lock`], counted on `c`.
    fn hash_lock_with<'a>(&'a self, c: &CpuCounters<'_>, b: &'a Bucket<F>) -> HashGuard<'a, F> {
        match self.settings.hash_lock {
            HashLock::Global => {
                c.add(Ctr::GlobalLocks, 1);
                HashGuard::Global(self.global_hash_lock.lock())
            }
            HashLock::PerChain => {
                c.add(Ctr::ChainLocks, 1);
                b.lock();
                HashGuard::Chain(b)
            }
        }
    }

    fn hash_locked(&self, b: &Bucket<F>) -> bool {
        match self.settings.hash_lock {
            HashLock::Global => self.global_hash_lock.is_locked(),
            HashLock::PerChain => b.is_locked(),
        }
    }
}

/// One LRU list (`list_lru_one`): a doubly-linked list through the inodes' `lru_prev` /
/// `lru_next`, oldest at `head`. Add, delete and rotate are O(1) and allocate nothing.
/// The links of an inode on it are read and written only under this shard's lock.
struct LruShard<F: SuperOperations> {
    head: Option<InodePtr<F>>,
    tail: Option<InodePtr<F>>,
    len: usize,
    /// Its index in the superblock's LRU shards (what an inode on it has as `lru_shard`).
    shard: u32,
}

impl<F: SuperOperations> LruShard<F> {
    fn new(shard: usize) -> Self {
        LruShard {
            head: None,
            tail: None,
            len: 0,
            shard: shard as u32,
        }
    }

    /// Whether `inode` is linked on this list by `lru_shard` (the caller holds this
    /// shard's lock: it has `&mut self`/`&self` only through the lock's guard, so the
    /// links of the inodes on it are the caller's to touch).
    fn owns(&self, inode: &Inode<F>) -> bool {
        inode.lru_shard() == self.shard as usize
    }

    /// `list_add_tail` (newest at the tail). The caller holds this shard's lock (it has
    /// `&mut self` through the guard) and the inode is on no LRU (`ON_LRU` clear, under
    /// `i_lock`).
    fn add_tail(&mut self, inode: &Inode<F>) {
        let me = NonNull::from(inode);
        inode.set_lru_shard(self.shard);
        debug_assert!(inode.lru_prev.load(Ordering::Relaxed).is_null());
        debug_assert!(inode.lru_next.load(Ordering::Relaxed).is_null());
        match self.tail {
            Some(t) => {
                // SAFETY: on this list, whose lock the caller holds.
                unsafe { t.get() }.lru_next.store(me.as_ptr(), Ordering::Relaxed);
                inode.lru_prev.store(t.0.as_ptr(), Ordering::Relaxed);
            }
            None => self.head = Some(InodePtr(me)),
        }
        self.tail = Some(InodePtr(me));
        self.len += 1;
    }

    /// `list_del_init`. The caller holds this shard's lock and the inode is on this list.
    fn del(&mut self, inode: &Inode<F>) {
        debug_assert!(self.owns(inode), "{} is on another LRU shard", inode.name());
        let prev = NonNull::new(inode.lru_prev.swap(std::ptr::null_mut(), Ordering::Relaxed));
        let next = NonNull::new(inode.lru_next.swap(std::ptr::null_mut(), Ordering::Relaxed));
        match prev {
            // SAFETY: on this list, whose lock the caller holds.
            Some(p) => unsafe { p.as_ref() }.lru_next.store(
                next.map_or(std::ptr::null_mut(), |n| n.as_ptr()),
                Ordering::Relaxed,
            ),
            None => {
                debug_assert!(self.head.map(|h| h.0) == Some(NonNull::from(inode)));
                self.head = next.map(InodePtr);
            }
        }
        match next {
            // SAFETY: as above.
            Some(n) => unsafe { n.as_ref() }.lru_prev.store(
                prev.map_or(std::ptr::null_mut(), |p| p.as_ptr()),
                Ordering::Relaxed,
            ),
            None => {
                debug_assert!(self.tail.map(|t| t.0) == Some(NonNull::from(inode)));
                self.tail = prev.map(InodePtr);
            }
        }
        self.len -= 1;
    }

    /// `list_move_tail` (`LRU_ROTATE`).
    fn rotate(&mut self, inode: &Inode<F>) {
        self.del(inode);
        self.add_tail(inode);
    }

    /// The inode after `inode` (towards the newest); the caller holds the lock.
    fn next_of(&self, inode: &Inode<F>) -> Option<InodePtr<F>> {
        debug_assert!(self.owns(inode));
        NonNull::new(inode.lru_next.load(Ordering::Relaxed)).map(InodePtr)
    }
}

/// One shard of a superblock's inode list (`s_inodes`): a slot per inode, which the inode
/// knows (`sb_index`). A removed inode's slot joins a free list threaded through the empty
/// slots (bit 0 set: inode addresses are at least 8-aligned), and an add takes the most
/// recently freed slot; so a removal writes only its own slot (a `swap_remove` also wrote
/// the moved inode's index: one more cache miss, under a lock that another CPU's
/// evictions of the inodes this CPU allocated take too). An inode's slot is written only
/// under the shard's lock.
struct SbSlots<F: SuperOperations> {
    /// An inode's address, or `(next free slot << 1) | 1`.
    slots: Vec<usize>,
    /// The first free slot, or [`SB_SLOT_NONE`].
    free: usize,
    len: usize,
    _inode: PhantomData<fn() -> F>,
}

/// The end of an [`SbSlots`] free list.
const SB_SLOT_NONE: usize = usize::MAX >> 1;

impl<F: SuperOperations> SbSlots<F> {
    fn new() -> Self {
        SbSlots {
            slots: Vec::new(),
            free: SB_SLOT_NONE,
            len: 0,
            _inode: PhantomData,
        }
    }

    /// Adds `inode`; returns its slot. The caller holds the shard's lock.
    fn add(&mut self, inode: &Inode<F>) -> usize {
        let a = inode as *const Inode<F> as usize;
        debug_assert!(a & 1 == 0);
        self.len += 1;
        if self.free != SB_SLOT_NONE {
            let i = self.free;
            self.free = self.slots[i] >> 1;
            self.slots[i] = a;
            i
        } else {
            self.slots.push(a);
            self.slots.len() - 1
        }
    }

    /// Removes `inode` from slot `i`. The caller holds the shard's lock.
    fn del(&mut self, i: usize, inode: &Inode<F>) {
        assert!(
            self.slots.get(i) == Some(&(inode as *const Inode<F> as usize)),
            "{} misplaced on its sb list",
            inode.name()
        );
        self.slots[i] = (self.free << 1) | 1;
        self.free = i;
        self.len -= 1;
        if self.len == 0 {
            // Empty: forget the free list. The memory stays (the shrinker gives a large
            // one back, `shrink_if_empty`): freeing a large block inside an eviction made
            // glibc consolidate every fastbin chunk of the process there (a mass unlink's
            // last eviction paid for all the frees before it).
            self.slots.clear();
            self.free = SB_SLOT_NONE;
        }
    }

    /// Gives the memory of an empty list back if it is large (the caller holds the
    /// shard's lock; `prune_icache_sb`, under memory pressure).
    fn shrink_if_empty(&mut self) {
        if self.len == 0 && self.slots.capacity() > 4096 {
            self.slots = Vec::new();
        }
    }

    /// The inodes in slots `start..`, with their slots. The caller holds the shard's lock.
    fn iter_from(&self, start: usize) -> impl Iterator<Item = (usize, InodePtr<F>)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .skip(start)
            .filter(|(_, a)| **a & 1 == 0)
            .map(|(i, a)| {
                (
                    i,
                    InodePtr(NonNull::new(*a as *mut Inode<F>).expect("a used slot holds an inode")),
                )
            })
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// Inodes one hold of a superblock list shard's lock takes in a walk of the whole list
/// (`evict_inodes`, `for_each_inode`). The lock is a spinlock whose waiters spin and then
/// yield, so a walk of a large shard lets it go every so often and goes on from the next
/// slot, as Linux's `evict_inodes` drops `s_inode_list_lock` when it must reschedule.
/// Slots do not move while an inode is on the list, so a resumed walk visits every inode
/// that stayed; an inode added meanwhile may or may not be visited (as at any time).
const SB_WALK_BATCH: usize = 128;

/// Walks every superblock list shard of `sb`, at most [`SB_WALK_BATCH`] picks per hold of
/// a shard's lock: `pick` runs for each inode under the shard's lock and the inode's
/// `i_lock` and may push onto the batch; `then` runs on each full (and the last) batch
/// with no lock held and must empty it. The batch is allocated before any lock is taken.
fn sb_walk<F: SuperOperations, T>(
    sb: &SbInner<F>,
    mut pick: impl FnMut(InodePtr<F>, &Inode<F>, &mut Vec<T>),
    mut then: impl FnMut(&mut Vec<T>),
) {
    let mut batch = Vec::with_capacity(SB_WALK_BATCH);
    for shard in 0..sb.lists.len() {
        let mut next = 0;
        loop {
            let done = {
                let l = sb.list_lock(shard);
                let mut it = l.iter_from(next);
                loop {
                    if batch.len() >= SB_WALK_BATCH {
                        break false;
                    }
                    let Some((i, p)) = it.next() else { break true };
                    next = i + 1;
                    // SAFETY: on the list whose lock we hold.
                    let inode = unsafe { p.get() };
                    let _g = inode.lock();
                    pick(p, inode, &mut batch);
                }
            };
            then(&mut batch);
            debug_assert!(batch.is_empty(), "sb_walk: `then` left the batch full");
            if done {
                break;
            }
        }
    }
}

/// One LRU shard and its length on the same lines: the length is written under the
/// shard's lock on every add and delete and read without it (the shrinker's `count`), so
/// a line of its own was one more line per LRU operation (a transfer between CPUs when
/// an eviction takes an inode off another CPU's shard).
struct LruSlot<F: SuperOperations> {
    list: ShardMutex<LruShard<F>>,
    /// `list`'s `len`, for readers that do not take the lock.
    len: StdAtomicUsize,
}

/// One shard of a superblock's inode list and its lock (`s_inode_list_lock`).
type SbListShard<F> = ShardMutex<SbSlots<F>>;

/// Evictions whose inodes wait in an outbox before they are taken off another CPU's
/// superblock list and LRU shards in one hold of each shard's lock (the crate docs,
/// "Batched removal"). A flush takes a remote shard's lock line to this CPU once per
/// this many evictions instead of once (or, with the LRU, twice) per eviction: at 32 the
/// two line transfers of an eviction whose inode another CPU listed cost about 1/16 of
/// what they did, while a flush holds a shard lock for at most 32 unlinks (a few
/// microseconds of a waiter's spin), the outbox's 256 bytes of pointers stay in L1, and
/// each thread holds back at most 32 evicted inodes' memory per superblock. Under the
/// models: 2 (a second remote eviction, or [`SuperBlock::flush_evictions`], flushes; one
/// stays parked, so umount's drain and a prune meeting a parked inode are explored).
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
const OUTBOX: usize = 32;
#[cfg(any(vfscale_loom, vfscale_shuttle))]
const OUTBOX: usize = 2;

/// A counter slot's evicted inodes whose list removal waits (at most [`OUTBOX`]): each is
/// `I_FREEING | I_CLEAR | PARKED`, unhashed, through `->evict_inode` and `->destroy_inode`,
/// still on its superblock list shard and maybe on an LRU shard. Its buffer is allocated
/// at the first park (under its lock, which only a drain ever contends).
struct Outbox<F: SuperOperations> {
    items: Vec<InodePtr<F>>,
}

/// What a superblock keeps per counter slot, on one line that the slot's thread writes:
/// its live-inode count (inodes allocated and not yet through `destroy_inode`: `+1` on
/// the allocating thread's slot, a plain load and store when the thread owns the slot;
/// `-1` on the destroying one's, a slot alone may wrap below 0, the wrapping sum is exact,
/// summed at teardown only) and its outbox, under a lock of its own: taken by the slot's
/// thread to park and flush (uncontended: its line stays on that CPU), and by a drain
/// (umount, the list observers) of every slot.
struct SbSlot<F: SuperOperations> {
    live: AtomicUsize,
    outbox: ShardMutex<Outbox<F>>,
}

/// A superblock: its operations, `SB_ACTIVE`, its inode lists and its LRU.
pub(crate) struct SbInner<F: SuperOperations> {
    pub(crate) cache: Arc<CacheInner<F>>,
    pub(crate) ops: F,
    pub(crate) dev: u64,
    active: AtomicBool,
    /// `s_inodes`, one list per shard (`s_inode_list_lock` each).
    lists: Box<[CachePadded<SbListShard<F>>]>,
    /// `s_inode_lru`, one list per shard, with its length.
    lru: Box<[CachePadded<LruSlot<F>>]>,
    prune_cursor: StdAtomicUsize,
    /// Where the superblock lives (the pointer from `Box::into_raw`): what inodes hold as
    /// `i_sb`, and what the last one out frees.
    pub(crate) this: NonNull<SbInner<F>>,
    /// Per counter slot (as [`CacheInner::counters`]: one per thread in normal builds,
    /// per shard under the models): its live-inode count and its outbox ([`SbSlot`]).
    slots: Box<[CachePadded<SbSlot<F>>]>,
    /// No handle ([`SuperBlock`], a waiting lookup) is left: the superblock is freed when
    /// its last inode is destroyed.
    detached: AtomicBool,
    /// The free is claimed (exactly once).
    freed: AtomicBool,
}

// SAFETY: `this` points at the superblock itself; everything else is `Send + Sync` (locks,
// atomics, the filesystem's `Send + Sync` operations, lists of inode pointers used under
// their locks).
unsafe impl<F: SuperOperations> Send for SbInner<F> {}
// SAFETY: as above.
unsafe impl<F: SuperOperations> Sync for SbInner<F> {}

impl<F: SuperOperations> Drop for SbInner<F> {
    fn drop(&mut self) {
        let n = self
            .slots
            .iter()
            .fold(0usize, |a, c| a.wrapping_add(c.live.load(Ordering::Relaxed)));
        // Checked in the models too (their builds are release builds).
        if cfg!(any(debug_assertions, vfscale_loom, vfscale_shuttle)) {
            assert_eq!(n, 0, "superblock {} freed with live inodes", self.dev);
        }
    }
}

/// A counted handle on a superblock: what [`SuperBlock`] and a waiting lookup
/// ([`InodeWait`]) hold (inodes hold an uncounted `i_sb`). Dropping the last one detaches
/// the superblock: it is freed once its live inodes are all destroyed.
pub(crate) struct SbHandle<F: SuperOperations> {
    sb: NonNull<SbInner<F>>,
}

// SAFETY: a handle is a shared reference to a `Sync` superblock that it keeps alive.
unsafe impl<F: SuperOperations> Send for SbHandle<F> {}
// SAFETY: as above.
unsafe impl<F: SuperOperations> Sync for SbHandle<F> {}

impl<F: SuperOperations> std::ops::Deref for SbHandle<F> {
    type Target = SbInner<F>;
    fn deref(&self) -> &SbInner<F> {
        // SAFETY: a handle is counted in `Arc<SbHandle>`; the superblock is not freed
        // before the last handle is dropped (`detached`).
        unsafe { self.sb.as_ref() }
    }
}

impl<F: SuperOperations> Drop for SbHandle<F> {
    fn drop(&mut self) {
        let sb: &SbInner<F> = self;
        // Pinned before `detached` is set: once it is, a destroyer may free the
        // superblock, but only a grace period after, so `sb` stays valid until we unpin.
        let pin = sb.cache.domain.pin();
        sb.detached.store(true, Ordering::SeqCst);
        // Dekker with `sb_inode_gone`: see there.
        fence(Ordering::SeqCst);
        sb_try_free(sb, &pin);
    }
}

/// The last use of `sb` by an inode: `destroy_inode` of one of its inodes is done. The
/// caller is pinned (`pin`) since before this call and touches `sb` no more after it;
/// `c` is its CPU's counters (whose slot of `live` it decrements).
fn sb_inode_gone<F: SuperOperations>(sb: &SbInner<F>, pin: &Guard, c: &CpuCounters<'_>) {
    // Dekker with `SbHandle::drop`, through SeqCst fences (each side: its write, a
    // fence, then its reads): either this decrement is seen by the detacher's sum, or
    // this load sees `detached` and sums itself; of two destroyers on different shards,
    // the one whose fence is later in the SeqCst order sees the other's decrement, so
    // the last one sums 0. SeqCst accesses alone order this in C++ (the decrement, this
    // load and the detacher's store and sum are all in the single SeqCst order: if this
    // load reads `detached` false it precedes the store, so the sum after it reads the
    // decrement), and on x86 the locked decrement is a full barrier already, so normal
    // builds leave the fence out (an `mfence` per eviction). loom models SeqCst accesses
    // as AcqRel (with per-thread shards, `sb_freed_after_last_inode` then found the
    // superblock never freed): under the models the fence is there, and loom checks it
    // exactly.
    sb.live_slot_of(c).0.fetch_sub(1, Ordering::SeqCst);
    #[cfg(any(vfscale_loom, vfscale_shuttle))]
    fence(Ordering::SeqCst);
    if sb.detached.load(Ordering::SeqCst) {
        sb_try_free(sb, pin);
    }
}

/// Frees a detached superblock when no inode of it is live, a grace period later.
fn sb_try_free<F: SuperOperations>(sb: &SbInner<F>, pin: &Guard) {
    // No inode is allocated once `detached` is set (allocating takes a handle, and every
    // handle's drop happens before the last one's), so every increment is visible here and
    // the sum can only overstate what is live: 0 means none.
    let n = sb
        .slots
        .iter()
        .fold(0usize, |a, c| a.wrapping_add(c.live.load(Ordering::SeqCst)));
    if n == 0 && !sb.freed.swap(true, Ordering::AcqRel) {
        // SAFETY: `this` came from `Box::into_raw` in `mount` and only this claim frees
        // it. Everyone that may still touch `sb` is pinned since before the decrement or
        // the `detached` store we observed (each touches it only while pinned after that
        // point), so freeing after the grace period is safe; inodes of it may still be
        // read by pinned chain walkers, which compare `i_sb` but do not dereference it.
        unsafe { pin.defer_free_box(sb.this.as_ptr()) };
    }
}

impl<F: SuperOperations> SbInner<F> {
    fn list_lock(&self, shard: usize) -> ShardGuard<'_, SbSlots<F>> {
        self.list_lock_with(&self.cache.counters(), shard)
    }

    /// [`SbInner::list_lock`], counted on `c`.
    fn list_lock_with(&self, c: &CpuCounters<'_>, shard: usize) -> ShardGuard<'_, SbSlots<F>> {
        if self.cache.settings.sb_list == SbList::Global {
            c.add(Ctr::GlobalLocks, 1);
        } else {
            c.add(Ctr::SbShardLocks, 1);
        }
        self.lists[shard].lock()
    }

    fn lru_lock(&self, shard: usize) -> ShardGuard<'_, LruShard<F>> {
        self.lru_lock_with(&self.cache.counters(), shard)
    }

    /// [`SbInner::lru_lock`], counted on `c`.
    fn lru_lock_with(&self, c: &CpuCounters<'_>, shard: usize) -> ShardGuard<'_, LruShard<F>> {
        if self.cache.settings.lru == Lru::Single {
            c.add(Ctr::GlobalLocks, 1);
        } else {
            c.add(Ctr::LruShardLocks, 1);
        }
        self.lru[shard].list.lock()
    }

    /// The slot of `live` of the thread whose counters are `c` (the same slot), and
    /// whether it owns it (no other thread writes it).
    #[inline]
    fn live_slot_of(&self, c: &CpuCounters<'_>) -> (&AtomicUsize, bool) {
        (&self.slots[c.slot].live, c.own)
    }

    /// The LRU shard a last `iput` on `c`'s CPU adds to.
    fn lru_shard_of(&self, c: &CpuCounters<'_>) -> usize {
        if self.cache.settings.lru == Lru::Single {
            0
        } else {
            c.shard
        }
    }

    fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Whether the eviction of `inode` (on an LRU if `on_lru`) by the thread of `c` parks
    /// it: it is listed on another CPU's superblock list shard or LRU shard. Never with
    /// one shard, [`SbList::Global`] and [`Lru::Single`] (those lists have one shard).
    #[inline]
    fn evict_parks(&self, inode: &Inode<F>, on_lru: bool, c: &CpuCounters<'_>) -> bool {
        // One load of both shards; the common case (this CPU's) decides on it alone.
        let (sb_shard, lru_shard) = inode.shards();
        (sb_shard != c.shard && self.lists.len() > 1)
            || (on_lru && lru_shard != c.shard && self.lru.len() > 1)
    }

    /// Flushes every slot's outbox (each under its lock): afterwards no inode parked
    /// before this call is on the superblock's lists. Counted on the caller's counters.
    fn drain_outboxes(&self) {
        let c = self.cache.counters();
        {
            let pin = self.cache.domain.pin();
            for s in self.slots.iter() {
                c.add(Ctr::OutboxLocks, 1);
                let mut o = s.outbox.lock();
                if !o.items.is_empty() {
                    flush_parked(self, &mut o.items, &pin, &c);
                }
            }
        }
        reclaim_due();
    }

    /// The LRU shards' lengths, summed without a lock.
    fn lru_len(&self) -> usize {
        self.lru.iter().map(|l| l.len.load(Ordering::Relaxed)).sum()
    }
}

// ---------------------------------------------------------------------------------------
// Allocation, the superblock list, the hash chains.

/// `alloc_inode` + `inode_init_always`: `i_count` 1, `nlink` 1, no state.
fn alloc_inode<F: SuperOperations>(
    sb: &SbInner<F>,
    c: &CpuCounters<'_>,
    ino: u64,
    hashval: u64,
    data: F::Data,
) -> NonNull<Inode<F>> {
    match sb.live_slot_of(c) {
        // Only this thread writes its own slot (the decrement above is its own too).
        (l, true) => l.store(l.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed),
        (l, false) => {
            l.fetch_add(1, Ordering::Relaxed);
        }
    }
    let b = Box::new(Inode {
        ino,
        hashval,
        sb: sb.this,
        i_lock: ILock::new(),
        state: AtomicU32::new(0),
        count: AtomicU32::new(1),
        nlink: AtomicU32::new(1),
        hash_next: AtomicPtr::new(std::ptr::null_mut()),
        shards: AtomicU32::new(0),
        sb_index: AtomicU32::new(0),
        lru_prev: AtomicPtr::new(std::ptr::null_mut()),
        lru_next: AtomicPtr::new(std::ptr::null_mut()),
        data,
    });
    c.add(Ctr::NrInodes, 1);
    NonNull::from(Box::leak(b))
}

/// `destroy_inode` of an inode nobody else ever saw (lost the insert race).
fn destroy_unpublished<F: SuperOperations>(p: NonNull<Inode<F>>) {
    // SAFETY: `p` came from `alloc_inode` and was never published: this is the only pointer.
    let b = unsafe { Box::from_raw(p.as_ptr()) };
    let sb = b.sb();
    let p = catch_op(|| sb.ops.destroy_inode(&b));
    let c = sb.cache.counters();
    c.add(Ctr::NrInodes, -1);
    {
        // Quiet: a reclaim's panic must not skip the superblock's live count.
        let pin = sb.cache.domain.pin_quiet();
        sb_inode_gone(sb, &pin, &c);
    }
    resume(p);
}

/// `inode_sb_list_add`: onto the list of this CPU's shard (`c`'s).
fn inode_sb_list_add<F: SuperOperations>(inode: &Inode<F>, c: &CpuCounters<'_>) {
    let sb = inode.sb();
    let shard = if sb.cache.settings.sb_list == SbList::Global {
        0
    } else {
        c.shard
    };
    let mut l = sb.list_lock_with(c, shard);
    inode.set_sb_shard(shard as u32);
    let i = l.add(inode);
    let i = u32::try_from(i).unwrap_or_else(|_| panic!("more than 2^32 inodes on one superblock list shard"));
    inode.sb_index.store(i, Ordering::Relaxed);
}

/// `inode_sb_list_del`.
fn inode_sb_list_del<F: SuperOperations>(inode: &Inode<F>, c: &CpuCounters<'_>) {
    let sb = inode.sb();
    let mut l = sb.list_lock_with(c, inode.sb_shard());
    let i = inode.sb_index.load(Ordering::Relaxed) as usize;
    l.del(i, inode);
}

/// `hlist_add_head_rcu`: the caller holds the chain's lock and the inode's `i_lock`.
fn hash_link<F: SuperOperations>(cache: &CacheInner<F>, b: &Bucket<F>, inode: &Inode<F>) {
    debug_assert!(cache.hash_locked(b));
    inode
        .hash_next
        .store(b.first(Ordering::Relaxed), Ordering::Relaxed);
    // Release: a lock-free walker that loads the pointer sees the initialized inode.
    b.set_first(NonNull::from(inode).as_ptr());
    inode.set_bits(HASHED | WAS_HASHED);
}

/// `remove_inode_hash`.
pub(crate) fn remove_inode_hash<F: SuperOperations>(inode: &Inode<F>) {
    let cache = &*inode.sb().cache;
    let b = cache.bucket(inode.sb(), inode.hashval);
    let _h = cache.hash_lock(b);
    let _g = inode.lock();
    hash_unlink_locked(cache, b, inode);
}

/// `__remove_inode_hash`: unlinks `inode` from chain `b` if it is hashed. The caller
/// holds the chain's lock (or `inode_hash_lock`) and the inode's `i_lock`.
fn hash_unlink_locked<F: SuperOperations>(cache: &CacheInner<F>, b: &Bucket<F>, inode: &Inode<F>) {
    debug_assert!(inode.i_lock.is_locked());
    if inode.state.load(Ordering::Relaxed) & HASHED == 0 {
        return;
    }
    debug_assert!(cache.hash_locked(b));
    let me = NonNull::from(inode).as_ptr();
    // hlist_del_init_rcu: `hash_next` stays, so a walker standing on us goes on.
    let after = inode.hash_next.load(Ordering::Relaxed);
    let mut p = b.first(Ordering::Relaxed);
    if p == me {
        b.set_first(after);
    } else {
        loop {
            assert!(
                !p.is_null(),
                "remove_inode_hash: {} is not on its chain",
                inode.name()
            );
            // SAFETY: chain members are alive while we hold the chain lock (they are
            // unhashed under it before they are freed).
            let link = unsafe { &(*p).hash_next };
            let q = link.load(Ordering::Relaxed);
            if q == me {
                link.store(after, Ordering::Release);
                break;
            }
            p = q;
        }
    }
    inode.clear_bits(HASHED);
}

// ---------------------------------------------------------------------------------------
// Lookup.

/// `test` of `iget5_locked`/`ilookup5`; `Ino` compares `i_ino` with the hash value.
pub(crate) enum Test<F: SuperOperations> {
    Ino,
    Custom(TestFn<F>),
}

type TestFn<F> = Arc<dyn Fn(&Inode<F>) -> bool + Send + Sync>;

impl<F: SuperOperations> Clone for Test<F> {
    fn clone(&self) -> Self {
        match self {
            Test::Ino => Test::Ino,
            Test::Custom(f) => Test::Custom(f.clone()),
        }
    }
}

impl<F: SuperOperations> Test<F> {
    fn matches(&self, inode: &Inode<F>, hashval: u64) -> bool {
        match self {
            Test::Ino => inode.ino == hashval,
            Test::Custom(f) => f(inode),
        }
    }
}

/// How a new inode is made: `->alloc_inode`, or `iget5_locked`'s `set`.
pub(crate) enum Make<F: SuperOperations> {
    Alloc,
    Custom(Arc<dyn Fn() -> (u64, F::Data) + Send + Sync>),
}

impl<F: SuperOperations> Clone for Make<F> {
    fn clone(&self) -> Self {
        match self {
            Make::Alloc => Make::Alloc,
            Make::Custom(f) => Make::Custom(f.clone()),
        }
    }
}

enum Find<F: SuperOperations> {
    Absent,
    /// `I_CREATING`: `-ESTALE`.
    Creating,
    /// Registered to wait for the eviction of the inode at this address.
    Freeing(usize),
    /// With a reference; whether it was `I_NEW` when found (the flag is never set again).
    Found(InodeRef<F>, bool),
}

/// `find_inode`/`find_inode_fast`: walk the chain newest first. The caller is pinned or
/// holds the chain lock. `skip_freeing` is `insert_inode_locked`'s walk (it passes over
/// inodes being freed and never waits).
fn find_inode<F: SuperOperations>(
    sb: &SbInner<F>,
    b: &Bucket<F>,
    hashval: u64,
    test: &Test<F>,
    waiter: &mut Option<Arc<Waiter>>,
    skip_freeing: bool,
) -> Find<F> {
    'repeat: loop {
        let mut p = b.first(Ordering::Acquire);
        while let Some(n) = NonNull::new(p) {
            // SAFETY: reached from the chain while pinned or under its lock: the inode
            // is freed only a grace period after it left the chain.
            let inode = unsafe { n.as_ref() };
            p = inode.hash_next.load(Ordering::Acquire);
            if inode.sb != sb.this || inode.hashval != hashval || !test.matches(inode, hashval) {
                continue;
            }
            let g = inode.lock();
            let s = inode.state.load(Ordering::Relaxed);
            if s & (I_FREEING | I_WILL_FREE) != 0 {
                if skip_freeing {
                    continue;
                }
                if s & HASHED == 0 {
                    // evict() already unhashed it: nothing to wait for, look again.
                    drop(g);
                    continue 'repeat;
                }
                if waiter.is_none() {
                    // The waiter is made without `i_lock` held (no allocation under the
                    // spinlock); then look again.
                    drop(g);
                    *waiter = Some(Waiter::new());
                    continue 'repeat;
                }
                // __wait_on_freeing_inode: sleep until evict() unhashes it.
                let w = waiter.get_or_insert_with(Waiter::new);
                w.rearm();
                inode.set_bits(WAITERS);
                sb.cache.waits.register(inode.addr(), w);
                return Find::Freeing(inode.addr());
            }
            if s & I_CREATING != 0 {
                return Find::Creating;
            }
            return Find::Found(inode.iget_locked_ref(), s & I_NEW != 0);
        }
        return Find::Absent;
    }
}

/// What a walk of a chain found for an inode number (see [`chain_hit`]).
enum Hit<F: SuperOperations> {
    /// Hashed, neither `I_NEW`, `I_CREATING` nor being freed: a reference taken.
    Found(InodeRef<F>),
    /// Hashed and `I_NEW` (not `I_CREATING`, not being freed): a reference taken, as
    /// `find_inode` takes one before it waits; the caller settles it ([`settle_found`]).
    New(InodeRef<F>),
    /// The first match is in some other state: the full path decides (it may wait).
    Busy,
    /// No inode of this superblock has the number on the chain.
    Absent,
}

/// The walk of `iget_locked`/`ilookup` by inode number (`find_inode_fast`), without
/// building the operation that only a wait or a miss needs (that machinery was most of a
/// cached `stat`'s instructions): the first match decides; a hashed inode that is not
/// `I_CREATING` or being freed gets a reference under its `i_lock` (`__iget`), as
/// [`find_inode`] gives it. The caller is pinned (lock-free walk) or holds the chain's
/// lock; with [`Lookup::Locked`] the lock-free walk is not used (a miss would take the
/// hash lock once more, here and then in `run`, so that setting keeps the one path it
/// always had).
///
/// `Walk::Pinned`: a match seen `I_NEW` without the lock is first spun on read-only
/// ([`spin_while_new`]) before its `i_lock` is taken. In a cold walk two tasks meet on
/// the same misses, and the one that finds the other's inode `I_NEW` took `i_lock` and
/// the reference at once, writing the line the loader is still filling and is about to
/// write again (`unlock_new_inode`, its own `iput`): each such write moved the line
/// between the CPUs once more. The look under `i_lock` after the spin decides as before
/// (still `I_NEW` → [`Hit::New`], the caller spins or sleeps; unhashed or being freed →
/// [`Hit::Busy`]), so the lookup is the same as one that started later; the inode
/// stays valid while pinned, and the walk compared `i_sb` with `sb` before the spin uses
/// `sb`. Never under the chain lock (`Walk::Locked`): the spin would hold it.
fn chain_hit<F: SuperOperations>(sb: &SbInner<F>, b: &Bucket<F>, ino: u64, walk: Walk) -> Hit<F> {
    let mut p = b.first(Ordering::Acquire);
    while let Some(n) = NonNull::new(p) {
        // SAFETY: reached from the chain while pinned or under the chain lock (the
        // caller's): the inode is freed only a grace period after it left the chain.
        let inode = unsafe { n.as_ref() };
        p = inode.hash_next.load(Ordering::Acquire);
        if inode.sb != sb.this || inode.hashval != ino || inode.ino != ino {
            continue;
        }
        if walk == Walk::Pinned && inode.state.load(Ordering::Relaxed) & I_NEW != 0 {
            spin_while_new(sb, inode);
        }
        // The first match decides, as in `find_inode` (newest first).
        let _g = inode.lock();
        let s = inode.state.load(Ordering::Relaxed);
        if s & (I_CREATING | I_FREEING | I_WILL_FREE) != 0 || s & HASHED == 0 {
            return Hit::Busy;
        }
        let r = inode.iget_locked_ref();
        return if s & I_NEW != 0 {
            Hit::New(r)
        } else {
            Hit::Found(r)
        };
    }
    Hit::Absent
}

/// How [`chain_hit`]'s caller holds the chain.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// Pinned, without the chain lock (lock-free lookup).
    Pinned,
    /// Under the chain lock.
    Locked,
}

/// `ilookup`'s walk (see [`chain_hit`]); `Hit::Busy` or `Hit::Absent`: the caller takes
/// the full path, which looks again from the start (nothing was changed).
fn iget_hit<F: SuperOperations>(sb: &SbInner<F>, ino: u64) -> Hit<F> {
    let cache = &*sb.cache;
    if cache.settings.lookup != Lookup::Lockless {
        return Hit::Busy;
    }
    let b = cache.bucket(sb, ino);
    let _pin = cache.domain.pin();
    chain_hit(sb, b, ino, Walk::Pinned)
}

/// What [`iget_fast`] did.
enum Fast<F: SuperOperations> {
    /// The result.
    Done(Iget<F>),
    /// Found `I_NEW`, with a reference: settle it ([`settle_found`]).
    New(InodeRef<F>),
    /// The full path decides.
    Slow,
}

/// `iget_locked` by inode number without the operation machinery, for the common cases: a
/// cached hit or an `I_NEW` inode ([`chain_hit`]), and a miss (the pinned walk found no
/// inode with the number; allocate, take the chain lock, look again, and if there is
/// still none hash the new inode `I_NEW` and add it to the superblock list, exactly as
/// `run`'s miss does; if the look under the lock finds one, the new inode is destroyed
/// unpublished and the one found is used as `run` would). Anything else (`I_CREATING`, an
/// inode being freed) gives [`Fast::Slow`]: the caller takes the full path, which looks
/// again from the start.
fn iget_fast<F: SuperOperations>(sb: &SbInner<F>, ino: u64) -> Fast<F> {
    let cache = &*sb.cache;
    if cache.settings.lookup != Lookup::Lockless {
        return Fast::Slow;
    }
    let b = cache.bucket(sb, ino);
    {
        let _pin = cache.domain.pin();
        match chain_hit(sb, b, ino, Walk::Pinned) {
            Hit::Found(r) => return Fast::Done(Iget::Cached(r)),
            Hit::New(r) => return Fast::New(r),
            Hit::Busy => return Fast::Slow,
            Hit::Absent => {}
        }
    }
    let c = cache.counters();
    let new = alloc_inode(sb, &c, ino, ino, sb.ops.alloc_inode(ino));
    let h = cache.hash_lock_with(&c, b);
    // We released the lock, so..
    let again = chain_hit(sb, b, ino, Walk::Locked);
    if !matches!(again, Hit::Absent) {
        // Somebody inserted it since: use theirs.
        drop(h);
        destroy_unpublished(new);
        return match again {
            Hit::Found(r) => Fast::Done(Iget::Cached(r)),
            Hit::New(r) => Fast::New(r),
            _ => Fast::Slow,
        };
    }
    // SAFETY: just allocated; published below under the chain lock.
    let inode = unsafe { new.as_ref() };
    {
        let _g = inode.lock();
        inode.set_bits(I_NEW);
        hash_link(cache, b, inode);
    }
    inode_sb_list_add(inode, &c);
    drop(h);
    c.add(Ctr::Loads, 1);
    Fast::Done(Iget::New(NewInode::new(InodeRef { ptr: new })))
}

/// Whether chain `b` holds an inode of `sb` with this hash value and `i_ino`, in any
/// state. The caller holds the chain's lock.
fn chain_has<F: SuperOperations>(sb: &SbInner<F>, b: &Bucket<F>, hashval: u64, ino: u64) -> bool {
    debug_assert!(sb.cache.hash_locked(b));
    let mut p = b.first(Ordering::Acquire);
    while let Some(n) = NonNull::new(p) {
        // SAFETY: chain members are alive under the chain lock.
        let o = unsafe { n.as_ref() };
        if o.sb == sb.this && o.hashval == hashval && o.ino == ino {
            return true;
        }
        p = o.hash_next.load(Ordering::Acquire);
    }
    false
}

/// `insert_inode_locked` (by inode number) when no inode of the superblock has the
/// number on the chain: hash it `I_NEW | I_CREATING` under the chain lock, as `run`'s
/// insert does, without the operation machinery. `Err` gives the inode back untouched
/// when the chain holds one with the number (in any state: live → `EBUSY`, `I_NEW` → wait,
/// being freed → passed over): the full path decides.
///
/// # Panics
/// If the inode was hashed before (as the full path).
fn insert_fast<F: SuperOperations>(sb: &SbInner<F>, inode: InodeRef<F>) -> Result<NewInode<F>, InodeRef<F>> {
    let cache = &*sb.cache;
    let hashval = inode.hashval;
    let b = cache.bucket(sb, hashval);
    let c = cache.counters();
    let h = cache.hash_lock_with(&c, b);
    if chain_has(sb, b, hashval, hashval) {
        drop(h);
        return Err(inode);
    }
    {
        let _g = inode.lock();
        if inode.state.load(Ordering::Relaxed) & WAS_HASHED != 0 {
            drop(_g);
            drop(h);
            panic!("insert_inode_locked: {} was hashed before", inode.name());
        }
        inode.set_bits(I_NEW | I_CREATING);
        hash_link(cache, b, &inode);
    }
    drop(h);
    c.add(Ctr::Loads, 1);
    Ok(NewInode::new(inode))
}

/// What a lookup operation is, kept by a waiting one to try again.
pub(crate) enum Op<F: SuperOperations> {
    Iget {
        hashval: u64,
        test: Test<F>,
        make: Make<F>,
    },
    Lookup {
        hashval: u64,
        test: Test<F>,
    },
    Insert {
        inode: Option<InodeRef<F>>,
        test: Test<F>,
    },
}

/// The result of a lookup operation (internal to [`FromOutcome`]).
#[doc(hidden)]
pub enum Outcome<F: SuperOperations> {
    /// `iget_locked`.
    Iget(Option<Iget<F>>),
    /// `ilookup`.
    Lookup(Option<InodeRef<F>>),
    /// `insert_inode_locked`.
    Insert(Result<NewInode<F>, InsertBusy<F>>),
}

enum Attempt<F: SuperOperations> {
    Done(Outcome<F>),
    Freeing(usize),
    New(InodeRef<F>),
}

/// How many times a lookup that found an `I_NEW` inode looks at its state again before it
/// registers in the wait table and blocks. A load in a cache-hot filesystem lasts a few
/// hundred nanoseconds, a registration (a wait-table bucket lock, a waiter, the
/// superblock handle a wait keeps) and its wake-up far more; the loader is most likely
/// running (it inserted the inode just before), as Linux's mutexes bet when they spin on
/// a running owner. Bounded: a loader that is descheduled or does I/O costs a spinner
/// at most this many `spin_loop`s (a few microseconds) before it blocks. Under the
/// models: one look (with a yield), so they explore both a wait that ends in the spin and
/// one that registers.
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
const NEW_SPINS: u32 = 256;
#[cfg(any(vfscale_loom, vfscale_shuttle))]
const NEW_SPINS: u32 = 1;

/// The optimistic spin of a lookup that found `r` `I_NEW` (it holds a reference): looks at
/// `i_state` without a lock until `I_NEW` is clear, at most [`NEW_SPINS`] times. `true`:
/// the load ended; the Acquire load that saw `I_NEW` clear synchronizes with the
/// loader's Release store that cleared it (`end_new`, under `i_lock`), so everything the
/// loader wrote before is visible (no waiter sees a half-loaded inode), and so is an
/// unhash that `iget_failed` did before it (the caller checks `HASHED` next). `false`:
/// still `I_NEW`; the caller registers under `i_lock` (which looks again).
fn spin_while_new<F: SuperOperations>(sb: &SbInner<F>, r: &Inode<F>) -> bool {
    for _ in 0..NEW_SPINS {
        // Under the models the look comes after the yield, so that the loader can end
        // the load between the lookup that found it I_NEW and the look.
        #[cfg(vfscale_loom)]
        loom::thread::yield_now();
        #[cfg(all(vfscale_shuttle, not(vfscale_loom)))]
        shuttle::thread::yield_now();
        if r.state.load(Ordering::Acquire) & I_NEW == 0 {
            sb.cache.counters().add(Ctr::NewWaitsSpun, 1);
            return true;
        }
        #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
        std::hint::spin_loop();
    }
    false
}

/// How a lookup met the inode it settles.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// Found without `I_NEW` (never set again once clear).
    Plain,
    /// Found `I_NEW`: spin on it, then register if still `I_NEW`.
    New,
    /// Woken from a wait on it: look under `i_lock` (no spin).
    Woken,
}

impl Seen {
    fn found(new: bool) -> Seen {
        if new {
            Seen::New
        } else {
            Seen::Plain
        }
    }
}

/// A found inode: wait while it is `I_NEW`; then an unhashed one is put and the
/// operation starts over (`iget_locked`, `ilookup`, `insert_inode_locked` all do this).
fn settle_found<F: SuperOperations>(
    sb: &SbInner<F>,
    op: &mut Op<F>,
    r: InodeRef<F>,
    seen: Seen,
    waiter: &mut Option<Arc<Waiter>>,
) -> Attempt<F> {
    // I_NEW is set only before an inode is published, so one found without it needs no
    // second look under `i_lock`. One found I_NEW is spun on first.
    let settled = match seen {
        Seen::Plain => true,
        Seen::New => spin_while_new(sb, &r),
        Seen::Woken => false,
    };
    if !settled {
        // The waiter is made before `i_lock` is taken, so that no allocation runs under
        // the spinlock; if the inode settled meanwhile it is kept for a later wait.
        let w = waiter.get_or_insert_with(Waiter::new);
        let _g = r.lock();
        if r.state.load(Ordering::Relaxed) & I_NEW != 0 {
            w.rearm();
            r.set_bits(WAITERS);
            sb.cache.waits.register(r.addr(), w);
            drop(_g);
            sb.cache.counters().add(Ctr::NewWaitsSlept, 1);
            return Attempt::New(r);
        }
    }
    if !r.is_hashed() {
        drop(r);
        return run(sb, op, waiter);
    }
    Attempt::Done(match op {
        Op::Iget { .. } => Outcome::Iget(Some(Iget::Cached(r))),
        Op::Lookup { .. } => Outcome::Lookup(Some(r)),
        Op::Insert { inode, .. } => {
            drop(r);
            Outcome::Insert(Err(InsertBusy {
                inode: inode.take().expect("insert holds its inode"),
            }))
        }
    })
}

/// Runs an operation from the start.
fn run<F: SuperOperations>(sb: &SbInner<F>, op: &mut Op<F>, waiter: &mut Option<Arc<Waiter>>) -> Attempt<F> {
    let cache = &*sb.cache;
    match op {
        Op::Iget { hashval, test, make } => {
            let (hashval, test, make) = (*hashval, test.clone(), make.clone());
            let b = cache.bucket(sb, hashval);
            let first = match cache.settings.lookup {
                Lookup::Lockless => {
                    let _p = cache.domain.pin();
                    find_inode(sb, b, hashval, &test, waiter, false)
                }
                Lookup::Locked => {
                    let _h = cache.hash_lock(b);
                    find_inode(sb, b, hashval, &test, waiter, false)
                }
            };
            match first {
                Find::Creating => return Attempt::Done(Outcome::Iget(None)),
                Find::Freeing(a) => return Attempt::Freeing(a),
                Find::Found(r, new) => return settle_found(sb, op, r, Seen::found(new), waiter),
                Find::Absent => {}
            }
            let (ino, data) = match make {
                Make::Alloc => (hashval, sb.ops.alloc_inode(hashval)),
                Make::Custom(f) => f(),
            };
            let c = cache.counters();
            let new = alloc_inode(sb, &c, ino, hashval, data);
            let h = cache.hash_lock_with(&c, b);
            // We released the lock, so..
            match find_inode(sb, b, hashval, &test, waiter, false) {
                Find::Absent => {
                    // SAFETY: just allocated; published below under the chain lock.
                    let inode = unsafe { new.as_ref() };
                    {
                        let _g = inode.lock();
                        inode.set_bits(I_NEW);
                        hash_link(cache, b, inode);
                    }
                    inode_sb_list_add(inode, &c);
                    drop(h);
                    c.add(Ctr::Loads, 1);
                    Attempt::Done(Outcome::Iget(Some(Iget::New(NewInode::new(InodeRef {
                        ptr: new,
                    })))))
                }
                other => {
                    // Somebody else created it under us: use theirs.
                    drop(h);
                    destroy_unpublished(new);
                    match other {
                        Find::Creating => Attempt::Done(Outcome::Iget(None)),
                        Find::Freeing(a) => Attempt::Freeing(a),
                        Find::Found(r, new) => settle_found(sb, op, r, Seen::found(new), waiter),
                        Find::Absent => unreachable!(),
                    }
                }
            }
        }
        Op::Lookup { hashval, test } => {
            let (hashval, test) = (*hashval, test.clone());
            let b = cache.bucket(sb, hashval);
            let f = match cache.settings.lookup {
                Lookup::Lockless => {
                    let _p = cache.domain.pin();
                    find_inode(sb, b, hashval, &test, waiter, false)
                }
                Lookup::Locked => {
                    let _h = cache.hash_lock(b);
                    find_inode(sb, b, hashval, &test, waiter, false)
                }
            };
            match f {
                Find::Absent | Find::Creating => Attempt::Done(Outcome::Lookup(None)),
                Find::Freeing(a) => Attempt::Freeing(a),
                Find::Found(r, new) => settle_found(sb, op, r, Seen::found(new), waiter),
            }
        }
        Op::Insert { inode, test } => {
            let test = test.clone();
            let me = inode.as_ref().expect("insert holds its inode");
            let hashval = me.hashval;
            let b = cache.bucket(sb, hashval);
            let h = cache.hash_lock(b);
            let old = {
                let mut p = b.first(Ordering::Acquire);
                let mut found = None;
                while let Some(n) = NonNull::new(p) {
                    // SAFETY: chain members are alive under the chain lock.
                    let o = unsafe { n.as_ref() };
                    p = o.hash_next.load(Ordering::Acquire);
                    if o.sb != sb.this || o.hashval != hashval || !test.matches(o, hashval) {
                        continue;
                    }
                    let g = o.lock();
                    if o.state.load(Ordering::Relaxed) & (I_FREEING | I_WILL_FREE) != 0 {
                        continue;
                    }
                    found = Some((o, g));
                    break;
                }
                found
            };
            match old {
                None => {
                    {
                        let _g = me.lock();
                        let s = me.state.load(Ordering::Relaxed);
                        if s & WAS_HASHED != 0 {
                            drop(_g);
                            drop(h);
                            panic!("insert_inode_locked: {} was hashed before", me.name());
                        }
                        me.set_bits(I_NEW | I_CREATING);
                        hash_link(cache, b, me);
                    }
                    drop(h);
                    cache.counters().add(Ctr::Loads, 1);
                    let r = inode.take().expect("held");
                    Attempt::Done(Outcome::Insert(Ok(NewInode::new(r))))
                }
                Some((o, g)) => {
                    if o.state.load(Ordering::Relaxed) & I_CREATING != 0 {
                        drop(g);
                        drop(h);
                        return Attempt::Done(Outcome::Insert(Err(InsertBusy {
                            inode: inode.take().expect("held"),
                        })));
                    }
                    let new = o.state.load(Ordering::Relaxed) & I_NEW != 0;
                    let r = o.iget_locked_ref();
                    drop(g);
                    drop(h);
                    settle_found(sb, op, r, Seen::found(new), waiter)
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// iput, the LRU, eviction.

/// `iput`.
pub(crate) fn iput<F: SuperOperations>(p: NonNull<Inode<F>>) {
    // SAFETY: the caller gives up one counted reference: alive until it is given up.
    let inode = unsafe { p.as_ref() };
    // atomic_add_unless(&i_count, -1, 1): not the last reference, no lock.
    let mut c = inode.count.load(Ordering::Relaxed);
    while c > 1 {
        match inode
            .count
            .compare_exchange_weak(c, c - 1, Ordering::Release, Ordering::Relaxed)
        {
            Ok(_) => return,
            Err(x) => c = x,
        }
    }
    // Most likely the last reference. An inode that will most likely stay cached (linked,
    // hashed, not on an LRU yet, superblock active: what a create or a load leaves) goes
    // onto this CPU's LRU shard: take that lock first (lock order LRU → i_lock), so
    // `iput_final` adds it under the one `i_lock` hold that decides, instead of dropping
    // `i_lock` and taking both again. A racy guess: `iput_final` decides under `i_lock`
    // as always and only uses the lock if it keeps the inode.
    // Likewise an inode that will most likely be evicted (unlinked, unhashed, ...) while
    // it is on this CPU's LRU shard: take that lock first (`lru_shard`, read racily and
    // checked under both locks), so the eviction takes it off under the same hold. One on
    // another CPU's shard stays there until a batch takes it off (`evict_with`).
    // This CPU's counters are looked up only when an LRU lock is taken (a cached hit's
    // last `iput`, already on an LRU, needs none).
    let sb = inode.sb();
    let lru = match lru_likely(inode, sb) {
        LruGuess::Add => {
            let c = sb.cache.counters();
            Some((sb.lru_shard_of(&c), c))
        }
        LruGuess::Del => {
            // Only this CPU's LRU shard: an inode on another's is evicted without that
            // lock, and parked (`evict_with`).
            let c = sb.cache.counters();
            let shard = inode.lru_shard();
            (shard == sb.lru_shard_of(&c)).then_some((shard, c))
        }
        LruGuess::None => None,
    }
    .map(|(shard, c)| (shard, sb.lru_lock_with(&c, shard), c));
    let g = inode.lock();
    let prev = inode.count.fetch_sub(1, Ordering::AcqRel);
    assert!(prev != 0, "iput: {} has no reference to put", inode.name());
    if prev != 1 {
        return;
    }
    iput_final(inode, g, lru);
}

/// What a last `iput` will most likely do with an LRU (a racy look at the generic drop
/// rule, for [`iput`]'s choice of locks only).
enum LruGuess {
    /// Keep the inode, and add it to this CPU's LRU shard.
    Add,
    /// Evict the inode, and take it off the LRU shard it is on.
    Del,
    /// Neither (already on an LRU and kept; or evicted and on none).
    None,
}

fn lru_likely<F: SuperOperations>(inode: &Inode<F>, sb: &SbInner<F>) -> LruGuess {
    let s = inode.state.load(Ordering::Relaxed);
    if s & (I_NEW | I_FREEING | I_WILL_FREE) != 0 {
        return LruGuess::None;
    }
    let evict =
        s & (HASHED | I_DONTCACHE) != HASHED || inode.nlink.load(Ordering::Relaxed) == 0 || !sb.is_active();
    match (evict, s & ON_LRU != 0) {
        (false, false) => LruGuess::Add,
        (true, true) => LruGuess::Del,
        _ => LruGuess::None,
    }
}

/// The LRU shard (and its lock) a last `iput` took before `i_lock`, with this CPU's
/// counters (what it counts under that lock on).
type LruHeld<'a, F> = Option<(usize, ShardGuard<'a, LruShard<F>>, CpuCounters<'a>)>;

/// `iput_final`: the last reference went; the caller holds `i_lock`, and maybe this
/// CPU's LRU shard lock, taken before it (`lru`, with this CPU's counters).
fn iput_final<'a, F: SuperOperations>(inode: &'a Inode<F>, g: ILockGuard<'_>, lru: LruHeld<'a, F>) {
    let s = inode.state.load(Ordering::Relaxed);
    if s & I_NEW != 0 {
        drop(g);
        drop(lru);
        panic!(
            "iput: the last reference to {} was put while it is I_NEW (end the load with \
             unlock_new_inode, discard_new_inode or iget_failed first)",
            inode.name()
        );
    }
    let sb = inode.sb();
    let drop_it = sb.ops.drop_inode(inode);
    if !drop_it && s & I_DONTCACHE == 0 && sb.is_active() {
        // __inode_add_lru(inode, true)
        if s & ON_LRU != 0 {
            inode.set_bits(I_REFERENCED);
            return;
        }
        if let Some((shard, mut l, c)) = lru {
            // Both locks held since the decision: add it now.
            lru_add_locked(sb, &c, shard, &mut l, inode);
            return;
        }
        // Lock order is LRU -> i_lock: retake them in that order. Stay pinned so that a
        // concurrent eviction cannot free the inode under us (quiet: under `i_lock`, and
        // the inode is not on its LRU yet).
        let pin = sb.cache.domain.pin_quiet();
        drop(g);
        inode_lru_list_add(inode);
        drop(pin);
        return;
    }
    if let Some((shard, mut l, c)) = lru {
        if drop_it && s & ON_LRU != 0 && l.owns(inode) {
            // `iput_evict` with the inode's LRU lock held since before `i_lock` (no
            // `->write_inode`: dropped): I_FREEING and off the LRU under one hold.
            debug_assert!(s & (I_FREEING | I_WILL_FREE) == 0);
            inode.set_bits(I_FREEING);
            l.del(inode);
            sb.lru[shard].len.store(l.len, Ordering::Relaxed);
            inode.clear_bits(ON_LRU);
            c.add(Ctr::NrUnused, -1);
            drop(l);
            drop(g);
            evict_with(inode, &c);
            return;
        }
    }
    // The eviction takes the inode's LRU shard lock (if it is on one) after dropping
    // `i_lock`: never hold one across.
    iput_evict(inode, g, drop_it);
}

/// The end of `iput_final` that evicts: the caller holds `i_lock` (`g`), `i_count` is 0
/// and the inode is not being freed; from here it is ours (`I_WILL_FREE`, then
/// `I_FREEING`: `evict_inodes` and the shrinker pass over it). `->write_inode` first
/// unless `->drop_inode` said drop.
fn iput_evict<F: SuperOperations>(inode: &Inode<F>, g: ILockGuard<'_>, drop_it: bool) {
    debug_assert!(inode.count.load(Ordering::Relaxed) == 0);
    debug_assert!(inode.state.load(Ordering::Relaxed) & (I_FREEING | I_WILL_FREE) == 0);
    let sb = inode.sb();
    let mut g = g;
    let mut p = None;
    if !drop_it {
        inode.set_bits(I_WILL_FREE);
        drop(g);
        p = catch_op(|| sb.ops.write_inode(inode));
        g = inode.lock();
        inode.clear_bits(I_WILL_FREE);
    }
    inode.set_bits(I_FREEING);
    drop(g);
    // `evict` takes it off the LRU (now, or in a batch).
    evict(inode);
    resume(p);
}

/// `__inode_add_lru` after `iput_final` dropped `i_lock`: checks again under both locks.
fn inode_lru_list_add<F: SuperOperations>(inode: &Inode<F>) {
    let sb = inode.sb();
    let c = sb.cache.counters();
    let shard = sb.lru_shard_of(&c);
    let mut l = sb.lru_lock_with(&c, shard);
    let g = inode.lock();
    let s = inode.state.load(Ordering::Relaxed);
    if inode.count.load(Ordering::Relaxed) != 0 || s & (I_FREEING | I_WILL_FREE) != 0 {
        // Taken again (its last iput decides), or someone else is evicting it.
        return;
    }
    if !sb.is_active() {
        // An umount cleared SB_ACTIVE since iput_final looked: decide as iput_final
        // would now (never leave an unused inode neither on the LRU nor evicted).
        // `evict_inodes` passes over it once it is I_WILL_FREE/I_FREEING.
        drop(l);
        iput_evict(inode, g, false);
        return;
    }
    if s & ON_LRU != 0 {
        inode.set_bits(I_REFERENCED);
        return;
    }
    lru_add_locked(sb, &c, shard, &mut l, inode);
}

/// `list_lru_add` of an unused inode on no LRU: the caller holds LRU shard `shard`'s lock
/// (`l`) and the inode's `i_lock`; `c` is this CPU's counters.
fn lru_add_locked<F: SuperOperations>(
    sb: &SbInner<F>,
    c: &CpuCounters<'_>,
    shard: usize,
    l: &mut LruShard<F>,
    inode: &Inode<F>,
) {
    debug_assert!(inode.i_lock.is_locked());
    debug_assert!(inode.state.load(Ordering::Relaxed) & ON_LRU == 0);
    l.add_tail(inode);
    sb.lru[shard].len.store(l.len, Ordering::Relaxed);
    inode.set_bits(ON_LRU);
    c.add(Ctr::NrUnused, 1);
}

/// `inode_lru_list_del` of an inode the caller is evicting (`I_FREEING`), counted on `c`:
/// if it is still on its LRU (a prune may have taken it off), under that shard's lock
/// and `i_lock`. Out of line: an unlink's last `iput` takes the inode off this CPU's LRU
/// itself, before `i_lock` (`iput_final`).
#[inline(never)]
fn inode_lru_list_del<F: SuperOperations>(inode: &Inode<F>, c: &CpuCounters<'_>) {
    let sb = inode.sb();
    let shard = inode.lru_shard();
    let mut l = sb.lru_lock_with(c, shard);
    lru_del_evicting(&mut l, inode, c);
    sb.lru[shard].len.store(l.len, Ordering::Relaxed);
}

/// Takes an inode being evicted off its LRU shard (whose lock the caller holds: `l`)
/// if it is still on it, under its `i_lock`; `nr_unused` drops unless the inode was
/// counted out when it was parked. The caller updates the shard's length mirror.
fn lru_del_evicting<F: SuperOperations>(l: &mut LruShard<F>, inode: &Inode<F>, c: &CpuCounters<'_>) {
    let _g = inode.lock();
    let s = inode.state.load(Ordering::Relaxed);
    debug_assert!(s & I_FREEING != 0);
    if s & ON_LRU != 0 {
        l.del(inode);
        inode.clear_bits(ON_LRU);
        if s & PARKED == 0 {
            c.add(Ctr::NrUnused, -1);
        }
    }
}

/// A panic's payload, held while an eviction finishes.
type Panic = Box<dyn std::any::Any + Send>;

/// Runs one of the filesystem's operations inside an eviction (`->write_inode`,
/// `->evict_inode`, `->destroy_inode`). A panic is caught and returned: the eviction
/// finishes first (unhashed, waiters woken, memory and superblock count given back) and
/// resumes it at its end. Let through, it left the inode `I_WILL_FREE` or `I_FREEING`
/// and hashed, and every later lookup of it waited for ever.
fn catch_op(op: impl FnOnce()) -> Option<Panic> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(op)).err()
}

/// Resumes the first panic `catch_op` caught, if any.
fn resume(p: Option<Panic>) {
    if let Some(e) = p {
        std::panic::resume_unwind(e);
    }
}

/// Evicts every inode of `dispose` (each `I_FREEING`, the caller's), as `dispose_list`
/// does. A panic in one (a retired box's `Drop` in the reclaim after it, or the
/// filesystem's own operations) does not stop the others: the first panic is returned,
/// for the caller to resume once its own work is done, so that no inode of the list is
/// left `I_FREEING` and never evicted.
#[must_use]
fn evict_each<F: SuperOperations>(dispose: impl IntoIterator<Item = InodePtr<F>>) -> Option<Panic> {
    let mut first = None;
    let mut rest = dispose.into_iter();
    // One unwind boundary for the whole list (not one per inode, which costs the loop its
    // inlining): after a panic the loop goes on with the inode after the one that panicked
    // (`by_ref` took it already).
    while let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for p in rest.by_ref() {
            // SAFETY: the caller set I_FREEING on it: it is ours to evict.
            evict(unsafe { p.get() });
        }
    })) {
        first.get_or_insert(e);
    }
    first
}

/// `evict`: the inode is `I_FREEING` and the caller owns it (maybe still on an LRU).
fn evict<F: SuperOperations>(inode: &Inode<F>) {
    evict_with(inode, &inode.sb().cache.counters());
}

/// [`evict`], counted on this CPU's counters `c`.
///
/// An inode listed on this CPU's shards (superblock list, and LRU if it is on one) is
/// taken off them first, as Linux's `evict` does. One on another CPU's is not: see
/// [`evict_parked`].
fn evict_with<F: SuperOperations>(inode: &Inode<F>, c: &CpuCounters<'_>) {
    // Racy but exact enough: this thread set I_FREEING (and read ON_LRU) under `i_lock`
    // before, and ON_LRU is never set again; a prune may clear it meanwhile, which each
    // taker checks again under the LRU lock and `i_lock`.
    let on_lru = inode.state.load(Ordering::Relaxed) & ON_LRU != 0;
    debug_assert!(inode.state.load(Ordering::Relaxed) & I_FREEING != 0);
    let sb = inode.sb();
    if sb.evict_parks(inode, on_lru, c) {
        evict_parked(inode, c);
        return;
    }
    if on_lru {
        inode_lru_list_del(inode, c);
    }
    inode_sb_list_del(inode, c);
    let p = evict_clear::<F, false>(inode, c);
    destroy_inode(inode, c);
    resume(p);
}

/// The eviction of an inode listed on another CPU's superblock list shard or LRU shard
/// (out of line: the path of an inode on this CPU's keeps its size). It does at once all
/// that anyone can observe (`->evict_inode`; `I_CLEAR`, unhashed and the waiters woken;
/// `->destroy_inode`; `nr_inodes` and `nr_unused`), and then parks the inode in this
/// slot's outbox, still linked but `I_FREEING`, which every walker of those lists passes
/// over; a batch takes it off them later and frees it ([`park`]; the crate docs,
/// "Batched removal").
#[inline(never)]
fn evict_parked<F: SuperOperations>(inode: &Inode<F>, c: &CpuCounters<'_>) {
    let p = evict_clear::<F, true>(inode, c);
    let q = catch_op(|| inode.sb().ops.destroy_inode(inode));
    c.add(Ctr::NrInodes, -1);
    park(inode.sb(), inode, c);
    resume(p.or(q));
}

/// `evict`'s middle: `->evict_inode`, then `clear_inode` (I_CLEAR), `remove_inode_hash`
/// and the wake-up of the lookups waiting for the eviction (`__wait_on_freeing_inode`).
/// Linux takes `i_lock` for each of the three; here one hold under the chain lock does
/// all three (nobody can tell them apart: the inode is I_FREEING throughout, and a
/// waiter registers under `i_lock` only while it sees the inode hashed, so it is either
/// in the waiters taken here or sees it unhashed and looks again). `PARKS`: the inode
/// will be parked; the same hold marks it `PARKED` and counts it out of `nr_unused` if
/// it is still on an LRU.
#[inline(always)]
///
/// Returns a panic of `->evict_inode`, for the caller to resume once the eviction is done
/// ([`catch_op`]).
#[must_use]
fn evict_clear<F: SuperOperations, const PARKS: bool>(
    inode: &Inode<F>,
    c: &CpuCounters<'_>,
) -> Option<Panic> {
    let sb = inode.sb();
    let panicked = catch_op(|| sb.ops.evict_inode(inode));
    let w = {
        let cache = &*sb.cache;
        let b = cache.bucket(sb, inode.hashval);
        let _h = cache.hash_lock_with(c, b);
        let _g = inode.lock();
        inode.set_bits(I_CLEAR);
        hash_unlink_locked(cache, b, inode);
        if PARKS {
            if inode.state.load(Ordering::Relaxed) & ON_LRU != 0 {
                c.add(Ctr::NrUnused, -1);
            }
            inode.set_bits(PARKED);
        }
        inode.take_waiters()
    };
    if w {
        sb.cache.waits.wake_all(inode.addr());
    }
    panicked
}

/// `destroy_inode` of an inode off every list: `->destroy_inode` and `nr_inodes` (Linux's
/// `__destroy_inode`) now, the memory a grace period later ([`free_inode`]); `c` is this
/// CPU's counters.
///
/// Reclaim panics: the eviction's last step. Its pin is quiet and its free queued
/// without freeing; a reclaim then runs once all of it is done ([`reclaim_due`]), so a
/// retired box's `Drop` that panics unwinds from a finished eviction, not from one that
/// lost its free or its superblock's live count.
fn destroy_inode<F: SuperOperations>(inode: &Inode<F>, c: &CpuCounters<'_>) {
    let p = catch_op(|| inode.sb().ops.destroy_inode(inode));
    c.add(Ctr::NrInodes, -1);
    {
        let pin = inode.sb().cache.domain.pin_quiet();
        free_inode(inode, &pin, c);
    }
    reclaim_due();
    resume(p);
}

/// `destroy_inode`'s end, once the inode is off every list: its memory a grace period
/// later, and its superblock's live count (`pin` is held since before this call). Frees
/// nothing itself: the caller runs [`reclaim_due`] when its own work is done.
#[inline(always)]
fn free_inode<F: SuperOperations>(inode: &Inode<F>, pin: &Guard, c: &CpuCounters<'_>) {
    let sb = inode.sb();
    let p = NonNull::from(inode).as_ptr();
    // SAFETY: the inode is off every list and chain, nobody holds a reference, and
    // walkers that may still see its pointer are pinned: the box (from `alloc_inode`'s
    // `Box::leak`) is freed after them.
    unsafe { pin.defer_free_box_quiet(p) };
    // The inode's last use of its superblock (which may be freed a grace period later).
    sb_inode_gone(sb, pin, c);
}

/// Parks an evicted inode (see [`evict_with`]) in the outbox of `c`'s slot; a full outbox
/// is flushed at once. On an inactive superblock nothing is parked: the inode is taken
/// off its lists and freed now. `SB_ACTIVE` is read under the outbox lock, and `umount`
/// clears it before it drains every outbox under its lock, so either the drain finds the
/// inode or this sees `SB_ACTIVE` clear (loom model `umount_races_remote_park`): no
/// inode is parked after an umount's drain, and none keeps an unmounted superblock.
fn park<F: SuperOperations>(sb: &SbInner<F>, inode: &Inode<F>, c: &CpuCounters<'_>) {
    park_quiet(sb, inode, c);
    // The eviction's last step is done (and the outbox unlocked): now the frees a full
    // batch left (a panicking `Drop` unwinds from here, see `destroy_inode`).
    reclaim_due();
}

/// [`park`] without its reclaim: parks (or, unmounted, frees) the inode, flushing a full
/// outbox, and frees nothing itself.
fn park_quiet<F: SuperOperations>(sb: &SbInner<F>, inode: &Inode<F>, c: &CpuCounters<'_>) {
    // Pinned across the flush, and dropped after the outbox guard (declared first): the
    // flush frees inodes and may end the superblock's live count. Quiet: nothing is
    // freed while an inode is half parked or half flushed.
    let pin = sb.cache.domain.pin_quiet();
    c.add(Ctr::OutboxLocks, 1);
    let mut o = sb.slots[c.slot].outbox.lock();
    let mut p = InodePtr(NonNull::from(inode));
    if !sb.is_active() {
        drop(o);
        unlist_parked(sb, std::slice::from_mut(&mut p), c);
        free_inode(inode, &pin, c);
        return;
    }
    if o.items.capacity() == 0 {
        o.items.reserve_exact(OUTBOX);
    }
    o.items.push(p);
    if o.items.len() >= OUTBOX {
        flush_parked(sb, &mut o.items, &pin, c);
    }
}

/// Takes parked inodes off their superblock list shards and LRU shards: one hold of each
/// shard's lock for all of its inodes. An inode a prune took off its LRU meanwhile (it
/// met it `I_FREEING`) is left alone there; `nr_unused` is not touched (it was counted
/// out at the park). Lock order: (the caller's outbox lock →) superblock list shard;
/// then LRU shard → `i_lock`.
fn unlist_parked<F: SuperOperations>(sb: &SbInner<F>, items: &mut [InodePtr<F>], c: &CpuCounters<'_>) {
    // SAFETY (every `get` below): a parked inode is alive until `free_inode`, which runs
    // after this, and it is ours (its evictor's, or a drain's under the outbox lock).
    let get = |p: &InodePtr<F>| unsafe { p.get() };
    items.sort_unstable_by_key(|p| get(p).sb_shard());
    for run in items.chunk_by(|a, b| get(a).sb_shard() == get(b).sb_shard()) {
        let mut l = sb.list_lock_with(c, get(&run[0]).sb_shard());
        for p in run {
            let inode = get(p);
            l.del(inode.sb_index.load(Ordering::Relaxed) as usize, inode);
        }
    }
    items.sort_unstable_by_key(|p| get(p).lru_shard());
    for run in items.chunk_by(|a, b| get(a).lru_shard() == get(b).lru_shard()) {
        // Acquire: an ON_LRU seen clear was cleared by a prune under the LRU lock after it
        // unlinked the inode (`clear_bits` is a Release store): its writes to the inode up
        // to that store come before the free. Its last one, the release of the inode's
        // `i_lock`, comes after it: the prune is pinned (`prune_shard`), so the free waits
        // for it. ON_LRU is never set again on an inode being freed.
        if !run
            .iter()
            .any(|p| get(p).state.load(Ordering::Acquire) & ON_LRU != 0)
        {
            continue;
        }
        let shard = get(&run[0]).lru_shard();
        let mut l = sb.lru_lock_with(c, shard);
        for p in run {
            lru_del_evicting(&mut l, get(p), c);
        }
        sb.lru[shard].len.store(l.len, Ordering::Relaxed);
    }
}

/// Flushes an outbox (the caller holds its lock; `pin` is held since before): takes its
/// inodes off their lists and frees them.
fn flush_parked<F: SuperOperations>(
    sb: &SbInner<F>,
    items: &mut Vec<InodePtr<F>>,
    pin: &Guard,
    c: &CpuCounters<'_>,
) {
    unlist_parked(sb, items, c);
    for p in items.drain(..) {
        // SAFETY: parked, now off every list: ours to free.
        free_inode(unsafe { p.get() }, pin, c);
    }
}

/// A shard's share of a scan of `nr_to_scan` over shards of `total` inodes: in proportion
/// to its `len`, rounded up, at most the `left` of the scan. In u128: `nr_to_scan` may be
/// anything up to `usize::MAX` ("scan all"), whose product with a length overflows.
fn scan_share(nr_to_scan: usize, len: usize, total: usize, left: usize) -> usize {
    debug_assert!(total > 0);
    (nr_to_scan as u128 * len as u128)
        .div_ceil(total as u128)
        .min(left as u128) as usize
}

/// `list_lru_walk_one` with `inode_lru_isolate` over one LRU shard.
///
/// Pinned (the guard outlives the LRU lock and every `i_lock` it takes): a parked inode
/// (evicted, its removal from this shard batched in another CPU's outbox) whose ON_LRU
/// it clears may be freed by that outbox's flush as soon as the flush sees ON_LRU clear,
/// without the flush taking the inode's `i_lock` (`unlist_parked`); the prune's release
/// of that `i_lock` comes after, and the pin keeps the inode's memory until then.
fn prune_shard<F: SuperOperations>(
    sb: &SbInner<F>,
    shard: usize,
    mut budget: usize,
    dispose: &mut Vec<InodePtr<F>>,
) -> usize {
    let _pin = sb.cache.domain.pin_quiet();
    let mut l = sb.lru_lock(shard);
    let mut freed = 0;
    let mut cur = l.head;
    while let Some(p) = cur {
        if budget == 0 {
            break;
        }
        budget -= 1;
        // SAFETY: on the LRU whose lock we hold.
        let inode = unsafe { p.get() };
        // list_for_each_safe: the next entry is taken before acting on this one (a
        // rotated inode is met again at the tail if the budget lasts, as in Linux).
        let next = l.next_of(inode);
        let _g = inode.lock();
        let s = inode.state.load(Ordering::Relaxed);
        if inode.count.load(Ordering::Relaxed) != 0 || s & LINUX_STATE & !I_REFERENCED != 0 {
            // In use, or busy: leave the LRU (lazy removal), not evicted. A parked inode
            // (evicted, its removal batched) was counted out of nr_unused at the park.
            l.del(inode);
            inode.clear_bits(ON_LRU);
            // Under loom, a preemption here, before `i_lock`'s release (loom does not
            // switch threads at a mutex release): the window the pin above covers
            // (model `prune_releases_a_parked_inode_before_its_flush_frees_it`).
            #[cfg(vfscale_loom)]
            loom::thread::yield_now();
            if s & PARKED == 0 {
                sb.cache.counters().add(Ctr::NrUnused, -1);
            }
            freed += 1;
        } else if s & I_REFERENCED != 0 {
            // Second chance: rotate to the tail.
            inode.clear_bits(I_REFERENCED);
            l.rotate(inode);
        } else {
            inode.set_bits(I_FREEING);
            inode.clear_bits(ON_LRU);
            l.del(inode);
            sb.cache.counters().add(Ctr::NrUnused, -1);
            dispose.push(p);
            freed += 1;
        }
        cur = next;
    }
    sb.lru[shard].len.store(l.len, Ordering::Relaxed);
    freed
}

// ---------------------------------------------------------------------------------------
// Public types.

/// An inode cache: the inode hash table and the counters shared by its superblocks.
/// Cloning gives another handle to the same cache.
pub struct InodeCache<F: SuperOperations> {
    inner: Arc<CacheInner<F>>,
}

impl<F: SuperOperations> Clone for InodeCache<F> {
    fn clone(&self) -> Self {
        InodeCache {
            inner: self.inner.clone(),
        }
    }
}

impl<F: SuperOperations> fmt::Debug for InodeCache<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InodeCache")
            .field("settings", &self.inner.settings)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<F: SuperOperations> Default for InodeCache<F> {
    fn default() -> Self {
        Self::new(Settings::default())
    }
}

impl<F: SuperOperations> InodeCache<F> {
    /// A cache with the given settings.
    pub fn new(settings: Settings) -> Self {
        let shards = settings.shard_count();
        let bits = settings.hash_bits.clamp(0, 30);
        InodeCache {
            inner: Arc::new(CacheInner {
                settings,
                shards,
                buckets: (0..1usize << bits).map(|_| Bucket::new()).collect(),
                hash_shift: 64 - bits,
                global_hash_lock: Mutex::new(()),
                counters: (0..counter_slots(shards))
                    .map(|_| CachePadded::new(Counters::default()))
                    .collect(),
                waits: WaitTable::new(),
                domain: Domain::new(),
                next_dev: StdAtomicU64::new(1),
            }),
        }
    }

    /// The settings.
    pub fn settings(&self) -> Settings {
        self.inner.settings
    }

    /// Mounts a superblock (`SB_ACTIVE`) with these operations.
    pub fn mount(&self, ops: F) -> SuperBlock<F> {
        let shards = self.inner.shards;
        let sb_shards = if self.inner.settings.sb_list == SbList::Global {
            1
        } else {
            shards
        };
        let lru_shards = if self.inner.settings.lru == Lru::Single {
            1
        } else {
            shards
        };
        let sb = Box::new(SbInner {
            cache: self.inner.clone(),
            ops,
            dev: self.inner.next_dev.fetch_add(1, Ordering::Relaxed),
            active: AtomicBool::new(true),
            lists: (0..sb_shards)
                .map(|_| CachePadded::new(ShardMutex::new(SbSlots::new())))
                .collect(),
            lru: (0..lru_shards)
                .map(|i| {
                    CachePadded::new(LruSlot {
                        list: ShardMutex::new(LruShard::new(i)),
                        len: StdAtomicUsize::new(0),
                    })
                })
                .collect(),
            prune_cursor: StdAtomicUsize::new(0),
            this: NonNull::dangling(),
            slots: (0..counter_slots(shards))
                .map(|_| {
                    CachePadded::new(SbSlot {
                        live: AtomicUsize::new(0),
                        outbox: ShardMutex::new(Outbox { items: Vec::new() }),
                    })
                })
                .collect(),
            detached: AtomicBool::new(false),
            freed: AtomicBool::new(false),
        });
        let p = NonNull::from(Box::leak(sb));
        // SAFETY: just leaked, not shared yet: this is the only pointer.
        unsafe { (*p.as_ptr()).this = p };
        SuperBlock {
            inner: Arc::new(SbHandle { sb: p }),
        }
    }

    /// The counters, summed over CPUs (`/proc/sys/fs/inode-nr` and the lock counts).
    pub fn stats(&self) -> CacheStats {
        let mut s = CacheStats::default();
        // Sums of per-thread slots: a slot alone may go below 0 (an inode counted in on
        // one thread and out on another); the sums are exact.
        let sum = |k: Ctr| {
            self.inner
                .counters
                .iter()
                .fold(0i64, |a, c| a.wrapping_add(c.get(k)))
        };
        let (nr, unused) = (sum(Ctr::NrInodes), sum(Ctr::NrUnused));
        s.global_lock_acquisitions = sum(Ctr::GlobalLocks) as u64;
        s.chain_lock_acquisitions = sum(Ctr::ChainLocks) as u64;
        s.sb_shard_lock_acquisitions = sum(Ctr::SbShardLocks) as u64;
        s.lru_shard_lock_acquisitions = sum(Ctr::LruShardLocks) as u64;
        s.loads = sum(Ctr::Loads) as u64;
        s.new_waits_spun = sum(Ctr::NewWaitsSpun) as u64;
        s.new_waits_slept = sum(Ctr::NewWaitsSlept) as u64;
        s.outbox_lock_acquisitions = sum(Ctr::OutboxLocks) as u64;
        s.nr_inodes = nr.max(0) as u64;
        s.nr_unused = unused.max(0) as u64;
        s
    }
}

/// A mounted superblock: where inodes are looked up, created and reclaimed. Dropping it
/// unmounts it (as [`SuperBlock::umount`]) if that was not done.
pub struct SuperBlock<F: SuperOperations> {
    inner: Arc<SbHandle<F>>,
}

impl<F: SuperOperations> fmt::Debug for SuperBlock<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SuperBlock")
            .field("dev", &self.inner.dev)
            .field("active", &self.inner.is_active())
            .finish()
    }
}

impl<F: SuperOperations> Drop for SuperBlock<F> {
    fn drop(&mut self) {
        if self.inner.is_active() {
            self.umount();
        }
    }
}

/// `find_inode_nowait`'s verdict on one inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Match {
    /// Not this one: go on.
    Skip,
    /// This one: take a reference (none if it is being freed) and stop.
    Take,
    /// Stop and return nothing.
    Stop,
}

/// `insert_inode_locked` failed with `EBUSY`: a live inode has the key. Your inode back.
pub struct InsertBusy<F: SuperOperations> {
    /// The inode that was to be inserted (still unhashed).
    pub inode: InodeRef<F>,
}

impl<F: SuperOperations> fmt::Debug for InsertBusy<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EBUSY ({:?})", self.inode)
    }
}

impl<F: SuperOperations> SuperBlock<F> {
    fn start<T: FromOutcome<F>>(&self, mut op: Op<F>) -> Started<T, F> {
        let mut waiter = None;
        let a = run(&self.inner, &mut op, &mut waiter);
        // The superblock's `Arc` is cloned only by a wait: a hit writes no shared line.
        InodeWait::from_attempt(&self.inner, op, waiter, a)
    }

    /// The device number that names it in messages and hashes.
    pub fn dev(&self) -> u64 {
        self.inner.dev
    }

    /// The filesystem operations.
    pub fn ops(&self) -> &F {
        &self.inner.ops
    }

    /// `SB_ACTIVE`.
    pub fn is_active(&self) -> bool {
        self.inner.is_active()
    }

    /// `iget_locked`: the cached inode, or a new `I_NEW` one for the caller to load; waits
    /// while another task loads it. `None` when the inode found is `I_CREATING`.
    pub fn iget_locked(&self, ino: u64) -> Option<Iget<F>> {
        match iget_fast(&self.inner, ino) {
            Fast::Done(i) => Some(i),
            Fast::New(r) => self
                .settle_new(
                    Op::Iget {
                        hashval: ino,
                        test: Test::Ino,
                        make: Make::Alloc,
                    },
                    r,
                )
                .wait(),
            Fast::Slow => self.iget_locked_start(ino).wait(),
        }
    }

    /// Goes on with `op` from where the full path would be after `find_inode` found `r`
    /// `I_NEW` (and took the reference): spin, then register and wait if need be.
    fn settle_new<T: FromOutcome<F>>(&self, mut op: Op<F>, r: InodeRef<F>) -> Started<T, F> {
        let mut waiter = None;
        let a = settle_found(&self.inner, &mut op, r, Seen::New, &mut waiter);
        InodeWait::from_attempt(&self.inner, op, waiter, a)
    }

    /// `iget_locked` that returns instead of blocking: see [`Started`].
    pub fn iget_locked_start(&self, ino: u64) -> Started<Option<Iget<F>>, F> {
        self.start(Op::Iget {
            hashval: ino,
            test: Test::Ino,
            make: Make::Alloc,
        })
    }

    /// `iget5_locked`: lookup by `hashval` and `test`; a miss makes the inode with `set`
    /// (its `i_ino` and data).
    pub fn iget5_locked(
        &self,
        hashval: u64,
        test: impl Fn(&Inode<F>) -> bool + Send + Sync + 'static,
        set: impl Fn() -> (u64, F::Data) + Send + Sync + 'static,
    ) -> Option<Iget<F>> {
        self.iget5_locked_start(hashval, test, set).wait()
    }

    /// `iget5_locked` that returns instead of blocking.
    pub fn iget5_locked_start(
        &self,
        hashval: u64,
        test: impl Fn(&Inode<F>) -> bool + Send + Sync + 'static,
        set: impl Fn() -> (u64, F::Data) + Send + Sync + 'static,
    ) -> Started<Option<Iget<F>>, F> {
        self.start(Op::Iget {
            hashval,
            test: Test::Custom(Arc::new(test)),
            make: Make::Custom(Arc::new(set)),
        })
    }

    /// `ilookup`: the cached inode (after its load), never creating one.
    pub fn ilookup(&self, ino: u64) -> Option<InodeRef<F>> {
        match iget_hit(&self.inner, ino) {
            Hit::Found(r) => Some(r),
            Hit::New(r) => self
                .settle_new(
                    Op::Lookup {
                        hashval: ino,
                        test: Test::Ino,
                    },
                    r,
                )
                .wait(),
            Hit::Busy | Hit::Absent => self.ilookup_start(ino).wait(),
        }
    }

    /// `ilookup` that returns instead of blocking.
    pub fn ilookup_start(&self, ino: u64) -> Started<Option<InodeRef<F>>, F> {
        self.start(Op::Lookup {
            hashval: ino,
            test: Test::Ino,
        })
    }

    /// `ilookup5`.
    pub fn ilookup5(
        &self,
        hashval: u64,
        test: impl Fn(&Inode<F>) -> bool + Send + Sync + 'static,
    ) -> Option<InodeRef<F>> {
        self.ilookup5_start(hashval, test).wait()
    }

    /// `ilookup5` that returns instead of blocking.
    pub fn ilookup5_start(
        &self,
        hashval: u64,
        test: impl Fn(&Inode<F>) -> bool + Send + Sync + 'static,
    ) -> Started<Option<InodeRef<F>>, F> {
        self.start(Op::Lookup {
            hashval,
            test: Test::Custom(Arc::new(test)),
        })
    }

    /// `find_inode_nowait`: calls `m` on each inode of the chain with this hash value,
    /// newest first, under the chain lock, and never waits. `m` must not block or call
    /// anything that takes the chain lock. [`Match::Take`] of an inode being freed gives
    /// `None`.
    pub fn find_inode_nowait(
        &self,
        hashval: u64,
        mut m: impl FnMut(&Inode<F>) -> Match,
    ) -> Option<InodeRef<F>> {
        let sb: &SbInner<F> = &self.inner;
        let b = sb.cache.bucket(sb, hashval);
        let _h = sb.cache.hash_lock(b);
        let mut p = b.first(Ordering::Acquire);
        while let Some(n) = NonNull::new(p) {
            // SAFETY: chain members are alive under the chain lock.
            let inode = unsafe { n.as_ref() };
            p = inode.hash_next.load(Ordering::Acquire);
            if inode.sb != sb.this || inode.hashval != hashval {
                continue;
            }
            match m(inode) {
                Match::Skip => continue,
                Match::Stop => return None,
                Match::Take => return inode.igrab(),
            }
        }
        None
    }

    /// `new_inode`: an unhashed inode with `i_ino` `ino`, on the superblock's list.
    pub fn new_inode(&self, ino: u64) -> InodeRef<F> {
        let data = self.inner.ops.alloc_inode(ino);
        self.new_inode_with(ino, ino, data)
    }

    /// `new_inode` with the hash value and data given (for `insert_inode_locked4`).
    pub fn new_inode_with(&self, ino: u64, hashval: u64, data: F::Data) -> InodeRef<F> {
        // A new inode is most often hashed next (`insert_inode_locked`): start loading its
        // chain head now, so the miss on it (a random line of the table) overlaps the
        // allocation and the caller's filling of the inode.
        self.inner.cache.bucket(&self.inner, hashval).prefetch();
        let c = self.inner.cache.counters();
        let p = alloc_inode(&self.inner, &c, ino, hashval, data);
        // SAFETY: just allocated.
        inode_sb_list_add(unsafe { p.as_ref() }, &c);
        InodeRef { ptr: p }
    }

    /// `insert_inode_locked`: hash a `new_inode` as `I_NEW | I_CREATING`, unless a live
    /// inode has its number (`EBUSY`); inodes being evicted are passed over.
    ///
    /// # Panics
    /// If `inode` was hashed before, or belongs to another superblock.
    pub fn insert_inode_locked(&self, inode: InodeRef<F>) -> Result<NewInode<F>, InsertBusy<F>> {
        self.check_own(&inode);
        match insert_fast(&self.inner, inode) {
            Ok(n) => Ok(n),
            Err(inode) => self.insert_inode_locked_start(inode).wait(),
        }
    }

    /// `insert_inode_locked` that returns instead of blocking.
    pub fn insert_inode_locked_start(
        &self,
        inode: InodeRef<F>,
    ) -> Started<Result<NewInode<F>, InsertBusy<F>>, F> {
        self.check_own(&inode);
        self.start(Op::Insert {
            inode: Some(inode),
            test: Test::Ino,
        })
    }

    /// `insert_inode_locked4`: as `insert_inode_locked`, by the inode's hash value (see
    /// [`SuperBlock::new_inode_with`]) and `test`.
    pub fn insert_inode_locked4(
        &self,
        inode: InodeRef<F>,
        test: impl Fn(&Inode<F>) -> bool + Send + Sync + 'static,
    ) -> Result<NewInode<F>, InsertBusy<F>> {
        self.insert_inode_locked4_start(inode, test).wait()
    }

    /// `insert_inode_locked4` that returns instead of blocking.
    pub fn insert_inode_locked4_start(
        &self,
        inode: InodeRef<F>,
        test: impl Fn(&Inode<F>) -> bool + Send + Sync + 'static,
    ) -> Started<Result<NewInode<F>, InsertBusy<F>>, F> {
        self.check_own(&inode);
        self.start(Op::Insert {
            inode: Some(inode),
            test: Test::Custom(Arc::new(test)),
        })
    }

    fn check_own(&self, inode: &InodeRef<F>) {
        if inode.sb != self.inner.this {
            panic!(
                "insert_inode_locked: {} belongs to another superblock",
                inode.name()
            );
        }
    }

    /// The shrinker's `count_objects`: inodes on the LRU. The outboxes are flushed first
    /// (see [`SuperBlock::nr_inodes`]), so an evicted inode is not counted.
    pub fn count_objects(&self) -> usize {
        self.inner.drain_outboxes();
        self.inner.lru_len()
    }

    /// Finishes the calling thread's parked evictions on this superblock: takes the
    /// inodes it evicted but left on another CPU's lists off them and frees them (the
    /// crate docs, "Batched removal"). Optional: a thread's outbox is flushed when it
    /// fills, and every observer of the lists and `umount` flush all outboxes; a thread
    /// that stops evicting for good can call it to give the memory back sooner.
    pub fn flush_evictions(&self) {
        let sb: &SbInner<F> = &self.inner;
        let c = sb.cache.counters();
        {
            let pin = sb.cache.domain.pin();
            c.add(Ctr::OutboxLocks, 1);
            let mut o = sb.slots[c.slot].outbox.lock();
            if !o.items.is_empty() {
                flush_parked(sb, &mut o.items, &pin, &c);
            }
        }
        reclaim_due();
    }

    /// Evicted inodes parked in outboxes (not yet off the lists), for tests.
    #[doc(hidden)]
    pub fn nr_parked(&self) -> usize {
        self.inner.slots.iter().map(|s| s.outbox.lock().items.len()).sum()
    }

    /// `prune_icache_sb` (the shrinker's `scan_objects`): walks up to `nr_to_scan` LRU
    /// entries, oldest first, and evicts the unused ones without `I_REFERENCED`. Returns
    /// the entries taken off the LRU.
    pub fn prune_icache_sb(&self, nr_to_scan: usize) -> usize {
        let sb: &SbInner<F> = &self.inner;
        let n = sb.lru.len();
        let total = sb.lru_len();
        let mut dispose = Vec::new();
        let mut freed = 0;
        if n == 1 {
            freed = prune_shard(sb, 0, nr_to_scan, &mut dispose);
        } else if total > 0 {
            // Each shard's share of the scan, in proportion to its length (as
            // shrink_slab splits a scan over NUMA nodes).
            let start = sb.prune_cursor.fetch_add(1, Ordering::Relaxed);
            let mut left = nr_to_scan;
            for i in 0..n {
                let s = (start + i) % n;
                let len = sb.lru[s].len.load(Ordering::Relaxed);
                let share = scan_share(nr_to_scan, len, total, left);
                if share > 0 {
                    freed += prune_shard(sb, s, share, &mut dispose);
                    left -= share;
                }
            }
        }
        // We set I_FREEING on each: ours to evict.
        let panicked = evict_each(dispose);
        // Memory pressure: the superblock list shards left empty give their memory back.
        for l in sb.lists.iter() {
            l.lock().shrink_if_empty();
        }
        resume(panicked);
        freed
    }

    /// `evict_inodes`: evicts every unused inode of the superblock that is not `I_NEW` or
    /// already being evicted, then flushes every outbox (parked evictions). Returns how
    /// many it evicted.
    pub fn evict_inodes(&self) -> usize {
        let mut n = 0;
        let mut panicked = None;
        sb_walk(
            &self.inner,
            |p, inode, dispose: &mut Vec<InodePtr<F>>| {
                // i_count is read under i_lock only (as invalidate_inodes does; Linux's
                // evict_inodes skips on an unlocked read first): the SB_ACTIVE clear
                // before this walk and a last iput's 1 -> 0 and SB_ACTIVE read (under
                // i_lock) are then ordered by the lock. Either this sees the count 0 and
                // evicts, or that iput sees SB_ACTIVE clear and evicts. An unlocked skip
                // could see a stale count while that iput saw a stale SB_ACTIVE and kept
                // the inode: one unused inode left behind (loom: umount_races_last_iput).
                let s = inode.state.load(Ordering::Relaxed);
                if inode.count.load(Ordering::Relaxed) == 0 && s & (I_NEW | I_FREEING | I_WILL_FREE) == 0 {
                    inode.set_bits(I_FREEING);
                    dispose.push(p);
                }
            },
            |dispose| {
                n += dispose.len();
                // We set I_FREEING on each: ours to evict (`evict` takes it off the LRU
                // too). A panic waits for the walk and the outboxes (`evict_each`).
                if let Some(e) = evict_each(dispose.drain(..)) {
                    panicked.get_or_insert(e);
                }
            },
        );
        // Inodes other threads evicted but left on this superblock's lists (their
        // outboxes). After `umount` cleared SB_ACTIVE nobody parks any more (`park`).
        self.inner.drain_outboxes();
        resume(panicked);
        n
    }

    /// `generic_shutdown_super`'s part: clears `SB_ACTIVE` (from now on the last `iput`
    /// evicts, and no eviction is parked), then `evict_inodes` (which flushes every
    /// outbox after its walk). Returns the busy inodes left ("Busy inodes after
    /// unmount"); they are evicted at their last `iput`. Evicted inodes that waited in an
    /// outbox are not among them (an eviction still running in another thread is, as
    /// before).
    pub fn umount(&self) -> usize {
        self.inner.active.store(false, Ordering::Release);
        self.evict_inodes();
        self.inner.lists.iter().map(|l| l.lock().len()).sum()
    }

    /// Calls `f` on every inode of the superblock that is neither `I_NEW` nor being
    /// freed, holding a reference to it (what `drop_pagecache_sb` and sync do). Safe
    /// against concurrent creation (a new inode may or may not be visited) and eviction
    /// (a visited inode is held; one already being evicted is skipped). `f` runs with no
    /// lock held.
    pub fn for_each_inode(&self, mut f: impl FnMut(&InodeRef<F>)) {
        sb_walk(
            &self.inner,
            |_, inode, held: &mut Vec<InodeRef<F>>| {
                if inode.state.load(Ordering::Relaxed) & (I_NEW | I_FREEING | I_WILL_FREE) == 0 {
                    held.push(inode.iget_locked_ref());
                }
            },
            |held| {
                held.iter().for_each(&mut f);
                // The references go (a last one may evict) with no lock held.
                held.clear();
            },
        );
    }

    /// The inode numbers on the LRU, oldest first (shard by shard with per-CPU LRUs). The
    /// outboxes are flushed first (see [`SuperBlock::nr_inodes`]).
    pub fn lru_inos(&self) -> Vec<u64> {
        let sb: &SbInner<F> = &self.inner;
        sb.drain_outboxes();
        let mut v = Vec::new();
        for s in 0..sb.lru.len() {
            let l = sb.lru_lock(s);
            let mut cur = l.head;
            while let Some(p) = cur {
                // SAFETY: on the LRU whose lock we hold.
                let inode = unsafe { p.get() };
                v.push(inode.ino);
                cur = l.next_of(inode);
            }
        }
        v
    }

    /// Inodes on the superblock's lists (allocated, not yet evicted). Every outbox is
    /// flushed first, so that, as in Linux, an inode whose eviction started in another
    /// call is not on them (in Linux it is off them before `->evict_inode`; here an
    /// eviction may leave it on another CPU's list, `I_FREEING`, until a batch takes it
    /// off: the crate docs, "Batched removal"). It takes every slot's outbox lock.
    pub fn nr_inodes(&self) -> usize {
        self.inner.drain_outboxes();
        self.inner.lists.iter().map(|l| l.lock().len()).sum()
    }
}

// ---------------------------------------------------------------------------------------
// Waiting.

/// Why a wait ended without a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitError {
    /// An [`Interrupter`] interrupted it.
    Interrupted,
    /// The deadline passed.
    TimedOut,
}

impl fmt::Display for WaitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WaitError::Interrupted => "interrupted",
            WaitError::TimedOut => "timed out",
        })
    }
}

impl std::error::Error for WaitError {}

/// An operation that either finished or has to wait.
pub enum Started<T, F: SuperOperations> {
    /// Finished.
    Done(T),
    /// Waiting on an `I_NEW` inode or on an eviction.
    Wait(InodeWait<F, T>),
}

impl<T: fmt::Debug, F: SuperOperations> fmt::Debug for Started<T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Started::Done(t) => f.debug_tuple("Done").field(t).finish(),
            Started::Wait(w) => f.debug_tuple("Wait").field(w).finish(),
        }
    }
}

impl<T: FromOutcome<F>, F: SuperOperations> Started<T, F> {
    /// The result, blocking until it is there.
    pub fn wait(self) -> T {
        match self {
            Started::Done(t) => t,
            Started::Wait(w) => match w.wait() {
                Ok(t) => t,
                Err(e) => unreachable!("an uninterruptible wait without deadline ended: {e}"),
            },
        }
    }

    /// Whether it has to wait.
    pub fn is_waiting(&self) -> bool {
        matches!(self, Started::Wait(_))
    }
}

/// The results a waiting operation can give (sealed).
pub trait FromOutcome<F: SuperOperations>: Sized + private::Sealed {
    #[doc(hidden)]
    fn from_outcome(o: Outcome<F>) -> Self;
}

mod private {
    pub trait Sealed {}
    impl<F: crate::SuperOperations> Sealed for Option<crate::Iget<F>> {}
    impl<F: crate::SuperOperations> Sealed for Option<crate::InodeRef<F>> {}
    impl<F: crate::SuperOperations> Sealed for Result<crate::NewInode<F>, crate::InsertBusy<F>> {}
}

impl<F: SuperOperations> FromOutcome<F> for Option<Iget<F>> {
    fn from_outcome(o: Outcome<F>) -> Self {
        match o {
            Outcome::Iget(x) => x,
            _ => unreachable!("an iget gives an iget outcome"),
        }
    }
}

impl<F: SuperOperations> FromOutcome<F> for Option<InodeRef<F>> {
    fn from_outcome(o: Outcome<F>) -> Self {
        match o {
            Outcome::Lookup(x) => x,
            _ => unreachable!("a lookup gives a lookup outcome"),
        }
    }
}

impl<F: SuperOperations> FromOutcome<F> for Result<NewInode<F>, InsertBusy<F>> {
    fn from_outcome(o: Outcome<F>) -> Self {
        match o {
            Outcome::Insert(x) => x,
            _ => unreachable!("an insert gives an insert outcome"),
        }
    }
}

enum Stage<F: SuperOperations> {
    Freeing(usize),
    New(InodeRef<F>),
    Done,
}

/// A lookup waiting for an `I_NEW` inode's load to end or for an eviction to finish
/// (`wait_on_inode`, `__wait_on_freeing_inode`). Finish it with [`InodeWait::wait`] (the
/// thread blocks), [`InodeWait::wait_until`] (with a deadline), by `.await`ing it, or by
/// calling [`InodeWait::poll_complete`] from a driver of your own. An [`Interrupter`]
/// ends it from anywhere. Dropping it abandons the lookup (any reference it holds is
/// put).
#[must_use = "dropping a wait abandons the lookup"]
pub struct InodeWait<F: SuperOperations, T> {
    sb: Arc<SbHandle<F>>,
    op: Op<F>,
    stage: Stage<F>,
    waiter: Arc<Waiter>,
    _t: PhantomData<fn() -> T>,
}

impl<F: SuperOperations, T> fmt::Debug for InodeWait<F, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on = match &self.stage {
            Stage::Freeing(_) => "an eviction",
            Stage::New(_) => "I_NEW",
            Stage::Done => "nothing",
        };
        write!(f, "InodeWait(on {on})")
    }
}

/// Ends an [`InodeWait`] with [`WaitError::Interrupted`] from anywhere (the role of a
/// fatal signal).
#[derive(Clone, Debug)]
pub struct Interrupter {
    waiter: Arc<Waiter>,
}

impl Interrupter {
    /// Interrupts the wait (no effect once it finished).
    pub fn interrupt(&self) {
        self.waiter.interrupt();
    }
}

impl<F: SuperOperations, T: FromOutcome<F>> InodeWait<F, T> {
    fn from_attempt(
        sb: &Arc<SbHandle<F>>,
        op: Op<F>,
        waiter: Option<Arc<Waiter>>,
        a: Attempt<F>,
    ) -> Started<T, F> {
        let stage = match a {
            Attempt::Done(o) => return Started::Done(T::from_outcome(o)),
            Attempt::Freeing(addr) => Stage::Freeing(addr),
            Attempt::New(r) => Stage::New(r),
        };
        Started::Wait(InodeWait {
            sb: sb.clone(),
            op,
            stage,
            waiter: waiter.expect("a waiting attempt registered a waiter"),
            _t: PhantomData,
        })
    }

    /// The `I_NEW` inode this wait holds a reference to, while it waits for its load
    /// (`None` while it waits for an eviction).
    pub fn waiting_on(&self) -> Option<&InodeRef<F>> {
        match &self.stage {
            Stage::New(r) => Some(r),
            _ => None,
        }
    }

    /// A handle that interrupts this wait.
    pub fn interrupter(&self) -> Interrupter {
        Interrupter {
            waiter: self.waiter.clone(),
        }
    }

    /// Blocks until the result is there.
    pub fn wait(mut self) -> Result<T, WaitError> {
        self.wait_deadline(None)
    }

    /// Blocks until the result is there or `deadline` passes.
    pub fn wait_until(mut self, deadline: Instant) -> Result<T, WaitError> {
        self.wait_deadline(Some(deadline))
    }

    fn wait_deadline(&mut self, deadline: Option<Instant>) -> Result<T, WaitError> {
        loop {
            match self.waiter.wait(deadline) {
                WaitOutcome::Woken => {
                    if let Some(t) = self.advance() {
                        return Ok(t);
                    }
                }
                WaitOutcome::Interrupted => return Err(self.abandon(WaitError::Interrupted)),
                WaitOutcome::TimedOut => return Err(self.abandon(WaitError::TimedOut)),
            }
        }
    }

    /// Without blocking: if the wait was woken, tries again; `None` while it still waits.
    pub fn poll_complete(&mut self) -> Option<Result<T, WaitError>> {
        self.step(None)
    }

    /// Whether it was woken (a driver's hint that `poll_complete` will make progress).
    pub fn is_woken(&self) -> bool {
        self.waiter.poll(None).is_some()
    }

    fn step(&mut self, waker: Option<&std::task::Waker>) -> Option<Result<T, WaitError>> {
        if matches!(self.stage, Stage::Done) {
            return Some(Err(WaitError::Interrupted));
        }
        loop {
            match self.waiter.poll(waker)? {
                WaitOutcome::Woken => {
                    if let Some(t) = self.advance() {
                        return Some(Ok(t));
                    }
                }
                WaitOutcome::Interrupted => return Some(Err(self.abandon(WaitError::Interrupted))),
                WaitOutcome::TimedOut => return Some(Err(self.abandon(WaitError::TimedOut))),
            }
        }
    }

    /// After a wake-up: tries again; `None` if it waits again.
    fn advance(&mut self) -> Option<T> {
        let mut w = Some(self.waiter.clone());
        let a = match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::Freeing(_) => run(&self.sb, &mut self.op, &mut w),
            Stage::New(r) => settle_found(&self.sb, &mut self.op, r, Seen::Woken, &mut w),
            Stage::Done => unreachable!("advanced after the end"),
        };
        match a {
            Attempt::Done(o) => Some(T::from_outcome(o)),
            Attempt::Freeing(addr) => {
                self.stage = Stage::Freeing(addr);
                None
            }
            Attempt::New(r) => {
                self.stage = Stage::New(r);
                None
            }
        }
    }

    fn abandon(&mut self, e: WaitError) -> WaitError {
        match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::Freeing(addr) => self.sb.cache.waits.cancel(addr, &self.waiter),
            Stage::New(r) => {
                self.sb.cache.waits.cancel(r.addr(), &self.waiter);
                drop(r);
            }
            Stage::Done => {}
        }
        e
    }
}

impl<F: SuperOperations, T> Drop for InodeWait<F, T> {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.stage, Stage::Done) {
            Stage::Freeing(addr) => self.sb.cache.waits.cancel(addr, &self.waiter),
            Stage::New(r) => {
                self.sb.cache.waits.cancel(r.addr(), &self.waiter);
                drop(r);
            }
            Stage::Done => {}
        }
    }
}

impl<F: SuperOperations, T: FromOutcome<F>> Future for InodeWait<F, T> {
    type Output = Result<T, WaitError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // `InodeWait` is `Unpin` (no self-references).
        let this = self.get_mut();
        match this.step(Some(cx.waker())) {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

impl<F: SuperOperations, T> Unpin for InodeWait<F, T> {}

#[cfg(all(test, vfscale_loom))]
mod loom_bitlock {
    use super::*;

    struct Nop;
    impl SuperOperations for Nop {
        type Data = ();
        fn alloc_inode(&self, _: u64) {}
    }

    #[test]
    fn two_lockers_of_one_chain_exclude_each_other() {
        loom::model(|| {
            let b = Arc::new(Bucket::<Nop>::new());
            // loom runs its threads on one OS thread (its spawn needs no `Send`); the
            // cell's accesses are what the model checks.
            #[allow(clippy::arc_with_non_send_sync)]
            let c = Arc::new(loom::cell::UnsafeCell::new(0u32));
            let (b2, c2) = (b.clone(), c.clone());
            let t = loom::thread::spawn(move || {
                b2.lock();
                // SAFETY: under the bit lock (what the model checks).
                c2.with_mut(|p| unsafe { *p += 1 });
                let f = b2.first(Ordering::Relaxed) as usize;
                b2.set_first((f + 8) as *mut Inode<Nop>);
                b2.unlock();
            });
            b.lock();
            // SAFETY: as above.
            c.with_mut(|p| unsafe { *p += 1 });
            let f = b.first(Ordering::Relaxed) as usize;
            b.set_first((f + 8) as *mut Inode<Nop>);
            b.unlock();
            t.join().unwrap();
            // Both links made it, and the lock is free.
            assert_eq!(b.head.load(Ordering::Relaxed), 16);
            // SAFETY: both threads are done.
            assert_eq!(c.with(|p| unsafe { *p }), 2);
        });
    }
}

#[cfg(all(test, not(any(vfscale_loom, vfscale_shuttle))))]
mod tests {
    use super::scan_share;

    /// A scan's split over shards never overflows: with `nr_to_scan` = usize::MAX or
    /// 2^63 every shard's share covers its whole length (a wrapped product once gave a
    /// shard of 2 inodes a share of 0 at 2^63, and a debug build panicked). A share above
    /// a shard's length is harmless: the walk ends with the list.
    #[test]
    fn scan_shares_of_huge_counts_cover_each_shard() {
        for n in [usize::MAX, 1 << 63, (1 << 63) + 1, 3] {
            let a = scan_share(n, 2, 3, n);
            assert!(a >= 2, "{n}: {a}");
            assert!(scan_share(n, 1, 3, n - a) >= 1, "{n}");
        }
        assert_eq!(scan_share(1 << 63, 2, 3, usize::MAX), 6_148_914_691_236_517_206);
        assert_eq!(scan_share(3, 2, 3, 3), 2);
        assert_eq!(scan_share(1, 2, 3, 1), 1);
        assert_eq!(scan_share(6, 2, 3, 1), 1, "at most what is left");
        assert_eq!(scan_share(0, 2, 3, 0), 0);
    }
}
