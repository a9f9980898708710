//! The lock-scenario format (`shared/specs/lock-scenarios.md`): steps, results, and the
//! rules every runner enforces the same way.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::format::{field, Object, StepOp};
use serde_json::{json, Value};

use vfscale_locks::{Errno, FcntlCmd, FlockOp, LockType};

/// How a scenario opens a file: `r`, `w` or `rw`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpenMode {
    /// `O_RDONLY`.
    R,
    /// `O_WRONLY`.
    W,
    /// `O_RDWR`.
    Rw,
}

impl OpenMode {
    /// The scenario's spelling.
    pub fn name(self) -> &'static str {
        match self {
            OpenMode::R => "r",
            OpenMode::W => "w",
            OpenMode::Rw => "rw",
        }
    }
    /// The library's access mode.
    pub fn access(self) -> vfscale_locks::AccessMode {
        match self {
            OpenMode::R => vfscale_locks::AccessMode::Read,
            OpenMode::W => vfscale_locks::AccessMode::Write,
            OpenMode::Rw => vfscale_locks::AccessMode::ReadWrite,
        }
    }
}

/// One operation of a scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `open`: `proc` opens `file` (created empty if new) as descriptor `fd`.
    Open {
        /// Process name.
        proc: String,
        /// File name.
        file: String,
        /// Descriptor name.
        fd: String,
        /// Access mode.
        mode: OpenMode,
    },
    /// `dup`: `new` is a second descriptor for `fd`'s open file description.
    Dup {
        /// Existing descriptor.
        fd: String,
        /// New descriptor name.
        new: String,
    },
    /// `close`: close one descriptor.
    Close {
        /// Descriptor name.
        fd: String,
    },
    /// `exit`: the process ends; all its descriptors close.
    Exit {
        /// Process name.
        proc: String,
    },
    /// `fcntl` with a record-lock command.
    Fcntl {
        /// Descriptor name.
        fd: String,
        /// Command.
        cmd: FcntlCmd,
        /// `l_type`.
        ty: LockType,
        /// `l_start` (`SEEK_SET`).
        start: i64,
        /// `l_len`.
        len: i64,
    },
    /// `flock`.
    Flock {
        /// Descriptor name.
        fd: String,
        /// Operation.
        how: FlockOp,
        /// `LOCK_NB`.
        nb: bool,
    },
    /// `interrupt`: a signal interrupts `proc`'s blocked call.
    Interrupt {
        /// Process name.
        proc: String,
    },
}

impl Op {
    /// Whether this call can wait (`F_SETLKW`, `F_OFD_SETLKW`, `flock` without `LOCK_NB`).
    pub fn may_block(&self) -> bool {
        match self {
            Op::Fcntl { cmd, .. } => cmd.waits(),
            Op::Flock { nb, .. } => !nb,
            _ => false,
        }
    }

    /// The step as one line of JSON, the inverse of [`Scenario::parse`].
    pub fn to_json(&self) -> Value {
        match self {
            Op::Open { proc, file, fd, mode } => {
                json!({"op":"open","proc":proc,"file":file,"fd":fd,"mode":mode.name()})
            }
            Op::Dup { fd, new } => json!({"op":"dup","fd":fd,"as":new}),
            Op::Close { fd } => json!({"op":"close","fd":fd}),
            Op::Exit { proc } => json!({"op":"exit","proc":proc}),
            Op::Fcntl {
                fd,
                cmd,
                ty,
                start,
                len,
            } => json!({"op":"fcntl","fd":fd,"cmd":cmd.name(),"type":ty.name(),"start":start,"len":len}),
            Op::Flock { fd, how, nb } => json!({"op":"flock","fd":fd,"how":how.name(),"nb":nb}),
            Op::Interrupt { proc } => json!({"op":"interrupt","proc":proc}),
        }
    }
}

/// One step of a scenario.
pub type Step = crate::format::Step<Op>;

/// A parsed scenario.
pub type Scenario = crate::format::Scenario<Op>;

pub use crate::format::ScenarioError;

