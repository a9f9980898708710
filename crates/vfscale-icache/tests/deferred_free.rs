//! The deferred free of evicted inodes (a grace period after `->destroy_inode`; `epoch.rs`
//! and `deferred_free.rs`: each thread queues its stamped batches and frees them itself once they
//! expire; a thread that exits, or queues more than it keeps, leaves its batches on a
//! shared orphan list that any thread frees): every inode's data is dropped exactly once
//! and only after its `->destroy_inode`, when threads exit while others evict, when a
//! thread stops evicting and idles, and the superblock itself (which holds the filesystem)
//! is freed too. Counted in the data's own `Drop`, so a batch lost, or freed twice, shows.

#![cfg(not(any(vfscale_loom, vfscale_shuttle)))]

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::thread;

use vfscale_icache::*;

/// Per object: 0 allocated, 1 destroyed (`->destroy_inode`), 2 dropped (memory freed).
struct Counts {
    state: Vec<AtomicU8>,
    next: AtomicU64,
    drops: AtomicUsize,
    /// Drops of data not destroyed first, or dropped twice.
    bad: AtomicUsize,
}

impl Counts {
    fn new(objects: usize) -> Arc<Self> {
        Arc::new(Counts {
            state: (0..objects).map(|_| AtomicU8::new(0)).collect(),
            next: AtomicU64::new(0),
            drops: AtomicUsize::new(0),
            bad: AtomicUsize::new(0),
        })
    }
    fn allocs(&self) -> usize {
        self.next.load(Ordering::SeqCst) as usize
    }
}

struct Obj {
    id: usize,
    counts: Arc<Counts>,
}

