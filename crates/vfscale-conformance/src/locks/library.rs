//! Replays a lock scenario against this library: processes and open file descriptions
//! become [`Process`] and [`OpenFile`] keys, files become [`FileLockContext`]s.
//!
//! Waiting calls are [`PendingLock`]s driven from this one thread: after every step the
//! runner settles, trying again every request that was woken until none is left, which
//! is what the kernel's woken tasks do on their own before the kernel runner looks.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::format::{
    canonical_listing, LockPid, NamedListing, Op, Outcome, Resolved, Scenario, ScenarioError, Step,
    StepResult, Tracker,
};
use vfscale_locks::{
    ContextStats, FileId, FileLockContext, Flock, InodeKey, LockManager, LockType, OpenFile, PendingLock,
    Process, Settings,
};
use vfscale_locks::{LockKind, LockRecord};

/// Replays `scn` with the library's default settings.
///
/// ```
/// use vfscale_conformance::locks::{library, render_results, Scenario};
/// let s = Scenario::parse(concat!(
///     r#"{"op":"open","proc":"p1","file":"a","fd":"d1","mode":"rw"}"#, "\n",
///     r#"{"op":"open","proc":"p2","file":"a","fd":"d2","mode":"rw"}"#, "\n",
///     r#"{"op":"fcntl","fd":"d1","cmd":"F_SETLK","type":"F_WRLCK","start":0,"len":10}"#, "\n",
///     r#"{"op":"fcntl","fd":"d2","cmd":"F_SETLKW","type":"F_WRLCK","start":5,"len":1}"#, "\n",
///     r#"{"op":"close","fd":"d1"}"#, "\n",
/// )).unwrap();
/// let out = render_results(&library::replay(&s).unwrap());
/// assert!(out.ends_with("{\"step\":4,\"result\":\"ok\",\"completed\":[{\"step\":3,\"result\":\"ok\"}]}\n"));
/// ```
pub fn replay(scn: &Scenario) -> Result<Vec<StepResult>, ScenarioError> {
    replay_with(scn, Settings::default())
}

/// Replays `scn` with the given experiment settings.
pub fn replay_with(scn: &Scenario, settings: Settings) -> Result<Vec<StepResult>, ScenarioError> {
    replay_with_listing(scn, settings).map(|(r, _)| r)
}

/// Replays `scn` and returns, with the results, the lock listing after the last step.
pub fn replay_with_listing(
    scn: &Scenario,
    settings: Settings,
) -> Result<(Vec<StepResult>, Vec<NamedListing>), ScenarioError> {
    let mut r = LibraryReplay::new(settings);
    let results = scn
        .steps
        .iter()
        .map(|step| r.apply(step))
        .collect::<Result<_, _>>()?;
    Ok((results, r.listing()))
}

/// A replay in progress, one step at a time: for drivers that choose the next step from
/// the results so far (the random scenario generator does).
pub struct LibraryReplay {
    runner: Runner,
    next: usize,
}

impl LibraryReplay {
    /// A fresh replay.
    pub fn new(settings: Settings) -> LibraryReplay {
        LibraryReplay {
            runner: Runner::new(settings),
            next: 0,
        }
    }

    /// Applies the next step and settles.
    pub fn apply(&mut self, step: &Step) -> Result<StepResult, ScenarioError> {
        let r = &mut self.runner;
        let i = self.next;
        let resolved = r.tracker.resolve(i, step)?;
        self.next += 1;
        let result = r.step(i, &step.op, resolved);
        let completed = r.settle();
        Ok(StepResult::settled(i, result, completed, |r| {
            matches!(r, Outcome::Blocked)
        }))
    }

    /// The lock listing now, with scenario names (see [`NamedListing`]).
    pub fn listing(&self) -> Vec<NamedListing> {
        let line = |l: &NamedLock| {
            let kind = match l.kind {
                LockKind::Posix => "POSIX",
                LockKind::Ofd => "OFDLCK",
                LockKind::Flock => "FLOCK",
            };
            let ty = if l.ty == LockType::Write { "WRITE" } else { "READ" };
            let (start, end) = if l.kind == LockKind::Flock {
                ("0".to_string(), "EOF".to_string())
            } else if l.end == vfscale_locks::OFFSET_MAX {
                (l.start.to_string(), "EOF".to_string())
            } else {
                (l.start.to_string(), l.end.to_string())
            };
            NamedListing::line(kind, ty, &l.owner, &l.file, &start, &end)
        };
        let l = self
            .locks()
            .iter()
            .map(|(lock, waiters)| NamedListing {
                lock: line(lock),
                waiters: waiters
                    .iter()
                    .map(|(d, w)| NamedListing::waiter_prefix(*d) + &line(w))
                    .collect(),
            })
            .collect();
        canonical_listing(l)
    }

