//! The reference model: a sequential inode cache written from `fs/inode.c` (v6.18), the
//! function behind each rule cited beside it. The kernel's inode cache cannot be driven
//! from userspace, so this model is the reference the library runner is compared with.
//!
//! Woken tasks retry in passes over the blocked steps in step order until a pass finds
//! none woken, as the library runner drives its waits; both are deterministic, so a
//! scenario the spec calls racy still replays the same way on both.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use super::format::{warn, Op, Outcome, Scenario, StateOf, StateView, Step, StepResult, Tracker};
use crate::format::ScenarioError;

const I_NEW: u8 = 1;
const I_CREATING: u8 = 2;
const I_REFERENCED: u8 = 4;
const I_FREEING: u8 = 8;
const I_DONTCACHE: u8 = 16;

#[derive(Clone, Debug)]
struct MInode {
    sb: String,
    ino: u64,
    count: u32,
    nlink: u32,
    flags: u8,
    hashed: bool,
    was_hashed: bool,
    lru: bool,
    alive: bool,
}

/// A lookup operation that may wait.
#[derive(Clone, Debug)]
enum LookupOp {
    Iget { sb: String, ino: u64 },
    Ilookup { sb: String, ino: u64 },
    Insert { obj: usize },
}

#[derive(Clone, Debug)]
enum WaitOn {
    /// Waiting for `I_NEW` to clear, holding a reference.
    New(usize),
    /// Waiting for the eviction of this inode (no reference).
    Freeing(usize),
}

#[derive(Clone, Debug)]
struct Blocked {
    task: String,
    op: LookupOp,
    on: WaitOn,
    woken: bool,
    /// The name to bind when it completes.
    name: Option<String>,
}

enum Attempt {
    Done(Outcome, Option<usize>),
    Wait(WaitOn),
}

/// The model's state; replays one step at a time.
#[derive(Debug, Default)]
pub struct Reference {
    tracker: Tracker,
    objs: Vec<MInode>,
    /// Hash chains, newest first.
    chains: HashMap<(String, u64), Vec<usize>>,
    /// Per-superblock LRU, oldest first.
    lru: BTreeMap<String, VecDeque<usize>>,
    sb_list: BTreeMap<String, BTreeSet<usize>>,
    active: HashMap<String, bool>,
    refs: HashMap<String, usize>,
    blocked: BTreeMap<usize, Blocked>,
    /// Held evictions: task -> (step, obj).
    held: BTreeMap<String, (usize, usize)>,
    evicted: Vec<u64>,
    next: usize,
}

/// Replays a scenario through the model.
///
/// ```
/// use vfscale_conformance::icache::{reference, render_results, Scenario};
/// let s = Scenario::parse(concat!(
///     r#"{"op":"iget","task":"t1","ino":5,"ref":"r1"}"#, "\n",
///     r#"{"op":"iget","task":"t2","ino":5,"ref":"r2"}"#, "\n",
///     r#"{"op":"unlock_new","task":"t1","ref":"r1"}"#, "\n",
/// )).unwrap();
/// let out = render_results(&reference::replay(&s).unwrap());
/// assert!(out.ends_with("{\"step\":2,\"result\":\"ok\",\"completed\":[{\"step\":1,\"result\":{\"obj\":1,\"new\":false}}]}\n"));
/// ```
pub fn replay(scn: &Scenario) -> Result<Vec<StepResult>, ScenarioError> {
    let mut m = Reference::new();
    scn.steps.iter().map(|s| m.apply(s)).collect()
}

impl Reference {
    /// A fresh model.
    pub fn new() -> Self {
        Self::default()
    }

    /// The tracker (names, blocked tasks), for generators that pick valid steps.
    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    /// The flags of a live reference's inode: (`I_NEW`, count, nlink, was hashed).
    pub fn ref_info(&self, r: &str) -> Option<(bool, u32, u32, bool)> {
        let o = &self.objs[*self.refs.get(r)?];
        Some((o.flags & I_NEW != 0, o.count, o.nlink, o.was_hashed))
    }

