//! An in-memory [`Directory`] for tests of the lock service: several members in one
//! process share one [`MemCluster`]; a test ends a member's lease or fences it by hand.
//!
//! It keeps the directory's contract (claims are atomic, a token grows with every
//! claim, wait-graph publications are serialised and refuse a new edge that closes a
//! cycle) with no etcd and no clocks: leases end only when the test says so.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::broadcast;

use crate::{
    BoxFuture, ClusterError, Directory, DirectoryEvent, DirectoryStats, Home, InodeId, Member, PublishedEdge,
    WaitCycle, WaitEdge,
};

/// What the members of one in-memory cluster share (the role of etcd).
#[derive(Default)]
pub struct MemCluster {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The revision: grows with every change, as etcd's.
    rev: i64,
    next_lease: i64,
    members: HashMap<String, Member>,
    homes: HashMap<InodeId, Home>,
    waits: HashMap<String, Vec<WaitEdge>>,
    /// Every member's event channel, by node (a fenced member keeps its own).
    subscribers: HashMap<String, broadcast::Sender<DirectoryEvent>>,
    /// The lease TTL members joining from now on report (`None`: 5 s).
    ttl: Option<Duration>,
    /// How long a give-back takes before its key is deleted.
    give_back_delay: Duration,
}

impl MemCluster {
    /// An empty cluster.
    pub fn new() -> Arc<MemCluster> {
        Arc::new(MemCluster::default())
    }

    /// The lease TTL that members joining from now on report (how long the lock
    /// service keeps trying a home that does not answer depends on it).
    pub fn set_lease_ttl(&self, ttl: Duration) {
        self.state.lock().ttl = Some(ttl);
    }

    /// Makes every give-back take `delay` before its key is deleted (a slow etcd), so
    /// that calls can arrive while an inode is on its way out.
    pub fn set_give_back_delay(&self, delay: Duration) {
        self.state.lock().give_back_delay = delay;
    }

    /// Registers member `node` at `addr` with a new lease.
    pub fn join(self: &Arc<Self>, node: &str, addr: SocketAddr) -> Arc<MemDirectory> {
        let (tx, _) = broadcast::channel(1024);
        let mut st = self.state.lock();
        st.next_lease += 1;
        st.rev += 1;
        let me = Member {
            node: node.to_string(),
            addr,
            lease: st.next_lease,
        };
        st.members.insert(node.to_string(), me.clone());
        st.subscribers.insert(node.to_string(), tx.clone());
        Arc::new(MemDirectory {
            cluster: self.clone(),
            ttl: st.ttl.unwrap_or(Duration::from_secs(5)),
            me: Mutex::new(me),
            fenced: AtomicBool::new(false),
            fence_in: AtomicI64::new(-1),
            tx,
            txns: AtomicU64::new(0),
            claims_won: AtomicU64::new(0),
            claims_lost: AtomicU64::new(0),
            publications: AtomicU64::new(0),
            fences: AtomicU64::new(0),
        })
    }

    /// Publishes `addr` as `node`'s peer address (its registration and the homes it
    /// holds), as if it had moved, without telling the member: pointed at a closed port,
    /// the member is alive and holds its lease but the others cannot reach it. Returns
    /// the address it had.
    pub fn set_peer_addr(&self, node: &str, addr: SocketAddr) -> Option<SocketAddr> {
        let mut st = self.state.lock();
        let old = st
            .members
            .get_mut(node)
            .map(|m| std::mem::replace(&mut m.addr, addr))?;
        for h in st.homes.values_mut().filter(|h| h.member.node == node) {
            h.member.addr = addr;
        }
        Some(old)
    }

    /// Ends `node`'s lease, as etcd does when it expires or is revoked: its
    /// registration, homes and published waits go, and every other member is told
    /// (`HomeGone` for each home, then `MemberGone`). The member itself is not told:
    /// see [`MemCluster::fence`].
    pub fn expire(&self, node: &str) {
        let mut st = self.state.lock();
        let Some(m) = st.members.remove(node) else {
            return;
        };
        st.rev += 1;
        let gone: Vec<(InodeId, i64)> = st
            .homes
            .iter()
            .filter(|(_, h)| h.member == m)
            .map(|(i, h)| (*i, h.token))
            .collect();
        for (ino, _) in &gone {
            st.homes.remove(ino);
        }
        st.waits.remove(node);
        for (n, tx) in &st.subscribers {
            if n == node {
                continue;
            }
            for &(ino, token) in &gone {
                let _ = tx.send(DirectoryEvent::HomeGone { ino, token });
            }
            let _ = tx.send(DirectoryEvent::MemberGone(m.clone()));
        }
    }

