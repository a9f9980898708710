//! Shuttle: many threads allocating, closing and duplicating in one table.
//! Invariants: a descriptor is never handed out twice; every installed file stays
//! reachable until closed.
//! Run: `RUSTFLAGS="--cfg vfscale_shuttle" CARGO_TARGET_DIR=target/shuttle cargo test -p vfscale-fdtable --release --test shuttle`
#![cfg(vfscale_shuttle)]

use std::collections::HashSet;
use std::sync::Arc;

use shuttle::sync::Mutex;
use shuttle::thread;
use vfscale_fdtable::{AllocPolicy, Fd, FdTable, InstallMode, Settings};

fn scenario(settings: Settings) {
    let t: Arc<FdTable<(usize, usize)>> = Arc::new(FdTable::with_limits(settings, 64, 64));
    let live: Arc<Mutex<HashSet<Fd>>> = Arc::new(Mutex::new(HashSet::new()));
    let hs: Vec<_> = (0..4)
        .map(|th| {
            let (t, live) = (t.clone(), live.clone());
            thread::spawn(move || {
                let mut mine: Vec<(Fd, (usize, usize))> = Vec::new();
                for i in 0..6 {
                    let me = (th, i);
                    match i % 3 {
                        0 | 1 => {
                            let fd = t.reserve(Fd(0), false).unwrap();
                            assert!(live.lock().unwrap().insert(fd), "{fd} handed out twice");
                            t.install(fd, Arc::new(me));
                            mine.push((fd, me));
                        }
                        _ => {
                            let (src, f) = mine[0];
                            let fd = t.dup(src).unwrap();
                            assert!(live.lock().unwrap().insert(fd), "{fd} handed out twice");
                            mine.push((fd, f));
                        }
                    }
                    for &(fd, f) in &mine {
                        assert_eq!(t.get(fd).map(|x| *x), Some(f), "installed file unreachable");
                    }
                    if mine.len() > 2 {
                        let (fd, _) = mine.remove(1);
                        live.lock().unwrap().remove(&fd);
                        t.close(fd).unwrap();
                    }
                }
                for (fd, _) in mine {
                    live.lock().unwrap().remove(&fd);
                    t.close(fd).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert!(t.iter().is_empty());
}

#[test]
fn alloc_close_dup_lowest() {
    shuttle::check_random(|| scenario(Settings::default()), 300);
}

#[test]
fn alloc_close_dup_under_lock() {
    shuttle::check_random(
        || {
            scenario(Settings {
                install: InstallMode::UnderLock,
                policy: AllocPolicy::Lowest,
            })
        },
        200,
    );
}

#[test]
fn alloc_close_dup_per_thread() {
    shuttle::check_random(
        || {
            scenario(Settings {
                install: InstallMode::Lockless,
                policy: AllocPolicy::PerThread,
            })
        },
        200,
    );
}
