//! Shuttle: many tasks loading, failing loads, dropping, unlinking, pruning, walking and
//! unmounting one superblock at once, under randomized schedules. Tasks alternate between
//! two shards, so evictions of inodes another task listed are parked in outboxes (2 under
//! the models) and flushed when one fills, by `flush_evictions`, by a drain (`nr_inodes`)
//! or by the umount. Checked: no lost wake-up (every task finishes), no inode returned
//! after its eviction started, no double load of one key, every inode evicted at most
//! once and destroyed exactly once (counted), and nothing left at the end (nothing
//! parked after an umount).
//! Run: `RUSTFLAGS="--cfg vfscale_shuttle" CARGO_TARGET_DIR=target/shuttle cargo test -p vfscale-icache --release --test shuttle`
#![cfg(vfscale_shuttle)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use shuttle::sync::Mutex;
use shuttle::thread;
use vfscale_icache::*;

const KEYS: u64 = 3;

/// Runs of [`scenario`] whose tasks left an eviction parked at the end (the last umount
/// flushes it): a test checks that parking happens at all.
static PARKED_AT_END: AtomicUsize = AtomicUsize::new(0);

#[derive(Default)]
struct Counts {
    allocs: AtomicUsize,
    next: AtomicU64,
    /// Per object: (evictions, destroys).
    per_obj: Mutex<HashMap<u64, (u32, u32)>>,
}

struct Data {
    obj: u64,
    loaded: AtomicU64,
}

#[derive(Clone, Default)]
struct Fs(Arc<Counts>);

impl SuperOperations for Fs {
    type Data = Data;
    fn alloc_inode(&self, _ino: u64) -> Data {
        self.0.allocs.fetch_add(1, Ordering::SeqCst);
        Data {
            obj: self.0.next.fetch_add(1, Ordering::SeqCst),
            loaded: AtomicU64::new(0),
        }
    }
    fn evict_inode(&self, inode: &Inode<Self>) {
        // A slow eviction: let lookups meet the I_FREEING inode.
        thread::yield_now();
        let mut m = self.0.per_obj.lock().unwrap();
        let e = m.entry(inode.data().obj).or_default();
        e.0 += 1;
        assert_eq!(e.0, 1, "object {} evicted twice", inode.data().obj);
        drop(m);
        thread::yield_now();
    }
    fn destroy_inode(&self, inode: &Inode<Self>) {
        let mut m = self.0.per_obj.lock().unwrap();
        let e = m.entry(inode.data().obj).or_default();
        e.1 += 1;
        assert_eq!(e.1, 1, "object {} destroyed twice", inode.data().obj);
    }
}

