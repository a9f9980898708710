//! What the etcd directory tests share: a 3-member etcd, members joining it, and waiting
//! for events.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use vfscale_cluster::etcd::{EtcdConfig, EtcdDirectory};
use vfscale_cluster::DirectoryEvent;
use vfscale_conformance::etcd::EtcdCluster;

/// A fresh 3-member etcd, or `None` after printing why the test is skipped.
pub fn etcd() -> Option<EtcdCluster> {
    if let Err(why) = EtcdCluster::available() {
        println!("SKIP: {why}");
        return None;
    }
    Some(EtcdCluster::start(3).expect("start a 3-member etcd"))
}

/// The configuration of member `node` (its peer address is made up: nothing dials it).
pub fn config(etcd: &EtcdCluster, node: &str, ttl_secs: u64) -> EtcdConfig {
    let port = 40000 + node.bytes().map(u16::from).sum::<u16>();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut cfg = EtcdConfig::new(etcd.endpoints(), "test", node, addr);
    cfg.lease_ttl = Duration::from_secs(ttl_secs);
    cfg
}

/// Joins member `node`.
pub async fn join(etcd: &EtcdCluster, node: &str, ttl_secs: u64) -> Arc<EtcdDirectory> {
    EtcdDirectory::join(config(etcd, node, ttl_secs))
        .await
        .expect("join")
}

/// The first event `pick` accepts within `within`, or a panic naming `what`.
pub async fn wait_event<T>(
    rx: &mut broadcast::Receiver<DirectoryEvent>,
    within: Duration,
    what: &str,
    mut pick: impl FnMut(&DirectoryEvent) -> Option<T>,
) -> T {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Ok(e)) => {
                if let Some(t) = pick(&e) {
                    return t;
                }
            }
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(e)) => panic!("events closed while waiting for {what}: {e}"),
            Err(_) => panic!("no {what} within {within:?}"),
        }
    }
}

/// Polls `cond` every 20 ms until it holds, or panics naming `what` after `within`.
pub async fn eventually(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not {what} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
