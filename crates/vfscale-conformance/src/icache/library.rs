//! Replays an inode-cache scenario against `vfscale-icache` itself.
//!
//! Every call that may wait goes through the library's non-blocking start
//! (`iget_locked_start`, ...) and is driven from this thread with `poll_complete`: after
//! each step the runner polls the woken waits, in passes over the blocked steps in step
//! order, until a pass finds none woken (as the model does).
//!
//! `hold_evict`: the runner's filesystem operations can stop in `->evict_inode` (as a
//! filesystem with slow eviction does). A call with `hold_evict` runs on a helper thread
//! that arms the hold; if its eviction starts, `->evict_inode` reports it and sleeps until
//! `finish_evict` releases it. The helper holds no cache lock while it sleeps, so the
//! replay goes on on this thread, and the order of events stays the step order.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vfscale_icache::{
    Iget, Inode, InodeCache, InodeRef, InodeWait, InsertBusy, Lru, Match, NewInode, Settings, Started,
    SuperBlock, SuperOperations,
};

use super::format::{warn, Op, Outcome, Scenario, StateOf, StateView, Step, StepResult, Tracker};
use crate::format::ScenarioError;

/// The runner's inode data: the object number (`obj` in results).
#[derive(Debug)]
pub struct RunnerInode {
    obj: u64,
}

enum HoldMsg {
    Held,
    Done,
}

thread_local! {
    /// Set on a helper thread whose call may hold its eviction: where to report, and
    /// where to wait for `finish_evict`.
    static HOLD: RefCell<Option<(Sender<HoldMsg>, Receiver<()>)>> = const { RefCell::new(None) };
}

/// The runner's filesystem: numbers objects, logs evictions, holds an eviction on demand.
#[derive(Debug, Default)]
pub struct RunnerFs {
    next_obj: Arc<AtomicU64>,
    evicted: Arc<Mutex<Vec<u64>>>,
}

impl SuperOperations for RunnerFs {
    type Data = RunnerInode;

    fn alloc_inode(&self, _ino: u64) -> RunnerInode {
        RunnerInode {
            obj: self.next_obj.fetch_add(1, Ordering::SeqCst) + 1,
        }
    }

    fn evict_inode(&self, inode: &Inode<Self>) {
        self.evicted.lock().unwrap().push(inode.ino());
        HOLD.with(|h| {
            let hold = h.borrow_mut().take();
            if let Some((tx, rx)) = hold {
                let _ = tx.send(HoldMsg::Held);
                let _ = rx.recv();
                // Give the channel back so the helper can report Done.
                *h.borrow_mut() = Some((tx, rx));
            }
        });
    }
}

type Fs = RunnerFs;

enum Pending {
    Iget(InodeWait<Fs, Option<Iget<Fs>>>),
    Lookup(InodeWait<Fs, Option<InodeRef<Fs>>>),
    Insert(InodeWait<Fs, Result<NewInode<Fs>, InsertBusy<Fs>>>),
}

struct Blocked {
    task: String,
    name: String,
    wait: Pending,
}

struct Held {
    step: usize,
    release: Sender<()>,
    done: Receiver<HoldMsg>,
    thread: JoinHandle<()>,
}

/// A replay in progress, one step at a time.
pub struct LibraryReplay {
    tracker: Tracker,
    cache: InodeCache<Fs>,
    next_obj: Arc<AtomicU64>,
    evicted: Arc<Mutex<Vec<u64>>>,
    sbs: BTreeMap<String, SuperBlock<Fs>>,
    refs: HashMap<String, InodeRef<Fs>>,
    hashed_before: HashSet<u64>,
    blocked: BTreeMap<usize, Blocked>,
    held: HashMap<String, Held>,
    next: usize,
}

/// The settings the replay uses: the defaults, with one LRU list per superblock (the
/// spec's single NUMA node) and a small hash table.
pub fn replay_settings() -> Settings {
    Settings {
        lru: Lru::Single,
        hash_bits: 6,
        ..Settings::default()
    }
}

/// Replays a scenario against the library.
///
/// ```
/// use vfscale_conformance::icache::{library, render_results, Scenario};
/// let s = Scenario::parse(concat!(
///     r#"{"op":"iget","task":"t1","ino":5,"ref":"r1"}"#, "\n",
///     r#"{"op":"iget","task":"t2","ino":5,"ref":"r2"}"#, "\n",
///     r#"{"op":"unlock_new","task":"t1","ref":"r1"}"#, "\n",
///     r#"{"op":"state","ino":5}"#, "\n",
/// )).unwrap();
/// let out = render_results(&library::replay(&s).unwrap());
/// assert!(out.ends_with("{\"step\":3,\"result\":{\"obj\":1,\"count\":2,\"nlink\":1,\"state\":[],\"hashed\":true,\"lru\":false}}\n"));
/// ```
pub fn replay(scn: &Scenario) -> Result<Vec<StepResult>, ScenarioError> {
    replay_with(scn, replay_settings())
}

