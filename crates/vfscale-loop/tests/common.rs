//! Helpers shared by the loom and shuttle models: a backing file on tmpfs, and checks
//! that a device has detached and nothing is left behind.

#![allow(dead_code)]

use std::fs::File;
use std::path::PathBuf;

use vfscale_loop::{LoopControl, LoopState};

pub const SIZE: usize = 16384;

/// A fresh backing file of `SIZE` bytes of value 7, and its path.
pub fn backing() -> (File, PathBuf) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let p = dir.join(format!(
        "vfscale-loop-model-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&p, vec![7u8; SIZE]).unwrap();
    let f = File::options().read(true).write(true).open(&p).unwrap();
    (f, p)
}

/// The device is unbound, unopened, and holds no backing.
pub fn detached(ctl: &LoopControl, i: u32) {
    let d = ctl.lookup(i).expect("device exists");
    assert_eq!(d.state(), LoopState::Unbound);
    assert_eq!(d.openers(), 0);
    assert_eq!(d.live_handles(), 0);
    assert_eq!(d.backing_path(), None);
    assert_eq!(d.size(), 0);
}
