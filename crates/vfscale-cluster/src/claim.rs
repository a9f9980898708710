//! Claiming an inode: this member became its home in the directory; before it serves
//! the inode it re-creates the locks its own clients hold there (its shadow) and asks
//! every live member for theirs (reclaim). Calls that arrive meanwhile, local or from
//! peers, wait for the claim.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;
use vfscale_locks::{
    AccessMode, Errno, FcntlCmd, FileLock, FileLockContext, FlockOp, LockKind, LockType, OpenFile, OwnerId,
    OwnerKey, Process,
};

use crate::homes::{context_for, HomeInode, Pinned};
use crate::peer::{self, pb, MOVED};
use crate::request::flock_of_range;
use crate::service::{Service, EIO};
use crate::stats::Counters;
use crate::{InodeId, Member};

/// How long a new home waits for one reclaim answer before it asks again (a member
/// that holds its lease is asked until it answers or its lease ends).
const RECLAIM_TIMEOUT: Duration = Duration::from_secs(1);

/// How often a reclaim that waits for a member's answer looks whether this member was
/// fenced meanwhile.
const FENCE_POLL: Duration = Duration::from_millis(20);

/// A claim in progress: its token and the home state it makes.
pub(crate) type Claim = Arc<(i64, OnceCell<Result<Arc<HomeInode>, Errno>>)>;

impl Service {
    /// The home state of `ino` under `token`, pinned for the caller, claiming it (with
    /// reclaim) when this member just became its home. Concurrent callers share one
    /// claim. `MOVED`: the inode was given back (or lost) meanwhile; resolve it again.
    pub async fn home_inode(self: &Arc<Self>, ino: InodeId, token: i64) -> Result<Pinned, Errno> {
        let current = || self.homes.pin(ino).filter(|hi| hi.token >= token);
        if let Some(hi) = current() {
            return Ok(hi);
        }
        #[cfg(all(test, not(vfscale_loom)))]
        tests::pause_before_claims(ino).await;
        let claim = {
            let mut c = self.claims.lock();
            // Again under the map's mutex: a claim that finished since the look above
            // put its home in the table before it left the map, and a second claim
            // under its token would make a second home state (its clients' locks not
            // in it: granted again).
            if let Some(hi) = current() {
                return Ok(hi);
            }
            c.entry(ino)
                .or_insert_with(|| Arc::new((token, OnceCell::new())))
                .clone()
        };
        let made = self.drive_claim(ino, &claim).await?;
        // Pinned through the table: a home given back (or lost) since the claim made
        // it is not used.
        match self.homes.pin(ino) {
            Some(hi) if Arc::ptr_eq(hi.home(), &made) => Ok(hi),
            _ => Err(MOVED),
        }
    }

    /// The home state a peer's call with `token` may use, pinned: the current one, or
    /// the one a claim in progress is making; `None`: not the home (the peer resolves
    /// again).
    pub async fn home_for_peer(self: &Arc<Self>, ino: InodeId, token: i64) -> Option<Pinned> {
        if let Some(hi) = self.homes.pin(ino) {
            return (hi.token == token).then_some(hi);
        }
        let claim = self.claims.lock().get(&ino).cloned()?;
        if claim.0 != token {
            return None;
        }
        // Driven by whichever of its callers is polled: one whose every local caller
        // went (interrupted, fenced) is carried on by this call, which then finds it.
        let _ = self.drive_claim(ino, &claim).await;
        self.homes.pin(ino).filter(|hi| hi.token == token)
    }

    /// Runs `claim` to its end (or waits for the caller running it), then takes it out
    /// of the claims' map; its result.
    async fn drive_claim(self: &Arc<Self>, ino: InodeId, claim: &Claim) -> Result<Arc<HomeInode>, Errno> {
        let r = claim
            .1
            .get_or_init(|| self.clone().become_home(ino, claim.0))
            .await
            .clone();
        let mut c = self.claims.lock();
        if c.get(&ino).is_some_and(|x| Arc::ptr_eq(x, claim)) {
            c.remove(&ino);
        }
        r
    }

    /// Whether a claim of `ino` under `token` may make a home: the directory still shows
    /// this member as its home under that token, and it was not given back. The
    /// directory never shows a given-back claim again once it stopped, and the inode is
    /// returning until it stops: a call that resolved the home before a give-back and
    /// claims after it is refused.
    fn may_claim(&self, ino: InodeId, token: i64) -> bool {
        !self.returning.blocks(ino, token)
            && self
                .dir
                .cached_home(ino)
                .is_some_and(|h| h.token == token && self.is_me(&h.member))
    }

