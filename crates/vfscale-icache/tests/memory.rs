//! Bookkeeping per cached inode beyond the filesystem's own data: everything the cache
//! allocates for an inode that sits unused on the LRU (the inode struct, its superblock
//! list slot, its LRU entry), measured with a counting allocator. The target is
//! 128 bytes; the fixed hash table (16 bytes per chain) is counted apart.

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
    let cache = InodeCache::new(Settings {
        lru: Lru::Single,
        shards: 1,
        ..Settings::default()
    });
    let sb = cache.mount(Fs);
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
    let per = (after - before) as f64 / N as f64 - std::mem::size_of::<[u64; 4]>() as f64;
    eprintln!(
        "bookkeeping per cached inode: {per:.1} bytes (struct inode part: {} bytes)",
        std::mem::size_of::<Inode<Fs>>() - std::mem::size_of::<[u64; 4]>()
    );
    assert!(per <= 128.0, "{per:.1} bytes of bookkeeping per cached inode");
    // evict_inodes of all of them leaves nothing.
    assert_eq!(sb.umount(), 0);
    assert_eq!(cache.stats().nr_inodes, 0);
}
