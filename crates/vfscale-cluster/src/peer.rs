//! The peer protocol's wire types (generated from `proto/peer.proto`), the conversions
//! between them and the service's requests, and the pool of connections to peers (one
//! HTTP/2 channel per peer, reused by every call).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use parking_lot::Mutex;
use tonic::transport::{Channel, Endpoint};
use vfscale_locks::{AccessMode, Errno, FcntlCmd, FileLock, Flock, FlockOp, LockKind, LockType, OwnerKey};

use crate::ids::IdSeed;
use crate::request::{Op, Request};
use crate::{ClusterError, InodeId, Member};

/// The generated messages and service.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub(crate) mod pb {
    tonic::include_proto!("vfscale.cluster.v1");
}

pub(crate) use pb::peer_client::PeerClient;

/// Errno sentinel inside the service: the call must go to the inode's home again (this
/// member stopped being its home while the call waited). Never given to a client.
pub(crate) const MOVED: Errno = Errno::Other(-1);

fn mode_raw(m: AccessMode) -> i32 {
    match m {
        AccessMode::Read => 0,
        AccessMode::Write => 1,
        AccessMode::ReadWrite => 2,
    }
}

fn mode_of(v: i32) -> Result<AccessMode, Errno> {
    Ok(match v {
        0 => AccessMode::Read,
        1 => AccessMode::Write,
        2 => AccessMode::ReadWrite,
        _ => return Err(Errno::EINVAL),
    })
}

fn cmd_of(v: i32) -> Result<FcntlCmd, Errno> {
    FcntlCmd::from_raw(v).ok_or(Errno::EINVAL)
}

fn type_of(v: i32) -> Result<LockType, Errno> {
    LockType::from_raw(i16::try_from(v).map_err(|_| Errno::EINVAL)?)
}

/// The request as sent: global ids, the range from `SEEK_SET`.
pub(crate) fn encode_lock(g: &Request, caller: &pb::Caller, call_id: u64, token: i64) -> pb::LockRequest {
    let mut m = pb::LockRequest {
        caller: Some(caller.clone()),
        call_id,
        ino: g.ino.0,
        token,
        owner: g.owner,
        pid: g.pid,
        file: g.file,
        mode: mode_raw(g.mode),
        ..Default::default()
    };
    match g.op {
        Op::Fcntl { cmd, fl } => {
            m.kind = pb::Kind::Fcntl as i32;
            m.cmd = cmd.raw();
            m.l_type = i32::from(fl.l_type.raw());
            m.l_start = fl.l_start;
            m.l_len = fl.l_len;
            m.l_pid = fl.l_pid;
        }
        Op::Flock { op, nb } => {
            m.kind = pb::Kind::Flock as i32;
            m.l_type = i32::from(op.lock_type().raw());
            m.nb = nb;
        }
    }
    m
}

/// The request a peer sent, with its global ids; `EINVAL` for values no member sends.
pub(crate) fn decode_lock(m: &pb::LockRequest) -> Result<Request, Errno> {
    let op = if m.kind == pb::Kind::Flock as i32 {
        let op = match type_of(m.l_type)? {
            LockType::Read => FlockOp::Shared,
            LockType::Write => FlockOp::Exclusive,
            LockType::Unlock => FlockOp::Unlock,
        };
        Op::Flock { op, nb: m.nb }
    } else {
        let mut fl = Flock::new(type_of(m.l_type)?, m.l_start, m.l_len);
        fl.l_pid = m.l_pid;
        Op::Fcntl {
            cmd: cmd_of(m.cmd)?,
            fl,
        }
    };
    Ok(Request {
        ino: InodeId(m.ino),
        owner: m.owner,
        pid: m.pid,
        file: m.file,
        mode: mode_of(m.mode)?,
        op,
    })
}

/// A finished call's reply.
pub(crate) fn reply_of(r: Result<Flock, Errno>) -> pb::LockReply {
    match r {
        Ok(fl) => pb::LockReply {
            status: pb::Status::Done as i32,
            errno: 0,
            l_type: i32::from(fl.l_type.raw()),
            l_start: fl.l_start,
            l_len: fl.l_len,
            l_pid: fl.l_pid,
        },
        Err(e) if e == MOVED => status_reply(pb::Status::Moved),
        Err(e) => pb::LockReply {
            status: pb::Status::Done as i32,
            errno: e.raw(),
            ..Default::default()
        },
    }
}

