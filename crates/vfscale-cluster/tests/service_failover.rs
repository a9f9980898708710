//! Failure: a home's lease ends (another member claims its inodes, reclaims the locks
//! the live members hold there, and grants the waiters), a dead member's owners lose
//! their locks at every home, and a fenced member's former holders get EIO.

mod service_support;

use std::time::Duration;

use service_support::*;
use vfscale_cluster::memdir::MemCluster;
use vfscale_cluster::{Directory as _, InodeId};
use vfscale_locks::{Errno, FcntlCmd, FlockOp};

#[test]
fn a_dead_home_is_claimed_again_with_the_live_members_locks() {
    let c = start(3);
    let (a, b, m2) = (&c.members[0], &c.members[1], &c.members[2]);
    let ino = 40;
    setlk(a, ino, who(1, 100), wr(0, 10)).unwrap(); // home A
    setlk(b, ino, who(1, 200), wr(20, 10)).unwrap(); // held at A by B's owner
    setlk(m2, ino, who(1, 300), rd(40, 5)).unwrap(); // held at A by C's owner
    flock(b, ino, file(7), FlockOp::Shared, true).unwrap();
    // B's second owner waits at A for A's owner.
    let (_w, rx) = fcntl_start(b, ino, who(2, 201), file(2), FcntlCmd::SetLkW, wr(0, 1));
    still_waiting(&rx);

    // A stops granting, then its lease ends.
    c.mem.fence(&c.dirs[0]);
    std::thread::sleep(Duration::from_millis(100));
    still_waiting(&rx);
    c.mem.expire("m0");

    // The waiter is granted at the new home: A's owner's lock died with A.
    rx.recv_timeout(ANSWER).unwrap().unwrap();
    let home = c.mem.home_of(InodeId(ino)).expect("claimed again");
    assert_ne!(home.member.node, "m0");
    // The live members' locks were re-created there before anything was granted.
    let probe = who(9, 900);
    assert_eq!(
        setlk(m2, ino, probe, wr(20, 1)),
        Err(Errno::EAGAIN),
        "B's lock reclaimed"
    );
    assert_eq!(
        setlk(m2, ino, probe, wr(40, 1)),
        Err(Errno::EAGAIN),
        "C's lock reclaimed"
    );
    assert_eq!(
        setlk(m2, ino, probe, wr(0, 1)),
        Err(Errno::EAGAIN),
        "the waiter holds"
    );
    assert_eq!(
        flock(m2, ino, file(8), FlockOp::Exclusive, true),
        Err(Errno::EAGAIN)
    );
    setlk(m2, ino, probe, wr(5, 5)).unwrap();
    let reclaimed: u64 = [b, m2].iter().map(|m| m.stats().reclaimed).sum();
    assert!(reclaimed >= 3, "{reclaimed}");
}

#[test]
fn a_dead_members_locks_and_waits_go_at_the_home() {
    let c = start(2);
    let (a, b) = (&c.members[0], &c.members[1]);
    let ino = 41;
    setlk(a, ino, who(1, 100), rd(100, 1)).unwrap(); // home A
    setlk(b, ino, who(1, 200), wr(0, 10)).unwrap();
    flock(b, ino, file(3), FlockOp::Exclusive, true).unwrap();
    let (_w, rx) = fcntl_start(a, ino, who(2, 101), file(2), FcntlCmd::SetLkW, wr(0, 1));
    still_waiting(&rx);
    c.mem.fence(&c.dirs[1]);
    c.mem.expire("m1");
    rx.recv_timeout(ANSWER).unwrap().unwrap();
    flock(a, ino, file(4), FlockOp::Exclusive, true).unwrap();
    assert!(a.stats().dead_owners_dropped >= 2, "{:?}", a.stats());
}

#[test]
fn a_fenced_members_former_holders_get_eio_until_they_close() {
    let c = start(2);
    let (a, b) = (&c.members[0], &c.members[1]);
    let (pa, pa2, pa3) = (who(1, 100), who(2, 101), who(3, 102));
    setlk(a, 50, pa, wr(0, 1)).unwrap(); // home A
    setlk(b, 51, who(1, 200), rd(100, 1)).unwrap(); // home B
    setlk(a, 51, pa2, wr(0, 1)).unwrap(); // A's owner holds at B

    c.mem.fence(&c.dirs[0]);
    assert_eq!(setlk(a, 50, pa, wr(5, 1)), Err(EIO));
    assert_eq!(setlk(a, 51, pa2, wr(5, 1)), Err(EIO));
    // While fenced nothing is granted, to anyone.
    assert_eq!(setlk(a, 50, pa3, wr(9, 1)), Err(EIO));
    // The fencing event marks what was held as lost (handled by the service's task).
    eventually("the former holders are marked lost", || {
        a.posix_lost(InodeId(50), pa) && a.posix_lost(InodeId(51), pa2)
    });
    assert!(!a.posix_lost(InodeId(50), pa3));

    c.mem.expire("m0");
    c.mem.rejoin(&c.dirs[0]);
    // B dropped A's old owners: B's owner takes A's former range.
    eventually("B drops the dead lease's locks", || {
        setlk(b, 51, who(1, 200), wr(0, 1)).is_ok()
    });
    // Former holders keep getting EIO; an owner that held nothing is served again.
    assert_eq!(setlk(a, 50, pa, wr(5, 1)), Err(EIO));
    assert_eq!(setlk(a, 51, pa2, rd(200, 1)), Err(EIO));
    setlk(a, 50, pa3, wr(9, 1)).unwrap();
    // Closing the file ends it.
    a.posix_remove_owner(InodeId(50), pa);
    a.posix_remove_owner(InodeId(51), pa2);
    assert!(!a.posix_lost(InodeId(50), pa));
    setlk(a, 50, pa, wr(5, 1)).unwrap();
    setlk(a, 51, pa2, rd(200, 1)).unwrap();
    // The two calls after rejoining were refused as lost (before it, `fenced()` may
    // have answered first).
    assert!(a.stats().lost_eio >= 2, "{:?}", a.stats());
}

