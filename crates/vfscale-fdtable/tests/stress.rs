//! Threads allocating, installing, looking up and closing on one table while it is
//! forced to grow. Files count their drops: each must be dropped exactly once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfscale_fdtable::{AllocPolicy, Fd, FdTable, InstallMode, Settings};

struct File {
    id: usize,
    alive: AtomicBool,
    drops: Arc<AtomicUsize>,
}

impl Drop for File {
    fn drop(&mut self) {
        assert!(
            self.alive.swap(false, Ordering::SeqCst),
            "file {} dropped twice",
            self.id
        );
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

/// The drop-counting tests run one at a time (each uses every CPU).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn stress(settings: Settings) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const THREADS: usize = 8;
    const OPS: usize = 20_000;
    let drops = Arc::new(AtomicUsize::new(0));
    let made = AtomicUsize::new(0);
    let deadline = Instant::now() + Duration::from_secs(3);
    {
        let t: FdTable<File> = FdTable::with_limits(settings, 1 << 16, 1 << 16);
        std::thread::scope(|s| {
            let mut workers = Vec::new();
            for th in 0..THREADS {
                let (t, drops, made) = (&t, &drops, &made);
                workers.push(s.spawn(move || {
                    let mut mine: Vec<(Fd, usize)> = Vec::new();
                    for i in 0..OPS {
                        if Instant::now() > deadline {
                            break;
                        }
                        let id = made.fetch_add(1, Ordering::Relaxed);
                        let f = Arc::new(File {
                            id,
                            alive: AtomicBool::new(true),
                            drops: drops.clone(),
                        });
                        // forced resizes: reserve far up now and then
                        let start = if i % 97 == 0 {
                            Fd(((th * OPS + i) % 60000) as u32)
                        } else {
                            Fd(0)
                        };
                        let fd = t.reserve(start, false).unwrap();
                        t.install(fd, f);
                        mine.push((fd, id));
                        // our installs are never lost, and lookups see live files
                        for &(fd, id) in mine.iter().rev().take(4) {
                            let got = t.get(fd).expect("lost install");
                            assert!(got.alive.load(Ordering::SeqCst));
                            assert_eq!(got.id, id);
                            assert_eq!(t.with(fd, |f| f.id), Some(id));
                        }
                        // peek at others' descriptors (may be closed any moment)
                        if let Some(f) = t.get(Fd((i % 200) as u32)) {
                            assert!(f.alive.load(Ordering::SeqCst));
                        }
                        if mine.len() > 16 {
                            let (fd, _) = mine.swap_remove(i % mine.len());
                            t.close(fd).unwrap();
                        }
                    }
                    for (fd, _) in mine {
                        t.close(fd).unwrap();
                    }
                }));
            }
            for w in workers {
                w.join().expect("worker panicked");
            }
        });
        assert!(t.iter().is_empty());
        assert!(t.stats().resizes >= 1);
    }
    // Every file was dropped at its last reference: by a close, by the lookup that held
    // it last, or by the table's drop. None waits for a grace period.
    let want = made.load(Ordering::SeqCst);
    assert_eq!(
        drops.load(Ordering::SeqCst),
        want,
        "every file dropped exactly once"
    );
}

#[test]
fn stress_lockless() {
    stress(Settings {
        install: InstallMode::Lockless,
        policy: AllocPolicy::Lowest,
    });
}

#[test]
fn stress_under_lock() {
    stress(Settings {
        install: InstallMode::UnderLock,
        policy: AllocPolicy::Lowest,
    });
}

#[test]
fn stress_per_thread() {
    stress(Settings {
        install: InstallMode::Lockless,
        policy: AllocPolicy::PerThread,
    });
}

/// Installs racing resizes head-on: reserve a batch, let one thread force growth while
/// the others install.
#[test]
fn install_races_resize() {
    for round in 0..50 {
        let t: FdTable<usize> = FdTable::with_limits(Settings::default(), 1 << 20, 1 << 20);
        let fds: Vec<Fd> = (0..60).map(|_| t.reserve(Fd(0), false).unwrap()).collect();
        std::thread::scope(|s| {
            for chunk in fds.chunks(15) {
                let t = &t;
                s.spawn(move || {
                    for &fd in chunk {
                        t.install(fd, Arc::new(fd.0 as usize));
                    }
                });
            }
            let t = &t;
            s.spawn(move || {
                for k in 0..6 {
                    t.reserve(Fd(64 << k), false).unwrap();
                }
            });
        });
        for &fd in &fds {
            assert_eq!(
                t.get(fd).map(|f| *f),
                Some(fd.0 as usize),
                "round {round}: lost install of {fd}"
            );
        }
    }
}