/// A reply that only carries a status.
pub(crate) fn status_reply(s: pb::Status) -> pb::LockReply {
    pb::LockReply {
        status: s as i32,
        ..Default::default()
    }
}

/// What a `Done` reply answers: `asked` (the caller's own flock, before its range
/// was made absolute) filled in as `F_GETLK` does.
pub(crate) fn result_of(m: &pb::LockReply, asked: &Op) -> Result<Flock, Errno> {
    if m.errno != 0 {
        return Err(Errno::from_raw(m.errno));
    }
    let mut fl = match asked {
        Op::Fcntl { fl, .. } => *fl,
        Op::Flock { op, .. } => Flock::new(op.lock_type(), 0, 0),
    };
    if let Op::Fcntl { cmd, .. } = asked {
        let ty = type_of(m.l_type).unwrap_or(LockType::Unlock);
        // As F_GETLK: with no conflict only l_type changes (the rest stays as asked,
        // l_whence included); a conflict is described from SEEK_SET.
        if cmd.is_get() && ty == LockType::Unlock {
            fl.l_type = LockType::Unlock;
        } else if cmd.is_get() {
            fl = Flock::new(ty, m.l_start, m.l_len);
            fl.l_pid = m.l_pid;
        }
    }
    Ok(fl)
}

/// A held lock as sent by a reclaim, with ids under `seed`.
pub(crate) fn encode_held(l: &FileLock, seed: IdSeed) -> pb::HeldLock {
    let owner = match l.owner {
        OwnerKey::Process(o) => o.0,
        OwnerKey::File(f) => f.0,
    };
    pb::HeldLock {
        kind: match l.kind {
            LockKind::Posix => 0,
            LockKind::Ofd => 1,
            LockKind::Flock => 2,
        },
        l_type: i32::from(l.ty.raw()),
        start: l.start,
        end: l.end,
        owner: seed.global(owner).0,
        file: seed.global(l.file.0).0,
        pid: l.pid.0,
    }
}

/// A reclaimed lock, as the new home applies it.
pub(crate) fn decode_held(m: &pb::HeldLock) -> Option<FileLock> {
    let kind = match m.kind {
        0 => LockKind::Posix,
        1 => LockKind::Ofd,
        2 => LockKind::Flock,
        _ => return None,
    };
    let owner = if kind == LockKind::Posix {
        OwnerKey::Process(vfscale_locks::OwnerId(m.owner))
    } else {
        OwnerKey::File(vfscale_locks::FileId(m.owner))
    };
    Some(FileLock {
        kind,
        ty: type_of(m.l_type).ok()?,
        start: m.start,
        end: m.end,
        owner,
        file: vfscale_locks::FileId(m.file),
        pid: vfscale_locks::Pid(m.pid),
    })
}

/// How long a connection attempt to a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// One channel per peer, by node, remade when the peer's address changes.
#[derive(Default)]
pub(crate) struct Peers {
    map: Mutex<HashMap<String, (SocketAddr, PeerClient<Channel>)>>,
}

impl Peers {
    /// The client of `m` (connects lazily). Inside the runtime.
    pub fn client(&self, m: &Member) -> Result<PeerClient<Channel>, ClusterError> {
        let mut map = self.map.lock();
        if let Some((a, c)) = map.get(&m.node) {
            if *a == m.addr {
                return Ok(c.clone());
            }
        }
        let ep = Endpoint::from_shared(format!("http://{}", m.addr))
            .map_err(|e| ClusterError::Peer(format!("{}: {e}", m.addr)))?
            .tcp_nodelay(true)
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(2))
            .keep_alive_while_idle(true);
        let c = PeerClient::new(ep.connect_lazy());
        map.insert(m.node.clone(), (m.addr, c.clone()));
        Ok(c)
    }

    /// Forgets `node`'s channel (it died).
    pub fn forget(&self, node: &str) {
        self.map.lock().remove(node);
    }
}