    /// The held locks now, each with its waiters depth first (with their depth, 1 for a
    /// direct waiter), in the library's listing order.
    pub fn locks(&self) -> Vec<(NamedLock, Vec<(usize, NamedLock)>)> {
        let r = &self.runner;
        let files: HashMap<u64, &str> = r
            .files
            .iter()
            .map(|(name, c)| (c.key().ino, name.as_str()))
            .collect();
        let named = |rec: &LockRecord| NamedLock {
            kind: rec.kind,
            ty: rec.ty,
            owner: match rec.pid {
                -1 => "-1".to_string(),
                p => r.pid_names.get(&p).cloned().unwrap_or_else(|| p.to_string()),
            },
            file: files.get(&rec.inode.ino).copied().unwrap_or("?").to_string(),
            start: rec.start,
            end: rec.end,
        };
        r.mgr
            .locks_listing()
            .iter()
            .map(|l| {
                let waiters = l.waiters.iter().map(|(d, w)| (*d, named(w))).collect();
                (named(&l.lock), waiters)
            })
            .collect()
    }

    /// The library's counters for `file` (see [`ContextStats`]), if the scenario opened
    /// it: what the steps so far cost the lock manager.
    pub fn file_stats(&self, file: &str) -> Option<ContextStats> {
        self.runner.files.get(file).map(|c| c.stats())
    }

    /// The processes with a blocked call, and that call's step.
    pub fn blocked(&self) -> Vec<(String, usize)> {
        self.runner
            .tracker
            .blocked()
            .map(|(p, s)| (p.to_string(), s))
            .collect()
    }
}

/// A lock or a waiting request of [`LibraryReplay::locks`], with scenario names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedLock {
    /// POSIX, OFD or flock.
    pub kind: LockKind,
    /// Read or write.
    pub ty: LockType,
    /// The owning process's name (for flock, the one that asked), `-1` for an OFD lock.
    pub owner: String,
    /// The file's name.
    pub file: String,
    /// First byte.
    pub start: i64,
    /// Last byte (inclusive), `OFFSET_MAX` to end of file.
    pub end: i64,
}

struct Fd {
    file: OpenFile,
    ctx: Arc<FileLockContext>,
}

struct Runner {
    mgr: Arc<LockManager>,
    tracker: Tracker,
    files: HashMap<String, Arc<FileLockContext>>,
    procs: HashMap<String, Process>,
    pid_names: HashMap<i32, String>,
    fds: HashMap<String, Fd>,
    /// Descriptors per open file description.
    ofd_refs: HashMap<FileId, usize>,
    /// Blocked calls by step, with their process.
    pending: BTreeMap<usize, (String, PendingLock)>,
    next_id: u32,
}

impl Runner {
    fn new(settings: Settings) -> Runner {
        Runner {
            mgr: LockManager::with_settings(settings),
            tracker: Tracker::new(),
            files: HashMap::new(),
            procs: HashMap::new(),
            pid_names: HashMap::new(),
            fds: HashMap::new(),
            ofd_refs: HashMap::new(),
            pending: BTreeMap::new(),
            next_id: 1000,
        }
    }

    fn fresh_id(&mut self) -> u32 {
        self.next_id += 1;
        self.next_id
    }

    /// Closes one descriptor: the process's POSIX locks on the inode go; the open file
    /// description's locks go with its last descriptor.
    fn close(&mut self, proc: &str, fd: &str) {
        let Some(d) = self.fds.remove(fd) else { return };
        d.ctx.posix_remove_owner(self.procs[proc]);
        let refs = self.ofd_refs.get_mut(&d.file.id).expect("open file counted");
        *refs -= 1;
        if *refs == 0 {
            self.ofd_refs.remove(&d.file.id);
            d.ctx.file_remove(d.file.id);
        }
    }

