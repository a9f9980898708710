//! Giving back: a home gives back an inode idle for a while (its key goes, the next lock
//! claims it anew), never one with a lock held or a call waiting, never two grants of
//! one lock while calls race a give-back, and nothing once fenced.

mod service_support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use service_support::*;
use vfscale_cluster::memdir::MemCluster;
use vfscale_cluster::InodeId;
use vfscale_locks::{Errno, FcntlCmd, FlockOp};

/// The idle time the tests run with.
const IDLE: Duration = Duration::from_millis(40);

fn start_idle(n: usize, mem: Arc<MemCluster>) -> Cluster {
    let c = start_with(n, mem);
    for m in &c.members {
        m.set_home_idle(IDLE);
    }
    c
}

#[test]
fn an_idle_home_is_given_back_and_claimed_anew() {
    let c = start_idle(2, MemCluster::new());
    let (a, b) = (&c.members[0], &c.members[1]);
    let ino = 7;
    setlk(a, ino, who(1, 100), wr(0, 10)).unwrap();
    // B's lock at A's home leaves an entry in B's shadow once dropped.
    setlk(b, ino, who(2, 200), wr(20, 1)).unwrap();
    setlk(b, ino, who(2, 200), un(20, 1)).unwrap();
    setlk(a, ino, who(1, 100), un(0, 10)).unwrap();
    let old = c.mem.home_of(InodeId(ino)).expect("homed at A");
    assert_eq!(old.member.node, "m0");
    // Counted once the directory's delete has returned, after the key is gone.
    eventually("A gives the idle inode back", || {
        c.mem.home_of(InodeId(ino)).is_none() && a.stats().homes_now == 0 && a.stats().homes_given_back == 1
    });
    eventually("B drops its empty shadow", || b.stats().shadows_pruned >= 1);
    // B's shadow held nothing, so B does not claim the inode when told it lost its home.
    std::thread::sleep(IDLE * 3);
    assert_eq!(c.mem.home_of(InodeId(ino)), None);

    // The next lock, from B, claims the inode anew and is granted; A's calls go there.
    setlk(b, ino, who(2, 200), wr(0, 10)).unwrap();
    let new = c.mem.home_of(InodeId(ino)).expect("claimed anew");
    assert_eq!(new.member.node, "m1");
    assert!(new.token > old.token, "{new:?} after {old:?}");
    assert_eq!(setlk(a, ino, who(1, 100), wr(5, 1)), Err(Errno::EAGAIN));
    assert_eq!(getlk(a, ino, who(1, 100), wr(0, 1)).l_pid, 200);
}

#[test]
fn a_held_lock_or_a_waiting_call_keeps_the_home() {
    let c = start_idle(2, MemCluster::new());
    let (a, b) = (&c.members[0], &c.members[1]);
    // A POSIX lock, an OFD lock, a flock, each on an inode of its own.
    setlk(a, 1, who(1, 100), wr(0, 1)).unwrap();
    fcntl(a, 2, who(1, 100), file(5), FcntlCmd::OfdSetLk, rd(0, 1)).unwrap();
    flock(a, 3, file(6), FlockOp::Shared, true).unwrap();
    // Inode 4: A's lock, and B's call waiting for it at A.
    setlk(a, 4, who(2, 101), wr(0, 1)).unwrap();
    let (_w, rx) = fcntl_start(b, 4, who(3, 300), file(3), FcntlCmd::SetLkW, wr(0, 1));
    std::thread::sleep(IDLE * 8);
    assert_eq!(a.stats().homes_given_back, 0);
    assert_eq!(a.stats().homes_now, 4);
    for ino in 1..=4 {
        assert_eq!(c.mem.home_of(InodeId(ino)).unwrap().member.node, "m0");
    }
    still_waiting(&rx);
    // The holder lets go: the waiter is granted there, and its lock keeps the home.
    a.posix_remove_owner(InodeId(4), who(2, 101));
    rx.recv_timeout(ANSWER).unwrap().unwrap();
    std::thread::sleep(IDLE * 8);
    assert_eq!(c.mem.home_of(InodeId(4)).unwrap().member.node, "m0");
    assert_eq!(a.stats().homes_given_back, 0);
    // Dropped at last, it goes.
    b.posix_remove_owner(InodeId(4), who(3, 300));
    eventually("inode 4 given back", || {
        c.mem.home_of(InodeId(4)).is_none() && a.stats().homes_given_back == 1
    });
    assert_eq!(a.stats().homes_now, 3);
}

