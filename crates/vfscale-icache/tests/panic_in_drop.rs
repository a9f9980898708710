//! A filesystem whose inode data panics in its `Drop`: the panic reaches the caller of the
//! operation whose reclaim freed that inode, and it leaks nothing else. Every other
//! inode is evicted and freed, the superblock's live count reaches 0 and the superblock
//! (with the filesystem it owns) is freed. Before session 10 the panic unwound from the
//! middle of an eviction (a pin or a retire that reclaimed): the inode being evicted was
//! never freed and its superblock never either.
//!
//! The same for the filesystem's own operations inside an eviction (`->write_inode`,
//! `->evict_inode`, `->destroy_inode`): the eviction finishes, then the panic reaches the
//! caller. Let through, a panic there left the inode hashed and `I_WILL_FREE` or
//! `I_FREEING`, and every later lookup of its number waited for ever.
//!
//! Its own test binary: the reclaim that meets the panicking box may run on any thread
//! of the process.
#![cfg(not(any(vfscale_loom, vfscale_shuttle)))]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use std::sync::mpsc;
use std::time::Duration;

use vfscale_icache::{
    flush_deferred, Iget, Inode, InodeCache, InodeRef, Settings, SuperBlock, SuperOperations,
};

/// Inode data: counts its drops; the first one made panics when dropped.
struct Data {
    panics: bool,
    drops: Arc<AtomicUsize>,
}

impl Drop for Data {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
        if self.panics {
            panic!("inode data panics in its drop");
        }
    }
}

struct Fs {
    /// Dropped with the filesystem, so with the superblock that owns it.
    _alive: Arc<()>,
    drops: Arc<AtomicUsize>,
    first: AtomicBool,
}

impl SuperOperations for Fs {
    type Data = Data;
    fn alloc_inode(&self, _ino: u64) -> Data {
        Data {
            panics: self.first.swap(false, Ordering::SeqCst),
            drops: self.drops.clone(),
        }
    }
}

const N: u64 = 1000;

fn mount(cache: &InodeCache<Fs>) -> (SuperBlock<Fs>, Arc<()>, Arc<AtomicUsize>) {
    let alive = Arc::new(());
    let drops = Arc::new(AtomicUsize::new(0));
    let sb = cache.mount(Fs {
        _alive: alive.clone(),
        drops: drops.clone(),
        first: AtomicBool::new(true),
    });
    (sb, alive, drops)
}

/// Loads each of `inos` new, hands it to `last` and puts it, catching panics: how many
/// reached this caller.
fn load_and_put<F: SuperOperations>(
    sb: &SuperBlock<F>,
    inos: std::ops::RangeInclusive<u64>,
    last: impl Fn(&InodeRef<F>),
) -> usize {
    let mut panics = 0;
    for ino in inos {
        let r = catch_unwind(AssertUnwindSafe(|| {
            let Some(Iget::New(new)) = sb.iget_locked(ino) else {
                panic!("inode {ino} is not new")
            };
            let r = new.unlock_new_inode();
            last(&r);
            drop(r);
        }));
        panics += usize::from(r.is_err());
    }
    panics
}

/// Waits (flushing deferred frees) until the superblock that holds the other reference to
/// `alive` is freed; false if it never is.
fn superblock_freed(alive: &Arc<()>) -> bool {
    for _ in 0..10_000 {
        // A panic here would be a second one from the same box: there is one.
        flush_deferred();
        if Arc::strong_count(alive) == 1 {
            return true;
        }
        std::thread::yield_now();
    }
    false
}

/// Drops `sb` and waits until its filesystem is gone; then every inode's data must have
/// been dropped once and none be left cached.
fn unmount_and_check(cache: &InodeCache<Fs>, sb: SuperBlock<Fs>, alive: Arc<()>, drops: &AtomicUsize) {
    drop(sb);
    let freed = superblock_freed(&alive);
    assert_eq!(cache.stats().nr_inodes, 0);
    assert_eq!(
        drops.load(Ordering::SeqCst),
        N as usize,
        "every inode's data dropped once"
    );
    assert!(
        freed,
        "the superblock (which owns the filesystem) was never freed"
    );
}

/// Unlinked inodes evicted at their last `iput`, one after the other: the reclaims run
/// by the evictions meet the panicking box.
#[test]
fn a_panicking_drop_during_evictions_leaks_nothing_else() {
    std::thread::spawn(|| {
        let cache = InodeCache::new(Settings::default());
        let (sb, alive, drops) = mount(&cache);
        let mut panics = load_and_put(&sb, 1..=N, |r| r.clear_nlink());
        flush_deferred_catching(&mut panics);
        assert_eq!(panics, 1, "the drop's panic reached a caller once");
        unmount_and_check(&cache, sb, alive, &drops);
    })
    .join()
    .unwrap();
}

