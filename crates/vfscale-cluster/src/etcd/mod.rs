//! The directory on etcd: membership under leases, homes claimed by one transaction,
//! the wait-for graph serialised by a compare-and-swap, and self-fencing.
//!
//! # Keys (all under `/vfscale/<cluster>/`)
//!
//! | key | value | lease | written by |
//! |---|---|---|---|
//! | `members/<node>` | `{"addr": "<peer addr>", "lease": N}` | the member's | join / rejoin (create-only txn) |
//! | `homes/<ino>` | the home's node name | the home's | a claim: `if create_revision == 0 then put else get`; deleted by a give-back: `if create_revision == token then delete` |
//! | `waits/<node>` | the member's wait-for edges, `[[waiter, blocker], ...]` | the member's | `publish_waits` |
//! | `waits-version` | the last publisher's node | none | every publication, compared on its mod revision |
//!
//! A home's fencing token is its key's create revision: a later home of the same inode
//! is created at a later revision, so its token is larger. The view applies a home's
//! put or delete only to an entry no newer than it (a delete at revision D removes only
//! an entry created before D), so a watch that lags behind a claim this member recorded
//! itself never drops or overwrites it. When a lease ends (expired or
//! revoked), etcd deletes every key under it at one revision, so a member's registration,
//! homes and edges go together.
//!
//! # What protects what
//!
//! * The view (members, homes, the revision applied) is behind one `parking_lot::RwLock`,
//!   written by the watch task and by claims (a claim records its result unless the watch
//!   already applied that revision), read by `cached_home`, `members` and `home`. No
//!   await happens under it, and no other lock is taken under it.
//! * The lease id is an atomic, replaced only by (re)registration. The fence clock is
//!   atomics only: `fenced()` is one load and one `CLOCK_MONOTONIC` read.
//! * Two tasks run on the caller's tokio runtime: the keep-alive (it alone fences and
//!   rejoins) and the watch (it alone re-lists). Their handles sit behind a mutex that
//!   only `leave` and drop take. Dropping the directory aborts both.
//! * etcd is reached through one client per endpoint; which one is current is an atomic
//!   index that a failed or timed-out request moves to the next endpoint.
//!
//! # Where to find what
//!
//! | concept | file |
//! |---|---|
//! | key names, value encodings | `keys.rs` |
//! | the endpoints, failover between them, retry budgets | `endpoints.rs` |
//! | the fence clock (`CLOCK_MONOTONIC`, TTL minus margin) | `fence.rs` |
//! | keep-alive, fencing, rejoin, registration | `lease.rs` |
//! | the view (members, homes), its watch and re-list | `view.rs` |
//! | claims, cached homes, give-backs | `homes.rs` |
//! | the wait-for graph and cycle search | `waits.rs` |
//!
//! # Fencing rule
//!
//! Renewals go out every TTL/3, each answered within 1 s or retried on the next
//! endpoint. This member is fenced when the last renewal etcd
//! acknowledged was *sent* more than `TTL - max(TTL/5, 500 ms)` ago, or when etcd said
//! the lease is gone. Then `Fenced` is emitted once, `home` answers `Err(Fenced)`, and
//! the keep-alive task rejoins: it revokes the old lease (or learns it is gone) before
//! it grants a new one and registers again, so no key of the old lease outlives the
//! rejoin; then `Rejoined` is emitted. A rejoined member owns no homes.
//!
//! # Events
//!
//! One watch covers the key range `[homes/, members0)`, which holds exactly the homes
//! and the members, so their events arrive in revision order (a home's member is always
//! known before its home). A deleted `members/<node>` is `MemberGone` (this member's own old registration too,
//! after a rejoin); a deleted `homes/<ino>` is `HomeGone`. When the watch falls behind
//! compaction it re-lists, and emits the same events for what the listing lacks.

mod endpoints;
mod fence;
mod homes;
mod keys;
mod lease;
mod view;
mod waits;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, Error as EtcdError};
use parking_lot::{Mutex, RwLock};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::directory::{BoxFuture, Directory, DirectoryStats, WaitCycle};
use crate::{ClusterError, DirectoryEvent, Home, InodeId, Member, WaitEdge};
use endpoints::{Endpoints, Failure};
use fence::FenceClock;
use keys::Keys;
use view::View;

/// The shortest lease TTL accepted: etcd's own minimum is about 1.5 s with its default
/// election timeout, and the fencing margin needs room below the TTL.
const MIN_TTL: Duration = crate::config::MIN_LEASE_TTL;

