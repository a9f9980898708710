//! The service behind [`crate::ClusterLocks`]: what every part shares, and the lock path
//! (home here, or one request to the remote home). Claims are in `claim.rs`, closes in
//! `close.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tokio::runtime::Handle;
use tokio::sync::Notify;
use vfscale_locks::{
    flock_to_posix_range, Errno, FcntlCmd, Flock, FlockOp, LockManager, LockType, PendingLock, Whence,
};

use crate::call::{CallCtl, Hook, LockCall, LockDone};
use crate::claim::Claim;
use crate::give_back::{idle_millis, Returning, HOME_IDLE};
use crate::homes::{HomeInode, HomeTable, Pinned};
use crate::ids::IdSeed;
use crate::in_flight::InFlight;
use crate::lost::LostSet;
use crate::peer::{self, pb, Peers, MOVED};
use crate::request::{flock_of_range, Op, Request, Started};
use crate::shadow::ShadowTable;
use crate::stats::Counters;
use crate::waiting::{Waiting, WaitingCall};
use crate::{Directory, Home, InodeId, Member};

/// `EIO`: what a call gets when its lock was lost or this member cannot grant.
pub(crate) const EIO: Errno = Errno::Other(libc::EIO);

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
type Waiter = (Pinned, Request, PendingLock, Flock);

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
    pub claims: Mutex<HashMap<InodeId, Claim>>,
    /// Inodes given back whose claim the directory may still show.
    pub returning: Returning,
    /// How long an inode stays idle before it is given back, in ms (0: never).
    home_idle_ms: AtomicU64,
    /// Wakes the sweeper: the idle time changed.
    pub sweep_kick: Notify,
    /// Members whose lease ended, as (node, lease): their requests are refused.
    dead: Mutex<HashSet<(String, i64)>>,
    pub next_call: AtomicU64,
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
            returning: Returning::default(),
            home_idle_ms: AtomicU64::new(idle_millis(HOME_IDLE)),
            sweep_kick: Notify::new(),
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

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// How long an inode stays idle before it is given back; `None`: never.
    pub fn home_idle(&self) -> Option<Duration> {
        match self.home_idle_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    pub fn set_home_idle(&self, idle: Duration) {
        self.home_idle_ms.store(idle_millis(idle), Ordering::Relaxed);
        self.sweep_kick.notify_one();
    }

    #[inline]
    pub fn seed(&self) -> IdSeed {
        IdSeed::from_raw(self.seed.load(Ordering::Acquire))
    }

    pub fn me(&self) -> Member {
        self.me.read().clone()
    }

    /// A new lease: new global ids from now on, and nothing homed here (every home
    /// was claimed under an earlier lease, which etcd ended).
    pub fn set_me(&self, m: Member) -> Vec<Arc<HomeInode>> {
        self.seed
            .store(IdSeed::new(&m.node, m.lease).raw(), Ordering::Release);
        *self.me.write() = m;
        self.homes.drain()
    }

    /// Puts a claimed home in the table if this member still holds the lease it was
    /// claimed under and is not fenced (else `EIO`), and if the inode has no home state
    /// in the table and is not returning under the claim's token (else `MOVED`): one
    /// home state per inode, never one replaced while it serves. Under the identity's
    /// read lock, so a rejoin ([`Service::set_me`], which empties the table after it)
    /// cannot come between the check and the insert; the table's own checks are made
    /// under its shard's write lock, under which a give-back marks the inode returning.
    pub fn insert_home_under(&self, lease: i64, hi: &Arc<HomeInode>) -> Result<(), Errno> {
        let me = self.me.read();
        if me.lease != lease || self.dir.fenced() {
            return Err(EIO);
        }
        match self
            .homes
            .insert_new(hi.clone(), || !self.returning.blocks(hi.ino, hi.token))
        {
            Ok(()) => Ok(()),
            Err(held) => {
                debug_assert!(
                    held != Some(hi.token),
                    "two claims of inode {} under token {}",
                    hi.ino.0,
                    hi.token
                );
                Err(MOVED)
            }
        }
    }

    pub fn is_me(&self, m: &Member) -> bool {
        self.me.read().same_lease(m)
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
            match g.start(&hi.ctx)? {
                // Fenced while it ran (a thread held up past the fence): another member
                // may serve the inode once the lease ends, so the grant is not given.
                Started::Done(_) if self.dir.fenced() => Err(EIO),
                Started::Done(fl) => Ok(Fast::Done(fl)),
                // Pinned under the shard's lock: no give-back while it waits.
                Started::Waiting(p, fl) => Ok(Fast::Wait(Box::new((hi.pin(), g, p, fl)))),
            }
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
                    let r = svc.finish_wait(hi.ino, g, p, fl, &c, None).await;
                    drop(hi);
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
    /// peer's with `peer`), registered so the service can end it. The caller keeps the
    /// home pinned until it returns.
    pub async fn finish_wait(
        &self,
        ino: InodeId,
        g: Request,
        pending: PendingLock,
        fl: Flock,
        ctl: &Arc<CallCtl>,
        peer: Option<(String, i64, u64)>,
    ) -> Result<Flock, Errno> {
        let is_peer = peer.is_some();
        ctl.set_hook(Hook::Local(pending.interrupter()));
        let posix = g.is_posix_wait();
        let guard = self.waiting.add(WaitingCall {
            ino,
            peer,
            wait: Some(pending.wait_id()),
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
            let outcome = if self.is_me(&home.member) {
                match self.home_inode(req.ino, home.token).await {
                    Ok(hi) => {
                        if self.dir.fenced() {
                            return Err(EIO);
                        }
                        self.counters.local_calls.bump();
                        let g = req.global(seed);
                        return match g.start(&hi.ctx)? {
                            Started::Done(_) if self.dir.fenced() => Err(EIO),
                            Started::Done(fl) => Ok(fl),
                            Started::Waiting(p, fl) => self.finish_wait(hi.ino, g, p, fl, ctl, None).await,
                        };
                    }
                    // Given back meanwhile: the directory names the next home soon.
                    Err(e) if e == MOVED => Remote::Retry,
                    Err(e) => return Err(e),
                }
            } else {
                // An unlock leaves the shadow before it is sent: once the home answered,
                // the home may give the inode back, and a new home's reclaim must not
                // find the lock here still. Early is safe: the lock is being let go of.
                if req.is_unlock() {
                    if let Some(s) = self.shadow.get(req.ino) {
                        req.mirror(&s.ctx);
                    }
                }
                self.remote_lock(&home, req, seed, ctl).await
            };
            match outcome {
                Remote::Done(r) => {
                    self.mirror(&home, &req, &r);
                    return r;
                }
                Remote::Gone => return Err(EIO),
                Remote::Retry => {
                    let now = Instant::now();
                    if now > *deadline.get_or_insert(now + patience) {
                        tracing::warn!(ino = req.ino.0, "no home answered in time");
                        if req.is_unlock() {
                            // Out of the shadow already, maybe still at a home that is
                            // alive but out of reach: the owner is told until it closes
                            // the file, and the close is sent there (`cluster_locks.rs`).
                            self.lost.add(req.ino, req.lock_owner());
                        }
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
        let cancel = self.in_flight.add(call_id, home, req.ino);
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
