//! An inode's memory: `alloc_inode`, `destroy_inode` and the free a grace period later,
//! with the superblock's live-inode count that each of them moves.

use std::ptr::NonNull;

use crate::counters::{Counter, CpuCounters};
use crate::deferred_free::{reclaim_due, Guard};
use crate::evict::{catch_op, resume};
use crate::inode::*;
use crate::superblock::{sb_inode_gone, SbInner};
use crate::sync::{AtomicPtr, AtomicU32, ILock, Ordering};
use crate::SuperOperations;

/// `alloc_inode` + `inode_init_always`: `i_count` 1, `nlink` 1, no state.
pub(crate) fn alloc_inode<F: SuperOperations>(
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
    c.add(Counter::NrInodes, 1);
    NonNull::from(Box::leak(b))
}

/// `destroy_inode` of an inode nobody else ever saw (lost the insert race).
pub(crate) fn destroy_unpublished<F: SuperOperations>(p: NonNull<Inode<F>>) {
    // SAFETY: `p` came from `alloc_inode` and was never published: this is the only pointer.
    let b = unsafe { Box::from_raw(p.as_ptr()) };
    let sb = b.sb();
    let p = catch_op(|| sb.ops.destroy_inode(&b));
    let c = sb.cache.counters();
    c.add(Counter::NrInodes, -1);
    {
        // Quiet: a reclaim's panic must not skip the superblock's live count.
        let pin = sb.cache.domain.pin_quiet();
        sb_inode_gone(sb, &pin, &c);
    }
    resume(p);
}

/// `destroy_inode` of an inode off every list: `->destroy_inode` and `nr_inodes` (Linux's
/// `__destroy_inode`) now, the memory a grace period later ([`free_inode`]); `c` is this
/// CPU's counters.
///
/// Reclaim panics: the eviction's last step. Its pin is quiet and its free queued
/// without freeing; a reclaim then runs once all of it is done ([`reclaim_due`]), so a
/// retired box's `Drop` that panics unwinds from a finished eviction, not from one that
/// lost its free or its superblock's live count.
pub(crate) fn destroy_inode<F: SuperOperations>(inode: &Inode<F>, c: &CpuCounters<'_>) {
    let p = catch_op(|| inode.sb().ops.destroy_inode(inode));
    c.add(Counter::NrInodes, -1);
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
pub(crate) fn free_inode<F: SuperOperations>(inode: &Inode<F>, pin: &Guard, c: &CpuCounters<'_>) {
    let sb = inode.sb();
    let p = NonNull::from(inode).as_ptr();
    // SAFETY: the inode is off every list and chain, nobody holds a reference, and
    // walkers that may still see its pointer are pinned: the box (from `alloc_inode`'s
    // `Box::leak`) is freed after them.
    unsafe { pin.defer_free_box_quiet(p) };
    // The inode's last use of its superblock (which may be freed a grace period later).
    sb_inode_gone(sb, pin, c);
}
