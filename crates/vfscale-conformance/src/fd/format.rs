//! The descriptor-scenario format (`docs/scenarios/fd.md`): steps, results, and
//! the rules every runner enforces the same way.

use std::collections::HashMap;

use crate::format::{field, Object, StepOp};
use serde_json::{json, Value};

/// The `RLIMIT_NOFILE` every process starts with (soft and hard).
pub const INITIAL_NOFILE: u64 = 1024;

/// The names of descriptors 0, 1 and 2 of a freshly spawned process.
pub const STD_NAMES: [&str; 3] = ["stdin", "stdout", "stderr"];

/// One operation of a scenario. Descriptor numbers are `i32`, as the system calls take
/// them; `close_range` bounds are `u32`, as `close_range(2)` takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `spawn`: a new process with descriptors 0, 1 and 2.
    Spawn {
        /// Process name.
        proc: String,
    },
    /// `open`: open file `name` read-only; the result is the new descriptor.
    Open {
        /// Process name.
        proc: String,
        /// File name.
        name: String,
        /// `O_CLOEXEC`.
        cloexec: bool,
    },
    /// `dup`.
    Dup {
        /// Process name.
        proc: String,
        /// Old descriptor.
        fd: i32,
    },
    /// `dup2`.
    Dup2 {
        /// Process name.
        proc: String,
        /// Old descriptor.
        fd: i32,
        /// New descriptor.
        newfd: i32,
    },
    /// `dup3`.
    Dup3 {
        /// Process name.
        proc: String,
        /// Old descriptor.
        fd: i32,
        /// New descriptor.
        newfd: i32,
        /// `O_CLOEXEC`.
        cloexec: bool,
    },
    /// `fcntl(F_DUPFD)`, or `F_DUPFD_CLOEXEC` with `cloexec`.
    FcntlDupfd {
        /// Process name.
        proc: String,
        /// Old descriptor.
        fd: i32,
        /// The lowest acceptable new descriptor.
        min: i32,
        /// `F_DUPFD_CLOEXEC`.
        cloexec: bool,
    },
    /// `fcntl(F_GETFD)`.
    Getfd {
        /// Process name.
        proc: String,
        /// Descriptor.
        fd: i32,
    },
    /// `fcntl(F_SETFD)`.
    Setfd {
        /// Process name.
        proc: String,
        /// Descriptor.
        fd: i32,
        /// `FD_CLOEXEC`.
        cloexec: bool,
    },
    /// `close`.
    Close {
        /// Process name.
        proc: String,
        /// Descriptor.
        fd: i32,
    },
    /// `close_range`.
    CloseRange {
        /// Process name.
        proc: String,
        /// First descriptor.
        first: u32,
        /// Last descriptor (inclusive).
        last: u32,
        /// `CLOSE_RANGE_CLOEXEC`.
        cloexec: bool,
        /// `CLOSE_RANGE_UNSHARE`.
        unshare: bool,
    },
    /// `fork`: `child` gets a copy of `proc`'s table.
    Fork {
        /// Process name.
        proc: String,
        /// The new process.
        child: String,
    },
    /// `exec`: close-on-exec descriptors are closed.
    Exec {
        /// Process name.
        proc: String,
    },
    /// `setrlimit(RLIMIT_NOFILE)`, soft and hard.
    Setrlimit {
        /// Process name.
        proc: String,
        /// The new limit.
        nofile: u64,
    },
    /// `list`: the open descriptors.
    List {
        /// Process name.
        proc: String,
    },
    /// `exit`.
    Exit {
        /// Process name.
        proc: String,
    },
}

impl Op {
    /// The process the step acts on.
    pub fn proc(&self) -> &str {
        match self {
            Op::Spawn { proc }
            | Op::Open { proc, .. }
            | Op::Dup { proc, .. }
            | Op::Dup2 { proc, .. }
            | Op::Dup3 { proc, .. }
            | Op::FcntlDupfd { proc, .. }
            | Op::Getfd { proc, .. }
            | Op::Setfd { proc, .. }
            | Op::Close { proc, .. }
            | Op::CloseRange { proc, .. }
            | Op::Fork { proc, .. }
            | Op::Exec { proc }
            | Op::Setrlimit { proc, .. }
            | Op::List { proc }
            | Op::Exit { proc } => proc,
        }
    }

