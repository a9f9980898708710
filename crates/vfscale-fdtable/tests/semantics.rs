//! The Linux rules, one by one.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use vfscale_fdtable::{AllocPolicy, CloseRangeFlags, Errno, Fd, FdTable, InstallMode, Settings};

fn table() -> FdTable<u32> {
    FdTable::new(Settings::default())
}

fn open_n(t: &FdTable<u32>, n: u32) {
    for i in 0..n {
        assert_eq!(t.open(Arc::new(i), false), Ok(Fd(i)));
    }
}

fn val(t: &FdTable<u32>, fd: u32) -> Option<u32> {
    t.get(Fd(fd)).map(|f| *f)
}

#[test]
fn lowest_fd_order_and_reuse() {
    let t = table();
    open_n(&t, 5);
    t.close(Fd(1)).unwrap();
    t.close(Fd(3)).unwrap();
    assert_eq!(t.open(Arc::new(10), false), Ok(Fd(1)));
    assert_eq!(t.open(Arc::new(11), false), Ok(Fd(3)));
    assert_eq!(t.open(Arc::new(12), false), Ok(Fd(5)));
    assert_eq!(t.reserve(Fd(2), false), Ok(Fd(6)));
    assert_eq!(t.reserve(Fd(100), false), Ok(Fd(100)));
    assert_eq!(t.reserve(Fd(0), false), Ok(Fd(7)));
}

#[test]
fn errno_names() {
    assert_eq!(Errno::EBADF.name(), "EBADF");
    assert_eq!(Errno::EBUSY.raw(), libc::EBUSY);
    assert_eq!(Errno::from_raw(libc::EMFILE), Errno::EMFILE);
    assert_eq!(Fd(3).to_string(), "3");
}

#[test]
fn close_ebadf() {
    let t = table();
    assert_eq!(t.close(Fd(0)), Err(Errno::EBADF));
    assert_eq!(t.close(Fd(5000)), Err(Errno::EBADF));
    let r = t.reserve(Fd(0), false).unwrap();
    assert_eq!(t.close(r), Err(Errno::EBADF), "reserved, not installed");
    t.install(r, Arc::new(1));
    assert_eq!(t.close(r), Ok(()));
    assert_eq!(t.close(r), Err(Errno::EBADF));
}

#[test]
fn unreserve_frees() {
    let t = table();
    let r = t.reserve(Fd(0), false).unwrap();
    assert_eq!(t.open(Arc::new(1), false), Ok(Fd(1)));
    t.unreserve(r);
    assert_eq!(t.open(Arc::new(2), false), Ok(Fd(0)));
}

#[test]
fn emfile_below_rlimit() {
    let t: FdTable<u32> = FdTable::with_limits(Settings::default(), 3, 1 << 20);
    open_n(&t, 3);
    assert_eq!(t.open(Arc::new(9), false), Err(Errno::EMFILE));
    assert_eq!(t.reserve(Fd(2), false), Err(Errno::EMFILE));
    assert_eq!(t.dup(Fd(0)), Err(Errno::EMFILE));
    t.close(Fd(1)).unwrap();
    assert_eq!(t.dup(Fd(0)), Ok(Fd(1)));
}

#[test]
fn emfile_at_nr_open() {
    let t: FdTable<u32> = FdTable::with_limits(Settings::default(), 200, 200);
    assert_eq!(t.reserve(Fd(199), false), Ok(Fd(199)));
    assert_eq!(t.reserve(Fd(199), false), Err(Errno::EMFILE));
    assert_eq!(t.set_rlimit_nofile(201), Err(Errno::EPERM));
    assert_eq!(t.set_rlimit_nofile(200), Ok(()));
}

#[test]
fn lowering_rlimit_keeps_fds() {
    let t = table();
    open_n(&t, 10);
    t.set_rlimit_nofile(4).unwrap();
    assert_eq!(t.rlimit_nofile(), 4);
    assert_eq!(val(&t, 9), Some(9));
    assert_eq!(t.get_cloexec(Fd(9)), Ok(false));
    assert_eq!(t.open(Arc::new(1), false), Err(Errno::EMFILE));
    assert_eq!(t.dup2(Fd(0), Fd(4)), Err(Errno::EBADF));
    assert_eq!(t.dup2(Fd(0), Fd(3)), Ok(Fd(3)));
    assert_eq!(t.dupfd(Fd(0), 4, false), Err(Errno::EINVAL));
    assert_eq!(t.close(Fd(9)), Ok(()));
}

