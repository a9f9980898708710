//! Library-level checks of what a replay cannot see: which waiters an unlock wakes, how
//! the wait tree re-forms, what an abandoned wait leaves, and which locks a call takes.
//! Byte-exact behaviour is compared with the kernel in `kernel_diff.rs`.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use vfscale_locks::*;

fn rw(n: u64) -> OpenFile {
    OpenFile::new(n, AccessMode::ReadWrite)
}

fn setup(settings: Settings) -> (Arc<LockManager>, Arc<FileLockContext>) {
    let mgr = LockManager::with_settings(settings);
    let ctx = inode(&mgr, 42);
    (mgr, ctx)
}

/// The lock context of inode `ino` on the test's device.
fn inode(mgr: &Arc<LockManager>, ino: u64) -> Arc<FileLockContext> {
    FileLockContext::new(
        mgr,
        InodeKey {
            major: 0,
            minor: 0x1b,
            ino,
        },
    )
}

fn posix(
    ctx: &Arc<FileLockContext>,
    p: u32,
    cmd: FcntlCmd,
    ty: LockType,
    start: i64,
    len: i64,
) -> Result<Option<PendingLock>, Errno> {
    ctx.fcntl_lock(
        Process::new(p),
        rw(p as u64),
        cmd,
        &mut Flock::new(ty, start, len),
    )
}

fn wait_on(ctx: &Arc<FileLockContext>, p: u32, start: i64, len: i64) -> PendingLock {
    posix(ctx, p, FcntlCmd::SetLkW, LockType::Write, start, len)
        .unwrap()
        .expect("must wait")
}

#[test]
fn an_unlock_wakes_one_exclusive_waiter_with_the_tree_and_all_without() {
    for (wake, expect) in [(WakeMode::Tree, 1), (WakeMode::All, 50)] {
        let (_m, ctx) = setup(Settings {
            wake,
            ..Settings::default()
        });
        posix(&ctx, 1, FcntlCmd::SetLk, LockType::Write, 0, 0).unwrap();
        let mut waiters: Vec<PendingLock> = (2..52).map(|p| wait_on(&ctx, p, 0, 0)).collect();
        let before = ctx.stats().wakeups;
        ctx.posix_remove_owner(Process::new(1));
        assert_eq!(ctx.stats().wakeups - before, expect, "{wake:?}");
        let woken = waiters.iter().filter(|w| w.is_woken()).count();
        assert_eq!(woken as u64, expect, "{wake:?}");
        // Exactly one of them gets the lock; the others go back to sleep.
        let granted = waiters
            .iter_mut()
            .filter_map(|w| w.poll_complete())
            .filter(|r| r.is_ok())
            .count();
        assert_eq!(granted, 1, "{wake:?}");
    }
}

#[test]
fn readers_waiting_on_a_writer_are_siblings_and_wake_together() {
    let (_m, ctx) = setup(Settings::default());
    posix(&ctx, 1, FcntlCmd::SetLk, LockType::Write, 0, 100).unwrap();
    let mut readers: Vec<PendingLock> = (2..6)
        .map(|p| {
            posix(&ctx, p, FcntlCmd::SetLkW, LockType::Read, 0, 100)
                .unwrap()
                .unwrap()
        })
        .collect();
    let mut writer = wait_on(&ctx, 9, 50, 1);
    ctx.posix_remove_owner(Process::new(1));
    for r in &mut readers {
        assert_eq!(r.poll_complete(), Some(Ok(())));
    }
    // The writer hung below the first reader: it now waits on that reader's lock.
    assert_eq!(writer.poll_complete(), None);
}

