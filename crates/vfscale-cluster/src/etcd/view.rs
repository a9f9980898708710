//! The view: members and homes as the watch last saw them, kept current by one watch on
//! the key range that holds both (so their events arrive in revision order), re-listed
//! when the watch falls behind compaction.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, GetOptions, KeyValue, WatchOptions, WatchResponse};
use tracing::{debug, info};

use super::keys::{decode_member_addr, Keys, ViewKey};
use super::Shared;
use crate::{ClusterError, DirectoryEvent, InodeId, Member};

/// Pause before reopening a broken watch.
const REOPEN: Duration = Duration::from_millis(200);
/// How long opening a watch may take before another endpoint is tried.
const WATCH_OPEN: Duration = Duration::from_secs(2);

/// An ownership key as read: the home's node, its lease and the fencing token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HomeEntry {
    pub(crate) node: String,
    pub(crate) lease: i64,
    pub(crate) token: i64,
}

impl HomeEntry {
    pub(crate) fn from_kv(kv: &KeyValue) -> HomeEntry {
        HomeEntry {
            node: String::from_utf8_lossy(kv.value()).into_owned(),
            lease: kv.lease(),
            token: kv.create_revision(),
        }
    }
}

/// What the directory knows of the cluster, as of revision `rev`.
#[derive(Debug, Default)]
pub(crate) struct View {
    pub(crate) members: HashMap<String, Member>,
    pub(crate) homes: HashMap<InodeId, HomeEntry>,
    /// The revision every event up to which has been applied.
    pub(crate) rev: i64,
}

impl View {
    /// The registered member `node` if it holds `lease` (a home recorded under an older
    /// lease of that node is gone, or about to be).
    pub(crate) fn member_with_lease(&self, node: &str, lease: i64) -> Option<&Member> {
        self.members.get(node).filter(|m| m.lease == lease)
    }

    /// Records a home that a claim read or wrote at revision `mod_rev`, unless the watch
    /// already applied that revision (then the view already says what became of it, and
    /// re-inserting could resurrect a key deleted since), or the view shows a newer claim
    /// (a claim that read an older key and was slow to record it: that key is gone).
    pub(crate) fn note_claim(&mut self, ino: InodeId, entry: HomeEntry, mod_rev: i64) {
        if self.rev < mod_rev && self.homes.get(&ino).is_none_or(|e| e.token <= entry.token) {
            self.homes.insert(ino, entry);
        }
    }

    /// Applies one key's put or delete; returns the event it means for the lock service.
    fn apply(&mut self, keys: &Keys, kind: EventType, kv: &KeyValue) -> Option<DirectoryEvent> {
        let key = kv.key_str().ok()?;
        match (keys.parse_view_key(key)?, kind) {
            (ViewKey::Member(node), EventType::Put) => {
                if let Some(addr) = decode_member_addr(kv.value()) {
                    let m = Member {
                        node: node.to_string(),
                        addr,
                        lease: kv.lease(),
                    };
                    self.members.insert(m.node.clone(), m);
                }
                None
            }
            (ViewKey::Member(node), EventType::Delete) => {
                self.members.remove(node).map(DirectoryEvent::MemberGone)
            }
            (ViewKey::Home(ino), EventType::Put) => {
                let entry = HomeEntry::from_kv(kv);
                // A claim recorded before the watch got here may be newer than the put.
                if self.homes.get(&ino).is_none_or(|e| e.token <= entry.token) {
                    self.homes.insert(ino, entry);
                }
                None
            }
            (ViewKey::Home(ino), EventType::Delete) => {
                // A delete at revision D removes a key created before D: a newer claim
                // (given back and claimed again while the watch lagged) stays.
                if self.homes.get(&ino)?.token >= kv.mod_revision() {
                    return None;
                }
                let gone = self.homes.remove(&ino)?;
                Some(DirectoryEvent::HomeGone {
                    ino,
                    token: gone.token,
                })
            }
        }
    }

    /// Replaces the view with a fresh listing; returns the events for what went missing
    /// between the two (members gone, homes gone or replaced).
    ///
    /// A home created after the listing's revision (a claim recorded while the listing
    /// was read) is not missing: the listing could not show it, and the watch, which
    /// resumes after that revision, brings its put or delete. It is kept.
    fn replace(&mut self, mut fresh: View) -> Vec<DirectoryEvent> {
        let mut events = Vec::new();
        for (node, m) in &self.members {
            if fresh.members.get(node).is_none_or(|n| n.lease != m.lease) {
                events.push(DirectoryEvent::MemberGone(m.clone()));
            }
        }
        for (ino, h) in self.homes.drain() {
            if h.token > fresh.rev {
                if fresh.homes.get(&ino).is_none_or(|n| n.token < h.token) {
                    fresh.homes.insert(ino, h);
                }
            } else if fresh.homes.get(&ino).is_none_or(|n| n.token != h.token) {
                events.push(DirectoryEvent::HomeGone { ino, token: h.token });
            }
        }
        *self = fresh;
        events
    }
}

