//! The cache's own grace periods (`epoch.rs`, `deferred_free.rs`) under lock-free lookups that meet
//! inodes being evicted: threads `iget_locked` and `ilookup` a few keys (every last `iput`
//! evicts, so lookups keep finding inodes that are being freed), short-lived threads exit
//! while others evict (their batches go to the orphan list), and some threads exit with a
//! read-side section still open in a thread-local destructor that then looks up and evicts
//! (a record left to its last guard, temporary records, single-box orphans). Every inode is
//! evicted, destroyed and its data dropped exactly once; a lookup reads its data's canary
//! (a use-after-free shows as a bad canary, or under `valgrind --tool=memcheck`).
//!
//! `VFSCALE_RCU_ROUNDS` (thread generations, default 6), `VFSCALE_RCU_OPS` (operations per
//! thread, default 3000), `VFSCALE_RCU_THREADS` (default 4) scale it; small for valgrind.

#![cfg(not(any(vfscale_loom, vfscale_shuttle)))]

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use vfscale_icache::*;

const KEYS: u64 = 6;
const CANARY: u64 = 0x5a5a_1234_cafe_f00d;
/// Objects a run may allocate at most (the per-object state array).
const MAX_OBJECTS: usize = 4_000_000;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Per object: 0 allocated, 1 evicted, 2 destroyed, 3 data dropped.
struct Counts {
    state: Vec<AtomicU8>,
    next: AtomicU64,
    drops: AtomicUsize,
    /// Steps out of order or twice.
    bad: AtomicUsize,
    /// Bad canaries, seen by lookups or the data's drop.
    bad_canary: AtomicUsize,
}

impl Counts {
    fn step(&self, id: usize, from: u8) {
        if self.state[id]
            .compare_exchange(from, from + 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            self.bad.fetch_add(1, Ordering::SeqCst);
        }
    }
}

struct Obj {
    id: usize,
    canary: AtomicU64,
    counts: Arc<Counts>,
}

impl Drop for Obj {
    fn drop(&mut self) {
        // No panic: this runs inside a reclaim (maybe under an `i_lock`) or a thread exit.
        if self.canary.swap(0, Ordering::SeqCst) != CANARY {
            self.counts.bad_canary.fetch_add(1, Ordering::SeqCst);
        }
        self.counts.step(self.id, 2);
        self.counts.drops.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(Clone)]
struct Fs(Arc<Counts>);

impl SuperOperations for Fs {
    type Data = Obj;
    fn alloc_inode(&self, _ino: u64) -> Obj {
        let id = self.0.next.fetch_add(1, Ordering::SeqCst) as usize;
        assert!(id < MAX_OBJECTS, "raise MAX_OBJECTS");
        Obj {
            id,
            canary: AtomicU64::new(CANARY),
            counts: self.0.clone(),
        }
    }
    fn drop_inode(&self, _inode: &Inode<Self>) -> bool {
        true
    }
    fn evict_inode(&self, inode: &Inode<Self>) {
        thread::yield_now(); // let lookups meet the I_FREEING inode
        self.0.step(inode.data().id, 0);
    }
    fn destroy_inode(&self, inode: &Inode<Self>) {
        // An inode that lost its insert race is destroyed without an eviction.
        let s = &self.0.state[inode.data().id];
        let _ = s.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst);
        self.0.step(inode.data().id, 1);
    }
}

fn check(inode: &Inode<Fs>, c: &Counts) {
    if inode.data().canary.load(Ordering::SeqCst) != CANARY {
        c.bad_canary.fetch_add(1, Ordering::SeqCst);
    }
}

/// `ops` random lookups of the keys: `iget_locked` (a miss loads), `ilookup`, a lookup
/// inside an explicit (nested) read-side section, and `ilookup5` with a test that yields;
/// each reference is dropped at once, so every last `iput` evicts.
fn hammer(sb: &SuperBlock<Fs>, c: &Arc<Counts>, seed: u64, ops: usize) {
    let mut x = seed | 1;
    for _ in 0..ops {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let ino = x % KEYS;
        match (x >> 8) % 5 {
            4 => {
                // `ilookup5`'s test runs inside the lock-free walk, before `i_lock`, on
                // inodes that may be being evicted: it yields, so evictors retire and
                // reclaim meanwhile, then reads the data again (freed: a bad canary,
                // or an invalid read under memcheck).
                let c2 = c.clone();
                let found = sb.ilookup5(ino, move |inode| {
                    check(inode, &c2);
                    thread::yield_now();
                    check(inode, &c2);
                    inode.ino() == ino
                });
                if let Some(r) = found {
                    check(&r, c);
                }
            }
            0 | 1 => match sb.iget_locked(ino) {
                Some(Iget::New(n)) => {
                    check(&n, c);
                    drop(n.unlock_new_inode());
                }
                Some(Iget::Cached(r)) => check(&r, c),
                None => {}
            },
            2 => {
                if let Some(r) = sb.ilookup(ino) {
                    check(&r, c);
                }
            }
            _ => {
                let _outer = rcu_read_lock();
                if let Some(r) = sb.ilookup(ino) {
                    check(&r, c);
                }
            }
        }
    }
}

