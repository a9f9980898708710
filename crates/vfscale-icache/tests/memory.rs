//! Bookkeeping per cached inode beyond the filesystem's own data: everything the cache
//! allocates for an inode that sits unused on the LRU (the inode struct with its LRU
//! links, its superblock list slot) plus its share of the hash table (one 8-byte
//! `hlist_bl_head` per chain, sized here at one chain or more per cached inode, as the
//! lab does), measured with a counting allocator. The target is 128 bytes.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use vfscale_icache::*;

struct Counting;
static NET: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator, only counting bytes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        NET.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: same layout contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        NET.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from `alloc` with `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        NET.fetch_add(n as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: as `GlobalAlloc::realloc`.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

struct Fs;
impl SuperOperations for Fs {
    type Data = [u64; 4];
    fn alloc_inode(&self, ino: u64) -> [u64; 4] {
        [ino; 4]
    }
}

#[test]
fn bookkeeping_per_cached_inode_is_at_most_128_bytes() {
    const N: u64 = 100_000;
    let t0 = NET.load(Ordering::Relaxed);
    let cache = InodeCache::new(Settings {
        lru: Lru::Single,
        shards: 1,
        // 2^18 chains >= the 2N inodes cached below.
        hash_bits: 18,
        ..Settings::default()
    });
    let sb = cache.mount(Fs);
    // The hash table and the rest of the cache's and superblock's fixed allocations.
    let fixed = NET.load(Ordering::Relaxed) - t0;
    assert!(fixed >= 8 << 18, "the hash table is 8 bytes per chain ({fixed})");
    // Warm up (vectors grow in powers of two: measure between two fills).
    for ino in 0..N {
        if let Some(Iget::New(n)) = sb.iget_locked(ino) {
            drop(n.unlock_new_inode());
        }
    }
    let before = NET.load(Ordering::Relaxed);
    for ino in N..2 * N {
        if let Some(Iget::New(n)) = sb.iget_locked(ino) {
            drop(n.unlock_new_inode());
        }
    }
    let after = NET.load(Ordering::Relaxed);
    assert_eq!(cache.stats().nr_unused, 2 * N);
    let own = (after - before) as f64 / N as f64 - std::mem::size_of::<[u64; 4]>() as f64;
    let table = fixed as f64 / (2 * N) as f64;
    let per = own + table;
    eprintln!(
        "bookkeeping per cached inode: {per:.1} bytes = {own:.1} per inode (struct inode \
         part: {} bytes) + {table:.1} hash table and fixed share",
        std::mem::size_of::<Inode<Fs>>() - std::mem::size_of::<[u64; 4]>()
    );
    assert!(per <= 128.0, "{per:.1} bytes of bookkeeping per cached inode");
    // evict_inodes of all of them leaves nothing.
    assert_eq!(sb.umount(), 0);
    assert_eq!(cache.stats().nr_inodes, 0);
}
