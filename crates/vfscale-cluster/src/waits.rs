//! Deadlock detection across members: this member publishes the wait-for edges of its
//! homes' POSIX waits that last (the directory serialises publications and refuses a
//! new edge that closes a cycle); a cycle is confirmed with the members whose edges it
//! uses (`IsWaiting`) before its closing wait answers `EDEADLK` (that wait alone: the
//! owner's other waits go on).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::events::EDEADLK;
use crate::peer::pb;
use crate::service::Service;
use crate::stats::Counters;
use crate::{WaitCycle, WaitEdge};
use vfscale_locks::PosixWaitId;

/// A wait is published once it has lasted this long: most waits end sooner, and
/// publishing costs an etcd transaction.
const PUBLISH_AFTER: Duration = Duration::from_millis(2);

/// How often the published edges are compared with the current ones while some are
/// published (edges of ended waits are withdrawn in one publication).
const REPUBLISH_EVERY: Duration = Duration::from_millis(5);

/// The edges of this member's waits that have lasted [`PUBLISH_AFTER`].
fn lasting_edges(svc: &Service) -> Vec<WaitEdge> {
    let now = Instant::now();
    let mut v: Vec<WaitEdge> = svc
        .mgr
        .posix_wait_edges()
        .iter()
        .filter(|e| now.duration_since(e.blocked_at) >= PUBLISH_AFTER)
        .map(|e| WaitEdge {
            waiter: e.waiter.0,
            blocker: e.blocker.0,
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// The waits that may have closed a cycle: the closing owner's waits for the closing
/// blocker, newest first; the newest one that is registered is answered. Linux refuses
/// the request that would close a cycle, not the owner's other waits (a process whose
/// threads wait on other locks keeps those waits).
fn closing_waits(svc: &Service, closing: WaitEdge) -> Vec<PosixWaitId> {
    let mut v: Vec<_> = svc
        .mgr
        .posix_wait_edges()
        .into_iter()
        .filter(|e| e.waiter.0 == closing.waiter && e.blocker.0 == closing.blocker)
        .collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.blocked_at));
    v.into_iter().map(|e| e.wait).collect()
}

/// Whether every edge of the cycle other than the closing one is still a wait.
async fn confirm(svc: &Service, c: &WaitCycle) -> bool {
    let me = svc.me();
    let members = svc.dir.members();
    for pe in &c.path {
        let current = if pe.node == me.node {
            svc.mgr
                .posix_wait_edges()
                .iter()
                .any(|e| e.waiter.0 == pe.edge.waiter && e.blocker.0 == pe.edge.blocker)
        } else {
            let Some(m) = members.iter().find(|m| m.node == pe.node) else {
                return false;
            };
            let Ok(mut client) = svc.peers.client(m) else {
                return false;
            };
            let ask = pb::IsWaitingRequest {
                waiter: pe.edge.waiter,
                blocker: pe.edge.blocker,
            };
            matches!(
                tokio::time::timeout(Duration::from_secs(1), client.is_waiting(ask)).await,
                Ok(Ok(r)) if r.get_ref().waiting
            )
        };
        if !current {
            return false;
        }
    }
    true
}

/// The publisher: runs while the service runs.
pub(crate) async fn run(svc: Arc<Service>) {
    let mut published: Vec<WaitEdge> = Vec::new();
    loop {
        if published.is_empty() {
            svc.waits_kick.notified().await;
        }
        tokio::time::sleep(if published.is_empty() {
            PUBLISH_AFTER
        } else {
            REPUBLISH_EVERY
        })
        .await;
        let edges = lasting_edges(&svc);
        if edges == published {
            continue;
        }
        let new: Vec<WaitEdge> = edges.iter().filter(|e| !published.contains(e)).copied().collect();
        Counters::bump(&svc.counters.wait_publications);
        match svc.dir.publish_waits(edges.clone(), new).await {
            Ok(cycles) if cycles.is_empty() => published = edges,
            Ok(cycles) => {
                let mut answered = Vec::new();
                for c in &cycles {
                    if confirm(&svc, c).await {
                        // The newest wait that is registered (a wait's call registers it
                        // just after it blocks).
                        let refused = closing_waits(&svc, c.closing)
                            .into_iter()
                            .any(|id| svc.waiting.interrupt_where(EDEADLK, |w| w.wait == Some(id)) > 0);
                        if refused {
                            Counters::bump(&svc.counters.deadlocks_across);
                            tracing::info!(
                                waiter = c.closing.waiter,
                                blocker = c.closing.blocker,
                                "EDEADLK across members"
                            );
                        }
                        // Left out of what is published either way: a wait not answered
                        // (not registered yet) is new again next round, and checked.
                        answered.push(c.closing);
                    } else {
                        Counters::bump(&svc.counters.cycles_unconfirmed);
                    }
                }
                // Publish what is left, claiming no new edge: a cycle a stale edge made
                // is not one, and the member whose edge is current again will close it.
                let rest: Vec<WaitEdge> = edges.into_iter().filter(|e| !answered.contains(e)).collect();
                Counters::bump(&svc.counters.wait_publications);
                if svc.dir.publish_waits(rest.clone(), Vec::new()).await.is_ok() {
                    published = rest;
                }
            }
            Err(e) => {
                tracing::debug!(%e, "wait publication failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