    fn step(&mut self, index: usize, op: &Op, resolved: Resolved) -> Outcome {
        match resolved {
            Resolved::Open {
                proc,
                file,
                fd,
                mode,
                new_proc,
            } => {
                if new_proc {
                    let id = self.fresh_id();
                    let p = Process::new(id);
                    self.procs.insert(proc.clone(), p);
                    self.pid_names.insert(p.pid.0, proc);
                }
                let ino = self.files.len() as u64 + 1;
                let mgr = self.mgr.clone();
                let ctx = self
                    .files
                    .entry(file)
                    .or_insert_with(|| {
                        FileLockContext::new(
                            &mgr,
                            InodeKey {
                                major: 0,
                                minor: 0,
                                ino,
                            },
                        )
                    })
                    .clone();
                let id = FileId(self.fresh_id() as u64);
                self.ofd_refs.insert(id, 1);
                let file = OpenFile {
                    id,
                    mode: mode.access(),
                };
                self.fds.insert(fd, Fd { file, ctx });
                Outcome::Ok
            }
            Resolved::Dup { fd, new, .. } => {
                let d = &self.fds[&fd];
                let (file, ctx) = (d.file, d.ctx.clone());
                *self.ofd_refs.get_mut(&file.id).expect("open file counted") += 1;
                self.fds.insert(new, Fd { file, ctx });
                Outcome::Ok
            }
            Resolved::Close { proc, fd, .. } => {
                self.close(&proc, &fd);
                Outcome::Ok
            }
            Resolved::Exit { proc, fds } => {
                for fd in fds {
                    self.close(&proc, &fd);
                }
                Outcome::Ok
            }
            Resolved::Interrupt { blocked, .. } => {
                if let Some((_, p)) = blocked.and_then(|s| self.pending.get(&s)) {
                    p.interrupter().interrupt();
                }
                Outcome::Ok
            }
            Resolved::Call { proc, fd, .. } => {
                let who = self.procs[&proc];
                let d = &self.fds[&fd];
                let (file, ctx) = (d.file, d.ctx.clone());
                let started = match op {
                    Op::Fcntl {
                        cmd, ty, start, len, ..
                    } => {
                        let mut fl = Flock::new(*ty, *start, *len);
                        let r = ctx.fcntl_lock(who, file, *cmd, &mut fl);
                        if cmd.is_get() {
                            return match r {
                                Err(e) => Outcome::Err(e),
                                Ok(_) => self.reported(&fl),
                            };
                        }
                        r
                    }
                    Op::Flock { how, nb, .. } => ctx.flock_lock(who, file, *how, *nb),
                    _ => unreachable!("resolved as a call"),
                };
                match started {
                    Err(e) => Outcome::Err(e),
                    Ok(None) => Outcome::Ok,
                    Ok(Some(p)) => {
                        self.tracker.set_blocked(&proc, index);
                        self.pending.insert(index, (proc, p));
                        Outcome::Blocked
                    }
                }
            }
        }
    }

    /// What `F_GETLK` found, with the owner's pid turned back into its name.
    fn reported(&self, fl: &Flock) -> Outcome {
        if fl.l_type == LockType::Unlock {
            return Outcome::NoLock;
        }
        let pid = if fl.l_pid == -1 {
            LockPid::Ofd
        } else {
            LockPid::Proc(
                self.pid_names
                    .get(&fl.l_pid)
                    .cloned()
                    .unwrap_or_else(|| fl.l_pid.to_string()),
            )
        };
        Outcome::Lock {
            ty: fl.l_type,
            start: fl.l_start,
            len: fl.l_len,
            pid,
        }
    }

    /// Tries every woken request again until none is left; returns the calls that
    /// finished, by step.
    fn settle(&mut self) -> BTreeMap<usize, Outcome> {
        let mut done = BTreeMap::new();
        loop {
            let mut progressed = false;
            let steps: Vec<usize> = self.pending.keys().copied().collect();
            for s in steps {
                let (_, p) = self.pending.get_mut(&s).expect("pending");
                if let Some(r) = p.poll_complete() {
                    let (proc, _) = self.pending.remove(&s).expect("pending");
                    self.tracker.clear_blocked(&proc);
                    done.insert(s, r.map_or_else(Outcome::Err, |()| Outcome::Ok));
                    progressed = true;
                }
            }
            if !progressed {
                return done;
            }
        }
    }
}
