//! [`ClusterLocks`]: the lock calls an embedding server makes, by its own ids.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::runtime::Runtime;
use vfscale_locks::{AccessMode, FcntlCmd, FileId, Flock, FlockOp, OwnerId, Pid, Process};

use crate::call::{LockCall, LockDone};
use crate::close::Removal;
use crate::etcd_join::LeaveFn;
use crate::request::{LockOwner, Op, Request};
use crate::server::PeerService;
use crate::service::{Done, Service};
use crate::stats::ClusterStats;
use crate::{ClusterConfig, ClusterError, Directory, InodeId, Member};

/// A POSIX lock owner as the embedding server names it (for vfscalefs: its owner id of
/// the FUSE `lock_owner`), with the pid `F_GETLK` reports for its locks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClusterProcess {
    /// The server's own id of the owner.
    pub owner: u64,
    /// The pid its clients see.
    pub pid: i32,
}

/// An open file description as the embedding server names it (for vfscalefs: the file
/// handle), with its access mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClusterFile {
    /// The server's own id of the open file.
    pub id: u64,
    /// How it was opened (a write lock needs a writable file).
    pub mode: AccessMode,
}

/// The cluster's lock service, one per server process.
///
/// Lock calls return at once; their `done` is called exactly once with the answer,
/// maybe before the call returns (when the inode is homed here and nothing waits).
pub struct ClusterLocks {
    svc: Arc<Service>,
    rt: Mutex<Option<Runtime>>,
    leave: Mutex<Option<LeaveFn>>,
}

/// A call of `who` through `file` on `ino`, by this member's own ids.
#[inline]
fn request(ino: InodeId, who: ClusterProcess, file: ClusterFile, op: Op) -> Request {
    Request {
        ino,
        owner: who.owner,
        pid: who.pid,
        file: file.id,
        mode: file.mode,
        op,
    }
}

/// The runtime's worker threads: one per CPU, between 2 and 16. Peers' calls, waits and
/// the directory's streams are light (the lock path itself runs on the caller's
/// threads), but a home serving many members' calls must not queue them behind two
/// threads on a large machine.
fn workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 16))
}

impl ClusterLocks {
    /// The service behind this handle (tests of the event handlers).
    #[cfg(test)]
    pub(crate) fn service(&self) -> &Arc<Service> {
        &self.svc
    }

    /// Starts a runtime of its own, the peer service on `cfg.peer_listen`, and joins
    /// the cluster through etcd. Blocking; call it outside any tokio runtime.
    pub fn join(cfg: ClusterConfig) -> Result<Arc<ClusterLocks>, ClusterError> {
        cfg.validate()?;
        let node = cfg.node_name();
        let c2 = cfg.clone();
        let leave = Arc::new(Mutex::new(None));
        let slot = leave.clone();
        let me = ClusterLocks::with_directory(cfg.peer_listen, move |addr| async move {
            let (dir, leave) = crate::etcd_join::join_etcd(c2, node, addr).await?;
            *slot.lock() = Some(leave);
            Ok(dir)
        })?;
        if let Some(f) = leave.lock().take() {
            me.set_leave(f);
        }
        me.set_home_idle(cfg.home_idle);
        Ok(me)
    }

