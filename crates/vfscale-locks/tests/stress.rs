//! 1,000 threads on one inode, in both wake settings and all three lock families,
//! bounded in count (a few rounds each) and time (a watchdog): every thread finishes
//! and no two conflicting locks are ever held at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use vfscale_locks::*;

const THREADS: u32 = 1000;
const ROUNDS: u32 = 3;
const LIMIT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug)]
enum Family {
    Flock,
    Ofd,
    Posix,
}

fn lock(
    ctx: &Arc<FileLockContext>,
    fam: Family,
    who: Process,
    f: OpenFile,
    ty: LockType,
    start: i64,
    len: i64,
) {
    let r = match fam {
        Family::Flock => ctx.flock(
            who,
            f,
            match ty {
                LockType::Read => FlockOp::Shared,
                LockType::Write => FlockOp::Exclusive,
                LockType::Unlock => FlockOp::Unlock,
            },
            false,
        ),
        Family::Ofd => ctx.fcntl(who, f, FcntlCmd::OfdSetLkW, &mut Flock::new(ty, start, len)),
        Family::Posix => ctx.fcntl(who, f, FcntlCmd::SetLkW, &mut Flock::new(ty, start, len)),
    };
    assert_eq!(r, Ok(()), "{fam:?} {ty:?} [{start}, +{len})");
}

/// Runs `body(i)` on `THREADS` threads with small stacks, failing if they are not all
/// done within `LIMIT`.
fn run_all(name: &str, body: impl Fn(u32) + Send + Sync + 'static) {
    let body = Arc::new(body);
    let (tx, rx) = mpsc::channel();
    let start = Instant::now();
    let handles: Vec<_> = (0..THREADS)
        .map(|i| {
            let (body, tx) = (body.clone(), tx.clone());
            std::thread::Builder::new()
                .stack_size(128 * 1024)
                .spawn(move || {
                    body(i);
                    tx.send(()).unwrap();
                })
                .expect("spawn")
        })
        .collect();
    drop(tx);
    let mut done = 0;
    while done < THREADS {
        let left = LIMIT.saturating_sub(start.elapsed());
        match rx.recv_timeout(left) {
            Ok(()) => done += 1,
            Err(e) => panic!("{name}: only {done} of {THREADS} threads finished in {LIMIT:?} ({e})"),
        }
    }
    for h in handles {
        h.join().expect("a thread panicked");
    }
    eprintln!(
        "{name}: {THREADS} threads x {ROUNDS} rounds in {:?}",
        start.elapsed()
    );
}

#[test]
fn a_thousand_exclusive_contenders_all_finish_one_at_a_time() {
    for wake in [WakeMode::Tree, WakeMode::All] {
        for fam in [Family::Flock, Family::Ofd, Family::Posix] {
            let mgr = LockManager::with_settings(Settings {
                wake,
                ..Settings::default()
            });
            let ctx = FileLockContext::new(&mgr, InodeKey::default());
            let holders = Arc::new(AtomicUsize::new(0));
            let grants = Arc::new(AtomicUsize::new(0));
            let (c, h, g) = (ctx.clone(), holders.clone(), grants.clone());
            run_all(&format!("{wake:?}/{fam:?}"), move |i| {
                let who = Process::new(i + 1);
                let f = OpenFile::new(i as u64 + 1, AccessMode::ReadWrite);
                for _ in 0..ROUNDS {
                    lock(&c, fam, who, f, LockType::Write, 0, 0);
                    assert_eq!(h.fetch_add(1, Ordering::SeqCst), 0, "two exclusive holders");
                    g.fetch_add(1, Ordering::Relaxed);
                    std::hint::spin_loop();
                    h.fetch_sub(1, Ordering::SeqCst);
                    lock(&c, fam, who, f, LockType::Unlock, 0, 0);
                }
            });
            assert_eq!(grants.load(Ordering::Relaxed), (THREADS * ROUNDS) as usize);
            let s = ctx.stats();
            assert_eq!(s.grants, (THREADS * ROUNDS) as u64, "{wake:?}/{fam:?}");
            assert_eq!(mgr.locks_listing(), vec![], "nothing left behind");
        }
    }
}

/// A held range, for the conflict check.
#[derive(Clone, Copy)]
struct Held {
    owner: u32,
    write: bool,
    start: i64,
    end: i64,
}

#[test]
fn a_thousand_range_lockers_never_hold_conflicting_ranges() {
    for wake in [WakeMode::Tree, WakeMode::All] {
        let mgr = LockManager::with_settings(Settings {
            wake,
            ..Settings::default()
        });
        let ctx = FileLockContext::new(&mgr, InodeKey::default());
        let held: Arc<Mutex<Vec<Held>>> = Arc::new(Mutex::new(Vec::new()));
        let (c, hd) = (ctx.clone(), held.clone());
        run_all(&format!("{wake:?}/ranges"), move |i| {
            let who = Process::new(i + 1);
            let f = OpenFile::new(i as u64 + 1, AccessMode::ReadWrite);
            for r in 0..ROUNDS {
                // Deterministic pseudo-random ranges over 16 bytes; one lock at a time
                // per owner, so no deadlock is possible.
                let x = (i.wrapping_mul(2654435761).wrapping_add(r * 40503)) >> 7;
                let start = (x % 16) as i64;
                let len = 1 + ((x >> 4) % 4) as i64;
                let write = (x >> 8) % 3 == 0;
                let ty = if write { LockType::Write } else { LockType::Read };
                let fam = if (x >> 10) % 2 == 0 {
                    Family::Posix
                } else {
                    Family::Ofd
                };
                lock(&c, fam, who, f, ty, start, len);
                let me = Held {
                    owner: i,
                    write,
                    start,
                    end: start + len - 1,
                };
                {
                    let mut h = hd.lock().unwrap();
                    for o in h.iter() {
                        let overlap = o.start <= me.end && me.start <= o.end;
                        assert!(
                            !(overlap && o.owner != me.owner && (o.write || me.write)),
                            "conflicting locks held at once: [{},{}] and [{},{}]",
                            o.start,
                            o.end,
                            me.start,
                            me.end
                        );
                    }
                    h.push(me);
                }
                hd.lock().unwrap().retain(|o| o.owner != i);
                lock(&c, fam, who, f, LockType::Unlock, start, len);
            }
        });
        assert_eq!(mgr.locks_listing(), vec![]);
    }
}
