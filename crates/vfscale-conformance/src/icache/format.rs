//! The inode-cache scenario format (`shared/specs/icache-scenarios.md`,
//! `docs/scenarios/icache.md`): steps, results, and the rules both runners enforce the
//! same way, with the same messages.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{json, Value};

use crate::format::{field, Object, ScenarioError, StepOp};

/// What `state` looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StateOf {
    /// The inode a lookup of `(sb, ino)` would meet first.
    Key {
        /// Superblock.
        sb: String,
        /// Inode number.
        ino: u64,
    },
    /// The inode of a reference.
    Ref(String),
}

/// One operation of a scenario. `task` is the caller (default `"t0"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `iget_locked`.
    Iget {
        /// Caller.
        task: String,
        /// Superblock.
        sb: String,
        /// Inode number.
        ino: u64,
        /// Reference name bound.
        r: String,
    },
    /// `ilookup`.
    Ilookup {
        /// Caller.
        task: String,
        /// Superblock.
        sb: String,
        /// Inode number.
        ino: u64,
        /// Reference name bound.
        r: String,
    },
    /// `new_inode` with `i_ino` = `ino`.
    NewInode {
        /// Caller.
        task: String,
        /// Superblock.
        sb: String,
        /// Inode number.
        ino: u64,
        /// Reference name bound.
        r: String,
    },
    /// `insert_inode_locked`.
    InsertLocked {
        /// Caller.
        task: String,
        /// The `new_inode` reference.
        r: String,
    },
    /// `unlock_new_inode`.
    UnlockNew {
        /// Caller.
        task: String,
        /// Reference.
        r: String,
    },
    /// `discard_new_inode` (ends `r`).
    DiscardNew {
        /// Caller.
        task: String,
        /// Reference.
        r: String,
        /// Stop an eviction this call starts in `->evict_inode`.
        hold: bool,
    },
    /// `iget_failed` (ends `r`).
    IgetFailed {
        /// Caller.
        task: String,
        /// Reference.
        r: String,
        /// Stop an eviction this call starts in `->evict_inode`.
        hold: bool,
    },
    /// `ihold`: `new` is one more reference.
    Ihold {
        /// Caller.
        task: String,
        /// Reference.
        r: String,
        /// New reference name.
        new: String,
    },
    /// `iput` (ends `r`).
    Iput {
        /// Caller.
        task: String,
        /// Reference.
        r: String,
        /// Stop an eviction this call starts in `->evict_inode`.
        hold: bool,
    },
    /// The held `->evict_inode` of `task` returns.
    FinishEvict {
        /// The held task.
        task: String,
    },
    /// `remove_inode_hash`.
    Unhash {
        /// Caller.
        task: String,
        /// Reference.
        r: String,
    },
    /// `set_nlink`.
    SetNlink {
        /// Caller.
        task: String,
        /// Reference.
        r: String,
        /// New link count.
        nlink: u32,
    },
    /// `drop_nlink`.
    DropNlink {
        /// Caller.
        task: String,
        /// Reference.
        r: String,
    },
    /// `clear_nlink`.
    ClearNlink {
        /// Caller.
        task: String,
        /// Reference.
        r: String,
    },
    /// `d_mark_dontcache`.
    Dontcache {
        /// Caller.
        task: String,
        /// Reference.
        r: String,
    },
    /// `prune_icache_sb`.
    Prune {
        /// Caller.
        task: String,
        /// Superblock.
        sb: String,
        /// `nr_to_scan`.
        count: u64,
    },
    /// `generic_shutdown_super`'s part.
    Umount {
        /// Caller.
        task: String,
        /// Superblock.
        sb: String,
    },
    /// An inode's state.
    State {
        /// Caller.
        task: String,
        /// Which inode.
        of: StateOf,
    },
    /// A superblock's LRU.
    Lru {
        /// Caller.
        task: String,
        /// Superblock.
        sb: String,
    },
    /// `/proc/sys/fs/inode-nr`.
    Stats {
        /// Caller.
        task: String,
    },
}

