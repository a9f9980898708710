//! What the service does when the directory reports a change: a member died (drop its
//! owners here, re-send calls that waited at it, claim its inodes this member uses), an
//! inode lost its home, this member was fenced, or rejoined.

use std::sync::Arc;

use tokio::sync::broadcast::{self, error::RecvError};
use vfscale_locks::{Errno, OwnerKey};

use crate::homes::HomeInode;
use crate::peer::MOVED;
use crate::request::LockOwner;
use crate::service::{Service, EIO};
use crate::stats::Counters;
use crate::{DirectoryEvent, InodeId};

/// Follows the directory's events until the directory goes.
pub(crate) async fn run(svc: Arc<Service>, mut rx: broadcast::Receiver<DirectoryEvent>) {
    loop {
        match rx.recv().await {
            Ok(ev) => handle(&svc, ev),
            Err(RecvError::Lagged(n)) => {
                // Missed events: every inode this member uses at another home is
                // resolved again (a new home reclaims from everyone anyway).
                tracing::warn!(missed = n, "directory events lagged; resolving homes again");
                // A missed `Fenced` or `Rejoined`: this member's lease changed, so what
                // was homed here under the old one is gone (a fence's work, then a rejoin's).
                // `fenced()` first: a rejoin sets the new lease before it clears the
                // fence, so a false read comes with the lease it cleared it for.
                let fenced = svc.dir.fenced();
                let now = svc.dir.me();
                if !svc.is_me(&now) {
                    fence(&svc);
                    handle(&svc, DirectoryEvent::Rejoined(now));
                } else if fenced {
                    // A missed `Fenced` under a lease not renewed yet: its work now.
                    fence(&svc);
                }
                drop_unlisted_members(&svc);
                // A missed `HomeGone` of an inode homed here: the directory no longer
                // shows the claim (a claim is shown from the moment it is made).
                for hi in svc.homes.all() {
                    if !svc.dir.claim_shown(hi.ino, hi.token) {
                        handle(
                            &svc,
                            DirectoryEvent::HomeGone {
                                ino: hi.ino,
                                token: hi.token,
                            },
                        );
                    }
                }
                for ino in svc.shadow.homed_at(None) {
                    re_home(&svc, ino);
                }
                // Only the calls whose home went: one cancelled at a home that still
                // serves its token may be applied there after its re-sent copy.
                svc.in_flight
                    .cancel_where(|h, ino| svc.dir.cached_home(ino).as_ref() != Some(h));
            }
            Err(RecvError::Closed) => return,
        }
    }
}

fn handle(svc: &Arc<Service>, ev: DirectoryEvent) {
    match ev {
        DirectoryEvent::MemberGone(m) => {
            if svc.is_me(&m) {
                // Our own lease ended: the fencing event follows (or came first).
                return;
            }
            svc.mark_dead(&m);
            svc.peers.forget(&m.node);
            let dropped: usize = svc
                .homes
                .all()
                .iter()
                .map(|hi| hi.drop_peer(&m.node, m.lease))
                .sum();
            Counters::add(&svc.counters.dead_owners_dropped, dropped as u64);
            svc.waiting.interrupt_where(EIO, |c| {
                c.peer
                    .as_ref()
                    .is_some_and(|(n, lease, _)| *n == m.node && *lease == m.lease)
            });
            // Under the lease that ended: calls sent to the node's new lease are served.
            svc.in_flight.cancel_where(|h, _| h.member.same_lease(&m));
            let used = svc.shadow.homed_at(Some(&m.node));
            tracing::info!(node = %m.node, lease = m.lease, dropped, inodes = used.len(), "member gone");
            for ino in used {
                re_home(svc, ino);
            }
        }
        DirectoryEvent::HomeGone { ino, token } => {
            if let Some(hi) = svc.homes.remove_token(ino, token) {
                tracing::warn!(ino = ino.0, token, "an inode homed here lost its ownership key");
                lose_home(svc, &hi);
            }
            // Only the calls sent to the home that went: a call to a newer home (claimed
            // after a give-back) is left to finish there.
            svc.in_flight.cancel_where(|h, i| i == ino && h.token == token);
            // Only to reclaim: a shadow that holds nothing (its home gave the idle
            // inode back) needs no new home.
            if svc.shadow.holds_any(ino) {
                re_home(svc, ino);
            }
        }
        DirectoryEvent::Fenced => {
            // After a `Lagged`, the broadcast still hands over the oldest events it kept:
            // a `Fenced` whose fence and rejoin the lagged branch did already. The
            // current lease, adopted and not fenced, is not the one it ended. `fenced()`
            // is read first, as above.
            if !svc.dir.fenced() && svc.is_me(&svc.dir.me()) {
                return;
            }
            fence(svc)
        }
        DirectoryEvent::Rejoined(m) => {
            // Likewise a rejoin done already, or one under a lease since replaced
            // (adopting it would go back to an ended lease).
            let now = svc.dir.me();
            if svc.is_me(&m) || !now.same_lease(&m) {
                return;
            }
            tracing::info!(node = %m.node, lease = m.lease, "rejoined the cluster");
            for hi in svc.set_me(m) {
                // Claimed under the old lease after the fencing emptied the table.
                lose_home(svc, &hi);
            }
        }
    }
}

