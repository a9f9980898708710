//! The service behind [`crate::ClusterLocks`]: the lock path (home here, or one request
//! to the remote home), claiming an inode and reclaiming its locks, and what is shared
//! by the peer server, the event handler and the deadlock publisher.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tokio::runtime::Handle;
use tokio::sync::{Notify, OnceCell};
use vfscale_locks::{
    flock_to_posix_range, AccessMode, Errno, FcntlCmd, FileId, FileLock, FileLockContext, Flock, FlockOp,
    LockKind, LockManager, LockType, OpenFile, OwnerId, OwnerKey, PendingLock, Pid, Process, Whence,
};

use crate::call::{CallCtl, Hook, LockCall, LockDone};
use crate::homes::{context_for, HomeInode, HomeTable};
use crate::ids::IdSeed;
use crate::lost::LostSet;
use crate::peer::{self, pb, Peers, MOVED};
use crate::request::{flock_of_range, LockOwner, Op, Request, Started};
use crate::shadow::ShadowTable;
use crate::stats::Counters;
use crate::waiting::{Waiting, WaitingCall};
use crate::{Directory, Home, InodeId, Member};

/// `EIO`: what a call gets when its lock was lost or this member cannot grant.
pub(crate) const EIO: Errno = Errno::Other(libc::EIO);

/// How long a new home waits for a member's reclaim answer (a member that does not
/// answer is stopped or partitioned: its lease ends soon, and its clients' locks with
/// it).
const RECLAIM_TIMEOUT: Duration = Duration::from_secs(1);

/// The caller's completion, for either kind of call.
pub(crate) enum Done {
    Fcntl(LockDone<Flock>),
    Flock(LockDone<()>),
}

impl Done {
    pub fn call(self, r: Result<Flock, Errno>) {
        match self {
            Done::Fcntl(d) => d(r),
            Done::Flock(d) => d(r.map(|_| ())),
        }
    }
}

/// A completion carried by a task: if the task is dropped unfinished (the service shut
/// down under it), the caller still gets its one answer, `EIO`.
struct DoneOnce(Option<Done>);

impl DoneOnce {
    fn call(mut self, r: Result<Flock, Errno>) {
        if let Some(d) = self.0.take() {
            d.call(r);
        }
    }
}

impl Drop for DoneOnce {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            d.call(Err(EIO));
        }
    }
}

/// A request that waits at a home here: the home, the request (global ids), the
/// pending lock and the answer's flock.
type Waiter = (Arc<HomeInode>, Request, PendingLock, Flock);

/// A first attempt at a home here (small: the usual answer is copied out of the home
/// table's closure; a wait is boxed, as waiting allocates anyway).
enum Fast {
    Done(Flock),
    Wait(Box<Waiter>),
}

/// A remote call's outcome.
enum Remote {
    Done(Result<Flock, Errno>),
    /// Resolve the home again and re-send.
    Retry,
    /// This member's lease is gone at the home.
    Gone,
}

/// What a close drops.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Removal {
    Posix { owner: u64, pid: i32 },
    File { file: u64 },
}

/// A claim in progress: its token and the home state it makes.
type Claim = Arc<(i64, OnceCell<Result<Arc<HomeInode>, Errno>>)>;

/// A remote call in flight: its home's node, its inode, and what cancels it.
type Flight = (String, InodeId, Arc<Notify>);

/// Remote calls in flight, so that a home's death re-sends them at once.
#[derive(Default)]
pub(crate) struct InFlight {
    map: Mutex<HashMap<u64, Flight>>,
}

impl InFlight {
    fn add(&self, id: u64, node: &str, ino: InodeId) -> Arc<Notify> {
        let n = Arc::new(Notify::new());
        self.map.lock().insert(id, (node.to_string(), ino, n.clone()));
        n
    }

    fn remove(&self, id: u64) {
        self.map.lock().remove(&id);
    }

    /// Makes the calls `pick` selects re-send.
    pub fn cancel_where(&self, pick: impl Fn(&str, InodeId) -> bool) {
        for (node, ino, n) in self.map.lock().values() {
            if pick(node, *ino) {
                n.notify_one();
            }
        }
    }
}

