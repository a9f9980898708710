//! fs/inode.c semantics through the public API, function by function.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::TestFs;
use vfscale_icache::*;

fn setup(settings: Settings) -> (InodeCache<TestFs>, SuperBlock<TestFs>, TestFs) {
    let fs = TestFs::default();
    let cache = InodeCache::new(settings);
    let sb = cache.mount(fs.clone());
    (cache, sb, fs)
}

fn all_settings() -> Vec<Settings> {
    vec![
        Settings::default(),
        Settings::prepatch(),
        Settings {
            lru: Lru::Single,
            ..Settings::default()
        },
    ]
}

fn load(sb: &SuperBlock<TestFs>, ino: u64) -> InodeRef<TestFs> {
    match sb.iget_locked(ino).unwrap() {
        Iget::New(n) => n.unlock_new_inode(),
        Iget::Cached(r) => r,
    }
}

#[test]
fn iget_miss_then_hit_same_object() {
    for s in all_settings() {
        let (cache, sb, _) = setup(s);
        let a = sb.iget_locked(5).unwrap();
        assert!(a.is_new());
        assert!(a.inode().state().flags.contains(InodeFlags::NEW));
        let Iget::New(n) = a else { unreachable!() };
        let a = n.unlock_new_inode();
        let Some(Iget::Cached(b)) = sb.iget_locked(5) else {
            panic!("hit expected")
        };
        assert_eq!(a, b);
        assert_eq!(b.state().count, 2);
        assert_eq!(cache.stats().loads, 1);
        assert_eq!(cache.stats().nr_inodes, 1);
    }
}