    fn sb(&mut self, sb: &str) {
        self.active.entry(sb.to_string()).or_insert(true);
    }

    /// Applies the next step and settles the woken tasks.
    pub fn apply(&mut self, step: &Step) -> Result<StepResult, ScenarioError> {
        let i = self.next;
        self.tracker.check(step)?;
        self.check_warn(step)?;
        self.tracker.commit(step);
        self.next += 1;
        let mut completed = BTreeMap::new();
        let result = self.step(i, step, &mut completed);
        self.settle(&mut completed);
        Ok(StepResult::settled(i, result, completed, |r| {
            matches!(r, Outcome::Blocked)
        }))
    }

    /// The rules on which Linux would `WARN`, and `insert_locked` of a hashed inode.
    fn check_warn(&self, step: &Step) -> Result<(), ScenarioError> {
        warn::check(step, |r| {
            let o = &self.objs[self.refs[r]];
            warn::InodeFacts {
                new: o.flags & I_NEW != 0,
                nlink: o.nlink,
                count: o.count,
                hashed_before: o.was_hashed,
            }
        })
    }

    fn step(&mut self, i: usize, step: &Step, completed: &mut BTreeMap<usize, Outcome>) -> Outcome {
        let task = step.op.task().to_string();
        match &step.op {
            Op::Iget { sb, ino, r, .. } => {
                self.sb(sb);
                let op = LookupOp::Iget {
                    sb: sb.clone(),
                    ino: *ino,
                };
                self.start(i, &task, op, Some(r.clone()))
            }
            Op::Ilookup { sb, ino, r, .. } => {
                self.sb(sb);
                let op = LookupOp::Ilookup {
                    sb: sb.clone(),
                    ino: *ino,
                };
                self.start(i, &task, op, Some(r.clone()))
            }
            Op::NewInode { sb, ino, r, .. } => {
                self.sb(sb);
                // new_inode: alloc_inode + inode_sb_list_add; unhashed, i_count 1.
                let o = self.alloc(sb, *ino);
                self.refs.insert(r.clone(), o);
                self.tracker.bind(r);
                Outcome::Obj(o as u64 + 1)
            }
            Op::InsertLocked { r, .. } => {
                let obj = self.refs[r];
                let out = self.start(i, &task, LookupOp::Insert { obj }, None);
                if out == Outcome::Blocked {
                    self.tracker.unblock(&task);
                    self.tracker.block(&task, i, false, Some(r));
                }
                out
            }
            Op::UnlockNew { r, .. } => {
                // unlock_new_inode: clear I_NEW and I_CREATING, wake the waiters.
                let o = self.refs[r];
                self.objs[o].flags &= !(I_NEW | I_CREATING);
                self.wake(o);
                Outcome::Ok
            }
            Op::DiscardNew { r, hold, .. } => {
                // discard_new_inode: clear I_NEW only, wake, iput.
                let o = self.refs.remove(r).expect("live");
                self.objs[o].flags &= !I_NEW;
                self.wake(o);
                self.iput_step(i, &task, o, *hold)
            }
            Op::IgetFailed { r, hold, .. } => {
                // iget_failed: make_bad_inode (remove_inode_hash), unlock_new_inode, iput.
                let o = self.refs.remove(r).expect("live");
                self.unhash(o);
                self.objs[o].flags &= !(I_NEW | I_CREATING);
                self.wake(o);
                self.iput_step(i, &task, o, *hold)
            }
            Op::Ihold { r, new, .. } => {
                // ihold: atomic_inc of i_count.
                let o = self.refs[r];
                self.objs[o].count += 1;
                self.refs.insert(new.clone(), o);
                self.tracker.bind(new);
                Outcome::Ok
            }
            Op::Iput { r, hold, .. } => {
                let o = self.refs.remove(r).expect("live");
                self.iput_step(i, &task, o, *hold)
            }
            Op::FinishEvict { .. } => {
                let (s, o) = self.held.remove(&task).expect("held");
                self.tracker.unblock(&task);
                self.finish_evict(o);
                completed.insert(s, Outcome::Ok);
                Outcome::Ok
            }
            Op::Unhash { r, .. } => {
                let o = self.refs[r];
                self.unhash(o);
                Outcome::Ok
            }
            Op::SetNlink { r, nlink, .. } => {
                let o = self.refs[r];
                self.objs[o].nlink = *nlink;
                Outcome::Ok
            }
            Op::DropNlink { r, .. } => {
                let o = self.refs[r];
                self.objs[o].nlink -= 1;
                Outcome::Ok
            }
            Op::ClearNlink { r, .. } => {
                let o = self.refs[r];
                self.objs[o].nlink = 0;
                Outcome::Ok
            }
            Op::Dontcache { r, .. } => {
                // d_mark_dontcache: I_DONTCACHE under i_lock.
                let o = self.refs[r];
                self.objs[o].flags |= I_DONTCACHE;
                Outcome::Ok
            }
            Op::Prune { sb, count, .. } => {
                self.sb(sb);
                self.evicted.clear();
                let freed = self.prune(sb, *count);
                let mut ev = std::mem::take(&mut self.evicted);
                ev.sort_unstable();
                Outcome::Prune { freed, evicted: ev }
            }
            Op::Umount { sb, .. } => {
                self.sb(sb);
                self.evicted.clear();
                // generic_shutdown_super: sb->s_flags &= ~SB_ACTIVE, then evict_inodes.
                self.active.insert(sb.clone(), false);
                self.evict_inodes(sb);
                let mut ev = std::mem::take(&mut self.evicted);
                ev.sort_unstable();
                Outcome::Umount(ev)
            }
            Op::State { of, .. } => {
                let o = match of {
                    StateOf::Ref(r) => Some(self.refs[r]),
                    StateOf::Key { sb, ino } => {
                        self.sb(sb);
                        self.chains
                            .get(&(sb.clone(), *ino))
                            .and_then(|c| c.first().copied())
                    }
                };
                match o {
                    None => Outcome::Null,
                    Some(o) => Outcome::State(self.view(o)),
                }
            }
            Op::Lru { sb, .. } => {
                self.sb(sb);
                Outcome::Lru(
                    self.lru
                        .get(sb)
                        .map(|l| l.iter().map(|o| self.objs[*o].ino).collect())
                        .unwrap_or_default(),
                )
            }
            Op::Stats { .. } => Outcome::Stats {
                nr_inodes: self.objs.iter().filter(|o| o.alive).count() as u64,
                nr_unused: self.lru.values().map(|l| l.len() as u64).sum(),
            },
        }
    }