#[test]
fn non_conflicting_waiters_split_off_when_the_holder_unlocks() {
    // The wait tree's case (NeilBrown, 2018): [0,4) held; [2,4), then [1,3), then [0,2) wait. [1,3) hangs
    // below [2,4); [0,2) does not conflict with [2,4) and hangs beside it.
    let (_m, ctx) = setup(Settings::default());
    posix(&ctx, 1, FcntlCmd::SetLk, LockType::Write, 0, 4).unwrap();
    let mut p2 = wait_on(&ctx, 2, 2, 2);
    let mut p3 = wait_on(&ctx, 3, 1, 2);
    let mut p4 = wait_on(&ctx, 4, 0, 2);
    let before = ctx.stats().wakeups;
    ctx.posix_remove_owner(Process::new(1));
    assert_eq!(ctx.stats().wakeups - before, 2, "only the two siblings wake");
    assert!(p2.is_woken() && p4.is_woken() && !p3.is_woken());
    assert_eq!(p2.poll_complete(), Some(Ok(())));
    assert_eq!(p4.poll_complete(), Some(Ok(())));
    assert_eq!(
        p3.poll_complete(),
        None,
        "[1,3) conflicts with both granted locks"
    );
}

#[test]
fn a_requeued_waiter_wakes_its_own_waiters() {
    // p3 [0,6) waits below p2 [5,10), which waits on p1 [0,10). p1 unlocks and, before
    // p2 runs, takes [8,10): p2 must wait again, on [8,10), which p3 does not conflict
    // with. Leaving p3 below p2 would make it wait for nothing.
    let (_m, ctx) = setup(Settings::default());
    posix(&ctx, 1, FcntlCmd::SetLk, LockType::Write, 0, 10).unwrap();
    let mut p2 = wait_on(&ctx, 2, 5, 5);
    let mut p3 = wait_on(&ctx, 3, 0, 6);
    ctx.posix_remove_owner(Process::new(1));
    assert!(p2.is_woken() && !p3.is_woken());
    posix(&ctx, 1, FcntlCmd::SetLk, LockType::Write, 8, 2).unwrap();
    assert_eq!(p2.poll_complete(), None, "p2 sleeps again, on [8,10)");
    assert!(p3.is_woken(), "re-queuing p2 woke p3");
    assert_eq!(p3.poll_complete(), Some(Ok(())));
}

#[test]
fn interrupt_and_deadline_leave_no_trace() {
    let (mgr, ctx) = setup(Settings::default());
    posix(&ctx, 1, FcntlCmd::SetLk, LockType::Write, 0, 0).unwrap();
    let p2 = wait_on(&ctx, 2, 0, 10);
    let mut p3 = wait_on(&ctx, 3, 0, 10); // below p2
    assert!(mgr.proc_locks().contains("1: -> POSIX"));
    let int = p2.interrupter();
    let h = std::thread::spawn(move || p2.wait());
    std::thread::sleep(Duration::from_millis(20));
    int.interrupt();
    assert_eq!(h.join().unwrap(), Err(Errno::EINTR));
    // p3 was woken when p2 left, and sleeps again directly on p1's lock.
    assert_eq!(p3.poll_complete(), None);
    let t = wait_on(&ctx, 4, 20, 1);
    assert_eq!(
        t.wait_until(Instant::now() + Duration::from_millis(30)),
        Err(Errno::ETIMEDOUT)
    );
    drop(p3);
    assert_eq!(mgr.proc_locks(), "1: POSIX  ADVISORY  WRITE 1 00:1b:42 0 EOF\n");
}

struct ThreadWaker(std::thread::Thread);
impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn block_on<F: Future>(f: F) -> F::Output {
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(Duration::from_secs(5));
    }
}

#[test]
fn a_pending_lock_is_a_future() {
    let (_m, ctx) = setup(Settings::default());
    let p = Process::new(1);
    ctx.flock(p, rw(1), FlockOp::Exclusive, true).unwrap();
    let pending = ctx
        .flock_lock(Process::new(2), rw(2), FlockOp::Shared, false)
        .unwrap()
        .unwrap();
    let c2 = ctx.clone();
    let h = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        c2.file_remove(FileId(1));
    });
    assert_eq!(block_on(pending), Ok(()));
    h.join().unwrap();
}