#[test]
fn a_fenced_members_waiting_calls_answer_eio() {
    let c = start(2);
    let (a, b) = (&c.members[0], &c.members[1]);
    setlk(b, 60, who(1, 200), wr(0, 1)).unwrap(); // home B
    setlk(a, 61, who(1, 100), wr(0, 1)).unwrap(); // home A
                                                  // A's clients wait: one at B, one at its own home.
    let (_w1, rx1) = fcntl_start(a, 60, who(2, 101), file(2), FcntlCmd::SetLkW, wr(0, 1));
    let (_w2, rx2) = fcntl_start(a, 61, who(3, 102), file(3), FcntlCmd::SetLkW, wr(0, 1));
    still_waiting(&rx1);
    still_waiting(&rx2);
    c.mem.fence(&c.dirs[0]);
    assert_eq!(rx1.recv_timeout(ANSWER).unwrap(), Err(EIO));
    assert_eq!(rx2.recv_timeout(ANSWER).unwrap(), Err(EIO));
    // B's holder is untouched.
    assert_eq!(setlk(b, 60, who(5, 205), wr(0, 1)), Err(Errno::EAGAIN));
}

#[test]
fn a_waiter_that_waited_past_the_lease_is_granted_at_the_next_home() {
    // With a 0.5 s lease a call keeps trying a silent home for 2 s after it fails;
    // the waiter has waited longer than that before the home dies.
    let mem = vfscale_cluster::memdir::MemCluster::new();
    mem.set_lease_ttl(Duration::from_millis(500));
    let c = start_with(2, mem);
    let (a, b) = (&c.members[0], &c.members[1]);
    setlk(a, 70, who(1, 100), wr(0, 1)).unwrap();
    let (_w, rx) = fcntl_start(b, 70, who(2, 200), file(2), FcntlCmd::SetLkW, wr(0, 1));
    std::thread::sleep(Duration::from_millis(2500));
    still_waiting(&rx);
    c.mem.fence(&c.dirs[0]);
    std::thread::sleep(Duration::from_millis(100));
    c.mem.expire("m0");
    assert_eq!(rx.recv_timeout(ANSWER).unwrap().map(|_| ()), Ok(()));
}

#[test]
fn a_grant_made_as_the_fence_passes_is_refused() {
    let c = start(2);
    let (a, b) = (&c.members[0], &c.members[1]);
    setlk(a, 90, who(1, 100), wr(0, 1)).unwrap(); // home A
                                                  // A's clock passes its fence point while the next call runs (after the check
                                                  // before it): another member may serve the inode once the lease ends, so the lock
                                                  // must not be given.
    c.mem.fence_after(&c.dirs[0], 1);
    assert_eq!(setlk(a, 90, who(2, 101), wr(10, 1)), Err(EIO));
    assert!(c.dirs[0].fenced(), "the fence passed during the call");
    c.mem.expire("m0");
    // B serves the inode now and grants the range: no one else was told they hold it.
    eventually("B grants the range", || {
        setlk(b, 90, who(1, 200), wr(10, 1)).is_ok()
    });
}

#[test]
fn an_unlock_that_never_reached_its_home_is_sent_again_at_close() {
    let mem = MemCluster::new();
    // The patience of a call whose home does not answer: twice the lease and 1 s.
    mem.set_lease_ttl(Duration::from_secs(1));
    let c = start_with(2, mem.clone());
    let (a, b) = (&c.members[0], &c.members[1]);
    let (pb, other) = (who(1, 200), who(2, 300));
    setlk(a, 40, who(1, 100), rd(100, 1)).unwrap(); // home A
    setlk(b, 40, pb, wr(0, 10)).unwrap();
    // A stays alive and holds its lease, but B cannot reach it: a closed port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let real = mem.set_peer_addr("m0", closed).unwrap();
    assert_eq!(setlk(b, 40, pb, un(0, 10)), Err(EIO));
    // The lock is still at A, and pb is told so on its next call.
    assert_eq!(setlk(a, 40, other, wr(0, 1)), Err(Errno::EAGAIN));
    assert_eq!(setlk(b, 40, pb, wr(20, 1)), Err(EIO));
    // Reachable again, pb's close goes to A, though B's shadow holds nothing of it.
    mem.set_peer_addr("m0", real);
    b.posix_remove_owner(InodeId(40), pb);
    setlk(a, 40, other, wr(0, 1)).unwrap();
    // And pb's calls are served again.
    assert_eq!(setlk(b, 40, pb, wr(20, 1)), Ok(()));
}
