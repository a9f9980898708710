//! loom models of the two lock-free hand-offs: the `I_NEW` hand-off (a loader fills the
//! inode and unlocks it or fails, racing a second lookup of the same key) and a lock-free
//! lookup racing the eviction of the inode it finds; and of the cached hit (`ilookup_fast`)
//! racing a last `iput` that keeps the inode on the LRU and the shrinker; and of batched
//! removal (an eviction of an inode listed on another thread's shards parks it in an
//! outbox, 2 under the models) racing umount, the shrinker and a lookup of its key. Under
//! the models each thread has its own shard (the main thread 0, the first spawned 1, the
//! next 0), so the LRU and counters are used across shards. Run with
//! `RUSTFLAGS="--cfg vfscale_loom" CARGO_TARGET_DIR=target/loom cargo test -p vfscale-icache --release --test loom`.
#![cfg(vfscale_loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use vfscale_icache::*;

/// The filesystem's inode: a plain (non-atomic) field written while I_NEW, read by whoever
/// gets the inode afterwards. loom reports a data race if the hand-off does not order them.
struct Data {
    value: UnsafeCell<u64>,
}

// SAFETY: `value` is written only by the loader while the inode is I_NEW and read only
// after the load ended (that ordering is what the model checks).
unsafe impl Sync for Data {}

#[derive(Default)]
struct Counts {
    allocs: AtomicUsize,
    evicts: AtomicUsize,
    destroys: AtomicUsize,
    /// `->evict_inode` does not yield. A yield is a slow eviction: loom then runs the
    /// other threads as far as they go before the evictor goes on, which lets lookups
    /// meet the `I_FREEING` inode, but also puts everything after `->evict_inode` (the
    /// park of a remote eviction) after them, always.
    quiet: bool,
}

#[derive(Clone, Default)]
struct Fs(Arc<Counts>);

impl Fs {
    /// A filesystem whose `->evict_inode` does not yield.
    fn quiet() -> Fs {
        Fs(Arc::new(Counts {
            quiet: true,
            ..Counts::default()
        }))
    }
}

impl SuperOperations for Fs {
    type Data = Data;
    fn alloc_inode(&self, _ino: u64) -> Data {
        self.0.allocs.fetch_add(1, Ordering::SeqCst);
        Data {
            value: UnsafeCell::new(0),
        }
    }
    fn evict_inode(&self, _inode: &Inode<Self>) {
        self.0.evicts.fetch_add(1, Ordering::SeqCst);
        if !self.0.quiet {
            thread::yield_now();
        }
    }
    fn destroy_inode(&self, _inode: &Inode<Self>) {
        self.0.destroys.fetch_add(1, Ordering::SeqCst);
    }
}

fn read(r: &Inode<Fs>) -> u64 {
    r.data().value.with(|p| unsafe { *p })
}