#[test]
fn deadlock_is_refused_and_ofd_is_not_checked() {
    let (mgr, a) = setup(Settings::default());
    let b = inode(&mgr, 43);
    posix(&a, 1, FcntlCmd::SetLk, LockType::Write, 0, 1).unwrap();
    posix(&b, 2, FcntlCmd::SetLk, LockType::Write, 0, 1).unwrap();
    let _w = posix(&b, 1, FcntlCmd::SetLkW, LockType::Write, 0, 1)
        .unwrap()
        .unwrap();
    assert_eq!(
        posix(&a, 2, FcntlCmd::SetLkW, LockType::Write, 0, 1).unwrap_err(),
        Errno::EDEADLK
    );
    assert_eq!(mgr.stats().deadlocks, 1);
    // The same wait as an OFD request is not checked: it just waits.
    let ofd = a.fcntl_lock(
        Process::new(2),
        rw(2),
        FcntlCmd::OfdSetLkW,
        &mut Flock::new(LockType::Write, 0, 1),
    );
    assert!(matches!(ofd, Ok(Some(_))));
}

#[test]
fn uncontended_calls_never_take_a_global_lock() {
    let (mgr, _) = setup(Settings::default());
    let inodes: Vec<_> = (0..8)
        .map(|i| {
            FileLockContext::new(
                &mgr,
                InodeKey {
                    major: 0,
                    minor: 1,
                    ino: i,
                },
            )
        })
        .collect();
    for (i, ctx) in inodes.iter().enumerate() {
        for _ in 0..100 {
            let p = i as u32 + 1;
            posix(ctx, p, FcntlCmd::SetLk, LockType::Write, 0, 1).unwrap();
            posix(ctx, p, FcntlCmd::SetLk, LockType::Unlock, 0, 1).unwrap();
            ctx.flock(Process::new(p), rw(p as u64), FlockOp::Exclusive, true)
                .unwrap();
            ctx.flock(Process::new(p), rw(p as u64), FlockOp::Unlock, true)
                .unwrap();
        }
    }
    assert_eq!(mgr.stats(), ManagerStats::default());
    // With the setting from before the per-inode lock (Jeff Layton, 2013), every call
    // takes the one global lock.
    let (mgr, ctx) = setup(Settings {
        context_lock: ContextLock::Global,
        ..Settings::default()
    });
    posix(&ctx, 1, FcntlCmd::SetLk, LockType::Write, 0, 1).unwrap();
    posix(&ctx, 1, FcntlCmd::SetLk, LockType::Unlock, 0, 1).unwrap();
    assert_eq!(mgr.stats().global_lock_acquisitions, 2);
}

#[test]
fn flock_waiters_never_touch_the_blocked_hash() {
    let (mgr, ctx) = setup(Settings::default());
    ctx.flock(Process::new(1), rw(1), FlockOp::Exclusive, true)
        .unwrap();
    let mut w: Vec<_> = (2..10)
        .map(|p| {
            ctx.flock_lock(Process::new(p), rw(p as u64), FlockOp::Exclusive, false)
                .unwrap()
                .unwrap()
        })
        .collect();
    ctx.file_remove(FileId(1));
    for p in &mut w {
        let _ = p.poll_complete();
    }
    assert_eq!(mgr.stats().blocked_lock_acquisitions, 0);
}

#[test]
fn listing_shows_nested_waiters_like_proc_locks() {
    let (mgr, ctx) = setup(Settings::default());
    posix(&ctx, 1, FcntlCmd::SetLk, LockType::Write, 0, 0).unwrap();
    let _a = wait_on(&ctx, 2, 0, 10);
    let _b = wait_on(&ctx, 3, 5, 1);
    let _c = ctx
        .fcntl_lock(
            Process::new(4),
            rw(4),
            FcntlCmd::OfdSetLkW,
            &mut Flock::new(LockType::Read, 100, 1),
        )
        .unwrap()
        .unwrap();
    assert_eq!(
        mgr.proc_locks(),
        "1: POSIX  ADVISORY  WRITE 1 00:1b:42 0 EOF\n\
         1: -> POSIX  ADVISORY  WRITE 2 00:1b:42 0 9\n\
         1:  -> POSIX  ADVISORY  WRITE 3 00:1b:42 5 5\n\
         1: -> OFDLCK ADVISORY  READ  -1 00:1b:42 100 100\n"
    );
}