/// One step of a scenario.
pub type Step = crate::format::Step<Op>;
/// A parsed scenario.
pub type Scenario = crate::format::Scenario<Op>;

impl Op {
    /// The calling task.
    pub fn task(&self) -> &str {
        match self {
            Op::Iget { task, .. }
            | Op::Ilookup { task, .. }
            | Op::NewInode { task, .. }
            | Op::InsertLocked { task, .. }
            | Op::UnlockNew { task, .. }
            | Op::DiscardNew { task, .. }
            | Op::IgetFailed { task, .. }
            | Op::Ihold { task, .. }
            | Op::Iput { task, .. }
            | Op::FinishEvict { task }
            | Op::Unhash { task, .. }
            | Op::SetNlink { task, .. }
            | Op::DropNlink { task, .. }
            | Op::ClearNlink { task, .. }
            | Op::Dontcache { task, .. }
            | Op::Prune { task, .. }
            | Op::Umount { task, .. }
            | Op::State { task, .. }
            | Op::Lru { task, .. }
            | Op::Stats { task } => task,
        }
    }

    /// The reference this step uses (not one it binds).
    pub fn uses(&self) -> Option<&str> {
        match self {
            Op::InsertLocked { r, .. }
            | Op::UnlockNew { r, .. }
            | Op::DiscardNew { r, .. }
            | Op::IgetFailed { r, .. }
            | Op::Ihold { r, .. }
            | Op::Iput { r, .. }
            | Op::Unhash { r, .. }
            | Op::SetNlink { r, .. }
            | Op::DropNlink { r, .. }
            | Op::ClearNlink { r, .. }
            | Op::Dontcache { r, .. } => Some(r),
            Op::State {
                of: StateOf::Ref(r), ..
            } => Some(r),
            _ => None,
        }
    }

    /// The name this step gives.
    pub fn binds(&self) -> Option<&str> {
        match self {
            Op::Iget { r, .. } | Op::Ilookup { r, .. } | Op::NewInode { r, .. } => Some(r),
            Op::Ihold { new, .. } => Some(new),
            _ => None,
        }
    }

    /// Whether the step ends its reference.
    pub fn ends(&self) -> bool {
        matches!(
            self,
            Op::Iput { .. } | Op::DiscardNew { .. } | Op::IgetFailed { .. }
        )
    }

    /// The step as one line of JSON.
    pub fn to_json(&self) -> Value {
        let mut o = match self {
            Op::Iget { sb, ino, r, .. } => json!({"op":"iget","sb":sb,"ino":ino,"ref":r}),
            Op::Ilookup { sb, ino, r, .. } => json!({"op":"ilookup","sb":sb,"ino":ino,"ref":r}),
            Op::NewInode { sb, ino, r, .. } => json!({"op":"new_inode","sb":sb,"ino":ino,"ref":r}),
            Op::InsertLocked { r, .. } => json!({"op":"insert_locked","ref":r}),
            Op::UnlockNew { r, .. } => json!({"op":"unlock_new","ref":r}),
            Op::DiscardNew { r, hold, .. } => json!({"op":"discard_new","ref":r,"hold_evict":hold}),
            Op::IgetFailed { r, hold, .. } => json!({"op":"iget_failed","ref":r,"hold_evict":hold}),
            Op::Ihold { r, new, .. } => json!({"op":"ihold","ref":r,"as":new}),
            Op::Iput { r, hold, .. } => json!({"op":"iput","ref":r,"hold_evict":hold}),
            Op::FinishEvict { .. } => json!({"op":"finish_evict"}),
            Op::Unhash { r, .. } => json!({"op":"unhash","ref":r}),
            Op::SetNlink { r, nlink, .. } => json!({"op":"set_nlink","ref":r,"nlink":nlink}),
            Op::DropNlink { r, .. } => json!({"op":"drop_nlink","ref":r}),
            Op::ClearNlink { r, .. } => json!({"op":"clear_nlink","ref":r}),
            Op::Dontcache { r, .. } => json!({"op":"dontcache","ref":r}),
            Op::Prune { sb, count, .. } => json!({"op":"prune","sb":sb,"count":count}),
            Op::Umount { sb, .. } => json!({"op":"umount","sb":sb}),
            Op::State {
                of: StateOf::Key { sb, ino },
                ..
            } => json!({"op":"state","sb":sb,"ino":ino}),
            Op::State {
                of: StateOf::Ref(r), ..
            } => json!({"op":"state","ref":r}),
            Op::Lru { sb, .. } => json!({"op":"lru","sb":sb}),
            Op::Stats { .. } => json!({"op":"stats"}),
        };
        o.as_object_mut()
            .expect("object")
            .insert("task".into(), json!(self.task()));
        o
    }
}

