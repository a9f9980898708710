//! Waits across members: a remote SETLKW granted when the holder on another member
//! unlocks, interrupts, EDEADLK for a cycle whose waits sit at two homes, and no false
//! EDEADLK when a published edge went stale.

mod service_support;

use service_support::*;
use vfscale_cluster::InodeId;
use vfscale_locks::{Errno, FcntlCmd, FlockOp};

#[test]
fn a_remote_setlkw_is_granted_when_the_holder_unlocks() {
    let c = start(2);
    let (a, b) = (&c.members[0], &c.members[1]);
    setlk(a, 1, who(1, 10), wr(0, 10)).unwrap();
    let (_call, rx) = fcntl_start(b, 1, who(1, 20), file(1), FcntlCmd::SetLkW, wr(5, 10));
    still_waiting(&rx);
    setlk(a, 1, who(1, 10), un(0, 10)).unwrap();
    rx.recv_timeout(ANSWER).unwrap().unwrap();
    assert_eq!(setlk(a, 1, who(1, 10), rd(14, 1)), Err(Errno::EAGAIN));
}

#[test]
fn a_local_waiter_is_granted_when_a_remote_holder_closes() {
    let c = start(2);
    let (a, b) = (&c.members[0], &c.members[1]);
    // The home is A; B's owner holds there; A's owner waits at its own home.
    setlk(a, 2, who(1, 10), rd(100, 1)).unwrap();
    setlk(b, 2, who(1, 20), wr(0, 10)).unwrap();
    let (_call, rx) = fcntl_start(a, 2, who(1, 10), file(1), FcntlCmd::SetLkW, wr(0, 1));
    still_waiting(&rx);
    b.posix_remove_owner(InodeId(2), who(1, 20));
    rx.recv_timeout(ANSWER).unwrap().unwrap();
}

#[test]
fn flock_and_ofd_waits_are_granted_across_members() {
    let c = start(2);
    let (a, b) = (&c.members[0], &c.members[1]);
    flock(a, 3, file(1), FlockOp::Exclusive, true).unwrap();
    let (_c1, rx) = flock_start(b, 3, file(1), FlockOp::Shared, false);
    still_waiting(&rx);
    flock(a, 3, file(1), FlockOp::Unlock, true).unwrap();
    rx.recv_timeout(ANSWER).unwrap().unwrap();

    fcntl(b, 4, who(1, 1), file(9), FcntlCmd::OfdSetLk, wr(0, 1)).unwrap();
    let (_c2, rx) = fcntl_start(a, 4, who(1, 1), file(9), FcntlCmd::OfdSetLkW, wr(0, 1));
    still_waiting(&rx);
    b.file_remove(InodeId(4), file(9));
    rx.recv_timeout(ANSWER).unwrap().unwrap();
}

#[test]
fn interrupt_answers_eintr_remote_and_local() {
    let c = start(2);
    let (a, b) = (&c.members[0], &c.members[1]);
    setlk(a, 5, who(1, 10), wr(0, 0)).unwrap();
    for m in [b, a] {
        let (call, rx) = fcntl_start(m, 5, who(2, 20), file(2), FcntlCmd::SetLkW, wr(0, 1));
        still_waiting(&rx);
        call.interrupt();
        assert_eq!(rx.recv_timeout(ANSWER).unwrap(), Err(Errno::EINTR));
    }
    // Nothing was left waiting: the holder's unlock grants nobody, a new lock is free.
    setlk(a, 5, who(1, 10), un(0, 0)).unwrap();
    setlk(b, 5, who(3, 30), wr(0, 1)).unwrap();
    // An interrupt right after the call starts (it may overtake the call itself).
    setlk(a, 5, who(1, 10), wr(50, 1)).unwrap();
    let (call, rx) = fcntl_start(b, 5, who(4, 40), file(4), FcntlCmd::SetLkW, wr(50, 1));
    call.interrupt();
    assert_eq!(rx.recv_timeout(ANSWER).unwrap(), Err(Errno::EINTR));
    setlk(a, 5, who(1, 10), un(50, 1)).unwrap();
    setlk(a, 5, who(5, 50), wr(50, 1)).unwrap();
}

#[test]
fn edeadlk_for_a_cycle_whose_waits_sit_at_two_homes() {
    let c = start(2);
    let (a, b) = (&c.members[0], &c.members[1]);
    let (pa, pb) = (who(1, 100), who(1, 200));
    // X is homed at A, Y at B; each owner holds its own member's inode.
    setlk(a, 10, pa, wr(0, 1)).unwrap();
    setlk(b, 11, pb, wr(0, 1)).unwrap();
    // pa waits for Y (at home B), then pb for X (at home A): a cycle across homes.
    let (_ca, rxa) = fcntl_start(a, 11, pa, file(1), FcntlCmd::SetLkW, wr(0, 1));
    still_waiting(&rxa);
    let (_cb, rxb) = fcntl_start(b, 10, pb, file(1), FcntlCmd::SetLkW, wr(0, 1));
    // Exactly one of the two answers EDEADLK; the other keeps waiting.
    let (dead, a_answered) = first_answer(&rxa, &rxb);
    assert_eq!(dead, Err(Errno::EDEADLK));
    // The one that got EDEADLK gives up its lock (closes): the other is granted.
    let (alive, m, ino, p) = if a_answered {
        (&rxb, a, 10, pa)
    } else {
        (&rxa, b, 11, pb)
    };
    still_waiting(alive);
    m.posix_remove_owner(InodeId(ino), p);
    alive.recv_timeout(ANSWER).unwrap().unwrap();
    let total: u64 = c.members.iter().map(|m| m.stats().deadlocks_across).sum();
    assert_eq!(total, 1);
}