impl Drop for Obj {
    fn drop(&mut self) {
        // No panic here: this runs inside a reclaim or a thread's exit.
        if self.counts.state[self.id]
            .compare_exchange(1, 2, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            self.counts.bad.fetch_add(1, Ordering::SeqCst);
        }
        self.counts.drops.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(Clone)]
struct Fs(Arc<Counts>);

impl SuperOperations for Fs {
    type Data = Obj;
    fn alloc_inode(&self, _ino: u64) -> Obj {
        Obj {
            id: self.0.next.fetch_add(1, Ordering::SeqCst) as usize,
            counts: self.0.clone(),
        }
    }
    /// Every last `iput` evicts (an unlink): each `iget` below retires one inode.
    fn drop_inode(&self, _inode: &Inode<Self>) -> bool {
        true
    }
    fn destroy_inode(&self, inode: &Inode<Self>) {
        let c = &inode.data().counts;
        if c.state[inode.data().id]
            .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            c.bad.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// Held by each test: one holds a read-side section (no grace period ends anywhere
/// meanwhile), which would stall the other's frees.
static SERIAL: Mutex<()> = Mutex::new(());

/// A batch of retired inodes (`deferred_free.rs`'s `BATCH`).
const BATCH: usize = 60;

/// Loads and evicts inodes `first..first + n` (each `iget` misses; its last `iput`
/// evicts).
fn churn(sb: &SuperBlock<Fs>, first: u64, n: u64) {
    for ino in first..first + n {
        match sb.iget_locked(ino) {
            Some(Iget::New(n)) => drop(n.unlock_new_inode()),
            _ => panic!("inode {ino} is loaded once"),
        }
    }
}

/// Flushes until every allocated inode's data is dropped (or gives up after `tries`):
/// the inodes not freed yet.
fn settle(c: &Counts, tries: usize) -> usize {
    for _ in 0..tries {
        flush_deferred();
        if c.drops.load(Ordering::SeqCst) == c.allocs() {
            break;
        }
        thread::yield_now();
    }
    c.allocs() - c.drops.load(Ordering::SeqCst)
}

/// Checks every object went allocated → destroyed → dropped, once each.
fn check_all_freed_once(c: &Counts) {
    assert_eq!(
        c.bad.load(Ordering::SeqCst),
        0,
        "data dropped before its destroy, or twice"
    );
    assert_eq!(
        c.drops.load(Ordering::SeqCst),
        c.allocs(),
        "data never dropped (leaked)"
    );
    for (id, s) in c.state[..c.allocs()].iter().enumerate() {
        assert_eq!(s.load(Ordering::SeqCst), 2, "object {id}");
    }
}

/// Threads that evict different amounts exit one after another while the others keep
/// evicting, so batches are delivered to lists being closed (and to closed ones); then
/// the main thread unmounts and flushes. Every inode's data is dropped once, after its
/// destroy, and the superblock (holding the filesystem's `Arc`) is freed.
#[test]
fn threads_exiting_while_others_deliver_free_every_inode_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const THREADS: u64 = 4;
    const PER: u64 = 30 * BATCH as u64;
    for round in 0..3 {
        let total = (PER * THREADS * (THREADS + 1) / 2) as usize;
        let c = Counts::new(total);
        let cache = InodeCache::new(Settings::default());
        let sb = Arc::new(cache.mount(Fs(c.clone())));
        let start = Arc::new(Barrier::new(THREADS as usize));
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (sb, start) = (sb.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    // Thread t evicts (t + 1) * PER inodes: the first exits first.
                    churn(&sb, t * 1_000_000, (t + 1) * PER);
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let sb = Arc::into_inner(sb).unwrap();
        assert_eq!(sb.umount(), 0);
        drop(sb);
        drop(cache);
        let left = settle(&c, 200);
        assert_eq!(left, 0, "round {round}: {left} inodes never freed");
        check_all_freed_once(&c);
        assert_eq!(c.allocs(), total);
        // The superblock (which holds the filesystem, and so an `Arc` of the counts) is
        // freed too: it went into the main thread's batch at the last handle's drop.
        assert_eq!(Arc::strong_count(&c), 1, "round {round}: superblock not freed");
    }
}

/// A thread evicts, then idles without exiting (a pooled thread). Its batches could not
/// be freed while it evicted (the main thread held a read-side section): it keeps the
/// newest 64 queued and leaves the older ones on the orphan list, which the main thread
/// frees once it leaves its section and reclaims. So an idle thread holds a bounded number
/// of inodes (64 batches and its partial batch), and when it exits everything is freed,
/// once. Without the bound it held every batch (18,000 inodes).
#[test]
fn an_idle_thread_holds_a_bounded_number_and_frees_all_at_exit() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const N: u64 = 300 * BATCH as u64;
    let c = Counts::new(N as usize + 2 * BATCH);
    let cache = InodeCache::new(Settings::default());
    let sb = Arc::new(cache.mount(Fs(c.clone())));
    let (done_tx, done_rx) = mpsc::channel();
    let (exit_tx, exit_rx) = mpsc::channel::<()>();
    // Held while the thread evicts: no grace period ends meanwhile.
    let pin = rcu_read_lock();
    let sb2 = sb.clone();
    let h = thread::spawn(move || {
        churn(&sb2, 0, N);
        drop(sb2);
        done_tx.send(()).unwrap();
        exit_rx.recv().unwrap();
    });
    done_rx.recv().unwrap();
    assert_eq!(c.drops.load(Ordering::SeqCst), 0, "freed within a grace period");
    drop(pin);
    // The main thread evicts and reclaims: it frees the idle thread's orphaned batches.
    churn(&sb, 10_000_000, 2 * BATCH as u64);
    let held = settle(&c, 100);
    let bound = 64 * BATCH + (BATCH - 1);
    eprintln!(
        "an idle thread holds {held} of {} inodes (bound {bound})",
        c.allocs()
    );
    assert!(
        held <= bound,
        "an idle thread holds {held} inodes, more than {bound}"
    );
    assert_eq!(c.bad.load(Ordering::SeqCst), 0);
    exit_tx.send(()).unwrap();
    h.join().unwrap();
    let sb = Arc::into_inner(sb).unwrap();
    assert_eq!(sb.umount(), 0);
    drop(sb);
    drop(cache);
    assert_eq!(settle(&c, 200), 0, "inodes of an exited thread never freed");
    check_all_freed_once(&c);
    assert_eq!(Arc::strong_count(&c), 1, "superblock not freed");
}