fn scenario(settings: Settings, umount_midway: bool) {
    let fs = Fs::default();
    let cache = InodeCache::new(settings);
    let sb = Arc::new(cache.mount(fs.clone()));
    let loading: Arc<Vec<AtomicBool>> = Arc::new((0..KEYS).map(|_| AtomicBool::new(false)).collect());
    let hs: Vec<_> = (0..4u64)
        .map(|t| {
            let (sb, loading) = (sb.clone(), loading.clone());
            thread::spawn(move || {
                for i in 0..4u64 {
                    let key = (t + i) % KEYS;
                    match sb.iget_locked(key) {
                        Some(Iget::New(n)) => {
                            assert!(
                                !loading[key as usize].swap(true, Ordering::SeqCst),
                                "key {key} loaded twice at once"
                            );
                            n.data().loaded.store(1, Ordering::SeqCst);
                            loading[key as usize].store(false, Ordering::SeqCst);
                            match (t + i) % 4 {
                                0 => n.iget_failed(),
                                1 => {
                                    let r = n.unlock_new_inode();
                                    r.clear_nlink();
                                }
                                2 => n.discard_new_inode(),
                                _ => drop(n.unlock_new_inode()),
                            }
                        }
                        Some(Iget::Cached(r)) => {
                            assert_eq!(
                                r.data().loaded.load(Ordering::SeqCst),
                                1,
                                "returned before its load ended"
                            );
                            assert!(
                                !r.state().flags.contains(InodeFlags::FREEING),
                                "returned while being evicted"
                            );
                            if i == 2 {
                                r.mark_dontcache();
                            }
                        }
                        None => panic!("no I_CREATING inode in this scenario"),
                    }
                    match (t, i) {
                        (0, 1) => {
                            sb.prune_icache_sb(2);
                        }
                        (1, 2) => {
                            sb.for_each_inode(|r| assert_eq!(r.data().loaded.load(Ordering::SeqCst), 1))
                        }
                        (2, 1) if umount_midway => {
                            sb.umount();
                            assert_eq!(sb.nr_parked(), 0, "parked after an umount");
                        }
                        (3, 2) => sb.flush_evictions(),
                        (1, 3) => {
                            // A drain of every outbox racing the parks and flushes.
                            sb.nr_inodes();
                        }
                        _ => {}
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let sb = Arc::try_unwrap(sb).unwrap();
    if sb.nr_parked() > 0 {
        PARKED_AT_END.fetch_add(1, Ordering::Relaxed);
    }
    assert_eq!(sb.umount(), 0, "no busy inode once every task is done");
    assert_eq!(sb.nr_parked(), 0);
    drop(sb);
    let st = cache.stats();
    assert_eq!(st.nr_inodes, 0);
    assert_eq!(st.nr_unused, 0);
    let c = &fs.0;
    let m = c.per_obj.lock().unwrap();
    assert_eq!(
        m.values().filter(|(_, d)| *d == 1).count(),
        c.allocs.load(Ordering::SeqCst),
        "every object destroyed once"
    );
    assert_eq!(
        m.values().filter(|(e, _)| *e == 1).count() as u64,
        st.loads,
        "every loaded object evicted once"
    );
}

#[test]
fn load_drop_prune_umount_scalable() {
    let before = PARKED_AT_END.load(Ordering::Relaxed);
    shuttle::check_random(|| scenario(Settings::default(), false), 300);
    assert!(
        PARKED_AT_END.load(Ordering::Relaxed) > before,
        "no run left an eviction parked for the umount"
    );
}

#[test]
fn load_drop_prune_umount_midway() {
    shuttle::check_random(|| scenario(Settings::default(), true), 300);
}

#[test]
fn load_drop_prune_prepatch() {
    shuttle::check_random(|| scenario(Settings::prepatch(), true), 200);
}

#[test]
fn load_drop_prune_pct() {
    shuttle::check_pct(|| scenario(Settings::default(), true), 200, 3);
}

/// A umount racing the last `iput`s of live, linked inodes (and a lookup taking one again),
/// with no second umount to clean up after it: every inode ends evicted exactly once and
/// none is left on the superblock (shuttle's schedules are sequentially consistent; the
/// stale-value side of this race is loom's `umount_races_last_iput`).
fn umount_races_last_iputs() {
    let fs = Fs::default();
    let cache = InodeCache::new(Settings::default());
    let sb = Arc::new(cache.mount(fs.clone()));
    let refs: Vec<InodeRef<Fs>> = (0..KEYS)
        .map(|k| {
            let Some(Iget::New(n)) = sb.iget_locked(k) else {
                panic!()
            };
            n.data().loaded.store(1, Ordering::SeqCst);
            n.unlock_new_inode()
        })
        .collect();
    let mut hs = Vec::new();
    for r in refs {
        let sb = sb.clone();
        hs.push(thread::spawn(move || {
            let k = r.ino();
            if k != 1 {
                // Unlinked: its eviction (the main thread listed it, on shard 0) parks
                // on the tasks of shard 1 (keys 0 and 2), racing the umount's drain.
                r.clear_nlink();
            }
            drop(r);
            // Maybe taken again (from the LRU, or nothing once evicted) and put again.
            drop(sb.ilookup(k));
        }));
    }
    let sb2 = sb.clone();
    hs.push(thread::spawn(move || {
        sb2.umount();
    }));
    for h in hs {
        h.join().unwrap();
    }
    assert!(!sb.is_active());
    assert_eq!(sb.nr_parked(), 0, "an eviction parked after the umount");
    assert_eq!(sb.nr_inodes(), 0, "an unused inode survived the umount");
    assert_eq!(sb.count_objects(), 0);
    drop(sb);
    let st = cache.stats();
    assert_eq!((st.nr_inodes, st.nr_unused), (0, 0));
    let m = fs.0.per_obj.lock().unwrap();
    assert_eq!(m.len(), fs.0.allocs.load(Ordering::SeqCst));
    assert!(
        m.values().all(|&(e, d)| (e, d) == (1, 1)),
        "each evicted and destroyed once: {m:?}"
    );
}

#[test]
fn umount_races_last_iput_random() {
    shuttle::check_random(umount_races_last_iputs, 1000);
}

#[test]
fn umount_races_last_iput_pct() {
    shuttle::check_pct(umount_races_last_iputs, 500, 3);
}