/// Replays with other settings (`lru` should stay `Single` for the spec's order).
pub fn replay_with(scn: &Scenario, settings: Settings) -> Result<Vec<StepResult>, ScenarioError> {
    let mut r = LibraryReplay::new(settings);
    scn.steps.iter().map(|s| r.apply(s)).collect()
}

impl LibraryReplay {
    /// A fresh replay.
    pub fn new(settings: Settings) -> Self {
        LibraryReplay {
            tracker: Tracker::new(),
            cache: InodeCache::new(settings),
            next_obj: Arc::new(AtomicU64::new(0)),
            evicted: Arc::new(Mutex::new(Vec::new())),
            sbs: BTreeMap::new(),
            refs: HashMap::new(),
            hashed_before: HashSet::new(),
            blocked: BTreeMap::new(),
            held: HashMap::new(),
            next: 0,
        }
    }

    /// The cache's counters (for the lab and tests).
    pub fn cache(&self) -> &InodeCache<Fs> {
        &self.cache
    }

    fn sb(&mut self, name: &str) -> &SuperBlock<Fs> {
        if !self.sbs.contains_key(name) {
            let sb = self.cache.mount(RunnerFs {
                next_obj: self.next_obj.clone(),
                evicted: self.evicted.clone(),
            });
            self.sbs.insert(name.to_string(), sb);
        }
        &self.sbs[name]
    }

    /// Applies the next step and settles the woken waits.
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

    fn check_warn(&self, step: &Step) -> Result<(), ScenarioError> {
        warn::check(step, |r| {
            let inode = &self.refs[r];
            let s = inode.state();
            warn::InodeFacts {
                new: s.flags.contains(vfscale_icache::InodeFlags::NEW),
                nlink: s.nlink,
                count: s.count,
                hashed_before: self.hashed_before.contains(&inode.data().obj),
            }
        })
    }

    fn bind(&mut self, name: &str, r: InodeRef<Fs>) {
        self.refs.insert(name.to_string(), r);
        self.tracker.bind(name);
    }

    /// The outcome of a finished iget/ilookup/insert, binding its reference.
    fn finish(&mut self, name: &str, p: Done) -> Outcome {
        match p {
            Done::Iget(None) | Done::Lookup(None) => Outcome::Null,
            Done::Iget(Some(Iget::Cached(r))) => {
                let obj = r.data().obj;
                self.bind(name, r);
                Outcome::Iget { obj, new: false }
            }
            Done::Iget(Some(Iget::New(n))) => {
                let r = n.into_inner();
                let obj = r.data().obj;
                self.hashed_before.insert(obj);
                self.bind(name, r);
                Outcome::Iget { obj, new: true }
            }
            Done::Lookup(Some(r)) => {
                let obj = r.data().obj;
                self.bind(name, r);
                Outcome::Obj(obj)
            }
            Done::Insert(Ok(n)) => {
                let r = n.into_inner();
                self.hashed_before.insert(r.data().obj);
                self.refs.insert(name.to_string(), r);
                Outcome::Ok
            }
            Done::Insert(Err(b)) => {
                self.refs.insert(name.to_string(), b.inode);
                Outcome::Ebusy
            }
        }
    }

    fn started(&mut self, i: usize, task: &str, name: &str, s: StartedAny) -> Outcome {
        let wait = match s {
            StartedAny::Done(d) => return self.finish(name, d),
            StartedAny::Wait(w) => w,
        };
        let insert_ref = matches!(wait, Pending::Insert(_)).then_some(name);
        self.tracker.block(task, i, false, insert_ref);
        self.blocked.insert(
            i,
            Blocked {
                task: task.to_string(),
                name: name.to_string(),
                wait,
            },
        );
        Outcome::Blocked
    }

    /// Runs `f` (a call that may evict) on a helper thread that holds the eviction it
    /// starts; `"blocked"` if it did, `"ok"` when the call finished.
    fn held_call(&mut self, i: usize, task: &str, f: Box<dyn FnOnce() + Send>) -> Outcome {
        let (tx, rx) = channel();
        let (rel_tx, rel_rx) = channel();
        let thread = std::thread::spawn(move || {
            HOLD.with(|h| *h.borrow_mut() = Some((tx, rel_rx)));
            f();
            HOLD.with(|h| {
                let (tx, _) = h.borrow_mut().take().expect("hold state");
                let _ = tx.send(HoldMsg::Done);
            });
        });
        match rx.recv() {
            Ok(HoldMsg::Held) => {
                self.tracker.block(task, i, true, None);
                self.held.insert(
                    task.to_string(),
                    Held {
                        step: i,
                        release: rel_tx,
                        done: rx,
                        thread,
                    },
                );
                Outcome::Blocked
            }
            Ok(HoldMsg::Done) | Err(_) => {
                thread.join().expect("the held call panicked");
                Outcome::Ok
            }
        }
    }

