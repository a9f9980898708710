//! The general path of a lookup (`iget_locked`, `iget5_locked`, `ilookup`,
//! `insert_inode_locked`): `find_inode`, the miss that inserts an `I_NEW` inode, and the
//! settling of a found one (spin, then wait while it is `I_NEW`; start over if unhashed).
//! A waiting lookup keeps its [`LookupOp`] to run again.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::cache::CacheInner;
use crate::counters::{Counter, CpuCounters};
use crate::hash_table::{hash_inserted, hash_link, ChainHead, HashGuard};
use crate::inode::*;
use crate::inode_alloc::{alloc_inode, destroy_unpublished};
use crate::sb_list::inode_sb_list_add;
use crate::superblock::{InsertBusy, SbInner};
use crate::sync::Ordering;
use crate::waiter::{new_waiter, WaiterRef};
use crate::{Lookup, SuperOperations};

/// `test` of `iget5_locked`/`ilookup5`; `Ino` compares `i_ino` with the hash value.
pub(crate) enum InodeTest<F: SuperOperations> {
    /// `i_ino` equals the hash value (`iget_locked`, `ilookup`, `insert_inode_locked`).
    Ino,
    /// The caller's `test`.
    Custom(InodeTestFn<F>),
}

/// The caller's `test` of an inode.
pub(crate) type InodeTestFn<F> = Arc<dyn Fn(&Inode<F>) -> bool + Send + Sync>;

impl<F: SuperOperations> Clone for InodeTest<F> {
    fn clone(&self) -> Self {
        match self {
            InodeTest::Ino => InodeTest::Ino,
            InodeTest::Custom(f) => InodeTest::Custom(f.clone()),
        }
    }
}

impl<F: SuperOperations> InodeTest<F> {
    fn matches(&self, inode: &Inode<F>, hashval: u64) -> bool {
        match self {
            InodeTest::Ino => inode.ino == hashval,
            InodeTest::Custom(f) => f(inode),
        }
    }
}

/// How a new inode is made: `->alloc_inode`, or `iget5_locked`'s `set`.
pub(crate) enum NewInodeFrom<F: SuperOperations> {
    /// `->alloc_inode` of the superblock's operations.
    Alloc,
    /// `iget5_locked`'s `set`: the new inode's `i_ino` and data.
    Set(Arc<dyn Fn() -> (u64, F::Data) + Send + Sync>),
}

impl<F: SuperOperations> Clone for NewInodeFrom<F> {
    fn clone(&self) -> Self {
        match self {
            NewInodeFrom::Alloc => NewInodeFrom::Alloc,
            NewInodeFrom::Set(f) => NewInodeFrom::Set(f.clone()),
        }
    }
}

/// What [`find_inode`] found.
enum FindInode<F: SuperOperations> {
    /// No inode matches.
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
    b: &ChainHead<F>,
    hashval: u64,
    test: &InodeTest<F>,
    waiter: &mut Option<WaiterRef>,
    skip_freeing: bool,
) -> FindInode<F> {
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
                    *waiter = Some(new_waiter());
                    continue 'repeat;
                }
                // __wait_on_freeing_inode: sleep until evict() unhashes it.
                let w = waiter.get_or_insert_with(new_waiter);
                w.rearm();
                inode.set_bits(WAITERS);
                sb.cache.waits.register(inode.addr(), w);
                return FindInode::Freeing(inode.addr());
            }
            if s & I_CREATING != 0 {
                return FindInode::Creating;
            }
            return FindInode::Found(inode.iget_locked_ref(), s & I_NEW != 0);
        }
        return FindInode::Absent;
    }
}

