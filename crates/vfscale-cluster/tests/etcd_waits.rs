//! The wait-for graph on a real 3-member etcd: publications are serialised, so the edge
//! that closes a cycle sees the others and is not published.

mod etcd_support;

use etcd_client::{Client, GetOptions};
use etcd_support::{etcd, join};
use vfscale_cluster::{Directory, PublishedEdge, WaitCycle, WaitEdge};

fn edge(waiter: u64, blocker: u64) -> WaitEdge {
    WaitEdge { waiter, blocker }
}

async fn published(client: &mut Client, node: &str) -> Option<String> {
    let resp = client
        .get(format!("/vfscale/test/waits/{node}"), Some(GetOptions::new()))
        .await
        .expect("get");
    resp.kvs()
        .first()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_edge_that_closes_a_cycle_gets_it_and_is_not_published() {
    let Some(etcd) = etcd() else { return };
    let a = join(&etcd, "a", 5).await;
    let b = join(&etcd, "b", 5).await;
    let mut client = Client::connect(etcd.endpoints(), None).await.expect("connect");
    let ab = edge(1, 2);
    let ba = edge(2, 1);
    assert_eq!(
        a.publish_waits(vec![ab], vec![ab]).await.expect("a publishes"),
        vec![]
    );
    let cycles = b.publish_waits(vec![ba], vec![ba]).await.expect("b publishes");
    assert_eq!(
        cycles,
        vec![WaitCycle {
            closing: ba,
            path: vec![PublishedEdge {
                edge: ab,
                node: "a".into()
            }]
        }]
    );
    assert_eq!(
        published(&mut client, "b").await,
        None,
        "a cycle publishes nothing"
    );
    // Told the cycle is stale, the member publishes with no new edge.
    assert_eq!(
        b.publish_waits(vec![ba], vec![]).await.expect("b republishes"),
        vec![]
    );
    assert_eq!(published(&mut client, "b").await.as_deref(), Some("[[2,1]]"));
    assert_eq!(b.stats().wait_publications, 1);
    // An empty list withdraws the edges.
    a.publish_waits(vec![], vec![]).await.expect("a withdraws");
    b.publish_waits(vec![], vec![]).await.expect("b withdraws");
    assert_eq!(published(&mut client, "a").await, None);
    // A race: of two edges closing one cycle, exactly one gets the cycle.
    for round in 0..10u64 {
        let (x, y) = (edge(100 + round, 200 + round), edge(200 + round, 100 + round));
        let (ra, rb) = tokio::join!(
            a.publish_waits(vec![x], vec![x]),
            b.publish_waits(vec![y], vec![y])
        );
        let (ra, rb) = (ra.expect("a"), rb.expect("b"));
        assert_eq!(ra.len() + rb.len(), 1, "round {round}: {ra:?} {rb:?}");
        a.publish_waits(vec![], vec![]).await.expect("a withdraws");
        b.publish_waits(vec![], vec![]).await.expect("b withdraws");
    }
    // Edges go with their member's lease.
    a.publish_waits(vec![ab], vec![ab]).await.expect("a publishes");
    a.leave().await;
    assert_eq!(published(&mut client, "a").await, None);
    assert_eq!(
        b.publish_waits(vec![ba], vec![ba]).await.expect("b publishes"),
        vec![]
    );
}