    /// The op's name in the format.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Spawn { .. } => "spawn",
            Op::Open { .. } => "open",
            Op::Dup { .. } => "dup",
            Op::Dup2 { .. } => "dup2",
            Op::Dup3 { .. } => "dup3",
            Op::FcntlDupfd { .. } => "fcntl_dupfd",
            Op::Getfd { .. } => "getfd",
            Op::Setfd { .. } => "setfd",
            Op::Close { .. } => "close",
            Op::CloseRange { .. } => "close_range",
            Op::Fork { .. } => "fork",
            Op::Exec { .. } => "exec",
            Op::Setrlimit { .. } => "setrlimit",
            Op::List { .. } => "list",
            Op::Exit { .. } => "exit",
        }
    }

    /// The step as one line of JSON, the inverse of [`Scenario::parse`].
    pub fn to_json(&self) -> Value {
        match self {
            Op::Spawn { proc } => json!({"op":"spawn","proc":proc}),
            Op::Open { proc, name, cloexec } => {
                json!({"op":"open","proc":proc,"name":name,"cloexec":cloexec})
            }
            Op::Dup { proc, fd } => json!({"op":"dup","proc":proc,"fd":fd}),
            Op::Dup2 { proc, fd, newfd } => json!({"op":"dup2","proc":proc,"fd":fd,"newfd":newfd}),
            Op::Dup3 {
                proc,
                fd,
                newfd,
                cloexec,
            } => json!({"op":"dup3","proc":proc,"fd":fd,"newfd":newfd,"cloexec":cloexec}),
            Op::FcntlDupfd {
                proc,
                fd,
                min,
                cloexec,
            } => json!({"op":"fcntl_dupfd","proc":proc,"fd":fd,"min":min,"cloexec":cloexec}),
            Op::Getfd { proc, fd } => json!({"op":"getfd","proc":proc,"fd":fd}),
            Op::Setfd { proc, fd, cloexec } => {
                json!({"op":"setfd","proc":proc,"fd":fd,"cloexec":cloexec})
            }
            Op::Close { proc, fd } => json!({"op":"close","proc":proc,"fd":fd}),
            Op::CloseRange {
                proc,
                first,
                last,
                cloexec,
                unshare,
            } => {
                let mut flags = Vec::new();
                if *cloexec {
                    flags.push("CLOEXEC");
                }
                if *unshare {
                    flags.push("UNSHARE");
                }
                json!({"op":"close_range","proc":proc,"first":first,"last":last,"flags":flags})
            }
            Op::Fork { proc, child } => json!({"op":"fork","proc":proc,"child":child}),
            Op::Exec { proc } => json!({"op":"exec","proc":proc}),
            Op::Setrlimit { proc, nofile } => json!({"op":"setrlimit","proc":proc,"nofile":nofile}),
            Op::List { proc } => json!({"op":"list","proc":proc}),
            Op::Exit { proc } => json!({"op":"exit","proc":proc}),
        }
    }
}

/// One step of a scenario.
pub type Step = crate::format::Step<Op>;

/// A parsed scenario.
pub type Scenario = crate::format::Scenario<Op>;

pub use crate::format::ScenarioError;

fn field_fd(o: &Object, line: usize, k: &str) -> Result<i32, ScenarioError> {
    field::int(o, line, k, "a descriptor number (a 32-bit signed integer)")
}

/// Rejects unknown fields; every op names its process, so `proc` is always allowed.
fn check_fields(o: &Object, line: usize, op: &str, allowed: &[&str]) -> Result<(), ScenarioError> {
    field::only(o, line, op, &[&["proc"], allowed].concat())
}