/// What a lookup operation is, kept by a waiting one to try again.
pub(crate) enum LookupOp<F: SuperOperations> {
    /// `iget_locked`, `iget5_locked`.
    Iget {
        hashval: u64,
        test: InodeTest<F>,
        make: NewInodeFrom<F>,
    },
    /// `ilookup`, `ilookup5`.
    Lookup { hashval: u64, test: InodeTest<F> },
    /// `insert_inode_locked`, `insert_inode_locked4` (the inode until it is hashed or
    /// given back).
    Insert {
        inode: Option<InodeRef<F>>,
        test: InodeTest<F>,
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

/// What one attempt of a lookup operation ended with: its result, or the wait it
/// registered for (an [`InodeWait`](crate::InodeWait) then tries again when woken).
pub(crate) enum Attempt<F: SuperOperations> {
    /// The result.
    Done(Outcome<F>),
    /// Registered to wait for the eviction of the inode at this address.
    WaitEviction(usize),
    /// Registered to wait for the load of this `I_NEW` inode (a reference held).
    WaitLoad(InodeRef<F>),
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
pub(crate) fn spin_while_new<F: SuperOperations>(sb: &SbInner<F>, r: &Inode<F>) -> bool {
    for _ in 0..NEW_SPINS {
        // Under the models the look comes after the yield, so that the loader can end
        // the load between the lookup that found it I_NEW and the look.
        #[cfg(vfscale_loom)]
        loom::thread::yield_now();
        #[cfg(all(vfscale_shuttle, not(vfscale_loom)))]
        shuttle::thread::yield_now();
        if r.state.load(Ordering::Acquire) & I_NEW == 0 {
            sb.cache.counters().add(Counter::NewWaitsSpun, 1);
            return true;
        }
        #[cfg(not(any(vfscale_loom, vfscale_shuttle)))]
        std::hint::spin_loop();
    }
    false
}

/// How a lookup met the inode it settles.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum FoundAs {
    /// Found without `I_NEW` (never set again once clear).
    NotNew,
    /// Found `I_NEW`: spin on it, then register if still `I_NEW`.
    New,
    /// Woken from a wait on it: look under `i_lock` (no spin).
    Woken,
}

impl FoundAs {
    fn with_i_new(new: bool) -> FoundAs {
        if new {
            FoundAs::New
        } else {
            FoundAs::NotNew
        }
    }
}

/// A found inode: wait while it is `I_NEW`; then an unhashed one is put and the
/// operation starts over (`iget_locked`, `ilookup`, `insert_inode_locked` all do this).
pub(crate) fn settle_found<F: SuperOperations>(
    sb: &SbInner<F>,
    op: &mut LookupOp<F>,
    r: InodeRef<F>,
    seen: FoundAs,
    waiter: &mut Option<WaiterRef>,
) -> Attempt<F> {
    // I_NEW is set only before an inode is published, so one found without it needs no
    // second look under `i_lock`. One found I_NEW is spun on first.
    let settled = match seen {
        FoundAs::NotNew => true,
        FoundAs::New => spin_while_new(sb, &r),
        FoundAs::Woken => false,
    };
    if !settled {
        // The waiter is made before `i_lock` is taken, so that no allocation runs under
        // the spinlock; if the inode settled meanwhile it is kept for a later wait.
        let w = waiter.get_or_insert_with(new_waiter);
        let _g = r.lock();
        if r.state.load(Ordering::Relaxed) & I_NEW != 0 {
            w.rearm();
            r.set_bits(WAITERS);
            sb.cache.waits.register(r.addr(), w);
            drop(_g);
            sb.cache.counters().add(Counter::NewWaitsSlept, 1);
            return Attempt::WaitLoad(r);
        }
    }
    if !r.is_hashed() {
        drop(r);
        return run(sb, op, waiter);
    }
    Attempt::Done(match op {
        LookupOp::Iget { .. } => Outcome::Iget(Some(Iget::Cached(r))),
        LookupOp::Lookup { .. } => Outcome::Lookup(Some(r)),
        LookupOp::Insert { inode, .. } => {
            drop(r);
            Outcome::Insert(Err(InsertBusy {
                inode: inode.take().expect("insert holds its inode"),
            }))
        }
    })
}

/// A lookup's first [`find_inode`]: pinned (lock-free) or under the hash lock, as
/// [`Lookup`] says.
fn find_inode_pinned_or_locked<F: SuperOperations>(
    sb: &SbInner<F>,
    b: &ChainHead<F>,
    hashval: u64,
    test: &InodeTest<F>,
    waiter: &mut Option<WaiterRef>,
) -> FindInode<F> {
    let cache = &*sb.cache;
    match cache.settings.lookup {
        Lookup::Lockless => {
            let _p = cache.domain.pin();
            find_inode(sb, b, hashval, test, waiter, false)
        }
        Lookup::Locked => {
            let _h = cache.hash_lock(b);
            find_inode(sb, b, hashval, test, waiter, false)
        }
    }
}

/// `iget_locked`'s miss: hashes `new` (just allocated, not yet published) `I_NEW` on
/// chain `b`, whose lock (`h`) the caller holds, adds it to this CPU's superblock list
/// shard, then drops the chain lock. The caller loads it.
#[inline]
pub(crate) fn hash_new<F: SuperOperations>(
    cache: &CacheInner<F>,
    b: &ChainHead<F>,
    h: HashGuard<'_, F>,
    new: NonNull<Inode<F>>,
    c: &CpuCounters<'_>,
) -> NewInode<F> {
    // SAFETY: just allocated; published below under the chain lock.
    let inode = unsafe { new.as_ref() };
    {
        let _g = inode.lock();
        inode.set_bits(I_NEW);
        hash_link(cache, b, inode);
    }
    inode_sb_list_add(inode, c);
    drop(h);
    c.add(Counter::Loads, 1);
    NewInode::new(InodeRef { ptr: new })
}

/// Runs an operation from the start.
pub(crate) fn run<F: SuperOperations>(
    sb: &SbInner<F>,
    op: &mut LookupOp<F>,
    waiter: &mut Option<WaiterRef>,
) -> Attempt<F> {
    let cache = &*sb.cache;
    match op {
        LookupOp::Iget { hashval, test, make } => {
            let (hashval, test, make) = (*hashval, test.clone(), make.clone());
            let b = cache.chain(sb, hashval);
            match find_inode_pinned_or_locked(sb, b, hashval, &test, waiter) {
                FindInode::Creating => return Attempt::Done(Outcome::Iget(None)),
                FindInode::Freeing(a) => return Attempt::WaitEviction(a),
                FindInode::Found(r, new) => return settle_found(sb, op, r, FoundAs::with_i_new(new), waiter),
                FindInode::Absent => {}
            }
            let (ino, data) = match make {
                NewInodeFrom::Alloc => (hashval, sb.ops.alloc_inode(hashval)),
                NewInodeFrom::Set(f) => f(),
            };
            let c = cache.counters();
            let new = alloc_inode(sb, &c, ino, hashval, data);
            let h = cache.hash_lock_with(&c, b);
            // We released the lock, so..
            match find_inode(sb, b, hashval, &test, waiter, false) {
                FindInode::Absent => {
                    Attempt::Done(Outcome::Iget(Some(Iget::New(hash_new(cache, b, h, new, &c)))))
                }
                other => {
                    // Somebody else created it under us: use theirs.
                    drop(h);
                    destroy_unpublished(new);
                    match other {
                        FindInode::Creating => Attempt::Done(Outcome::Iget(None)),
                        FindInode::Freeing(a) => Attempt::WaitEviction(a),
                        FindInode::Found(r, new) => settle_found(sb, op, r, FoundAs::with_i_new(new), waiter),
                        FindInode::Absent => unreachable!(),
                    }
                }
            }
        }
        LookupOp::Lookup { hashval, test } => {
            let (hashval, test) = (*hashval, test.clone());
            let b = cache.chain(sb, hashval);
            match find_inode_pinned_or_locked(sb, b, hashval, &test, waiter) {
                FindInode::Absent | FindInode::Creating => Attempt::Done(Outcome::Lookup(None)),
                FindInode::Freeing(a) => Attempt::WaitEviction(a),
                FindInode::Found(r, new) => settle_found(sb, op, r, FoundAs::with_i_new(new), waiter),
            }
        }
        LookupOp::Insert { inode, test } => {
            let test = test.clone();
            let me = inode.as_ref().expect("insert holds its inode");
            let hashval = me.hashval;
            let b = cache.chain(sb, hashval);
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
                    hash_inserted(cache, b, h, me);
                    cache.counters().add(Counter::Loads, 1);
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
                    settle_found(sb, op, r, FoundAs::with_i_new(new), waiter)
                }
            }
        }
    }
}
