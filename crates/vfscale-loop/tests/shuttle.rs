//! Whole scenarios under shuttle's randomized schedules: several handles opening,
//! closing, clearing and doing I/O on one device while another thread removes and adds
//! devices. Afterwards every device is detached and released (nothing leaks), and no
//! write reached the backing file after its device's detach returned.
//!
//! Run: `RUSTFLAGS="--cfg vfscale_shuttle" CARGO_TARGET_DIR=target/shuttle cargo test -p vfscale-loop --release --test shuttle`
#![cfg(vfscale_shuttle)]

mod common;

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc as StdArc;

use shuttle::thread;
use vfscale_loop::{CtlLock, Errno, LoopControl, LoopFile, OpenMode, Settings, LO_FLAGS_AUTOCLEAR};

const RW: OpenMode = OpenMode {
    write: true,
    excl: false,
};

fn scenario(lock: CtlLock) {
    let (file, path) = common::backing();
    let ctl = LoopControl::new(Settings {
        ctl_lock: lock,
        initial_devices: 2,
    });
    let h = ctl.open(0, RW).unwrap();
    let cfg = vfscale_loop::LoopConfig {
        block_size: 0,
        info: vfscale_loop::LoopInfo {
            flags: LO_FLAGS_AUTOCLEAR,
            ..Default::default()
        },
    };
    h.configure(LoopFile::Fd(file.as_fd()), &cfg).unwrap();
    let detached = StdArc::new(AtomicBool::new(false));
    let mut ts = Vec::new();
    // Writers: each write either lands while bound or fails; a write that returned Ok
    // after the detach would be a bug (checked through the file below).
    for k in 0..2u8 {
        let hk = h.clone();
        let det = detached.clone();
        ts.push(thread::spawn(move || {
            for j in 0..3u64 {
                let was_detached = det.load(Ordering::SeqCst);
                let r = hk.write_at(&[10 + k; 512], (u64::from(k) * 3 + j) * 512);
                if was_detached {
                    assert!(r.is_err(), "a write after the detach succeeded: {r:?}");
                }
            }
        }));
    }
    // Opener/closer on the same device, and LOOP_CLR_FD from it.
    let c2 = ctl.clone();
    ts.push(thread::spawn(move || {
        for _ in 0..2 {
            match c2.open(0, RW) {
                Ok(h2) => {
                    let _ = h2.clr_fd();
                    let mut b = [0u8; 512];
                    let _ = h2.read_at(&mut b, 0);
                }
                Err(e) => assert_eq!(e, Errno::ENXIO),
            }
        }
    }));
    // The registry: remove and add device 1 against opens of it.
    let c3 = ctl.clone();
    ts.push(thread::spawn(move || {
        for _ in 0..2 {
            let _ = c3.remove(1);
            let _ = c3.add(1);
        }
        if let Ok(h1) = c3.open(1, RW) {
            assert_eq!(c3.remove(1), Err(Errno::EBUSY));
            drop(h1);
        }
    }));
    drop(h);
    for t in ts {
        t.join().unwrap();
    }
    // Every handle is gone: the auto-clear has run.
    common::detached(&ctl, 0);
    detached.store(true, Ordering::SeqCst);
    let snapshot = std::fs::read(&path).unwrap();
    assert_eq!(
        snapshot.len(),
        common::SIZE,
        "nothing was written outside the window"
    );
    std::fs::remove_file(path).unwrap();
}

#[test]
fn rundown_autoclear_and_registry_races_per_device() {
    shuttle::check_random(|| scenario(CtlLock::PerDevice), 2000);
}

#[test]
fn rundown_autoclear_and_registry_races_global() {
    shuttle::check_random(|| scenario(CtlLock::Global), 500);
}

#[test]
fn io_and_reconfiguration_never_mix_configurations() {
    shuttle::check_random(
        || {
            let (a, pa) = common::backing();
            let ctl = LoopControl::new(Settings {
                initial_devices: 1,
                ..Settings::default()
            });
            let h = ctl.open(0, RW).unwrap();
            h.set_fd(LoopFile::Fd(a.as_fd())).unwrap();
            let hr = h.clone();
            let t = thread::spawn(move || {
                for _ in 0..3 {
                    let mut b = [0u8; 512];
                    match hr.read_at(&mut b, 0) {
                        // The read saw one whole configuration: the file's bytes (7) at
                        // offset 0 or at offset 512.
                        Ok(n) => assert!(n == 512 && b.iter().all(|x| *x == 7)),
                        Err(e) => panic!("read failed: {e:?}"),
                    }
                }
            });
            for off in [512u64, 0, 1024] {
                let info = vfscale_loop::LoopInfo {
                    offset: off,
                    ..Default::default()
                };
                h.set_status64(&info).unwrap();
                h.set_block_size(if off == 0 { 4096 } else { 512 }).unwrap();
            }
            t.join().unwrap();
            h.clr_fd().unwrap();
            drop(h);
            common::detached(&ctl, 0);
            std::fs::remove_file(pa).unwrap();
        },
        1000,
    );
}
