//! What a lock step costs the library as locks pile up on one file, through the replay
//! path (`vfscale locks replay --against library` runs the same code). With the index
//! ([`LockIndex::Tree`], the default) a step with 10,000 OFD locks held compares its
//! request with no more locks than one with 10 held (at most twice as many), and walks
//! tree paths whose length grows as the log of the locks held (measured: 3.3 nodes per
//! step at 10 held, 6.0 at 10,000 — the 3 nodes of the B+ tree by start, with 31-child
//! branches and 15-entry leaves; the
//! by-owner lookups are one table probe and the requesting owner's own tree, which
//! holds nothing here); with Linux's list
//! ([`LockIndex::List`]) a step compares every lock held.
//!
//! Cost is counted, not timed (timing is the lab's job): the library's own counters
//! of lock records compared with a request (`lock_checks`, Linux's list walk compares
//! every lock) and of index tree nodes visited (`index_nodes`).

use vfscale_conformance::locks::{LibraryReplay, Op, OpenMode, Outcome, Step};
use vfscale_locks::{ContextStats, FcntlCmd, LockIndex, LockType, Settings};

/// Steps measured per setting and size: set + unset at a free byte and test a held one,
/// `ROUNDS` times.
const ROUNDS: usize = 50;

fn step(line: usize, op: Op) -> Step {
    Step { line, op }
}

fn ofd(fd: String, cmd: FcntlCmd, ty: LockType, start: i64) -> Op {
    Op::Fcntl {
        fd,
        cmd,
        ty,
        start,
        len: 1,
    }
}

/// Per-step cost of a lock step with `held` OFD locks on bytes 0, 2, 4, ...: mean
/// (lock_checks, index_nodes) over set, unset and test steps.
fn cost_per_step(index: LockIndex, held: usize) -> (f64, f64) {
    let mut r = LibraryReplay::new(Settings {
        index,
        ..Settings::default()
    });
    let mut line = 0;
    let mut apply = |r: &mut LibraryReplay, op: Op| {
        line += 1;
        r.apply(&step(line, op)).expect("a valid step")
    };
    // One process, `held` open file descriptions, each holding one byte.
    for i in 0..=held {
        let open = Op::Open {
            proc: "p".into(),
            file: "f".into(),
            fd: format!("d{i}"),
            mode: OpenMode::Rw,
        };
        apply(&mut r, open);
    }
    for i in 0..held {
        let res = apply(
            &mut r,
            ofd(format!("d{i}"), FcntlCmd::OfdSetLk, LockType::Write, 2 * i as i64),
        );
        assert_eq!(res.result, Outcome::Ok);
    }
    let before = r.file_stats("f").expect("file f is open");
    let probe = format!("d{held}");
    let mut x = 0x9E3779B97F4A7C15u64;
    let mut steps = 0;
    for _ in 0..ROUNDS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let byte = (x % held as u64) as i64;
        let set = apply(
            &mut r,
            ofd(probe.clone(), FcntlCmd::OfdSetLk, LockType::Write, 2 * byte + 1),
        );
        assert_eq!(set.result, Outcome::Ok, "byte {} is free", 2 * byte + 1);
        let unset = apply(
            &mut r,
            ofd(probe.clone(), FcntlCmd::OfdSetLk, LockType::Unlock, 2 * byte + 1),
        );
        assert_eq!(unset.result, Outcome::Ok);
        let test = apply(
            &mut r,
            ofd(probe.clone(), FcntlCmd::OfdGetLk, LockType::Read, 2 * byte),
        );
        assert!(
            matches!(test.result, Outcome::Lock { start, .. } if start == 2 * byte),
            "byte {} is held: {:?}",
            2 * byte,
            test.result
        );
        steps += 3;
    }
    let after = r.file_stats("f").expect("file f is open");
    let d = |f: fn(&ContextStats) -> u64| (f(&after) - f(&before)) as f64 / steps as f64;
    (d(|s| s.lock_checks), d(|s| s.index_nodes))
}

#[test]
fn a_lock_step_compares_no_more_locks_with_ten_thousand_held_than_with_ten() {
    let (checks_10, nodes_10) = cost_per_step(LockIndex::Tree, 10);
    let (checks_10k, nodes_10k) = cost_per_step(LockIndex::Tree, 10_000);
    let (list_10, _) = cost_per_step(LockIndex::List, 10);
    let (list_10k, _) = cost_per_step(LockIndex::List, 10_000);
    eprintln!(
        "per lock step: index: {checks_10:.2} locks compared and {nodes_10:.1} tree nodes visited with 10 held, \
         {checks_10k:.2} and {nodes_10k:.1} with 10,000; list: {list_10:.1} locks compared with 10 held, \
         {list_10k:.1} with 10,000"
    );
    // The index compares a step's request only with the locks it meets.
    assert!(
        checks_10k <= 2.0 * checks_10,
        "index: {checks_10k} locks compared per step with 10,000 held, {checks_10} with 10"
    );
    // The tree walks grow with the depth, log2 of the locks held (about 13.3 at 10,000):
    // a few walks of at most 1.45 log2(n) + 2 nodes each (an AVL tree's height bound).
    let depth_bound = 1.45 * (10_000f64).log2() + 2.0;
    assert!(
        nodes_10k <= 8.0 * depth_bound,
        "index: {nodes_10k} tree nodes per step with 10,000 held (depth bound {depth_bound:.1})"
    );
    // The owner lookups cost the same whatever other owners hold; only the B+ tree by
    // start grows (1 node at 10 held, 3 at 10,000): measured 3.3 and 6.0 nodes per step.
    // (With one AVL tree by owner over every owner's locks it was 6.0 and 23.3.)
    assert!(
        nodes_10k <= 3.0 * nodes_10,
        "index: {nodes_10k} tree nodes per step with 10,000 held, {nodes_10} with 10"
    );
    // Linux's list walks every lock: the counter sees it.
    assert!(
        list_10k >= 500.0 * list_10.max(1.0) / 10.0,
        "list: {list_10k} locks compared per step with 10,000 held, {list_10} with 10"
    );
}
