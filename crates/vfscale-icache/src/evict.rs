//! `evict`: `->evict_inode`, `clear_inode` and the unhash under one hold, the wake-up of
//! the lookups waiting for it, and the hand-off to the free (or to the outbox when
//! another CPU listed the inode). The filesystem's panics are held until it finishes.

use crate::counters::{Counter, CpuCounters};
use crate::hash_table::hash_unlink_locked;
use crate::inode::*;
use crate::inode_alloc::destroy_inode;
use crate::lru::inode_lru_list_del;
use crate::outbox::park;
use crate::sb_list::inode_sb_list_del;
use crate::sync::Ordering;
use crate::SuperOperations;

/// A panic's payload, held while an eviction finishes.
pub(crate) type PanicPayload = Box<dyn std::any::Any + Send>;

/// Runs one of the filesystem's operations inside an eviction (`->write_inode`,
/// `->evict_inode`, `->destroy_inode`). A panic is caught and returned: the eviction
/// finishes first (unhashed, waiters woken, memory and superblock count given back) and
/// resumes it at its end. Let through, it left the inode `I_WILL_FREE` or `I_FREEING`
/// and hashed, and every later lookup of it waited for ever.
pub(crate) fn catch_op(op: impl FnOnce()) -> Option<PanicPayload> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(op)).err()
}

/// Resumes the first panic `catch_op` caught, if any.
pub(crate) fn resume(p: Option<PanicPayload>) {
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
pub(crate) fn evict_each<F: SuperOperations>(
    dispose: impl IntoIterator<Item = InodePtr<F>>,
) -> Option<PanicPayload> {
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
pub(crate) fn evict<F: SuperOperations>(inode: &Inode<F>) {
    evict_with(inode, &inode.sb().cache.counters());
}

/// [`evict`], counted on this CPU's counters `c`.
///
/// An inode listed on this CPU's shards (superblock list, and LRU if it is on one) is
/// taken off them first, as Linux's `evict` does. One on another CPU's is not: see
/// [`evict_parked`]. The LRU and the superblock list decide apart: an inode on this
/// CPU's LRU shard (or the only one) leaves it here even when its list shard parks it.
pub(crate) fn evict_with<F: SuperOperations>(inode: &Inode<F>, c: &CpuCounters<'_>) {
    // Racy but exact enough: this thread set I_FREEING (and read ON_LRU) under `i_lock`
    // before, and ON_LRU is never set again; a prune may clear it meanwhile, which each
    // taker checks again under the LRU lock and `i_lock`.
    let mut on_lru = inode.state.load(Ordering::Relaxed) & ON_LRU != 0;
    debug_assert!(inode.state.load(Ordering::Relaxed) & I_FREEING != 0);
    let sb = inode.sb();
    // Linux's `evict` finds the inode off every LRU; left on a local one while parked it
    // stayed listed and in `nr_unused` through `->evict_inode`, and a later prune met it.
    if on_lru && inode.lru_shard() == sb.lru_shard_of(c) {
        inode_lru_list_del(inode, c);
        on_lru = false;
    }
    if sb.evict_parks(inode, on_lru, c) {
        evict_parked(inode, c);
        return;
    }
    debug_assert!(!on_lru, "a remote LRU shard parks the eviction");
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
    c.add(Counter::NrInodes, -1);
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
) -> Option<PanicPayload> {
    let sb = inode.sb();
    let panicked = catch_op(|| sb.ops.evict_inode(inode));
    let w = {
        let cache = &*sb.cache;
        let b = cache.chain(sb, inode.hashval);
        let _h = cache.hash_lock_with(c, b);
        let _g = inode.lock();
        inode.set_bits(I_CLEAR);
        hash_unlink_locked(cache, b, inode);
        if PARKS {
            if inode.state.load(Ordering::Relaxed) & ON_LRU != 0 {
                c.add(Counter::NrUnused, -1);
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
