//! The index against Linux's list: random calls on one inode, replayed with both
//! settings, must give the same results, the same listing in the same order (held
//! locks in list order, waiters in tree order) and the same counters, and the trees
//! must stay balanced, ordered and correctly augmented after every call.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;

use crate::*;

const PROCS: u32 = 5;
const FILES: u64 = 8;

#[derive(Clone, Debug)]
enum Call {
    Fcntl {
        file: u64,
        cmd: FcntlCmd,
        ty: LockType,
        start: i64,
        len: i64,
        /// The calling thread of the file's process: its pid is the process's plus
        /// 100 per thread (tasks sharing one file table: one POSIX owner, several
        /// pids, each lock reporting its own).
        thread: u8,
    },
    Close(u64),
    LastClose(u64),
    Interrupt(u64),
}

fn call() -> impl Strategy<Value = Call> {
    call_over(FILES, 48, 1, 4)
}

/// A call by one of `files` open files on bytes below `bytes` (ranges may run past
/// them); `closes` weighs closes and interrupts against 12 for `fcntl`, and `waits`
/// the blocking commands against 8 for a set and 4 for a test.
fn call_over(files: u64, bytes: i64, closes: u32, waits: u32) -> impl Strategy<Value = Call> {
    use FcntlCmd::*;
    let cmd = prop_oneof![
        8 => Just(SetLk),
        waits => Just(SetLkW),
        4 => Just(GetLk),
        8 => Just(OfdSetLk),
        waits => Just(OfdSetLkW),
        4 => Just(OfdGetLk),
    ];
    let ty = prop::sample::select(vec![
        LockType::Read,
        LockType::Write,
        LockType::Write,
        LockType::Unlock,
    ]);
    let len = prop_oneof![3 => 1i64..6, 1 => Just(0i64), 1 => -3i64..0, 1 => 6i64..30];
    prop_oneof![
        12 => (1..=files, cmd, ty, 0i64..bytes, len, 0u8..3).prop_map(|(file, cmd, ty, start, len, thread)| {
            Call::Fcntl {
                file,
                cmd,
                ty,
                start,
                len,
                thread,
            }
        }),
        closes => (1..=files).prop_map(Call::Close),
        closes => (1..=files).prop_map(Call::LastClose),
        closes => (1..=files).prop_map(Call::Interrupt),
    ]
}

/// File `f` is opened by process `f % PROCS + 1`.
fn who(file: u64) -> (Process, OpenFile) {
    (
        Process::new((file % PROCS as u64) as u32 + 1),
        OpenFile::new(file, AccessMode::ReadWrite),
    )
}

struct Side {
    mgr: Arc<LockManager>,
    ctx: Arc<FileLockContext>,
    /// Pending requests by file.
    pending: BTreeMap<u64, PendingLock>,
}

impl Side {
    fn new(index: LockIndex) -> Side {
        let mgr = LockManager::with_settings(Settings {
            index,
            ..Settings::default()
        });
        let ctx = FileLockContext::new(
            &mgr,
            InodeKey {
                major: 0,
                minor: 1,
                ino: 2,
            },
        );
        Side {
            mgr,
            ctx,
            pending: BTreeMap::new(),
        }
    }