fn load(n: NewInode<Fs>, v: u64) -> InodeRef<Fs> {
    n.data().value.with_mut(|p| unsafe { *p = v });
    n.unlock_new_inode()
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// A model whose runs end one of two ways (`f` says which: `true` for the ending named by
/// `ending`); checks that both were explored.
fn model_both_endings(ending: &'static str, f: impl Fn() -> bool + Sync + Send + 'static) {
    use std::sync::atomic::AtomicUsize as StdUsize;
    let counts = std::sync::Arc::new([StdUsize::new(0), StdUsize::new(0)]);
    let c = counts.clone();
    model(move || {
        c[0].fetch_add(1, Ordering::Relaxed);
        if f() {
            c[1].fetch_add(1, Ordering::Relaxed);
        }
    });
    let (runs, hits) = (
        counts[0].load(Ordering::Relaxed),
        counts[1].load(Ordering::Relaxed),
    );
    assert!(
        0 < hits && hits < runs,
        "both endings explored: {ending} in {hits} of {runs} runs"
    );
}

/// The inode `ino` of `sb`, new (the caller loads it).
fn new_inode(sb: &SuperBlock<Fs>, ino: u64) -> NewInode<Fs> {
    let Some(Iget::New(n)) = sb.iget_locked(ino) else {
        panic!("inode {ino} is not new")
    };
    n
}

/// A mounted filesystem with inode 1 new (`I_NEW`, the caller loads it).
fn mount_with_new_inode() -> (Fs, InodeCache<Fs>, Arc<SuperBlock<Fs>>, NewInode<Fs>) {
    let fs = Fs::default();
    let cache = InodeCache::new(Settings::default());
    let sb = Arc::new(cache.mount(fs.clone()));
    let n = new_inode(&sb, 1);
    (fs, cache, sb, n)
}

/// A mounted filesystem with inode 1 loaded with `v` and held.
fn mount_with_inode(v: u64) -> (Fs, InodeCache<Fs>, Arc<SuperBlock<Fs>>, InodeRef<Fs>) {
    mount_fs_with_inode(Fs::default(), v)
}

/// [`mount_with_inode`] with the filesystem given.
fn mount_fs_with_inode(fs: Fs, v: u64) -> (Fs, InodeCache<Fs>, Arc<SuperBlock<Fs>>, InodeRef<Fs>) {
    let cache = InodeCache::new(Settings::default());
    let sb = Arc::new(cache.mount(fs.clone()));
    let r = load(new_inode(&sb, 1), v);
    (fs, cache, sb, r)
}

/// Two lookups of one key: exactly one loads it; the other gets the loaded inode (no data
/// race on the filesystem's fields, no lost wake-up: both threads finish).
#[test]
fn i_new_handoff_loads_once() {
    model(|| {
        let fs = Fs::default();
        let cache = InodeCache::new(Settings::default());
        let sb = Arc::new(cache.mount(fs.clone()));
        let sb2 = sb.clone();
        let t = thread::spawn(move || match sb2.iget_locked(1).unwrap() {
            Iget::New(n) => (true, read(&load(n, 7))),
            Iget::Cached(r) => (false, read(&r)),
        });
        let mine = match sb.iget_locked(1).unwrap() {
            Iget::New(n) => (true, read(&load(n, 7))),
            Iget::Cached(r) => (false, read(&r)),
        };
        let theirs = t.join().unwrap();
        assert_eq!(mine.1, 7);
        assert_eq!(theirs.1, 7);
        assert!(mine.0 != theirs.0, "exactly one loader: {mine:?} {theirs:?}");
        assert_eq!(cache.stats().loads, 1);
    });
}

/// A lookup that finds the inode `I_NEW` spins on it (one look under the models) before it
/// registers to sleep: whichever way its wait ends (the load ended while it spun, or it
/// registered and was woken, or it came after the load), it sees the loaded data (the
/// spin's Acquire load of `i_state` pairs with `unlock_new_inode`'s Release store: a
/// plain Relaxed-free field, so loom reports a race if it did not), nobody loads twice,
/// and at most one of the two endings is counted. Both endings are explored.
#[test]
fn i_new_spin_or_sleep() {
    i_new_wait_model(|sb, ino| match sb.iget_locked(ino).unwrap() {
        Iget::New(_) => panic!("a second load of an I_NEW inode"),
        Iget::Cached(r) => r,
    });
}

/// A second thread looks up (`lookup`) inode 1 while the main thread loads it with 7:
/// the lookup returns the loaded inode whichever way its wait ends (no data race), the
/// inode is loaded once, a wait is counted at most once, and runs both where the wait
/// ended while spinning and where it did not are explored.
fn i_new_wait_model(lookup: fn(&SuperBlock<Fs>, u64) -> InodeRef<Fs>) {
    model_both_endings("the wait ended while spinning", move || {
        let (_fs, cache, sb, n) = mount_with_new_inode();
        let sb2 = sb.clone();
        let t = thread::spawn(move || read(&lookup(&sb2, 1)));
        // A scheduling point first (spawning is none): the lookup may then find the
        // inode I_NEW, or come after the load.
        thread::yield_now();
        let r = load(n, 7);
        assert_eq!(t.join().unwrap(), 7, "the waiter saw a half-loaded inode");
        drop(r);
        let s = cache.stats();
        assert_eq!(s.loads, 1);
        assert!(
            s.new_waits_spun + s.new_waits_slept <= 1,
            "one wait counted once: {s:?}"
        );
        s.new_waits_spun == 1
    });
}

/// `ilookup` of an inode being loaded: a lock-free walk that sees it `I_NEW` spins on it
/// read-only before it takes `i_lock` and the reference (`match_ino_on_chain`'s pinned walk), then
/// decides under `i_lock` as before. Whichever way the wait ends (in that spin, in the
/// spin or sleep after the reference, or the lookup came after the load), it returns the
/// inode with the loaded data (no data race), the load happens once, and a wait is
/// counted at most once. Both endings (the spin saw the load end, or not) are explored.
#[test]
fn ilookup_spins_on_i_new_before_i_lock() {
    i_new_wait_model(|sb, ino| sb.ilookup(ino).expect("a hashed inode is found"));
}

/// `ilookup` while the loader fails (`iget_failed`): whether its walk spins on the `I_NEW`
/// inode, sleeps on it or comes after, it never returns the failed inode; the inode is
/// evicted and destroyed once.
#[test]
fn ilookup_races_iget_failed() {
    model(|| {
        let (fs, _cache, sb, n) = mount_with_new_inode();
        let sb2 = sb.clone();
        let t = thread::spawn(move || sb2.ilookup(1).is_none());
        thread::yield_now();
        n.iget_failed();
        assert!(t.join().unwrap(), "ilookup returned an inode whose load failed");
        assert_eq!(fs.0.evicts.load(Ordering::SeqCst), 1);
        assert_eq!(fs.0.destroys.load(Ordering::SeqCst), 1);
    });
}

/// The loader fails (iget_failed) while another task looks the key up: the other task
/// either becomes the loader or gets nothing bad; the failed inode is evicted once.
#[test]
fn iget_failed_handoff() {
    model(|| {
        let (fs, cache, sb, n) = mount_with_new_inode();
        let sb2 = sb.clone();
        let t = thread::spawn(move || match sb2.iget_locked(1).unwrap() {
            Iget::New(n) => read(&load(n, 9)),
            Iget::Cached(r) => read(&r),
        });
        n.iget_failed();
        assert_eq!(t.join().unwrap(), 9, "the waiter must load it itself");
        assert_eq!(fs.0.evicts.load(Ordering::SeqCst), 1);
        assert_eq!(cache.stats().loads, 2);
    });
}

/// A lock-free lookup racing the last iput of an unlinked inode: the lookup gets the inode
/// only before its eviction started (never I_FREEING), else nothing; one eviction, one
/// destroy, whatever the interleaving.
#[test]
fn lookup_races_eviction() {
    model(|| {
        let (fs, cache, sb, r) = mount_with_inode(3);
        r.clear_nlink();
        let sb2 = sb.clone();
        let t = thread::spawn(move || {
            if let Some(x) = sb2.ilookup(1) {
                assert!(
                    !x.state().flags.contains(InodeFlags::FREEING),
                    "returned an inode being evicted"
                );
                assert_eq!(read(&x), 3);
            }
        });
        drop(r);
        t.join().unwrap();
        assert_eq!(fs.0.evicts.load(Ordering::SeqCst), 1);
        assert_eq!(fs.0.destroys.load(Ordering::SeqCst), 1);
        assert_eq!(cache.stats().nr_inodes, 0);
    });
}

/// An iget racing the eviction of its key: it waits for the eviction (or finds nothing)
/// and loads a new inode; never two live inodes with one key.
#[test]
fn iget_waits_for_eviction() {
    model(|| {
        let (fs, cache, sb, r) = mount_with_inode(3);
        r.clear_nlink();
        let sb2 = sb.clone();
        let t = thread::spawn(move || match sb2.iget_locked(1).unwrap() {
            Iget::New(n) => {
                let r = load(n, 4);
                r.clear_nlink();
            }
            Iget::Cached(r) => assert_eq!(read(&r), 3),
        });
        drop(r);
        t.join().unwrap();
        let c = &fs.0;
        assert_eq!(c.evicts.load(Ordering::SeqCst), c.allocs.load(Ordering::SeqCst));
        assert_eq!(c.destroys.load(Ordering::SeqCst), c.allocs.load(Ordering::SeqCst));
        assert_eq!(cache.stats().nr_inodes, 0);
    });
}

/// The superblock's lifetime (inodes hold an uncounted `i_sb`): after an umount that
/// leaves two busy inodes, the last handle is dropped (detach) while another thread puts
/// the last reference of one inode (its `iput_final` evicts it), and the unmounting thread
/// then puts the other. Whatever the
/// interleaving, the superblock (and with it the filesystem's operations) is freed exactly
/// once, only after both inodes were destroyed (its drop asserts no live inode is left),
/// and no eviction touches it after it was freed.
#[test]
fn sb_freed_after_last_inode() {
    model(|| {
        let fs = Fs::default();
        let counts = fs.0.clone();
        let cache = InodeCache::new(Settings::default());
        let sb = cache.mount(fs);
        let r = load(new_inode(&sb, 1), 5);
        let r2 = load(new_inode(&sb, 2), 6);
        assert_eq!(sb.umount(), 2, "both inodes are busy");
        let t = thread::spawn(move || {
            assert_eq!(read(&r), 5);
            assert_eq!(r.sb_dev(), 1);
            drop(r);
        });
        drop(sb);
        assert_eq!(read(&r2), 6);
        drop(r2);
        t.join().unwrap();
        assert_eq!(counts.destroys.load(Ordering::SeqCst), 2);
        assert_eq!(cache.stats().nr_inodes, 0);
        assert_eq!(
            Arc::strong_count(&counts),
            1,
            "the superblock (holding the mounted Fs) is freed once no handle and no inode is left"
        );
    });
}

/// A umount (clear `SB_ACTIVE`, then `evict_inodes`) racing the last `iput` of a live,
/// linked inode (`generic_shutdown_super` against `iput_final`). Whatever the interleaving
/// and whatever stale values the memory model allows, the inode ends evicted exactly once
/// (by `evict_inodes` or by `iput_final` itself, as in Linux): `->evict_inode` and
/// `->destroy_inode` run once each, and no inode is left on the superblock's lists (none
/// kept on the LRU of an inactive superblock, none left neither on the LRU nor evicted).
/// Before `evict_inodes` read `i_count` under `i_lock` only, this failed: its unlocked
/// skip read a stale count 1 while the `iput` read a stale `SB_ACTIVE` and put the inode
/// on the LRU. The model must reach both endings (the umount found the inode busy, and
/// did not).
#[test]
fn umount_races_last_iput() {
    model_both_endings("busy at umount", || {
        let (fs, cache, sb, r) = mount_with_inode(3);
        let sb2 = sb.clone();
        let t = thread::spawn(move || sb2.umount());
        drop(r);
        let busy = t.join().unwrap() == 1;
        assert!(!sb.is_active());
        assert_eq!(
            sb.nr_inodes(),
            0,
            "an unused inode survived the umount (on the LRU: {})",
            sb.count_objects()
        );
        assert_eq!(
            sb.count_objects(),
            0,
            "an inode on the LRU of an unmounted superblock"
        );
        assert_eq!(fs.0.evicts.load(Ordering::SeqCst), 1);
        assert_eq!(fs.0.destroys.load(Ordering::SeqCst), 1);
        assert_eq!(cache.stats().nr_inodes, 0);
        assert_eq!(cache.stats().nr_unused, 0);
        busy
    });
}

/// Checks what a lookup returned: never an inode whose eviction started, and the loaded
/// data.
fn check_hit(x: &InodeRef<Fs>) {
    let f = x.state().flags;
    assert!(
        !f.contains(InodeFlags::FREEING) && !f.contains(InodeFlags::WILL_FREE),
        "returned an inode being evicted: {f:?}"
    );
    assert_eq!(read(x), 3);
}

/// After the threads of a model are done: umount evicts what is left, exactly once each,
/// and nothing is left on the superblock's lists, the LRU or the counters.
fn umount_and_check(cache: &InodeCache<Fs>, sb: &SuperBlock<Fs>, fs: &Fs) {
    assert_eq!(sb.umount(), 0, "no busy inode once every thread is done");
    assert_eq!(fs.0.allocs.load(Ordering::SeqCst), 1, "an ilookup never loads");
    assert_eq!(fs.0.evicts.load(Ordering::SeqCst), 1);
    assert_eq!(fs.0.destroys.load(Ordering::SeqCst), 1);
    assert_eq!(sb.nr_inodes(), 0);
    assert_eq!(sb.count_objects(), 0);
    assert!(sb.lru_inos().is_empty());
    let st = cache.stats();
    assert_eq!((st.nr_inodes, st.nr_unused), (0, 0));
}

/// The cached-hit fast path (`ilookup_fast`, through `ilookup`) racing the last `iput` of a
/// linked inode on an active superblock, which keeps it (on the LRU). The models give
/// each thread its own shard (the spawned thread has shard 1, the main thread shard 0):
/// the `iput` puts the inode on LRU shard 1; the lookup's own put then either finds it on
/// that shard's LRU (`I_REFERENCED` only), or is the last itself and adds it to shard 0,
/// or both last puts race to add it, each to its shard (the later sees `ON_LRU` under the
/// locks). Whatever the interleaving: the lookup gets the live inode (never one being
/// freed), the inode ends on exactly one LRU, unused and not evicted, and the umount
/// (shard 0) takes it off the LRU shard named by `lru_shard` and evicts it once.
#[test]
fn iget_hit_races_last_iput_kept() {
    model_both_endings("the lookup found it on the LRU", || {
        let (fs, cache, sb, r) = mount_with_inode(3);
        let t = thread::spawn(move || drop(r));
        let x = sb.ilookup(1).expect("a linked inode of an active sb is kept");
        check_hit(&x);
        // Found after the iput kept it (lazy LRU removal: it stays there).
        let on_lru = x.state().on_lru;
        drop(x);
        t.join().unwrap();
        assert_eq!(fs.0.evicts.load(Ordering::SeqCst), 0, "kept, not evicted");
        assert_eq!(sb.count_objects(), 1, "on exactly one LRU");
        assert_eq!(sb.lru_inos(), vec![1]);
        assert_eq!(cache.stats().nr_unused, 1);
        umount_and_check(&cache, &sb, &fs);
        on_lru
    });
}

/// `ilookup_fast` (thread A: `ilookup` and put) racing the last `iput` that keeps the inode
/// (thread B, on another shard: the inode goes to its LRU) and the shrinker
/// (`prune_icache_sb(1)` on the main thread), which may evict the inode once it is unused
/// and not `I_REFERENCED`. Whatever the interleaving: the lookup returns the live inode or
/// nothing (never one being freed: a lookup meeting `I_FREEING` waits for the eviction
/// and finds nothing), the inode is evicted at most once, and exactly once after the
/// umount; nothing is left. The model must reach both endings (the prune evicted the
/// inode, and did not).
#[test]
fn iget_hit_races_last_iput_and_prune() {
    model_both_endings("the prune evicted", || {
        let (fs, cache, sb, r) = mount_with_inode(3);
        let b = thread::spawn(move || drop(r));
        let sb2 = sb.clone();
        let a = thread::spawn(move || {
            if let Some(x) = sb2.ilookup(1) {
                check_hit(&x);
            }
        });
        // A scheduling point first: the prune starts by reading the LRU lengths, plain
        // counters loom does not interleave (and spawning is no scheduling point), so
        // without it the prune would always run before the other threads and find none.
        thread::yield_now();
        sb.prune_icache_sb(1);
        b.join().unwrap();
        a.join().unwrap();
        let evicted = fs.0.evicts.load(Ordering::SeqCst);
        assert!(evicted <= 1, "evicted {evicted} times");
        if evicted == 1 {
            assert_eq!(sb.nr_inodes(), 0);
            assert!(sb.ilookup(1).is_none(), "an evicted inode is gone");
        } else {
            assert_eq!(sb.lru_inos(), vec![1], "kept: on the LRU");
        }
        // One eviction in all: the prune's, or the umount's.
        umount_and_check(&cache, &sb, &fs);
        evicted == 1
    });
}

/// The last `iput` of an unlinked inode that is still on an LRU (taken again after it was
/// cached: lazy LRU removal) races the shrinker. The inode was cached by the main thread
/// (shard 0), which prunes; the unlinker is the first spawned thread (shard 1), so the
/// inode is on another CPU's LRU and superblock list shards: the eviction leaves it on
/// them (`I_FREEING`) and parks it, counted out of `nr_unused`. The main thread's
/// `lru_inos` drains the outboxes (a flush racing the park) and the prune meets the inode
/// in use (lazily removed), evicting or parked, or finds it gone. Whatever the
/// interleaving: one eviction, one destroy, nothing left on the LRU, the lists or the
/// outboxes, `nr_unused` exact. (Before batched removal the unlinker took that LRU lock
/// before `i_lock` and the inode off the LRU under one hold with `I_FREEING`; it still
/// does on its own shard: `iget_hit_races_last_iput_and_prune`'s prune on shard 0.)
#[test]
fn unlink_last_iput_races_prune() {
    model_both_endings("the prune took it off the LRU", || {
        let (fs, cache, sb, r) = mount_fs_with_inode(Fs::quiet(), 3);
        drop(r); // unused, on the main thread's LRU shard
        let r = sb.ilookup(1).expect("cached");
        let a = thread::spawn(move || {
            r.clear_nlink();
            drop(r);
        });
        // The prune first reads the LRU lengths, plain counters loom does not see; a
        // look at the LRU under its locks first makes the race visible to the model (and
        // flushes the outboxes: a drain racing the park).
        let _ = sb.lru_inos();
        let pruned = sb.prune_icache_sb(1) == 1;
        a.join().unwrap();
        assert_eq!(fs.0.evicts.load(Ordering::SeqCst), 1);
        assert_eq!(fs.0.destroys.load(Ordering::SeqCst), 1);
        assert_eq!(sb.count_objects(), 0);
        assert_eq!(sb.nr_inodes(), 0);
        assert!(sb.ilookup(1).is_none());
        let s = cache.stats();
        assert_eq!((s.nr_inodes, s.nr_unused), (0, 0), "{s:?}");
        pruned
    });
}

/// Batched removal against umount: the spawned thread (shard 1) puts the last reference of
/// an unlinked inode that the main thread (shard 0) loaded, so the inode is on shard 0's
/// superblock list: its eviction parks it in the thread's outbox (2 under the models: it
/// stays parked). Meanwhile the main thread unmounts, holding a second inode. Whatever the
/// interleaving: either the park saw `SB_ACTIVE` set under its outbox lock and the
/// umount's drain (after clearing it) found the inode, or the park saw it clear and took
/// the inode off the lists itself; so once both returned no inode is parked, the umount
/// counted the held inode busy and the parked one never (it may count the evicted one
/// only while its eviction still ran), each inode is evicted and destroyed once, and
/// the superblock is freed after its last inode (nothing parked keeps it). Both endings
/// (the thread saw its inode still parked after its `iput`, and not) are explored.
/// Without the `SB_ACTIVE` check under the outbox lock, an inode stays parked on an
/// unmounted superblock.
#[test]
fn umount_races_remote_park() {
    model_both_endings("parked before the drain", || {
        let fs = Fs::quiet();
        let counts = fs.0.clone();
        let cache = InodeCache::new(Settings::default());
        let sb = Arc::new(cache.mount(fs));
        let r1 = load(new_inode(&sb, 1), 3);
        let r2 = load(new_inode(&sb, 2), 4);
        let sb2 = sb.clone();
        let t = thread::spawn(move || {
            r1.clear_nlink();
            drop(r1);
            sb2.nr_parked() == 1
        });
        let busy = sb.umount();
        let parked = t.join().unwrap();
        assert!(busy == 1 || busy == 2, "busy {busy}");
        assert_eq!(sb.nr_parked(), 0, "an inode left parked after the umount");
        assert_eq!(counts.evicts.load(Ordering::SeqCst), 1);
        assert_eq!(counts.destroys.load(Ordering::SeqCst), 1);
        assert_eq!(sb.nr_inodes(), 1, "only the held inode is left");
        let sb = Arc::try_unwrap(sb).expect("the thread's handle is gone");
        drop(sb);
        assert_eq!(read(&r2), 4);
        drop(r2);
        assert_eq!(counts.evicts.load(Ordering::SeqCst), 2);
        assert_eq!(counts.destroys.load(Ordering::SeqCst), 2);
        let st = cache.stats();
        assert_eq!((st.nr_inodes, st.nr_unused), (0, 0), "{st:?}");
        assert_eq!(
            Arc::strong_count(&counts),
            1,
            "the superblock is freed once no handle and no inode is left"
        );
        parked
    });
}

/// Batched removal against the shrinker, on the inode's LRU: the inode is unused on the
/// main thread's LRU shard (0) when the main thread takes it again and hands it to the
/// spawned thread (shard 1), which unlinks it and puts it; the eviction parks it (still on shard 0's LRU, `I_FREEING`, counted
/// out of `nr_unused`), and the thread then flushes its outbox. Meanwhile the main thread
/// prunes: the prune may meet the inode in use, evicting or parked and take it off the
/// LRU (lazily, as a busy inode), and the flush then leaves the LRU alone; or the flush
/// takes it off first. Whatever the interleaving: one eviction and one destroy,
/// `nr_unused` exact (never counted out twice: a second unused inode stays counted),
/// nothing else left on the LRU or the lists.
#[test]
fn flush_races_prune() {
    model_both_endings("the prune took it off the LRU", || {
        let (fs, cache, sb, r) = mount_fs_with_inode(Fs::quiet(), 3);
        // Inode 1 unused, on the main thread's LRU shard; a second unused inode behind it
        // on that LRU (newer: the prune of one entry scans inode 1, or rotates this one
        // once inode 1 is gone: it is I_REFERENCED), so that `nr_unused` counted out
        // twice shows (it is clamped at 0).
        drop(r);
        drop(load(new_inode(&sb, 2), 3));
        drop(sb.ilookup(2));
        let r = sb.ilookup(1).expect("cached");
        let sb2 = sb.clone();
        let a = thread::spawn(move || {
            r.clear_nlink();
            drop(r);
            sb2.flush_evictions();
        });
        // A look at the outboxes under their locks (without flushing them): the prune
        // first reads the LRU lengths, plain counters loom does not interleave.
        let _ = sb.nr_parked();
        let pruned = sb.prune_icache_sb(1) == 1;
        a.join().unwrap();
        assert_eq!(fs.0.evicts.load(Ordering::SeqCst), 1);
        assert_eq!(fs.0.destroys.load(Ordering::SeqCst), 1);
        assert_eq!(sb.nr_parked(), 0, "flushed by the thread");
        let s = cache.stats();
        assert_eq!((s.nr_inodes, s.nr_unused), (1, 1), "{s:?}");
        assert_eq!(sb.lru_inos(), vec![2]);
        assert_eq!(sb.count_objects(), 1);
        assert_eq!(sb.nr_inodes(), 1);
        assert!(sb.ilookup(1).is_none());
        assert_eq!(sb.umount(), 0);
        assert_eq!(fs.0.destroys.load(Ordering::SeqCst), 2);
        let s = cache.stats();
        assert_eq!((s.nr_inodes, s.nr_unused), (0, 0), "{s:?}");
        pruned
    });
}

/// Batched removal against a lookup of the same key: the spawned thread (shard 1) puts the
/// last reference of an unlinked inode the main thread loaded (shard 0): the eviction
/// unhashes it and wakes the waiters at once, parks it, and the thread flushes. The main
/// thread's `iget_locked` of the key gets the live inode before the eviction started, or
/// waits for the eviction (woken at the unhash, not at the flush) and loads a new one;
/// never the inode being evicted, never two live inodes with one key; every inode evicted
/// and destroyed once. Both endings (found it live, loaded a new one) are explored.
#[test]
fn flush_races_lookup() {
    model_both_endings("loaded a new inode", || {
        let (fs, cache, sb, r) = mount_with_inode(3);
        let sb2 = sb.clone();
        let t = thread::spawn(move || {
            r.clear_nlink();
            drop(r);
            sb2.flush_evictions();
        });
        let new = match sb.iget_locked(1).unwrap() {
            Iget::New(n) => {
                let r = load(n, 4);
                r.clear_nlink();
                true
            }
            Iget::Cached(r) => {
                assert!(
                    !r.state().flags.contains(InodeFlags::FREEING),
                    "returned an inode being evicted"
                );
                assert_eq!(read(&r), 3);
                false
            }
        };
        t.join().unwrap();
        let c = &fs.0;
        assert_eq!(c.evicts.load(Ordering::SeqCst), c.allocs.load(Ordering::SeqCst));
        assert_eq!(c.destroys.load(Ordering::SeqCst), c.allocs.load(Ordering::SeqCst));
        assert_eq!(sb.nr_inodes(), 0);
        assert_eq!(cache.stats().nr_inodes, 0);
        new
    });
}

/// `unlink_last_iput_races_prune` with the unlinker on the inode's own shards (the main
/// thread, shard 0, cached it and unlinks it; the spawned thread prunes): the last `iput`
/// takes the inode's LRU shard lock before `i_lock` and takes it off the LRU under one
/// hold with `I_FREEING`, then the superblock list, with no outbox; the prune meets it
/// busy or evicting, or first, or not at all. Whatever the interleaving: one eviction,
/// one destroy, nothing left, nothing parked, `nr_unused` exact.
#[test]
fn unlink_own_shard_races_prune() {
    model_both_endings("the prune took it off the LRU", || {
        let (fs, cache, sb, r) = mount_with_inode(3);
        drop(r); // unused, on the main thread's LRU shard
        let r = sb.ilookup(1).expect("cached");
        let sb2 = sb.clone();
        let p = thread::spawn(move || {
            // The prune first reads the LRU lengths, plain counters loom does not see; a
            // look at the LRU under its locks first makes the race visible to the model.
            let _ = sb2.lru_inos();
            sb2.prune_icache_sb(1) == 1
        });
        r.clear_nlink();
        drop(r);
        assert_eq!(sb.nr_parked(), 0, "an eviction on its own shards parked");
        let pruned = p.join().unwrap();
        assert_eq!(fs.0.evicts.load(Ordering::SeqCst), 1);
        assert_eq!(fs.0.destroys.load(Ordering::SeqCst), 1);
        let s = cache.stats();
        assert_eq!((s.nr_inodes, s.nr_unused), (0, 0), "{s:?}");
        assert_eq!(sb.count_objects(), 0);
        assert_eq!(sb.nr_inodes(), 0);
        pruned
    });
}