fn opt_str(o: &Object, line: usize, k: &str, default: &str) -> Result<String, ScenarioError> {
    if o.contains_key(k) {
        Ok(field::str(o, line, k)?.to_string())
    } else {
        Ok(default.to_string())
    }
}

impl StepOp for Op {
    /// Parses one step.
    ///
    /// ```
    /// use vfscale_conformance::icache::{Op, Scenario};
    /// let s = Scenario::parse(r#"{"op":"iget","task":"t1","ino":5,"ref":"r1"}"#).unwrap();
    /// assert!(matches!(&s.steps[0].op, Op::Iget { sb, ino: 5, .. } if sb == "s0"));
    /// let e = Scenario::parse("\n{\"op\":\"iput\",\"ref\":\"r1\",\"hold_evict\":1}").unwrap_err();
    /// assert_eq!(e.to_string(), "line 2: field `hold_evict` must be true or false, not 1");
    /// ```
    fn parse(o: &Object, line: usize) -> Result<Op, ScenarioError> {
        let op = field::str(o, line, "op")?;
        let task = opt_str(o, line, "task", "t0")?;
        let sb = || opt_str(o, line, "sb", "s0");
        let ino = || field::int::<u64>(o, line, "ino", "an unsigned 64-bit integer");
        let r = || field::str(o, line, "ref").map(str::to_string);
        let only = |allowed: &[&str]| {
            let mut a = vec!["task"];
            a.extend_from_slice(allowed);
            field::only(o, line, op, &a)
        };
        Ok(match op {
            "iget" | "ilookup" | "new_inode" => {
                only(&["sb", "ino", "ref"])?;
                let (sb, ino, r) = (sb()?, ino()?, r()?);
                match op {
                    "iget" => Op::Iget { task, sb, ino, r },
                    "ilookup" => Op::Ilookup { task, sb, ino, r },
                    _ => Op::NewInode { task, sb, ino, r },
                }
            }
            "insert_locked" | "unlock_new" | "unhash" | "drop_nlink" | "clear_nlink" | "dontcache" => {
                only(&["ref"])?;
                let r = r()?;
                match op {
                    "insert_locked" => Op::InsertLocked { task, r },
                    "unlock_new" => Op::UnlockNew { task, r },
                    "unhash" => Op::Unhash { task, r },
                    "drop_nlink" => Op::DropNlink { task, r },
                    "clear_nlink" => Op::ClearNlink { task, r },
                    _ => Op::Dontcache { task, r },
                }
            }
            "discard_new" | "iget_failed" | "iput" => {
                only(&["ref", "hold_evict"])?;
                let (r, hold) = (r()?, field::bool(o, line, "hold_evict")?);
                match op {
                    "discard_new" => Op::DiscardNew { task, r, hold },
                    "iget_failed" => Op::IgetFailed { task, r, hold },
                    _ => Op::Iput { task, r, hold },
                }
            }
            "ihold" => {
                only(&["ref", "as"])?;
                Op::Ihold {
                    task,
                    r: r()?,
                    new: field::str(o, line, "as")?.to_string(),
                }
            }
            "finish_evict" => {
                only(&[])?;
                Op::FinishEvict { task }
            }
            "set_nlink" => {
                only(&["ref", "nlink"])?;
                Op::SetNlink {
                    task,
                    r: r()?,
                    nlink: field::int::<u32>(o, line, "nlink", "an unsigned 32-bit integer")?,
                }
            }
            "prune" => {
                only(&["sb", "count"])?;
                Op::Prune {
                    task,
                    sb: sb()?,
                    count: field::int::<u64>(o, line, "count", "an unsigned 64-bit integer")?,
                }
            }
            "umount" => {
                only(&["sb"])?;
                Op::Umount { task, sb: sb()? }
            }
            "state" => {
                only(&["sb", "ino", "ref"])?;
                let of = match (o.contains_key("ref"), o.contains_key("ino")) {
                    (true, false) if !o.contains_key("sb") => StateOf::Ref(r()?),
                    (true, _) => {
                        return Err(ScenarioError::at(
                            line,
                            "field `ref`: a state step names either a ref or an sb and ino, not both",
                        ))
                    }
                    (false, true) => StateOf::Key {
                        sb: sb()?,
                        ino: ino()?,
                    },
                    (false, false) => return Err(ScenarioError::at(line, "missing field `ino` (or `ref`)")),
                };
                Op::State { task, of }
            }
            "lru" => {
                only(&["sb"])?;
                Op::Lru { task, sb: sb()? }
            }
            "stats" => {
                only(&[])?;
                Op::Stats { task }
            }
            other => {
                return Err(ScenarioError::at(
                    line,
                    format!("field `op`: unknown op {other:?}"),
                ))
            }
        })
    }

