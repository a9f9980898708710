//! Mixed replays: a scenario's processes spread over several directories that show the
//! same files, a source directory and mounts of it by a server that holds its clients'
//! locks on the source too (vfscalefs's `-o source_locks=mirror`).
//!
//! The kernel runner puts the scenario's processes, numbered in the order they start, on
//! the directories in turn: process *i* on directory [`dir_of`]`(i, n)`
//! ([`super::KernelOptions::views`]); one of the directories is the source, the others
//! mounts of it. Which scenarios such a replay is meant for is [`eligible`]; what it
//! must give is [`compare`]: the results of a replay in one directory, except in two
//! precise ways.
//!
//! - **Pids.** An `F_GETLK` answer's `pid` is not compared.
//! - **The server's lock, seen from the source.** The server holds what all the
//!   processes on the mounts hold as one OFD lock per maximal run of their union: write
//!   where any of them holds a write lock, read where they hold only reads. So where a
//!   replay in one directory answers an `F_GETLK` asked on the source with a lock of a
//!   process on a mount, a mixed replay may answer with one such run (pid -1) instead,
//!   provided it conflicts with the request. Its type and range are checked against the
//!   union computed from the library's lock state at that step.
//!
//! Everything else (every other result, every `completed` list) must be identical.

use std::collections::{HashMap, HashSet};

use serde_json::Value;
use vfscale_locks::{Errno, FcntlCmd, LockKind, LockType, Settings, OFFSET_MAX};

use super::format::{Op, Outcome, Resolved, Scenario, Tracker};
use super::library::LibraryReplay;

/// The directory of the `process`-th process to start (from 0), of `dirs` (at least 1).
pub fn dir_of(process: usize, dirs: usize) -> usize {
    process % dirs.max(1)
}

/// Whether a mixed replay of `scn` is meant to give a replay's results in one directory:
/// POSIX and flock locks without a cycle of waits. `Err` says why not: the scenario
/// uses OFD locks, or a step ends in `EDEADLK`, or after a step the waits form a cycle
/// (which Linux does not detect through a server's OFD locks, nor among flock locks).
pub fn eligible(scn: &Scenario) -> Result<(), String> {
    let ofd = scn
        .steps
        .iter()
        .position(|s| matches!(&s.op, Op::Fcntl { cmd, .. } if cmd.is_ofd()));
    if let Some(i) = ofd {
        return Err(format!("step {i} uses an OFD lock"));
    }
    let mut lib = LibraryReplay::new(Settings::default());
    for (i, step) in scn.steps.iter().enumerate() {
        let r = lib.apply(step).map_err(|e| e.to_string())?;
        let deadlock = Outcome::Err(Errno::EDEADLK);
        if r.result == deadlock || r.completed.iter().any(|(_, o)| *o == deadlock) {
            return Err(format!("step {i} ends in EDEADLK"));
        }
        if let Some(cycle) = wait_cycle(&lib) {
            return Err(format!("after step {i} the waits form a cycle ({cycle})"));
        }
    }
    Ok(())
}

/// A cycle of processes each waiting for the next one's lock, if there is one.
fn wait_cycle(lib: &LibraryReplay) -> Option<String> {
    let mut waits: HashMap<String, HashSet<String>> = HashMap::new();
    for (lock, waiters) in lib.locks() {
        // The owners along the path from the held lock down to the current waiter.
        let mut path = vec![lock.owner];
        for (depth, w) in waiters {
            path.truncate(depth);
            if let Some(blocker) = path.last() {
                waits.entry(w.owner.clone()).or_default().insert(blocker.clone());
            }
            path.push(w.owner);
        }
    }
    // Depth-first search from each process; `on` is the current path.
    fn visit(p: &str, waits: &HashMap<String, HashSet<String>>, on: &mut Vec<String>) -> Option<String> {
        if let Some(i) = on.iter().position(|q| q == p) {
            return Some(on[i..].join(" → ") + " → " + p);
        }
        on.push(p.to_string());
        for q in waits.get(p).into_iter().flatten() {
            if let Some(c) = visit(q, waits, on) {
                return Some(c);
            }
        }
        on.pop();
        None
    }
    let mut start: Vec<&String> = waits.keys().collect();
    start.sort();
    start.into_iter().find_map(|p| visit(p, &waits, &mut Vec::new()))
}