/// Unused inodes evicted by one prune: the panic waits until every inode of the prune's
/// list was evicted.
#[test]
fn a_panicking_drop_during_a_prune_leaks_nothing_else() {
    std::thread::spawn(|| {
        let cache = InodeCache::new(Settings::default());
        let (sb, alive, drops) = mount(&cache);
        for ino in 1..=N {
            let Some(Iget::New(new)) = sb.iget_locked(ino) else {
                panic!("inode {ino} is not new")
            };
            drop(new.unlock_new_inode());
        }
        let mut panics = 0;
        let r = catch_unwind(AssertUnwindSafe(|| sb.prune_icache_sb(usize::MAX)));
        match r {
            Ok(n) => assert_eq!(n, N as usize),
            Err(_) => panics += 1,
        }
        assert_eq!(cache.stats().nr_inodes, 0, "the prune evicted every inode");
        flush_deferred_catching(&mut panics);
        assert_eq!(panics, 1, "the drop's panic reached a caller once");
        unmount_and_check(&cache, sb, alive, &drops);
    })
    .join()
    .unwrap();
}

/// `flush_deferred` until nothing is left, counting the panics it passes on.
fn flush_deferred_catching(panics: &mut usize) {
    for _ in 0..100 {
        *panics += usize::from(catch_unwind(flush_deferred).is_err());
    }
}

/// Which of its operations a [`Faulty`] filesystem panics in, for inode 7.
#[derive(Clone, Copy, Debug)]
enum Op {
    Write,
    Evict,
    Destroy,
}

struct Faulty {
    op: Op,
    _alive: Arc<()>,
    destroyed: Arc<AtomicUsize>,
}

const BAD: u64 = 7;

impl SuperOperations for Faulty {
    type Data = ();
    fn alloc_inode(&self, _ino: u64) {}
    fn write_inode(&self, inode: &Inode<Self>) {
        if matches!(self.op, Op::Write) && inode.ino() == BAD {
            panic!("write_inode panics");
        }
    }
    fn evict_inode(&self, inode: &Inode<Self>) {
        if matches!(self.op, Op::Evict) && inode.ino() == BAD {
            panic!("evict_inode panics");
        }
    }
    fn destroy_inode(&self, inode: &Inode<Self>) {
        self.destroyed.fetch_add(1, Ordering::SeqCst);
        if matches!(self.op, Op::Destroy) && inode.ino() == BAD {
            panic!("destroy_inode panics");
        }
    }
}

/// Each operation in turn panics for inode 7 while 20 inodes are evicted at their last
/// `iput` (`I_DONTCACHE`, so `->write_inode` runs first): the panic reaches that `iput`'s
/// caller once, inode 7 is gone all the same (a new lookup of its number loads it again,
/// within 10 s rather than waiting for ever), and unmounting frees the superblock.
#[test]
fn a_panicking_operation_still_finishes_its_eviction() {
    for op in [Op::Write, Op::Evict, Op::Destroy] {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let alive = Arc::new(());
            let destroyed = Arc::new(AtomicUsize::new(0));
            let cache = InodeCache::new(Settings::default());
            let sb = cache.mount(Faulty {
                op,
                _alive: alive.clone(),
                destroyed: destroyed.clone(),
            });
            let panics = load_and_put(&sb, 1..=20, |r| r.mark_dontcache());
            assert_eq!(panics, 1, "{op:?}: the panic reached the caller once");
            assert_eq!(destroyed.load(Ordering::SeqCst), 20, "{op:?}");
            assert_eq!(cache.stats().nr_inodes, 0, "{op:?}");
            // Not hashed, not being freed: a lookup loads it again at once.
            match sb.iget_locked(BAD) {
                Some(Iget::New(n)) => n.discard_new_inode(),
                _ => panic!("{op:?}: inode {BAD} is still cached"),
            }
            let r = catch_unwind(AssertUnwindSafe(|| sb.umount()));
            assert!(matches!(r, Ok(0) | Err(_)), "{op:?}: busy inodes after umount");
            drop(sb);
            assert!(superblock_freed(&alive), "{op:?}: the superblock was never freed");
            tx.send(()).unwrap();
        });
        rx.recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{op:?}: the test failed or hung (a lookup waiting for ever)"));
    }
}