    fn to_json(&self) -> Value {
        Op::to_json(self)
    }
}

/// An inode as `state` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StateView {
    /// Object number.
    pub obj: u64,
    /// `i_count`.
    pub count: u32,
    /// `i_nlink`.
    pub nlink: u32,
    /// Sorted names among `I_CREATING`, `I_DONTCACHE`, `I_FREEING`, `I_NEW`, `I_REFERENCED`.
    pub state: Vec<String>,
    /// Hashed.
    pub hashed: bool,
    /// On the LRU.
    pub lru: bool,
}

/// A step's result.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// `"ok"`.
    Ok,
    /// `"blocked"`.
    Blocked,
    /// `"EBUSY"`.
    Ebusy,
    /// `null`.
    Null,
    /// `iget`: `{"obj":N,"new":B}`.
    Iget {
        /// Object.
        obj: u64,
        /// Created by this call.
        new: bool,
    },
    /// `ilookup`, `new_inode`: `{"obj":N}`.
    Obj(u64),
    /// `prune`.
    Prune {
        /// The walk's return value.
        freed: u64,
        /// Sorted inos evicted.
        evicted: Vec<u64>,
    },
    /// `umount`: sorted inos evicted.
    Umount(Vec<u64>),
    /// `state`.
    State(StateView),
    /// `lru`.
    Lru(Vec<u64>),
    /// `stats`.
    Stats {
        /// `nr_inodes`.
        nr_inodes: u64,
        /// `nr_unused`.
        nr_unused: u64,
    },
}

impl StepOutcome for Outcome {
    /// The `result` value.
    fn to_json(&self) -> Value {
        match self {
            Outcome::Ok => json!("ok"),
            Outcome::Blocked => json!("blocked"),
            Outcome::Ebusy => json!("EBUSY"),
            Outcome::Null => Value::Null,
            Outcome::Iget { obj, new } => json!({"obj":obj,"new":new}),
            Outcome::Obj(o) => json!({ "obj": o }),
            Outcome::Prune { freed, evicted } => json!({"freed":freed,"evicted":evicted}),
            Outcome::Umount(e) => json!({ "evicted": e }),
            Outcome::State(s) => json!({
                "obj":s.obj,"count":s.count,"nlink":s.nlink,"state":s.state,"hashed":s.hashed,"lru":s.lru
            }),
            Outcome::Lru(v) => json!(v),
            Outcome::Stats { nr_inodes, nr_unused } => json!({"nr_inodes":nr_inodes,"nr_unused":nr_unused}),
        }
    }
}