impl StepOp for Op {
    /// Parses JSON Lines text. Blank lines and lines starting with `#` or `//` are skipped.
    ///
    /// ```
    /// use vfscale_conformance::locks::{Op, Scenario};
    /// let s = Scenario::parse(r#"{"op":"open","proc":"p1","file":"a","fd":"d1","mode":"rw"}"#).unwrap();
    /// assert!(matches!(s.steps[0].op, Op::Open { .. }));
    /// let e = Scenario::parse(r#"{"op":"close"}"#).unwrap_err();
    /// assert_eq!(e.to_string(), "line 1: missing field `fd`");
    /// ```
    fn parse(o: &Object, line: usize) -> Result<Op, ScenarioError> {
        let op = field::str(o, line, "op")?;
        Ok(match op {
            "open" => {
                field::only(o, line, op, &["proc", "file", "fd", "mode"])?;
                let mode = match field::str(o, line, "mode")? {
                    "r" => OpenMode::R,
                    "w" => OpenMode::W,
                    "rw" => OpenMode::Rw,
                    m => {
                        return Err(ScenarioError::at(
                            line,
                            format!("field `mode` must be \"r\", \"w\" or \"rw\", not {m:?}"),
                        ))
                    }
                };
                Op::Open {
                    proc: field::str(o, line, "proc")?.into(),
                    file: field::str(o, line, "file")?.into(),
                    fd: field::str(o, line, "fd")?.into(),
                    mode,
                }
            }
            "dup" => {
                field::only(o, line, op, &["fd", "as"])?;
                Op::Dup {
                    fd: field::str(o, line, "fd")?.into(),
                    new: field::str(o, line, "as")?.into(),
                }
            }
            "close" => {
                field::only(o, line, op, &["fd"])?;
                Op::Close {
                    fd: field::str(o, line, "fd")?.into(),
                }
            }
            "exit" | "interrupt" => {
                field::only(o, line, op, &["proc"])?;
                let proc = field::str(o, line, "proc")?.into();
                match op {
                    "exit" => Op::Exit { proc },
                    _ => Op::Interrupt { proc },
                }
            }
            "fcntl" => {
                field::only(o, line, op, &["fd", "cmd", "type", "start", "len"])?;
                let cmd = field::named(o, line, "cmd", "command", FcntlCmd::from_name)?;
                let ty = field::named(o, line, "type", "lock type", LockType::from_name)?;
                Op::Fcntl {
                    fd: field::str(o, line, "fd")?.into(),
                    cmd,
                    ty,
                    start: field::int::<i64>(o, line, "start", "a signed 64-bit integer")?,
                    len: field::int::<i64>(o, line, "len", "a signed 64-bit integer")?,
                }
            }
            "flock" => {
                field::only(o, line, op, &["fd", "how", "nb"])?;
                let how = field::named(o, line, "how", "operation", FlockOp::from_name)?;
                Op::Flock {
                    fd: field::str(o, line, "fd")?.into(),
                    how,
                    nb: field::bool(o, line, "nb")?,
                }
            }
            other => return Err(field::unknown_op(line, other)),
        })
    }

    fn to_json(&self) -> Value {
        Op::to_json(self)
    }
}

/// Who owns a lock that `F_GETLK` reports.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum LockPid {
    /// A POSIX lock of the named process.
    Proc(String),
    /// An OFD lock (`l_pid` -1).
    Ofd,
}

/// What a step, or a finished blocked call, resulted in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// `"ok"`.
    Ok,
    /// `"blocked"`: a waiting call that has not finished yet.
    Blocked,
    /// An errno name.
    Err(Errno),
    /// `F_GETLK`: no conflicting lock (`{"type":"F_UNLCK"}`).
    NoLock,
    /// `F_GETLK`: the conflicting lock found.
    Lock {
        /// Its type.
        ty: LockType,
        /// `l_start`.
        start: i64,
        /// `l_len` (0 to end of file).
        len: i64,
        /// Its owner.
        pid: LockPid,
    },
}

impl StepOutcome for Outcome {
    /// The `result` value as the spec renders it.
    fn to_json(&self) -> Value {
        match self {
            Outcome::Ok => json!("ok"),
            Outcome::Blocked => json!("blocked"),
            Outcome::Err(e) => json!(e.name()),
            Outcome::NoLock => json!({"type":"F_UNLCK"}),
            Outcome::Lock { ty, start, len, pid } => {
                let pid = match pid {
                    LockPid::Proc(p) => json!(p),
                    LockPid::Ofd => json!(-1),
                };
                json!({"type":ty.name(),"start":start,"len":len,"pid":pid})
            }
        }
    }
}

