//! Loom models: install racing a resize; lookup racing close and resize (the lookup's
//! increment-if-not-zero against the close's drop of the last reference).
//! Run: `RUSTFLAGS="--cfg vfscale_loom" CARGO_TARGET_DIR=target/loom cargo test -p vfscale-fdtable --release --test loom`
//! (tables start at 2 slots under loom, so reserving fd 2 forces a resize).
#![cfg(vfscale_loom)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use loom::thread;
use vfscale_fdtable::{Fd, FdTable, InstallMode, Settings};

struct File {
    id: u32,
    alive: AtomicBool,
    drops: Arc<AtomicUsize>,
}

impl Drop for File {
    fn drop(&mut self) {
        assert!(self.alive.swap(false, Ordering::SeqCst), "double drop");
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

fn file(id: u32, drops: &Arc<AtomicUsize>) -> Arc<File> {
    Arc::new(File {
        id,
        alive: AtomicBool::new(true),
        drops: drops.clone(),
    })
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

#[test]
fn install_races_resize() {
    model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let t: Arc<FdTable<File>> = Arc::new(FdTable::new(Settings::default()));
        let a = t.reserve(Fd(0), false).unwrap();
        let b = t.reserve(Fd(0), false).unwrap();
        assert_eq!((a, b), (Fd(0), Fd(1)));
        let t1 = t.clone();
        let f1 = file(1, &drops);
        let h = thread::spawn(move || t1.install(b, f1));
        // resize 2 -> 4 slots while the install runs
        assert_eq!(t.reserve(Fd(2), false), Ok(Fd(2)));
        h.join().unwrap();
        assert_eq!(t.get(b).map(|f| f.id), Some(1), "lost install");
        assert!(t.get(a).is_none());
        assert_eq!(t.stats().resizes, 1);
        drop(t);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn install_races_resize_under_lock() {
    model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let t: Arc<FdTable<File>> = Arc::new(FdTable::new(Settings {
            install: InstallMode::UnderLock,
            ..Settings::default()
        }));
        let b = t.reserve(Fd(1), false).unwrap();
        let t1 = t.clone();
        let f1 = file(1, &drops);
        let h = thread::spawn(move || t1.install(b, f1));
        assert_eq!(t.reserve(Fd(2), false), Ok(Fd(2)));
        h.join().unwrap();
        assert_eq!(t.get(b).map(|f| f.id), Some(1));
        drop(t);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn lookup_races_close_and_resize() {
    model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let t: Arc<FdTable<File>> = Arc::new(FdTable::new(Settings::default()));
        let fd = t.open(file(7, &drops), false).unwrap();
        let t1 = t.clone();
        let reader = thread::spawn(move || {
            if let Some(f) = t1.get(fd) {
                assert!(f.alive.load(Ordering::SeqCst), "use after free");
                assert_eq!(f.id, 7);
            }
            t1.with(fd, |f| assert!(f.alive.load(Ordering::SeqCst), "use after free"));
        });
        let t2 = t.clone();
        let closer = thread::spawn(move || {
            t2.close(fd).unwrap();
        });
        // resize concurrently with both
        assert_eq!(t.reserve(Fd(2), false), Ok(Fd(2)));
        reader.join().unwrap();
        closer.join().unwrap();
        assert!(t.get(fd).is_none());
        // Dropped by the close or by the reader's last reference, with the table alive.
        assert_eq!(drops.load(Ordering::SeqCst), 1, "closed file kept");
        drop(t);
        assert_eq!(drops.load(Ordering::SeqCst), 1, "dropped exactly once");
    });
}

/// A file whose contents loom tracks: written by the thread that creates it, read by
/// lookups in other threads. A read not ordered after the write by the install's
/// Release and the lookup's Acquire is a causality violation loom reports.
struct Published {
    value: loom::cell::UnsafeCell<u32>,
}

// SAFETY: `value` is written once, by the creating thread before the file is installed,
// and only read afterwards; loom checks that every read happens after that write.
unsafe impl Sync for Published {}

impl Published {
    fn read(&self) -> u32 {
        // SAFETY: shared reads only; loom checks them against the one write.
        self.value.with(|v| unsafe { *v })
    }
}

#[test]
fn install_publishes_the_file_to_lookups() {
    model(|| {
        let t: Arc<FdTable<Published>> = Arc::new(FdTable::new(Settings::default()));
        let fd = t.reserve(Fd(0), false).unwrap();
        let t1 = t.clone();
        let installer = thread::spawn(move || {
            let f = Published {
                value: loom::cell::UnsafeCell::new(0),
            };
            // SAFETY: not shared yet.
            f.value.with_mut(|v| unsafe { *v = 42 });
            t1.install(fd, Arc::new(f));
        });
        // A lookup racing the install sees nothing or the whole file.
        if let Some(f) = t.get(fd) {
            assert_eq!(f.read(), 42);
        }
        if let Some(v) = t.with(fd, |f| f.read()) {
            assert_eq!(v, 42);
        }
        installer.join().unwrap();
        assert_eq!(t.with(fd, |f| f.read()), Some(42));
    });
}

#[test]
fn dup2_replacing_a_file_races_lookups() {
    model(|| {
        let t: Arc<FdTable<Published>> = Arc::new(FdTable::new(Settings::default()));
        let new = |v: u32| {
            let f = Published {
                value: loom::cell::UnsafeCell::new(0),
            };
            // SAFETY: not shared yet.
            f.value.with_mut(|p| unsafe { *p = v });
            Arc::new(f)
        };
        let a = t.open(new(1), false).unwrap();
        let t1 = t.clone();
        let replacer = thread::spawn(move || {
            let b = t1.open(new(2), false).unwrap();
            // dup2 onto an open descriptor replaces its file atomically.
            assert_eq!(t1.dup2(b, a), Ok(a));
        });
        // `a` is open throughout (dup2 replaces atomically): the lookup finds a file.
        let v = t.with(a, |f| f.read());
        assert!(v == Some(1) || v == Some(2), "saw {v:?}");
        replacer.join().unwrap();
        assert_eq!(t.with(a, |f| f.read()), Some(2));
    });
}