/// Reads the members and homes at one revision and makes that the view; emits the
/// events for what the old view had and the new one lacks.
pub(crate) async fn relist(shared: &Shared) -> Result<(), ClusterError> {
    let (from, to) = shared.keys.view_range();
    let get = shared.request(shared.cfg.lease_ttl, |mut c| async move {
        c.get(from, Some(GetOptions::new().with_range(to))).await
    });
    let resp = get
        .await
        .map_err(|f| ClusterError::Etcd(format!("listing members and homes: {f}")))?;
    let mut fresh = View {
        rev: resp.header().map_or(0, |h| h.revision()),
        ..View::default()
    };
    for kv in resp.kvs() {
        fresh.apply(&shared.keys, EventType::Put, kv);
    }
    let events = shared.view.write().replace(fresh);
    for e in events {
        let _ = shared.events.send(e);
    }
    Ok(())
}

/// Follows the view range from the view's revision on, for as long as the directory
/// lives: reopens a broken watch where it stopped, and re-lists when etcd has compacted
/// past that point.
pub(crate) async fn watch_task(shared: Arc<Shared>) {
    let mut hold = shared.watch_hold.subscribe();
    loop {
        // A held watch (tests) reads nothing, so it falls behind like a slow one.
        while *hold.borrow_and_update() {
            if hold.changed().await.is_err() {
                return;
            }
        }
        let from = shared.view.read().rev + 1;
        let (start, end) = shared.keys.view_range();
        let opts = WatchOptions::new()
            .with_range(end)
            .with_start_revision(from)
            .with_progress_notify();
        let pick = shared.endpoints.pick();
        let mut client = pick.client.clone();
        let opened = tokio::time::timeout(WATCH_OPEN, client.watch(start, Some(opts))).await;
        let mut stream = match opened {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                debug!(error = %e, "watch failed to open");
                shared.endpoints.failed(&pick);
                tokio::time::sleep(REOPEN).await;
                continue;
            }
            Err(_) => {
                debug!("watch did not open in time");
                shared.endpoints.failed(&pick);
                tokio::time::sleep(REOPEN).await;
                continue;
            }
        };
        loop {
            let msg = tokio::select! {
                m = stream.message() => m,
                _ = hold.changed() => break,
            };
            match msg {
                Ok(Some(resp)) if resp.compact_revision() != 0 => {
                    info!(
                        from,
                        compacted = resp.compact_revision(),
                        "watch fell behind compaction: re-listing"
                    );
                    shared.counters.relists.inc();
                    if let Err(e) = relist(&shared).await {
                        debug!(error = %e, "re-list failed");
                        tokio::time::sleep(REOPEN).await;
                    }
                    break;
                }
                // etcd cancels watches on a member that lost its leader.
                Ok(Some(resp)) if resp.canceled() => {
                    debug!(reason = resp.cancel_reason(), "watch canceled, reopening");
                    shared.endpoints.failed(&pick);
                    tokio::time::sleep(REOPEN).await;
                    break;
                }
                Ok(Some(resp)) => apply_response(&shared, &resp),
                Ok(None) | Err(_) => {
                    shared.endpoints.failed(&pick);
                    tokio::time::sleep(REOPEN).await;
                    break;
                }
            }
        }
    }
}

fn apply_response(shared: &Shared, resp: &WatchResponse) {
    let mut out = Vec::new();
    {
        let mut view = shared.view.write();
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            // The watch starts after the view's revision, so every event is new; a lease's
            // end deletes all its keys at one revision, hence no skipping by revision.
            if let Some(e) = view.apply(&shared.keys, ev.event_type(), kv) {
                out.push(e);
            }
            view.rev = kv.mod_revision();
        }
        // A progress notification: every event up to the header's revision was sent.
        if resp.events().is_empty() && !resp.created() {
            if let Some(h) = resp.header() {
                view.rev = view.rev.max(h.revision());
            }
        }
    }
    for e in out {
        let _ = shared.events.send(e);
    }
}

#[cfg(test)]
mod tests {
    use super::{HomeEntry, View};
    use crate::{DirectoryEvent, InodeId};

    fn home(token: i64) -> HomeEntry {
        HomeEntry {
            node: "a".into(),
            lease: 7,
            token,
        }
    }

    /// A re-list read at revision 100 while this member claimed inode 3 at revision 120:
    /// the claim stays (no `HomeGone`, which would make the member drop a live home and
    /// report its clients' locks lost), also after another claim records, late, the
    /// older key it read; inode 1, gone before 100, is reported; inode 2, claimed again
    /// before 100, is reported under its old token and replaced.
    #[test]
    fn a_relist_keeps_a_claim_newer_than_its_listing() {
        let mut view = View {
            rev: 80,
            ..View::default()
        };
        view.homes.insert(InodeId(1), home(50));
        view.homes.insert(InodeId(2), home(60));
        view.note_claim(InodeId(3), home(120), 120);
        // A claim that read inode 3's older key (gone since) records it late: ignored.
        view.note_claim(InodeId(3), home(85), 85);
        let mut fresh = View {
            rev: 100,
            ..View::default()
        };
        fresh.homes.insert(InodeId(2), home(90));
        let mut events: Vec<(u64, i64)> = view
            .replace(fresh)
            .into_iter()
            .map(|e| match e {
                DirectoryEvent::HomeGone { ino, token } => (ino.0, token),
                e => panic!("unexpected {e:?}"),
            })
            .collect();
        events.sort();
        assert_eq!(events, vec![(1, 50), (2, 60)]);
        assert_eq!(view.homes.get(&InodeId(3)), Some(&home(120)));
        assert_eq!(view.homes.get(&InodeId(2)), Some(&home(90)));
        assert!(!view.homes.contains_key(&InodeId(1)));
        assert_eq!(view.rev, 100);
    }
}
