//! Figures for the notes, not assertions (run with `--ignored --nocapture`): etcd
//! transaction latency on this machine, serial, one client, against a 3-member etcd on
//! loopback; and the directory's etcd requests per claim.

mod etcd_support;

use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use etcd_support::{etcd, join, wait_event};
use vfscale_cluster::{Directory, DirectoryEvent, InodeId};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn report(what: &str, mut samples: Vec<Duration>, wall: Duration) {
    samples.sort();
    println!(
        "{what}: n={} p50={:?} p99={:?} max={:?} rate={:.0}/s",
        samples.len(),
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
        samples[samples.len() - 1],
        samples.len() as f64 / wall.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn etcd_txn_latency_and_txns_per_claim() {
    let Some(etcd) = etcd() else { return };
    let n = 2000;
    let mut client = Client::connect(etcd.endpoints(), None).await.expect("connect");
    // Serial compare-and-swap on one key, as the lab's reference.
    let mut version = 0;
    let mut samples = Vec::with_capacity(n);
    let wall = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        let txn = Txn::new()
            .when([Compare::mod_revision("cas", CompareOp::Equal, version)])
            .and_then([TxnOp::put("cas", i.to_string(), None)]);
        let resp = client.txn(txn).await.expect("txn");
        assert!(resp.succeeded());
        version = resp.header().expect("header").revision();
        samples.push(t.elapsed());
    }
    report("serial CAS txn", samples, wall.elapsed());
    // Claims of fresh inodes through the directory.
    let a = join(&etcd, "a", 5).await;
    let before = a.stats().etcd_txns;
    let mut samples = Vec::with_capacity(n);
    let wall = Instant::now();
    for i in 0..n as u64 {
        let t = Instant::now();
        a.home(InodeId(i)).await.expect("claim");
        samples.push(t.elapsed());
    }
    report("claim (fresh inode)", samples, wall.elapsed());
    println!(
        "etcd requests per claim: {:.3}",
        (a.stats().etcd_txns - before) as f64 / n as f64
    );
    // Known homes: answered from the cache.
    let before = a.stats().etcd_txns;
    let wall = Instant::now();
    for i in 0..n as u64 {
        a.home(InodeId(i)).await.expect("cached");
    }
    println!(
        "home() of a known home: {:?} each, etcd requests {}",
        wall.elapsed() / n as u32,
        a.stats().etcd_txns - before
    );
    // A member that stops renewing (dropped without leaving): how long until the other
    // member hears its home is gone, for TTL 2 s.
    let b = join(&etcd, "b", 5).await;
    for round in 0..3 {
        let c = join(&etcd, "c", 2).await;
        let ino = InodeId(1_000_000 + round);
        c.home(ino).await.expect("c claims");
        let mut rx = b.events();
        drop(c);
        let t = Instant::now();
        wait_event(&mut rx, Duration::from_secs(10), "HomeGone", |e| {
            matches!(e, DirectoryEvent::HomeGone { ino: i, .. } if *i == ino).then_some(())
        })
        .await;
        println!(
            "TTL 2 s member dropped: HomeGone at the other after {:?}",
            t.elapsed()
        );
    }
}
