//! Real threads racing every path that allocates or frees an inode (`iget_locked` and
//! `iget5_locked` misses and their lost insert races, failed loads and dropped guards,
//! `new_inode` + `insert_inode_locked`, `ilookup`, `igrab`, `iput`, unlink, unhash,
//! `I_DONTCACHE`, prune, `for_each_inode`) on a few keys, then checking the counters at
//! quiescence: `nr_inodes` equals the inodes on the superblock lists and the allocations
//! not yet destroyed, `nr_unused` the LRU; after unmount both are 0 and every inode was
//! destroyed exactly once (counted in the filesystem's own `destroy_inode`).
//!
//! `VFSCALE_STRESS_ITERS` (rounds, default 6), `VFSCALE_STRESS_OPS` (operations per thread
//! and round, default 2000) and `VFSCALE_STRESS_THREADS` (default 4) scale it up; the
//! defaults are small (2 shared cores).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use vfscale_icache::*;

const KEYS: u64 = 5;
/// `iget5_locked` keys live here (another hash value than the `iget_locked` ones).
const KEY5: u64 = 100;
/// `insert_inode_locked` keys live here.
const KEYI: u64 = 200;

#[derive(Default)]
struct Counts {
    next: AtomicU64,
    allocs: AtomicUsize,
    destroys: AtomicUsize,
    /// Per object: (evictions, destroys).
    per_obj: Mutex<HashMap<u64, (u32, u32)>>,
}

struct Data {
    obj: u64,
    loaded: AtomicU64,
}

#[derive(Clone)]
struct Fs {
    counts: Arc<Counts>,
    /// `drop_inode` always evicts (as vfscalefs does), or the generic rule (LRU).
    always_drop: bool,
}

impl Fs {
    fn data(&self) -> Data {
        self.counts.allocs.fetch_add(1, Ordering::SeqCst);
        Data {
            obj: self.counts.next.fetch_add(1, Ordering::SeqCst),
            loaded: AtomicU64::new(0),
        }
    }
}