    /// Applies `c`; returns what a caller would see, as text.
    fn apply(&mut self, c: &Call) -> String {
        let out = match *c {
            Call::Fcntl {
                file,
                cmd,
                ty,
                start,
                len,
                thread,
            } => {
                if cmd.waits() && self.pending.contains_key(&file) {
                    return "skip".into();
                }
                // A process blocked in one call makes no other.
                let (mut p, f) = who(file);
                if !cmd.is_ofd() && self.pending.keys().any(|&g| who(g).0 == p) {
                    return "skip".into();
                }
                p.pid = Pid(p.pid.0 + 100 * thread as i32);
                let mut fl = Flock::new(ty, start, len);
                match self.ctx.fcntl_lock(p, f, cmd, &mut fl) {
                    Ok(Some(pl)) => {
                        self.pending.insert(file, pl);
                        "blocked".into()
                    }
                    Ok(None) if cmd.is_get() => format!("{fl:?}"),
                    r => format!("{:?}", r.map(|_| ())),
                }
            }
            Call::Close(file) => {
                let (p, _) = who(file);
                if self.pending.keys().any(|&g| who(g).0 == p) {
                    return "skip".into();
                }
                self.ctx.posix_remove_owner(p);
                "closed".into()
            }
            Call::LastClose(file) => {
                if self.pending.contains_key(&file) {
                    return "skip".into();
                }
                self.ctx.file_remove(FileId(file));
                "closed".into()
            }
            Call::Interrupt(file) => match self.pending.remove(&file) {
                Some(p) => {
                    p.interrupter().interrupt();
                    format!("{:?}", p.wait())
                }
                None => "none".into(),
            },
        };
        // Settle: retry every woken request until none is left, in file order.
        let mut done = Vec::new();
        loop {
            let mut progressed = false;
            let files: Vec<u64> = self.pending.keys().copied().collect();
            for f in files {
                if let Some(r) = self.pending.get_mut(&f).unwrap().poll_complete() {
                    self.pending.remove(&f);
                    done.push((f, r));
                    progressed = true;
                }
            }
            if !progressed {
                break;
            }
        }
        format!("{out} {done:?}")
    }

    fn check(&self) {
        let inner = self.ctx.inner.lock();
        inner.tree.check(&inner.arena);
    }
}

/// Replays `calls` with both settings: the same results, listing and counters, and
/// the trees (leaf tags and the owner cache included) checked after every call.
/// Returns how many times the run keys were renumbered.
fn same_as_the_list(calls: &[Call]) -> Result<u32, TestCaseError> {
    let mut tree = Side::new(LockIndex::Tree);
    let mut list = Side::new(LockIndex::List);
    let next_seq = |s: &Side| s.ctx.inner.lock().tree.next_seq;
    let mut renumbered = 0;
    for (i, c) in calls.iter().enumerate() {
        let before = next_seq(&tree);
        let a = tree.apply(c);
        let b = list.apply(c);
        prop_assert_eq!(&a, &b, "call {} {:?}", i, c);
        tree.check();
        renumbered += u32::from(next_seq(&tree) < before);
        prop_assert_eq!(
            tree.mgr.proc_locks(),
            list.mgr.proc_locks(),
            "listing after call {} {:?}",
            i,
            c
        );
        let (st, sl) = (tree.ctx.stats(), list.ctx.stats());
        prop_assert_eq!(
            (st.grants, st.wakeups, st.blocks),
            (sl.grants, sl.wakeups, sl.blocks),
            "counters after call {} {:?}",
            i,
            c
        );
    }
    Ok(renumbered)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_index_gives_linuxs_list_results(calls in prop::collection::vec(call(), 1..120)) {
        same_as_the_list(&calls)?;
    }

    /// Many owners (40 open files; 5 processes, each calling from three pids) on 24
    /// bytes, closing often: runs start and end all the time, so the run keys are
    /// renumbered (every 40 runs in tests) several times a case, records, leaf tags
    /// and the cached owner's key alike; an owner's locks are upgraded, downgraded,
    /// split and merged, each keeping the pid Linux keeps.
    #[test]
    fn many_owners_coming_and_going_give_linuxs_list_results(
        calls in prop::collection::vec(call_over(40, 64, 3, 1), 1..400)
    ) {
        same_as_the_list(&calls)?;
    }
}

/// The churn above renumbers the run keys often (so that the proptest exercises it).
#[test]
fn churning_owners_renumber_the_run_keys() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let calls = prop::collection::vec(call_over(40, 64, 3, 1), 3000)
        .new_tree(&mut runner)
        .unwrap()
        .current();
    let renumbered = same_as_the_list(&calls).unwrap();
    assert!(renumbered >= 15, "renumbered {renumbered} times");
}