    fn step(&mut self, i: usize, step: &Step, completed: &mut BTreeMap<usize, Outcome>) -> Outcome {
        let task = step.op.task().to_string();
        match &step.op {
            Op::Iget { sb, ino, r, .. } => {
                let s = StartedAny::iget(self.sb(sb).iget_locked_start(*ino));
                self.started(i, &task, r, s)
            }
            Op::Ilookup { sb, ino, r, .. } => {
                let s = StartedAny::lookup(self.sb(sb).ilookup_start(*ino));
                self.started(i, &task, r, s)
            }
            Op::NewInode { sb, ino, r, .. } => {
                let x = self.sb(sb).new_inode(*ino);
                let obj = x.data().obj;
                self.bind(r, x);
                Outcome::Obj(obj)
            }
            Op::InsertLocked { r, .. } => {
                let x = self.refs.remove(r).expect("live");
                let sb = self
                    .sbs
                    .values()
                    .find(|s| s.dev() == x.sb_dev())
                    .expect("the inode's superblock");
                let s = StartedAny::insert(sb.insert_inode_locked_start(x));
                self.started(i, &task, r, s)
            }
            Op::UnlockNew { r, .. } => {
                self.refs[r].unlock_new_inode();
                Outcome::Ok
            }
            Op::DiscardNew { r, hold, .. } => {
                let x = self.refs.remove(r).expect("live");
                if *hold {
                    self.held_call(i, &task, Box::new(move || x.discard_new_inode()))
                } else {
                    x.discard_new_inode();
                    Outcome::Ok
                }
            }
            Op::IgetFailed { r, hold, .. } => {
                let x = self.refs.remove(r).expect("live");
                if *hold {
                    self.held_call(i, &task, Box::new(move || x.iget_failed()))
                } else {
                    x.iget_failed();
                    Outcome::Ok
                }
            }
            Op::Ihold { r, new, .. } => {
                let x = self.refs[r].ihold();
                self.bind(new, x);
                Outcome::Ok
            }
            Op::Iput { r, hold, .. } => {
                let x = self.refs.remove(r).expect("live");
                if *hold {
                    self.held_call(i, &task, Box::new(move || drop(x)))
                } else {
                    drop(x);
                    Outcome::Ok
                }
            }
            Op::FinishEvict { .. } => {
                let h = self.held.remove(&task).expect("held");
                let _ = h.release.send(());
                let _ = h.done.recv();
                h.thread.join().expect("the held call panicked");
                self.tracker.unblock(&task);
                completed.insert(h.step, Outcome::Ok);
                Outcome::Ok
            }
            Op::Unhash { r, .. } => {
                self.refs[r].remove_inode_hash();
                Outcome::Ok
            }
            Op::SetNlink { r, nlink, .. } => {
                self.refs[r].set_nlink(*nlink);
                Outcome::Ok
            }
            Op::DropNlink { r, .. } => {
                self.refs[r].drop_nlink();
                Outcome::Ok
            }
            Op::ClearNlink { r, .. } => {
                self.refs[r].clear_nlink();
                Outcome::Ok
            }
            Op::Dontcache { r, .. } => {
                self.refs[r].mark_dontcache();
                Outcome::Ok
            }
            Op::Prune { sb, count, .. } => {
                self.evicted.lock().unwrap().clear();
                let freed = self
                    .sb(sb)
                    .prune_icache_sb(usize::try_from(*count).unwrap_or(usize::MAX));
                let mut ev = std::mem::take(&mut *self.evicted.lock().unwrap());
                ev.sort_unstable();
                Outcome::Prune {
                    freed: freed as u64,
                    evicted: ev,
                }
            }
            Op::Umount { sb, .. } => {
                self.sb(sb);
                self.evicted.lock().unwrap().clear();
                self.sbs[sb].umount();
                let mut ev = std::mem::take(&mut *self.evicted.lock().unwrap());
                ev.sort_unstable();
                Outcome::Umount(ev)
            }
            Op::State { of, .. } => match of {
                StateOf::Ref(r) => Outcome::State(view(&self.refs[r])),
                StateOf::Key { sb, ino } => {
                    let mut seen = None;
                    self.sb(sb).find_inode_nowait(*ino, |i| {
                        seen = Some(view(i));
                        Match::Stop
                    });
                    seen.map_or(Outcome::Null, Outcome::State)
                }
            },
            Op::Lru { sb, .. } => Outcome::Lru(self.sb(sb).lru_inos()),
            Op::Stats { .. } => {
                let s = self.cache.stats();
                Outcome::Stats {
                    nr_inodes: s.nr_inodes,
                    nr_unused: s.nr_unused,
                }
            }
        }
    }

