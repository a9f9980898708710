//! The peer service: what this member answers as an inode's home (lock calls, closes,
//! interrupts) and as a holder of shadow locks (reclaim), and whether its waits are
//! current (deadlock confirmation).

use std::sync::Arc;

use tonic::{Request as Rpc, Response, Status};

use crate::call::CallCtl;
use crate::close::{remove_at, Removal};
use crate::peer::{self, pb, MOVED};
use crate::request::{LockOwner, Started};
use crate::service::Service;
use crate::stats::Counters;
use crate::InodeId;

/// The tonic service over the shared [`Service`].
pub(crate) struct PeerService {
    pub svc: Arc<Service>,
}

impl PeerService {
    async fn serve_lock(&self, m: pb::LockRequest) -> pb::LockReply {
        let svc = &self.svc;
        let caller = m.caller.clone().unwrap_or_default();
        if svc.is_dead(&caller.node, caller.lease) {
            return peer::status_reply(pb::Status::Gone);
        }
        if svc.dir.fenced() {
            return peer::status_reply(pb::Status::Moved);
        }
        let g = match peer::decode_lock(&m) {
            Ok(g) => g,
            Err(e) => return peer::reply_of(Err(e)),
        };
        let Some(hi) = svc.home_for_peer(g.ino, m.token).await else {
            return peer::status_reply(pb::Status::Moved);
        };
        if g.changes_locks() {
            match g.lock_owner() {
                LockOwner::Posix(o) => hi.note_peer(&caller.node, caller.lease, Some(o), None),
                LockOwner::File(f) => hi.note_peer(&caller.node, caller.lease, None, Some(f)),
            }
        }
        Counters::bump(&svc.counters.served_for_peers);
        let r = match g.start(&hi.ctx) {
            Err(e) => Err(e),
            // Fenced while it ran: the caller resolves the home again.
            Ok(Started::Done(_)) if svc.dir.fenced() => Err(MOVED),
            Ok(Started::Done(fl)) => Ok(fl),
            Ok(Started::Waiting(p, fl)) => {
                // Dropping this future (the caller's stream broke) drops the pending
                // request: it leaves the wait tree, as an interrupted F_SETLKW does.
                let ctl = CallCtl::new();
                let r = svc
                    .finish_wait(
                        hi.ino,
                        g,
                        p,
                        fl,
                        &ctl,
                        Some((caller.node.clone(), caller.lease, m.call_id)),
                    )
                    .await;
                ctl.finish(r)
            }
        };
        if r.is_ok() && svc.is_dead(&caller.node, caller.lease) {
            // Granted to a member that died meanwhile: its owners' locks go.
            hi.drop_peer(&caller.node, caller.lease);
            return peer::status_reply(pb::Status::Gone);
        }
        if r == Err(MOVED) {
            return peer::status_reply(pb::Status::Moved);
        }
        peer::reply_of(r)
    }

    async fn serve_remove(&self, m: pb::RemoveRequest) -> pb::LockReply {
        let svc = &self.svc;
        let caller = m.caller.clone().unwrap_or_default();
        if svc.is_dead(&caller.node, caller.lease) {
            return peer::status_reply(pb::Status::Gone);
        }
        let Some(hi) = svc.home_for_peer(InodeId(m.ino), m.token).await else {
            return peer::status_reply(pb::Status::Moved);
        };
        Counters::bump(&svc.counters.served_for_peers);
        let what = if m.posix_owner {
            Removal::Posix {
                owner: m.id,
                pid: m.pid,
            }
        } else {
            Removal::File { file: m.id }
        };
        remove_at(&hi.ctx, what, None);
        hi.forget_peer_id(&caller.node, m.posix_owner, m.id);
        peer::reply_of(Ok(vfscale_locks::Flock::new(
            vfscale_locks::LockType::Unlock,
            0,
            0,
        )))
    }
}

#[tonic::async_trait]
impl pb::peer_server::Peer for PeerService {
    async fn lock(&self, r: Rpc<pb::LockRequest>) -> Result<Response<pb::LockReply>, Status> {
        Ok(Response::new(self.serve_lock(r.into_inner()).await))
    }

    async fn interrupt(&self, r: Rpc<pb::InterruptRequest>) -> Result<Response<pb::Empty>, Status> {
        let m = r.into_inner();
        let caller = m.caller.unwrap_or_default();
        self.svc.waiting.interrupt_peer(&caller.node, m.call_id);
        Ok(Response::new(pb::Empty {}))
    }

    async fn remove(&self, r: Rpc<pb::RemoveRequest>) -> Result<Response<pb::LockReply>, Status> {
        Ok(Response::new(self.serve_remove(r.into_inner()).await))
    }

    async fn reclaim(&self, r: Rpc<pb::ReclaimRequest>) -> Result<Response<pb::ReclaimReply>, Status> {
        let m = r.into_inner();
        let svc = &self.svc;
        let caller = m.caller.unwrap_or_default();
        let ino = InodeId(m.ino);
        let Some(sh) = svc.shadow.get(ino) else {
            return Ok(Response::new(pb::ReclaimReply::default()));
        };
        {
            let mut h = sh.home.lock();
            if h.1 <= m.token {
                *h = (caller.node.clone(), m.token);
            }
        }
        let seed = svc.seed();
        let locks: Vec<pb::HeldLock> = sh
            .ctx
            .held_locks()
            .iter()
            .map(|l| peer::encode_held(l, seed))
            .collect();
        Counters::add(&svc.counters.reclaimed, locks.len() as u64);
        tracing::info!(ino = m.ino, home = %caller.node, locks = locks.len(), "locks re-sent to a new home");
        Ok(Response::new(pb::ReclaimReply { locks }))
    }

    async fn is_waiting(&self, r: Rpc<pb::IsWaitingRequest>) -> Result<Response<pb::IsWaitingReply>, Status> {
        let m = r.into_inner();
        let waiting = self
            .svc
            .mgr
            .posix_wait_edges()
            .iter()
            .any(|e| e.waiter.0 == m.waiter && e.blocker.0 == m.blocker);
        Ok(Response::new(pb::IsWaitingReply { waiting }))
    }
}
