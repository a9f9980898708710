//! Giving back: an inode homed here that served nothing for a while (no lock held, no
//! waiter, no call in flight, no peer's call being served) leaves the home table and
//! its ownership key is deleted, so that a member that locks millions of files over
//! days keeps only those in use, in its memory and in etcd's keyspace. Shadows that
//! hold nothing go in the same sweep.
//!
//! Between the table and the directory, the inode is *returning*: a claim under the
//! token given back (or an older one) is refused ("moved": the caller resolves the home
//! again) until the directory no longer shows this member as its home under that token,
//! so a call that resolved the old home before the delete cannot make it again while
//! another member may already have claimed the inode.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinSet;

use crate::service::Service;
use crate::stats::Counters;
use crate::InodeId;

/// How long an inode homed here stays idle before it is given back (it goes after
/// between one and two of these). Locked again within it, an inode keeps its home and
/// costs no etcd request; idle longer, it costs two (the delete, and a claim when it is
/// locked again) and a reclaim round, so a home costs at most two requests per 5 s of
/// idleness, against about 1 KiB here and one key in etcd for as long as it is kept.
/// As long as the default lease TTL: a home outlives its use by what a dead member's does.
pub const HOME_IDLE: Duration = Duration::from_secs(5);

/// Deletes in flight at once in one sweep (one etcd round trip each).
const PARALLEL_DELETES: usize = 32;

/// An inode given back: the token and lease of the claim, and whether its key is known
/// to be gone.
struct Tombstone {
    token: i64,
    lease: i64,
    deleted: bool,
}

/// The inodes given back whose claim the directory may still show.
#[derive(Default)]
pub(crate) struct Returning {
    map: Mutex<HashMap<InodeId, Tombstone>>,
}

impl Returning {
    /// Whether a claim of `ino` under `token` would make a given-back home again.
    pub fn blocks(&self, ino: InodeId, token: i64) -> bool {
        self.map.lock().get(&ino).is_some_and(|t| token <= t.token)
    }

    fn insert(&self, ino: InodeId, token: i64, lease: i64) {
        self.map.lock().insert(
            ino,
            Tombstone {
                token,
                lease,
                deleted: false,
            },
        );
    }

    fn set_deleted(&self, ino: InodeId, token: i64) {
        if let Some(t) = self.map.lock().get_mut(&ino).filter(|t| t.token == token) {
            t.deleted = true;
        }
    }

    /// Drops the tombstones of other leases (their keys went with the lease); returns
    /// the deleted ones, to look up, and the undeleted ones of `lease`, to delete again.
    #[allow(clippy::type_complexity)]
    fn sort_out(&self, lease: i64) -> (Vec<(InodeId, i64)>, Vec<(InodeId, i64)>) {
        let mut m = self.map.lock();
        m.retain(|_, t| t.lease == lease);
        let (mut deleted, mut undeleted) = (Vec::new(), Vec::new());
        for (ino, t) in m.iter() {
            if t.deleted {
                deleted.push((*ino, t.token));
            } else {
                undeleted.push((*ino, t.token));
            }
        }
        (deleted, undeleted)
    }

    fn remove(&self, ino: InodeId, token: i64) {
        let mut m = self.map.lock();
        if m.get(&ino).is_some_and(|t| t.token == token) {
            m.remove(&ino);
        }
    }
}

/// The sweeper: every idle time, gives back the inodes idle since the last sweep.
/// Runs while the service runs; an idle time of zero stops it until set again.
pub(crate) async fn run(svc: Arc<Service>) {
    loop {
        let Some(idle) = svc.home_idle() else {
            svc.sweep_kick.notified().await;
            continue;
        };
        tokio::select! {
            _ = tokio::time::sleep(idle) => sweep(&svc).await,
            // A new idle time: wait that one instead.
            _ = svc.sweep_kick.notified() => {}
        }
    }
}

/// One sweep: prunes empty shadows, takes idle inodes out of the table, deletes their
/// keys (and those an earlier sweep failed to delete), and drops the tombstones the
/// directory no longer needs.
pub(crate) async fn sweep(svc: &Arc<Service>) {
    let pruned = svc.shadow.prune_empty();
    Counters::add(&svc.counters.shadows_pruned, pruned as u64);
    // The lock manager remembers every context that held a lock until told.
    svc.mgr.forget_dropped_contexts();
    if svc.is_closed() || svc.dir.fenced() {
        return;
    }
    let me = svc.me();
    for hi in svc.homes.unused_since_last_look() {
        svc.homes.take_idle(&hi, || {
            // Fenced, the table is being emptied and the key goes with the lease.
            if hi.lease != me.lease || svc.dir.fenced() {
                return false;
            }
            svc.returning.insert(hi.ino, hi.token, hi.lease);
            true
        });
    }
    // The keys to delete: those just taken out, and those an earlier sweep could not.
    let (deleted, undeleted) = svc.returning.sort_out(me.lease);
    delete_keys(svc, undeleted).await;
    // A tombstone goes once the directory no longer shows the claim: it never shows it
    // again then. Asked of the watch's view itself: what a fenced member resolves hides
    // its claims, and a fence can come and go between two looks.
    for (ino, token) in deleted {
        if !svc.dir.claim_shown(ino, token) {
            svc.returning.remove(ino, token);
        }
    }
}

/// Deletes the keys of `todo` (inode, token), a few at once. A key deleted counts as a
/// home given back; one that could not be is deleted again by the next sweep (fenced:
/// it goes with the lease).
async fn delete_keys(svc: &Arc<Service>, todo: Vec<(InodeId, i64)>) {
    let mut todo = todo.into_iter();
    let mut running = JoinSet::new();
    loop {
        while running.len() < PARALLEL_DELETES {
            let Some((ino, token)) = todo.next() else {
                break;
            };
            let dir = svc.dir.clone();
            running.spawn(async move { (ino, token, dir.give_back(ino, token).await) });
        }
        let Some(done) = running.join_next().await else {
            return;
        };
        match done {
            Ok((ino, token, Ok(()))) => {
                svc.returning.set_deleted(ino, token);
                Counters::bump(&svc.counters.homes_given_back);
                tracing::debug!(ino = ino.0, token, "home given back");
            }
            Ok((ino, token, Err(e))) => {
                tracing::warn!(ino = ino.0, token, %e, "giving back a home failed; tried again later");
            }
            Err(e) => tracing::warn!(%e, "a give-back task failed"),
        }
    }
}

/// The idle time as stored: milliseconds, at least 1 unless zero (never give back).
pub(crate) fn idle_millis(idle: Duration) -> u64 {
    if idle.is_zero() {
        return 0;
    }
    u64::try_from(idle.as_millis()).unwrap_or(u64::MAX).max(1)
}
