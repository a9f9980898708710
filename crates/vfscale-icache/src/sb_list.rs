//! The superblock's inode list (`s_inodes`): one slot array per CPU shard, each under its
//! own lock (`s_inode_list_lock`), and the batched walk of every inode on it.

use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::counters::{Counter, CpuCounters};
use crate::inode::*;
use crate::superblock::SbInner;
use crate::sync::{Ordering, ShardGuard, ShardMutex};
use crate::{SbList, SuperOperations};

/// One shard of a superblock's inode list (`s_inodes`): a slot per inode, which the inode
/// knows (`sb_index`). A removed inode's slot joins a free list threaded through the empty
/// slots (bit 0 set: inode addresses are at least 8-aligned), and an add takes the most
/// recently freed slot; so a removal writes only its own slot (a `swap_remove` would also
/// write the moved inode's index: one more cache miss, under a lock that another CPU's
/// evictions of the inodes this CPU allocated take too). An inode's slot is written only
/// under the shard's lock.
pub(crate) struct SbListSlots<F: SuperOperations> {
    /// An inode's address, or `(next free slot << 1) | 1`.
    slots: Vec<usize>,
    /// The first free slot, or [`SB_SLOT_NONE`].
    free: usize,
    len: usize,
    _inode: PhantomData<fn() -> F>,
}

/// The end of an [`SbListSlots`] free list.
const SB_SLOT_NONE: usize = usize::MAX >> 1;

impl<F: SuperOperations> SbListSlots<F> {
    pub(crate) fn new() -> Self {
        SbListSlots {
            slots: Vec::new(),
            free: SB_SLOT_NONE,
            len: 0,
            _inode: PhantomData,
        }
    }

    /// Adds `inode`; returns its slot. The caller holds the shard's lock.
    pub(crate) fn add(&mut self, inode: &Inode<F>) -> usize {
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
    pub(crate) fn del(&mut self, i: usize, inode: &Inode<F>) {
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
            // one back, `shrink_if_empty`): freeing a large block inside an eviction makes
            // glibc consolidate every fastbin chunk of the process there (a mass unlink's
            // last eviction would pay for all the frees before it).
            self.slots.clear();
            self.free = SB_SLOT_NONE;
        }
    }

    /// Gives the memory of an empty list back if it is large (the caller holds the
    /// shard's lock; `prune_icache_sb`, under memory pressure).
    pub(crate) fn shrink_if_empty(&mut self) {
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

    pub(crate) fn len(&self) -> usize {
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

/// One shard of a superblock's inode list and its lock (`s_inode_list_lock`).
pub(crate) type SbListShard<F> = ShardMutex<SbListSlots<F>>;

/// Walks every superblock list shard of `sb`, at most [`SB_WALK_BATCH`] picks per hold of
/// a shard's lock: `pick` runs for each inode under the shard's lock and the inode's
/// `i_lock` and may push onto the batch; `then` runs on each full (and the last) batch
/// with no lock held and must empty it. The batch is allocated before any lock is taken.
pub(crate) fn sb_walk<F: SuperOperations, T>(
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

impl<F: SuperOperations> SbInner<F> {
    fn list_lock(&self, shard: usize) -> ShardGuard<'_, SbListSlots<F>> {
        self.list_lock_with(&self.cache.counters(), shard)
    }

    /// [`SbInner::list_lock`], counted on `c`.
    pub(crate) fn list_lock_with(&self, c: &CpuCounters<'_>, shard: usize) -> ShardGuard<'_, SbListSlots<F>> {
        if self.cache.settings.sb_list == SbList::Global {
            c.add(Counter::GlobalLocks, 1);
        } else {
            c.add(Counter::SbShardLocks, 1);
        }
        self.lists[shard].lock()
    }
}

/// `inode_sb_list_add`: onto the list of this CPU's shard (`c`'s).
pub(crate) fn inode_sb_list_add<F: SuperOperations>(inode: &Inode<F>, c: &CpuCounters<'_>) {
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
pub(crate) fn inode_sb_list_del<F: SuperOperations>(inode: &Inode<F>, c: &CpuCounters<'_>) {
    let sb = inode.sb();
    let mut l = sb.list_lock_with(c, inode.sb_shard());
    let i = inode.sb_index.load(Ordering::Relaxed) as usize;
    l.del(i, inode);
}
