//! The fast paths of a lookup by inode number: a cached hit, an `I_NEW` hit and a miss of
//! `iget_locked`/`ilookup`, and an uncontended `insert_inode_locked`, without building
//! the operation that only a wait needs. Anything else goes to the general path
//! ([`crate::lookup`]), which looks again from the start.

use std::ptr::NonNull;

use crate::counters::Counter;
use crate::hash_table::{hash_inserted, ChainHead};
use crate::inode::*;
use crate::inode_alloc::{alloc_inode, destroy_unpublished};
use crate::lookup::{hash_new, spin_while_new};
use crate::superblock::SbInner;
use crate::sync::Ordering;
use crate::{Lookup, SuperOperations};

/// What a walk of a chain found for an inode number (see [`match_ino_on_chain`]).
pub(crate) enum InoMatch<F: SuperOperations> {
    /// Hashed, neither `I_NEW`, `I_CREATING` nor being freed: a reference taken.
    Cached(InodeRef<F>),
    /// Hashed and `I_NEW` (not `I_CREATING`, not being freed): a reference taken, as
    /// `find_inode` takes one before it waits; the caller settles it ([`settle_found`]).
    New(InodeRef<F>),
    /// The first match is in some other state: the full path decides (it may wait).
    Busy,
    /// No inode of this superblock has the number on the chain.
    Absent,
}

/// The walk of `iget_locked`/`ilookup` by inode number (`find_inode_fast`), without
/// building the operation that only a wait or a miss needs (it would cost more than the
/// rest of a cached `stat`): the first match decides; a hashed inode that is not
/// `I_CREATING` or being freed gets a reference under its `i_lock` (`__iget`), as
/// [`find_inode`] gives it. The caller is pinned (lock-free walk) or holds the chain's
/// lock; with [`Lookup::Locked`] the lock-free walk is not used (a miss would take the
/// hash lock once more, here and then in `run`, so that setting keeps the one path it
/// always had).
///
/// `ChainHold::Pinned`: a match seen `I_NEW` without the lock is first spun on read-only
/// ([`spin_while_new`]) before its `i_lock` is taken. In a cold walk two tasks meet on
/// the same misses, and the one that finds the other's inode `I_NEW` took `i_lock` and
/// the reference at once, writing the line the loader is still filling and is about to
/// write again (`unlock_new_inode`, its own `iput`): each such write moved the line
/// between the CPUs once more. The look under `i_lock` after the spin decides as before
/// (still `I_NEW` → [`InoMatch::New`], the caller spins or sleeps; unhashed or being freed →
/// [`InoMatch::Busy`]), so the lookup is the same as one that started later; the inode
/// stays valid while pinned, and the walk compared `i_sb` with `sb` before the spin uses
/// `sb`. Never under the chain lock (`ChainHold::Locked`): the spin would hold it.
fn match_ino_on_chain<F: SuperOperations>(
    sb: &SbInner<F>,
    b: &ChainHead<F>,
    ino: u64,
    walk: ChainHold,
) -> InoMatch<F> {
    let mut p = b.first(Ordering::Acquire);
    while let Some(n) = NonNull::new(p) {
        // SAFETY: reached from the chain while pinned or under the chain lock (the
        // caller's): the inode is freed only a grace period after it left the chain.
        let inode = unsafe { n.as_ref() };
        p = inode.hash_next.load(Ordering::Acquire);
        if inode.sb != sb.this || inode.hashval != ino || inode.ino != ino {
            continue;
        }
        if walk == ChainHold::Pinned && inode.state.load(Ordering::Relaxed) & I_NEW != 0 {
            spin_while_new(sb, inode);
        }
        // The first match decides, as in `find_inode` (newest first).
        let _g = inode.lock();
        let s = inode.state.load(Ordering::Relaxed);
        if s & (I_CREATING | I_FREEING | I_WILL_FREE) != 0 || s & HASHED == 0 {
            return InoMatch::Busy;
        }
        let r = inode.iget_locked_ref();
        return if s & I_NEW != 0 {
            InoMatch::New(r)
        } else {
            InoMatch::Cached(r)
        };
    }
    InoMatch::Absent
}