    /// The same over any directory (tests use [`crate::memdir`]). `make_dir` runs
    /// inside the runtime and is given the address the peer service bound.
    pub fn with_directory<F, Fut>(
        peer_listen: SocketAddr,
        make_dir: F,
    ) -> Result<Arc<ClusterLocks>, ClusterError>
    where
        F: FnOnce(SocketAddr) -> Fut,
        Fut: Future<Output = Result<Arc<dyn Directory>, ClusterError>> + Send + 'static,
    {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers())
            .thread_name("vfscale-cluster")
            .enable_all()
            .build()
            .map_err(|e| ClusterError::Config(format!("cannot start the runtime: {e}")))?;
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(peer_listen))
            .map_err(|e| ClusterError::Config(format!("peer listen address {peer_listen}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| ClusterError::Config(format!("peer listen address {peer_listen}: {e}")))?;
        let dir = rt
            .block_on(rt.spawn(make_dir(addr)))
            .map_err(|e| ClusterError::Config(format!("joining failed: {e}")))??;
        let events = dir.events();
        let svc = Arc::new(Service::new(dir, rt.handle().clone()));
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let server = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            // Every waiting F_SETLKW of a member is one open stream: no stream limit
            // (hyper's own default is 200) may queue the unlock that would end them.
            .max_concurrent_streams(None)
            .add_service(crate::peer::pb::peer_server::PeerServer::new(PeerService {
                svc: svc.clone(),
            }));
        rt.spawn(async move {
            if let Err(e) = server.serve_with_incoming(incoming).await {
                tracing::error!(%e, "peer service stopped");
            }
        });
        rt.spawn(crate::events::run(svc.clone(), events));
        rt.spawn(crate::waits::run(svc.clone()));
        rt.spawn(crate::give_back::run(svc.clone()));
        let me = svc.me();
        tracing::info!(node = %me.node, lease = me.lease, peer = %addr, "joined the cluster");
        Ok(Arc::new(ClusterLocks {
            svc,
            rt: Mutex::new(Some(rt)),
            leave: Mutex::new(None),
        }))
    }

    /// Sets what [`ClusterLocks::leave`] runs (the directory's orderly leave).
    fn set_leave(&self, f: LeaveFn) {
        *self.leave.lock() = Some(f);
    }

    /// How long an inode homed here stays idle (no lock held, nothing waiting, no call
    /// in progress) before this member gives it back: the inode leaves its table and
    /// its ownership key is deleted; the next lock on it claims it again. Zero: never.
    /// [`crate::HOME_IDLE`] unless set.
    pub fn set_home_idle(&self, idle: std::time::Duration) {
        self.svc.set_home_idle(idle);
    }

    /// This member, with its current lease.
    pub fn me(&self) -> Member {
        self.svc.me()
    }

    /// The directory this member runs on.
    pub fn directory(&self) -> &Arc<dyn Directory> {
        &self.svc.dir
    }

    /// `F_GETLK`/`F_SETLK`/`F_SETLKW` and the OFD commands on `ino`. `done` gets the
    /// answer: for `F_GETLK`, the flock with `l_type` `F_UNLCK` or the conflicting lock
    /// (`l_pid` as its own server saw it); for the others `fl` as given.
    pub fn fcntl(
        &self,
        ino: InodeId,
        who: ClusterProcess,
        file: ClusterFile,
        cmd: FcntlCmd,
        fl: Flock,
        done: LockDone<Flock>,
    ) -> LockCall {
        self.svc
            .call(request(ino, who, file, Op::Fcntl { cmd, fl }), Done::Fcntl(done))
    }

    /// `flock(2)` on `ino` through `file` (`nb`: `LOCK_NB`).
    pub fn flock(
        &self,
        ino: InodeId,
        who: ClusterProcess,
        file: ClusterFile,
        op: FlockOp,
        nb: bool,
        done: LockDone<()>,
    ) -> LockCall {
        self.svc
            .call(request(ino, who, file, Op::Flock { op, nb }), Done::Flock(done))
    }

    /// `close(2)` of a descriptor of `who` (FUSE `FLUSH`): drops `who`'s POSIX locks
    /// on `ino`. Returns once the home applied it: at once when the home is here, one
    /// round trip when remote, nothing at all when `who` holds nothing there. Call it
    /// outside the runtime's threads.
    pub fn posix_remove_owner(&self, ino: InodeId, who: ClusterProcess) {
        let svc = &self.svc;
        // A lost owner's close goes to the home whatever the shadow holds: an unlock
        // that never reached it left the shadow but maybe not the home.
        let lost = svc.lost.clear(ino, LockOwner::Posix(who.owner));
        let seed = svc.seed();
        let here = svc.homes.with(ino, |hi| {
            hi.ctx.posix_remove_owner(Process {
                owner: OwnerId(seed.global(who.owner).0),
                pid: Pid(who.pid),
            })
        });
        if here.is_some() || !(lost || svc.shadow.posix_holds(ino, who.owner)) {
            return;
        }
        let what = Removal::Posix {
            owner: who.owner,
            pid: who.pid,
        };
        svc.block_on(svc.clone().remove(ino, what));
    }

    /// The last close of an open file (FUSE `RELEASE`): drops its OFD and flock locks
    /// on `ino`, as [`ClusterLocks::posix_remove_owner`] does.
    pub fn file_remove(&self, ino: InodeId, file: ClusterFile) {
        let svc = &self.svc;
        let lost = svc.lost.clear(ino, LockOwner::File(file.id));
        let seed = svc.seed();
        let here = svc
            .homes
            .with(ino, |hi| hi.ctx.file_remove(FileId(seed.global(file.id).0)));
        if here.is_some() || !(lost || svc.shadow.file_holds(ino, file.id)) {
            return;
        }
        svc.block_on(svc.clone().remove(ino, Removal::File { file: file.id }));
    }

    /// Whether `who`'s POSIX locks on `ino` were lost with a lease (its lock calls
    /// answer `EIO` until it closes the file; the server may fail its I/O too).
    pub fn posix_lost(&self, ino: InodeId, who: ClusterProcess) -> bool {
        self.svc.lost.contains(ino, LockOwner::Posix(who.owner))
    }

    /// Whether `file`'s OFD or flock locks on `ino` were lost with a lease.
    pub fn file_lost(&self, ino: InodeId, file: ClusterFile) -> bool {
        self.svc.lost.contains(ino, LockOwner::File(file.id))
    }

    /// The counters, with the directory's.
    pub fn stats(&self) -> ClusterStats {
        self.svc.counters.snapshot(
            self.svc.homes.len() as u64,
            self.svc.waiting.len() as u64,
            self.svc.dir.stats(),
        )
    }

    /// Leaves the cluster in order (the lease is revoked: homes and registration go at
    /// once) and stops the peer service. Also done on drop. Calls still waiting, and
    /// every call made after, answer `EIO`.
    pub fn leave(&self) {
        let Some(rt) = self.rt.lock().take() else {
            return;
        };
        self.svc.close();
        if let Some(f) = self.leave.lock().take() {
            let _ = rt.block_on(rt.spawn(f()));
        }
        rt.shutdown_background();
    }
}

impl Drop for ClusterLocks {
    fn drop(&mut self) {
        self.leave();
    }
}

impl std::fmt::Debug for ClusterLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterLocks").field("me", &self.me()).finish()
    }
}
