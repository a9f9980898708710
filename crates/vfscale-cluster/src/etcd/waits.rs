//! The wait-for graph across members: each member publishes its edges under
//! `waits/<node>`, and every publication rewrites `waits-version` under a compare on its
//! mod revision, so publications are serialised cluster-wide: of two edges that close
//! one cycle, the one committed second read the first before it committed.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use super::endpoints::{Failure, Retries, ATTEMPT};
use super::keys::{decode_edges, encode_edges};
use super::Shared;
use crate::wait_graph::find_cycles;
use crate::{ClusterError, PublishedEdge, WaitCycle, WaitEdge};

/// Pause between attempts after an error.
const RETRY: Duration = Duration::from_millis(50);

/// Replaces this member's edges with `current` unless an edge of `new` closes a cycle.
pub(crate) async fn publish(
    shared: &Shared,
    current: Vec<WaitEdge>,
    new: Vec<WaitEdge>,
) -> Result<Vec<WaitCycle>, ClusterError> {
    let me = shared.cfg.node.as_str();
    let mut retries = Retries::new(shared.cfg.lease_ttl);
    loop {
        retries.next(&shared.fence, format_args!("publishing wait-for edges"))?;
        // The graph and its version at one revision.
        let prefix = shared.keys.waits_prefix();
        let read = shared.request(ATTEMPT, |mut c| async move {
            c.get(prefix, Some(GetOptions::new().with_prefix())).await
        });
        let resp = match read.await {
            Ok(resp) => resp,
            Err(f) => {
                retries.last_error = format!("reading the wait graph: {f}");
                pause_after(&f).await;
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
        match shared
            .request(ATTEMPT, |mut c| async move { c.txn(txn).await })
            .await
        {
            Ok(resp) if resp.succeeded() => {
                shared.counters.wait_publications.inc();
                return Ok(Vec::new());
            }
            // Another member published in between: read its edges and check again.
            Ok(_) => {}
            Err(f) if f.lease_not_found() => return Err(ClusterError::Fenced),
            Err(f) => {
                retries.last_error = f.to_string();
                pause_after(&f).await;
            }
        }
    }
}

/// An error answer is retried after a pause; a timeout has paused already.
async fn pause_after(f: &Failure) {
    if !matches!(f, Failure::Timeout(_)) {
        tokio::time::sleep(RETRY).await;
    }
}
