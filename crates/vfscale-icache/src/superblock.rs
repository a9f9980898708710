//! A superblock: its state shared with its inodes (`SbInner`: `SB_ACTIVE`, lists, LRU,
//! per-slot live counts and outboxes), the counted handle that keeps it and frees it
//! with its last inode, and the public [`SuperBlock`] API (lookups, create, shrinker,
//! `evict_inodes`, umount).

use std::fmt;

use std::ptr::NonNull;
use std::sync::atomic::AtomicUsize as StdAtomicUsize;
use std::sync::Arc;

use crossbeam_utils::CachePadded;

use crate::cache::CacheInner;
use crate::counters::{counter_slots, Counter, CpuCounters};
use crate::deferred_free::{reclaim_due, Guard};
use crate::evict::{evict_each, resume};
use crate::inode::*;
use crate::inode_alloc::alloc_inode;
use crate::inode_wait::{FromOutcome, InodeWait, Started};
use crate::lookup::{run, settle_found, FoundAs, InodeTest, LookupOp, NewInodeFrom};
use crate::lookup_fast::{iget_fast, ilookup_fast, insert_fast, IgetFastPath, InoMatch};
use crate::lru::{prune_shard, scan_share, LruShard, LruSlot};
use crate::outbox::{flush_parked, Outbox};
use crate::sb_list::{inode_sb_list_add, sb_walk, SbListShard, SbListSlots};
use crate::sync::{fence, AtomicBool, AtomicUsize, Ordering, ShardMutex};
use crate::{Lru, SbList, SuperOperations};

/// What a superblock keeps per counter slot, on one line that the slot's thread writes:
/// its live-inode count (inodes allocated and not yet through `destroy_inode`: `+1` on
/// the allocating thread's slot, a plain load and store when the thread owns the slot;
/// `-1` on the destroying one's, a slot alone may wrap below 0, the wrapping sum is exact,
/// summed at teardown only) and its outbox, under a lock of its own: taken by the slot's
/// thread to park and flush (uncontended: its line stays on that CPU), and by a drain
/// (umount, the list observers) of every slot.
pub(crate) struct SbThreadSlot<F: SuperOperations> {
    pub(crate) live: AtomicUsize,
    pub(crate) outbox: ShardMutex<Outbox<F>>,
}

