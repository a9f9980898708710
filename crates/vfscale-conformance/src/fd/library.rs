//! Replays a descriptor scenario against this library: each process is an
//! [`FdTable`] of file names (`Arc<String>`, one per `open`, so each `open` is a new
//! open file description), with `stdin`, `stdout`, `stderr` at 0, 1, 2 and
//! `RLIMIT_NOFILE` 1024.
//!
//! Descriptor numbers reach the table as the kernel's system calls take them, unsigned:
//! a negative number is a huge one (so `close(-1)` is `EBADF`, `F_DUPFD` with a negative
//! minimum `EINVAL`, and `dup3(-1, -1)` `EINVAL`, as in Linux).

use std::collections::HashMap;
use std::sync::Arc;

use super::format::{
    ErrName, Listed, Op, Outcome, Scenario, ScenarioError, Step, StepResult, Tracker, STD_NAMES,
};
use vfscale_fdtable::{CloseRangeFlags, Errno, Fd, FdTable, Settings};

/// Replays `scn`.
///
/// ```
/// use vfscale_conformance::fd::{library, render_results, Scenario};
/// let s = Scenario::parse(concat!(
///     r#"{"op":"spawn","proc":"p1"}"#, "\n",
///     r#"{"op":"close","proc":"p1","fd":1}"#, "\n",
///     r#"{"op":"open","proc":"p1","name":"a","cloexec":false}"#, "\n",
/// )).unwrap();
/// let out = render_results(&library::replay(&s).unwrap());
/// assert_eq!(out, "{\"step\":0,\"result\":\"ok\"}\n{\"step\":1,\"result\":\"ok\"}\n{\"step\":2,\"result\":1}\n");
/// ```
pub fn replay(scn: &Scenario) -> Result<Vec<StepResult>, ScenarioError> {
    let mut r = LibraryReplay::new();
    scn.steps.iter().map(|step| r.apply(step)).collect()
}

/// A replay in progress, one step at a time: for drivers that choose the next step from
/// the state so far (the random scenario generator does).
#[derive(Default)]
pub struct LibraryReplay {
    tracker: Tracker,
    procs: HashMap<String, FdTable<String>>,
    next: usize,
}

impl LibraryReplay {
    /// A fresh replay.
    pub fn new() -> LibraryReplay {
        LibraryReplay::default()
    }

    /// The table of a live process.
    pub fn table(&self, proc: &str) -> Option<&FdTable<String>> {
        self.procs.get(proc)
    }

    /// The live processes, sorted by name.
    pub fn procs(&self) -> Vec<String> {
        crate::format::sorted_names(self.procs.keys())
    }

    /// Applies the next step.
    pub fn apply(&mut self, step: &Step) -> Result<StepResult, ScenarioError> {
        self.tracker.check(step)?;
        StepResult::numbered(self.run(&step.op), step.line, &mut self.next)
    }

    fn run(&mut self, op: &Op) -> Result<Outcome, String> {
        let fd = |n: i32| Fd(n as u32);
        if let Op::Spawn { proc } = op {
            let t = FdTable::new(Settings::default());
            for name in STD_NAMES {
                t.open(Arc::new(name.to_string()), false)
                    .map_err(|e| format!("library: cannot open {name}: {e}"))?;
            }
            self.procs.insert(proc.clone(), t);
            return Ok(Outcome::Ok);
        }
        let t = self
            .procs
            .get(op.proc())
            .ok_or_else(|| format!("internal error: no table for {:?}", op.proc()))?;
        let r: Result<Outcome, Errno> = match op {
            Op::Spawn { .. } => unreachable!("handled above"),
            Op::Open { name, cloexec, .. } => t.open(Arc::new(name.clone()), *cloexec).map(fd_outcome),
            Op::Dup { fd: f, .. } => t.dup(fd(*f)).map(fd_outcome),
            Op::Dup2 { fd: f, newfd, .. } => t.dup2(fd(*f), fd(*newfd)).map(fd_outcome),
            Op::Dup3 {
                fd: f,
                newfd,
                cloexec,
                ..
            } => t.dup3(fd(*f), fd(*newfd), *cloexec).map(fd_outcome),
            Op::FcntlDupfd {
                fd: f, min, cloexec, ..
            } => t.dupfd(fd(*f), *min as u32, *cloexec).map(fd_outcome),
            Op::Getfd { fd: f, .. } => t.get_cloexec(fd(*f)).map(Outcome::Cloexec),
            Op::Setfd { fd: f, cloexec, .. } => t.set_cloexec(fd(*f), *cloexec).map(|()| Outcome::Ok),
            Op::Close { fd: f, .. } => t.close(fd(*f)).map(|()| Outcome::Ok),
            Op::CloseRange {
                proc,
                first,
                last,
                cloexec,
                unshare,
            } => {
                let flags = CloseRangeFlags {
                    cloexec: *cloexec,
                    unshare: *unshare,
                };
                match t.close_range(*first, *last, flags) {
                    Ok(Some(copy)) => {
                        self.procs.insert(proc.clone(), copy);
                        Ok(Outcome::Ok)
                    }
                    Ok(None) => Ok(Outcome::Ok),
                    Err(e) => Err(e),
                }
            }
            Op::Fork { child, .. } => {
                let copy = t.fork();
                self.procs.insert(child.clone(), copy);
                Ok(Outcome::Ok)
            }
            Op::Exec { .. } => {
                t.exec();
                Ok(Outcome::Ok)
            }
            Op::Setrlimit { nofile, .. } => {
                let n = u32::try_from(*nofile).map_err(|_| format!("limit {nofile} out of range"))?;
                t.set_rlimit_nofile(n).map(|()| Outcome::Ok)
            }
            Op::List { .. } => Ok(Outcome::List(
                t.iter()
                    .into_iter()
                    .map(|(fd, name, cloexec)| Listed {
                        fd: fd.0 as i32,
                        name: name.to_string(),
                        cloexec,
                    })
                    .collect(),
            )),
            Op::Exit { proc } => {
                self.procs.remove(proc);
                Ok(Outcome::Ok)
            }
        };
        match r {
            Ok(o) => Ok(o),
            Err(e) => err_outcome(op, e),
        }
    }
}

fn fd_outcome(fd: Fd) -> Outcome {
    Outcome::Fd(fd.0 as i32)
}

fn err_outcome(op: &Op, e: Errno) -> Result<Outcome, String> {
    match e {
        Errno::EBADF => Ok(Outcome::Err(ErrName::EBADF)),
        Errno::EINVAL => Ok(Outcome::Err(ErrName::EINVAL)),
        Errno::EMFILE => Ok(Outcome::Err(ErrName::EMFILE)),
        Errno::EBUSY => Ok(Outcome::Err(ErrName::EBUSY)),
        e => Err(format!(
            "library: {} failed with {e}, which results cannot name",
            op.name()
        )),
    }
}