/// Everything the service shares. See the crate's first page for what protects what.
pub(crate) struct Service {
    pub dir: Arc<dyn Directory>,
    pub rt: Handle,
    /// The home contexts' manager (global ids).
    pub mgr: Arc<LockManager>,
    /// The current [`IdSeed`] (changes with the lease).
    seed: AtomicU64,
    me: RwLock<Member>,
    pub homes: HomeTable,
    pub shadow: ShadowTable,
    pub lost: LostSet,
    pub waiting: Waiting,
    pub peers: Peers,
    pub counters: Counters,
    pub in_flight: InFlight,
    claims: Mutex<HashMap<InodeId, Claim>>,
    /// Members whose lease ended, as (node, lease): their requests are refused.
    dead: Mutex<HashSet<(String, i64)>>,
    next_call: AtomicU64,
    /// Kicks the wait-graph publisher: a POSIX request started waiting.
    pub waits_kick: Notify,
    /// The member left: every call answers `EIO`.
    closed: AtomicBool,
}

impl Service {
    pub fn new(dir: Arc<dyn Directory>, rt: Handle) -> Service {
        let me = dir.me();
        Service {
            seed: AtomicU64::new(IdSeed::new(&me.node, me.lease).raw()),
            me: RwLock::new(me),
            dir,
            rt,
            mgr: LockManager::new(),
            homes: HomeTable::new(),
            shadow: ShadowTable::new(),
            lost: LostSet::default(),
            waiting: Waiting::default(),
            peers: Peers::default(),
            counters: Counters::default(),
            in_flight: InFlight::default(),
            claims: Mutex::new(HashMap::new()),
            dead: Mutex::new(HashSet::new()),
            next_call: AtomicU64::new(1),
            waits_kick: Notify::new(),
            closed: AtomicBool::new(false),
        }
    }