#[test]
fn calls_racing_give_backs_never_get_one_lock_twice() {
    let mem = MemCluster::new();
    // A slow delete: calls arrive while the inode is on its way out.
    mem.set_give_back_delay(Duration::from_millis(5));
    let c = start_with(2, mem);
    for m in &c.members {
        m.set_home_idle(Duration::from_millis(3));
    }
    let holders = AtomicUsize::new(0);
    let grants = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    // Quiet spells in which nobody locks, so that the inode goes idle even on a loaded
    // machine (where its users seldom all sleep at once), and every caller comes back
    // at once as the spell ends, racing the give-back it let happen.
    let quiet = AtomicBool::new(false);
    let given_back = || -> u64 { c.members.iter().map(|m| m.stats().homes_given_back).sum() };
    std::thread::scope(|s| {
        for t in 0..4usize {
            let m = c.members[t % 2].clone();
            let (holders, grants, stop, quiet) = (&holders, &grants, &stop, &quiet);
            s.spawn(move || {
                let p = who(t as u64 + 1, 100 + t as i32);
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if quiet.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    i += 1;
                    let cmd = if i.is_multiple_of(3) {
                        FcntlCmd::SetLkW
                    } else {
                        FcntlCmd::SetLk
                    };
                    match fcntl(&m, 1, p, file(p.owner), cmd, wr(0, 1)) {
                        Ok(_) => {}
                        Err(Errno::EAGAIN) => continue,
                        Err(e) => panic!("thread {t}: {e:?}"),
                    }
                    let before = holders.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(
                        before, 0,
                        "thread {t} was granted the write lock while another held it"
                    );
                    grants.fetch_add(1, Ordering::Relaxed);
                    std::thread::yield_now();
                    holders.fetch_sub(1, Ordering::SeqCst);
                    setlk(&m, 1, p, un(0, 1)).unwrap();
                    // Now and then nobody locks for a while: the home goes idle.
                    if i.is_multiple_of(7) {
                        std::thread::sleep(Duration::from_millis(8 + t as u64));
                    }
                }
            });
        }
        // At least 2 s, and until the inode went idle often enough, 30 s at most.
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30)
            && (start.elapsed() < Duration::from_secs(2) || given_back() < 5)
        {
            std::thread::sleep(Duration::from_millis(40));
            quiet.store(true, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
            quiet.store(false, Ordering::Relaxed);
        }
        stop.store(true, Ordering::Relaxed);
    });
    let given_back = given_back();
    let claimed: u64 = c.members.iter().map(|m| m.stats().homes_claimed).sum();
    println!(
        "grants {}, homes claimed {claimed}, given back {given_back}",
        grants.load(Ordering::Relaxed)
    );
    assert!(given_back >= 5, "the race was not run: {given_back} give-backs");
    for m in &c.members {
        assert_eq!(m.stats().lost_eio, 0);
    }
}

#[test]
fn a_fenced_member_gives_nothing_back() {
    let mem = MemCluster::new();
    let c = start_with(2, mem);
    let (a, b) = (&c.members[0], &c.members[1]);
    // Inode 2: taken out of A's table, its delete still on its way when A is fenced.
    c.mem.set_give_back_delay(Duration::from_millis(300));
    setlk(a, 2, who(1, 100), wr(0, 1)).unwrap();
    setlk(a, 2, who(1, 100), un(0, 1)).unwrap();
    let h2 = c.mem.home_of(InodeId(2)).unwrap();
    a.set_home_idle(IDLE);
    eventually("inode 2 taken out of the table", || a.stats().homes_now == 0);
    // Inode 1: idle in A's table when A is fenced.
    a.set_home_idle(Duration::ZERO);
    setlk(a, 1, who(1, 100), wr(0, 1)).unwrap();
    setlk(a, 1, who(1, 100), un(0, 1)).unwrap();
    let h1 = c.mem.home_of(InodeId(1)).unwrap();
    c.mem.fence(&c.dirs[0]);
    a.set_home_idle(IDLE);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(a.stats().homes_given_back, 0);
    assert_eq!(
        c.mem.home_of(InodeId(1)),
        Some(h1),
        "a fenced member deletes no key"
    );
    assert_eq!(
        c.mem.home_of(InodeId(2)),
        Some(h2),
        "a fenced member deletes no key"
    );
    // Nothing is served at A meanwhile.
    assert_eq!(setlk(a, 1, who(1, 100), wr(0, 1)), Err(EIO));
    // The keys go with A's lease; B claims both, A rejoins and locks through B.
    c.mem.set_give_back_delay(Duration::ZERO);
    c.mem.expire("m0");
    setlk(b, 1, who(2, 200), wr(0, 1)).unwrap();
    setlk(b, 2, who(2, 200), wr(0, 1)).unwrap();
    c.mem.rejoin(&c.dirs[0]);
    eventually("A serves again", || setlk(a, 3, who(3, 300), wr(0, 1)).is_ok());
    assert_eq!(setlk(a, 1, who(3, 300), wr(0, 1)), Err(Errno::EAGAIN));
    assert_eq!(setlk(a, 2, who(3, 300), wr(0, 1)), Err(Errno::EAGAIN));
    assert_eq!(a.stats().homes_given_back, 0);
    assert_eq!(
        a.stats().homes_now,
        1,
        "only inode 3: nothing came back from before the fence"
    );
}