/// The result line of one step.
pub type StepResult = crate::format::StepResult<Outcome>;

pub use crate::format::{render_results, StepOutcome};

/// The rules that need the cache's state, and their messages (both runners use these).
pub mod warn {
    use super::{Op, Step};
    use crate::format::ScenarioError;

    /// What the rules read of the inode a reference holds.
    pub struct InodeFacts {
        /// `I_NEW` is set.
        pub new: bool,
        /// `i_nlink`.
        pub nlink: u32,
        /// `i_count`.
        pub count: u32,
        /// The inode was hashed at some time.
        pub hashed_before: bool,
    }

    /// The rules on which Linux would `WARN`, and `insert_locked` of an inode hashed
    /// before: the one `step` breaks, given what a runner sees of a reference's inode.
    pub fn check(step: &Step, inode: impl Fn(&str) -> InodeFacts) -> Result<(), ScenarioError> {
        let line = step.line;
        match &step.op {
            Op::UnlockNew { r, .. } | Op::DiscardNew { r, .. } | Op::IgetFailed { r, .. }
                if !inode(r).new =>
            {
                let name = match &step.op {
                    Op::UnlockNew { .. } => "unlock_new",
                    Op::DiscardNew { .. } => "discard_new",
                    _ => "iget_failed",
                };
                Err(not_new(line, name, r))
            }
            Op::DropNlink { r, .. } if inode(r).nlink == 0 => Err(nlink_zero(line, r)),
            Op::Iput { r, .. } if inode(r).count == 1 && inode(r).new => Err(last_iput_new(line, r)),
            Op::InsertLocked { r, .. } if inode(r).hashed_before => Err(hashed_before(line, r)),
            _ => Ok(()),
        }
    }

    /// `unlock_new`, `discard_new`, `iget_failed` of an inode that is not `I_NEW`.
    pub fn not_new(line: usize, op: &str, r: &str) -> ScenarioError {
        ScenarioError::at(
            line,
            format!("{op}: the inode of reference {r:?} is not I_NEW (Linux WARNs)"),
        )
    }
    /// `drop_nlink` at 0.
    pub fn nlink_zero(line: usize, r: &str) -> ScenarioError {
        ScenarioError::at(
            line,
            format!("drop_nlink: the inode of reference {r:?} has nlink 0 (Linux WARNs)"),
        )
    }
    /// The last `iput` of an `I_NEW` inode.
    pub fn last_iput_new(line: usize, r: &str) -> ScenarioError {
        ScenarioError::at(
            line,
            format!("iput: reference {r:?} is the last one to an I_NEW inode (Linux WARNs in iput_final)"),
        )
    }
    /// `insert_locked` of an inode hashed before.
    pub fn hashed_before(line: usize, r: &str) -> ScenarioError {
        ScenarioError::at(
            line,
            format!("insert_locked: the inode of reference {r:?} was hashed before"),
        )
    }
}

/// The rules about names and tasks, which both runners enforce through this one type.
#[derive(Debug, Default)]
pub struct Tracker {
    names: HashSet<String>,
    live: HashSet<String>,
    /// Blocked tasks and their step.
    blocked: BTreeMap<String, usize>,
    /// Tasks held in `->evict_inode`, and their step.
    held: BTreeMap<String, usize>,
    /// References inside a blocked `insert_locked`, and its step.
    in_insert: HashMap<String, usize>,
    umounted: HashSet<String>,
}