    /// This member just became `ino`'s home: re-create its own clients' locks (its
    /// shadow) and every live member's (reclaim), then serve.
    async fn become_home(self: Arc<Self>, ino: InodeId, token: i64) -> Result<Arc<HomeInode>, Errno> {
        // Checked before the shadow is taken: a void claim must not take it.
        if !self.may_claim(ino, token) {
            return Err(MOVED);
        }
        // The claim is under this lease; a rejoin meanwhile makes it void.
        let lease = self.me().lease;
        let hi = Arc::new(HomeInode::new(ino, token, lease, context_for(&self.mgr, ino)));
        let seed = self.seed();
        let mut n = 0u64;
        // This member's own clients' locks, by its own ids: lost (EIO) unless the claim
        // completes, also when it is dropped half-way (a fence cancels its caller).
        let mut own = TakenShadow {
            svc: self.clone(),
            ino,
            locks: self
                .shadow
                .take(ino)
                .map(|sh| sh.ctx.held_locks())
                .unwrap_or_default(),
            kept: false,
        };
        for l in &own.locks {
            if let Some(g) = peer::decode_held(&peer::encode_held(l, seed)) {
                apply_held(&hi.ctx, &g);
                n += 1;
            }
        }
        // Every live member at once, each asked until it answers or its lease ends: a
        // member that holds its lease may hold locks here, and serving without them
        // would grant them twice.
        let me = self.me();
        let caller = self.caller();
        let mut asks = tokio::task::JoinSet::new();
        for m in self.dir.members() {
            if m.node == me.node || self.is_dead(&m.node, m.lease) {
                continue;
            }
            let ask = pb::ReclaimRequest {
                caller: Some(caller.clone()),
                ino: ino.0,
                token,
            };
            let svc = self.clone();
            asks.spawn(async move { (svc.reclaim_from(&m, ask).await, m) });
        }
        let mut complete = true;
        while let Some(joined) = asks.join_next().await {
            let Ok((reply, m)) = joined else {
                complete = false;
                continue;
            };
            for l in reply
                .iter()
                .flat_map(|r| r.locks.iter())
                .filter_map(peer::decode_held)
            {
                apply_held(&hi.ctx, &l);
                let (owner, file) = match l.owner {
                    OwnerKey::Process(o) => (Some(o.0), None),
                    OwnerKey::File(f) => (None, Some(f.0)),
                };
                hi.note_peer(&m.node, m.lease, owner, file);
                n += 1;
            }
        }
        if !complete {
            // Fenced or rejoined meanwhile: the claim is void, and what this member's
            // clients held went with the shadow (`own` marks it lost).
            return Err(EIO);
        }
        // Refused as the reclaim: or, with `MOVED`, given back meanwhile, or a home
        // state of an older claim is still in the table (its `HomeGone` has not come
        // yet): the caller resolves the home again.
        self.insert_home_under(lease, &hi)?;
        own.kept = true;
        Counters::add(&self.counters.reclaimed, n);
        Counters::bump(&self.counters.homes_claimed);
        if n > 0 {
            tracing::info!(ino = ino.0, token, locks = n, "home claimed; locks reclaimed");
        }
        Ok(hi)
    }

    /// `m`'s clients' locks on the inode, asked again (pausing up to 1 s) until it
    /// answers; `None` once it no longer holds the lease it was listed with, or this
    /// member is fenced (the claim is void then).
    async fn reclaim_from(&self, m: &Member, ask: pb::ReclaimRequest) -> Option<pb::ReclaimReply> {
        let mut pause = Duration::from_millis(50);
        loop {
            match self.peers.client(m) {
                Ok(mut c) => {
                    let rpc = c.reclaim(ask.clone());
                    tokio::pin!(rpc);
                    let deadline = tokio::time::Instant::now() + RECLAIM_TIMEOUT;
                    // Checked while waiting: a fence voids the claim at once, and its
                    // shadow's owners must be told (EIO) without waiting out the ask.
                    loop {
                        tokio::select! {
                            r = &mut rpc => {
                                match r {
                                    Ok(reply) => return Some(reply.into_inner()),
                                    Err(status) => tracing::warn!(node = %m.node, ino = ask.ino, %status, "reclaim failed"),
                                }
                                break;
                            }
                            _ = tokio::time::sleep(FENCE_POLL) => {
                                if self.dir.fenced() {
                                    return None;
                                }
                                if tokio::time::Instant::now() >= deadline {
                                    tracing::warn!(node = %m.node, ino = ask.ino, "reclaim timed out");
                                    break;
                                }
                            }
                        }
                    }
                }
                Err(e) => tracing::warn!(node = %m.node, ino = ask.ino, %e, "reclaim: no connection"),
            }
            let listed = self.dir.members().iter().any(|x| x.same_lease(m));
            if !listed || self.is_dead(&m.node, m.lease) || self.dir.fenced() {
                return None;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RECLAIM_TIMEOUT);
        }
    }
}

