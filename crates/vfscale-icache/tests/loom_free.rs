//! Loom models of frees racing a writer that is not the freer, on an allocator that
//! scribbles every freed block and keeps the last few thousand from reuse: a write to a
//! block after its free shows as a scribble that changed (checked after each execution),
//! or as a panic when the freed memory is read back.
//! Run: `RUSTFLAGS="--cfg vfscale_loom" CARGO_TARGET_DIR=target/loom cargo test -p vfscale-icache --release --test loom_free`
#![cfg(vfscale_loom)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Mutex;

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use vfscale_icache::{Iget, InodeCache, NewInode, Settings, SuperBlock, SuperOperations};

const SCRIBBLE: u8 = 0xA5;
/// Freed blocks kept from reuse (address, layout), oldest first out.
const KEPT: usize = 1 << 14;

struct Quarantine {
    ring: Mutex<Option<Ring>>,
}

struct Ring {
    blocks: Vec<(usize, Layout)>,
    next: usize,
}

/// Set when a kept block no longer holds its scribble: it was written after its free.
static WRITTEN_AFTER_FREE: AtomicBool = AtomicBool::new(false);
/// Set while the ring itself allocates (its first growth): those frees pass through.
static IN_RING: AtomicBool = AtomicBool::new(false);

fn scribbled(addr: usize, layout: Layout) -> bool {
    // SAFETY: a kept block: still allocated (from the system's view) and `layout.size()`
    // bytes long.
    unsafe { std::slice::from_raw_parts(addr as *const u8, layout.size()) }
        .iter()
        .all(|&b| b == SCRIBBLE)
}

// SAFETY: allocation is the system allocator's; a freed block is written within its size,
// then either returned to the system with its own layout or kept (and returned later).
unsafe impl GlobalAlloc for Quarantine {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if IN_RING.load(SeqCst) {
            // SAFETY: forwarded with the caller's contract.
            return unsafe { System.dealloc(ptr, layout) };
        }
        // SAFETY: `ptr` is a live block of `layout.size()` bytes being freed.
        unsafe { std::ptr::write_bytes(ptr, SCRIBBLE, layout.size()) };
        let mut g = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let r = g.get_or_insert_with(|| {
            IN_RING.store(true, SeqCst);
            let r = Ring {
                blocks: Vec::with_capacity(KEPT),
                next: 0,
            };
            IN_RING.store(false, SeqCst);
            r
        });
        let out = if r.blocks.len() < KEPT {
            r.blocks.push((ptr as usize, layout));
            None
        } else {
            let i = r.next;
            r.next = (r.next + 1) % KEPT;
            Some(std::mem::replace(&mut r.blocks[i], (ptr as usize, layout)))
        };
        drop(g);
        if let Some((addr, l)) = out {
            if !scribbled(addr, l) {
                WRITTEN_AFTER_FREE.store(true, SeqCst);
            }
            // SAFETY: a block this allocator kept, with the layout it was freed with.
            unsafe { System.dealloc(addr as *mut u8, l) };
        }
    }
}

#[global_allocator]
static ALLOC: Quarantine = Quarantine {
    ring: Mutex::new(None),
};

/// Whether every kept block still holds its scribble.
fn kept_blocks_untouched() -> bool {
    let g = ALLOC.ring.lock().unwrap_or_else(|e| e.into_inner());
    let all = g
        .as_ref()
        .is_none_or(|r| r.blocks.iter().all(|&(a, l)| scribbled(a, l)));
    all && !WRITTEN_AFTER_FREE.load(SeqCst)
}

#[derive(Clone, Default)]
struct Fs(Arc<AtomicUsize>);

impl SuperOperations for Fs {
    type Data = ();
    fn alloc_inode(&self, _ino: u64) {}
    fn destroy_inode(&self, _inode: &vfscale_icache::Inode<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn new_inode(sb: &SuperBlock<Fs>, ino: u64) -> NewInode<Fs> {
    match sb.iget_locked(ino) {
        Some(Iget::New(n)) => n,
        _ => panic!("inode {ino} is not new"),
    }
}

/// A prune meets a parked inode (evicted by another CPU, its removal from this CPU's
/// lists batched in that CPU's outbox): under the inode's `i_lock` it takes it off the
/// LRU and clears ON_LRU, then releases the `i_lock`. The outbox's flush, seeing ON_LRU
/// clear, skips the LRU lock (and the `i_lock`) and retires the inode: only the prune's
/// pin keeps the memory until that release. Without it the release wrote into the freed
/// inode (the model panicked in the lock's release, reading scribbled memory).
#[test]
fn prune_releases_a_parked_inode_before_its_flush_frees_it() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let fs = Fs::default();
        let cache = InodeCache::new(Settings::default());
        let sb = Arc::new(cache.mount(fs.clone()));
        // Inode 1, unused on this thread's LRU (shard 0), then in use again.
        drop(new_inode(&sb, 1).unlock_new_inode());
        let r = sb.ilookup(1).expect("cached");
        let sb2 = sb.clone();
        // Another thread (shard 1) drops its last link and reference: evicted, parked
        // (still on shard 0's lists), then flushed.
        let evictor = thread::spawn(move || {
            r.clear_nlink();
            drop(r);
            sb2.flush_evictions();
        });
        sb.prune_icache_sb(1);
        evictor.join().unwrap();
        assert_eq!(fs.0.load(Ordering::SeqCst), 1, "destroyed once");
        assert!(kept_blocks_untouched(), "a freed block was written");
    });
}
