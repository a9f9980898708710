//! Homes on a real 3-member etcd: claim races, homes that go with their lease, fencing
//! tokens that grow, claims that go on when the etcd leader dies, and homes given back.

mod etcd_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_support::{etcd, eventually, join, wait_event};
use vfscale_cluster::etcd::EtcdDirectory;
use vfscale_cluster::{Directory, DirectoryEvent, Home, InodeId};
use vfscale_conformance::etcd::EtcdCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_race_makes_one_home_that_both_see() {
    let Some(etcd) = etcd() else { return };
    let a = join(&etcd, "a", 5).await;
    let b = join(&etcd, "b", 5).await;
    let inodes = 40u64;
    let before = a.stats().etcd_txns + b.stats().etcd_txns;
    for i in 0..inodes {
        let ino = InodeId(i);
        let (ha, hb) = tokio::join!(a.home(ino), b.home(ino));
        let (ha, hb) = (ha.expect("a claims"), hb.expect("b claims"));
        assert_eq!(ha, hb, "inode {i}: both must see one home and one token");
        assert!(ha.member.node == "a" || ha.member.node == "b");
        assert!(ha.token > 0);
    }
    let txns = a.stats().etcd_txns + b.stats().etcd_txns - before;
    println!(
        "etcd txns per contended claim (two members race): {:.2}",
        txns as f64 / inodes as f64 / 2.0
    );
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!(sa.claims_won + sb.claims_won, inodes, "{sa:?} {sb:?}");
    // The cache answers once the watch has caught up: no etcd traffic then.
    eventually(Duration::from_secs(5), "both caches agree", || {
        (0..inodes).all(|i| {
            a.cached_home(InodeId(i)).is_some() && a.cached_home(InodeId(i)) == b.cached_home(InodeId(i))
        })
    })
    .await;
    let before = a.stats().etcd_txns;
    for i in 0..inodes {
        a.home(InodeId(i)).await.expect("cached home");
    }
    assert_eq!(a.stats().etcd_txns, before, "a known home costs no etcd request");
    let names: Vec<String> = a.members().into_iter().map(|m| m.node).collect();
    assert_eq!(names, ["a", "b"]);
    // An uncontended claim: one txn.
    let before = a.stats().etcd_txns;
    a.home(InodeId(1000)).await.expect("claim");
    println!(
        "etcd txns per uncontended claim: {}",
        a.stats().etcd_txns - before
    );
    assert_eq!(a.stats().etcd_txns - before, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_home_goes_with_its_lease_and_the_next_token_is_larger() {
    let Some(etcd) = etcd() else { return };
    let ino = InodeId(7);
    let (a, b, first) = claimed_by_a(&etcd, ino).await;
    let seen = b.home(ino).await.expect("b learns");
    assert_eq!(seen, first);
    let a_member = a.me();
    let mut rx = b.events();
    a.leave().await;
    assert!(a.fenced(), "a member that left grants nothing");
    let gone = wait_event(&mut rx, Duration::from_secs(5), "MemberGone(a)", |e| match e {
        DirectoryEvent::MemberGone(m) if m.node == "a" => Some(m.clone()),
        _ => None,
    })
    .await;
    assert_eq!(gone, a_member);
    eventually(Duration::from_secs(5), "inode 7 without a cached home", || {
        b.cached_home(ino).is_none()
    })
    .await;
    let mut client = etcd_client::Client::connect(etcd.endpoints(), None)
        .await
        .expect("connect");
    let key = client.get("/vfscale/test/homes/7", None).await.expect("get");
    assert!(key.kvs().is_empty(), "the home's key went with its lease");
    let second = b.home(ino).await.expect("b claims");
    assert_eq!(second.member, b.me());
    assert!(
        second.token > first.token,
        "tokens grow: {} then {}",
        first.token,
        second.token
    );
    // The same name joins again at once: its old lease was revoked.
    let a2 = join(&etcd, "a", 5).await;
    assert_ne!(a2.me().lease, a_member.lease);
    assert_eq!(a2.home(ino).await.expect("a2 learns"), second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn home_gone_arrives_at_the_other_member() {
    let Some(etcd) = etcd() else { return };
    let a = join(&etcd, "a", 5).await;
    let b = join(&etcd, "b", 5).await;
    let first = a.home(InodeId(9)).await.expect("a claims");
    let mut rx = b.events();
    a.leave().await;
    assert_eq!(home_gone(&mut rx, InodeId(9)).await, first.token);
}

/// Members `a` and `b`, and `ino` claimed by `a`.
async fn claimed_by_a(etcd: &EtcdCluster, ino: InodeId) -> (Arc<EtcdDirectory>, Arc<EtcdDirectory>, Home) {
    let a = join(etcd, "a", 5).await;
    let b = join(etcd, "b", 5).await;
    let first = a.home(ino).await.expect("a claims");
    assert_eq!(first.member, a.me());
    (a, b, first)
}

/// The token of the next `HomeGone` of `ino`.
async fn home_gone(rx: &mut tokio::sync::broadcast::Receiver<DirectoryEvent>, ino: InodeId) -> i64 {
    wait_event(rx, Duration::from_secs(5), "HomeGone", |e| match e {
        DirectoryEvent::HomeGone { ino: i, token } if *i == ino => Some(*token),
        _ => None,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_go_on_when_the_etcd_leader_is_killed() {
    let Some(mut etcd) = etcd() else { return };
    let a = join(&etcd, "a", 5).await;
    let b = join(&etcd, "b", 5).await;
    a.home(InodeId(0)).await.expect("warm");
    let leader = etcd.leader().expect("a leader");
    etcd.kill(leader);
    let killed = Instant::now();
    let mut worst = Duration::ZERO;
    let mut n = 0u64;
    while killed.elapsed() < Duration::from_secs(4) {
        n += 1;
        let t = Instant::now();
        let ino = InodeId(100 + n);
        let (ha, hb) = tokio::join!(a.home(ino), b.home(ino));
        let (ha, hb) = (ha.expect("a claims after the leader died"), hb.expect("b claims"));
        assert_eq!(ha, hb);
        worst = worst.max(t.elapsed());
    }
    println!("leader killed: {n} claim races in 4 s, the slowest took {worst:?}");
    assert!(worst < Duration::from_secs(5), "a claim stalled {worst:?}");
    assert!(
        !a.fenced() && !b.fenced(),
        "an etcd election must not fence members"
    );
    assert_eq!(a.stats().fences + b.stats().fences, 0);
}

/// Stops the first etcd member (where every client starts) with `stop`: claims go on,
/// the watch still delivers, and the keep-alive moves on before the members fence.
async fn first_endpoint_lost(stop: impl FnOnce(&mut EtcdCluster)) {
    let Some(mut etcd) = etcd() else { return };
    let a = join(&etcd, "a", 5).await;
    let b = join(&etcd, "b", 5).await;
    a.home(InodeId(1)).await.expect("warm");
    stop(&mut etcd);
    let h = b
        .home(InodeId(2))
        .await
        .expect("b claims after its endpoint stopped");
    eventually(Duration::from_secs(10), "a's watch sees b's claim", || {
        a.cached_home(InodeId(2)) == Some(h.clone())
    })
    .await;
    // Past TTL minus the margin (4 s): only a renewal through another endpoint keeps a.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(!a.fenced() && !b.fenced());
    assert_eq!(a.stats().fences + b.stats().fences, 0);
    assert_eq!(a.home(InodeId(1)).await.expect("still home").member, a.me());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_first_endpoint_is_left_for_the_others() {
    first_endpoint_lost(|etcd| etcd.kill(0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_first_endpoint_is_left_for_the_others() {
    // SIGSTOP: the connection stays up and nothing answers on it (Drop reaps it).
    first_endpoint_lost(|etcd| etcd.pause(0).expect("SIGSTOP")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_home_given_back_goes_and_a_newer_claim_is_never_deleted() {
    let Some(etcd) = etcd() else { return };
    let ino = InodeId(11);
    let (a, b, first) = claimed_by_a(&etcd, ino).await;
    let mut rx = b.events();
    a.give_back(ino, first.token).await.expect("given back");
    assert_eq!(home_gone(&mut rx, ino).await, first.token);
    eventually(Duration::from_secs(5), "a no longer shows its claim", || {
        a.cached_home(ino).is_none()
    })
    .await;
    let second = b.home(ino).await.expect("b claims anew");
    assert_eq!(second.member, b.me());
    assert!(second.token > first.token);
    // Giving back the old claim again deletes nothing: b's key has a newer token.
    a.give_back(ino, first.token).await.expect("answered");
    let mut client = etcd_client::Client::connect(etcd.endpoints(), None)
        .await
        .expect("connect");
    let key = client.get("/vfscale/test/homes/11", None).await.expect("get");
    assert_eq!(
        key.kvs().first().map(|kv| kv.create_revision()),
        Some(second.token)
    );
}
