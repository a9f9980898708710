//! Whole scenarios under shuttle's randomized scheduler: several threads lock and unlock
//! ranges of two inodes in all three families. Invariants: no two conflicting locks are
//! ever held at once, every thread finishes (shuttle reports a deadlock otherwise), no
//! EDEADLK where no cycle can exist, and nothing is left behind. Run with
//! `RUSTFLAGS="--cfg vfscale_shuttle" cargo test -p vfscale-locks --test shuttle --release`.
#![cfg(vfscale_shuttle)]

use shuttle::sync::Mutex;
use std::sync::Arc;
use vfscale_locks::*;

#[derive(Clone, Copy, Debug)]
struct Held {
    inode: usize,
    owner: u64,
    flock: bool,
    write: bool,
    start: i64,
    end: i64,
}

fn conflicts(a: &Held, b: &Held) -> bool {
    a.inode == b.inode
        && a.flock == b.flock
        && a.owner != b.owner
        && (a.write || b.write)
        && a.start <= b.end
        && b.start <= a.end
}

fn scenario(wake: WakeMode) {
    let mgr = LockManager::with_settings(Settings {
        wake,
        ..Settings::default()
    });
    let inodes: Arc<Vec<_>> = Arc::new(
        (0..2)
            .map(|i| {
                FileLockContext::new(
                    &mgr,
                    InodeKey {
                        major: 0,
                        minor: 0,
                        ino: i,
                    },
                )
            })
            .collect(),
    );
    let held = Arc::new(Mutex::new(Vec::<Held>::new()));
    let threads: Vec<_> = (1..=6u64)
        .map(|t| {
            let (inodes, held) = (inodes.clone(), held.clone());
            shuttle::thread::spawn(move || {
                let who = Process::new(t as u32);
                let f = OpenFile::new(t, AccessMode::ReadWrite);
                for round in 0..3u64 {
                    let x = (t * 7 + round * 13) % 16;
                    let write = x % 3 != 1;
                    let ty = if write { LockType::Write } else { LockType::Read };
                    let (start, len) = ((x % 4) as i64, 1 + (x % 3) as i64);
                    let mut mine = Vec::new();
                    // POSIX threads take both inodes, in order, so no cycle can form; the
                    // others one inode a round. Two threads of each family contend.
                    let both = [0usize, 1];
                    let one = [(round % 2) as usize];
                    let kinds: &[usize] = if t % 3 == 0 { &both } else { &one };
                    for &ino in kinds {
                        let c = &inodes[ino];
                        let (flock, r) = match t % 3 {
                            0 => (
                                false,
                                c.fcntl(who, f, FcntlCmd::SetLkW, &mut Flock::new(ty, start, len)),
                            ),
                            1 => (
                                false,
                                c.fcntl(who, f, FcntlCmd::OfdSetLkW, &mut Flock::new(ty, start, len)),
                            ),
                            _ => {
                                let op = if write {
                                    FlockOp::Exclusive
                                } else {
                                    FlockOp::Shared
                                };
                                (true, c.flock(who, f, op, false))
                            }
                        };
                        assert_eq!(r, Ok(()), "thread {t} round {round}");
                        let me = Held {
                            inode: ino,
                            owner: t,
                            flock,
                            write,
                            start: if flock { 0 } else { start },
                            end: if flock { i64::MAX } else { start + len - 1 },
                        };
                        let mut h = held.lock().unwrap();
                        if let Some(o) = h.iter().find(|o| conflicts(o, &me)) {
                            panic!("conflicting locks held at once: {o:?} and {me:?}");
                        }
                        h.push(me);
                        mine.push(me);
                    }
                    held.lock().unwrap().retain(|o| o.owner != t);
                    for m in mine {
                        let c = &inodes[m.inode];
                        if m.flock {
                            c.flock(who, f, FlockOp::Unlock, true).unwrap();
                        } else if t % 3 == 0 {
                            c.posix_remove_owner(who);
                        } else {
                            c.file_remove(f.id);
                        }
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(mgr.locks_listing(), vec![]);
    assert_eq!(mgr.stats().deadlocks, 0);
}

#[test]
fn random_schedules_with_the_wait_tree() {
    shuttle::check_random(|| scenario(WakeMode::Tree), 2000);
}

#[test]
fn random_schedules_waking_everyone() {
    shuttle::check_random(|| scenario(WakeMode::All), 1000);
}

#[test]
fn pct_schedules_with_the_wait_tree() {
    shuttle::check_pct(|| scenario(WakeMode::Tree), 1000, 3);
}
