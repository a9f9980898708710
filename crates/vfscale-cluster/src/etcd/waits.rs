//! The wait-for graph across members: each member publishes its edges under
//! `waits/<node>`, and every publication rewrites `waits-version` under a compare on its
//! mod revision, so publications are serialised cluster-wide: of two edges that close
//! one cycle, the one committed second read the first before it committed.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use super::fence::now_nanos;
use super::keys::{decode_edges, encode_edges};
use super::lease::{etcd_error, lease_not_found};
use super::Shared;
use crate::{ClusterError, PublishedEdge, WaitCycle, WaitEdge};

/// How long one etcd request may take before it is retried.
const ATTEMPT: Duration = Duration::from_secs(1);
/// Pause between attempts after an error.
const RETRY: Duration = Duration::from_millis(50);

/// Replaces this member's edges with `current` unless an edge of `new` closes a cycle.
pub(crate) async fn publish(
    shared: &Shared,
    current: Vec<WaitEdge>,
    new: Vec<WaitEdge>,
) -> Result<Vec<WaitCycle>, ClusterError> {
    let me = shared.cfg.node.as_str();
    let give_up = now_nanos() + shared.cfg.lease_ttl.as_nanos() as u64;
    let mut last_error = String::from("no attempt");
    loop {
        if shared.fence.fenced() {
            return Err(ClusterError::Fenced);
        }
        if now_nanos() >= give_up {
            return Err(ClusterError::Etcd(format!(
                "publishing wait-for edges: {last_error}"
            )));
        }
        // The graph and its version at one revision.
        let mut kv = shared.kv();
        let read = kv.get(shared.keys.waits_prefix(), Some(GetOptions::new().with_prefix()));
        let resp = match tokio::time::timeout(ATTEMPT, read).await {
            Ok(Ok(resp)) => resp,
            Ok(Err(e)) => {
                last_error = etcd_error("reading the wait graph", &e).to_string();
                tokio::time::sleep(RETRY).await;
                continue;
            }
            Err(_) => {
                last_error = format!("no answer within {ATTEMPT:?}");
                continue;
            }
        };
        let version_key = shared.keys.waits_version();
        let mut version = 0;
        let mut graph = Vec::new();
        for kv in resp.kvs() {
            let Ok(key) = kv.key_str() else { continue };
            if key == version_key {
                version = kv.mod_revision();
            } else if let Some(node) = shared.keys.parse_waits_key(key).filter(|n| *n != me) {
                graph.extend(decode_edges(kv.value()).into_iter().map(|edge| PublishedEdge {
                    edge,
                    node: node.to_string(),
                }));
            }
        }
        graph.extend(current.iter().map(|&edge| PublishedEdge {
            edge,
            node: me.to_string(),
        }));
        let cycles = find_cycles(&graph, &new);
        if !cycles.is_empty() {
            return Ok(cycles);
        }
        let mine = shared.keys.waits(me);
        let write = if current.is_empty() {
            TxnOp::delete(mine.as_str(), None)
        } else {
            let lease = PutOptions::new().with_lease(shared.lease());
            TxnOp::put(mine.as_str(), encode_edges(&current), Some(lease))
        };
        let txn = Txn::new()
            .when([Compare::mod_revision(
                version_key.as_str(),
                CompareOp::Equal,
                version,
            )])
            .and_then([write, TxnOp::put(version_key.as_str(), me, None)]);
        match tokio::time::timeout(ATTEMPT, shared.kv().txn(txn)).await {
            Ok(Ok(resp)) if resp.succeeded() => {
                shared.counters.wait_publications.inc();
                return Ok(Vec::new());
            }
            // Another member published in between: read its edges and check again.
            Ok(Ok(_)) => {}
            Ok(Err(e)) if lease_not_found(&e) => return Err(ClusterError::Fenced),
            Ok(Err(e)) => {
                last_error = etcd_error("publishing wait-for edges", &e).to_string();
                tokio::time::sleep(RETRY).await;
            }
            Err(_) => last_error = format!("no answer within {ATTEMPT:?}"),
        }
    }
}

/// For each edge of `new` that closes a cycle in `graph`, the cycle: the path from the
/// edge's blocker back to its waiter.
pub(crate) fn find_cycles(graph: &[PublishedEdge], new: &[WaitEdge]) -> Vec<WaitCycle> {
    let mut out: HashMap<u64, Vec<&PublishedEdge>> = HashMap::new();
    for e in graph {
        out.entry(e.edge.waiter).or_default().push(e);
    }
    new.iter()
        .filter_map(|&closing| {
            let path = path_between(&out, closing.blocker, closing.waiter)?;
            Some(WaitCycle {
                closing,
                path: path.into_iter().cloned().collect(),
            })
        })
        .collect()
}

/// A path of edges from `from` to `to` (depth first; owners wait for few others).
fn path_between<'g>(
    out: &HashMap<u64, Vec<&'g PublishedEdge>>,
    from: u64,
    to: u64,
) -> Option<Vec<&'g PublishedEdge>> {
    let mut seen = HashSet::from([from]);
    // Each frame: an owner and the index of its next edge to try.
    let mut stack: Vec<(u64, usize)> = vec![(from, 0)];
    let mut path: Vec<&PublishedEdge> = Vec::new();
    while let Some(&mut (owner, ref mut next)) = stack.last_mut() {
        let edges = out.get(&owner).map_or(&[][..], Vec::as_slice);
        let Some(&e) = edges.get(*next) else {
            stack.pop();
            path.pop();
            continue;
        };
        *next += 1;
        if e.edge.blocker == to {
            path.push(e);
            return Some(path);
        }
        if seen.insert(e.edge.blocker) {
            path.push(e);
            stack.push((e.edge.blocker, 0));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pe(waiter: u64, blocker: u64, node: &str) -> PublishedEdge {
        PublishedEdge {
            edge: WaitEdge { waiter, blocker },
            node: node.into(),
        }
    }

    #[test]
    fn a_closing_edge_gets_the_path_back_to_its_waiter() {
        // 1 -> 2 (a), 2 -> 3 (b), 3 -> 9 (b, a dead end tried first), 3 -> 1 closes.
        let graph = vec![pe(1, 2, "a"), pe(2, 4, "b"), pe(2, 3, "b"), pe(4, 9, "a")];
        let closing = WaitEdge {
            waiter: 3,
            blocker: 1,
        };
        let cycles = find_cycles(&graph, &[closing]);
        assert_eq!(
            cycles,
            vec![WaitCycle {
                closing,
                path: vec![pe(1, 2, "a"), pe(2, 3, "b")]
            }]
        );
        assert!(find_cycles(
            &graph,
            &[WaitEdge {
                waiter: 9,
                blocker: 5
            }]
        )
        .is_empty());
    }

    #[test]
    fn loops_that_do_not_reach_the_waiter_end() {
        let graph = vec![pe(1, 2, "a"), pe(2, 1, "b")];
        assert!(find_cycles(
            &graph,
            &[WaitEdge {
                waiter: 7,
                blocker: 1
            }]
        )
        .is_empty());
    }
}