/// Locks evenly spaced (the by-start tree's nodes step by interpolation), from 0 or
/// ending at the greatest offset, spaced by bytes or by gigabytes, held by one to
/// three owners; then tests, locks and unlocks on, beside and across them.
fn evenly_spaced() -> impl Strategy<Value = (Vec<Call>, Vec<Call>)> {
    let step = prop_oneof![
        2i64..9,
        prop::sample::select(vec![
            4096i64,
            (1 << 14) - 1,
            1 << 14,
            (1 << 14) + 1,
            1 << 20,
            1 << 40
        ]),
    ];
    let n = prop_oneof![3 => 14i64..64, 1 => 404i64..440];
    let setup = (step, n, any::<bool>(), 1u64..=3, any::<bool>(), 0u8..3);
    setup.prop_flat_map(|(step, n, at_end, owners, ofd, fill)| {
        let n = n.min(i64::MAX / step);
        let base = if at_end { i64::MAX - (n - 1) * step } else { 0 };
        let held = (0..n)
            .map(|i| Call::Fcntl {
                file: 1 + i as u64 % owners,
                cmd: if ofd { FcntlCmd::OfdSetLk } else { FcntlCmd::SetLk },
                ty: if i % 5 == 2 {
                    LockType::Read
                } else {
                    LockType::Write
                },
                start: base + i * step,
                len: [1, step / 2, step - 1][fill as usize],
                thread: (i % 3) as u8,
            })
            .collect::<Vec<_>>();
        let cmd = prop::sample::select(vec![
            FcntlCmd::GetLk,
            FcntlCmd::OfdGetLk,
            FcntlCmd::GetLk,
            FcntlCmd::OfdGetLk,
            FcntlCmd::SetLk,
            FcntlCmd::OfdSetLk,
            FcntlCmd::SetLkW,
        ]);
        let ty = prop::sample::select(vec![LockType::Read, LockType::Write, LockType::Unlock]);
        let at = prop_oneof![0..n, Just(n - 1), Just(0)];
        let off = prop::sample::select(vec![0i64, 0, 1, -1, step - 1, step / 2]);
        let len = prop::sample::select(vec![1i64, 1, 0, step, step + 1, 3 * step, -1, 2]);
        let one =
            (1..=FILES, cmd, ty, at, off, len).prop_map(move |(file, cmd, ty, i, off, len)| Call::Fcntl {
                file,
                cmd,
                ty,
                start: (base + i * step).saturating_add(off).max(0),
                len,
                thread: (i % 2) as u8,
            });
        let calls = prop_oneof![
            20 => one,
            1 => (1..=FILES).prop_map(Call::Close),
            1 => (1..=FILES).prop_map(Call::Interrupt),
        ];
        (Just(held), prop::collection::vec(calls, 1..40))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn evenly_spaced_locks_give_linuxs_list_results((held, calls) in evenly_spaced()) {
        let mut tree = Side::new(LockIndex::Tree);
        let mut list = Side::new(LockIndex::List);
        for (i, c) in held.iter().chain(&calls).enumerate() {
            let a = tree.apply(c);
            let b = list.apply(c);
            prop_assert_eq!(&a, &b, "call {} {:?}", i, c);
            if i + 1 >= held.len() {
                tree.check();
                prop_assert_eq!(tree.mgr.proc_locks(), list.mgr.proc_locks(), "listing after call {} {:?}", i, c);
            }
        }
    }
}

/// Runs `f` on a context with each setting (then checks the trees); both must see
/// the same. Returns what they saw.
fn on_tree_and_list<T: PartialEq + std::fmt::Debug>(f: impl Fn(&Side) -> T) -> T {
    let [tree, list] = [LockIndex::Tree, LockIndex::List].map(|index| {
        let side = Side::new(index);
        let seen = f(&side);
        side.check();
        seen
    });
    assert_eq!(tree, list, "Tree against List");
    tree
}

/// `F_GETLK` is answered from the by-start tree's leaves: each lock's own pid (one
/// owner, two pids: processes sharing a file table), `-1` for an OFD lock, the
/// type and range, and nothing of the requester's own locks; as the list says.
#[test]
fn getlk_reports_each_locks_own_pid() {
    let f = |n| OpenFile::new(n, AccessMode::ReadWrite);
    let p = |owner, pid| Process {
        owner: OwnerId(owner),
        pid: Pid(pid),
    };
    let got = on_tree_and_list(|s| {
        let set = |who, file, cmd, ty, start, len| {
            let mut fl = Flock::new(ty, start, len);
            s.ctx.fcntl(who, f(file), cmd, &mut fl).unwrap();
        };
        set(p(1, 7), 1, FcntlCmd::SetLk, LockType::Write, 0, 10);
        set(p(1, 9), 1, FcntlCmd::SetLk, LockType::Read, 20, 10);
        set(p(2, 4), 2, FcntlCmd::OfdSetLk, LockType::Write, 40, 10);
        set(p(3, 5), 3, FcntlCmd::SetLk, LockType::Read, 25, 1);
        let mut out = Vec::new();
        for (who, file, cmd, ty, start) in [
            (p(5, 50), 5, FcntlCmd::GetLk, LockType::Write, 5),
            (p(5, 50), 5, FcntlCmd::GetLk, LockType::Write, 25),
            (p(5, 50), 5, FcntlCmd::OfdGetLk, LockType::Read, 0),
            (p(5, 50), 5, FcntlCmd::GetLk, LockType::Read, 45),
            (p(1, 11), 1, FcntlCmd::GetLk, LockType::Write, 0),
            (p(1, 11), 1, FcntlCmd::GetLk, LockType::Write, 25),
            (p(3, 5), 3, FcntlCmd::GetLk, LockType::Write, 0),
            (p(3, 5), 3, FcntlCmd::OfdGetLk, LockType::Unlock, 40),
            (p(3, 5), 2, FcntlCmd::OfdGetLk, LockType::Unlock, 40),
        ] {
            let mut fl = Flock::new(ty, start, 30);
            s.ctx.fcntl(who, f(file), cmd, &mut fl).unwrap();
            out.push((fl.l_type, fl.l_start, fl.l_len, fl.l_pid));
        }
        out
    });
    use LockType::*;
    assert_eq!(
        got,
        [
            (Write, 0, 10, 7),
            (Read, 20, 10, 9),
            (Write, 0, 10, 7),
            (Write, 40, 10, -1),
            (Read, 25, 1, 5),
            // The OFD lock's run started before process 3's.
            (Write, 40, 10, -1),
            (Write, 0, 10, 7),
            (Unlock, 40, 30, 0),
            (Write, 40, 10, -1),
        ]
    );
}

/// A POSIX owner's locks set from several pids (tasks sharing a file table) each
/// report their own pid, as Linux keeps it: a lock extended by a merge keeps the pid
/// of the lock it extends (`request = fl`), even over a lock of the other type, and
/// the pieces of a split keep the split lock's; as the list says.
#[test]
fn merged_and_split_locks_report_the_pid_linux_keeps() {
    let f = OpenFile::new(1, AccessMode::ReadWrite);
    let p = |owner, pid| Process {
        owner: OwnerId(owner),
        pid: Pid(pid),
    };
    let seen = on_tree_and_list(|s| {
        let call = |pid, cmd, ty, start, len| {
            let mut fl = Flock::new(ty, start, len);
            let who = if cmd == FcntlCmd::GetLk {
                p(2, 70)
            } else {
                p(1, pid)
            };
            s.ctx.fcntl(who, f, cmd, &mut fl).unwrap();
            (fl.l_type, fl.l_start, fl.l_len, fl.l_pid)
        };
        use FcntlCmd::{GetLk, SetLk};
        use LockType::*;
        call(7, SetLk, Write, 0, 10);
        // Merged into [0, 19]: still pid 7's.
        call(9, SetLk, Write, 5, 15);
        // Split: [0, 4] W 7, [5, 9] R 11, [10, 19] W 7.
        call(11, SetLk, Read, 5, 5);
        // Extends pid 11's read lock: [5, 10] R 11, [11, 19] W 7.
        call(13, SetLk, Read, 10, 1);
        // Extends pid 7's [0, 4]: [0, 6] W 7, [7, 10] R 11.
        call(15, SetLk, Write, 3, 4);
        // Another process's F_GETLK of (type, start, len) and what it must find.
        let mut seen = Vec::new();
        let mut test = |q: (LockType, i64, i64), want| seen.push((call(0, GetLk, q.0, q.1, q.2), want));
        test((Write, 0, 30), (Write, 0, 7, 7));
        test((Write, 7, 2), (Read, 7, 4, 11));
        test((Read, 7, 4), (Unlock, 7, 4, 0));
        test((Read, 8, 5), (Write, 11, 9, 7));
        test((Write, 19, 5), (Write, 11, 9, 7));
        // Extends pid 11's [7, 10] R over [11, 19] W, which goes: [7, 26] R 11.
        call(17, SetLk, Read, 7, 20);
        test((Write, 0, 30), (Write, 0, 7, 7));
        test((Write, 12, 1), (Read, 7, 20, 11));
        seen
    });
    for (i, (got, want)) in seen.iter().enumerate() {
        assert_eq!(got, want, "test {i}");
    }
}

/// The owner cache follows a renumbering of its own run: the last owner to search
/// holds locks when the keys are renumbered (the calls never leave it so — the owner
/// starting a run has just searched, and holds none — but the cache must not depend
/// on that), and its next test must still skip its own lock.
#[test]
fn the_cached_owner_follows_its_renumbered_run() {
    let mut side = Side::new(LockIndex::Tree);
    let ofd = |file, ty, start| Call::Fcntl {
        file,
        cmd: FcntlCmd::OfdSetLk,
        ty,
        start,
        len: 1,
        thread: 0,
    };
    let getlk = |file, start, len| Call::Fcntl {
        file,
        cmd: FcntlCmd::OfdGetLk,
        ty: LockType::Write,
        start,
        len,
        thread: 0,
    };
    // Runs 1..=30, one lock each at byte 2 * file; the first 20 end.
    for file in 1..=30 {
        side.apply(&ofd(file, LockType::Write, 2 * file as i64));
    }
    for file in 1..=20 {
        side.apply(&Call::LastClose(file));
    }
    // File 30 searches (the cache holds its key, 30), then the keys are renumbered:
    // its run is now the tenth.
    assert!(side.apply(&getlk(30, 60, 1)).contains("Unlock"));
    {
        let mut inner = side.ctx.inner.lock();
        let inner = &mut *inner;
        inner.tree.next_seq = super::SEQ_LIMIT;
        inner.tree.new_seq(&mut inner.arena);
        assert_eq!(inner.tree.last.get(), (1, 30, 10), "the cached owner's key");
        inner.tree.check(&inner.arena);
    }
    // Its own lock is still not a conflict, and file 21's (now key 1) is the first.
    assert!(side.apply(&getlk(30, 60, 1)).contains("Unlock"));
    assert!(side.apply(&getlk(30, 0, 0)).contains("l_start: 42"));
    side.check();
}

#[test]
fn many_owners_many_ranges_stay_consistent() {
    // A denser run than the proptest: 2,000 calls over 64 owners on 200 bytes.
    let mut tree = Side::new(LockIndex::Tree);
    let mut list = Side::new(LockIndex::List);
    let mut x = 0x2545F4914F6CDD1Du64;
    for i in 0..2000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let file = 1 + x % 64;
        let cmd = [
            FcntlCmd::SetLk,
            FcntlCmd::OfdSetLk,
            FcntlCmd::GetLk,
            FcntlCmd::OfdGetLk,
        ][(x >> 8) as usize % 4];
        let ty = [LockType::Read, LockType::Write, LockType::Unlock][(x >> 12) as usize % 3];
        let ty = if cmd == FcntlCmd::GetLk && ty == LockType::Unlock {
            LockType::Read
        } else {
            ty
        };
        let c = Call::Fcntl {
            file,
            cmd,
            ty,
            start: ((x >> 16) % 200) as i64,
            len: 1 + ((x >> 24) % 12) as i64,
            thread: ((x >> 40) % 3) as u8,
        };
        let (a, b) = (tree.apply(&c), list.apply(&c));
        assert_eq!(a, b, "call {i} {c:?}");
        if i % 50 == 0 {
            tree.check();
            assert_eq!(
                tree.mgr.proc_locks(),
                list.mgr.proc_locks(),
                "listing after call {i}"
            );
        }
    }
    tree.check();
    assert_eq!(tree.mgr.proc_locks(), list.mgr.proc_locks());
    let (st, sl) = (tree.ctx.stats(), list.ctx.stats());
    assert!(
        st.lock_checks * 4 < sl.lock_checks,
        "the index examines fewer locks: {st:?} vs {sl:?}"
    );
}