#[test]
fn a_requeued_waiter_keeps_waiters_whose_retry_would_only_sleep() {
    // A chain of exclusive waiters under p1's lock. p1 unlocks and takes the lock again
    // before the first waiter runs: that waiter sleeps again, and the rest of the chain,
    // which conflicts with p1's new lock too, is not woken.
    let (_m, ctx) = setup(Settings::default());
    posix(&ctx, 1, FcntlCmd::SetLk, LockType::Write, 0, 0).unwrap();
    let mut chain: Vec<PendingLock> = (2..12).map(|p| wait_on(&ctx, p, 0, 0)).collect();
    ctx.posix_remove_owner(Process::new(1));
    posix(&ctx, 1, FcntlCmd::SetLk, LockType::Write, 0, 0).unwrap();
    let before = ctx.stats().wakeups;
    assert_eq!(chain[0].poll_complete(), None);
    assert_eq!(ctx.stats().wakeups, before, "no waiter below the first was woken");
    assert!(chain.iter().all(|w| !w.is_woken()));
    // They still get the lock in turn.
    ctx.posix_remove_owner(Process::new(1));
    for (i, w) in chain.iter_mut().enumerate() {
        assert_eq!(w.poll_complete(), Some(Ok(())), "waiter {i}");
        ctx.posix_remove_owner(Process::new(i as u32 + 2));
    }
}

#[test]
fn a_kept_waiter_whose_retry_would_deadlock_is_woken_and_gets_edeadlk() {
    // File a: p1 holds; p2 waits; p3 waits below p2. p1 unlocks; before p2 runs, p4
    // takes a, then waits on file b for a lock of p3. When p2 sleeps again under p4's
    // lock, p3's retry (which Linux would run) finds p3 -> p4 -> p3: EDEADLK.
    let (mgr, a) = setup(Settings::default());
    let b = inode(&mgr, 43);
    posix(&b, 3, FcntlCmd::SetLk, LockType::Write, 0, 1).unwrap();
    posix(&a, 1, FcntlCmd::SetLk, LockType::Write, 0, 10).unwrap();
    let mut p2 = wait_on(&a, 2, 0, 10);
    let mut p3 = wait_on(&a, 3, 0, 10);
    a.posix_remove_owner(Process::new(1));
    posix(&a, 4, FcntlCmd::SetLk, LockType::Write, 0, 10).unwrap();
    let _p4 = posix(&b, 4, FcntlCmd::SetLkW, LockType::Write, 0, 1)
        .unwrap()
        .expect("p4 waits on b");
    assert_eq!(p2.poll_complete(), None);
    assert!(p3.is_woken());
    assert_eq!(p3.poll_complete(), Some(Err(Errno::EDEADLK)));
}

#[test]
fn a_starved_blocking_waiter_is_handed_the_lock() {
    // One owner relocks in a tight loop (barging); a second owner waits in a blocking
    // call. After it has starved for a couple of milliseconds an unlock finishes its
    // request on its behalf, and it returns with the lock.
    let (_m, ctx) = setup(Settings::default());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (c, s) = (ctx.clone(), stop.clone());
    let barger = std::thread::spawn(move || {
        let (p, f) = (Process::new(1), rw(1));
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            c.flock(p, f, FlockOp::Exclusive, false).unwrap();
            c.flock(p, f, FlockOp::Unlock, true).unwrap();
        }
    });
    std::thread::sleep(Duration::from_millis(5));
    let t = Instant::now();
    ctx.flock(Process::new(2), rw(2), FlockOp::Exclusive, false)
        .unwrap();
    let waited = t.elapsed();
    ctx.flock(Process::new(2), rw(2), FlockOp::Unlock, true).unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    barger.join().unwrap();
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
}