/// A superblock: its operations, `SB_ACTIVE`, its inode lists and its LRU.
pub(crate) struct SbInner<F: SuperOperations> {
    pub(crate) cache: Arc<CacheInner<F>>,
    pub(crate) ops: F,
    pub(crate) dev: u64,
    pub(crate) active: AtomicBool,
    /// `s_inodes`, one list per shard (`s_inode_list_lock` each).
    pub(crate) lists: Box<[CachePadded<SbListShard<F>>]>,
    /// `s_inode_lru`, one list per shard, with its length.
    pub(crate) lru: Box<[CachePadded<LruSlot<F>>]>,
    pub(crate) prune_cursor: StdAtomicUsize,
    /// Where the superblock lives (the pointer from `Box::into_raw`): what inodes hold as
    /// `i_sb`, and what the last one out frees.
    pub(crate) this: NonNull<SbInner<F>>,
    /// Per counter slot (as [`CacheInner::counters`]: one per thread in normal builds,
    /// per shard under the models): its live-inode count and its outbox ([`SbThreadSlot`]).
    pub(crate) slots: Box<[CachePadded<SbThreadSlot<F>>]>,
    /// No handle ([`SuperBlock`], a waiting lookup) is left: the superblock is freed when
    /// its last inode is destroyed.
    pub(crate) detached: AtomicBool,
    /// The free is claimed (exactly once).
    pub(crate) freed: AtomicBool,
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
pub(crate) fn sb_inode_gone<F: SuperOperations>(sb: &SbInner<F>, pin: &Guard, c: &CpuCounters<'_>) {
    // Dekker with `SbHandle::drop`, through SeqCst fences (each side: its write, a
    // fence, then its reads): either this decrement is seen by the detacher's sum, or
    // this load sees `detached` and sums itself; of two destroyers on different shards,
    // the one whose fence is later in the SeqCst order sees the other's decrement, so
    // the last one sums 0. SeqCst accesses alone order this in C++ (the decrement, this
    // load and the detacher's store and sum are all in the single SeqCst order: if this
    // load reads `detached` false it precedes the store, so the sum after it reads the
    // decrement), and on x86 the locked decrement is a full barrier already, so normal
    // builds leave the fence out (an `mfence` per eviction). loom models SeqCst accesses
    // as AcqRel (without the fence, `sb_freed_after_last_inode` finds the superblock
    // never freed): under the models the fence is there, and loom checks it exactly.
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
    /// The slot of `live` of the thread whose counters are `c` (the same slot), and
    /// whether it owns it (no other thread writes it).
    #[inline]
    pub(crate) fn live_slot_of(&self, c: &CpuCounters<'_>) -> (&AtomicUsize, bool) {
        (&self.slots[c.slot].live, c.own)
    }

    pub(crate) fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
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
    /// A new superblock of `cache` (`SB_ACTIVE`): [`InodeCache::mount`](crate::InodeCache::mount).
    pub(crate) fn mount(cache: &Arc<CacheInner<F>>, ops: F) -> SuperBlock<F> {
        let shards = cache.shards;
        let sb_shards = if cache.settings.sb_list == SbList::Global {
            1
        } else {
            shards
        };
        let lru_shards = if cache.settings.lru == Lru::Single {
            1
        } else {
            shards
        };
        let sb = Box::new(SbInner {
            cache: cache.clone(),
            ops,
            dev: cache.next_dev.fetch_add(1, Ordering::Relaxed),
            active: AtomicBool::new(true),
            lists: (0..sb_shards)
                .map(|_| CachePadded::new(ShardMutex::new(SbListSlots::new())))
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
                    CachePadded::new(SbThreadSlot {
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

    fn start<T: FromOutcome<F>>(&self, mut op: LookupOp<F>) -> Started<T, F> {
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
            IgetFastPath::Done(i) => Some(i),
            IgetFastPath::SettleNew(r) => self
                .settle_new(
                    LookupOp::Iget {
                        hashval: ino,
                        test: InodeTest::Ino,
                        make: NewInodeFrom::Alloc,
                    },
                    r,
                )
                .wait(),
            IgetFastPath::FullPath => self.iget_locked_start(ino).wait(),
        }
    }

    /// Goes on with `op` from where the full path would be after `find_inode` found `r`
    /// `I_NEW` (and took the reference): spin, then register and wait if need be.
    fn settle_new<T: FromOutcome<F>>(&self, mut op: LookupOp<F>, r: InodeRef<F>) -> Started<T, F> {
        let mut waiter = None;
        let a = settle_found(&self.inner, &mut op, r, FoundAs::New, &mut waiter);
        InodeWait::from_attempt(&self.inner, op, waiter, a)
    }

    /// `iget_locked` that returns instead of blocking: see [`Started`].
    pub fn iget_locked_start(&self, ino: u64) -> Started<Option<Iget<F>>, F> {
        self.start(LookupOp::Iget {
            hashval: ino,
            test: InodeTest::Ino,
            make: NewInodeFrom::Alloc,
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
        self.start(LookupOp::Iget {
            hashval,
            test: InodeTest::Custom(Arc::new(test)),
            make: NewInodeFrom::Set(Arc::new(set)),
        })
    }

    /// `ilookup`: the cached inode (after its load), never creating one.
    pub fn ilookup(&self, ino: u64) -> Option<InodeRef<F>> {
        match ilookup_fast(&self.inner, ino) {
            InoMatch::Cached(r) => Some(r),
            InoMatch::New(r) => self
                .settle_new(
                    LookupOp::Lookup {
                        hashval: ino,
                        test: InodeTest::Ino,
                    },
                    r,
                )
                .wait(),
            InoMatch::Busy | InoMatch::Absent => self.ilookup_start(ino).wait(),
        }
    }

    /// `ilookup` that returns instead of blocking.
    pub fn ilookup_start(&self, ino: u64) -> Started<Option<InodeRef<F>>, F> {
        self.start(LookupOp::Lookup {
            hashval: ino,
            test: InodeTest::Ino,
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
        self.start(LookupOp::Lookup {
            hashval,
            test: InodeTest::Custom(Arc::new(test)),
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
        let b = sb.cache.chain(sb, hashval);
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
        self.inner.cache.chain(&self.inner, hashval).prefetch();
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
        self.start(LookupOp::Insert {
            inode: Some(inode),
            test: InodeTest::Ino,
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
        self.start(LookupOp::Insert {
            inode: Some(inode),
            test: InodeTest::Custom(Arc::new(test)),
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
            c.add(Counter::OutboxLocks, 1);
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