/// After missed events: every member that used a home here and is no longer listed
/// (under the lease it used) is handled as gone.
fn drop_unlisted_members(svc: &Arc<Service>) {
    let live = svc.dir.members();
    let mut gone = Vec::new();
    for hi in svc.homes.all() {
        for (node, lease) in hi.peer_leases() {
            if !live.iter().any(|m| m.node == node && m.lease == lease) {
                gone.push(crate::Member {
                    node,
                    lease,
                    addr: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
                });
            }
        }
    }
    gone.sort_by(|a, b| (&a.node, a.lease).cmp(&(&b.node, b.lease)));
    gone.dedup();
    for m in gone {
        handle(svc, DirectoryEvent::MemberGone(m));
    }
}

/// Resolves `ino`'s home again; claims it (and reclaims its locks) when that is us.
fn re_home(svc: &Arc<Service>, ino: InodeId) {
    let svc = svc.clone();
    svc.rt.clone().spawn(async move {
        if let Ok(h) = svc.dir.home(ino).await {
            if svc.is_me(&h.member) {
                let _ = svc.home_inode(ino, h.token).await;
            }
        }
    });
}

/// An inode homed here is lost: this member's owners that held locks on it are lost
/// (their next calls answer `EIO`), waiting calls end (peers' calls go to the next
/// home).
fn lose_home(svc: &Service, hi: &HomeInode) {
    let seed = svc.seed();
    for l in hi.ctx.held_locks() {
        let who = match l.owner {
            OwnerKey::Process(o) if !hi.is_peer_id(true, o.0) => {
                LockOwner::Posix(seed.local(crate::GlobalOwner(o.0)))
            }
            OwnerKey::File(f) if !hi.is_peer_id(false, f.0) => {
                LockOwner::File(seed.local(crate::GlobalOwner(f.0)))
            }
            _ => continue,
        };
        svc.lost.add(hi.ino, who);
    }
    let ino = hi.ino;
    svc.waiting
        .interrupt_where(EIO, |c| c.ino == ino && c.peer.is_none());
    svc.waiting
        .interrupt_where(MOVED, |c| c.ino == ino && c.peer.is_some());
}

/// This member may have lost its lease: drop every inode homed here, mark what its
/// clients held (here and in the shadow) as lost, end every waiting call.
fn fence(svc: &Service) {
    let homes = svc.homes.drain();
    for hi in &homes {
        lose_home(svc, hi);
    }
    let shadows = svc.shadow.drain();
    for (ino, sh) in &shadows {
        svc.lost.add_held(*ino, &sh.ctx.held_locks());
    }
    svc.waiting.interrupt_where(EIO, |c| c.peer.is_none());
    svc.waiting.interrupt_where(MOVED, |c| c.peer.is_some());
    svc.in_flight.cancel_where(|_, _| true);
    tracing::error!(
        homes = homes.len(),
        shadows = shadows.len(),
        lost = svc.lost.len(),
        "fenced: this member's lease may have expired; its locks are lost"
    );
}

