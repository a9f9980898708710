//! Fencing and recovery on a real 3-member etcd: a member that cannot renew its lease
//! fences itself within TTL minus the margin and rejoins with a new lease once etcd is
//! back; a watch that falls behind compaction re-lists.

mod etcd_support;

use std::time::{Duration, Instant};

use etcd_client::{Client, GetOptions};
use etcd_support::{etcd, eventually, join, wait_event};
use vfscale_cluster::{ClusterError, Directory, DirectoryEvent, InodeId};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_cannot_renew_fences_and_rejoins() {
    let Some(etcd) = etcd() else { return };
    let ttl = Duration::from_secs(2);
    let a = join(&etcd, "a", ttl.as_secs()).await;
    let old = a.me();
    let first = a.home(InodeId(1)).await.expect("claim");
    let mut rx = a.events();
    // Freeze every etcd member: no renewal can succeed.
    for i in 0..etcd.len() {
        etcd.pause(i).expect("SIGSTOP etcd");
    }
    let stopped = Instant::now();
    wait_event(&mut rx, ttl + Duration::from_secs(1), "Fenced", |e| {
        (*e == DirectoryEvent::Fenced).then_some(())
    })
    .await;
    let fenced_after = stopped.elapsed();
    println!("fenced {fenced_after:?} after etcd stopped (TTL {ttl:?})");
    assert!(a.fenced());
    // TTL - margin = 1.5 s after the last renewal sent, which was at most TTL/3 before.
    assert!(fenced_after <= ttl, "fenced only after {fenced_after:?}");
    assert_eq!(a.home(InodeId(1)).await, Err(ClusterError::Fenced));
    assert_eq!(
        a.cached_home(InodeId(1)),
        None,
        "a fenced member is no one's home"
    );
    assert_eq!(a.stats().fences, 1);
    for i in 0..etcd.len() {
        etcd.resume(i).expect("SIGCONT etcd");
    }
    let me = wait_event(&mut rx, Duration::from_secs(20), "Rejoined", |e| match e {
        DirectoryEvent::Rejoined(m) => Some(m.clone()),
        _ => None,
    })
    .await;
    assert_ne!(me.lease, old.lease, "a new lease");
    assert_eq!(me, a.me());
    assert!(!a.fenced());
    // The old lease is gone, and its home with it: the next claim is a new home.
    let again = a.home(InodeId(1)).await.expect("claim after rejoin");
    assert_eq!(again.member, me);
    assert!(again.token > first.token);
    assert_eq!(a.stats().fences, 1, "fenced once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_behind_compaction_relists() {
    let Some(etcd) = etcd() else { return };
    let a = join(&etcd, "a", 5).await;
    let b = join(&etcd, "b", 5).await;
    let c = join(&etcd, "c", 5).await;
    c.home(InodeId(200)).await.expect("c claims");
    eventually(Duration::from_secs(5), "a sees c's home", || {
        a.cached_home(InodeId(200)).is_some()
    })
    .await;
    a.hold_watch(true);
    let mut rx = a.events();
    let c_member = c.me();
    c.leave().await;
    for i in 1..=5 {
        b.home(InodeId(i)).await.expect("b claims");
    }
    let mut client = Client::connect(etcd.endpoints(), None).await.expect("connect");
    let rev = client
        .get("x", Some(GetOptions::new()))
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision();
    client.compact(rev, None).await.expect("compact");
    assert_eq!(
        a.cached_home(InodeId(1)),
        None,
        "a held watch has not seen b's claims"
    );
    a.hold_watch(false);
    eventually(Duration::from_secs(5), "a re-lists", || a.relists() == 1).await;
    eventually(Duration::from_secs(5), "a sees b's homes", || {
        (1..=5).all(|i| a.cached_home(InodeId(i)).is_some_and(|h| h.member == b.me()))
    })
    .await;
    // What went while the watch was behind is reported from the listing.
    let gone = wait_event(&mut rx, Duration::from_secs(5), "MemberGone(c)", |e| match e {
        DirectoryEvent::MemberGone(m) => Some(m.clone()),
        _ => None,
    })
    .await;
    assert_eq!(gone, c_member);
    assert_eq!(a.cached_home(InodeId(200)), None);
    // And the watch goes on after the re-list.
    b.home(InodeId(6)).await.expect("b claims");
    eventually(Duration::from_secs(5), "a sees a new claim", || {
        a.cached_home(InodeId(6)).is_some()
    })
    .await;
}
