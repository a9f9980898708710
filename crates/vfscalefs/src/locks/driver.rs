//! Parked lock requests: who polls them when `vfscale-locks` wakes them, and who answers
//! them once they are done.
//!
//! A `SETLKW` that has to wait is a [`Task`]: its [`PendingLock`] (a `Future`), its
//! reply, and what it does once granted, kept in its own waker ([`TaskWaker`]; no
//! table, so parking and waking take no lock shared by every inode). A wake-up finishes
//! it one of two ways:
//!
//! * **Inline.** A thread serving a lock request (an unlock, a close, an interrupt, a
//!   request that parks) holds an [`InlineScope`]: the tasks it wakes or parks meanwhile
//!   are polled, and answered when done, by that thread as the scope ends, once it holds
//!   no lock. The grant an unlock makes is answered with no hop to another thread (over
//!   io_uring, on the unlocker's own queue when the waiter's request came on it).
//! * **By the driver thread,** for wake-ups from anywhere else (a host wait's thread
//!   that parks its request among clients), and past [`INLINE_MAX`] tasks in one scope.
//!
//! # Invariants
//!
//! * A task is polled by one thread at a time, and a wake-up that comes meanwhile makes
//!   that thread poll again, so none is lost; a task is answered once (`task_slot.rs`,
//!   with its loom model).
//! * No task is polled while the polling thread holds a mirror's mutex, except by
//!   [`poll_woken`] (a direct hand-off, which only records the result): wake-ups under
//!   it are held back ([`hold_wakes`]) and sent as the mutex is unlocked.
//!
//! Lock order: a mirror's mutex, then a task's slot, then the driver's queue (no task is
//! polled or answered under the lock of its slot or of the queue).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use fuser::{Errno as FErrno, ReplyEmpty};
use parking_lot::{Condvar, Mutex};
use vfscale_locks::{Errno, PendingLock};

use super::task_slot::TaskSlot;
use super::{ferr, Interrupts};
use crate::mirror::HostWait;

/// At most this many tasks are finished inline at the end of one scope; the rest go to
/// the driver thread, so one unlock that wakes a crowd (shared flock holders) does not
/// hold up the requests behind it on its thread.
const INLINE_MAX: usize = 64;

/// What a parked request does once it is done, before it is answered (granted: true):
/// take its lock on the source. It gives the reply back to be answered as the request
/// ended, or keeps it (answered, or waiting on).
pub(crate) type TaskDone = Box<dyn FnOnce(bool, ReplyEmpty) -> Option<ReplyEmpty> + Send>;

/// A parked request.
pub(crate) struct Task {
    pending: PendingLock,
    reply: ReplyEmpty,
    intr: Arc<Interrupts>,
    unique: u64,
    done: Option<TaskDone>,
    /// Its result, when a direct hand-off ([`poll_woken`]) finished it.
    result: Option<Result<(), Errno>>,
    /// An exclusive flock request.
    flock_ex: bool,
}

struct DriverShared {
    /// Tasks for the driver thread to poll.
    queue: Mutex<VecDeque<Arc<TaskWaker>>>,
    cv: Condvar,
    /// Tasks the driver thread answered (not inline).
    answered: AtomicU64,
}

impl Task {
    /// A parked request's task, not polled yet.
    pub(crate) fn new(
        pending: PendingLock,
        reply: ReplyEmpty,
        intr: &Arc<Interrupts>,
        unique: u64,
        done: Option<TaskDone>,
        flock_ex: bool,
    ) -> Task {
        Task {
            pending,
            reply,
            intr: intr.clone(),
            unique,
            done,
            result: None,
            flock_ex,
        }
    }

    /// Its result, once it has one: the one a hand-off recorded, else a poll's.
    fn poll_result(&mut self, waker: &Waker) -> Option<Result<(), Errno>> {
        if let Some(r) = self.result.take() {
            return Some(r);
        }
        match Pin::new(&mut self.pending).poll(&mut Context::from_waker(waker)) {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        }
    }
}

