//! Mixed lock scenarios: the corpus's POSIX and flock scenarios without cycles, replayed
//! by the kernel runner with their processes in turn on a tmpfs source and on a vfscalefs
//! mount of it, must give what the kernel gives on tmpfs (the recorded `X.expected`), by
//! the rules of `vfscale_conformance::locks::mixed`: pids aside, and an `F_GETLK` on the
//! source may see the server's lock standing for the mount's holders. With the default
//! `-o source_locks=mirror` they do; with `source_locks=off` the two sides' locks ignore
//! each other, and the same comparison must tell.

mod common;

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use common::{cannot_mount, say, Mounted};
use vfscale_conformance::locks::mixed::{self, Comparison};
use vfscale_conformance::locks::{kernel, render_results, KernelOptions, Scenario};

/// A replay known to differ from the kernel on tmpfs.
struct Known {
    scenario: &'static str,
    /// Whether the scenario's first process is on the source (else on the mount).
    source_first: bool,
    /// What the difference shows: the steps that differ (`steps [7, 12]`), or the error
    /// that ended the replay.
    shows: &'static str,
    why: &'static str,
}

const LIST_ORDER: &str = "F_GETLK answers with the first conflicting lock in the kernel's list; \
    across the server's lock space and the source's that order is not kept: through the mount \
    the server answers with a client's lock before a source's, and the source lists the \
    server's lock where the server first took it";

const HAND_OFF_ORDER: &str = "Linux queues a request behind a waiting request it conflicts \
    with, and wakes only a lock's direct waiters at its unlock; the server cannot see the \
    source's waiters, so a client's unlock hands the range on to a client that waits \
    for it there, and host processes waiting for the same lock wait on behind that client";

const KNOWN: &[Known] = &[
    Known {
        scenario: "posix_getlk_first_in_list_order",
        source_first: true,
        shows: "steps [7, 12]",
        why: LIST_ORDER,
    },
    Known {
        scenario: "posix_getlk_first_in_list_order",
        source_first: false,
        shows: "steps [8, 9, 15]",
        why: LIST_ORDER,
    },
    // p1 through the mount holds [0,4), p2 and p4 on the source wait for [2,4) and
    // [0,2), p3 through the mount for [1,3), which Linux queues behind p2's request;
    // p1 unlocks: Linux grants p2 and p4, the server hands [1,3) on to p3 (the one
    // waiter it sees), and p2 and p4 wait for p3.
    Known {
        scenario: "seed003_transitivity",
        source_first: false,
        shows: r#"process "p2" is blocked in step 6"#,
        why: HAND_OFF_ORDER,
    },
];

/// One mount at a time: settling on a FUSE mount is judged by time.
static ONE_MOUNT: Mutex<()> = Mutex::new(());

