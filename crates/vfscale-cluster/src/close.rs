//! Closes: `close(2)` of a descriptor drops its process's POSIX locks on the inode,
//! the last close of an open file its OFD and flock locks, at the home (one round trip
//! when it is remote) and in the shadow.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vfscale_locks::{FileId, FileLockContext, OwnerId, Pid, Process};

use crate::ids::IdSeed;
use crate::peer::{pb, MOVED};
use crate::service::Service;
use crate::stats::Counters;
use crate::InodeId;

/// What a close drops.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Removal {
    Posix { owner: u64, pid: i32 },
    File { file: u64 },
}

impl Service {
    /// close(2) / last close at the home of `ino`; returns once applied.
    pub async fn remove(self: Arc<Self>, ino: InodeId, what: Removal) {
        // Out of the shadow first, as an unlock (see the lock path): a home that applied
        // the close may give the inode back before this call returns.
        if let Some(s) = self.shadow.get(ino) {
            remove_at(&s.ctx, what, None);
        }
        let deadline = Instant::now() + self.dir.lease_ttl() * 2 + Duration::from_secs(1);
        loop {
            let Ok(home) = self.dir.home(ino).await else {
                break;
            };
            if self.is_me(&home.member) {
                match self.home_inode(ino, home.token).await {
                    Ok(hi) => remove_at(&hi.ctx, what, Some(self.seed())),
                    // Given back meanwhile: the directory names the next home soon.
                    Err(e) if e == MOVED && Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                    Err(_) => {}
                }
                break;
            }
            let Ok(mut c) = self.peers.client(&home.member) else {
                break;
            };
            let seed = self.seed();
            let (posix_owner, id, pid) = match what {
                Removal::Posix { owner, pid } => (true, seed.global(owner).0, pid),
                Removal::File { file } => (false, seed.global(file).0, 0),
            };
            let ask = pb::RemoveRequest {
                caller: Some(self.caller()),
                ino: ino.0,
                token: home.token,
                posix_owner,
                id,
                pid,
            };
            Counters::bump(&self.counters.remote_calls);
            let cancel = {
                let id = self.next_call.fetch_add(1, Ordering::Relaxed);
                (id, self.in_flight.add(id, &home, ino))
            };
            let r = tokio::select! {
                r = c.remove(ask) => Some(r),
                _ = cancel.1.notified() => None,
            };
            self.in_flight.remove(cancel.0);
            match r.map(|r| r.map(|m| pb::Status::try_from(m.into_inner().status))) {
                Some(Ok(Ok(pb::Status::Done))) | Some(Ok(Ok(pb::Status::Gone))) => break,
                _ if Instant::now() > deadline => break,
                _ => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
}

/// Applies a close to a context: a home's (ids made global under `seed`) or the
/// shadow's (`None`: local ids as they are).
pub(crate) fn remove_at(ctx: &Arc<FileLockContext>, what: Removal, seed: Option<IdSeed>) {
    let map = |id: u64| seed.map_or(id, |s| s.global(id).0);
    match what {
        Removal::Posix { owner, pid } => ctx.posix_remove_owner(Process {
            owner: OwnerId(map(owner)),
            pid: Pid(pid),
        }),
        Removal::File { file } => ctx.file_remove(FileId(map(file))),
    }
}