#[test]
fn edeadlk_ends_only_the_wait_that_closed_the_cycle() {
    let c = start(2);
    let (a, b) = (&c.members[0], &c.members[1]);
    let (pa, pb, pc) = (who(1, 100), who(1, 200), who(2, 300));
    setlk(a, 13, pa, wr(0, 1)).unwrap(); // X at home A, held by pa
    setlk(b, 14, pb, wr(0, 1)).unwrap(); // Y at home B, held by pb
    setlk(b, 15, pc, wr(0, 1)).unwrap(); // Z at home B, held by pc
                                         // A thread of pa waits for Z (at B, behind pc: no cycle)...
    let (_cz, rxz) = fcntl_start(a, 15, pa, file(1), FcntlCmd::SetLkW, wr(0, 1));
    // ...pb waits for X, long enough to be published...
    let (_cx, rxx) = fcntl_start(b, 13, pb, file(2), FcntlCmd::SetLkW, wr(0, 1));
    still_waiting(&rxz);
    still_waiting(&rxx);
    // ...then another thread of pa waits for Y: its wait closes the cycle.
    let (_cy, rxy) = fcntl_start(a, 14, pa, file(3), FcntlCmd::SetLkW, wr(0, 1));
    assert_eq!(rxy.recv_timeout(ANSWER).unwrap().map(|_| ()), Err(Errno::EDEADLK));
    // pa's other wait, at the same home and for the same owner, goes on, as pb's does.
    still_waiting(&rxz);
    still_waiting(&rxx);
    setlk(b, 15, pc, un(0, 1)).unwrap();
    rxz.recv_timeout(ANSWER).unwrap().unwrap();
    setlk(a, 13, pa, un(0, 1)).unwrap();
    rxx.recv_timeout(ANSWER).unwrap().unwrap();
    let total: u64 = c.members.iter().map(|m| m.stats().deadlocks_across).sum();
    assert_eq!(total, 1);
}