    /// Makes `dir`'s member fenced (its own clock says its lease may have ended):
    /// `fenced()` turns true and it gets `Fenced`. Its lease is left as it is: end it
    /// with [`MemCluster::expire`].
    pub fn fence(&self, dir: &MemDirectory) {
        if !dir.fenced.swap(true, Ordering::SeqCst) {
            dir.fences.fetch_add(1, Ordering::Relaxed);
            let _ = dir.tx.send(DirectoryEvent::Fenced);
        }
    }

    /// Makes `dir`'s member fenced as [`MemCluster::fence`] does, at the moment its
    /// `reads`-th next read of `fenced()` is made (its clock passing the fence point
    /// between two reads: 1 fences it between the check before a call and the one
    /// after).
    pub fn fence_after(&self, dir: &MemDirectory, reads: i64) {
        dir.fence_in.store(reads, Ordering::SeqCst);
    }

    /// A fenced member rejoins: a new lease, registered again; it gets `Rejoined`.
    pub fn rejoin(&self, dir: &MemDirectory) -> Member {
        let mut st = self.state.lock();
        st.next_lease += 1;
        st.rev += 1;
        let mut me = dir.me.lock();
        me.lease = st.next_lease;
        st.members.insert(me.node.clone(), me.clone());
        dir.fenced.store(false, Ordering::SeqCst);
        let _ = dir.tx.send(DirectoryEvent::Rejoined(me.clone()));
        me.clone()
    }

    /// Deletes `ino`'s ownership key and tells every member but its home, as if the
    /// home had missed the news (see [`MemCluster::flood`]). Returns the home dropped.
    pub fn drop_home_unheard(&self, ino: InodeId) -> Option<Home> {
        let mut st = self.state.lock();
        let home = st.homes.remove(&ino)?;
        st.rev += 1;
        for (n, tx) in &st.subscribers {
            if *n != home.member.node {
                let _ = tx.send(DirectoryEvent::HomeGone {
                    ino,
                    token: home.token,
                });
            }
        }
        Some(home)
    }

    /// Sends `node` `n` harmless events at once, more than its channel holds: a member
    /// whose event loop falls behind them misses events (`Lagged`) and must find out
    /// for itself what they said.
    pub fn flood(&self, node: &str, n: usize) {
        let st = self.state.lock();
        if let Some(tx) = st.subscribers.get(node) {
            for _ in 0..n {
                let _ = tx.send(DirectoryEvent::HomeGone {
                    ino: InodeId(u64::MAX),
                    token: 0,
                });
            }
        }
    }

    /// The current home of `ino`, if any.
    pub fn home_of(&self, ino: InodeId) -> Option<Home> {
        self.state.lock().homes.get(&ino).cloned()
    }

    /// Every published edge, with its member.
    pub fn published(&self) -> Vec<PublishedEdge> {
        let st = self.state.lock();
        let mut out: Vec<PublishedEdge> = st
            .waits
            .iter()
            .flat_map(|(n, es)| {
                es.iter().map(move |e| PublishedEdge {
                    edge: *e,
                    node: n.clone(),
                })
            })
            .collect();
        out.sort_by(|a, b| (a.edge, &a.node).cmp(&(b.edge, &b.node)));
        out
    }
}

/// One member's view of a [`MemCluster`].
pub struct MemDirectory {
    cluster: Arc<MemCluster>,
    ttl: Duration,
    me: Mutex<Member>,
    fenced: AtomicBool,
    /// Reads of `fenced()` left before it turns true ([`MemCluster::fence_after`]);
    /// negative: none planned.
    fence_in: AtomicI64,
    tx: broadcast::Sender<DirectoryEvent>,
    txns: AtomicU64,
    claims_won: AtomicU64,
    claims_lost: AtomicU64,
    publications: AtomicU64,
    fences: AtomicU64,
}

impl MemDirectory {
    /// The cluster this member belongs to.
    pub fn cluster(&self) -> &Arc<MemCluster> {
        &self.cluster
    }
}