/// `EDEADLK` without the noise of a full import at call sites.
pub(crate) const EDEADLK: Errno = Errno::EDEADLK;

#[cfg(all(test, not(vfscale_loom)))]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use vfscale_locks::{Errno, Flock, LockType};

    use super::handle;
    use crate::claim::tests::{member, setlk_on};
    use crate::memdir::MemCluster;
    use crate::service::EIO;
    use crate::{ClusterLocks, Directory, DirectoryEvent, InodeId};

    /// A home whose ownership key went while its member's event loop lagged (it missed
    /// the `HomeGone`) is dropped when the loop learns it lagged: its clients' locks are
    /// lost (`EIO`), not kept beside the home the next claim makes elsewhere, where the
    /// same range would be granted a second time.
    #[test]
    fn a_lagging_member_drops_a_home_whose_key_went() {
        let mem = MemCluster::new();
        let (a, b) = (member(&mem, "m0"), member(&mem, "m1"));
        let wr = Flock::new(LockType::Write, 0, 1);
        // Not inode 9, which the claim tests hold up while they run beside this one.
        let ino = InodeId(10);
        assert_eq!(setlk_on(&a, ino, 1, wr), Ok(()));
        assert_eq!(a.stats().homes_now, 1);
        mem.drop_home_unheard(ino).expect("m0 is the home");
        // Bursts of events until the loop falls behind one of them.
        let deadline = Instant::now() + Duration::from_secs(10);
        while a.stats().homes_now != 0 {
            assert!(
                Instant::now() < deadline,
                "the lagging member still serves the home"
            );
            mem.flood("m0", 20_000);
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(
            setlk_on(&b, ino, 2, wr),
            Ok(()),
            "the next claim is granted at the new home"
        );
        assert_eq!(setlk_on(&a, ino, 1, wr), Err(EIO), "the lost owner is told");
    }

    /// After a `Lagged`, the broadcast still hands over the oldest events it kept: a
    /// `Fenced` and a `Rejoined` whose work the lagged branch did already. Handled again,
    /// they would drop the homes claimed under the new lease while their keys live on
    /// (peers told "moved" until their patience ran out, the clients' locks reported
    /// lost). They change nothing.
    #[test]
    fn a_stale_fence_or_rejoin_keeps_the_new_leases_homes() {
        let mem = MemCluster::new();
        let slot = Arc::new(Mutex::new(None));
        let (c, s) = (mem.clone(), slot.clone());
        let a = ClusterLocks::with_directory("127.0.0.1:0".parse().unwrap(), move |addr| async move {
            let d = c.join("m0", addr);
            *s.lock().unwrap() = Some(d.clone());
            Ok(d as Arc<dyn Directory>)
        })
        .expect("a member starts");
        let dir = slot.lock().unwrap().clone().expect("joined");
        let before = a.service().me();
        mem.fence(&dir);
        let now = mem.rejoin(&dir);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !a.service().is_me(&now) {
            assert!(Instant::now() < deadline, "the rejoin was not handled");
            std::thread::sleep(Duration::from_millis(5));
        }
        let wr = Flock::new(LockType::Write, 0, 1);
        // Not inode 9, which the claim tests hold up while they run beside this one.
        let ino = InodeId(11);
        assert_eq!(setlk_on(&a, ino, 1, wr), Ok(()));
        assert_eq!(a.stats().homes_now, 1);
        handle(a.service(), DirectoryEvent::Fenced);
        handle(a.service(), DirectoryEvent::Rejoined(now.clone()));
        handle(a.service(), DirectoryEvent::Rejoined(before));
        assert!(
            a.service().is_me(&now),
            "a stale rejoin went back to an ended lease"
        );
        assert_eq!(a.stats().homes_now, 1, "a stale event dropped a live home");
        assert_eq!(
            setlk_on(&a, ino, 1, wr),
            Ok(()),
            "the owner's lock was reported lost"
        );
        assert_eq!(setlk_on(&a, ino, 2, wr), Err(Errno::EAGAIN), "the lock went");
    }
}