    fn view(&self, o: usize) -> StateView {
        let m = &self.objs[o];
        let mut state: Vec<String> = [
            (I_CREATING, "I_CREATING"),
            (I_DONTCACHE, "I_DONTCACHE"),
            (I_FREEING, "I_FREEING"),
            (I_NEW, "I_NEW"),
            (I_REFERENCED, "I_REFERENCED"),
        ]
        .iter()
        .filter(|(b, _)| m.flags & b != 0)
        .map(|(_, n)| n.to_string())
        .collect();
        state.sort();
        StateView {
            obj: o as u64 + 1,
            count: m.count,
            nlink: m.nlink,
            state,
            hashed: m.hashed,
            lru: m.lru,
        }
    }

    /// alloc_inode + inode_init_always (i_count 1, nlink 1) + inode_sb_list_add.
    fn alloc(&mut self, sb: &str, ino: u64) -> usize {
        self.objs.push(MInode {
            sb: sb.to_string(),
            ino,
            count: 1,
            nlink: 1,
            flags: 0,
            hashed: false,
            was_hashed: false,
            lru: false,
            alive: true,
        });
        let o = self.objs.len() - 1;
        self.sb_list.entry(sb.to_string()).or_default().insert(o);
        o
    }

    /// hlist_add_head_rcu onto the key's chain.
    fn hash(&mut self, o: usize) {
        let key = (self.objs[o].sb.clone(), self.objs[o].ino);
        self.chains.entry(key).or_default().insert(0, o);
        self.objs[o].hashed = true;
        self.objs[o].was_hashed = true;
    }