impl Directory for MemDirectory {
    fn me(&self) -> Member {
        self.me.lock().clone()
    }

    fn lease_ttl(&self) -> Duration {
        self.ttl
    }

    fn home(&self, ino: InodeId) -> BoxFuture<'_, Result<Home, ClusterError>> {
        Box::pin(async move {
            if self.fenced() {
                return Err(ClusterError::Fenced);
            }
            let me = self.me();
            let mut st = self.cluster.state.lock();
            if let Some(h) = st.homes.get(&ino) {
                if h.member != me {
                    self.claims_lost.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(h.clone());
            }
            self.txns.fetch_add(1, Ordering::Relaxed);
            st.rev += 1;
            let h = Home {
                member: me,
                token: st.rev,
            };
            st.homes.insert(ino, h.clone());
            self.claims_won.fetch_add(1, Ordering::Relaxed);
            Ok(h)
        })
    }

    fn cached_home(&self, ino: InodeId) -> Option<Home> {
        self.cluster.state.lock().homes.get(&ino).cloned()
    }

    fn claim_shown(&self, ino: InodeId, token: i64) -> bool {
        let node = self.me.lock().node.clone();
        self.cluster
            .state
            .lock()
            .homes
            .get(&ino)
            .is_some_and(|h| h.token == token && h.member.node == node)
    }

    fn members(&self) -> Vec<Member> {
        self.cluster.state.lock().members.values().cloned().collect()
    }

    fn give_back(&self, ino: InodeId, token: i64) -> BoxFuture<'_, Result<(), ClusterError>> {
        Box::pin(async move {
            let delay = self.cluster.state.lock().give_back_delay;
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if self.fenced() {
                return Err(ClusterError::Fenced);
            }
            let mut st = self.cluster.state.lock();
            self.txns.fetch_add(1, Ordering::Relaxed);
            if st.homes.get(&ino).is_none_or(|h| h.token != token) {
                return Ok(());
            }
            st.homes.remove(&ino);
            st.rev += 1;
            // Every member is told, this one too, as etcd's watch does.
            for tx in st.subscribers.values() {
                let _ = tx.send(DirectoryEvent::HomeGone { ino, token });
            }
            Ok(())
        })
    }

    fn events(&self) -> broadcast::Receiver<DirectoryEvent> {
        self.tx.subscribe()
    }

    fn fenced(&self) -> bool {
        if self.fence_in.load(Ordering::Relaxed) >= 0 && self.fence_in.fetch_sub(1, Ordering::SeqCst) == 0 {
            self.cluster.fence(self);
        }
        self.fenced.load(Ordering::Relaxed)
    }

    fn publish_waits(
        &self,
        current: Vec<WaitEdge>,
        new: Vec<WaitEdge>,
    ) -> BoxFuture<'_, Result<Vec<WaitCycle>, ClusterError>> {
        Box::pin(async move {
            if self.fenced() {
                return Err(ClusterError::Fenced);
            }
            let node = self.me().node;
            let mut st = self.cluster.state.lock();
            self.txns.fetch_add(1, Ordering::Relaxed);
            let others: Vec<PublishedEdge> = st
                .waits
                .iter()
                .filter(|(n, _)| **n != node)
                .flat_map(|(n, es)| {
                    es.iter().map(move |e| PublishedEdge {
                        edge: *e,
                        node: n.clone(),
                    })
                })
                .chain(current.iter().map(|e| PublishedEdge {
                    edge: *e,
                    node: node.clone(),
                }))
                .collect();
            let cycles = crate::wait_graph::find_cycles(&others, &new);
            if cycles.is_empty() {
                st.rev += 1;
                if current.is_empty() {
                    st.waits.remove(&node);
                } else {
                    st.waits.insert(node, current);
                }
                self.publications.fetch_add(1, Ordering::Relaxed);
            }
            Ok(cycles)
        })
    }

    fn stats(&self) -> DirectoryStats {
        DirectoryStats {
            etcd_txns: self.txns.load(Ordering::Relaxed),
            claims_won: self.claims_won.load(Ordering::Relaxed),
            claims_lost: self.claims_lost.load(Ordering::Relaxed),
            wait_publications: self.publications.load(Ordering::Relaxed),
            fences: self.fences.load(Ordering::Relaxed),
        }
    }
}