#[test]
fn waiters_block_until_unlock_new_inode() {
    for s in all_settings() {
        let (_c, sb, _) = setup(s);
        let sb = Arc::new(sb);
        let Some(Iget::New(n)) = sb.iget_locked(7) else {
            panic!()
        };
        let hs: Vec<_> = (0..3)
            .map(|_| {
                let sb = sb.clone();
                thread::spawn(move || match sb.iget_locked(7) {
                    Some(Iget::Cached(r)) => r.data().loaded.load(Ordering::SeqCst),
                    _ => panic!("waiter must get the loaded inode"),
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(20));
        n.data().loaded.store(42, Ordering::SeqCst);
        let r = n.unlock_new_inode();
        for h in hs {
            assert_eq!(
                h.join().unwrap(),
                42,
                "a waiter saw the inode before it was loaded"
            );
        }
        assert_eq!(r.state().count, 1);
    }
}

#[test]
fn start_api_reports_waiting_and_poll_completes() {
    let (_c, sb, _) = setup(Settings::default());
    let Some(Iget::New(n)) = sb.iget_locked(1) else {
        panic!()
    };
    let Started::Wait(mut w) = sb.iget_locked_start(1) else {
        panic!("must wait on I_NEW")
    };
    assert!(w.poll_complete().is_none());
    assert_eq!(n.state().count, 2, "the waiter holds a reference");
    let first = n.unlock_new_inode();
    match w.poll_complete() {
        Some(Ok(Some(Iget::Cached(r)))) => assert_eq!(r, first),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn iget_failed_makes_a_waiter_the_loader() {
    let (cache, sb, _) = setup(Settings::default());
    let Some(Iget::New(n)) = sb.iget_locked(3) else {
        panic!()
    };
    let Started::Wait(mut w) = sb.iget_locked_start(3) else {
        panic!()
    };
    n.iget_failed();
    match w.poll_complete() {
        Some(Ok(Some(Iget::New(n2)))) => {
            assert!(n2.is_hashed());
            n2.unlock_new_inode();
        }
        other => panic!("the waiter must become the loader: {other:?}"),
    }
    assert_eq!(cache.stats().loads, 2);
}

#[test]
fn dropped_guard_is_iget_failed() {
    let (cache, sb, fs) = setup(Settings::default());
    drop(sb.iget_locked(3));
    assert!(sb.ilookup(3).is_none());
    assert_eq!(cache.stats().nr_inodes, 0);
    assert_eq!(fs.counts.evicts.load(Ordering::SeqCst), 1);
}

#[test]
fn discard_new_inode_leaves_it_hashed_for_waiters() {
    let (_c, sb, _) = setup(Settings::default());
    let Some(Iget::New(n)) = sb.iget_locked(3) else {
        panic!()
    };
    let Started::Wait(mut w) = sb.ilookup_start(3) else {
        panic!()
    };
    n.discard_new_inode();
    let r = w.poll_complete().unwrap().unwrap().expect("waiter takes it");
    assert!(r.is_hashed());
    assert!(r.state().flags.is_empty());
}

#[test]
fn insert_inode_locked_creating_and_ebusy() {
    let (_c, sb, _) = setup(Settings::default());
    let a = sb.new_inode(9);
    assert!(!a.is_hashed());
    let n = sb.insert_inode_locked(a).unwrap();
    assert!(n.state().flags.contains(InodeFlags::CREATING));
    // Lookups give up on I_CREATING.
    assert!(sb.ilookup(9).is_none());
    assert!(sb.iget_locked(9).is_none());
    // A second insert: EBUSY at once.
    let b = sb.new_inode(9);
    let busy = sb.insert_inode_locked(b).expect_err("EBUSY");
    assert!(!busy.inode.is_hashed());
    let r = n.unlock_new_inode();
    assert!(r.state().flags.is_empty());
    let c = sb.new_inode(9);
    assert!(sb.insert_inode_locked(c).is_err(), "a live inode has the key");
}

#[test]
#[should_panic(expected = "was hashed before")]
fn insert_of_a_hashed_inode_panics() {
    let (_c, sb, _) = setup(Settings::default());
    let r = load(&sb, 4);
    r.remove_inode_hash();
    let _ = sb.insert_inode_locked(r);
}

#[test]
fn last_iput_keeps_linked_inode_on_lru_and_marks_referenced() {
    let (cache, sb, fs) = setup(Settings {
        lru: Lru::Single,
        ..Settings::default()
    });
    drop(load(&sb, 1));
    drop(load(&sb, 2));
    assert_eq!(sb.lru_inos(), vec![1, 2]);
    let r = sb.ilookup(1).unwrap();
    // Lazy removal: still on the LRU while in use.
    assert_eq!(sb.lru_inos(), vec![1, 2]);
    assert!(r.state().on_lru);
    drop(r);
    assert!(sb
        .ilookup(1)
        .unwrap()
        .state()
        .flags
        .contains(InodeFlags::REFERENCED));
    // prune: 1 is referenced -> rotated; 2 evicted; 1 met again and evicted.
    assert_eq!(sb.prune_icache_sb(3), 2);
    assert_eq!(sb.lru_inos(), Vec::<u64>::new());
    assert_eq!(fs.counts.evicts.load(Ordering::SeqCst), 2);
    assert_eq!(cache.stats().nr_unused, 0);
}

#[test]
fn prune_takes_in_use_inodes_off_without_evicting() {
    let (_c, sb, fs) = setup(Settings {
        lru: Lru::Single,
        ..Settings::default()
    });
    drop(load(&sb, 1));
    let held = sb.ilookup(1).unwrap();
    assert_eq!(sb.prune_icache_sb(5), 1);
    assert!(!held.state().on_lru);
    assert_eq!(fs.counts.evicts.load(Ordering::SeqCst), 0);
    drop(held);
    assert_eq!(sb.lru_inos(), vec![1]);
}

#[test]
fn nlink_zero_unhashed_and_dontcache_evict_at_last_iput() {
    let (cache, sb, fs) = setup(Settings::default());
    let a = load(&sb, 1);
    a.clear_nlink();
    drop(a);
    let b = load(&sb, 2);
    b.remove_inode_hash();
    drop(b);
    let c = load(&sb, 3);
    c.mark_dontcache();
    drop(c);
    assert_eq!(fs.counts.evicts.load(Ordering::SeqCst), 3);
    assert_eq!(cache.stats().nr_inodes, 0);
    let d = load(&sb, 4);
    d.set_nlink(2);
    d.drop_nlink();
    d.inc_nlink();
    assert_eq!(d.nlink(), 2);
}

#[test]
#[should_panic(expected = "nlink 0")]
fn drop_nlink_at_zero_panics() {
    let (_c, sb, _) = setup(Settings::default());
    let a = load(&sb, 1);
    a.clear_nlink();
    a.drop_nlink();
}

#[test]
#[should_panic(expected = "is not I_NEW")]
fn second_unlock_new_inode_panics() {
    let (_c, sb, _) = setup(Settings::default());
    let a = load(&sb, 1);
    a.unlock_new_inode();
}

#[test]
fn umount_evicts_unused_and_counts_busy() {
    let (cache, sb, fs) = setup(Settings::default());
    drop(load(&sb, 1));
    drop(load(&sb, 2));
    let busy = load(&sb, 3);
    assert_eq!(sb.umount(), 1);
    assert_eq!(fs.counts.evicts.load(Ordering::SeqCst), 2);
    assert!(!sb.is_active());
    drop(busy); // sb inactive: the last iput evicts
    assert_eq!(fs.counts.evicts.load(Ordering::SeqCst), 3);
    assert_eq!(cache.stats().nr_inodes, 0);
    fs.counts.check_once();
}

#[test]
fn for_each_inode_visits_live_inodes_only() {
    let (_c, sb, _) = setup(Settings::default());
    let a = load(&sb, 1);
    drop(load(&sb, 2));
    let _n = sb.iget_locked(3); // I_NEW: skipped
    let mut seen = vec![];
    sb.for_each_inode(|r| seen.push(r.ino()));
    seen.sort();
    assert_eq!(seen, vec![1, 2]);
    drop(a);
}

/// The walks of a whole superblock list let its (spin)lock go every so often and go on
/// from the next slot: still every inode once, busy ones passed over and counted.
#[test]
fn walks_of_a_large_list_visit_every_inode_once() {
    for s in all_settings() {
        let (cache, sb, fs) = setup(s);
        let n = 1000u64;
        let mut busy = Vec::new();
        for ino in 1..=n {
            let r = load(&sb, ino);
            if ino % 7 == 0 {
                busy.push(r);
            }
        }
        let mut seen = vec![];
        sb.for_each_inode(|r| seen.push(r.ino()));
        seen.sort();
        assert_eq!(seen, (1..=n).collect::<Vec<_>>(), "{s:?}");
        let held = busy.len();
        assert_eq!(sb.umount(), held, "{s:?}");
        assert_eq!(
            fs.counts.evicts.load(Ordering::SeqCst),
            n as usize - held,
            "{s:?}"
        );
        drop(busy);
        assert_eq!(fs.counts.evicts.load(Ordering::SeqCst), n as usize, "{s:?}");
        assert_eq!(cache.stats().nr_inodes, 0, "{s:?}");
        fs.counts.check_once();
    }
}

#[test]
fn lookup_waits_for_eviction_then_rescans() {
    let (_c, sb, fs) = setup(Settings::default());
    let sb = Arc::new(sb);
    let a = load(&sb, 8);
    a.clear_nlink();
    let old_obj = a.data().obj;
    fs.gate.arm();
    let t = thread::spawn(move || drop(a)); // evicts; held in evict_inode
    fs.gate.wait_held();
    let st = sb.find_inode_nowait(8, |_| Match::Stop);
    assert!(st.is_none());
    let mut seen = None;
    sb.find_inode_nowait(8, |i| {
        seen = Some(i.state());
        Match::Stop
    });
    let seen = seen.expect("still hashed while in ->evict_inode");
    assert!(seen.flags.contains(InodeFlags::FREEING) && seen.hashed && !seen.on_lru);
    let Started::Wait(mut w) = sb.iget_locked_start(8) else {
        panic!("must wait for the eviction")
    };
    assert!(w.poll_complete().is_none());
    fs.gate.release();
    t.join().unwrap();
    match w.poll_complete() {
        Some(Ok(Some(Iget::New(n)))) => assert_ne!(n.data().obj, old_obj, "a new object"),
        other => panic!("{other:?}"),
    }
    fs.counts.check_once();
}

#[test]
fn wait_with_deadline_and_interrupt() {
    let (_c, sb, _) = setup(Settings::default());
    let n = sb.iget_locked(1);
    let Started::Wait(w) = sb.ilookup_start(1) else {
        panic!()
    };
    assert_eq!(
        w.wait_until(Instant::now() + Duration::from_millis(10))
            .unwrap_err(),
        WaitError::TimedOut
    );
    let Started::Wait(w) = sb.ilookup_start(1) else {
        panic!()
    };
    let i = w.interrupter();
    let t = thread::spawn(move || w.wait());
    thread::sleep(Duration::from_millis(10));
    i.interrupt();
    assert_eq!(t.join().unwrap().unwrap_err(), WaitError::Interrupted);
    // Both waiters put their references.
    assert_eq!(n.as_ref().unwrap().inode().state().count, 1);
}

fn block_on<T>(mut f: impl std::future::Future<Output = T> + Unpin) -> T {
    use std::task::{Context, Poll, Wake, Waker};
    struct T(thread::Thread);
    impl Wake for T {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(T(thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = std::pin::Pin::new(&mut f).poll(&mut cx) {
            return v;
        }
        thread::park();
    }
}

#[test]
fn wait_as_a_future() {
    let (_c, sb, _) = setup(Settings::default());
    let Some(Iget::New(n)) = sb.iget_locked(2) else {
        panic!()
    };
    let Started::Wait(w) = sb.iget_locked_start(2) else {
        panic!()
    };
    let t = thread::spawn(move || block_on(w));
    thread::sleep(Duration::from_millis(10));
    let r = n.unlock_new_inode();
    match t.join().unwrap() {
        Ok(Some(Iget::Cached(x))) => assert_eq!(x, r),
        other => panic!("{other:?}"),
    }
}

#[test]
fn iget5_and_ilookup5_use_the_callers_key() {
    let (_c, sb, _) = setup(Settings::default());
    let mk = |key: u64| {
        move || {
            (
                100 + key,
                common::Obj {
                    obj: key,
                    loaded: Default::default(),
                },
            )
        }
    };
    let a = match sb.iget5_locked(1, |i| i.data().obj == 10, mk(10)).unwrap() {
        Iget::New(n) => n.unlock_new_inode(),
        _ => panic!(),
    };
    assert_eq!(a.ino(), 110);
    // Same hash value, other key: another inode.
    let b = sb.iget5_locked(1, |i| i.data().obj == 11, mk(11)).unwrap();
    assert!(b.is_new());
    drop(b);
    let c = sb.ilookup5(1, |i| i.data().obj == 10).unwrap();
    assert_eq!(c, a);
}

#[test]
fn counters_global_locks_zero_by_default_and_counted_prepatch() {
    let (cache, sb, _) = setup(Settings::default());
    let r = load(&sb, 1);
    let before = cache.stats();
    for _ in 0..10 {
        drop(sb.iget_locked(1));
    }
    let after = cache.stats();
    assert_eq!(after.global_lock_acquisitions, 0);
    assert_eq!(
        after.chain_lock_acquisitions, before.chain_lock_acquisitions,
        "hits take no chain lock"
    );
    drop(r);
    let (cache, sb, _) = setup(Settings::prepatch());
    let r = load(&sb, 1);
    let before = cache.stats().global_lock_acquisitions;
    drop(sb.iget_locked(1));
    assert!(cache.stats().global_lock_acquisitions > before);
    drop(r);
}

#[test]
fn superblocks_do_not_share_inodes() {
    let cache: InodeCache<TestFs> = InodeCache::default();
    let (a, b) = (cache.mount(TestFs::default()), cache.mount(TestFs::default()));
    let x = load(&a, 1);
    let y = load(&b, 1);
    assert_ne!(x, y);
    drop((x, y));
    drop(a);
    assert_eq!(cache.stats().nr_inodes, 1);
    drop(b);
    assert_eq!(cache.stats().nr_inodes, 0);
}

#[test]
fn insert_inode_locked4_by_hash_value_and_test() {
    let (_c, sb, _) = setup(Settings::default());
    let mk = |key: u64| common::Obj {
        obj: key,
        loaded: Default::default(),
    };
    let a = sb.new_inode_with(100, 7, mk(1));
    let n = sb.insert_inode_locked4(a, |i| i.data().obj == 1).unwrap();
    let a = n.unlock_new_inode();
    // Same hash value, another key: inserted too; the same key: EBUSY.
    let b = sb.new_inode_with(101, 7, mk(2));
    let b = sb
        .insert_inode_locked4(b, |i| i.data().obj == 2)
        .unwrap()
        .unlock_new_inode();
    let c = sb.new_inode_with(102, 7, mk(1));
    assert!(sb.insert_inode_locked4(c, |i| i.data().obj == 1).is_err());
    assert_eq!(sb.ilookup5(7, |i| i.data().obj == 2).unwrap(), b);
    assert_eq!(sb.ilookup5(7, |i| i.data().obj == 1).unwrap(), a);
}

/// Batched removal (the crate docs): evictions of inodes that another thread listed (its
/// superblock list shard, and its LRU shard when they are unused there) do
/// `->evict_inode` and `->destroy_inode` at once, count the inodes out of `nr_inodes` and
/// `nr_unused` at once, and take the other thread's shard locks once per 32 evictions; the
/// rest waits in the evicting thread's outbox until a list observer drains it. With 128
/// shards two live threads (distinct slots) never share one.
#[test]
fn remote_evictions_are_batched() {
    const N: u64 = 100;
    for on_lru in [false, true] {
        let (cache, sb, fs) = setup(Settings {
            shards: 128,
            ..Settings::default()
        });
        let sb = Arc::new(sb);
        // This thread takes its slot before the loader exists, so theirs differ.
        let mine = load(&sb, 1000);
        let sb2 = sb.clone();
        let held = thread::spawn(move || {
            let v: Vec<_> = (1..=N).map(|i| load(&sb2, i)).collect();
            if on_lru {
                drop(v);
                Vec::new()
            } else {
                v
            }
        })
        .join()
        .unwrap();
        let held = if on_lru {
            assert_eq!(cache.stats().nr_unused, N);
            (1..=N).map(|i| sb.ilookup(i).expect("cached")).collect()
        } else {
            held
        };
        let before = cache.stats();
        for r in held {
            r.clear_nlink();
        }
        let after = cache.stats();
        let c = &fs.counts;
        assert_eq!(c.evicts.load(Ordering::SeqCst), N as usize);
        assert_eq!(c.destroys.load(Ordering::SeqCst), N as usize);
        assert_eq!((after.nr_inodes, after.nr_unused), (1, 0), "{after:?}");
        let flushes = N / 32;
        assert_eq!(
            after.sb_shard_lock_acquisitions - before.sb_shard_lock_acquisitions,
            flushes
        );
        assert_eq!(
            after.lru_shard_lock_acquisitions - before.lru_shard_lock_acquisitions,
            if on_lru { flushes } else { 0 }
        );
        assert_eq!(after.chain_lock_acquisitions - before.chain_lock_acquisitions, N);
        assert_eq!(
            after.outbox_lock_acquisitions - before.outbox_lock_acquisitions,
            N
        );
        assert_eq!(sb.nr_parked(), (N % 32) as usize);
        for i in 1..=N {
            assert!(sb.ilookup(i).is_none(), "inode {i} found after its eviction");
        }
        // An observer drains the outboxes first: only the held inode is left.
        assert_eq!(sb.nr_inodes(), 1);
        assert_eq!(sb.nr_parked(), 0);
        assert!(sb.lru_inos().is_empty());
        assert_eq!(sb.count_objects(), 0);
        drop(mine);
        assert_eq!(sb.count_objects(), 1);
        drop(sb);
        fs.counts.check_once();
        assert_eq!(cache.stats().nr_inodes, 0);
    }
}