    /// remove_inode_hash.
    fn unhash(&mut self, o: usize) {
        if !self.objs[o].hashed {
            return;
        }
        let key = (self.objs[o].sb.clone(), self.objs[o].ino);
        let c = self.chains.get_mut(&key).expect("hashed inode has a chain");
        c.retain(|x| *x != o);
        if c.is_empty() {
            self.chains.remove(&key);
        }
        self.objs[o].hashed = false;
    }

    /// inode_wake_up_bit(inode, __I_NEW): every waiter on the inode.
    fn wake(&mut self, o: usize) {
        for b in self.blocked.values_mut() {
            if matches!(b.on, WaitOn::New(x) | WaitOn::Freeing(x) if x == o) {
                b.woken = true;
            }
        }
    }

    fn start(&mut self, i: usize, task: &str, op: LookupOp, name: Option<String>) -> Outcome {
        match self.run(&op) {
            Attempt::Done(out, obj) => self.finish(name.as_deref(), out, obj),
            Attempt::Wait(on) => {
                self.tracker.block(task, i, false, None);
                self.blocked.insert(
                    i,
                    Blocked {
                        task: task.to_string(),
                        op,
                        on,
                        woken: false,
                        name,
                    },
                );
                Outcome::Blocked
            }
        }
    }

    /// Binds the name to the object the call returned.
    fn finish(&mut self, name: Option<&str>, out: Outcome, obj: Option<usize>) -> Outcome {
        if let (Some(n), Some(o)) = (name, obj) {
            self.refs.insert(n.to_string(), o);
            self.tracker.bind(n);
        }
        out
    }

    /// find_inode_fast / find_inode: the key's chain newest first. I_FREEING or
    /// I_WILL_FREE: __wait_on_freeing_inode. I_CREATING: ERR_PTR(-ESTALE). Else __iget.
    fn find(&mut self, sb: &str, ino: u64) -> Result<Option<usize>, Attempt> {
        let Some(c) = self.chains.get(&(sb.to_string(), ino)) else {
            return Ok(None);
        };
        let o = c[0];
        let f = self.objs[o].flags;
        if f & I_FREEING != 0 {
            return Err(Attempt::Wait(WaitOn::Freeing(o)));
        }
        if f & I_CREATING != 0 {
            return Err(Attempt::Done(Outcome::Null, None));
        }
        self.objs[o].count += 1;
        Ok(Some(o))
    }

    /// Runs a lookup operation from the start.
    fn run(&mut self, op: &LookupOp) -> Attempt {
        match op {
            LookupOp::Iget { sb, ino } => match self.find(sb, *ino) {
                Err(a) => a,
                Ok(Some(o)) => self.settle_found(op, o),
                Ok(None) => {
                    // iget_locked: not found: alloc_inode, then (under the hash lock) set
                    // I_NEW, hlist_add_head_rcu, inode_sb_list_add; the caller loads it.
                    let o = self.alloc(sb, *ino);
                    self.objs[o].flags = I_NEW;
                    self.hash(o);
                    Attempt::Done(
                        Outcome::Iget {
                            obj: o as u64 + 1,
                            new: true,
                        },
                        Some(o),
                    )
                }
            },
            LookupOp::Ilookup { sb, ino } => match self.find(sb, *ino) {
                Err(Attempt::Done(..)) | Ok(None) => Attempt::Done(Outcome::Null, None),
                Err(a) => a,
                Ok(Some(o)) => self.settle_found(op, o),
            },
            LookupOp::Insert { obj } => {
                // insert_inode_locked: the first inode with the key that is not
                // I_FREEING/I_WILL_FREE (those are skipped, never waited for).
                let key = (self.objs[*obj].sb.clone(), self.objs[*obj].ino);
                let old = self
                    .chains
                    .get(&key)
                    .and_then(|c| c.iter().copied().find(|x| self.objs[*x].flags & I_FREEING == 0));
                match old {
                    None => {
                        self.objs[*obj].flags |= I_NEW | I_CREATING;
                        self.hash(*obj);
                        Attempt::Done(Outcome::Ok, None)
                    }
                    Some(x) if self.objs[x].flags & I_CREATING != 0 => Attempt::Done(Outcome::Ebusy, None),
                    Some(x) => {
                        // __iget(old); wait_on_inode(old).
                        self.objs[x].count += 1;
                        self.settle_found(op, x)
                    }
                }
            }
        }
    }