/// Answers a done task (granted: `Ok`), after its `done` step.
fn answer(task: Task, r: Result<(), Errno>) {
    task.intr.unpark(task.unique);
    let reply = match task.done {
        Some(done) => done(r.is_ok(), task.reply),
        None => Some(task.reply),
    };
    match (r, reply) {
        (_, None) => {}
        (Ok(()), Some(reply)) => reply.ok(),
        (Err(e), Some(reply)) => reply.error(ferr(e)),
    }
}

/// A parked request and its waker: only the thread that claimed it polls it.
pub(crate) struct TaskWaker {
    /// Boxed: a claim moves the task out of its slot and back.
    slot: TaskSlot<Box<Task>>,
    driver: Arc<DriverShared>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        if !HELD_WAKES.with(|h| h.borrow_mut().add(self)) {
            self.send();
        }
    }
}

impl TaskWaker {
    /// To this thread's inline scope if it has one, else to the driver thread.
    pub(crate) fn send(self: &Arc<Self>) {
        if !INLINE.with(|q| q.borrow_mut().add(self)) {
            self.driver.queue.lock().push_back(self.clone());
            self.driver.cv.notify_one();
        }
    }

    /// Polls the task until it parks again or is done, and answers it when done; true if
    /// this call answered it.
    fn step(self: &Arc<Self>) -> bool {
        let Some(mut task) = self.slot.claim() else {
            return false;
        };
        let waker = Waker::from(self.clone());
        loop {
            if let Some(r) = task.poll_result(&waker) {
                self.slot.finish();
                answer(*task, r);
                return true;
            }
            if !self.slot.unclaim(task) {
                return false;
            }
            match self.slot.claim() {
                Some(t) => task = t,
                None => return false,
            }
        }
    }
}

/// A thread's list of tasks to send on, kept allocated from one use to the next.
struct TaskList {
    /// In use: [`TaskList::add`] keeps tasks.
    on: bool,
    list: VecDeque<Arc<TaskWaker>>,
}

impl TaskList {
    const fn new() -> TaskList {
        TaskList {
            on: false,
            list: VecDeque::new(),
        }
    }

    /// Keeps `w` if the list is in use.
    fn add(&mut self, w: &Arc<TaskWaker>) -> bool {
        if self.on {
            self.list.push_back(w.clone());
        }
        self.on
    }

    /// Starts using the list; false if it is in use already (by an outer caller).
    fn start(&mut self) -> bool {
        !std::mem::replace(&mut self.on, true)
    }
}

/// Stops using `list` and sends on, in order, what it kept.
fn send_all(list: &'static std::thread::LocalKey<RefCell<TaskList>>) {
    list.with(|l| l.borrow_mut().on = false);
    while let Some(w) = list.with(|l| l.borrow_mut().list.pop_front()) {
        w.send();
    }
}

thread_local! {
    /// The wake-ups of parked requests held back while this thread holds a mirror's
    /// mutex (see `MirrorGuard`).
    static HELD_WAKES: RefCell<TaskList> = const { RefCell::new(TaskList::new()) };
    /// The tasks this thread finishes as its [`InlineScope`] ends.
    static INLINE: RefCell<TaskList> = const { RefCell::new(TaskList::new()) };
}

/// Holds back this thread's wake-ups until [`send_held_wakes`]; false if they are held
/// already (by an outer caller, who sends them).
pub(crate) fn hold_wakes() -> bool {
    HELD_WAKES.with(|h| h.borrow_mut().start())
}

/// Whether this thread holds back wake-ups it made.
pub(crate) fn wakes_held() -> bool {
    HELD_WAKES.with(|h| !h.borrow().list.is_empty())
}

/// Stops holding wake-ups back and sends those held.
pub(crate) fn send_held_wakes() {
    send_all(&HELD_WAKES);
}

/// What [`poll_woken`] found.
#[derive(Default)]
pub(crate) struct HandOff {
    /// A woken request was granted.
    pub(crate) granted: bool,
    /// An exclusive flock request was granted.
    pub(crate) flock_ex: bool,
}