/// How a mixed replay's results compare with a replay's in one directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Comparison {
    /// The steps whose `F_GETLK` answer was the server's lock where the other named a
    /// mount's process (allowed), in order.
    pub server_locks: Vec<usize>,
    /// The steps whose results differ in a way the rules do not allow, in order, each
    /// with both results and, for an `F_GETLK` on the source, why it is not the
    /// server's lock.
    pub differences: Vec<(usize, String)>,
}

impl Comparison {
    /// Whether the results agree: no difference but those allowed.
    pub fn agrees(&self) -> bool {
        self.differences.is_empty()
    }
}

/// Compares `got`, the rendered results of a mixed replay of `scn` over `dirs`
/// directories of which directory `source` is the source, with `expected`, those of a replay in one directory (a recorded
/// `.expected`, or the library's), step by step, by the rules of this module. `Err`
/// when they cannot be compared: not JSON lines, or not as many.
pub fn compare(
    scn: &Scenario,
    dirs: usize,
    source: usize,
    expected: &str,
    got: &str,
) -> Result<Comparison, String> {
    let parse = |what: &str, text: &str| {
        text.lines()
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str::<Value>(l).map_err(|e| format!("{what}, line {}: {e}", i + 1))
            })
            .collect::<Result<Vec<_>, _>>()
    };
    let (expected, got) = (parse("expected", expected)?, parse("got", got)?);
    if expected.len() != got.len() || expected.len() != scn.steps.len() {
        return Err(format!(
            "{} steps, {} results expected, {} got",
            scn.steps.len(),
            expected.len(),
            got.len()
        ));
    }
    let mut out = Comparison::default();
    let mut lib = LibraryReplay::new(Settings::default());
    let mut tracker = Tracker::new();
    // The directory of each live process, and how many have started.
    let mut dir: HashMap<String, usize> = HashMap::new();
    let mut started = 0;
    for (i, (step, (e, g))) in scn.steps.iter().zip(expected.iter().zip(&got)).enumerate() {
        let resolved = tracker.resolve(i, step).map_err(|e| e.to_string())?;
        if let Resolved::Open {
            proc, new_proc: true, ..
        } = &resolved
        {
            dir.insert(proc.clone(), dir_of(started, dirs));
            started += 1;
        }
        if without_pids(e) != without_pids(g) {
            let why = match (&resolved, &step.op) {
                (
                    Resolved::Call { proc, file, .. },
                    &Op::Fcntl {
                        cmd: FcntlCmd::GetLk,
                        ty,
                        start,
                        len,
                        ..
                    },
                ) if dir.get(proc) == Some(&source) && e.get("completed") == g.get("completed") => {
                    let on_mount = |p: &str| dir.get(p).is_some_and(|&d| d != source);
                    let request = (ty, range(start, len));
                    server_lock(&lib, on_mount, file, request, &e["result"], &g["result"])
                }
                _ => Err(String::new()),
            };
            match why {
                Ok(()) => out.server_locks.push(i),
                Err(why) => {
                    let why = if why.is_empty() {
                        why
                    } else {
                        format!("\n  ({why})")
                    };
                    out.differences
                        .push((i, format!("step {i}:\n  expected: {e}\n  got:      {g}{why}")));
                }
            }
        }
        lib.apply(step).map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// `v` with every `pid` field left out.
fn without_pids(v: &Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(k, _)| *k != "pid")
                .map(|(k, v)| (k.clone(), without_pids(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_pids).collect()),
        v => v.clone(),
    }
}

/// `[start, len]` as first and last byte (`OFFSET_MAX` to end of file), as POSIX reads
/// it; only for valid requests (the others have no lock in their answer).
fn range(start: i64, len: i64) -> (i64, i64) {
    match len {
        0 => (start, OFFSET_MAX),
        l if l > 0 => (start, start.saturating_add(l - 1)),
        l => (start.saturating_add(l), start - 1),
    }
}

