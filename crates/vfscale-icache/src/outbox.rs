//! Batched removal (the crate docs, "Batched removal"): an eviction whose inode another
//! CPU listed parks it in its thread's outbox; a full outbox, or a drain, takes the
//! parked inodes off their superblock list and LRU shards with one hold of each lock.

use std::ptr::NonNull;

use crate::counters::{Counter, CpuCounters};
use crate::deferred_free::{reclaim_due, Guard};
use crate::inode::*;
use crate::inode_alloc::free_inode;
use crate::lru::lru_del_evicting;
use crate::superblock::SbInner;
use crate::sync::Ordering;
use crate::SuperOperations;

/// Evictions whose inodes wait in an outbox before they are taken off another CPU's
/// superblock list and LRU shards in one hold of each shard's lock (the crate docs,
/// "Batched removal"). A flush takes a remote shard's lock line to this CPU once per
/// this many evictions instead of once (or, with the LRU, twice) per eviction: at 32 the
/// two line transfers of an eviction whose inode another CPU listed cost about 1/16 of
/// taking the locks per eviction, while a flush holds a shard lock for at most 32 unlinks (a few
/// microseconds of a waiter's spin), the outbox's 256 bytes of pointers stay in L1, and
/// each thread holds back at most 32 evicted inodes' memory per superblock. Under the
/// models: 2 (a second remote eviction, or [`SuperBlock::flush_evictions`], flushes; one
/// stays parked, so umount's drain and a prune meeting a parked inode are explored).
#[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
const OUTBOX_CAPACITY: usize = 32;
#[cfg(any(vfscale_loom, vfscale_shuttle))]
const OUTBOX_CAPACITY: usize = 2;

/// A counter slot's evicted inodes whose list removal waits (at most [`OUTBOX_CAPACITY`]): each is
/// `I_FREEING | I_CLEAR | PARKED`, unhashed, through `->evict_inode` and `->destroy_inode`,
/// still on its superblock list shard and maybe on an LRU shard. Its buffer is allocated
/// at the first park (under its lock, which only a drain ever contends).
pub(crate) struct Outbox<F: SuperOperations> {
    pub(crate) items: Vec<InodePtr<F>>,
}

impl<F: SuperOperations> SbInner<F> {
    /// Whether the eviction of `inode` (on an LRU if `on_lru`) by the thread of `c` parks
    /// it: it is listed on another CPU's superblock list shard or LRU shard. Never with
    /// one shard, [`SbList::Global`] and [`Lru::Single`] (those lists have one shard).
    #[inline]
    pub(crate) fn evict_parks(&self, inode: &Inode<F>, on_lru: bool, c: &CpuCounters<'_>) -> bool {
        // One load of both shards; the common case (this CPU's) decides on it alone.
        let (sb_shard, lru_shard) = inode.shards();
        (sb_shard != c.shard && self.lists.len() > 1)
            || (on_lru && lru_shard != c.shard && self.lru.len() > 1)
    }

    /// Flushes every slot's outbox (each under its lock): afterwards no inode parked
    /// before this call is on the superblock's lists. Counted on the caller's counters.
    pub(crate) fn drain_outboxes(&self) {
        let c = self.cache.counters();
        {
            let pin = self.cache.domain.pin();
            for s in self.slots.iter() {
                c.add(Counter::OutboxLocks, 1);
                let mut o = s.outbox.lock();
                if !o.items.is_empty() {
                    flush_parked(self, &mut o.items, &pin, &c);
                }
            }
        }
        reclaim_due();
    }
}

/// Parks an evicted inode (see [`evict_with`]) in the outbox of `c`'s slot; a full outbox
/// is flushed at once. On an inactive superblock nothing is parked: the inode is taken
/// off its lists and freed now. `SB_ACTIVE` is read under the outbox lock, and `umount`
/// clears it before it drains every outbox under its lock, so either the drain finds the
/// inode or this sees `SB_ACTIVE` clear (loom model `umount_races_remote_park`): no
/// inode is parked after an umount's drain, and none keeps an unmounted superblock.
pub(crate) fn park<F: SuperOperations>(sb: &SbInner<F>, inode: &Inode<F>, c: &CpuCounters<'_>) {
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
    c.add(Counter::OutboxLocks, 1);
    let mut o = sb.slots[c.slot].outbox.lock();
    let mut p = InodePtr(NonNull::from(inode));
    if !sb.is_active() {
        drop(o);
        unlist_parked(sb, std::slice::from_mut(&mut p), c);
        free_inode(inode, &pin, c);
        return;
    }
    if o.items.capacity() == 0 {
        o.items.reserve_exact(OUTBOX_CAPACITY);
    }
    o.items.push(p);
    if o.items.len() >= OUTBOX_CAPACITY {
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
pub(crate) fn flush_parked<F: SuperOperations>(
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