/// The result line of one step.
pub type StepResult = crate::format::StepResult<Outcome>;

pub use crate::format::{render_results, StepOutcome};

/// A step with its names resolved, as a runner executes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolved {
    /// Open a new descriptor `fd` in `proc` for `file`.
    Open {
        /// Process.
        proc: String,
        /// File.
        file: String,
        /// New descriptor.
        fd: String,
        /// Mode.
        mode: OpenMode,
        /// Whether this process is new (first step naming it, or first since its exit).
        new_proc: bool,
    },
    /// Duplicate `fd` (of `proc`) as `new`.
    Dup {
        /// Process.
        proc: String,
        /// Existing descriptor.
        fd: String,
        /// New descriptor.
        new: String,
    },
    /// Close `fd` of `proc`; `last` is true when no other descriptor shares its open
    /// file description.
    Close {
        /// Process.
        proc: String,
        /// Descriptor.
        fd: String,
        /// File name.
        file: String,
        /// The last descriptor of its open file description.
        last: bool,
    },
    /// The process exits, closing `fds` (in opening order).
    Exit {
        /// Process.
        proc: String,
        /// Its open descriptors.
        fds: Vec<String>,
    },
    /// A lock call on `fd` of `proc`.
    Call {
        /// Process.
        proc: String,
        /// Descriptor.
        fd: String,
        /// File.
        file: String,
    },
    /// Interrupt `proc`; `blocked` names its blocked step if it has one.
    Interrupt {
        /// Process.
        proc: String,
        /// The blocked step, if any.
        blocked: Option<usize>,
    },
}

#[derive(Clone, Debug)]
struct FdState {
    proc: String,
    file: String,
    /// Identifies the open file description (the step that opened it).
    ofd: usize,
}

/// The bookkeeping every runner shares: which names exist and which processes are
/// blocked. It enforces the spec's rules, so that the library and the kernel runner
/// reject the same scenarios with the same messages.
#[derive(Debug, Default)]
pub struct Tracker {
    procs: HashSet<String>,
    fds: HashMap<String, FdState>,
    fd_order: Vec<String>,
    files: HashSet<String>,
    blocked: BTreeMap<String, usize>,
}

impl Tracker {
    /// A tracker for a fresh replay.
    pub fn new() -> Self {
        Self::default()
    }

    fn live_fd(&self, line: usize, fd: &str) -> Result<&FdState, ScenarioError> {
        self.fds
            .get(fd)
            .ok_or_else(|| ScenarioError::at(line, format!("unknown descriptor {fd:?}")))
    }

    fn not_blocked(&self, line: usize, proc: &str) -> Result<(), ScenarioError> {
        if let Some(s) = self.blocked.get(proc) {
            return Err(ScenarioError::at(
                line,
                format!("process {proc:?} is blocked in step {s}; it can only be interrupted"),
            ));
        }
        Ok(())
    }

    fn known_proc(&self, line: usize, proc: &str) -> Result<(), ScenarioError> {
        if !self.procs.contains(proc) {
            return Err(ScenarioError::at(line, format!("unknown process {proc:?}")));
        }
        Ok(())
    }

