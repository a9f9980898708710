//! A lock storm: threads on three members take and drop random byte ranges with
//! F_SETLKW on one inode (and flock on another); every grant is checked against the
//! locks the other threads hold at that moment: no two conflicting locks, ever.

mod service_support;

use std::sync::Arc;

use parking_lot::Mutex;
use service_support::*;
use vfscale_cluster::InodeId;
use vfscale_locks::{FcntlCmd, Flock, FlockOp, LockType};

/// (thread, first byte, last byte, write) of each lock held now.
type Held = Arc<Mutex<Vec<(usize, i64, i64, bool)>>>;

#[test]
fn no_conflicting_grants_in_a_storm_across_members() {
    let c = start(3);
    let held: Held = Arc::new(Mutex::new(Vec::new()));
    let flocked: Arc<Mutex<(usize, usize)>> = Arc::new(Mutex::new((0, 0))); // (readers, writers)
    std::thread::scope(|s| {
        for t in 0..6usize {
            let m = c.members[t % 3].clone();
            let (held, flocked) = (held.clone(), flocked.clone());
            s.spawn(move || {
                let mut x = 0x9e37_79b9u64 * (t as u64 + 1);
                let mut rand = move |n: u64| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % n
                };
                let p = who(t as u64 + 1, 100 + t as i32);
                for _ in 0..150 {
                    let start = rand(16) as i64;
                    let len = 1 + rand(4) as i64;
                    let write = rand(3) != 0;
                    let fl = if write { wr(start, len) } else { rd(start, len) };
                    fcntl(&m, 1, p, file(p.owner), FcntlCmd::SetLkW, fl).unwrap();
                    let end = start + len - 1;
                    {
                        let mut h = held.lock();
                        for &(o, s2, e2, w2) in h.iter() {
                            let overlap = s2 <= end && start <= e2;
                            assert!(
                                !(overlap && (write || w2)),
                                "thread {t} granted {start}..={end} (write {write}) while thread {o} holds {s2}..={e2} (write {w2})"
                            );
                        }
                        h.push((t, start, end, write));
                    }
                    std::thread::yield_now();
                    held.lock().retain(|&(o, _, _, _)| o != t);
                    setlk(&m, 1, p, un(start, len)).unwrap();

                    // flock on inode 2: shared or exclusive, then unlock.
                    let f = file(1000 + t as u64);
                    let ex = rand(2) == 0;
                    let op = if ex { FlockOp::Exclusive } else { FlockOp::Shared };
                    let (_call, rx) = flock_start(&m, 2, f, op, false);
                    rx.recv_timeout(ANSWER).unwrap().unwrap();
                    {
                        let mut fl = flocked.lock();
                        assert!(fl.1 == 0 && (!ex || fl.0 == 0), "flock {op:?} granted beside {fl:?}");
                        if ex {
                            fl.1 += 1;
                        } else {
                            fl.0 += 1;
                        }
                    }
                    std::thread::yield_now();
                    {
                        let mut fl = flocked.lock();
                        if ex {
                            fl.1 -= 1;
                        } else {
                            fl.0 -= 1;
                        }
                    }
                    service_support::flock(&m, 2, f, FlockOp::Unlock, true).unwrap();
                }
                m.posix_remove_owner(InodeId(1), p);
            });
        }
    });
    // Nothing is left held.
    let probe = who(99, 99);
    setlk(&c.members[1], 1, probe, wr(0, 0)).unwrap();
    let got = getlk(&c.members[2], 1, who(98, 98), Flock::new(LockType::Read, 0, 0));
    assert_eq!(got.l_pid, 99);
    let remote: u64 = c.members.iter().map(|m| m.stats().remote_calls).sum();
    println!("remote calls: {remote}");
}