    /// Polls the woken waits, in passes in step order, until a pass finds none woken.
    fn settle(&mut self, completed: &mut BTreeMap<usize, Outcome>) {
        loop {
            let mut advanced = false;
            let steps: Vec<usize> = self.blocked.keys().copied().collect();
            for s in steps {
                let b = self.blocked.get_mut(&s).expect("blocked");
                let woken = match &b.wait {
                    Pending::Iget(w) => w.is_woken(),
                    Pending::Lookup(w) => w.is_woken(),
                    Pending::Insert(w) => w.is_woken(),
                };
                if !woken {
                    continue;
                }
                advanced = true;
                let done = match &mut b.wait {
                    Pending::Iget(w) => w.poll_complete().map(|r| Done::Iget(r.expect("not interrupted"))),
                    Pending::Lookup(w) => w
                        .poll_complete()
                        .map(|r| Done::Lookup(r.expect("not interrupted"))),
                    Pending::Insert(w) => w
                        .poll_complete()
                        .map(|r| Done::Insert(r.expect("not interrupted"))),
                };
                if let Some(d) = done {
                    let b = self.blocked.remove(&s).expect("blocked");
                    self.tracker.unblock(&b.task);
                    let out = self.finish(&b.name, d);
                    completed.insert(s, out);
                }
            }
            if !advanced {
                return;
            }
        }
    }
}

impl Drop for LibraryReplay {
    fn drop(&mut self) {
        // Let held evictions finish before the cache goes.
        for (_, h) in self.held.drain() {
            let _ = h.release.send(());
            let _ = h.done.recv();
            let _ = h.thread.join();
        }
        // A replay that stopped (an error, or a scenario that ended mid-load) may leave
        // I_NEW inodes: end their loads so that the last iput is legal.
        for b in self.blocked.values() {
            let r = match &b.wait {
                Pending::Iget(w) => w.waiting_on(),
                Pending::Lookup(w) => w.waiting_on(),
                Pending::Insert(w) => w.waiting_on(),
            };
            if let Some(r) = r {
                if r.state().flags.contains(vfscale_icache::InodeFlags::NEW) {
                    r.unlock_new_inode();
                }
            }
        }
        self.blocked.clear();
        for r in self.refs.values() {
            if r.state().flags.contains(vfscale_icache::InodeFlags::NEW) {
                r.unlock_new_inode();
            }
        }
        self.refs.clear();
    }
}

fn view(i: &Inode<Fs>) -> StateView {
    let s = i.state();
    // Only the flags the format shows (I_CLEAR and I_WILL_FREE are never observable
    // between steps).
    let state = s
        .flags
        .names()
        .into_iter()
        .filter(|n| {
            matches!(
                *n,
                "I_CREATING" | "I_DONTCACHE" | "I_FREEING" | "I_NEW" | "I_REFERENCED"
            )
        })
        .map(str::to_string)
        .collect();
    StateView {
        obj: i.data().obj,
        count: s.count,
        nlink: s.nlink,
        state,
        hashed: s.hashed,
        lru: s.on_lru,
    }
}

enum Done {
    Iget(Option<Iget<Fs>>),
    Lookup(Option<InodeRef<Fs>>),
    Insert(Result<NewInode<Fs>, InsertBusy<Fs>>),
}

enum StartedAny {
    Done(Done),
    Wait(Pending),
}

impl StartedAny {
    fn iget(s: Started<Option<Iget<Fs>>, Fs>) -> Self {
        match s {
            Started::Done(d) => StartedAny::Done(Done::Iget(d)),
            Started::Wait(w) => StartedAny::Wait(Pending::Iget(w)),
        }
    }
    fn lookup(s: Started<Option<InodeRef<Fs>>, Fs>) -> Self {
        match s {
            Started::Done(d) => StartedAny::Done(Done::Lookup(d)),
            Started::Wait(w) => StartedAny::Wait(Pending::Lookup(w)),
        }
    }
    fn insert(s: Started<Result<NewInode<Fs>, InsertBusy<Fs>>, Fs>) -> Self {
        match s {
            Started::Done(d) => StartedAny::Done(Done::Insert(d)),
            Started::Wait(w) => StartedAny::Wait(Pending::Insert(w)),
        }
    }
}