/// A direct hand-off (called under a mirror's mutex): polls the requests woken so far
/// while wake-ups are held, recording each one's result for whoever answers it; they
/// stay held, to be sent as the mutex is unlocked.
pub(crate) fn poll_woken() -> HandOff {
    let mut woken = HELD_WAKES.with(|h| std::mem::take(&mut h.borrow_mut().list));
    let mut out = HandOff::default();
    woken.retain(|w| {
        // Another thread has it: told to poll again, it goes on there.
        let Some(mut task) = w.slot.claim() else {
            return false;
        };
        if task.result.is_none() {
            task.result = task.poll_result(&Waker::from(w.clone()));
            let granted = task.result.as_ref().is_some_and(Result::is_ok);
            out.granted |= granted;
            out.flock_ex |= granted && task.flock_ex;
        }
        let finished = task.result.is_some();
        w.slot.unclaim(task) || finished
    });
    // Back in place (its allocation kept), after any wake-up made meanwhile.
    HELD_WAKES.with(|h| {
        let mut h = h.borrow_mut();
        let meanwhile = std::mem::replace(&mut h.list, woken);
        h.list.extend(meanwhile);
    });
    out
}

/// While it lives, the parked requests this thread wakes or parks are finished by the
/// thread when the scope is dropped (see the module docs). Taken at the top of a lock
/// request's handling, where the thread holds no lock; a scope inside another adds to
/// the outer one.
pub(crate) struct InlineScope {
    outer: bool,
}

impl InlineScope {
    pub(crate) fn enter() -> InlineScope {
        InlineScope {
            outer: INLINE.with(|q| q.borrow_mut().start()),
        }
    }
}

impl Drop for InlineScope {
    fn drop(&mut self) {
        if !self.outer {
            return;
        }
        // Ends the scope: what is left goes to the driver, also when a step panics.
        struct Rest;
        impl Drop for Rest {
            fn drop(&mut self) {
                send_all(&INLINE);
            }
        }
        let _rest = Rest;
        // A panic unwinding through the request leaves the tasks to the driver.
        for _ in 0..INLINE_MAX {
            if std::thread::panicking() {
                break;
            }
            let Some(w) = INLINE.with(|q| q.borrow_mut().list.pop_front()) else {
                break;
            };
            w.step();
        }
    }
}

/// The thread that finishes parked requests nobody finished inline.
#[derive(Clone)]
pub(crate) struct Driver {
    shared: Arc<DriverShared>,
}

impl Driver {
    /// Starts the driver thread. It runs for the life of the process.
    pub(crate) fn start() -> Driver {
        let shared = Arc::new(DriverShared {
            queue: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            answered: AtomicU64::new(0),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("vfscalefs-locks".into())
            .spawn(move || Driver::run(&s))
            .expect("spawn the lock driver thread");
        Driver { shared }
    }

    /// Parks `task`; its first poll (which registers its waker) is this thread's, in an
    /// inline scope, else the driver's.
    pub(crate) fn submit(&self, task: Task) {
        Arc::new(TaskWaker {
            slot: TaskSlot::new(Box::new(task)),
            driver: self.shared.clone(),
        })
        .send();
    }

    fn run(shared: &DriverShared) {
        loop {
            let w = {
                let mut q = shared.queue.lock();
                loop {
                    if let Some(w) = q.pop_front() {
                        break w;
                    }
                    shared.cv.wait(&mut q);
                }
            };
            if w.step() {
                shared.answered.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Parked requests the driver thread answered (the others were answered inline).
    pub(crate) fn answered(&self) -> u64 {
        self.shared.answered.load(Ordering::Relaxed)
    }

    /// A request that waited for the source in its own thread parks among clients now;
    /// `EINTR` (its `done` run) if it was interrupted meanwhile.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn after_host_wait(
        &self,
        intr: &Arc<Interrupts>,
        hw: &HostWait,
        unique: u64,
        pending: PendingLock,
        reply: ReplyEmpty,
        done: TaskDone,
        flock_ex: bool,
    ) {
        if !intr.repark(unique, hw, pending.interrupter()) {
            drop(pending); // abandons the request
            let reply = done(false, reply);
            intr.unpark(unique);
            if let Some(reply) = reply {
                reply.error(FErrno::EINTR);
            }
            return;
        }
        self.submit(Task::new(pending, reply, intr, unique, Some(done), flock_ex));
    }
}
