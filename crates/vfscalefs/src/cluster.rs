//! `--cluster`: several vfscalefs servers on one shared source, one lock space. Every
//! lock call goes to [`vfscale_cluster::ClusterLocks`] instead of the server's own
//! lock manager; the ids are those the server uses without a cluster.
//!
//! | FUSE | cluster call |
//! |---|---|
//! | `GETLK`, `SETLK`, `SETLKW` | [`ClusterLocks::fcntl`] on `InodeId(st_ino)`, `ClusterProcess{owner: owner_id(conn, lock_owner), pid}`, `ClusterFile{id: fh, mode}` |
//! | flock (`FUSE_LK_FLOCK`) | [`ClusterLocks::flock`] |
//! | `INTERRUPT` | [`LockCall::interrupt`] of the parked call |
//! | `FLUSH` | [`ClusterLocks::posix_remove_owner`], where the owner set locks on the inode |
//! | `RELEASE` | `posix_remove_owner` for the owners that used only released handles (OFD locks, see `locks.rs`), [`ClusterLocks::file_remove`] where a flock request came through the file |
//!
//! # Coherence at lock boundaries
//!
//! Another server's clients change the shared file under their locks; this server's
//! clients must see those changes once they are granted a conflicting lock (as NFS at a
//! lock grant). So before a grant is answered, the source file is `stat`ed and, where
//! its times or size differ from what the connection's kernel was last known to cache
//! (`mirror/views.rs`, the check the source-lock mirrors make for processes on the
//! source), its cached attributes and data go (`FUSE_NOTIFY_INVAL_INODE`), and the
//! first grant on a file marks its directory so that its entries are answered with no
//! cache time (a rollback journal deleted through another server must not still show;
//! `Server::grant_coherence`). An unchanged file costs one `stat`. A change never made
//! under a lock (a process that writes without locking) is not ordered by any grant, as
//! on NFS. Writes reach the source before the writer's unlock (through the server, or
//! kernel passthrough), except writes through a shared mapping, which the kernel writes
//! back later: the FUSE client does not flush them at an unlock as the NFS client does.
//!
//! # Lost locks
//!
//! When this server's lease could not be renewed in time, the cluster fences it: its
//! clients' locks are gone (another server may grant them), and their next lock call on
//! the file answers `EIO` ([`ClusterLocks`] remembers them until the owner's close).
//! Reads and writes the server serves itself (no kernel passthrough) through a handle
//! whose owners lost locks answer `EIO` too, as the Linux NFS client does, and so do
//! those through any handle that took locks while the server is fenced (right after a
//! stop, before the cluster has named what was lost); with passthrough the kernel reads
//! and writes the source without asking the server, and only the lock calls can say so.
//!
//! # Threads
//!
//! A call whose inode is homed here and that need not wait is answered on the dispatch
//! thread that made it; the others are answered from the cluster's runtime threads
//! (after a wait, or a peer's answer), coherence check included: a `stat`, and where
//! the file changed, an invalidation, after which the notify thread answers (see
//! `serve`). No lock of
//! this crate is held when a call is made, but an inode's `lock_owners` across the
//! removals of a `RELEASE` (as without a cluster).

pub mod log;

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

use fuser::{ReplyEmpty, ReplyLock};
use parking_lot::Mutex;
use vfscale_cluster::{
    ClusterConfig, ClusterFile, ClusterLocks, ClusterProcess, ClusterStats, InodeId, LockCall,
};
use vfscale_locks::{Errno, FcntlCmd, Flock, FlockOp, LockType, OwnerId};

use crate::handles::Handle;
use crate::inodes::{Inode, Node};
use crate::locks::{ferr, owner_id, reply_holder, Interrupts, LockReq, Locks, Parked};

/// What a grant does before it is answered, under `--cluster`: the coherence check of
/// connection `conn` on the inode (see the module docs; set by `serve`).
pub type CoherenceHook = Box<dyn Fn(usize, &Node, ReplyEmpty) + Send + Sync>;

/// The server's side of the cluster: the lock service and what a grant does first.
pub struct Cluster {
    locks: Arc<ClusterLocks>,
    name: String,
    coherence: OnceLock<CoherenceHook>,
}