/// This member's clients' locks taken out of the shadow by a claim: marked lost when
/// dropped, unless the claim re-created them at this member as the new home.
struct TakenShadow {
    svc: Arc<Service>,
    ino: InodeId,
    locks: Vec<FileLock>,
    kept: bool,
}

impl Drop for TakenShadow {
    fn drop(&mut self) {
        if !self.kept && !self.locks.is_empty() {
            self.svc.lost.add_held(self.ino, &self.locks);
        }
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

#[cfg(all(test, not(vfscale_loom)))]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    use vfscale_locks::{AccessMode, Errno, FcntlCmd, Flock, LockType};

    use crate::memdir::MemCluster;
    use crate::{ClusterFile, ClusterLocks, ClusterProcess, Directory, InodeId};

    /// The next call of `home_inode` for [`PAUSED`] that finds no home pauses this long
    /// (ms) before it takes the claims' mutex: a thread preempted there.
    static PAUSE_MS: AtomicU64 = AtomicU64::new(0);
    /// The inode whose calls [`PAUSE_MS`] holds up (the tests of this module use it; a
    /// test elsewhere, run at the same time, uses another).
    const PAUSED: InodeId = InodeId(9);

    pub(super) async fn pause_before_claims(ino: InodeId) {
        if ino != PAUSED {
            return;
        }
        let ms = PAUSE_MS.swap(0, Ordering::SeqCst);
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }

    /// Member `name` of `mem`, started.
    pub(crate) fn member(mem: &Arc<MemCluster>, name: &str) -> Arc<ClusterLocks> {
        let (c, name) = (mem.clone(), name.to_string());
        ClusterLocks::with_directory("127.0.0.1:0".parse().unwrap(), move |addr| async move {
            Ok(c.join(&name, addr) as Arc<dyn Directory>)
        })
        .expect("a member starts")
    }

    /// `F_SETLK` of `fl` on inode 9 by process and file `owner` through `m`.
    fn setlk(m: &ClusterLocks, owner: u64, fl: Flock) -> Result<(), Errno> {
        setlk_on(m, PAUSED, owner, fl)
    }

    /// `F_SETLK` of `fl` on `ino` by process and file `owner` through `m`.
    pub(crate) fn setlk_on(m: &ClusterLocks, ino: InodeId, owner: u64, fl: Flock) -> Result<(), Errno> {
        let (tx, rx) = mpsc::channel();
        let who = ClusterProcess {
            owner,
            pid: owner as i32,
        };
        let file = ClusterFile {
            id: owner,
            mode: AccessMode::ReadWrite,
        };
        let done = Box::new(move |r: Result<Flock, Errno>| {
            let _ = tx.send(r);
        });
        let _call = m.fcntl(ino, who, file, FcntlCmd::SetLk, fl, done);
        rx.recv_timeout(Duration::from_secs(10))
            .expect("an answer")
            .map(|_| ())
    }

    /// A call that found no home and is held up before the claims' mutex while another
    /// call claims the inode (same token) and is granted there: it must use that home
    /// state, not claim again and replace it (which granted the lock twice).
    #[test]
    fn a_call_held_up_before_the_claims_uses_the_home_claimed_meanwhile() {
        let mem = MemCluster::new();
        let (a, b) = (member(&mem, "m0"), member(&mem, "m1"));
        let wr = Flock::new(LockType::Write, 0, 1);
        PAUSE_MS.store(300, Ordering::SeqCst);
        let ax = a.clone();
        let x = std::thread::spawn(move || setlk(&ax, 1, wr));
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(setlk(&a, 2, wr), Ok(()), "the second call claims and is granted");
        assert_eq!(x.join().unwrap(), Err(Errno::EAGAIN), "granted twice");
        assert_eq!(
            setlk(&b, 3, wr),
            Err(Errno::EAGAIN),
            "granted at a second home state"
        );
        assert_eq!(a.stats().homes_claimed, 1);
    }
}