#[test]
fn a_hand_off_happens_only_for_owners_blocked_in_wait() {
    // A pending request driven by poll_complete (or a future) is never finished on its
    // behalf: dropping it must never leave a lock behind.
    let (mgr, ctx) = setup(Settings::default());
    ctx.flock(Process::new(1), rw(1), FlockOp::Exclusive, true)
        .unwrap();
    let mut p = ctx
        .flock_lock(Process::new(2), rw(2), FlockOp::Exclusive, false)
        .unwrap()
        .unwrap();
    std::thread::sleep(Duration::from_millis(5));
    ctx.flock(Process::new(1), rw(1), FlockOp::Unlock, true).unwrap();
    ctx.flock(Process::new(1), rw(1), FlockOp::Exclusive, true)
        .unwrap();
    assert_eq!(ctx.stats().handoffs, 0);
    assert_eq!(
        p.poll_complete(),
        None,
        "it lost to the barging owner, as Linux allows"
    );
    drop(p);
    ctx.flock(Process::new(1), rw(1), FlockOp::Unlock, true).unwrap();
    assert_eq!(mgr.locks_listing(), vec![]);
}

/// Owners 1..=`owners`, each on its own open file, take and drop an exclusive flock as
/// fast as they can for `run`; returns how many times each got it.
fn barging_herd(ctx: &Arc<FileLockContext>, owners: u32, run: Duration) -> Vec<u64> {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (1..=owners)
        .map(|i| {
            let (c, s) = (ctx.clone(), stop.clone());
            std::thread::spawn(move || {
                let (p, f) = (Process::new(i), rw(i as u64));
                let mut n = 0u64;
                while !s.load(std::sync::atomic::Ordering::Relaxed) {
                    c.flock(p, f, FlockOp::Exclusive, false).unwrap();
                    n += 1;
                    c.flock(p, f, FlockOp::Unlock, true).unwrap();
                }
                n
            })
        })
        .collect();
    std::thread::sleep(run);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    workers.into_iter().map(|w| w.join().unwrap()).collect()
}

#[test]
fn hand_offs_engage_under_a_barging_herd() {
    let (_m, ctx) = setup(Settings::default());
    let counts = barging_herd(&ctx, 8, Duration::from_millis(300));
    let s = ctx.stats();
    assert!(
        counts.iter().all(|&n| n > 0),
        "every worker got the lock: {counts:?}"
    );
    assert!(s.handoffs > 0, "no hand-off in 300 ms of barging: {s:?}");
}

#[test]
fn every_worker_of_a_barging_herd_gets_a_fair_share() {
    // Sixteen owners lock and unlock one file as fast as they can. Barging alone lets
    // one or two keep it; the turns (a hand-off to the longest waiter at most once per
    // half millisecond, and waiters woken in a turn holding back until it ends) give
    // each a share. An even number of owners: a scheme where the owner handed the lock
    // loses it to the next waiter at its first unlock serves every other owner once.
    let (_m, ctx) = setup(Settings::default());
    let counts = barging_herd(&ctx, 16, Duration::from_millis(400));
    let mean = counts.iter().sum::<u64>() as f64 / counts.len() as f64;
    let min = *counts.iter().min().unwrap() as f64;
    let s = ctx.stats();
    assert!(
        min >= mean / 10.0,
        "least-served {min}, mean {mean}: {counts:?} {s:?}"
    );
    assert!(s.handoffs > 0 && s.held > 0, "{s:?}");
}