    /// After finding `o` with a reference: wait_on_new_inode; then an unhashed inode is
    /// put and the lookup starts over (iget_locked, ilookup: `inode_unhashed` → `iput`,
    /// `goto again`; insert_inode_locked: `EBUSY` if still hashed, else retry).
    fn settle_found(&mut self, op: &LookupOp, o: usize) -> Attempt {
        if self.objs[o].flags & I_NEW != 0 {
            return Attempt::Wait(WaitOn::New(o));
        }
        if !self.objs[o].hashed {
            self.iput(o, None);
            return self.run(op);
        }
        match op {
            LookupOp::Iget { .. } => Attempt::Done(
                Outcome::Iget {
                    obj: o as u64 + 1,
                    new: false,
                },
                Some(o),
            ),
            LookupOp::Ilookup { .. } => Attempt::Done(Outcome::Obj(o as u64 + 1), Some(o)),
            LookupOp::Insert { .. } => {
                self.iput(o, None);
                Attempt::Done(Outcome::Ebusy, None)
            }
        }
    }

    /// An `iput` step (or the `iput` of `discard_new`/`iget_failed`).
    fn iput_step(&mut self, i: usize, task: &str, o: usize, hold: bool) -> Outcome {
        if self.iput(o, hold.then_some((i, task))) {
            self.tracker.block(task, i, true, None);
            Outcome::Blocked
        } else {
            Outcome::Ok
        }
    }

    /// iput → iput_final. Returns whether the eviction it started is held.
    fn iput(&mut self, o: usize, hold: Option<(usize, &str)>) -> bool {
        let m = &mut self.objs[o];
        m.count -= 1;
        if m.count > 0 {
            return false;
        }
        // iput_final: drop = inode_generic_drop (no ->drop_inode): !nlink || unhashed.
        let drop = m.nlink == 0 || !m.hashed;
        let active = self.active.get(&m.sb).copied().unwrap_or(true);
        if !drop && m.flags & I_DONTCACHE == 0 && active {
            // __inode_add_lru(inode, true): list_lru_add, or I_REFERENCED if on it.
            if m.lru {
                m.flags |= I_REFERENCED;
            } else {
                m.lru = true;
                let sb = m.sb.clone();
                self.lru.entry(sb).or_default().push_back(o);
            }
            return false;
        }
        // (I_WILL_FREE and write_inode_now when not dropped: nothing is dirty.)
        m.flags |= I_FREEING;
        if m.lru {
            self.lru_del(o);
        }
        self.evict(o, hold)
    }

    fn lru_del(&mut self, o: usize) {
        let sb = self.objs[o].sb.clone();
        if let Some(l) = self.lru.get_mut(&sb) {
            l.retain(|x| *x != o);
        }
        self.objs[o].lru = false;
    }

    /// evict: inode_sb_list_del, ->evict_inode (held here with hold_evict), then the rest.
    fn evict(&mut self, o: usize, hold: Option<(usize, &str)>) -> bool {
        let sb = self.objs[o].sb.clone();
        self.sb_list.get_mut(&sb).expect("listed").remove(&o);
        self.evicted.push(self.objs[o].ino);
        if let Some((i, task)) = hold {
            self.held.insert(task.to_string(), (i, o));
            return true;
        }
        self.finish_evict(o);
        false
    }