/// A parked cluster call (`SETLKW`, a blocking flock): what an `INTERRUPT` ends. The
/// call is registered before it is made, so an interrupt that comes while it is being
/// made is kept and passed on once its [`LockCall`] is known.
#[derive(Default)]
pub struct ClusterWait {
    st: Mutex<WaitState>,
}

#[derive(Default)]
struct WaitState {
    call: Option<LockCall>,
    interrupted: bool,
}

impl ClusterWait {
    /// Interrupts the call (now, or once it is known).
    pub fn interrupt(&self) {
        let mut st = self.st.lock();
        st.interrupted = true;
        if let Some(c) = &st.call {
            c.interrupt();
        }
    }

    fn set_call(&self, call: LockCall) {
        let mut st = self.st.lock();
        if st.interrupted {
            call.interrupt();
        }
        st.call = Some(call);
    }
}

impl Cluster {
    /// Joins the cluster (blocking: connects to etcd, starts the peer service); the
    /// cluster's events are logged on stderr from now on ([`log`]).
    pub fn join(cfg: &ClusterConfig) -> Result<Arc<Cluster>, String> {
        log::install();
        let locks = ClusterLocks::join(cfg.clone()).map_err(|e| e.to_string())?;
        Ok(Arc::new(Cluster {
            locks,
            name: cfg.cluster_name.clone(),
            coherence: OnceLock::new(),
        }))
    }

    /// Sets what a grant does before it is answered (once).
    pub fn set_coherence(&self, hook: CoherenceHook) {
        let _ = self.coherence.set(hook);
    }

    /// The mount line's words: `cluster=<name> node=<node> peer=<addr>`.
    pub fn line(&self) -> String {
        let me = self.locks.me();
        format!("cluster={} node={} peer={}", self.name, me.node, me.addr)
    }

    /// The service's counters.
    pub fn stats(&self) -> ClusterStats {
        self.locks.stats()
    }

    /// Leaves the cluster (the lease is revoked: what this server held goes at once).
    pub fn leave(&self) {
        self.locks.leave();
    }

    fn ino(h: &Handle) -> InodeId {
        InodeId(h.inode.key.ino)
    }

    fn who(r: &LockReq) -> ClusterProcess {
        ClusterProcess {
            owner: owner_id(r.conn, r.lock_owner).0,
            pid: r.pid as i32,
        }
    }

    fn file(h: &Handle, fh: u64) -> ClusterFile {
        ClusterFile { id: fh, mode: h.mode }
    }

