//! The lock service over a real 3-member etcd: conflicts and a wait across two members,
//! EDEADLK across them, and a failover when the home leaves (SKIP without etcd).

mod service_support;

use std::time::{Duration, Instant};

use service_support::*;
use vfscale_cluster::{ClusterConfig, ClusterLocks, InodeId};
use vfscale_conformance::etcd::EtcdCluster;
use vfscale_locks::{Errno, FcntlCmd};

fn member(etcd: &EtcdCluster, node: &str) -> std::sync::Arc<ClusterLocks> {
    let mut cfg = ClusterConfig::new(etcd.endpoints());
    cfg.cluster_name = "svc".into();
    cfg.node = Some(node.into());
    cfg.lease_ttl = Duration::from_secs(2);
    ClusterLocks::join(cfg).expect("join")
}

/// A fresh 3-member etcd, or `None` after printing why the test is skipped.
fn etcd() -> Option<EtcdCluster> {
    if let Err(why) = EtcdCluster::available() {
        println!("SKIP: {why}");
        return None;
    }
    Some(EtcdCluster::start(3).expect("etcd"))
}

#[test]
fn two_members_over_etcd() {
    let Some(etcd) = etcd() else { return };
    let (a, b) = (member(&etcd, "a"), member(&etcd, "b"));
    setlk(&a, 1, who(1, 100), wr(0, 10)).unwrap();
    assert_eq!(setlk(&b, 1, who(1, 200), wr(5, 1)), Err(Errno::EAGAIN));
    assert_eq!(getlk(&b, 1, who(1, 200), wr(5, 1)).l_pid, 100);
    let (_w, rx) = fcntl_start(&b, 1, who(1, 200), file(1), FcntlCmd::SetLkW, wr(5, 1));
    still_waiting(&rx);
    a.posix_remove_owner(InodeId(1), who(1, 100));
    rx.recv_timeout(ANSWER).unwrap().unwrap();
    // 2000 remote lock/unlock: no etcd traffic beyond the claims.
    let txns = b.stats().directory.etcd_txns + a.stats().directory.etcd_txns;
    let t = Instant::now();
    for i in 0..1000 {
        setlk(&b, 1, who(2, 201), wr(100 + i, 1)).unwrap();
        setlk(&b, 1, who(2, 201), un(100 + i, 1)).unwrap();
    }
    let per_s = 2000.0 / t.elapsed().as_secs_f64();
    let after = b.stats().directory.etcd_txns + a.stats().directory.etcd_txns;
    println!("remote lock calls over etcd-homed inode: {per_s:.0}/s; etcd txns {txns} -> {after}");
    assert!(after - txns <= 2, "{txns} -> {after}");

    // EDEADLK across members: X homed at a, Y at b.
    setlk(&a, 10, who(5, 500), wr(0, 1)).unwrap();
    setlk(&b, 11, who(6, 600), wr(0, 1)).unwrap();
    let (_x, rxa) = fcntl_start(&a, 11, who(5, 500), file(5), FcntlCmd::SetLkW, wr(0, 1));
    still_waiting(&rxa);
    let (_y, rxb) = fcntl_start(&b, 10, who(6, 600), file(6), FcntlCmd::SetLkW, wr(0, 1));
    let end = Instant::now() + ANSWER;
    let got = loop {
        if let Ok(r) = rxa.try_recv() {
            break r;
        }
        if let Ok(r) = rxb.try_recv() {
            break r;
        }
        assert!(Instant::now() < end, "no EDEADLK");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(got.map(|_| ()), Err(Errno::EDEADLK));

    // The home of inode 20 leaves; b's waiter is granted at the new home, its held lock
    // reclaimed.
    setlk(&a, 20, who(7, 700), wr(0, 1)).unwrap();
    setlk(&b, 20, who(8, 800), wr(50, 1)).unwrap();
    let (_z, rxz) = fcntl_start(&b, 20, who(9, 900), file(9), FcntlCmd::SetLkW, wr(0, 1));
    still_waiting(&rxz);
    let t = Instant::now();
    a.leave();
    rxz.recv_timeout(ANSWER).unwrap().unwrap();
    println!("granted {:?} after the home left", t.elapsed());
    assert_eq!(setlk(&b, 20, who(10, 1000), wr(50, 1)), Err(Errno::EAGAIN));
    println!("b: {:?}", b.stats());
}

#[test]
fn an_idle_home_is_given_back_over_etcd() {
    let Some(etcd) = etcd() else { return };
    let (a, b) = (member(&etcd, "a"), member(&etcd, "b"));
    a.set_home_idle(Duration::from_millis(200));
    setlk(&a, 5, who(1, 100), wr(0, 10)).unwrap();
    let first = a.directory().cached_home(InodeId(5)).expect("homed at a");
    setlk(&a, 5, who(1, 100), un(0, 10)).unwrap();
    eventually("a gives inode 5 back", || a.stats().homes_given_back == 1);
    assert_eq!(a.stats().homes_now, 0);
    eventually("b learns it has no home", || {
        b.directory().cached_home(InodeId(5)).is_none()
    });
    // The next lock, from b, claims it anew (a larger token) and is granted.
    setlk(&b, 5, who(2, 200), wr(0, 10)).unwrap();
    let second = b.directory().cached_home(InodeId(5)).expect("homed at b");
    assert_eq!(second.member.node, "b");
    assert!(second.token > first.token);
    assert_eq!(setlk(&a, 5, who(1, 100), wr(5, 1)), Err(Errno::EAGAIN));
    // Held at b, it stays there; a's next idle sweeps find nothing to give back.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(b.directory().cached_home(InodeId(5)), Some(second));
    assert_eq!(a.stats().homes_given_back, 1);
}