/// Events buffered for a slow subscriber before it sees `Lagged`.
const EVENT_BUFFER: usize = 4096;

/// How to join the cluster.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// etcd client URLs, e.g. `http://127.0.0.1:2379`; give all of them, so the
    /// directory keeps working when one etcd member is down.
    pub endpoints: Vec<String>,
    /// The key prefix `/vfscale/<cluster_name>/`: servers with one name share a lock space.
    pub cluster_name: String,
    /// This member's name, unique in the cluster (no `/`).
    pub node: String,
    /// The address this member's peer service bound (published for the other members).
    pub peer_addr: SocketAddr,
    /// The lease TTL (whole seconds, at least 2 s; default 5 s).
    pub lease_ttl: Duration,
}

impl EtcdConfig {
    /// A configuration with the default lease TTL (5 s).
    pub fn new(endpoints: Vec<String>, cluster_name: &str, node: &str, peer_addr: SocketAddr) -> EtcdConfig {
        EtcdConfig {
            endpoints,
            cluster_name: cluster_name.to_string(),
            node: node.to_string(),
            peer_addr,
            lease_ttl: Duration::from_secs(5),
        }
    }

    fn validate(&self) -> Result<(), ClusterError> {
        if self.endpoints.is_empty() {
            return Err(ClusterError::Config("no etcd endpoints given".into()));
        }
        crate::config::check_key_part("node name", &self.node)?;
        crate::config::check_key_part("cluster name", &self.cluster_name)?;
        if self.lease_ttl < MIN_TTL || self.lease_ttl.subsec_nanos() != 0 {
            return Err(ClusterError::Config(format!(
                "lease TTL {:?} must be whole seconds, at least {MIN_TTL:?}",
                self.lease_ttl
            )));
        }
        Ok(())
    }
}

/// One counter.
#[derive(Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    pub(crate) fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The directory's counters.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) etcd_txns: Counter,
    pub(crate) claims_won: Counter,
    pub(crate) claims_lost: Counter,
    pub(crate) wait_publications: Counter,
    pub(crate) fences: Counter,
    pub(crate) relists: Counter,
}

/// What the directory's handle and its tasks share.
pub(crate) struct Shared {
    pub(crate) cfg: EtcdConfig,
    pub(crate) keys: Keys,
    pub(crate) endpoints: Endpoints,
    lease: AtomicI64,
    pub(crate) fence: FenceClock,
    pub(crate) view: RwLock<View>,
    pub(crate) events: broadcast::Sender<DirectoryEvent>,
    pub(crate) counters: Counters,
    /// Tests hold the watch to make it fall behind compaction.
    pub(crate) watch_hold: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    pub(crate) fn lease(&self) -> i64 {
        self.lease.load(Ordering::Acquire)
    }

    pub(crate) fn set_lease(&self, lease: i64) {
        self.lease.store(lease, Ordering::Release);
    }

    pub(crate) fn me(&self) -> Member {
        Member {
            node: self.cfg.node.clone(),
            addr: self.cfg.peer_addr,
            lease: self.lease(),
        }
    }

    /// One counted request (everything but keep-alive and the watch), bounded by
    /// `limit`, on the current etcd endpoint.
    pub(crate) async fn request<T, F, Fut>(&self, limit: Duration, f: F) -> Result<T, Failure>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, EtcdError>>,
    {
        self.counters.etcd_txns.inc();
        self.endpoints.request(limit, f).await
    }

    /// Revokes `lease`, best effort (an orderly leave, or a failed join).
    pub(crate) async fn revoke(&self, lease: i64) -> Result<(), Failure> {
        let revoke = self.request(
            self.cfg.lease_ttl,
            |mut c| async move { c.lease_revoke(lease).await },
        );
        match revoke.await {
            Err(f) if !f.lease_not_found() => Err(f),
            _ => Ok(()),
        }
    }
}

