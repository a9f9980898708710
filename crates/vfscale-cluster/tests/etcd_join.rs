//! Joining: bad configurations and an unreachable etcd fail with clear errors, and a
//! node name held by a live member is refused.

mod etcd_support;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use etcd_support::{config, etcd, join};
use vfscale_cluster::etcd::{EtcdConfig, EtcdDirectory};
use vfscale_cluster::{ClusterError, Directory};

fn local(node: &str) -> EtcdConfig {
    EtcdConfig::new(
        vec!["http://127.0.0.1:1".into()],
        "test",
        node,
        ([127, 0, 0, 1], 1).into(),
    )
}

#[tokio::test]
async fn bad_configurations_are_refused_before_connecting() {
    let cases = [
        {
            let mut c = local("a");
            c.lease_ttl = Duration::from_secs(1);
            c
        },
        {
            let mut c = local("a");
            c.lease_ttl = Duration::from_millis(2500);
            c
        },
        local("a/b"),
        local(""),
        EtcdConfig::new(vec![], "test", "a", ([127, 0, 0, 1], 1).into()),
        EtcdConfig::new(
            vec!["http://127.0.0.1:1".into()],
            "x/y",
            "a",
            ([127, 0, 0, 1], 1).into(),
        ),
    ];
    for cfg in cases {
        match EtcdDirectory::join(cfg.clone()).await {
            Err(ClusterError::Config(msg)) => assert!(!msg.is_empty()),
            Err(e) => panic!("{cfg:?}: expected a configuration error, got {e}"),
            Ok(_) => panic!("{cfg:?}: joined"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_etcd_fails_within_the_ttl() {
    // A port that was free a moment ago: nothing answers there.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = local("a");
    cfg.endpoints = vec![format!("http://127.0.0.1:{port}")];
    cfg.lease_ttl = Duration::from_secs(2);
    let t = Instant::now();
    match EtcdDirectory::join(cfg).await {
        Err(ClusterError::Etcd(msg)) => assert!(msg.contains("lease"), "{msg}"),
        Err(e) => panic!("expected an etcd error, got {e}"),
        Ok(_) => panic!("joined a cluster that is not there"),
    }
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "gave up only after {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_held_by_a_live_member_is_refused() {
    let Some(etcd) = etcd() else { return };
    let a = join(&etcd, "a", 2).await;
    match EtcdDirectory::join(config(&etcd, "a", 2)).await {
        Err(ClusterError::Config(msg)) => assert!(msg.contains("\"a\""), "{msg}"),
        Err(e) => panic!("expected a configuration error, got {e}"),
        Ok(_) => panic!("two live members named a"),
    }
    assert!(!a.fenced(), "the first member is untouched");
    assert_eq!(a.members().len(), 1);
}