impl StepOp for Op {
    /// Parses JSON Lines text. Blank lines and lines starting with `#` are skipped.
    /// Every step must name its `proc`; unknown fields are rejected; `cloexec` is
    /// optional (false) except for `setfd`, and `flags` is optional (none).
    ///
    /// ```
    /// use vfscale_conformance::fd::{Op, Scenario};
    /// let s = Scenario::parse(r#"{"op":"dup2","proc":"p1","fd":3,"newfd":10}"#).unwrap();
    /// assert!(matches!(s.steps[0].op, Op::Dup2 { fd: 3, newfd: 10, .. }));
    /// let e = Scenario::parse("# header\n{\"op\":\"close\",\"proc\":\"p1\"}").unwrap_err();
    /// assert_eq!(e.to_string(), "line 2: missing field `fd`");
    /// ```
    fn parse(o: &Object, line: usize) -> Result<Op, ScenarioError> {
        let op = field::str(o, line, "op")?;
        let fields: &[&str] = match op {
            "spawn" | "exec" | "list" | "exit" => &[],
            "open" => &["name", "cloexec"],
            "dup" | "getfd" | "close" => &["fd"],
            "dup2" => &["fd", "newfd"],
            "dup3" => &["fd", "newfd", "cloexec"],
            "fcntl_dupfd" => &["fd", "min", "cloexec"],
            "setfd" => &["fd", "cloexec"],
            "close_range" => &["first", "last", "flags"],
            "fork" => &["child"],
            "setrlimit" => &["nofile"],
            other => return Err(field::unknown_op(line, other)),
        };
        check_fields(o, line, op, fields)?;
        let proc = field::str(o, line, "proc")?.to_string();
        Ok(match op {
            "spawn" => Op::Spawn { proc },
            "exec" => Op::Exec { proc },
            "list" => Op::List { proc },
            "exit" => Op::Exit { proc },
            "open" => Op::Open {
                proc,
                name: field::str(o, line, "name")?.into(),
                cloexec: field::bool(o, line, "cloexec")?,
            },
            "dup" | "getfd" | "close" => {
                let fd = field_fd(o, line, "fd")?;
                match op {
                    "dup" => Op::Dup { proc, fd },
                    "getfd" => Op::Getfd { proc, fd },
                    _ => Op::Close { proc, fd },
                }
            }
            "dup2" => Op::Dup2 {
                proc,
                fd: field_fd(o, line, "fd")?,
                newfd: field_fd(o, line, "newfd")?,
            },
            "dup3" => Op::Dup3 {
                proc,
                fd: field_fd(o, line, "fd")?,
                newfd: field_fd(o, line, "newfd")?,
                cloexec: field::bool(o, line, "cloexec")?,
            },
            "fcntl_dupfd" => Op::FcntlDupfd {
                proc,
                fd: field_fd(o, line, "fd")?,
                min: field_fd(o, line, "min")?,
                cloexec: field::bool(o, line, "cloexec")?,
            },
            "setfd" => Op::Setfd {
                proc,
                fd: field_fd(o, line, "fd")?,
                cloexec: field::bool_required(o, line, "cloexec")?,
            },
            "close_range" => {
                let bound = "an unsigned 32-bit integer";
                let (mut cloexec, mut unshare) = (false, false);
                match o.get("flags") {
                    None => {}
                    Some(Value::Array(a)) => {
                        for f in a {
                            match f.as_str() {
                                Some("CLOEXEC") => cloexec = true,
                                Some("UNSHARE") => unshare = true,
                                _ => {
                                    return Err(ScenarioError::at(
                                        line,
                                        format!("field `flags`: unknown flag {f} (CLOEXEC or UNSHARE)"),
                                    ))
                                }
                            }
                        }
                    }
                    Some(v) => {
                        return Err(ScenarioError::at(
                            line,
                            format!("field `flags` must be a list of flag names, not {v}"),
                        ))
                    }
                }
                Op::CloseRange {
                    proc,
                    first: field::int(o, line, "first", bound)?,
                    last: field::int(o, line, "last", bound)?,
                    cloexec,
                    unshare,
                }
            }
            "fork" => Op::Fork {
                proc,
                child: field::str(o, line, "child")?.into(),
            },
            "setrlimit" => Op::Setrlimit {
                proc,
                nofile: field::int(o, line, "nofile", "an unsigned 64-bit integer")?,
            },
            _ => unreachable!("checked above"),
        })
    }

