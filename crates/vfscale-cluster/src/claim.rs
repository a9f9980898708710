//! Claiming an inode: this member became its home in the directory; before it serves
//! the inode it re-creates the locks its own clients hold there (its shadow) and asks
//! every live member for theirs (reclaim). Calls that arrive meanwhile, local or from
//! peers, wait for the claim.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::OnceCell;
use vfscale_locks::{
    AccessMode, Errno, FcntlCmd, FileLock, FileLockContext, FlockOp, LockKind, LockType, OpenFile, OwnerId,
    OwnerKey, Process,
};

use crate::homes::{context_for, HomeInode};
use crate::peer::{self, pb};
use crate::request::flock_of_range;
use crate::service::{Service, EIO};
use crate::stats::Counters;
use crate::InodeId;

/// How long a new home waits for a member's reclaim answer (a member that does not
/// answer is stopped or partitioned: its lease ends soon, and its clients' locks with
/// it).
const RECLAIM_TIMEOUT: Duration = Duration::from_secs(1);

/// A claim in progress: its token and the home state it makes.
pub(crate) type Claim = Arc<(i64, OnceCell<Result<Arc<HomeInode>, Errno>>)>;

impl Service {
    /// The home state of `ino` under `token`, claiming it (with reclaim) when this
    /// member just became its home. Concurrent callers share one claim.
    pub async fn home_inode(self: &Arc<Self>, ino: InodeId, token: i64) -> Result<Arc<HomeInode>, Errno> {
        if let Some(hi) = self.homes.get(ino) {
            if hi.token >= token {
                return Ok(hi);
            }
        }
        let claim = {
            let mut c = self.claims.lock();
            c.entry(ino)
                .or_insert_with(|| Arc::new((token, OnceCell::new())))
                .clone()
        };
        let r = claim
            .1
            .get_or_init(|| self.clone().become_home(ino, claim.0))
            .await
            .clone();
        let mut c = self.claims.lock();
        if c.get(&ino).is_some_and(|x| Arc::ptr_eq(x, &claim)) {
            c.remove(&ino);
        }
        r
    }

    /// The home state a peer's call with `token` may use: the current one, or the one
    /// a claim in progress is making; `None`: not the home (the peer resolves again).
    pub async fn home_for_peer(&self, ino: InodeId, token: i64) -> Option<Arc<HomeInode>> {
        if let Some(hi) = self.homes.get(ino) {
            return (hi.token == token).then_some(hi);
        }
        let claim = self.claims.lock().get(&ino).cloned()?;
        if claim.0 != token {
            return None;
        }
        // The claim's owner drives it; wait for it to finish.
        loop {
            if let Some(r) = claim.1.get() {
                return r.as_ref().ok().filter(|h| h.token == token).cloned();
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// This member just became `ino`'s home: re-create its own clients' locks (its
    /// shadow) and every live member's (reclaim), then serve.
    async fn become_home(self: Arc<Self>, ino: InodeId, token: i64) -> Result<Arc<HomeInode>, Errno> {
        let hi = Arc::new(HomeInode {
            ino,
            token,
            ctx: context_for(&self.mgr, ino),
            peers: Mutex::new(HashMap::new()),
        });
        // The claim is under this lease; a rejoin meanwhile makes it void.
        let lease = self.me().lease;
        let seed = self.seed();
        let mut n = 0u64;
        if let Some(sh) = self.shadow.take(ino) {
            for l in sh.ctx.held_locks() {
                if let Some(g) = peer::decode_held(&peer::encode_held(&l, seed)) {
                    apply_held(&hi.ctx, &g);
                    n += 1;
                }
            }
        }
        // Every live member at once: one that does not answer in time (stopped, not
        // yet seen dead) delays the claim by one timeout, not one per member.
        let me = self.me();
        let caller = self.caller();
        let mut asks = tokio::task::JoinSet::new();
        for m in self.dir.members() {
            if m.node == me.node || self.is_dead(&m.node, m.lease) {
                continue;
            }
            let Ok(mut c) = self.peers.client(&m) else {
                continue;
            };
            let ask = pb::ReclaimRequest {
                caller: Some(caller.clone()),
                ino: ino.0,
                token,
            };
            asks.spawn(async move { (tokio::time::timeout(RECLAIM_TIMEOUT, c.reclaim(ask)).await, m) });
        }
        while let Some(Ok((r, m))) = asks.join_next().await {
            match r {
                Ok(Ok(reply)) => {
                    for l in reply.into_inner().locks.iter().filter_map(peer::decode_held) {
                        apply_held(&hi.ctx, &l);
                        let (owner, file) = match l.owner {
                            OwnerKey::Process(o) => (Some(o.0), None),
                            OwnerKey::File(f) => (None, Some(f.0)),
                        };
                        hi.note_peer(&m.node, m.lease, owner, file);
                        n += 1;
                    }
                }
                Ok(Err(status)) => {
                    tracing::warn!(node = %m.node, ino = ino.0, %status, "reclaim failed")
                }
                Err(_) => tracing::warn!(node = %m.node, ino = ino.0, "reclaim timed out"),
            }
        }
        if !self.insert_home_under(lease, &hi) {
            return Err(EIO);
        }
        Counters::add(&self.counters.reclaimed, n);
        Counters::bump(&self.counters.homes_claimed);
        if n > 0 {
            tracing::info!(ino = ino.0, token, locks = n, "home claimed; locks reclaimed");
        }
        Ok(hi)
    }
}

/// Re-creates a held lock (global ids) at a new home. A conflict means two members
/// disagree about what was held: the lock is not granted twice, it is logged.
pub(crate) fn apply_held(ctx: &Arc<FileLockContext>, l: &FileLock) {
    let rw = AccessMode::ReadWrite;
    let r = match (l.kind, l.owner) {
        (LockKind::Posix, OwnerKey::Process(o)) => ctx.fcntl(
            Process { owner: o, pid: l.pid },
            OpenFile { id: l.file, mode: rw },
            FcntlCmd::SetLk,
            &mut flock_of_range(l.ty, l.start, l.end),
        ),
        (LockKind::Ofd, OwnerKey::File(f)) => ctx.fcntl(
            Process {
                owner: OwnerId(0),
                pid: l.pid,
            },
            OpenFile { id: f, mode: rw },
            FcntlCmd::OfdSetLk,
            &mut flock_of_range(l.ty, l.start, l.end),
        ),
        (LockKind::Flock, OwnerKey::File(f)) => {
            let op = if l.ty == LockType::Write {
                FlockOp::Exclusive
            } else {
                FlockOp::Shared
            };
            ctx.flock(
                Process {
                    owner: OwnerId(0),
                    pid: l.pid,
                },
                OpenFile { id: f, mode: rw },
                op,
                true,
            )
        }
        _ => Err(Errno::EINVAL),
    };
    if let Err(e) = r {
        tracing::error!(?l, %e, "a reclaimed lock conflicts with one already re-created; not granted");
    }
}
