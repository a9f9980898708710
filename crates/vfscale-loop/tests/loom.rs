//! Loom models of the rundown and auto-clear races: last close against `LOOP_CLR_FD`,
//! `LOOP_CTL_REMOVE` against open, and a detach against I/O (no write reaches the
//! backing file after the detach returns; nothing leaks).
//!
//! Run: `RUSTFLAGS="--cfg vfscale_loom" CARGO_TARGET_DIR=target/loom cargo test -p vfscale-loop --release --test loom`
#![cfg(vfscale_loom)]

mod common;

use std::os::fd::AsFd;

use loom::thread;
use vfscale_loop::{Errno, LoopControl, LoopFile, OpenMode, Settings};

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    b.check(move || {
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f()
    });
    eprintln!(
        "loom: {} interleavings explored so far",
        RUNS.load(std::sync::atomic::Ordering::Relaxed)
    );
}

fn ctl() -> LoopControl {
    LoopControl::new(Settings {
        initial_devices: 1,
        ..Settings::default()
    })
}

const RW: OpenMode = OpenMode {
    write: true,
    excl: false,
};

#[test]
fn last_close_races_clr_fd() {
    model(|| {
        let (file, path) = common::backing();
        let ctl = ctl();
        let h1 = ctl.open(0, RW).unwrap();
        let h2 = ctl.open(0, RW).unwrap();
        h1.set_fd(LoopFile::Fd(file.as_fd())).unwrap();
        let t = thread::spawn(move || drop(h2));
        // Whichever comes first, LOOP_CLR_FD succeeds (the device is bound) and the
        // device detaches at the last close.
        assert_eq!(h1.clr_fd(), Ok(()));
        t.join().unwrap();
        drop(h1);
        common::detached(&ctl, 0);
        std::fs::remove_file(path).unwrap();
    });
}

#[test]
fn remove_races_open() {
    model(|| {
        let ctl = ctl();
        let c2 = ctl.clone();
        let t = thread::spawn(move || c2.remove(0));
        let opened = ctl.open(0, RW);
        let removed = t.join().unwrap();
        match (&opened, &removed) {
            (Ok(_), Err(e)) => assert_eq!(*e, Errno::EBUSY),
            (Err(e), Ok(())) => assert!(*e == Errno::ENOENT || *e == Errno::ENXIO, "{e:?}"),
            other => panic!("open and remove both {other:?}"),
        }
        if let Ok(h) = opened {
            drop(h);
            assert_eq!(ctl.remove(0), Ok(()));
        }
        assert!(ctl.lookup(0).is_none());
    });
}

#[test]
fn detach_races_io() {
    model(|| {
        let (file, path) = common::backing();
        let ctl = ctl();
        let h1 = ctl.open(0, RW).unwrap();
        h1.set_fd(LoopFile::Fd(file.as_fd())).unwrap();
        let h2 = h1.clone();
        let t = thread::spawn(move || {
            let r = h2.write_at(&[9u8; 512], 0);
            drop(h2);
            r
        });
        // LOOP_CLR_FD with one open file description: rundown now, detach at its close.
        h1.clr_fd().unwrap();
        drop(h1);
        let wrote = t.join().unwrap();
        common::detached(&ctl, 0);
        let after_detach = std::fs::read(&path).unwrap();
        // A write either landed before the detach or failed: the file is what it was
        // when the detach returned, and the write's answer says which.
        match wrote {
            Ok(512) => assert_eq!(&after_detach[..512], &[9u8; 512][..]),
            Err(Errno::EIO) | Err(Errno::ENOSPC) => assert_eq!(after_detach, vec![7u8; common::SIZE]),
            other => panic!("write gave {other:?}"),
        }
        std::fs::remove_file(path).unwrap();
    });
}