    /// The member leaves: nothing is homed here any more, and every call from now on
    /// answers `EIO` (the home table is emptied, so the lock path needs no check).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.homes.drain();
    }

    #[inline]
    pub fn seed(&self) -> IdSeed {
        IdSeed::from_raw(self.seed.load(Ordering::Acquire))
    }

    pub fn me(&self) -> Member {
        self.me.read().clone()
    }

    /// A new lease: new global ids from now on.
    pub fn set_me(&self, m: Member) {
        self.seed
            .store(IdSeed::new(&m.node, m.lease).raw(), Ordering::Release);
        *self.me.write() = m;
    }

    pub fn is_me(&self, m: &Member) -> bool {
        let me = self.me.read();
        me.node == m.node && me.lease == m.lease
    }

    pub fn caller(&self) -> pb::Caller {
        let me = self.me.read();
        pb::Caller {
            node: me.node.clone(),
            lease: me.lease,
        }
    }

    pub fn mark_dead(&self, m: &Member) {
        self.dead.lock().insert((m.node.clone(), m.lease));
    }

    pub fn is_dead(&self, node: &str, lease: i64) -> bool {
        let d = self.dead.lock();
        !d.is_empty() && d.contains(&(node.to_string(), lease))
    }

    /// A lock call: at once on the caller's thread when the home is here, else from
    /// the runtime.
    #[inline]
    pub fn call(self: &Arc<Self>, req: Request, done: Done) -> LockCall {
        if self.lost.contains(req.ino, req.lock_owner()) {
            Counters::bump(&self.counters.lost_eio);
            done.call(Err(EIO));
            return LockCall::answered();
        }
        let seed = self.seed();
        let fast = self.homes.with(req.ino, |hi| {
            if self.dir.fenced() {
                return Err(EIO);
            }
            self.counters.local_calls.bump();
            let g = req.global(seed);
            g.start(&hi.ctx).map(|s| match s {
                Started::Done(fl) => Fast::Done(fl),
                Started::Waiting(p, fl) => Fast::Wait(Box::new((hi.clone(), g, p, fl))),
            })
        });
        match fast {
            Some(Ok(Fast::Done(fl))) => {
                done.call(Ok(fl));
                LockCall::answered()
            }
            Some(Err(e)) => {
                done.call(Err(e));
                LockCall::answered()
            }
            Some(Ok(Fast::Wait(w))) => {
                let (hi, g, p, fl) = *w;
                let ctl = CallCtl::new();
                let svc = self.clone();
                let c = ctl.clone();
                let done = DoneOnce(Some(done));
                self.rt.spawn(async move {
                    let r = svc.finish_wait(&hi, g, p, fl, &c, None).await;
                    done.call(c.finish(r));
                });
                LockCall::waiting(ctl)
            }
            None => {
                if self.closed.load(Ordering::Acquire) {
                    done.call(Err(EIO));
                    return LockCall::answered();
                }
                let ctl = CallCtl::new();
                let svc = self.clone();
                let c = ctl.clone();
                let done = DoneOnce(Some(done));
                self.rt.spawn(async move {
                    let r = svc.slow_call(req, &c).await;
                    done.call(c.finish(r));
                });
                LockCall::waiting(ctl)
            }
        }
    }

    /// Waits for a request blocked at a home here (for a client of this member, or a
    /// peer's with `peer`), registered so the service can end it.
    pub async fn finish_wait(
        &self,
        hi: &Arc<HomeInode>,
        g: Request,
        pending: PendingLock,
        fl: Flock,
        ctl: &Arc<CallCtl>,
        peer: Option<(String, u64)>,
    ) -> Result<Flock, Errno> {
        let is_peer = peer.is_some();
        ctl.set_hook(Hook::Local(pending.interrupter()));
        let posix = g.is_posix_wait();
        let owner = match g.lock_owner() {
            LockOwner::Posix(o) | LockOwner::File(o) => o,
        };
        let guard = self.waiting.add(WaitingCall {
            ino: hi.ino,
            owner,
            posix,
            peer,
            ctl: ctl.clone(),
        });
        if posix {
            self.waits_kick.notify_one();
        }
        let r = pending.await;
        drop(guard);
        match r {
            Ok(()) if self.dir.fenced() => Err(if is_peer { MOVED } else { EIO }),
            Ok(()) => Ok(fl),
            Err(Errno::EINTR) => Err(ctl.reason().unwrap_or(Errno::EINTR)),
            Err(e) => Err(e),
        }
    }

    /// A call whose home is not known to be here: resolve it, then run it here or send
    /// it there; again when the home moved.
    async fn slow_call(self: &Arc<Self>, req: Request, ctl: &Arc<CallCtl>) -> Result<Flock, Errno> {
        // How long a call keeps trying a home that does not answer: past the lease of
        // a dead home, so that another member can claim the inode. Counted from the
        // first failure, not from the call's start (a wait may last any time before).
        let patience = self.dir.lease_ttl() * 2 + Duration::from_secs(1);
        let mut deadline: Option<Instant> = None;
        let mut backoff = Duration::from_millis(2);
        loop {
            if let Some(e) = ctl.reason() {
                return Err(e);
            }
            if self.lost.contains(req.ino, req.lock_owner()) {
                Counters::bump(&self.counters.lost_eio);
                return Err(EIO);
            }
            let home = self.dir.home(req.ino).await.map_err(|e| e.errno())?;
            let seed = self.seed();
            if self.is_me(&home.member) {
                let hi = self.home_inode(req.ino, home.token).await?;
                if self.dir.fenced() {
                    return Err(EIO);
                }
                self.counters.local_calls.bump();
                let g = req.global(seed);
                return match g.start(&hi.ctx)? {
                    Started::Done(fl) => Ok(fl),
                    Started::Waiting(p, fl) => self.finish_wait(&hi, g, p, fl, ctl, None).await,
                };
            }
            match self.remote_lock(&home, req, seed, ctl).await {
                Remote::Done(r) => {
                    self.mirror(&home, &req, &r);
                    return r;
                }
                Remote::Gone => return Err(EIO),
                Remote::Retry => {
                    let now = Instant::now();
                    if now > *deadline.get_or_insert(now + patience) {
                        tracing::warn!(ino = req.ino.0, "no home answered in time");
                        return Err(EIO);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
            }
        }
    }

    /// Keeps the shadow in step with what the remote home did.
    fn mirror(&self, home: &Home, req: &Request, r: &Result<Flock, Errno>) {
        if !req.changes_locks() {
            return;
        }
        match (r, req.op) {
            (Ok(_), _) => {
                let s = self.shadow.entry(req.ino, &home.member.node, home.token);
                req.mirror(&s.ctx);
            }
            // A failed flock conversion dropped the lock held before (as in Linux).
            (Err(_), Op::Flock { .. }) => {
                if let Some(s) = self.shadow.get(req.ino) {
                    let mut unlock = *req;
                    unlock.op = Op::Flock {
                        op: FlockOp::Unlock,
                        nb: true,
                    };
                    unlock.mirror(&s.ctx);
                }
            }
            _ => {}
        }
    }

    /// One request to the remote home.
    async fn remote_lock(&self, home: &Home, req: Request, seed: IdSeed, ctl: &Arc<CallCtl>) -> Remote {
        let asked = req.op;
        let mut req = req;
        // The home sees the range from SEEK_SET (it knows neither position nor size).
        if let Op::Fcntl { cmd, fl } = &mut req.op {
            if fl.l_whence != Whence::Set {
                if cmd.is_get() && fl.l_type == LockType::Unlock && *cmd == FcntlCmd::GetLk {
                    return Remote::Done(Err(Errno::EINVAL));
                }
                match flock_to_posix_range(fl) {
                    Ok((s, e)) => {
                        let pid = fl.l_pid;
                        *fl = flock_of_range(fl.l_type, s, e);
                        fl.l_pid = pid;
                    }
                    Err(e) => return Remote::Done(Err(e)),
                }
            }
        }
        let mut client = match self.peers.client(&home.member) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(%e, "peer");
                return Remote::Retry;
            }
        };
        let call_id = self.next_call.fetch_add(1, Ordering::Relaxed);
        let caller = self.caller();
        let msg = peer::encode_lock(&req.global(seed), &caller, call_id, home.token);
        if req.waits() {
            let c = client.clone();
            let rt = self.rt.clone();
            let caller = caller.clone();
            ctl.set_hook(Hook::Remote(Box::new(move || {
                let mut c = c.clone();
                let m = pb::InterruptRequest {
                    caller: Some(caller.clone()),
                    call_id,
                };
                rt.spawn(async move {
                    let _ = c.interrupt(m).await;
                });
            })));
        }
        let cancel = self.in_flight.add(call_id, &home.member.node, req.ino);
        Counters::bump(&self.counters.remote_calls);
        let r = tokio::select! {
            r = client.lock(msg) => Some(r),
            _ = cancel.notified() => None,
        };
        self.in_flight.remove(call_id);
        if req.waits() {
            ctl.set_hook(Hook::None);
        }
        match r {
            None => Remote::Retry,
            Some(Err(status)) => {
                tracing::debug!(%status, node = %home.member.node, "peer call failed");
                Remote::Retry
            }
            Some(Ok(reply)) => {
                let m = reply.into_inner();
                match pb::Status::try_from(m.status) {
                    Ok(pb::Status::Done) => Remote::Done(peer::result_of(&m, &asked)),
                    Ok(pb::Status::Gone) => Remote::Gone,
                    _ => Remote::Retry,
                }
            }
        }
    }

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
        if self.dir.fenced() {
            return Err(EIO);
        }
        Counters::add(&self.counters.reclaimed, n);
        Counters::bump(&self.counters.homes_claimed);
        if n > 0 {
            tracing::info!(ino = ino.0, token, locks = n, "home claimed; locks reclaimed");
        }
        self.homes.insert(hi.clone());
        Ok(hi)
    }

    /// close(2) / last close at the home of `ino`; returns once applied.
    pub async fn remove(self: Arc<Self>, ino: InodeId, what: Removal) {
        let deadline = Instant::now() + self.dir.lease_ttl() * 2 + Duration::from_secs(1);
        loop {
            let Ok(home) = self.dir.home(ino).await else {
                break;
            };
            if self.is_me(&home.member) {
                if let Ok(hi) = self.home_inode(ino, home.token).await {
                    remove_at(&hi.ctx, what, Some(self.seed()));
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
                (id, self.in_flight.add(id, &home.member.node, ino))
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
        if let Some(s) = self.shadow.get(ino) {
            remove_at(&s.ctx, what, None);
        }
    }

    /// Runs `fut` on the runtime and waits for it on this (non-runtime) thread.
    pub fn block_on<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.rt.spawn(async move {
            let _ = tx.send(fut.await);
        });
        rx.recv().ok()
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
