//! A filesystem whose inode data panics in its `Drop`: the panic reaches the caller of the
//! operation whose reclaim freed that inode, and it leaks nothing else. Every other
//! inode is evicted and freed, the superblock's live count reaches 0 and the superblock
//! (with the filesystem it owns) is freed. Before session 10 the panic unwound from the
//! middle of an eviction (a pin or a retire that reclaimed): the inode being evicted was
//! never freed and its superblock never either.
//!
//! Its own test binary: the reclaim that meets the panicking box may run on any thread
//! of the process.
#![cfg(not(any(vfscale_loom, vfscale_shuttle)))]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use vfscale_icache::{flush_deferred, Iget, InodeCache, Settings, SuperBlock, SuperOperations};

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

/// Drops `sb` and waits until its filesystem is gone; then every inode's data must have
/// been dropped once and none be left cached.
fn unmount_and_check(cache: &InodeCache<Fs>, sb: SuperBlock<Fs>, alive: Arc<()>, drops: &AtomicUsize) {
    drop(sb);
    for _ in 0..10_000 {
        // A panic here would be a second one from the same box: there is one.
        flush_deferred();
        if Arc::strong_count(&alive) == 1 {
            break;
        }
        std::thread::yield_now();
    }
    assert_eq!(cache.stats().nr_inodes, 0);
    assert_eq!(
        drops.load(Ordering::SeqCst),
        N as usize,
        "every inode's data dropped once"
    );
    assert_eq!(
        Arc::strong_count(&alive),
        1,
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
        let mut panics = 0;
        for ino in 1..=N {
            let r = catch_unwind(AssertUnwindSafe(|| {
                let Some(Iget::New(new)) = sb.iget_locked(ino) else {
                    panic!("inode {ino} is not new")
                };
                let r = new.unlock_new_inode();
                r.clear_nlink();
                drop(r);
            }));
            panics += usize::from(r.is_err());
        }
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
