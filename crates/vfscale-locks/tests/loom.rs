//! loom models of the waiter hand-off: an unlock racing a request going to sleep, an
//! interrupt racing a wake-up, and the fair hand-off to a woken waiter racing its own
//! retry. Run with
//! `RUSTFLAGS="--cfg vfscale_loom" cargo test -p vfscale-locks --test loom --release`.
#![cfg(vfscale_loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc as LArc;
use vfscale_locks::*;

fn ctx() -> std::sync::Arc<FileLockContext> {
    let mgr = LockManager::new();
    FileLockContext::new(&mgr, InodeKey::default())
}

fn file(n: u64) -> OpenFile {
    OpenFile::new(n, AccessMode::ReadWrite)
}

/// p1 holds an exclusive flock and p2's request for one is queued, waiting in a loom
/// thread: the context, its manager, p2's thread and p2's interrupter.
fn p2_waiting_on_p1() -> (
    std::sync::Arc<FileLockContext>,
    std::sync::Arc<LockManager>,
    loom::thread::JoinHandle<Result<(), Errno>>,
    Interrupter,
) {
    let c = ctx();
    let mgr = c.manager().clone();
    c.flock(Process::new(1), file(1), FlockOp::Exclusive, true)
        .unwrap();
    let pending = c
        .flock_lock(Process::new(2), file(2), FlockOp::Exclusive, false)
        .unwrap()
        .unwrap();
    let int = pending.interrupter();
    let t = loom::thread::spawn(move || pending.wait());
    (c, mgr, t, int)
}

/// A waiter that blocks while the holder unlocks is never lost: it always gets the lock.
#[test]
fn unlock_racing_a_sleeper_loses_no_wakeup() {
    loom::model(|| {
        let c = ctx();
        c.flock(Process::new(1), file(1), FlockOp::Exclusive, true)
            .unwrap();
        let c2 = c.clone();
        let t = loom::thread::spawn(move || {
            c2.flock(Process::new(2), file(2), FlockOp::Exclusive, false)
                .unwrap();
        });
        c.flock(Process::new(1), file(1), FlockOp::Unlock, true).unwrap();
        t.join().unwrap();
        // The waiter holds the lock now: a third open file cannot take it.
        assert_eq!(
            c.flock(Process::new(3), file(3), FlockOp::Exclusive, true),
            Err(Errno::EAGAIN)
        );
    });
}

/// Two POSIX waiters and an unlock: never two holders, both finish.
#[test]
fn two_waiters_are_never_granted_together() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.check(|| {
        let c = ctx();
        let held = LArc::new(AtomicUsize::new(0));
        let w = Flock::new(LockType::Write, 0, 0);
        c.fcntl(Process::new(1), file(1), FcntlCmd::SetLk, &mut w.clone())
            .unwrap();
        let ts: Vec<_> = [2u32, 3]
            .into_iter()
            .map(|p| {
                let (c, held) = (c.clone(), held.clone());
                loom::thread::spawn(move || {
                    c.fcntl(Process::new(p), file(p as u64), FcntlCmd::SetLkW, &mut w.clone())
                        .unwrap();
                    assert_eq!(held.fetch_add(1, Ordering::SeqCst), 0, "double grant");
                    held.fetch_sub(1, Ordering::SeqCst);
                    c.posix_remove_owner(Process::new(p));
                })
            })
            .collect();
        c.posix_remove_owner(Process::new(1));
        for t in ts {
            t.join().unwrap();
        }
    });
}

/// An interrupt racing the unlock that would grant: the call either gets the lock or
/// fails with EINTR, and in both cases leaves nothing behind.
#[test]
fn interrupt_racing_a_grant_leaves_no_trace() {
    loom::model(|| {
        let (c, mgr, t, int) = p2_waiting_on_p1();
        let c2 = c.clone();
        let u =
            loom::thread::spawn(move || c2.flock(Process::new(1), file(1), FlockOp::Unlock, true).unwrap());
        int.interrupt();
        let r = t.join().unwrap();
        u.join().unwrap();
        match r {
            Ok(()) => assert_eq!(mgr.locks_listing().len(), 1),
            Err(e) => {
                assert_eq!(e, Errno::EINTR);
                assert_eq!(mgr.locks_listing(), vec![]);
            }
        }
    });
}

/// The fair hand-off to a request that was woken by an earlier unlock and
/// whose owner has not run yet: main unlocks (waking the waiter), barges back in if it
/// can, and unlocks again, which may hand the lock to the waiter on its behalf while
/// the waiter's own thread wakes up and retries. Under the models the inode's clock
/// counts critical sections and the quantum is two of them, so the schedules include
/// both a wake-up without a hand-off and a later hand-off to the request it woke.
/// Whatever the schedule: never two holders, the waiter gets the lock exactly once and
/// releases it, and nothing is left behind; and some schedule hands the lock to the
/// waiter after the section that woke it (woken once, handed off once).
#[test]
fn a_handoff_to_a_woken_waiter_races_its_own_retry() {
    use std::sync::atomic::AtomicUsize as StdCount;
    static LATE_HANDOFFS: StdCount = StdCount::new(0);
    loom::model(|| {
        let c = ctx();
        let mgr = c.manager().clone();
        let held = LArc::new(AtomicUsize::new(1));
        c.flock(Process::new(1), file(1), FlockOp::Exclusive, true)
            .unwrap();
        let (c2, h2) = (c.clone(), held.clone());
        let t = loom::thread::spawn(move || {
            c2.flock(Process::new(2), file(2), FlockOp::Exclusive, false)
                .unwrap();
            assert_eq!(h2.fetch_add(1, Ordering::SeqCst), 0, "double grant");
            h2.fetch_sub(1, Ordering::SeqCst);
            c2.flock(Process::new(2), file(2), FlockOp::Unlock, true).unwrap();
        });
        held.fetch_sub(1, Ordering::SeqCst);
        c.flock(Process::new(1), file(1), FlockOp::Unlock, true).unwrap();
        if c.flock(Process::new(1), file(1), FlockOp::Exclusive, true)
            .is_ok()
        {
            assert_eq!(held.fetch_add(1, Ordering::SeqCst), 0, "double grant");
            held.fetch_sub(1, Ordering::SeqCst);
            c.flock(Process::new(1), file(1), FlockOp::Unlock, true).unwrap();
        }
        t.join().unwrap();
        assert_eq!(mgr.locks_listing(), vec![]);
        let st = c.stats();
        if st.handoffs == 1 && st.wakeups == 1 {
            LATE_HANDOFFS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    assert!(
        LATE_HANDOFFS.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no schedule handed the lock to the waiter after it was woken"
    );
}

/// An interrupt racing the fair hand-off to a woken waiter: the call ends with the lock
/// (the hand-off came first: its result stands) or with EINTR, and either way leaves
/// nothing behind once the winner unlocks.
#[test]
fn an_interrupt_racing_a_late_handoff_leaves_no_trace() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(|| {
        let (c, mgr, t, int) = p2_waiting_on_p1();
        c.flock(Process::new(1), file(1), FlockOp::Unlock, true).unwrap();
        let barged = c
            .flock(Process::new(1), file(1), FlockOp::Exclusive, true)
            .is_ok();
        if barged {
            c.flock(Process::new(1), file(1), FlockOp::Unlock, true).unwrap();
        }
        int.interrupt();
        match t.join().unwrap() {
            Ok(()) => c.flock(Process::new(2), file(2), FlockOp::Unlock, true).unwrap(),
            Err(e) => assert_eq!(e, Errno::EINTR),
        }
        assert_eq!(mgr.locks_listing(), vec![]);
    });
}