/// The first answer of two calls, and whether it was the first call's.
fn first_answer(
    rxa: &Answers<vfscale_locks::Flock>,
    rxb: &Answers<vfscale_locks::Flock>,
) -> (Result<(), Errno>, bool) {
    let end = std::time::Instant::now() + ANSWER;
    while std::time::Instant::now() < end {
        if let Ok(r) = rxa.try_recv() {
            return (r.map(|_| ()), true);
        }
        if let Ok(r) = rxb.try_recv() {
            return (r.map(|_| ()), false);
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    panic!("no answer within {ANSWER:?}");
}

#[test]
fn no_false_edeadlk_when_a_published_wait_went_stale() {
    let c = start(2);
    let (a, b) = (&c.members[0], &c.members[1]);
    let (pa, pb) = (who(1, 100), who(1, 200));
    setlk(a, 20, pa, wr(0, 1)).unwrap(); // X at home A, held by pa
    setlk(b, 21, pb, wr(0, 1)).unwrap(); // Y at home B, held by pb
    for round in 0..20 {
        // pb waits for X long enough to be published (pb -> pa, by A)...
        let (_cb, rxb) = fcntl_start(b, 20, pb, file(1), FcntlCmd::SetLkW, wr(0, 1));
        std::thread::sleep(std::time::Duration::from_millis(5 + round % 4));
        // ...pa unlocks X: pb is granted, and its edge is stale...
        setlk(a, 20, pa, un(0, 1)).unwrap();
        rxb.recv_timeout(ANSWER).unwrap().unwrap();
        // ...then pa waits for Y, which pb holds: no cycle.
        let (_ca, rxa) = fcntl_start(a, 21, pa, file(1), FcntlCmd::SetLkW, wr(0, 1));
        std::thread::sleep(std::time::Duration::from_millis(8));
        // pb releases both; pa is granted Y, not EDEADLK.
        setlk(b, 20, pb, un(0, 1)).unwrap();
        setlk(b, 21, pb, un(0, 1)).unwrap();
        assert_eq!(
            rxa.recv_timeout(ANSWER).unwrap().map(|_| ()),
            Ok(()),
            "round {round}"
        );
        // Back to the start: pa holds X, pb holds Y.
        setlk(a, 21, pa, un(0, 1)).unwrap();
        setlk(a, 20, pa, wr(0, 1)).unwrap();
        setlk(b, 21, pb, wr(0, 1)).unwrap();
    }
    let total: u64 = c.members.iter().map(|m| m.stats().deadlocks_across).sum();
    assert_eq!(total, 0);
    // The waits were long enough to be published (else this proves nothing).
    let published: u64 = c.members.iter().map(|m| m.stats().wait_publications).sum();
    let stale: u64 = c.members.iter().map(|m| m.stats().cycles_unconfirmed).sum();
    assert!(published >= 20, "{published} publications");
    println!("{published} publications, {stale} cycles refuted as stale");
}

#[test]
fn a_waiter_whose_member_goes_away_leaves_the_homes_wait_tree() {
    let mut c = start(2);
    let a = c.members[0].clone();
    setlk(&a, 6, who(1, 10), wr(0, 1)).unwrap();
    let (_w, rx) = fcntl_start(&c.members[1], 6, who(2, 20), file(2), FcntlCmd::SetLkW, wr(0, 1));
    still_waiting(&rx);
    assert_eq!(a.stats().waiting_now, 1);
    // B's process stops: its runtime and connections go, its lease stays (no event).
    let b = c.members.pop().unwrap();
    drop(b);
    // The broken stream drops the pending request at A (were A's owner to unlock
    // first, the request would be granted, and held until B's lease ended)...
    eventually("the orphaned request is gone", || a.stats().waiting_now == 0);
    // ...so once A's owner unlocks, a third owner gets the range.
    setlk(&a, 6, who(1, 10), un(0, 1)).unwrap();
    setlk(&a, 6, who(3, 30), wr(0, 1)).unwrap();
}

#[test]
fn leaving_answers_waiting_and_later_calls_with_eio() {
    let c = start(2);
    let (a, b) = (&c.members[0], &c.members[1]);
    setlk(a, 8, who(1, 10), wr(0, 1)).unwrap();
    setlk(b, 9, who(1, 20), wr(0, 1)).unwrap();
    let (_w1, rx1) = fcntl_start(b, 8, who(2, 21), file(2), FcntlCmd::SetLkW, wr(0, 1));
    let (_w2, rx2) = fcntl_start(b, 9, who(3, 22), file(3), FcntlCmd::SetLkW, wr(0, 1));
    still_waiting(&rx1);
    still_waiting(&rx2);
    b.leave();
    assert_eq!(rx1.recv_timeout(ANSWER).unwrap().map(|_| ()), Err(EIO));
    assert_eq!(rx2.recv_timeout(ANSWER).unwrap().map(|_| ()), Err(EIO));
    assert_eq!(setlk(b, 9, who(1, 20), wr(5, 1)), Err(EIO));
    assert_eq!(setlk(b, 8, who(1, 20), wr(5, 1)), Err(EIO));
}

#[test]
fn edeadlk_at_once_for_a_cycle_of_two_members_owners_at_one_home() {
    let c = start(2);
    let (a, b) = (&c.members[0], &c.members[1]);
    let (pa, pb) = (who(1, 100), who(1, 200));
    setlk(a, 12, pa, wr(0, 1)).unwrap(); // home A
    setlk(b, 12, pb, wr(1, 1)).unwrap();
    let (_w, rx) = fcntl_start(a, 12, pa, file(1), FcntlCmd::SetLkW, wr(1, 1));
    still_waiting(&rx);
    // The home's own detector sees both owners (cluster-wide ids): no publication needed.
    assert_eq!(
        fcntl(b, 12, pb, file(1), FcntlCmd::SetLkW, wr(0, 1)).map(|_| ()),
        Err(Errno::EDEADLK)
    );
    b.posix_remove_owner(InodeId(12), pb);
    rx.recv_timeout(ANSWER).unwrap().unwrap();
    assert_eq!(
        c.members.iter().map(|m| m.stats().deadlocks_across).sum::<u64>(),
        0
    );
}

#[test]
fn hundreds_of_remote_waiters_are_granted_one_after_another() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    const N: usize = 300;
    let c = start(2);
    let (a, b) = (c.members[0].clone(), c.members[1].clone());
    setlk(&a, 13, who(1, 10), wr(0, 1)).unwrap();
    let granted = Arc::new(AtomicUsize::new(0));
    let mut calls = Vec::new();
    for i in 0..N as u64 {
        let (g, m) = (granted.clone(), b.clone());
        let p = who(100 + i, 100 + i as i32);
        calls.push(b.fcntl(
            InodeId(13),
            p,
            file(p.owner),
            FcntlCmd::SetLkW,
            wr(0, 1),
            Box::new(move |r| {
                assert!(r.is_ok(), "{r:?}");
                g.fetch_add(1, Ordering::SeqCst);
                // Hand the range on (no waiting inside a completion).
                let _ = m.fcntl(
                    InodeId(13),
                    p,
                    file(p.owner),
                    FcntlCmd::SetLk,
                    un(0, 1),
                    Box::new(|_| {}),
                );
            }),
        ));
    }
    std::thread::sleep(STILL);
    assert_eq!(granted.load(Ordering::SeqCst), 0);
    setlk(&a, 13, who(1, 10), un(0, 1)).unwrap();
    eventually("every waiter is granted", || granted.load(Ordering::SeqCst) == N);
}