    /// Checks step `index` and resolves its names; updates the names it creates or
    /// ends. Runners record blocked calls with [`Tracker::set_blocked`] and
    /// [`Tracker::clear_blocked`].
    pub fn resolve(&mut self, index: usize, step: &Step) -> Result<Resolved, ScenarioError> {
        let line = step.line;
        Ok(match &step.op {
            Op::Open { proc, file, fd, mode } => {
                if self.fds.contains_key(fd) {
                    return Err(ScenarioError::at(
                        line,
                        format!("descriptor {fd:?} is already open"),
                    ));
                }
                self.not_blocked(line, proc)?;
                let new_proc = self.procs.insert(proc.clone());
                self.files.insert(file.clone());
                self.fds.insert(
                    fd.clone(),
                    FdState {
                        proc: proc.clone(),
                        file: file.clone(),
                        ofd: index,
                    },
                );
                self.fd_order.push(fd.clone());
                Resolved::Open {
                    proc: proc.clone(),
                    file: file.clone(),
                    fd: fd.clone(),
                    mode: *mode,
                    new_proc,
                }
            }
            Op::Dup { fd, new } => {
                let st = self.live_fd(line, fd)?.clone();
                self.not_blocked(line, &st.proc)?;
                if self.fds.contains_key(new) {
                    return Err(ScenarioError::at(
                        line,
                        format!("descriptor {new:?} is already open"),
                    ));
                }
                self.fds.insert(new.clone(), st.clone());
                self.fd_order.push(new.clone());
                Resolved::Dup {
                    proc: st.proc,
                    fd: fd.clone(),
                    new: new.clone(),
                }
            }
            Op::Close { fd } => {
                let st = self.live_fd(line, fd)?.clone();
                self.not_blocked(line, &st.proc)?;
                self.fds.remove(fd);
                self.fd_order.retain(|f| f != fd);
                let last = !self.fds.values().any(|o| o.ofd == st.ofd);
                Resolved::Close {
                    proc: st.proc,
                    fd: fd.clone(),
                    file: st.file,
                    last,
                }
            }
            Op::Exit { proc } => {
                self.known_proc(line, proc)?;
                self.not_blocked(line, proc)?;
                let fds: Vec<String> = self
                    .fd_order
                    .iter()
                    .filter(|f| self.fds[*f].proc == *proc)
                    .cloned()
                    .collect();
                for f in &fds {
                    self.fds.remove(f);
                }
                self.fd_order.retain(|f| !fds.contains(f));
                self.procs.remove(proc);
                Resolved::Exit {
                    proc: proc.clone(),
                    fds,
                }
            }
            Op::Fcntl { fd, .. } | Op::Flock { fd, .. } => {
                let st = self.live_fd(line, fd)?.clone();
                self.not_blocked(line, &st.proc)?;
                Resolved::Call {
                    proc: st.proc,
                    fd: fd.clone(),
                    file: st.file,
                }
            }
            Op::Interrupt { proc } => {
                self.known_proc(line, proc)?;
                Resolved::Interrupt {
                    proc: proc.clone(),
                    blocked: self.blocked.get(proc).copied(),
                }
            }
        })
    }

    /// Records that step `index`, a call by `proc`, is now blocked.
    pub fn set_blocked(&mut self, proc: &str, index: usize) {
        self.blocked.insert(proc.to_string(), index);
    }

    /// Records that the blocked call of `proc` finished.
    pub fn clear_blocked(&mut self, proc: &str) {
        self.blocked.remove(proc);
    }

    /// The processes with a blocked call, and the step of each.
    pub fn blocked(&self) -> impl Iterator<Item = (&str, usize)> {
        self.blocked.iter().map(|(p, s)| (p.as_str(), *s))
    }

    /// The process that owns descriptor `fd`, if it is open.
    pub fn proc_of(&self, fd: &str) -> Option<&str> {
        self.fds.get(fd).map(|s| s.proc.as_str())
    }
}

/// One held lock and its waiters as the lock listing (`/proc/locks`) shows them, with
/// pids and inodes replaced by the scenario's names, so a kernel listing and a library
/// listing can be compared. Each line is `KIND TYPE OWNER FILE START END` (`OWNER` is
/// `-1` for an OFD lock; `END` is `EOF` to end of file); a waiter's line starts with its
/// depth's `->` prefix as `/proc/locks` indents it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NamedListing {
    /// The held lock.
    pub lock: String,
    /// Its waiters, depth first.
    pub waiters: Vec<String>,
}

impl NamedListing {
    /// Normalizes one `/proc/locks` record (without the `id: ` prefix and the waiter
    /// arrow): `kind` is `POSIX`, `OFDLCK` or `FLOCK`, `ty` `READ` or `WRITE`.
    pub fn line(kind: &str, ty: &str, owner: &str, file: &str, start: &str, end: &str) -> String {
        format!("{kind} {ty} {owner} {file} {start} {end}")
    }

    /// The waiter prefix for `depth` (1 for a direct waiter), as `/proc/locks` writes it.
    pub fn waiter_prefix(depth: usize) -> String {
        format!("{}-> ", " ".repeat(depth.saturating_sub(1)))
    }
}

/// A listing in a canonical order (the kernel lists per CPU, newest first; the order of
/// held locks carries no meaning), one group per line block.
pub fn canonical_listing(mut l: Vec<NamedListing>) -> Vec<NamedListing> {
    l.sort();
    l
}