    /// Answers a set request: a grant after its coherence check.
    fn answer_set(
        self: &Arc<Self>,
        h: &Arc<Handle>,
        conn: usize,
        grant: bool,
        reply: ReplyEmpty,
    ) -> impl FnOnce(Result<(), Errno>) + Send + 'static {
        let (me, h) = (self.clone(), h.clone());
        move |res| match res {
            Ok(()) => match me.coherence.get() {
                Some(f) if grant => f(conn, &h.inode, reply),
                _ => reply.ok(),
            },
            Err(e) => reply.error(ferr(e)),
        }
    }

    /// `GETLK`: the holder, on whichever server, with the pid its server saw.
    pub fn getlk(&self, h: &Handle, r: &LockReq, fl: Flock, reply: ReplyLock) {
        let done = Box::new(move |res: Result<Flock, Errno>| match res {
            Err(e) => reply.error(ferr(e)),
            Ok(fl) if fl.l_type == LockType::Unlock => reply.locked(0, 0, libc::F_UNLCK, 0),
            Ok(fl) => reply_holder(reply, &fl),
        });
        let _answered = self.locks.fcntl(
            Self::ino(h),
            Self::who(r),
            Self::file(h, r.fh),
            FcntlCmd::GetLk,
            fl,
            done,
        );
    }

    /// `SETLK` / `SETLKW`.
    pub fn setlk(
        self: &Arc<Self>,
        h: &Arc<Handle>,
        r: &LockReq,
        fl: Flock,
        sleep: bool,
        intr: &Arc<Interrupts>,
        reply: ReplyEmpty,
    ) {
        let grant = fl.l_type != LockType::Unlock;
        if grant {
            Locks::record_owner(h, OwnerId(Self::who(r).owner));
        }
        let (ino, who, file) = (Self::ino(h), Self::who(r), Self::file(h, r.fh));
        let answer = self.answer_set(h, r.conn, grant, reply);
        if !sleep || !grant {
            let done = Box::new(move |res: Result<Flock, Errno>| answer(res.map(|_| ())));
            let _answered = self.locks.fcntl(ino, who, file, FcntlCmd::SetLk, fl, done);
            return;
        }
        self.parked(r.unique, intr, answer, |done| {
            self.locks.fcntl(
                ino,
                who,
                file,
                FcntlCmd::SetLkW,
                fl,
                Box::new(move |res: Result<Flock, Errno>| done(res.map(|_| ()))),
            )
        });
    }

    /// A flock request; `fop`, `nb` as `flock(2)`'s.
    #[allow(clippy::too_many_arguments)]
    pub fn flock(
        self: &Arc<Self>,
        h: &Arc<Handle>,
        r: &LockReq,
        fop: FlockOp,
        nb: bool,
        intr: &Arc<Interrupts>,
        reply: ReplyEmpty,
    ) {
        h.file_locked.store(true, Ordering::Relaxed);
        let (ino, who, file) = (Self::ino(h), Self::who(r), Self::file(h, r.fh));
        let grant = fop != FlockOp::Unlock;
        let answer = self.answer_set(h, r.conn, grant, reply);
        if nb || !grant {
            let _answered = self.locks.flock(ino, who, file, fop, true, Box::new(answer));
            return;
        }
        self.parked(r.unique, intr, answer, |done| {
            self.locks.flock(ino, who, file, fop, false, Box::new(done))
        });
    }

    /// A call that may wait, parked on the connection's interrupt table before it is
    /// made (an interrupt that came first answers `EINTR` at once) and unparked when it
    /// is answered.
    fn parked<A, C>(&self, unique: u64, intr: &Arc<Interrupts>, answer: A, call: C)
    where
        A: FnOnce(Result<(), Errno>) + Send + 'static,
        C: FnOnce(Box<dyn FnOnce(Result<(), Errno>) + Send>) -> LockCall,
    {
        let wait = Arc::new(ClusterWait::default());
        if !intr.park(unique, Parked::Cluster(wait.clone())) {
            return answer(Err(Errno::EINTR));
        }
        let unpark = intr.clone();
        let call = call(Box::new(move |res| {
            unpark.unpark(unique);
            answer(res)
        }));
        wait.set_call(call);
    }

    /// `FLUSH`: the owner's POSIX locks on the inode go, where it set any through a
    /// handle still open (else it holds none: see `locks.rs`, release).
    pub fn flush(&self, inode: &Inode, conn: usize, lock_owner: u64) {
        let owner = owner_id(conn, lock_owner);
        if !inode.lock_owners().lock().contains_key(&owner) {
            return;
        }
        self.locks.posix_remove_owner(
            InodeId(inode.key.ino),
            ClusterProcess {
                owner: owner.0,
                pid: 0,
            },
        );
    }

    /// `RELEASE` of handle `fh`: the owners whose last used handle this was lose their
    /// locks (an OFD lock's owner is the open file), then the file's flock lock.
    pub fn release(&self, h: &Handle, fh: u64) {
        let ino = Self::ino(h);
        Locks::release_owners(h, |o| {
            self.locks
                .posix_remove_owner(ino, ClusterProcess { owner: o.0, pid: 0 })
        });
        if h.file_locked.load(Ordering::Relaxed) {
            self.locks.file_remove(ino, Self::file(h, fh));
        }
    }

    /// Whether reads and writes through `h` answer `EIO`: a lock of its file, or of an
    /// owner that set locks through it, was lost with this server's lease, or this
    /// server is fenced now (its lease may have expired: whatever locks went through
    /// `h` may be another server's already, before the cluster has named the lost ones).
    pub fn lost(&self, h: &Handle, fh: u64) -> bool {
        let owners = h.owners.lock();
        let flocked = h.file_locked.load(Ordering::Relaxed);
        if owners.is_empty() && !flocked {
            return false;
        }
        if self.locks.directory().fenced() {
            return true;
        }
        let ino = Self::ino(h);
        (flocked && self.locks.file_lost(ino, Self::file(h, fh)))
            || owners
                .iter()
                .any(|o| self.locks.posix_lost(ino, ClusterProcess { owner: o.0, pid: 0 }))
    }
}
