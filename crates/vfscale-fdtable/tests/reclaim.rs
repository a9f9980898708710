//! Regression tests for how closed files are reclaimed: user code (a file's `Drop`, the
//! close hook) never runs under `file_lock`, and a panicking hook neither frees a file a
//! lookup still holds nor leaks the rest of a batch.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Barrier, OnceLock};
use std::time::Duration;

use vfscale_fdtable::{CloseRangeFlags, FdTable, Settings};

/// A file whose drop calls back into the table that held it, as a file object that
/// unregisters itself might: under `file_lock` it would deadlock on the table's own lock.
struct ReentrantFile;

static TABLE: OnceLock<FdTable<ReentrantFile>> = OnceLock::new();
static REENTRANT_DROPS: AtomicUsize = AtomicUsize::new(0);

impl Drop for ReentrantFile {
    fn drop(&mut self) {
        let _ = TABLE.get().expect("table set").stats();
        REENTRANT_DROPS.fetch_add(1, SeqCst);
    }
}

/// A file nobody else holds is dropped by `close` itself, after `file_lock` is released.
#[test]
fn file_drops_never_run_under_the_table_lock() {
    let _ = TABLE.set(FdTable::new(Settings::default()));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let t = TABLE.get().expect("table set");
        for i in 0..20_000 {
            let fd = t.open(Arc::new(ReentrantFile), false).unwrap();
            t.close(fd).unwrap();
            assert_eq!(REENTRANT_DROPS.load(SeqCst), i + 1, "close kept the file");
        }
        tx.send(()).unwrap();
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("deadlock after {} drops", REENTRANT_DROPS.load(SeqCst)));
    assert_eq!(REENTRANT_DROPS.load(SeqCst), 20_000);
}

static BORROWED_DROPPED: AtomicBool = AtomicBool::new(false);

struct Watched;

impl Drop for Watched {
    fn drop(&mut self) {
        BORROWED_DROPPED.store(true, SeqCst);
    }
}

#[test]
fn a_panicking_close_hook_does_not_free_a_borrowed_file() {
    let t: FdTable<Watched> = FdTable::new(Settings::default());
    let fd = t.open(Arc::new(Watched), false).unwrap();
    t.set_close_hook(|_, _| panic!("hook"));
    let (inside, closed) = (Barrier::new(2), Barrier::new(2));
    std::thread::scope(|s| {
        s.spawn(|| {
            t.with(fd, |_file| {
                inside.wait();
                closed.wait();
                assert!(!BORROWED_DROPPED.load(SeqCst), "file freed while `with` held it");
            })
        });
        inside.wait();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.close(fd)));
        assert!(r.is_err(), "the hook panicked");
        closed.wait();
    });
    // `with` held the last reference: the file went when its closure returned.
    assert!(
        BORROWED_DROPPED.load(SeqCst),
        "file kept after its last reference"
    );
}

/// A file that counts its drops on its own counter.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, SeqCst);
    }
}

/// A table of `n` counted files, whose close hook panics on the descriptors `panics`
/// picks; and their drop counter.
fn counted_table(n: usize, panics: fn(u32) -> bool) -> (FdTable<Counted>, Arc<AtomicUsize>) {
    let drops = Arc::new(AtomicUsize::new(0));
    let t: FdTable<Counted> = FdTable::new(Settings::default());
    for _ in 0..n {
        t.open(Arc::new(Counted(drops.clone())), false).unwrap();
    }
    t.set_close_hook(move |fd, _| {
        if panics(fd.0) {
            panic!("hook");
        }
    });
    (t, drops)
}

#[test]
fn a_panicking_close_hook_leaks_nothing_of_a_batch() {
    let (t, drops) = counted_table(10, |_| true);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        t.close_range(0, u32::MAX, CloseRangeFlags::default())
    }));
    assert!(r.is_err(), "the hook panicked");
    // The unwinding dropped the files the hook did not reach, and the first one.
    assert_eq!(drops.load(SeqCst), 10, "every closed file is dropped");
    drop(t);
    assert_eq!(drops.load(SeqCst), 10);
}

/// The table's drop runs the close hook on every descriptor; one that panics leaks no
/// file: every slot is emptied before the first hook runs.
#[test]
fn a_panicking_close_hook_in_the_table_drop_leaks_nothing() {
    let (t, drops) = counted_table(3, |fd| fd == 0);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(t)));
    assert!(r.is_err(), "the hook panicked");
    assert_eq!(drops.load(SeqCst), 3, "files leaked by the table's drop");
}
