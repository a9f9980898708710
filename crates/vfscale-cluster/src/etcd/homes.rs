//! Homes: claiming an inode (one etcd transaction, the winner of a race is the home),
//! answering from the view when it knows a live home (no etcd traffic at all), and
//! giving a home back (one transaction that deletes the key only under its token).

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use tracing::debug;

use super::endpoints::{Failure, Retries, ATTEMPT};
use super::view::{HomeEntry, View};
use super::Shared;
use crate::{ClusterError, Home, InodeId, Member};

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
    let mut retries = Retries::new(shared.cfg.lease_ttl);
    loop {
        retries.next(&shared.fence, format_args!("claiming inode {}", ino.0))?;
        let lease = shared.lease();
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                shared.cfg.node.as_str(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let resp = match shared
            .request(ATTEMPT, |mut c| async move { c.txn(txn).await })
            .await
        {
            Ok(resp) => resp,
            Err(f) if f.lease_not_found() => return Err(ClusterError::Fenced),
            Err(Failure::Timeout(d)) => {
                retries.last_error = format!("no answer within {d:?}");
                continue;
            }
            Err(f) => {
                retries.last_error = f.to_string();
                tokio::time::sleep(RETRY).await;
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
            debug!(ino = ino.0, token, "claimed: this member is home");
            if shared.fence.fenced() {
                return Err(ClusterError::Fenced);
            }
            let me = shared.me();
            if me.lease != lease {
                // Rejoined meanwhile: the key went with the old lease; claim it again.
                retries.last_error = format!("lease {lease:x} ended during the claim");
                continue;
            }
            return Ok(Home { member: me, token });
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
                debug!(ino = ino.0, token = entry.token, home = %m.node, "claim found another home");
                return Ok(Home {
                    member: m,
                    token: entry.token,
                });
            }
            None => {
                // The key's lease is ending (its member is gone): etcd deletes it soon.
                retries.last_error = format!("home {:?} (lease {:x}) is going away", entry.node, entry.lease);
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// Deletes `homes/<ino>` if its create revision is `token`: `if create_revision == token
/// then delete`. Either answer means no key of that claim is left (a failed compare: it
/// is gone, or a newer claim holds the key). Retried on another endpoint until etcd
/// answers, within the lease TTL; `Err(Fenced)` once fenced. The key is left in the view
/// for the watch to remove, so the view never shows it again once it stopped.
pub(crate) async fn give_back(shared: &Shared, ino: InodeId, token: i64) -> Result<(), ClusterError> {
    let key = shared.keys.home(ino);
    let mut retries = Retries::new(shared.cfg.lease_ttl);
    loop {
        retries.next(&shared.fence, format_args!("giving back inode {}", ino.0))?;
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, token)])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        match shared
            .request(ATTEMPT, |mut c| async move { c.txn(txn).await })
            .await
        {
            Ok(resp) => {
                debug!(ino = ino.0, token, deleted = resp.succeeded(), "home given back");
                return Ok(());
            }
            Err(Failure::Timeout(d)) => retries.last_error = format!("no answer within {d:?}"),
            Err(f) => {
                retries.last_error = f.to_string();
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// Reads `members/<node>`: the member, if it is registered under the entry's lease.
async fn read_member(shared: &Shared, entry: &HomeEntry) -> Option<Member> {
    let key = shared.keys.member(&entry.node);
    let get = shared.request(ATTEMPT, |mut c| async move {
        c.get(key, Some(GetOptions::new())).await
    });
    let resp = get.await.ok()?;
    let kv = resp.kvs().first()?;
    let addr = super::keys::decode_member_addr(kv.value())?;
    (kv.lease() == entry.lease).then(|| Member {
        node: entry.node.clone(),
        addr,
        lease: kv.lease(),
    })
}
