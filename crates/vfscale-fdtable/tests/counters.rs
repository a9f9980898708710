//! The lab's counters: table-lock acquisitions per reserve+install and per lookup.

use std::sync::Arc;

use vfscale_fdtable::{AllocPolicy, Fd, FdTable, InstallMode, Settings};

fn per_alloc_install(install: InstallMode) -> (u64, u64) {
    let t: FdTable<u32> = FdTable::new(Settings {
        install,
        policy: AllocPolicy::Lowest,
    });
    // stay inside the first table: no resize
    let s0 = t.stats().lock_acquisitions;
    for i in 0..50 {
        let fd = t.reserve(Fd(0), false).unwrap();
        t.install(fd, Arc::new(i));
    }
    let s1 = t.stats().lock_acquisitions;
    for i in 0..50 {
        assert_eq!(t.get(Fd(i)).map(|f| *f), Some(i));
        assert_eq!(t.with(Fd(i), |f| *f), Some(i));
    }
    let s2 = t.stats().lock_acquisitions;
    assert_eq!(t.stats().resizes, 0);
    ((s1 - s0) / 50, s2 - s1)
}

#[test]
fn lock_acquisitions_lockless() {
    assert_eq!(per_alloc_install(InstallMode::Lockless), (1, 0));
}

#[test]
fn lock_acquisitions_under_lock() {
    assert_eq!(per_alloc_install(InstallMode::UnderLock), (2, 0));
}

#[test]
fn open_counts_like_reserve_install() {
    let t: FdTable<u32> = FdTable::new(Settings::default());
    let s0 = t.stats().lock_acquisitions;
    t.open(Arc::new(1), false).unwrap();
    assert_eq!(t.stats().lock_acquisitions - s0, 1);
}
