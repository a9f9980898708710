//! The inode hash table: one word per chain (`hlist_bl_head`, its lock in bit 0), the
//! guard that holds a chain for insert and remove (its bit lock or `inode_hash_lock`),
//! and linking and unlinking an inode (`hlist_add_head_rcu`, `__remove_inode_hash`).

use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::cache::CacheInner;
use crate::counters::{Counter, CpuCounters};
use crate::inode::*;
use crate::superblock::SbInner;
use crate::sync::{AtomicUsize, MutexGuard, Ordering, SpinWait};
use crate::{HashLock, SuperOperations};

/// One hash chain (`hlist_bl_head`): one word, the first inode's address with the chain's
/// lock in bit 0 (a bit spinlock; inodes are at least 8-aligned, so bit 0 of an address is
/// free). Lock-free readers mask the bit off.
pub(crate) struct ChainHead<F: SuperOperations> {
    head: AtomicUsize,
    _inode: PhantomData<fn() -> F>,
}

/// Bit 0 of a chain head: `hlist_bl_lock`.
const CHAIN_LOCK: usize = 1;

impl<F: SuperOperations> ChainHead<F> {
    pub(crate) fn new() -> Self {
        ChainHead {
            head: AtomicUsize::new(0),
            _inode: PhantomData,
        }
    }

    /// `hlist_bl_first`: the first inode (lock bit masked off).
    pub(crate) fn first(&self, o: Ordering) -> *mut Inode<F> {
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
    /// model then loses the store (`loom_bitlock` below checks it). A failed
    /// compare-exchange writes nothing, so the waiter never dirties the holder's line.
    pub(crate) fn lock(&self) {
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
    pub(crate) fn prefetch(&self) {
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
    pub(crate) fn is_locked(&self) -> bool {
        self.head.load(Ordering::Relaxed) & CHAIN_LOCK != 0
    }
}

/// What holds a chain for insert and remove: its bit lock, or `inode_hash_lock`.
pub(crate) enum HashGuard<'a, F: SuperOperations> {
    Global(#[allow(dead_code)] MutexGuard<'a, ()>),
    Chain(&'a ChainHead<F>),
}

impl<F: SuperOperations> Drop for HashGuard<'_, F> {
    fn drop(&mut self) {
        if let HashGuard::Chain(b) = self {
            b.unlock();
        }
    }
}

impl<F: SuperOperations> CacheInner<F> {
    pub(crate) fn chain(&self, sb: &SbInner<F>, hashval: u64) -> &ChainHead<F> {
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
    pub(crate) fn hash_lock<'a>(&'a self, b: &'a ChainHead<F>) -> HashGuard<'a, F> {
        self.hash_lock_with(&self.counters(), b)
    }

    /// [`CacheInner::hash_lock`], counted on `c`.
    pub(crate) fn hash_lock_with<'a>(&'a self, c: &CpuCounters<'_>, b: &'a ChainHead<F>) -> HashGuard<'a, F> {
        match self.settings.hash_lock {
            HashLock::Global => {
                c.add(Counter::GlobalLocks, 1);
                HashGuard::Global(self.global_hash_lock.lock())
            }
            HashLock::PerChain => {
                c.add(Counter::ChainLocks, 1);
                b.lock();
                HashGuard::Chain(b)
            }
        }
    }

    pub(crate) fn hash_locked(&self, b: &ChainHead<F>) -> bool {
        match self.settings.hash_lock {
            HashLock::Global => self.global_hash_lock.is_locked(),
            HashLock::PerChain => b.is_locked(),
        }
    }
}

/// `hlist_add_head_rcu`: the caller holds the chain's lock and the inode's `i_lock`.
pub(crate) fn hash_link<F: SuperOperations>(cache: &CacheInner<F>, b: &ChainHead<F>, inode: &Inode<F>) {
    debug_assert!(cache.hash_locked(b));
    inode
        .hash_next
        .store(b.first(Ordering::Relaxed), Ordering::Relaxed);
    // Release: a lock-free walker that loads the pointer sees the initialized inode.
    b.set_first(NonNull::from(inode).as_ptr());
    inode.set_bits(HASHED | WAS_HASHED);
}

/// `insert_inode_locked`'s insert: hashes `inode` `I_NEW | I_CREATING` on chain `b`, whose
/// lock (`h`) the caller holds; drops that lock after.
///
/// # Panics
/// If the inode was hashed before (after dropping the locks).
pub(crate) fn hash_inserted<F: SuperOperations>(
    cache: &CacheInner<F>,
    b: &ChainHead<F>,
    h: HashGuard<'_, F>,
    inode: &Inode<F>,
) {
    {
        let _g = inode.lock();
        if inode.state.load(Ordering::Relaxed) & WAS_HASHED != 0 {
            drop(_g);
            drop(h);
            panic!("insert_inode_locked: {} was hashed before", inode.name());
        }
        inode.set_bits(I_NEW | I_CREATING);
        hash_link(cache, b, inode);
    }
    drop(h);
}

/// `remove_inode_hash`.
pub(crate) fn remove_inode_hash<F: SuperOperations>(inode: &Inode<F>) {
    let cache = &*inode.sb().cache;
    let b = cache.chain(inode.sb(), inode.hashval);
    let _h = cache.hash_lock(b);
    let _g = inode.lock();
    hash_unlink_locked(cache, b, inode);
}

/// `__remove_inode_hash`: unlinks `inode` from chain `b` if it is hashed. The caller
/// holds the chain's lock (or `inode_hash_lock`) and the inode's `i_lock`.
pub(crate) fn hash_unlink_locked<F: SuperOperations>(
    cache: &CacheInner<F>,
    b: &ChainHead<F>,
    inode: &Inode<F>,
) {
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

#[cfg(all(test, vfscale_loom))]
mod loom_bitlock {
    use std::sync::Arc;

    use super::*;

    struct Nop;
    impl SuperOperations for Nop {
        type Data = ();
        fn alloc_inode(&self, _: u64) {}
    }

    #[test]
    fn two_lockers_of_one_chain_exclude_each_other() {
        loom::model(|| {
            let b = Arc::new(ChainHead::<Nop>::new());
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