/// The cluster directory on etcd; see the module's first page.
pub struct EtcdDirectory {
    shared: Arc<Shared>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl EtcdDirectory {
    /// Connects, grants the lease, registers this member, reads the members and homes,
    /// and starts the keep-alive and the watch on the current tokio runtime. When `node`
    /// is registered already (a previous run whose lease has not expired), waits up to
    /// TTL + 2 s for it to go.
    pub async fn join(cfg: EtcdConfig) -> Result<Arc<EtcdDirectory>, ClusterError> {
        cfg.validate()?;
        let endpoints = Endpoints::connect(&cfg.endpoints).await?;
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        let shared = Arc::new(Shared {
            keys: Keys::new(&cfg.cluster_name),
            fence: FenceClock::new(cfg.lease_ttl),
            cfg,
            endpoints,
            lease: AtomicI64::new(0),
            view: RwLock::new(View::default()),
            events,
            counters: Counters::default(),
            watch_hold: tokio::sync::watch::channel(false).0,
        });
        lease::register(&shared, shared.cfg.lease_ttl + Duration::from_secs(2)).await?;
        if let Err(e) = view::relist(&shared).await {
            let _ = shared.revoke(shared.lease()).await;
            return Err(e);
        }
        let tasks = vec![
            tokio::spawn(lease::keep_alive_task(shared.clone())),
            tokio::spawn(view::watch_task(shared.clone())),
        ];
        tracing::info!(node = %shared.cfg.node, lease = shared.lease(), "joined the cluster");
        Ok(Arc::new(EtcdDirectory {
            shared,
            tasks: Mutex::new(tasks),
        }))
    }

    /// Orderly leave: stops the keep-alive and the watch and revokes the lease, so this
    /// member's registration, homes and edges go at once. The directory stays fenced.
    pub async fn leave(&self) {
        self.stop_tasks();
        self.shared.fence.set_lost();
        let lease = self.shared.lease();
        if lease != 0 {
            if let Err(e) = self.shared.revoke(lease).await {
                tracing::warn!(lease, error = %e, "leaving: the lease could not be revoked; it expires after its TTL");
            }
        }
    }

    /// How many times the watch fell behind compaction and re-listed.
    pub fn relists(&self) -> u64 {
        self.shared.counters.relists.get()
    }

    /// Holds (`true`) or releases the watch: a held watch reads nothing, as a slow one
    /// would; released, it resumes where it stopped. For tests of the re-list.
    #[doc(hidden)]
    pub fn hold_watch(&self, hold: bool) {
        self.shared.watch_hold.send_replace(hold);
    }

    fn stop_tasks(&self) {
        for t in self.tasks.lock().drain(..) {
            t.abort();
        }
    }
}

impl Drop for EtcdDirectory {
    fn drop(&mut self) {
        self.stop_tasks();
    }
}

impl Directory for EtcdDirectory {
    fn me(&self) -> Member {
        self.shared.me()
    }

    fn lease_ttl(&self) -> Duration {
        self.shared.cfg.lease_ttl
    }

    fn home(&self, ino: InodeId) -> BoxFuture<'_, Result<Home, ClusterError>> {
        Box::pin(homes::home(&self.shared, ino))
    }

    fn cached_home(&self, ino: InodeId) -> Option<Home> {
        homes::resolve(&self.shared, &self.shared.view.read(), ino)
    }

    fn claim_shown(&self, ino: InodeId, token: i64) -> bool {
        self.shared
            .view
            .read()
            .homes
            .get(&ino)
            .is_some_and(|e| e.token == token && e.node == self.shared.cfg.node)
    }

    fn give_back(&self, ino: InodeId, token: i64) -> BoxFuture<'_, Result<(), ClusterError>> {
        Box::pin(homes::give_back(&self.shared, ino, token))
    }

    fn members(&self) -> Vec<Member> {
        let me = self.shared.me();
        let mut out: Vec<Member> = {
            let view = self.shared.view.read();
            view.members
                .values()
                .filter(|m| m.node != me.node)
                .cloned()
                .collect()
        };
        if !self.shared.fence.fenced() {
            out.push(me);
        }
        out.sort_by(|a, b| a.node.cmp(&b.node));
        out
    }

    fn events(&self) -> broadcast::Receiver<DirectoryEvent> {
        self.shared.events.subscribe()
    }

    fn fenced(&self) -> bool {
        self.shared.fence.fenced()
    }

    fn publish_waits(
        &self,
        current: Vec<WaitEdge>,
        new: Vec<WaitEdge>,
    ) -> BoxFuture<'_, Result<Vec<WaitCycle>, ClusterError>> {
        Box::pin(waits::publish(&self.shared, current, new))
    }

    fn stats(&self) -> DirectoryStats {
        let c = &self.shared.counters;
        DirectoryStats {
            etcd_txns: c.etcd_txns.get(),
            claims_won: c.claims_won.get(),
            claims_lost: c.claims_lost.get(),
            wait_publications: c.wait_publications.get(),
            fences: c.fences.get(),
        }
    }
}
