//! loom models of the waiter hand-off: an unlock racing a request going to sleep, and an
//! interrupt racing a wake-up. Run with
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