impl SuperOperations for Fs {
    type Data = Data;
    fn alloc_inode(&self, _ino: u64) -> Data {
        self.data()
    }
    fn drop_inode(&self, inode: &Inode<Self>) -> bool {
        self.always_drop || inode_generic_drop(inode)
    }
    fn write_inode(&self, _inode: &Inode<Self>) {
        thread::yield_now(); // let lookups meet the I_WILL_FREE inode
    }
    fn evict_inode(&self, inode: &Inode<Self>) {
        thread::yield_now(); // let lookups meet the I_FREEING inode
        let mut m = self.counts.per_obj.lock().unwrap();
        m.entry(inode.data().obj).or_default().0 += 1;
    }
    fn destroy_inode(&self, inode: &Inode<Self>) {
        self.counts.destroys.fetch_add(1, Ordering::SeqCst);
        let mut m = self.counts.per_obj.lock().unwrap();
        m.entry(inode.data().obj).or_default().1 += 1;
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Ends an `I_NEW` load one of four ways; the reference kept, if any.
fn end_load(n: NewInode<Fs>, key: u64, rng: &mut Rng) -> Option<InodeRef<Fs>> {
    n.data().loaded.store(key + 1, Ordering::SeqCst);
    match rng.below(8) {
        0 => {
            n.iget_failed();
            None
        }
        1 => {
            drop(n); // the error path: iget_failed
            None
        }
        2 => {
            n.discard_new_inode();
            None
        }
        _ => Some(n.unlock_new_inode()),
    }
}

fn round(settings: Settings, always_drop: bool, seed: u64, ops: u64) {
    let fs = Fs {
        counts: Arc::default(),
        always_drop,
    };
    let cache = InodeCache::new(settings);
    let sb = Arc::new(cache.mount(fs.clone()));
    let threads = std::env::var("VFSCALE_STRESS_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4u64);
    let start = Arc::new(Barrier::new(threads as usize));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let sb = sb.clone();
            let fs = fs.clone();
            let start = start.clone();
            thread::spawn(move || {
                start.wait();
                let mut rng = Rng(seed.wrapping_mul(31).wrapping_add(t * 7919 + 1));
                // References this thread holds (the kernel's lookup counts).
                let mut held: Vec<InodeRef<Fs>> = Vec::new();
                for _ in 0..ops {
                    let key = rng.below(KEYS);
                    match rng.below(16) {
                        0..=2 => match sb.iget_locked(key) {
                            Some(Iget::New(n)) => held.extend(end_load(n, key, &mut rng)),
                            Some(Iget::Cached(r)) => {
                                assert!(!r.state().flags.contains(InodeFlags::FREEING));
                                held.push(r);
                            }
                            None => panic!("iget_locked keys are never I_CREATING"),
                        },
                        3..=5 => {
                            let fs = fs.clone();
                            let k = KEY5 + key;
                            match sb.iget5_locked(
                                k,
                                move |i| i.ino() == k,
                                move || {
                                    thread::yield_now(); // widen the insert race
                                    (k, fs.data())
                                },
                            ) {
                                Some(Iget::New(n)) => held.extend(end_load(n, k, &mut rng)),
                                Some(Iget::Cached(r)) => held.push(r),
                                None => panic!("iget5_locked keys are never I_CREATING"),
                            }
                        }
                        6 => {
                            let k = KEYI + key;
                            let r = sb.new_inode(k);
                            match sb.insert_inode_locked(r) {
                                Ok(n) => {
                                    n.data().loaded.store(k + 1, Ordering::SeqCst);
                                    match rng.below(4) {
                                        0 => n.iget_failed(),
                                        1 => {
                                            let r = n.ihold();
                                            r.clear_nlink();
                                            n.discard_new_inode();
                                            drop(r);
                                        }
                                        _ => held.push(n.unlock_new_inode()),
                                    }
                                }
                                Err(busy) => drop(busy.inode),
                            }
                        }
                        7 => {
                            let k = [key, KEY5 + key, KEYI + key][rng.below(3) as usize];
                            held.extend(sb.ilookup(k));
                        }
                        8 => {
                            let g = held
                                .get(rng.below(held.len() as u64 + 1) as usize)
                                .and_then(|r| r.igrab());
                            held.extend(g);
                        }
                        9..=11 => {
                            if !held.is_empty() {
                                let i = rng.below(held.len() as u64) as usize;
                                drop(held.swap_remove(i));
                            }
                        }
                        12 => {
                            if let Some(r) = held.get(rng.below(held.len() as u64 + 1) as usize) {
                                match rng.below(3) {
                                    0 => r.set_nlink(0),
                                    1 => r.remove_inode_hash(),
                                    _ => r.mark_dontcache(),
                                }
                            }
                        }
                        13 => {
                            sb.prune_icache_sb(1 + rng.below(4) as usize);
                        }
                        14 => sb.for_each_inode(|r| {
                            assert!(!r.state().flags.contains(InodeFlags::FREEING));
                        }),
                        _ => {
                            // Drop everything: the kernel forgets.
                            held.clear();
                        }
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }

    // Quiescence: nobody holds a reference.
    let st = cache.stats();
    let on_lists = sb.nr_inodes() as u64;
    let mut walked = 0u64;
    sb.for_each_inode(|_| walked += 1);
    let c = &fs.counts;
    let live = (c.allocs.load(Ordering::SeqCst) - c.destroys.load(Ordering::SeqCst)) as u64;
    assert_eq!(
        st.nr_inodes, on_lists,
        "seed {seed}: nr_inodes {} but {on_lists} inodes on the sb lists ({walked} walked, {live} allocated and not destroyed)",
        st.nr_inodes
    );
    assert_eq!(
        st.nr_inodes, live,
        "seed {seed}: nr_inodes vs allocations not destroyed"
    );
    assert_eq!(
        walked, on_lists,
        "seed {seed}: an inode on the sb list is I_NEW or being freed at quiescence"
    );
    assert_eq!(
        st.nr_unused,
        sb.count_objects() as u64,
        "seed {seed}: nr_unused vs the LRU's length"
    );
    if always_drop {
        assert_eq!(st.nr_inodes, 0, "seed {seed}: always-drop keeps nothing unused");
    }

    let sb = Arc::try_unwrap(sb).unwrap_or_else(|_| panic!("threads joined"));
    assert_eq!(sb.umount(), 0, "seed {seed}: no busy inode after unmount");
    let st = cache.stats();
    assert_eq!(st.nr_inodes, 0, "seed {seed}: nr_inodes after unmount");
    assert_eq!(st.nr_unused, 0, "seed {seed}: nr_unused after unmount");
    assert_eq!(
        c.allocs.load(Ordering::SeqCst),
        c.destroys.load(Ordering::SeqCst),
        "seed {seed}: allocations vs destroys"
    );
    let m = c.per_obj.lock().unwrap();
    assert_eq!(
        m.len(),
        c.allocs.load(Ordering::SeqCst),
        "seed {seed}: an object never destroyed"
    );
    for (obj, (e, d)) in m.iter() {
        assert!(
            *e <= 1 && *d == 1,
            "seed {seed}: object {obj} evicted {e} times, destroyed {d} times"
        );
    }
}

fn iters() -> u64 {
    std::env::var("VFSCALE_STRESS_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6)
}

fn ops() -> u64 {
    std::env::var("VFSCALE_STRESS_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000)
}

fn run(settings: Settings, always_drop: bool) {
    for seed in 0..iters() {
        round(settings, always_drop, seed, ops());
    }
}

#[test]
fn counts_balance_scalable() {
    run(Settings::default(), false);
}

#[test]
fn counts_balance_scalable_always_drop() {
    run(Settings::default(), true);
}

#[test]
fn counts_balance_prepatch() {
    run(Settings::prepatch(), false);
}

#[test]
fn counts_balance_locked_lookup_one_chain() {
    run(
        Settings {
            lookup: Lookup::Locked,
            hash_bits: 0,
            shards: 2,
            ..Settings::default()
        },
        false,
    );
}

#[test]
fn counts_balance_one_chain_always_drop() {
    run(
        Settings {
            hash_bits: 0,
            shards: 4,
            ..Settings::default()
        },
        true,
    );
}
