//! `iput` and `iput_final`: the last reference keeps an inode on the LRU or evicts it,
//! with the LRU shard lock guessed and taken before `i_lock` (lock order).

use std::ptr::NonNull;

use crate::counters::{Counter, CpuCounters};
use crate::evict::{catch_op, evict, evict_with, resume};
use crate::inode::*;
use crate::lru::{inode_lru_list_add, lru_add_locked, LruShard};
use crate::superblock::SbInner;
use crate::sync::{ILockGuard, Ordering, ShardGuard};
use crate::SuperOperations;

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
            c.add(Counter::NrUnused, -1);
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
pub(crate) fn iput_evict<F: SuperOperations>(inode: &Inode<F>, g: ILockGuard<'_>, drop_it: bool) {
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