    /// The rest of evict(): clear_inode (I_CLEAR), remove_inode_hash, wake the
    /// __wait_on_freeing_inode sleepers, destroy_inode.
    fn finish_evict(&mut self, o: usize) {
        self.unhash(o);
        self.wake(o);
        self.objs[o].alive = false;
    }

    /// prune_icache_sb: list_lru_shrink_walk with inode_lru_isolate, then dispose_list.
    fn prune(&mut self, sb: &str, count: u64) -> u64 {
        let mut l: VecDeque<usize> = self.lru.remove(sb).unwrap_or_default();
        let mut budget = count;
        let mut freed = 0;
        let mut dispose = Vec::new();
        // list_for_each_safe over a list whose entries may move to the tail: every entry
        // met leaves position 0 (removed, or rotated to the tail), so the next entry is
        // always at 0; a rotated last entry ends the walk (its `next` was the head).
        let pos = 0;
        while pos < l.len() && budget > 0 {
            budget -= 1;
            let o = l[pos];
            let m = &mut self.objs[o];
            if m.count > 0 || m.flags & !I_REFERENCED != 0 {
                // In use or busy: list_lru_isolate, LRU_REMOVED (not evicted).
                l.remove(pos);
                m.lru = false;
                freed += 1;
            } else if m.flags & I_REFERENCED != 0 {
                // Second chance: clear I_REFERENCED, LRU_ROTATE to the tail.
                m.flags &= !I_REFERENCED;
                let last = pos + 1 == l.len();
                l.remove(pos);
                l.push_back(o);
                if last {
                    break;
                }
            } else {
                // I_FREEING, isolate onto the dispose list, LRU_REMOVED.
                m.flags |= I_FREEING;
                m.lru = false;
                l.remove(pos);
                dispose.push(o);
                freed += 1;
            }
        }
        self.lru.insert(sb.to_string(), l);
        for o in dispose {
            self.evict(o, None);
        }
        freed
    }

    /// evict_inodes: every inode on the sb list with i_count 0 and not
    /// I_NEW/I_FREEING/I_WILL_FREE: I_FREEING, inode_lru_list_del, dispose_list.
    fn evict_inodes(&mut self, sb: &str) {
        let list: Vec<usize> = self
            .sb_list
            .get(sb)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        let mut dispose = Vec::new();
        for o in list {
            let m = &mut self.objs[o];
            if m.count > 0 || m.flags & (I_NEW | I_FREEING) != 0 {
                continue;
            }
            m.flags |= I_FREEING;
            if m.lru {
                self.lru_del(o);
            }
            dispose.push(o);
        }
        for o in dispose {
            self.evict(o, None);
        }
    }

    /// Woken tasks retry, in passes over the blocked steps in step order, until a pass
    /// finds none woken.
    fn settle(&mut self, completed: &mut BTreeMap<usize, Outcome>) {
        loop {
            let mut advanced = false;
            let steps: Vec<usize> = self.blocked.keys().copied().collect();
            for s in steps {
                let Some(b) = self.blocked.get(&s) else { continue };
                if !b.woken {
                    continue;
                }
                advanced = true;
                let b = self.blocked.remove(&s).expect("blocked");
                let a = match b.on {
                    WaitOn::Freeing(_) => self.run(&b.op),
                    WaitOn::New(o) => self.settle_found(&b.op, o),
                };
                match a {
                    Attempt::Done(out, obj) => {
                        self.tracker.unblock(&b.task);
                        let out = self.finish(b.name.as_deref(), out, obj);
                        completed.insert(s, out);
                    }
                    Attempt::Wait(on) => {
                        self.blocked.insert(
                            s,
                            Blocked {
                                on,
                                woken: false,
                                ..b
                            },
                        );
                    }
                }
            }
            if !advanced {
                return;
            }
        }
    }

    /// The blocked steps, for generators.
    pub fn blocked_steps(&self) -> HashSet<usize> {
        self.blocked.keys().copied().collect()
    }
}