/// A thread-local whose destructor runs after the cache's own (it is created before the
/// thread's first pin): it holds a read-side section taken while the thread's bookkeeping
/// was alive, and looks up and evicts after that bookkeeping is gone.
struct AtExit {
    sb: Option<Arc<SuperBlock<Fs>>>,
    counts: Option<Arc<Counts>>,
    section: Option<RcuReadLock>,
}

impl Drop for AtExit {
    fn drop(&mut self) {
        if let (Some(sb), Some(c)) = (&self.sb, &self.counts) {
            hammer(sb, c, 0x9e37_79b9, 40);
        }
        drop(self.section.take());
        if let (Some(sb), Some(c)) = (&self.sb, &self.counts) {
            hammer(sb, c, 0x7f4a_7c15, 40);
        }
    }
}

thread_local! {
    static AT_EXIT: RefCell<AtExit> = const {
        RefCell::new(AtExit { sb: None, counts: None, section: None })
    };
}

/// Serializes the tests of this file (a long section in one stalls the other's frees).
static SERIAL: Mutex<()> = Mutex::new(());

fn settle(c: &Counts) {
    for _ in 0..10_000 {
        flush_deferred();
        if c.drops.load(Ordering::SeqCst) == c.next.load(Ordering::SeqCst) as usize {
            return;
        }
        thread::yield_now();
    }
}

fn check_all(c: &Counts) {
    let n = c.next.load(Ordering::SeqCst) as usize;
    assert_eq!(
        c.bad_canary.load(Ordering::SeqCst),
        0,
        "a bad canary (freed data)"
    );
    assert_eq!(c.bad.load(Ordering::SeqCst), 0, "out of order, or twice");
    assert_eq!(c.drops.load(Ordering::SeqCst), n, "data never dropped");
    for (id, s) in c.state[..n].iter().enumerate() {
        assert_eq!(s.load(Ordering::SeqCst), 3, "object {id}");
    }
}

/// Generations of short-lived threads hammer the same keys; each generation's threads
/// exit while the next one's (and a long-lived thread) evict. Half the threads exit with
/// a section open in a thread-local destructor that evicts after the cache's bookkeeping
/// is gone.
#[test]
fn lookups_meet_evictions_while_threads_come_and_go() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rounds = env("VFSCALE_RCU_ROUNDS", 6);
    let ops = env("VFSCALE_RCU_OPS", 3000);
    let threads = env("VFSCALE_RCU_THREADS", 4);
    let c = Arc::new(Counts {
        state: (0..MAX_OBJECTS).map(|_| AtomicU8::new(0)).collect(),
        next: AtomicU64::new(0),
        drops: AtomicUsize::new(0),
        bad: AtomicUsize::new(0),
        bad_canary: AtomicUsize::new(0),
    });
    let cache = InodeCache::new(Settings::default());
    let sb = Arc::new(cache.mount(Fs(c.clone())));
    let stop = Arc::new(AtomicUsize::new(0));
    let steady = {
        let (sb, c, stop) = (sb.clone(), c.clone(), stop.clone());
        thread::spawn(move || {
            let mut seed = 1;
            while stop.load(Ordering::SeqCst) == 0 {
                hammer(&sb, &c, seed, 200);
                seed += 1;
            }
        })
    };
    let mut prev: Vec<thread::JoinHandle<()>> = Vec::new();
    for round in 0..rounds {
        let gen: Vec<_> = (0..threads)
            .map(|t| {
                let (sb, c) = (sb.clone(), c.clone());
                let seed = (round * 1000 + t) as u64 * 0x2545_f491 + 7;
                thread::spawn(move || {
                    let at_exit = t % 2 == 0;
                    if at_exit {
                        // Before any pin: this destructor runs after the cache's.
                        AT_EXIT.with(|a| {
                            let mut a = a.borrow_mut();
                            a.sb = Some(sb.clone());
                            a.counts = Some(c.clone());
                        });
                    }
                    hammer(&sb, &c, seed, ops);
                    if at_exit {
                        AT_EXIT.with(|a| a.borrow_mut().section = Some(rcu_read_lock()));
                        hammer(&sb, &c, seed ^ 0xff, 20);
                    }
                })
            })
            .collect();
        // The previous generation exits while this one runs.
        for h in prev.drain(..) {
            h.join().unwrap();
        }
        prev = gen;
    }
    for h in prev {
        h.join().unwrap();
    }
    stop.store(1, Ordering::SeqCst);
    steady.join().unwrap();
    let sb = Arc::into_inner(sb).unwrap();
    sb.umount();
    drop(sb);
    drop(cache);
    settle(&c);
    eprintln!(
        "{} inodes, each evicted, destroyed and freed once",
        c.next.load(Ordering::SeqCst)
    );
    check_all(&c);
    assert_eq!(Arc::strong_count(&c), 1, "superblock not freed");
}
