//! Locks taken through one member conflict with locks taken through another: POSIX
//! ranges, OFD locks and flock, with the home on either side.

mod service_support;

use service_support::*;
use vfscale_cluster::{Directory, InodeId};
use vfscale_locks::{Errno, FcntlCmd, FlockOp, LockType};

#[test]
fn posix_ranges_conflict_across_members_and_close_releases_them() {
    let c = start(2);
    let (a, b) = (&c.members[0], &c.members[1]);
    // The same local owner id on two members names two different processes.
    let (pa, pb) = (who(1, 100), who(1, 200));
    setlk(a, 7, pa, wr(0, 10)).unwrap();
    assert_eq!(c.mem.home_of(InodeId(7)).unwrap().member.node, "m0");
    assert_eq!(setlk(b, 7, pb, wr(5, 1)), Err(Errno::EAGAIN));
    assert_eq!(setlk(b, 7, pb, rd(9, 5)), Err(Errno::EAGAIN));
    setlk(b, 7, pb, wr(10, 10)).unwrap();
    // A's owner now meets B's lock at the home.
    assert_eq!(setlk(a, 7, pa, wr(15, 1)), Err(Errno::EAGAIN));
    // Unlock at the remote home.
    setlk(b, 7, pb, un(10, 10)).unwrap();
    setlk(a, 7, pa, wr(15, 1)).unwrap();
    // A close on the home drops every lock of the owner.
    a.posix_remove_owner(InodeId(7), pa);
    setlk(b, 7, pb, wr(0, 0)).unwrap();
    assert_eq!(setlk(a, 7, pa, rd(100, 1)), Err(Errno::EAGAIN));
    // A close through the remote member is applied before it returns.
    b.posix_remove_owner(InodeId(7), pb);
    setlk(a, 7, pa, wr(0, 0)).unwrap();
    let sa = a.stats();
    let sb = b.stats();
    assert!(sa.local_calls >= 4 && sa.served_for_peers >= 4, "{sa:?}");
    assert!(sb.remote_calls >= 4 && sb.local_calls == 0, "{sb:?}");
}

#[test]
fn getlk_reports_the_holder_pid_from_its_own_member() {
    let c = start(2);
    let (a, b) = (&c.members[0], &c.members[1]);
    // B takes the inode first: the home is B; A asks remotely, and the other way.
    setlk(b, 9, who(3, 4242), wr(100, 50)).unwrap();
    let got = getlk(a, 9, who(3, 777), rd(120, 1));
    assert_eq!(
        (got.l_type, got.l_start, got.l_len, got.l_pid),
        (LockType::Write, 100, 50, 4242)
    );
    setlk(a, 9, who(5, 555), rd(0, 10)).unwrap();
    let got = getlk(b, 9, who(3, 4242), wr(5, 1));
    assert_eq!((got.l_type, got.l_pid), (LockType::Read, 555));
    let free = getlk(a, 9, who(3, 777), wr(60, 10));
    assert_eq!(free.l_type, LockType::Unlock);
    // An owner's own lock is no conflict for it.
    let own = getlk(b, 9, who(3, 4242), wr(100, 1));
    assert_eq!(own.l_type, LockType::Unlock);
}

#[test]
fn ofd_locks_conflict_across_members() {
    let c = start(2);
    let (a, b) = (&c.members[0], &c.members[1]);
    let mut fl = wr(0, 10);
    fcntl(a, 11, who(1, 1), file(50), FcntlCmd::OfdSetLk, fl).unwrap();
    assert_eq!(
        fcntl(b, 11, who(1, 2), file(50), FcntlCmd::OfdSetLk, fl),
        Err(Errno::EAGAIN)
    );
    let got = fcntl(b, 11, who(1, 2), file(60), FcntlCmd::OfdGetLk, rd(3, 1)).unwrap();
    assert_eq!((got.l_type, got.l_pid), (LockType::Write, -1));
    fl.l_type = LockType::Unlock;
    fcntl(a, 11, who(1, 1), file(50), FcntlCmd::OfdSetLk, fl).unwrap();
    fcntl(b, 11, who(1, 2), file(50), FcntlCmd::OfdSetLk, wr(0, 10)).unwrap();
    // The last close of B's file releases it at A's home.
    b.file_remove(InodeId(11), file(50));
    fcntl(a, 11, who(1, 1), file(51), FcntlCmd::OfdSetLk, wr(0, 10)).unwrap();
}

#[test]
fn flock_conflicts_across_members_either_home() {
    let c = start(3);
    for (home, other) in [(0usize, 1usize), (2, 0)] {
        let ino = 20 + home as u64;
        let (h, o) = (&c.members[home], &c.members[other]);
        flock(h, ino, file(1), FlockOp::Exclusive, true).unwrap();
        assert_eq!(flock(o, ino, file(1), FlockOp::Shared, true), Err(Errno::EAGAIN));
        assert_eq!(
            flock(o, ino, file(2), FlockOp::Exclusive, true),
            Err(Errno::EAGAIN)
        );
        flock(h, ino, file(1), FlockOp::Shared, true).unwrap();
        flock(o, ino, file(1), FlockOp::Shared, true).unwrap();
        // Converting to exclusive fails and, as in Linux, drops the shared lock.
        assert_eq!(
            flock(o, ino, file(1), FlockOp::Exclusive, true),
            Err(Errno::EAGAIN)
        );
        flock(h, ino, file(1), FlockOp::Unlock, true).unwrap();
        flock(o, ino, file(7), FlockOp::Exclusive, true).unwrap();
        assert_eq!(flock(h, ino, file(1), FlockOp::Shared, true), Err(Errno::EAGAIN));
        o.file_remove(InodeId(ino), file(7));
        flock(h, ino, file(1), FlockOp::Shared, true).unwrap();
    }
}

#[test]
fn a_home_here_answers_before_the_call_returns() {
    let c = start(2);
    let a = &c.members[0];
    setlk(a, 30, who(1, 1), wr(0, 1)).unwrap();
    let (call, rx) = fcntl_start(a, 30, who(1, 1), file(1), FcntlCmd::SetLk, wr(1, 1));
    assert!(call.is_answered());
    assert_eq!(rx.try_recv().unwrap().map(|_| ()), Ok(()));
    assert_eq!(
        c.dirs[0].stats().etcd_txns,
        1,
        "one claim, then no directory traffic"
    );
}