/// Whether `got`, an `F_GETLK` answer on the source where a replay in one directory
/// answered `expected`, is the server's lock that the rules of this module allow.
fn server_lock(
    lib: &LibraryReplay,
    on_mount: impl Fn(&str) -> bool,
    file: &str,
    (ty, (s, e)): (LockType, (i64, i64)),
    expected: &Value,
    got: &Value,
) -> Result<(), String> {
    match expected.get("pid").and_then(Value::as_str) {
        Some(p) if on_mount(p) => {}
        _ => {
            return Err(
                "the server's lock may stand only for a lock of a process on a mount, \
                        and in one directory the answer is none"
                    .into(),
            )
        }
    }
    if got.get("pid").and_then(Value::as_i64) != Some(-1) {
        return Err("not the server's lock (pid -1)".into());
    }
    let got_ty = match got.get("type").and_then(Value::as_str) {
        Some("F_WRLCK") => LockType::Write,
        Some("F_RDLCK") => LockType::Read,
        _ => return Err("no lock type".into()),
    };
    let (Some(start), Some(len)) = (
        got.get("start").and_then(Value::as_i64),
        got.get("len").and_then(Value::as_i64),
    ) else {
        return Err("no range".into());
    };
    let (gs, ge) = range(start, len);
    if gs > e || ge < s || (ty == LockType::Read && got_ty == LockType::Read) {
        return Err("it does not conflict with the request".into());
    }
    let held: Vec<(i64, i64, LockType)> = lib
        .locks()
        .into_iter()
        .map(|(l, _)| l)
        .filter(|l| l.kind == LockKind::Posix && l.file == file && on_mount(&l.owner))
        .map(|l| (l.start, l.end, l.ty))
        .collect();
    let runs = union_runs(&held);
    if runs.contains(&(gs, ge, got_ty)) {
        Ok(())
    } else {
        Err(format!(
            "not a run of what the mounts' processes hold: {}",
            runs.iter()
                .map(|(a, b, t)| format!(
                    "{} {a}-{}",
                    t.name(),
                    if *b == OFFSET_MAX {
                        "EOF".into()
                    } else {
                        b.to_string()
                    }
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

/// The maximal runs of the union of `locks` (first byte, last byte, type): write where
/// any is a write lock, read where all are reads.
fn union_runs(locks: &[(i64, i64, LockType)]) -> Vec<(i64, i64, LockType)> {
    // Segment boundaries, as i128 so that the end of file + 1 does not overflow.
    let mut cuts: Vec<i128> = locks
        .iter()
        .flat_map(|&(s, e, _)| [s as i128, e as i128 + 1])
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut runs: Vec<(i64, i64, LockType)> = Vec::new();
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1] - 1);
        let covering = locks
            .iter()
            .filter(|&&(s, e, _)| s as i128 <= a && e as i128 >= b);
        let Some(ty) = covering.map(|l| l.2).max_by_key(|t| *t == LockType::Write) else {
            continue;
        };
        let (a, b) = (a as i64, b as i64);
        match runs.last_mut() {
            Some(last) if last.2 == ty && last.1.checked_add(1) == Some(a) => last.1 = b,
            _ => runs.push((a, b, ty)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use LockType::{Read, Write};

    #[test]
    fn union_runs_merge_by_type() {
        assert_eq!(
            union_runs(&[
                (0, 9, Read),
                (5, 14, Write),
                (10, 19, Read),
                (30, OFFSET_MAX, Read)
            ]),
            vec![
                (0, 4, Read),
                (5, 14, Write),
                (15, 19, Read),
                (30, OFFSET_MAX, Read)
            ]
        );
        assert_eq!(union_runs(&[(0, 4, Read), (5, 9, Read)]), vec![(0, 9, Read)]);
        assert_eq!(union_runs(&[]), vec![]);
    }

    const TWO: &str = concat!(
        r#"{"op":"open","proc":"p1","file":"a","fd":"d1","mode":"rw"}"#,
        "\n",
        r#"{"op":"open","proc":"p2","file":"a","fd":"d2","mode":"rw"}"#,
        "\n",
        r#"{"op":"fcntl","fd":"d2","cmd":"F_SETLK","type":"F_RDLCK","start":0,"len":5}"#,
        "\n",
        r#"{"op":"fcntl","fd":"d2","cmd":"F_SETLK","type":"F_WRLCK","start":5,"len":5}"#,
        "\n",
        r#"{"op":"fcntl","fd":"d1","cmd":"F_GETLK","type":"F_WRLCK","start":0,"len":0}"#,
        "\n",
    );

    fn results(last: &str) -> String {
        format!(
            "{}{last}\n",
            (0..4)
                .map(|i| format!("{{\"step\":{i},\"result\":\"ok\"}}\n"))
                .collect::<String>()
        )
    }

    #[test]
    fn the_server_lock_is_allowed_only_as_a_run_of_the_mounts_locks() {
        let scn = Scenario::parse(TWO).unwrap();
        let expected = results(r#"{"step":4,"result":{"type":"F_RDLCK","start":0,"len":5,"pid":"p2"}}"#);
        // p2 is on the mount: its two locks are two runs of the server's.
        for ok in [
            r#"{"type":"F_RDLCK","start":0,"len":5,"pid":-1}"#,
            r#"{"type":"F_WRLCK","start":5,"len":5,"pid":-1}"#,
            r#"{"type":"F_RDLCK","start":0,"len":5,"pid":"p2"}"#,
        ] {
            let got = results(&format!(r#"{{"step":4,"result":{ok}}}"#));
            assert!(compare(&scn, 2, 0, &expected, &got).unwrap().agrees(), "{ok}");
        }
        let a = compare(
            &scn,
            2,
            0,
            &expected,
            &results(r#"{"step":4,"result":{"type":"F_WRLCK","start":5,"len":5,"pid":-1}}"#),
        );
        assert_eq!(a.unwrap().server_locks, vec![4]);
        for bad in [
            r#"{"type":"F_WRLCK","start":0,"len":10,"pid":-1}"#,
            r#"{"type":"F_RDLCK","start":0,"len":4,"pid":-1}"#,
            r#"{"type":"F_UNLCK"}"#,
            r#"{"type":"F_WRLCK","start":0,"len":5,"pid":"p1"}"#,
        ] {
            let got = results(&format!(r#"{{"step":4,"result":{bad}}}"#));
            let c = compare(&scn, 2, 0, &expected, &got).unwrap();
            assert_eq!(c.differences.len(), 1, "{bad}");
            assert_eq!(c.differences[0].0, 4, "{bad}");
        }
        // In one directory there is no mount: the server's lock is a difference.
        let got = results(r#"{"step":4,"result":{"type":"F_RDLCK","start":0,"len":5,"pid":-1}}"#);
        assert!(
            compare(&scn, 1, 0, &expected, &got).unwrap().agrees(),
            "pids are not compared"
        );
        let got = results(r#"{"step":4,"result":{"type":"F_WRLCK","start":5,"len":5,"pid":-1}}"#);
        assert!(!compare(&scn, 1, 0, &expected, &got).unwrap().agrees());
    }

    #[test]
    fn eligible_leaves_out_ofd_deadlocks_and_cycles() {
        let open = |p: &str, f: &str, d: &str| {
            format!(r#"{{"op":"open","proc":"{p}","file":"{f}","fd":"{d}","mode":"rw"}}"#) + "\n"
        };
        let flock =
            |d: &str, nb: bool| format!(r#"{{"op":"flock","fd":"{d}","how":"LOCK_EX","nb":{nb}}}"#) + "\n";
        let two_files =
            open("p1", "a", "d1") + &open("p1", "b", "d2") + &open("p2", "a", "d3") + &open("p2", "b", "d4");
        let ok = two_files.clone() + &flock("d1", true) + &flock("d4", false) + &flock("d3", false);
        assert_eq!(eligible(&Scenario::parse(&ok).unwrap()), Ok(()));
        let cycle = ok + &flock("d2", false);
        let why = eligible(&Scenario::parse(&cycle).unwrap()).unwrap_err();
        assert!(why.contains("cycle"), "{why}");
        let ofd =
            two_files + r#"{"op":"fcntl","fd":"d1","cmd":"F_OFD_GETLK","type":"F_WRLCK","start":0,"len":1}"#;
        assert!(eligible(&Scenario::parse(&ofd).unwrap())
            .unwrap_err()
            .contains("OFD"));
    }
}