#[test]
fn dup_and_dupfd() {
    let t = table();
    open_n(&t, 3);
    assert_eq!(t.dup(Fd(1)), Ok(Fd(3)));
    assert_eq!(val(&t, 3), Some(1));
    assert_eq!(t.get_cloexec(Fd(3)), Ok(false));
    assert_eq!(t.dup(Fd(50)), Err(Errno::EBADF));
    assert_eq!(t.dupfd(Fd(0), 10, true), Ok(Fd(10)));
    assert_eq!(t.get_cloexec(Fd(10)), Ok(true));
    assert_eq!(t.dupfd(Fd(0), 10, false), Ok(Fd(11)));
    assert_eq!(t.dupfd(Fd(0), 1024, false), Err(Errno::EINVAL));
    assert_eq!(t.dupfd(Fd(0), 1023, false), Ok(Fd(1023)));
    assert_eq!(t.dupfd(Fd(0), 1023, false), Err(Errno::EMFILE));
    assert_eq!(
        t.dupfd(Fd(77), 2000, false),
        Err(Errno::EBADF),
        "EBADF before EINVAL"
    );
}

#[test]
fn dup2_rules() {
    let t = table();
    open_n(&t, 3);
    assert_eq!(t.dup2(Fd(1), Fd(1)), Ok(Fd(1)));
    assert_eq!(t.dup2(Fd(9), Fd(9)), Err(Errno::EBADF));
    assert_eq!(t.dup2(Fd(9), Fd(1)), Err(Errno::EBADF));
    assert_eq!(val(&t, 1), Some(1), "failed dup2 leaves newfd alone");
    // onto an open fd: replaced atomically, the old file closed (hook runs).
    let closed = Arc::new(Mutex::new(Vec::new()));
    let c2 = closed.clone();
    t.set_close_hook(move |fd, f| c2.lock().unwrap().push((fd, **f)));
    t.set_cloexec(Fd(2), true).unwrap();
    assert_eq!(t.dup2(Fd(0), Fd(2)), Ok(Fd(2)));
    assert_eq!(val(&t, 2), Some(0));
    assert_eq!(t.get_cloexec(Fd(2)), Ok(false), "dup2 clears close-on-exec");
    assert_eq!(*closed.lock().unwrap(), vec![(Fd(2), 2)]);
    // far beyond the table: grows it
    assert_eq!(t.dup2(Fd(0), Fd(1000)), Ok(Fd(1000)));
    assert!(t.stats().max_fds >= 1024);
    assert_eq!(t.dup2(Fd(0), Fd(1024)), Err(Errno::EBADF), "newfd >= rlimit");
    assert_eq!(t.dup2(Fd(0), Fd(u32::MAX)), Err(Errno::EBADF));
    // onto a reserved slot
    let r = t.reserve(Fd(0), false).unwrap();
    assert_eq!(t.dup2(Fd(0), r), Err(Errno::EBUSY));
    assert_eq!(t.dup3(Fd(0), r, true), Err(Errno::EBUSY));
    t.install(r, Arc::new(7));
    assert_eq!(val(&t, r.0), Some(7));
}

#[test]
fn dup3_rules() {
    let t = table();
    open_n(&t, 2);
    assert_eq!(t.dup3(Fd(1), Fd(1), false), Err(Errno::EINVAL));
    assert_eq!(t.dup3(Fd(5), Fd(5), false), Err(Errno::EINVAL));
    assert_eq!(t.dup3(Fd(0), Fd(5), true), Ok(Fd(5)));
    assert_eq!(t.get_cloexec(Fd(5)), Ok(true));
    assert_eq!(t.dup3(Fd(1), Fd(5), false), Ok(Fd(5)));
    assert_eq!(t.get_cloexec(Fd(5)), Ok(false));
    assert_eq!(val(&t, 5), Some(1));
    assert_eq!(t.dup3(Fd(0), Fd(2000), false), Err(Errno::EBADF));
}

#[test]
fn cloexec_get_set() {
    let t = table();
    assert_eq!(t.get_cloexec(Fd(0)), Err(Errno::EBADF));
    assert_eq!(t.set_cloexec(Fd(0), true), Err(Errno::EBADF));
    t.open(Arc::new(0), true).unwrap();
    assert_eq!(t.get_cloexec(Fd(0)), Ok(true));
    t.set_cloexec(Fd(0), false).unwrap();
    assert_eq!(t.get_cloexec(Fd(0)), Ok(false));
}