impl Tracker {
    /// A tracker for a fresh replay.
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks a step against the rules and records the names it gives and ends. The
    /// runner then reports what happened with the other methods.
    pub fn check(&mut self, step: &Step) -> Result<(), ScenarioError> {
        let line = step.line;
        let task = step.op.task();
        if let Op::FinishEvict { .. } = step.op {
            if !self.held.contains_key(task) {
                return Err(ScenarioError::at(
                    line,
                    format!("task {task:?} is not held in ->evict_inode"),
                ));
            }
            return Ok(());
        }
        if let Some(s) = self.blocked.get(task) {
            return Err(ScenarioError::at(
                line,
                format!("task {task:?} is blocked in step {s} and can take no step"),
            ));
        }
        if let Some(r) = step.op.uses() {
            if let Some(s) = self.in_insert.get(r) {
                return Err(ScenarioError::at(
                    line,
                    format!("reference {r:?} is in the blocked insert_locked of step {s}"),
                ));
            }
            if !self.live.contains(r) {
                return Err(ScenarioError::at(
                    line,
                    format!("unknown or ended reference {r:?}"),
                ));
            }
        }
        if let Some(n) = step.op.binds() {
            if self.names.contains(n) {
                return Err(ScenarioError::at(line, format!("the name {n:?} was used before")));
            }
        }
        if let Op::Umount { sb, .. } = &step.op {
            if self.umounted.contains(sb) {
                return Err(ScenarioError::at(
                    line,
                    format!("superblock {sb:?} is unmounted already"),
                ));
            }
        }
        Ok(())
    }

    /// Records the effects on names of a step that passed every check (before it runs):
    /// its name is taken, the reference it ends is gone, its superblock unmounted.
    pub fn commit(&mut self, step: &Step) {
        if let Some(n) = step.op.binds() {
            self.names.insert(n.to_string());
        }
        if step.op.ends() {
            self.live.remove(step.op.uses().expect("ends a reference"));
        }
        if let Op::Umount { sb, .. } = &step.op {
            self.umounted.insert(sb.clone());
        }
    }

    /// A name is bound now.
    pub fn bind(&mut self, name: &str) {
        self.live.insert(name.to_string());
    }

    /// `task` blocks in step `index`; `held` when in `->evict_inode`; `insert_ref` when it
    /// is an `insert_locked` holding that reference.
    pub fn block(&mut self, task: &str, index: usize, held: bool, insert_ref: Option<&str>) {
        self.blocked.insert(task.to_string(), index);
        if held {
            self.held.insert(task.to_string(), index);
        }
        if let Some(r) = insert_ref {
            self.in_insert.insert(r.to_string(), index);
        }
    }

    /// `task`'s blocked call finished.
    pub fn unblock(&mut self, task: &str) {
        if let Some(s) = self.blocked.remove(task) {
            self.held.remove(task);
            self.in_insert.retain(|_, v| *v != s);
        }
    }

    /// The step `task` is blocked in.
    pub fn blocked_step(&self, task: &str) -> Option<usize> {
        self.blocked.get(task).copied()
    }

    /// Whether the name is a live reference.
    pub fn is_live(&self, name: &str) -> bool {
        self.live.contains(name)
    }

    /// Live references, sorted.
    pub fn live_refs(&self) -> Vec<String> {
        let mut v: Vec<String> = self.live.iter().cloned().collect();
        v.sort();
        v
    }

    /// Blocked tasks with their steps.
    pub fn blocked_tasks(&self) -> impl Iterator<Item = (&str, usize)> {
        self.blocked.iter().map(|(t, s)| (t.as_str(), *s))
    }

    /// Held tasks.
    pub fn held_tasks(&self) -> impl Iterator<Item = &str> {
        self.held.keys().map(String::as_str)
    }

    /// Whether `sb` was unmounted.
    pub fn is_umounted(&self, sb: &str) -> bool {
        self.umounted.contains(sb)
    }
}
