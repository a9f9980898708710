//! The LRU (`s_inode_lru`): one intrusive list per CPU shard (`list_lru_one`), adding an
//! unused inode (`__inode_add_lru`), taking one off, and the shrinker's walk
//! (`prune_icache_sb`'s per-shard part, `inode_lru_isolate`).

use std::ptr::NonNull;
use std::sync::atomic::AtomicUsize as StdAtomicUsize;

use crate::counters::{Counter, CpuCounters};
use crate::inode::*;
use crate::iput::iput_evict;
use crate::superblock::SbInner;
use crate::sync::{Ordering, ShardGuard, ShardMutex};
use crate::{Lru, SuperOperations};

/// One LRU list (`list_lru_one`): a doubly-linked list through the inodes' `lru_prev` /
/// `lru_next`, oldest at `head`. Add, delete and rotate are O(1) and allocate nothing.
/// The links of an inode on it are read and written only under this shard's lock.
pub(crate) struct LruShard<F: SuperOperations> {
    pub(crate) head: Option<InodePtr<F>>,
    pub(crate) tail: Option<InodePtr<F>>,
    pub(crate) len: usize,
    /// Its index in the superblock's LRU shards (what an inode on it has as `lru_shard`).
    pub(crate) shard: u32,
}

impl<F: SuperOperations> LruShard<F> {
    pub(crate) fn new(shard: usize) -> Self {
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
    pub(crate) fn owns(&self, inode: &Inode<F>) -> bool {
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
    pub(crate) fn del(&mut self, inode: &Inode<F>) {
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
    pub(crate) fn next_of(&self, inode: &Inode<F>) -> Option<InodePtr<F>> {
        debug_assert!(self.owns(inode));
        NonNull::new(inode.lru_next.load(Ordering::Relaxed)).map(InodePtr)
    }
}

/// One LRU shard and its length on the same lines: the length is written under the
/// shard's lock on every add and delete and read without it (the shrinker's `count`), so
/// a line of its own would be one more line per LRU operation (a transfer between CPUs
/// when an eviction takes an inode off another CPU's shard).
pub(crate) struct LruSlot<F: SuperOperations> {
    pub(crate) list: ShardMutex<LruShard<F>>,
    /// `list`'s `len`, for readers that do not take the lock.
    pub(crate) len: StdAtomicUsize,
}

impl<F: SuperOperations> SbInner<F> {
    pub(crate) fn lru_lock(&self, shard: usize) -> ShardGuard<'_, LruShard<F>> {
        self.lru_lock_with(&self.cache.counters(), shard)
    }

    /// [`SbInner::lru_lock`], counted on `c`.
    pub(crate) fn lru_lock_with(&self, c: &CpuCounters<'_>, shard: usize) -> ShardGuard<'_, LruShard<F>> {
        if self.cache.settings.lru == Lru::Single {
            c.add(Counter::GlobalLocks, 1);
        } else {
            c.add(Counter::LruShardLocks, 1);
        }
        self.lru[shard].list.lock()
    }

    /// The LRU shard a last `iput` on `c`'s CPU adds to.
    pub(crate) fn lru_shard_of(&self, c: &CpuCounters<'_>) -> usize {
        if self.cache.settings.lru == Lru::Single {
            0
        } else {
            c.shard
        }
    }

    /// The LRU shards' lengths, summed without a lock.
    pub(crate) fn lru_len(&self) -> usize {
        self.lru.iter().map(|l| l.len.load(Ordering::Relaxed)).sum()
    }
}

/// `__inode_add_lru` after `iput_final` dropped `i_lock`: checks again under both locks.
pub(crate) fn inode_lru_list_add<F: SuperOperations>(inode: &Inode<F>) {
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
pub(crate) fn lru_add_locked<F: SuperOperations>(
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
    c.add(Counter::NrUnused, 1);
}

/// `inode_lru_list_del` of an inode the caller is evicting (`I_FREEING`), counted on `c`:
/// if it is still on its LRU (a prune may have taken it off), under that shard's lock
/// and `i_lock`. Out of line: an unlink's last `iput` takes the inode off this CPU's LRU
/// itself, before `i_lock` (`iput_final`).
#[inline(never)]
pub(crate) fn inode_lru_list_del<F: SuperOperations>(inode: &Inode<F>, c: &CpuCounters<'_>) {
    let sb = inode.sb();
    let shard = inode.lru_shard();
    let mut l = sb.lru_lock_with(c, shard);
    lru_del_evicting(&mut l, inode, c);
    sb.lru[shard].len.store(l.len, Ordering::Relaxed);
}

/// Takes an inode being evicted off its LRU shard (whose lock the caller holds: `l`)
/// if it is still on it, under its `i_lock`; `nr_unused` drops unless the inode was
/// counted out when it was parked. The caller updates the shard's length mirror.
pub(crate) fn lru_del_evicting<F: SuperOperations>(
    l: &mut LruShard<F>,
    inode: &Inode<F>,
    c: &CpuCounters<'_>,
) {
    let _g = inode.lock();
    let s = inode.state.load(Ordering::Relaxed);
    debug_assert!(s & I_FREEING != 0);
    if s & ON_LRU != 0 {
        l.del(inode);
        inode.clear_bits(ON_LRU);
        if s & PARKED == 0 {
            c.add(Counter::NrUnused, -1);
        }
    }
}

/// A shard's share of a scan of `nr_to_scan` over shards of `total` inodes: in proportion
/// to its `len`, rounded up, at most the `left` of the scan. In u128: `nr_to_scan` may be
/// anything up to `usize::MAX` ("scan all"), whose product with a length overflows.
pub(crate) fn scan_share(nr_to_scan: usize, len: usize, total: usize, left: usize) -> usize {
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
pub(crate) fn prune_shard<F: SuperOperations>(
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
                sb.cache.counters().add(Counter::NrUnused, -1);
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
            sb.cache.counters().add(Counter::NrUnused, -1);
            dispose.push(p);
            freed += 1;
        }
        cur = next;
    }
    sb.lru[shard].len.store(l.len, Ordering::Relaxed);
    freed
}

#[cfg(all(test, not(any(vfscale_loom, vfscale_shuttle))))]
mod tests {
    use super::scan_share;

    /// A scan's split over shards never overflows: with `nr_to_scan` = usize::MAX or
    /// 2^63 every shard's share covers its whole length (a wrapped product would give a
    /// shard of 2 inodes a share of 0 at 2^63, and panic in a debug build). A share above
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