    fn to_json(&self) -> Value {
        Op::to_json(self)
    }
}

/// The errors a step can report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrName {
    /// Bad descriptor.
    EBADF,
    /// Invalid argument.
    EINVAL,
    /// Too many open files.
    EMFILE,
    /// Busy (a descriptor being installed concurrently).
    EBUSY,
}

impl ErrName {
    /// The name as results spell it.
    pub fn name(self) -> &'static str {
        match self {
            ErrName::EBADF => "EBADF",
            ErrName::EINVAL => "EINVAL",
            ErrName::EMFILE => "EMFILE",
            ErrName::EBUSY => "EBUSY",
        }
    }

    /// The error for a Linux `errno` value, if results can name it.
    pub fn from_raw(errno: i32) -> Option<ErrName> {
        Some(match errno {
            libc::EBADF => ErrName::EBADF,
            libc::EINVAL => ErrName::EINVAL,
            libc::EMFILE => ErrName::EMFILE,
            libc::EBUSY => ErrName::EBUSY,
            _ => return None,
        })
    }
}

/// One entry of a `list` result.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Listed {
    /// Descriptor number.
    pub fd: i32,
    /// The file's name (`stdin`, `stdout`, `stderr` for the first three).
    pub name: String,
    /// Close-on-exec.
    pub cloexec: bool,
}

/// What a step resulted in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// `"ok"`.
    Ok,
    /// A descriptor number.
    Fd(i32),
    /// An errno name.
    Err(ErrName),
    /// `getfd`: `{"cloexec":b}`.
    Cloexec(bool),
    /// `list`: the open descriptors, sorted by number.
    List(Vec<Listed>),
}

impl StepOutcome for Outcome {
    /// The `result` value as the spec renders it.
    fn to_json(&self) -> Value {
        match self {
            Outcome::Ok => json!("ok"),
            Outcome::Fd(fd) => json!(fd),
            Outcome::Err(e) => json!(e.name()),
            Outcome::Cloexec(b) => json!({"cloexec": b}),
            Outcome::List(l) => Value::Array(l.iter().map(|e| json!([e.fd, e.name, e.cloexec])).collect()),
        }
    }
}

/// The result line of one step.
pub type StepResult = crate::format::StepResult<Outcome>;

pub use crate::format::{render_results, StepOutcome};

/// The bookkeeping every runner shares: which processes exist and their limits. It
/// enforces the format's rules, so that the library and the kernel runner reject the
/// same scenarios with the same messages.
#[derive(Debug, Default)]
pub struct Tracker {
    /// Live processes and their `RLIMIT_NOFILE`.
    procs: HashMap<String, u64>,
}

impl Tracker {
    /// A tracker for a fresh replay.
    pub fn new() -> Self {
        Self::default()
    }

    fn live(&self, line: usize, proc: &str) -> Result<u64, ScenarioError> {
        self.procs
            .get(proc)
            .copied()
            .ok_or_else(|| ScenarioError::at(line, format!("unknown process {proc:?}")))
    }

    fn fresh(&self, line: usize, proc: &str) -> Result<(), ScenarioError> {
        if self.procs.contains_key(proc) {
            return Err(ScenarioError::at(
                line,
                format!("process {proc:?} already exists"),
            ));
        }
        Ok(())
    }

    /// Checks a step against the processes alive before it, and records the processes
    /// it creates or ends and the limit it sets.
    pub fn check(&mut self, step: &Step) -> Result<(), ScenarioError> {
        let line = step.line;
        match &step.op {
            Op::Spawn { proc } => {
                self.fresh(line, proc)?;
                self.procs.insert(proc.clone(), INITIAL_NOFILE);
            }
            Op::Fork { proc, child } => {
                let limit = self.live(line, proc)?;
                self.fresh(line, child)?;
                self.procs.insert(child.clone(), limit);
            }
            Op::Exit { proc } => {
                self.live(line, proc)?;
                self.procs.remove(proc);
            }
            Op::Setrlimit { proc, nofile } => {
                let limit = self.live(line, proc)?;
                if *nofile > limit {
                    return Err(ScenarioError::at(
                        line,
                        format!(
                            "setrlimit may only lower RLIMIT_NOFILE (from {limit} to {nofile}): raising the hard limit needs a privilege"
                        ),
                    ));
                }
                self.procs.insert(proc.clone(), *nofile);
            }
            op => {
                self.live(line, op.proc())?;
            }
        }
        Ok(())
    }