#[test]
fn close_range_variants() {
    let t = table();
    open_n(&t, 10);
    assert_eq!(
        t.close_range(5, 4, CloseRangeFlags::default()).err(),
        Some(Errno::EINVAL)
    );
    assert!(t.close_range(2, 4, CloseRangeFlags::default()).unwrap().is_none());
    let fds: Vec<u32> = t.iter().iter().map(|(fd, _, _)| fd.0).collect();
    assert_eq!(fds, vec![0, 1, 5, 6, 7, 8, 9]);
    // cloexec only marks
    t.close_range(
        6,
        u32::MAX,
        CloseRangeFlags {
            cloexec: true,
            unshare: false,
        },
    )
    .unwrap();
    assert_eq!(t.iter().len(), 7);
    assert_eq!(t.get_cloexec(Fd(6)), Ok(true));
    assert_eq!(t.get_cloexec(Fd(5)), Ok(false));
    // a reserved slot in the range survives
    let r = t.reserve(Fd(0), false).unwrap();
    assert_eq!(r, Fd(2));
    t.close_range(0, u32::MAX, CloseRangeFlags::default()).unwrap();
    assert!(t.iter().is_empty());
    assert_eq!(t.open(Arc::new(1), false), Ok(Fd(0)));
    t.install(r, Arc::new(2));
    assert_eq!(val(&t, 2), Some(2));
    assert!(t
        .close_range(u32::MAX, u32::MAX, CloseRangeFlags::default())
        .unwrap()
        .is_none());
}

#[test]
fn close_range_unshare_returns_private_copy() {
    let t = table();
    open_n(&t, 6);
    let hooks = Arc::new(AtomicUsize::new(0));
    let h = hooks.clone();
    t.set_close_hook(move |_, _| {
        h.fetch_add(1, Ordering::Relaxed);
    });
    let flags = CloseRangeFlags {
        cloexec: false,
        unshare: true,
    };
    let copy = t
        .close_range(3, u32::MAX, flags)
        .unwrap()
        .expect("a private copy");
    assert_eq!(t.iter().len(), 6, "the shared table is untouched");
    let fds: Vec<u32> = copy.iter().iter().map(|(fd, _, _)| fd.0).collect();
    assert_eq!(fds, vec![0, 1, 2]);
    assert_eq!(
        hooks.load(Ordering::Relaxed),
        0,
        "to the end: not copied, not closed"
    );
    let copy2 = t.close_range(1, 2, flags).unwrap().unwrap();
    assert_eq!(copy2.iter().len(), 4);
    assert_eq!(hooks.load(Ordering::Relaxed), 2, "inside: copied then closed");
    let copy3 = t
        .close_range(
            0,
            u32::MAX,
            CloseRangeFlags {
                cloexec: true,
                unshare: true,
            },
        )
        .unwrap()
        .unwrap();
    assert!(copy3.iter().iter().all(|(_, _, c)| *c));
    assert_eq!(t.get_cloexec(Fd(0)), Ok(false));
}

#[test]
fn exec_closes_cloexec() {
    let t = table();
    t.open(Arc::new(0), false).unwrap();
    t.open(Arc::new(1), true).unwrap();
    t.dupfd(Fd(0), 200, true).unwrap();
    let r = t.reserve(Fd(0), true).unwrap();
    t.exec();
    let fds: Vec<u32> = t.iter().iter().map(|(fd, _, _)| fd.0).collect();
    assert_eq!(fds, vec![0]);
    t.install(r, Arc::new(5));
    assert_eq!(
        t.get_cloexec(r),
        Ok(false),
        "exec cleared the reserved slot's bit, as Linux"
    );
}

#[test]
fn fork_skips_reserved_and_copies_flags() {
    let t = table();
    t.open(Arc::new(0), false).unwrap();
    t.open(Arc::new(1), true).unwrap();
    let r = t.reserve(Fd(0), false).unwrap();
    t.dup2(Fd(0), Fd(300)).unwrap();
    let c = t.fork();
    t.install(r, Arc::new(2));
    assert_eq!(val(&c, 2), None);
    assert_eq!(
        c.open(Arc::new(9), false),
        Ok(Fd(2)),
        "reserved slot free in the child"
    );
    assert_eq!(c.get_cloexec(Fd(1)), Ok(true));
    assert_eq!(val(&c, 300), Some(0));
    c.close(Fd(0)).unwrap();
    assert_eq!(val(&t, 0), Some(0), "parent unaffected");
    assert_eq!(c.rlimit_nofile(), t.rlimit_nofile());
}

#[test]
fn growth_is_power_of_two() {
    let t = table();
    assert_eq!(t.stats().max_fds, 64);
    open_n(&t, 65);
    assert_eq!(t.stats().max_fds, 128);
    assert_eq!(t.stats().resizes, 1);
    t.dup2(Fd(0), Fd(300)).unwrap();
    assert_eq!(t.stats().max_fds, 512);
    for i in 0..65 {
        assert_eq!(val(&t, i), Some(i));
    }
}