#[test]
fn a_waiter_woken_in_another_owners_turn_waits_for_its_end() {
    // p2 is handed the lock (it waited while p1 held it); its turn starts at its first
    // unlock, which wakes p3: p3 holds back until the turn ends, so p2's next lock does
    // not wait; at p2's first unlock after the turn, p3 is handed the lock. A worker
    // thread can be descheduled for longer than a turn between its unlock and its next
    // lock: the sequence is tried a few times.
    let mut ok = 0;
    for _ in 0..5 {
        let (mgr, ctx) = setup(Settings::default());
        let (p1, p2, p3) = (Process::new(1), Process::new(2), Process::new(3));
        ctx.flock(p1, rw(1), FlockOp::Exclusive, true).unwrap();
        let c = ctx.clone();
        let t2 = std::thread::spawn(move || c.flock_waited(p2, rw(2), FlockOp::Exclusive, false));
        while mgr.locks_listing()[0].waiters.is_empty() {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(2));
        ctx.flock(p1, rw(1), FlockOp::Unlock, true).unwrap();
        assert!(t2.join().unwrap().unwrap().is_some(), "p2 waited");
        assert_eq!(ctx.stats().handoffs, 1, "p2 was handed the lock");
        let c = ctx.clone();
        let t3 = std::thread::spawn(move || c.flock_waited(p3, rw(3), FlockOp::Exclusive, false));
        while mgr.locks_listing()[0].waiters.is_empty() {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(2));
        // p2's first unlock starts its turn and wakes p3, who holds back.
        ctx.flock(p2, rw(2), FlockOp::Unlock, true).unwrap();
        let relock = ctx.flock_waited(p2, rw(2), FlockOp::Exclusive, true);
        let held = ctx.stats().held;
        if relock.is_ok() {
            std::thread::sleep(Duration::from_millis(2));
            ctx.flock(p2, rw(2), FlockOp::Unlock, true).unwrap();
        }
        assert!(t3.join().unwrap().unwrap().is_some(), "p3 waited");
        if relock == Ok(None) && held == 1 && ctx.stats().handoffs == 2 {
            ok += 1;
            break;
        }
        ctx.flock(p3, rw(3), FlockOp::Unlock, true).unwrap();
    }
    assert!(ok > 0, "p3 never held back for p2's turn in five tries");
}

#[test]
fn blocking_calls_say_whether_they_waited() {
    let (_m, ctx) = setup(Settings::default());
    let t = Instant::now();
    assert_eq!(
        ctx.fcntl_waited(
            Process::new(1),
            rw(1),
            FcntlCmd::SetLkW,
            &mut Flock::new(LockType::Write, 0, 0)
        ),
        Ok(None)
    );
    let c = ctx.clone();
    let h = std::thread::spawn(move || {
        c.fcntl_waited(
            Process::new(2),
            rw(2),
            FcntlCmd::SetLkW,
            &mut Flock::new(LockType::Write, 0, 0),
        )
    });
    std::thread::sleep(Duration::from_millis(20));
    ctx.posix_remove_owner(Process::new(1));
    let slept = h.join().unwrap().unwrap().expect("p2 waited");
    assert!(slept >= t && slept <= Instant::now());
}

/// `posix_owner_locks` lists one owner's locks over a range, cut to it, in start order,
/// alike with the index and with Linux's list.
#[test]
fn posix_owner_locks_lists_one_owners_locks_in_a_range() {
    for index in [LockIndex::Tree, LockIndex::List] {
        let (_mgr, ctx) = setup(Settings {
            index,
            ..Settings::default()
        });
        let (p, q) = (Process::new(1), Process::new(2));
        let set = |who: Process, f: u64, ty: LockType, s: i64, l: i64| {
            ctx.fcntl(who, rw(f), FcntlCmd::SetLk, &mut Flock::new(ty, s, l))
                .unwrap();
        };
        set(p, 1, LockType::Write, 40, 0);
        set(p, 1, LockType::Read, 0, 10);
        set(q, 2, LockType::Read, 5, 10);
        set(p, 1, LockType::Write, 20, 5);
        assert_eq!(
            ctx.posix_owner_locks(p, 5, 44),
            vec![
                (5, 9, LockType::Read),
                (20, 24, LockType::Write),
                (40, 44, LockType::Write)
            ],
            "{index:?}"
        );
        assert_eq!(ctx.posix_owner_locks(p, 10, 19), vec![], "{index:?}");
        assert_eq!(
            ctx.posix_owner_locks(p, 50, OFFSET_MAX),
            vec![(50, OFFSET_MAX, LockType::Write)],
            "{index:?}"
        );
        assert_eq!(
            ctx.posix_owner_locks(q, 0, OFFSET_MAX),
            vec![(5, 14, LockType::Read)],
            "{index:?}"
        );
    }
}