    /// The `RLIMIT_NOFILE` of a live process.
    pub fn nofile(&self, proc: &str) -> Option<u64> {
        self.procs.get(proc).copied()
    }

    /// The live processes.
    pub fn procs(&self) -> impl Iterator<Item = &str> {
        self.procs.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_render_as_the_spec_says() {
        let line = |result| StepResult::new(4, result).to_json_line();
        assert_eq!(line(Outcome::Ok), r#"{"step":4,"result":"ok"}"#);
        assert_eq!(line(Outcome::Fd(7)), r#"{"step":4,"result":7}"#);
        assert_eq!(
            line(Outcome::Err(ErrName::EMFILE)),
            r#"{"step":4,"result":"EMFILE"}"#
        );
        assert_eq!(
            line(Outcome::Cloexec(true)),
            r#"{"step":4,"result":{"cloexec":true}}"#
        );
        let l = vec![
            Listed {
                fd: 0,
                name: "stdin".into(),
                cloexec: false,
            },
            Listed {
                fd: 9,
                name: "a".into(),
                cloexec: true,
            },
        ];
        assert_eq!(
            line(Outcome::List(l)),
            r#"{"step":4,"result":[[0,"stdin",false],[9,"a",true]]}"#
        );
    }

    #[test]
    fn every_op_round_trips_through_json() {
        let text = r#"{"op":"spawn","proc":"p1"}
{"op":"open","proc":"p1","name":"a","cloexec":true}
{"op":"dup","proc":"p1","fd":3}
{"op":"dup2","proc":"p1","fd":3,"newfd":10}
{"op":"dup3","proc":"p1","fd":3,"newfd":10,"cloexec":true}
{"op":"fcntl_dupfd","proc":"p1","fd":3,"min":-1,"cloexec":false}
{"op":"getfd","proc":"p1","fd":3}
{"op":"setfd","proc":"p1","fd":3,"cloexec":true}
{"op":"close","proc":"p1","fd":-1}
{"op":"close_range","proc":"p1","first":3,"last":4294967295,"flags":["CLOEXEC","UNSHARE"]}
{"op":"fork","proc":"p1","child":"p2"}
{"op":"exec","proc":"p1"}
{"op":"setrlimit","proc":"p1","nofile":64}
{"op":"list","proc":"p1"}
{"op":"exit","proc":"p1"}
"#;
        let s = Scenario::parse(text).unwrap();
        assert_eq!(s.steps.len(), 15);
        assert_eq!(s.to_jsonl(), text);
    }

    #[test]
    fn optional_fields_default_and_bad_values_name_the_field() {
        let s = Scenario::parse(r#"{"op":"open","proc":"p1","name":"a"}"#).unwrap();
        assert!(matches!(&s.steps[0].op, Op::Open { cloexec: false, .. }));
        let err = |t: &str| Scenario::parse(t).unwrap_err().to_string();
        assert_eq!(
            err(r#"{"op":"dup","proc":"p1","fd":4294967296}"#),
            "line 1: field `fd` must be a descriptor number (a 32-bit signed integer), not 4294967296"
        );
        assert_eq!(
            err(r#"{"op":"open","proc":"p1","name":"a","cloexec":1}"#),
            "line 1: field `cloexec` must be true or false, not 1"
        );
        assert_eq!(
            err(r#"{"op":"spawn","proc":""}"#),
            "line 1: field `proc` is empty"
        );
        assert!(err("{nope").starts_with("line 1: not valid JSON"));
    }
}