/// Each file is dropped once, at its last reference, whatever closes it (close, dup2
/// replacing it, close_range, exec, the table's drop), never a grace period later.
#[test]
fn files_dropped_once_at_their_last_reference() {
    struct D(Arc<AtomicUsize>);
    impl Drop for D {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let drops = Arc::new(AtomicUsize::new(0));
    let n = || drops.load(Ordering::SeqCst);
    let file = || Arc::new(D(drops.clone()));
    let t: FdTable<D> = FdTable::new(Settings::default());
    for _ in 0..100 {
        t.open(file(), false).unwrap();
    }
    // dup2 onto fd 5 closes its file at once.
    t.dup2(Fd(3), Fd(5)).unwrap();
    assert_eq!(n(), 1);
    // fd 3's file is at 3 and 5 now: closing one keeps it.
    t.close(Fd(3)).unwrap();
    assert_eq!(n(), 1);
    t.close(Fd(5)).unwrap();
    assert_eq!(n(), 2);
    // A reference from `get` outlives the close; the file goes with it.
    let held = t.get(Fd(6)).unwrap();
    t.close(Fd(6)).unwrap();
    assert_eq!(n(), 2);
    drop(held);
    assert_eq!(n(), 3);
    for i in 50..60 {
        t.close(Fd(i)).unwrap();
    }
    assert_eq!(n(), 13);
    t.close_range(60, 69, CloseRangeFlags::default()).unwrap();
    assert_eq!(n(), 23);
    // A fork shares the files: exec in the child closes nothing the parent holds.
    t.set_cloexec(Fd(70), true).unwrap();
    let c = t.fork();
    c.exec();
    assert_eq!(n(), 23);
    drop(c);
    assert_eq!(n(), 23);
    t.exec();
    assert_eq!(n(), 24);
    drop(t);
    assert_eq!(n(), 100);
}

#[test]
fn with_borrows() {
    let t = table();
    t.open(Arc::new(42), false).unwrap();
    assert_eq!(t.with(Fd(0), |v| *v + 1), Some(43));
    assert_eq!(t.with(Fd(1), |v| *v), None);
}

#[test]
fn under_lock_mode_same_semantics() {
    let t: FdTable<u32> = FdTable::new(Settings {
        install: InstallMode::UnderLock,
        policy: AllocPolicy::Lowest,
    });
    open_n(&t, 100);
    assert_eq!(t.stats().install_fallbacks, 0);
    assert_eq!(val(&t, 99), Some(99));
}

#[test]
fn per_thread_policy() {
    let t: FdTable<u32> = FdTable::new(Settings {
        install: InstallMode::Lockless,
        policy: AllocPolicy::PerThread,
    });
    let a = t.open(Arc::new(1), false).unwrap();
    let b = t.open(Arc::new(2), true).unwrap();
    assert_eq!((a, b), (Fd(0), Fd(1)));
    assert_eq!(t.get_cloexec(b), Ok(true));
    let other = std::thread::scope(|s| s.spawn(|| t.open(Arc::new(3), false).unwrap()).join().unwrap());
    assert_eq!(other, Fd(64), "another thread gets its own chunk");
    let before = t.stats().lock_acquisitions;
    for i in 0..50 {
        t.open(Arc::new(i), false).unwrap();
    }
    assert_eq!(t.stats().lock_acquisitions, before, "steady state: no lock");
    t.close(Fd(1)).unwrap();
    assert_eq!(t.dup2(Fd(0), Fd(65)), Ok(Fd(65)));
    let r = t.reserve(Fd(0), false).unwrap();
    assert_eq!(r, Fd(1));
    assert_eq!(t.dup2(Fd(0), r), Err(Errno::EBUSY));
    t.install(r, Arc::new(9));
    t.exec();
    assert_eq!(
        t.dupfd(Fd(0), 3, false),
        Ok(Fd(128)),
        "min > 0 uses the shared lowest path"
    );
    let c = t.fork();
    assert_eq!(c.iter().len(), t.iter().len());
    // rlimit respected inside a chunk
    let t2: FdTable<u32> = FdTable::with_limits(
        Settings {
            policy: AllocPolicy::PerThread,
            ..Settings::default()
        },
        3,
        64,
    );
    for i in 0..3 {
        assert_eq!(t2.open(Arc::new(i), false), Ok(Fd(i)));
    }
    assert_eq!(t2.open(Arc::new(9), false), Err(Errno::EMFILE));
    // one word below the limit, owned by this thread: another thread still gets a free fd
    let t3: FdTable<u32> = FdTable::with_limits(
        Settings {
            policy: AllocPolicy::PerThread,
            ..Settings::default()
        },
        64,
        64,
    );
    assert_eq!(t3.open(Arc::new(0), false), Ok(Fd(0)));
    let other = std::thread::scope(|s| s.spawn(|| t3.open(Arc::new(1), false)).join().unwrap());
    assert_eq!(other, Ok(Fd(1)));
}