/// The corpus's scenarios meant for a mixed replay (see `mixed::eligible`), with their
/// expected results, in name order; and how many were left out.
fn eligible() -> (Vec<(String, Scenario, String)>, usize) {
    let mut left_out = 0;
    let mut out = Vec::new();
    for f in common::lock_corpus() {
        let scn = Scenario::parse(&std::fs::read_to_string(&f).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        if mixed::eligible(&scn).is_err() {
            left_out += 1;
            continue;
        }
        let expected = std::fs::read_to_string(f.with_extension("expected")).unwrap();
        let name = f.file_stem().unwrap().to_string_lossy().into_owned();
        out.push((name, scn, expected));
    }
    (out, left_out)
}

/// A mixed replay of `scn` over `m`'s source and its mount, the first process on the
/// source if `source_first`, else on the mount, compared with `expected`.
fn replay(m: &Mounted, source_first: bool, scn: &Scenario, expected: &str) -> Result<Comparison, String> {
    let mut dirs = [m.source.clone(), m.mounts[0].clone()];
    if !source_first {
        dirs.reverse();
    }
    let r = kernel::replay_with(scn, &KernelOptions::in_dirs(&dirs)).map_err(|e| e.to_string())?;
    let source = if source_first { 0 } else { 1 };
    mixed::compare(scn, dirs.len(), source, expected, &render_results(&r))
}

/// A server with `-o opts` on a fresh source, once no other test of this file has one;
/// `None` (after saying why) where the mount tests cannot run.
fn start(opts: &str) -> Option<(MutexGuard<'static, ()>, Mounted)> {
    let why = cannot_mount().or_else(|| {
        kernel::available()
            .err()
            .map(|why| format!("the kernel runner cannot run here: {why}"))
    });
    if let Some(why) = why {
        say(&format!("SKIP: {why}"));
        return None;
    }
    let one = ONE_MOUNT.lock().unwrap_or_else(|e| e.into_inner());
    Some((one, Mounted::start(1, opts).expect("mount")))
}

#[test]
fn mixed_corpus_gives_the_kernels_results() {
    let Some((_one, m)) = start("") else { return };
    let (scenarios, left_out) = eligible();
    let start = Instant::now();
    let (mut agree, mut differ_as_known, mut server_locks, mut failures) = (0, 0, 0, Vec::new());
    let runs = [true, false]
        .into_iter()
        .flat_map(|first| scenarios.iter().map(move |s| (first, s)));
    for (source_first, (name, scn, expected)) in runs {
        let known = KNOWN
            .iter()
            .find(|k| k.scenario == name && k.source_first == source_first);
        let side = if source_first {
            "source first"
        } else {
            "mount first"
        };
        // What is wrong with the replay: `None` when it agrees with the kernel.
        let attempt = || match replay(&m, source_first, scn, expected) {
            Ok(c) if c.agrees() => (c.server_locks.len(), None),
            Ok(c) => {
                let steps: Vec<usize> = c.differences.iter().map(|d| d.0).collect();
                let detail: Vec<String> = c.differences.into_iter().map(|d| d.1).collect();
                (0, Some(format!("steps {steps:?}:\n{}", detail.join("\n"))))
            }
            Err(e) => (0, Some(e)),
        };
        let judge = |(seen, wrong): (usize, Option<String>)| -> Result<usize, String> {
            match (wrong, known) {
                (None, None) => Ok(seen),
                (Some(w), Some(k)) if w.contains(k.shows) => Ok(seen),
                (None, Some(k)) => Err(format!(
                    "{name} ({side}): agrees, but is known to show {}",
                    k.shows
                )),
                (Some(w), _) => Err(format!("{name} ({side}): differs from the kernel on tmpfs: {w}")),
            }
        };
        // A difference is replayed once more, so that only one seen twice fails.
        let got = judge(attempt()).or_else(|first| {
            say(&format!("retrying (the first replay differed): {first}"));
            judge(attempt())
        });
        match got {
            Ok(seen) => {
                server_locks += seen;
                if known.is_none() {
                    agree += 1;
                } else {
                    differ_as_known += 1;
                }
            }
            Err(e) => failures.push(e),
        }
    }
    assert!(
        scenarios.len() >= 35,
        "only {} eligible scenarios",
        scenarios.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} replays differ:\n{}",
        failures.len(),
        2 * scenarios.len(),
        failures.join("\n")
    );
    for k in KNOWN {
        let side = if k.source_first {
            "source first"
        } else {
            "mount first"
        };
        say(&format!(
            "known difference: {} ({side}), {}: {}",
            k.scenario, k.shows, k.why
        ));
    }
    say(&format!(
        "mixed lock corpus (source and vfscalefs mount, mirror): {} scenarios ({left_out} with OFD \
         locks, deadlocks or cycles left out), each with its first process on the source and on \
         the mount: {agree} replays agree with the kernel, {differ_as_known} differ as known; the server's lock \
         seen from the source in {server_locks} steps; {:.1} s",
        scenarios.len(),
        start.elapsed().as_secs_f64()
    ));
}

/// The comparison can fail: without source locks, the locks taken through the mount are
/// not seen on the source, and the mixed replays say so.
#[test]
fn mixed_corpus_differs_without_source_locks() {
    let Some((_one, m)) = start("source_locks=off") else {
        return;
    };
    let (scenarios, _) = eligible();
    let mut differ = Vec::new();
    for (name, scn, expected) in &scenarios {
        let c = replay(&m, true, scn, expected).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some((_, first)) = c.differences.first() {
            differ.push((name.as_str(), first.clone()));
        }
    }
    let Some((name, first)) = differ.first() else {
        panic!("with source_locks=off every mixed scenario agreed: the comparison cannot fail");
    };
    say(&format!(
        "source_locks=off: {} of {} mixed scenarios differ, as they must; the first, {name}, at {first}",
        differ.len(),
        scenarios.len()
    ));
}
