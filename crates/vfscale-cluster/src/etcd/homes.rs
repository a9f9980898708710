//! Homes: claiming an inode (one etcd transaction, the winner of a race is the home) and
//! answering from the view when it knows a live home (no etcd traffic at all).

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::fence::now_nanos;
use super::lease::{etcd_error, lease_not_found};
use super::view::{HomeEntry, View};
use super::Shared;
use crate::{ClusterError, Home, InodeId, Member};

/// How long one etcd request may take before it is retried.
const ATTEMPT: Duration = Duration::from_secs(1);
/// Pause between attempts.
const RETRY: Duration = Duration::from_millis(50);

/// The home of `ino` in `view`, when its member is live with the lease the key names.
pub(crate) fn resolve(shared: &Shared, view: &View, ino: InodeId) -> Option<Home> {
    let entry = view.homes.get(&ino)?;
    let member = member_of(shared, view, entry)?;
    Some(Home {
        member,
        token: entry.token,
    })
}

/// The member a home entry names, if that member still holds the entry's lease; for this
/// member, only while it is not fenced.
fn member_of(shared: &Shared, view: &View, entry: &HomeEntry) -> Option<Member> {
    if entry.node == shared.cfg.node {
        let me = shared.me();
        return (me.lease == entry.lease && !shared.fence.fenced()).then_some(me);
    }
    view.member_with_lease(&entry.node, entry.lease).cloned()
}

/// The current home of `ino`, claiming it for this member when it has none.
pub(crate) async fn home(shared: &Shared, ino: InodeId) -> Result<Home, ClusterError> {
    if shared.fence.fenced() {
        return Err(ClusterError::Fenced);
    }
    if let Some(h) = resolve(shared, &shared.view.read(), ino) {
        return Ok(h);
    }
    let key = shared.keys.home(ino);
    let give_up = now_nanos() + shared.cfg.lease_ttl.as_nanos() as u64;
    let mut last_error = String::from("no attempt");
    loop {
        if shared.fence.fenced() {
            return Err(ClusterError::Fenced);
        }
        if now_nanos() >= give_up {
            return Err(ClusterError::Etcd(format!(
                "claiming inode {}: {last_error}",
                ino.0
            )));
        }
        let lease = shared.lease();
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                shared.cfg.node.as_str(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let resp = match tokio::time::timeout(ATTEMPT, shared.kv().txn(txn)).await {
            Ok(Ok(resp)) => resp,
            Ok(Err(e)) if lease_not_found(&e) => return Err(ClusterError::Fenced),
            Ok(Err(e)) => {
                last_error = etcd_error("claim", &e).to_string();
                tokio::time::sleep(RETRY).await;
                continue;
            }
            Err(_) => {
                last_error = format!("no answer within {ATTEMPT:?}");
                continue;
            }
        };
        if resp.succeeded() {
            let token = resp.header().map_or(0, |h| h.revision());
            let entry = HomeEntry {
                node: shared.cfg.node.clone(),
                lease,
                token,
            };
            shared.view.write().note_claim(ino, entry, token);
            shared.counters.claims_won.inc();
            if shared.fence.fenced() {
                return Err(ClusterError::Fenced);
            }
            return Ok(Home {
                member: shared.me(),
                token,
            });
        }
        let Some(kv) = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().cloned(),
            _ => None,
        }) else {
            continue;
        };
        let entry = HomeEntry::from_kv(&kv);
        let member = {
            let mut view = shared.view.write();
            view.note_claim(ino, entry.clone(), kv.mod_revision());
            member_of(shared, &view, &entry)
        };
        let member = match member {
            Some(m) => Some(m),
            None if entry.node == shared.cfg.node => None,
            // The view has not seen that member's registration yet: read it.
            None => read_member(shared, &entry).await,
        };
        match member {
            Some(m) if m.node == shared.cfg.node => {
                // An earlier attempt whose answer was lost made this member the home.
                shared.counters.claims_won.inc();
                return Ok(Home {
                    member: m,
                    token: entry.token,
                });
            }
            Some(m) => {
                shared.counters.claims_lost.inc();
                return Ok(Home {
                    member: m,
                    token: entry.token,
                });
            }
            None => {
                // The key's lease is ending (its member is gone): etcd deletes it soon.
                last_error = format!("home {:?} (lease {:x}) is going away", entry.node, entry.lease);
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// Reads `members/<node>`: the member, if it is registered under the entry's lease.
async fn read_member(shared: &Shared, entry: &HomeEntry) -> Option<Member> {
    let key = shared.keys.member(&entry.node);
    let resp = tokio::time::timeout(ATTEMPT, shared.kv().get(key, Some(GetOptions::new())))
        .await
        .ok()?
        .ok()?;
    let kv = resp.kvs().first()?;
    let addr = super::keys::decode_member_addr(kv.value())?;
    (kv.lease() == entry.lease).then(|| Member {
        node: entry.node.clone(),
        addr,
        lease: kv.lease(),
    })
}
