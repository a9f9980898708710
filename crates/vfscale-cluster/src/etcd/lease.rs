//! The lease: keep-alive every TTL/3, fencing when it cannot be renewed in time, and
//! rejoining with a new lease once etcd answers again.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Error as EtcdError, PutOptions, Txn, TxnOp, TxnOpResponse};
use tracing::{debug, info, warn};

use super::fence::now_nanos;
use super::keys::encode_member;
use super::Shared;
use crate::{ClusterError, DirectoryEvent};

/// Pause between attempts while etcd does not answer.
const RETRY: Duration = Duration::from_millis(200);

/// Why keeping a lease ended.
#[derive(Debug)]
enum LeaseEnd {
    /// etcd says the lease does not exist (expired or revoked).
    Gone,
    /// No renewal succeeded within TTL minus the margin.
    Deadline,
}

/// Keeps this member's lease alive for as long as the directory lives; on losing it,
/// fences, emits `Fenced`, rejoins with a new lease and emits `Rejoined`.
pub(crate) async fn keep_alive_task(shared: Arc<Shared>) {
    loop {
        let lease = shared.lease();
        let end = keep(&shared, lease).await;
        shared.fence.set_lost();
        shared.counters.fences.inc();
        warn!(node = %shared.cfg.node, lease, why = ?end, "fenced: the lease may have expired");
        let _ = shared.events.send(DirectoryEvent::Fenced);
        loop {
            match rejoin(&shared, lease).await {
                Ok(()) => break,
                Err(e) => {
                    debug!(error = %e, "rejoin failed, retrying");
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
        let me = shared.me();
        info!(node = %me.node, lease = me.lease, "rejoined with a new lease");
        let _ = shared.events.send(DirectoryEvent::Rejoined(me));
    }
}

/// Renews `lease` every TTL/3 until etcd says it is gone or the fence clock runs out.
async fn keep(shared: &Shared, lease: i64) -> LeaseEnd {
    let period = shared.cfg.lease_ttl / 3;
    loop {
        if shared.fence.fenced() {
            return LeaseEnd::Deadline;
        }
        // The stream's first renewal is sent when it opens.
        let sent = now_nanos();
        let bound = period.min(shared.fence.until_deadline());
        let mut client = shared.client.lease_client();
        let (mut keeper, mut stream) = match tokio::time::timeout(bound, client.keep_alive(lease)).await {
            Ok(Ok(pair)) => {
                shared.fence.renewed(sent);
                pair
            }
            Ok(Err(e)) if lease_not_found(&e) => return LeaseEnd::Gone,
            Ok(Err(e)) => {
                debug!(error = %e, "keep-alive stream failed to open");
                tokio::time::sleep(RETRY.min(shared.fence.until_deadline())).await;
                continue;
            }
            Err(_) => continue,
        };
        let mut last = sent;
        loop {
            let due = (last + period.as_nanos() as u64).saturating_sub(now_nanos());
            tokio::time::sleep(Duration::from_nanos(due).min(shared.fence.until_deadline())).await;
            if shared.fence.fenced() {
                return LeaseEnd::Deadline;
            }
            let sent = now_nanos();
            if keeper.keep_alive().await.is_err() {
                break;
            }
            let bound = period.min(shared.fence.until_deadline());
            match tokio::time::timeout(bound, stream.message()).await {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                    shared.fence.renewed(sent);
                    last = sent;
                }
                Ok(Ok(Some(_))) => return LeaseEnd::Gone,
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => break,
            }
        }
    }
}

/// Makes sure `old` is gone (so every key this member held under it is deleted before it
/// claims anything again), then grants a new lease and registers under it.
async fn rejoin(shared: &Shared, old: i64) -> Result<(), ClusterError> {
    if old != 0 {
        shared.counters.etcd_txns.inc();
        let mut leases = shared.client.lease_client();
        let revoke = leases.revoke(old);
        match tokio::time::timeout(shared.cfg.lease_ttl, revoke).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if lease_not_found(&e) => {}
            Ok(Err(e)) => return Err(etcd_error("revoking the old lease", &e)),
            Err(_) => return Err(ClusterError::Etcd("revoking the old lease timed out".into())),
        }
    }
    register(shared, Duration::ZERO).await
}

/// Grants a lease and registers `members/<node>` under it. When the name is taken (by a
/// previous run of this member whose lease has not expired yet, or by another live
/// member), waits up to `wait_for_name` for it to go, then fails.
pub(crate) async fn register(shared: &Shared, wait_for_name: Duration) -> Result<(), ClusterError> {
    let ttl = shared.cfg.lease_ttl;
    let ttl_secs = ttl.as_secs().max(1) as i64;
    let sent = now_nanos();
    shared.counters.etcd_txns.inc();
    let mut leases = shared.client.lease_client();
    let grant = leases.grant(ttl_secs, None);
    let lease = match tokio::time::timeout(ttl, grant).await {
        Ok(Ok(resp)) => resp.id(),
        Ok(Err(e)) => return Err(etcd_error("granting a lease", &e)),
        Err(_) => return Err(ClusterError::Etcd("granting a lease timed out".into())),
    };
    let key = shared.keys.member(&shared.cfg.node);
    let value = encode_member(shared.cfg.peer_addr, lease);
    let give_up = now_nanos() + wait_for_name.as_nanos() as u64;
    loop {
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                value.as_str(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let resp = match tokio::time::timeout(ttl, shared.kv().txn(txn)).await {
            Ok(Ok(resp)) => resp,
            Ok(Err(e)) => return Err(etcd_error("registering", &e)),
            Err(_) => return Err(ClusterError::Etcd("registering timed out".into())),
        };
        if resp.succeeded() {
            break;
        }
        let holder = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => g
                .kvs()
                .first()
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
            _ => None,
        });
        if now_nanos() >= give_up {
            shared.counters.etcd_txns.inc();
            let _ = shared.client.lease_client().revoke(lease).await;
            return Err(ClusterError::Config(format!(
                "node name {:?} is registered by a live member ({}) in cluster {:?}; give each server its own --node",
                shared.cfg.node,
                holder.unwrap_or_default(),
                shared.cfg.cluster_name
            )));
        }
        tokio::time::sleep(RETRY).await;
    }
    shared.set_lease(lease);
    shared.fence.rejoined(sent);
    Ok(())
}

/// Whether etcd says the lease does not exist.
pub(crate) fn lease_not_found(e: &EtcdError) -> bool {
    match e {
        EtcdError::LeaseKeepAliveError(m) => m.contains("not found"),
        EtcdError::GRpcStatus(s) => s.message().contains("lease not found"),
        _ => false,
    }
}

/// An etcd failure, saying what was being done.
pub(crate) fn etcd_error(doing: &str, e: &EtcdError) -> ClusterError {
    ClusterError::Etcd(format!("{doing}: {e}"))
}
