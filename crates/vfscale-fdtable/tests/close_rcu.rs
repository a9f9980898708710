//! Lookups racing closes, on an allocator that poisons and never reuses freed memory while
//! the test runs: a closed file's last reference goes at the close (Linux's last `fput`),
//! but the allocation a lookup may still be reading goes only a grace period later (the
//! slot's weak reference, as `struct file` is `SLAB_TYPESAFE_BY_RCU`). Were the allocation
//! freed at the close, a lookup that loaded the pointer just before would upgrade a
//! reference count of poison (`0xA5…`, above `isize::MAX`: `Weak::upgrade` aborts the
//! process) or return a file whose contents are poison (the `magic` check below).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use vfscale_fdtable::{Fd, FdTable, Settings};

/// The system allocator, except that while `QUARANTINE` is set a freed block is filled
/// with `0xA5` and never handed out again (leaked).
struct Poisoning;

static QUARANTINE: AtomicBool = AtomicBool::new(false);

// SAFETY: allocation is the system allocator's; deallocation either hands the block back
// to it unchanged in layout or keeps it (a leak is safe), after writing within its size.
unsafe impl GlobalAlloc for Poisoning {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if QUARANTINE.load(SeqCst) {
            // SAFETY: `ptr` is a live block of `layout.size()` bytes being freed.
            unsafe { std::ptr::write_bytes(ptr, 0xA5, layout.size()) };
        } else {
            // SAFETY: forwarded with the caller's contract.
            unsafe { System.dealloc(ptr, layout) }
        }
    }
}

#[global_allocator]
static ALLOC: Poisoning = Poisoning;

const MAGIC: u64 = 0x5eed_f11e_0000_0001;

struct File {
    magic: u64,
    drops: Arc<AtomicUsize>,
}

impl Drop for File {
    fn drop(&mut self) {
        assert_eq!(self.magic, MAGIC, "a file dropped twice or never made");
        self.drops.fetch_add(1, SeqCst);
    }
}

/// A table with a file at fd 0, a maker of files counting on its drop counter, and it.
fn table_with_fd0() -> (FdTable<File>, impl Fn() -> Arc<File>, Arc<AtomicUsize>) {
    let drops = Arc::new(AtomicUsize::new(0));
    let t: FdTable<File> = FdTable::new(Settings::default());
    let d = drops.clone();
    let file = move || {
        Arc::new(File {
            magic: MAGIC,
            drops: d.clone(),
        })
    };
    assert_eq!(t.open(file(), false), Ok(Fd(0)));
    (t, file, drops)
}

#[test]
fn lookups_racing_closes_never_read_a_freed_file() {
    const ROUNDS: usize = 200_000;
    let (t, file, drops) = table_with_fd0();
    QUARANTINE.store(true, SeqCst);
    let done = AtomicBool::new(false);
    let (mut seen, mut missed) = (0usize, 0usize);
    std::thread::scope(|s| {
        s.spawn(|| {
            // The closer: close fd 0 and open a new file there, over and over; no
            // lookup holds it most of the time, so most files are dropped by `close`.
            for _ in 0..ROUNDS {
                t.close(Fd(0)).unwrap();
                assert_eq!(t.open(file(), false), Ok(Fd(0)));
            }
            done.store(true, SeqCst);
        });
        while !done.load(SeqCst) {
            match t.get(Fd(0)) {
                Some(f) => {
                    assert_eq!(f.magic, MAGIC, "a lookup returned a freed file");
                    seen += 1;
                }
                None => missed += 1,
            }
            if let Some(m) = t.with(Fd(0), |f| f.magic) {
                assert_eq!(m, MAGIC, "`with` ran on a freed file");
            }
        }
    });
    QUARANTINE.store(false, SeqCst);
    assert!(seen > 0, "no lookup found a file ({missed} found none)");
    // Every file but the one still open was dropped, by its close or by the lookup that
    // held it last: none waits for a grace period.
    assert_eq!(drops.load(SeqCst), ROUNDS);
    drop(t);
    assert_eq!(drops.load(SeqCst), ROUNDS + 1);
}

/// dup2 replaces an open descriptor atomically: a lookup racing it finds the old file or
/// the new one, never nothing, even when the replaced file's last reference was the slot's
/// (the lookup's increment-if-not-zero then fails, and it reads the slot again).
#[test]
fn lookups_racing_dup2_always_find_a_file() {
    const ROUNDS: usize = 300_000;
    let (t, file, drops) = table_with_fd0();
    let done = AtomicBool::new(false);
    let (mut found, mut missed) = (0usize, 0usize);
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..ROUNDS {
                let tmp = t.open(file(), false).unwrap();
                assert_eq!(t.dup2(tmp, Fd(0)), Ok(Fd(0)));
                t.close(tmp).unwrap();
            }
            done.store(true, SeqCst);
        });
        while !done.load(SeqCst) {
            match t.get(Fd(0)) {
                Some(f) => {
                    assert_eq!(f.magic, MAGIC);
                    found += 1;
                }
                None => missed += 1,
            }
        }
    });
    assert!(found > 0);
    assert_eq!(
        missed, 0,
        "fd 0 was never closed, yet {missed} lookups found nothing"
    );
    assert_eq!(
        drops.load(SeqCst),
        ROUNDS,
        "each replaced file dropped by its dup2"
    );
}
