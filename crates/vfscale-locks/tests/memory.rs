//! `FileLockContext::memory` against the allocator: what it reports is what the heap
//! grew by, and a held lock costs at most 128 bytes with the index.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use vfscale_locks::*;

/// Counts the bytes each thread has live on the heap (its allocations less its frees),
/// so the test harness's own threads do not disturb the count.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    // `try_with`: a thread's last frees may come after its locals are gone.
    let _ = LIVE.try_with(|c| c.set(c.get() + delta));
}

// SAFETY: every call is forwarded to the system allocator unchanged; the counter only
// observes the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count(l.size() as isize);
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        count(-(l.size() as isize));
        // SAFETY: `p` was allocated by `System` with layout `l` (see `alloc`).
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        count(new as isize - l.size() as isize);
        // SAFETY: as for `dealloc`; `new` is the caller's valid new size.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn live() -> isize {
    LIVE.with(Cell::get)
}

/// Heap growth and reported memory for `held` locks, OFD (one open file each) or POSIX
/// (one process), on bytes 0, 2, 4, ...
fn measure(index: LockIndex, held: usize, ofd: bool) -> (isize, ContextMemory) {
    let mgr = LockManager::with_settings(Settings {
        index,
        ..Settings::default()
    });
    let base = live();
    let inode = FileLockContext::new(&mgr, InodeKey::default());
    for i in 0..held {
        let f = OpenFile::new(i as u64, AccessMode::ReadWrite);
        let mut fl = Flock::new(LockType::Write, 2 * i as i64, 1);
        let cmd = if ofd { FcntlCmd::OfdSetLk } else { FcntlCmd::SetLk };
        inode.fcntl(Process::new(1), f, cmd, &mut fl).unwrap();
    }
    let grown = live() - base;
    (grown, inode.memory())
}

#[test]
fn reported_memory_is_the_heaps_and_a_lock_costs_at_most_128_bytes() {
    for index in [LockIndex::Tree, LockIndex::List] {
        for ofd in [true, false] {
            // Setting up 100,000 locks through Linux's list takes O(n^2): not for List.
            let sizes: &[usize] = match index {
                LockIndex::Tree => &[1_000, 10_000, 100_000],
                LockIndex::List => &[1_000, 10_000],
            };
            for &held in sizes {
                let (grown, m) = measure(index, held, ofd);
                assert_eq!(m.posix_locks, held);
                let per_lock = m.bytes_per_lock();
                eprintln!(
                    "{index:?} {} x{held}: reported {} B ({per_lock:.1} B/lock), heap grew {grown} B",
                    if ofd { "OFD" } else { "POSIX" },
                    m.bytes
                );
                // The listing shard's entry for the context is the manager's, not the
                // context's: allow a few words of difference.
                assert!(
                    (grown - m.bytes as isize).abs() <= 64,
                    "reported {} B, heap grew {grown} B",
                    m.bytes
                );
                if index == LockIndex::Tree {
                    assert!(per_lock <= 128.0, "{per_lock} bytes per lock");
                }
            }
        }
    }
}
