//! A new home's reclaim: it serves an inode only once every member that holds its
//! lease has answered (a member cut off from it but alive may hold locks there), and a
//! claim that fails because this member was fenced meanwhile makes what its clients
//! held answer `EIO`, as a fence does.

mod service_support;

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use service_support::*;
use vfscale_cluster::memdir::{MemCluster, MemDirectory};
use vfscale_cluster::{ClusterLocks, Directory, InodeId};
use vfscale_locks::FcntlCmd;

/// A member whose registered peer address accepts connections and never answers (a
/// member cut off from the others, or stalled, that still renews its lease).
fn join_silent(
    mem: &Arc<MemCluster>,
    node: &'static str,
) -> (Arc<ClusterLocks>, Arc<MemDirectory>, TcpListener) {
    let hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr: SocketAddr = hole.local_addr().unwrap();
    let slot = Arc::new(Mutex::new(None));
    let (s, mm) = (slot.clone(), mem.clone());
    let m = ClusterLocks::with_directory("127.0.0.1:0".parse().unwrap(), move |_bound| async move {
        let d = mm.join(node, addr);
        *s.lock() = Some(d.clone());
        Ok(d as Arc<dyn Directory>)
    })
    .unwrap();
    let d = slot.lock().take().unwrap();
    (m, d, hole)
}

#[test]
fn a_new_home_waits_for_a_live_member_that_does_not_answer() {
    let mem = MemCluster::new();
    let c = start_with(2, mem.clone());
    let (a, b) = (&c.members[0], &c.members[1]);
    let ino = 77;
    setlk(a, ino, who(1, 100), wr(100, 1)).unwrap(); // home: a
                                                     // A third member's client holds [0,10) at a; then the member goes silent.
    let (m2, _d2, _hole) = join_silent(&mem, "m2");
    // m2 reaches a through its own connection (its address is only what others dial).
    setlk(&m2, ino, who(1, 300), wr(0, 10)).unwrap();
    c.mem.fence(&c.dirs[0]);
    c.mem.expire("m0");
    // b claims the inode and must not serve it while m2, alive, has not answered.
    let (_call, rx) = fcntl_start(b, ino, who(1, 200), file(1), FcntlCmd::SetLk, wr(0, 10));
    match rx.recv_timeout(Duration::from_millis(2500)) {
        Err(_) => {}
        Ok(r) => assert_ne!(
            r.map(|_| ()),
            Ok(()),
            "granted while m2 may hold [0,10): a double grant"
        ),
    }
    // Once m2's lease ends, what it held goes with it and b serves the inode.
    c.mem.expire("m2");
    assert_eq!(setlk(b, ino, who(1, 200), wr(0, 10)), Ok(()));
}

#[test]
fn a_fence_during_a_claim_makes_the_shadow_lost() {
    let mem = MemCluster::new();
    let c = start_with(3, mem.clone());
    let (a, b, m2) = (&c.members[0], &c.members[1], &c.members[2]);
    let ino = 78;
    setlk(a, ino, who(1, 100), wr(100, 1)).unwrap(); // home: a
    setlk(b, ino, who(1, 200), wr(0, 10)).unwrap(); // in b's shadow
    let (_m3, _d3, _hole) = join_silent(&mem, "m3"); // answers no reclaim: claims wait on it
    c.mem.expire("m0"); // b claims again: takes its shadow, waits on m3
    eventually("b claimed the inode", || {
        c.mem.home_of(InodeId(ino)).is_some_and(|h| h.member.node == "m1")
    });
    std::thread::sleep(Duration::from_millis(200));
    c.mem.fence(&c.dirs[1]);
    c.mem.expire("m1");
    c.mem.expire("m3"); // the claims no longer wait on m3
    std::thread::sleep(Duration::from_millis(300));
    c.mem.rejoin(&c.dirs[1]);
    assert_eq!(setlk(m2, ino, who(1, 300), wr(0, 10)), Ok(()));
    assert_eq!(
        setlk(b, ino, who(1, 200), rd(0, 1)),
        Err(EIO),
        "b's owner lost [0,10) with b's lease and must be told"
    );
}