/// How [`match_ino_on_chain`]'s caller holds the chain.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ChainHold {
    /// Pinned, without the chain lock (lock-free lookup).
    Pinned,
    /// Under the chain lock.
    Locked,
}

/// `ilookup`'s walk (see [`match_ino_on_chain`]); `InoMatch::Busy` or `InoMatch::Absent`: the caller takes
/// the full path, which looks again from the start (nothing was changed).
pub(crate) fn ilookup_fast<F: SuperOperations>(sb: &SbInner<F>, ino: u64) -> InoMatch<F> {
    let cache = &*sb.cache;
    if cache.settings.lookup != Lookup::Lockless {
        return InoMatch::Busy;
    }
    let b = cache.chain(sb, ino);
    let _pin = cache.domain.pin();
    match_ino_on_chain(sb, b, ino, ChainHold::Pinned)
}

/// What [`iget_fast`] did.
pub(crate) enum IgetFastPath<F: SuperOperations> {
    /// The result.
    Done(Iget<F>),
    /// Found `I_NEW`, with a reference: settle it ([`settle_found`]).
    SettleNew(InodeRef<F>),
    /// The full path decides.
    FullPath,
}

/// `iget_locked` by inode number without the operation machinery, for the common cases: a
/// cached hit or an `I_NEW` inode ([`match_ino_on_chain`]), and a miss (the pinned walk found no
/// inode with the number; allocate, take the chain lock, look again, and if there is
/// still none hash the new inode `I_NEW` and add it to the superblock list, exactly as
/// `run`'s miss does; if the look under the lock finds one, the new inode is destroyed
/// unpublished and the one found is used as `run` would). Anything else (`I_CREATING`, an
/// inode being freed) gives [`IgetFastPath::FullPath`]: the caller takes the full path, which looks
/// again from the start.
pub(crate) fn iget_fast<F: SuperOperations>(sb: &SbInner<F>, ino: u64) -> IgetFastPath<F> {
    let cache = &*sb.cache;
    if cache.settings.lookup != Lookup::Lockless {
        return IgetFastPath::FullPath;
    }
    let b = cache.chain(sb, ino);
    {
        let _pin = cache.domain.pin();
        match match_ino_on_chain(sb, b, ino, ChainHold::Pinned) {
            InoMatch::Cached(r) => return IgetFastPath::Done(Iget::Cached(r)),
            InoMatch::New(r) => return IgetFastPath::SettleNew(r),
            InoMatch::Busy => return IgetFastPath::FullPath,
            InoMatch::Absent => {}
        }
    }
    let c = cache.counters();
    let new = alloc_inode(sb, &c, ino, ino, sb.ops.alloc_inode(ino));
    let h = cache.hash_lock_with(&c, b);
    // We released the lock, so..
    let again = match_ino_on_chain(sb, b, ino, ChainHold::Locked);
    if !matches!(again, InoMatch::Absent) {
        // Somebody inserted it since: use theirs.
        drop(h);
        destroy_unpublished(new);
        return match again {
            InoMatch::Cached(r) => IgetFastPath::Done(Iget::Cached(r)),
            InoMatch::New(r) => IgetFastPath::SettleNew(r),
            _ => IgetFastPath::FullPath,
        };
    }
    IgetFastPath::Done(Iget::New(hash_new(cache, b, h, new, &c)))
}

/// Whether chain `b` holds an inode of `sb` with this hash value and `i_ino`, in any
/// state. The caller holds the chain's lock.
fn chain_has<F: SuperOperations>(sb: &SbInner<F>, b: &ChainHead<F>, hashval: u64, ino: u64) -> bool {
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
pub(crate) fn insert_fast<F: SuperOperations>(
    sb: &SbInner<F>,
    inode: InodeRef<F>,
) -> Result<NewInode<F>, InodeRef<F>> {
    let cache = &*sb.cache;
    let hashval = inode.hashval;
    let b = cache.chain(sb, hashval);
    let c = cache.counters();
    let h = cache.hash_lock_with(&c, b);
    if chain_has(sb, b, hashval, hashval) {
        drop(h);
        return Err(inode);
    }
    hash_inserted(cache, b, h, &inode);
    c.add(Counter::Loads, 1);
    Ok(NewInode::new(inode))
}
