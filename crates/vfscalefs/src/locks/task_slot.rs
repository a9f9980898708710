//! A parked task's slot: lets any thread that is woken for a task poll it, one at a time,
//! without losing a wake-up that comes while another polls it.
//!
//! States: `Idle(task)` → (claim) → `Running { woken: false }` → (unclaim) → `Idle`, or
//! → (finish) → `Done`. A claim that finds `Running` sets `woken` and returns nothing;
//! the thread that has the task then sees `woken` as it gives the task back and polls it
//! again. Every transition is made under the slot's mutex, so a wake-up either finds the
//! task `Running` (and is noted) or `Idle` (and claims it): there is no moment between.
//! `Done` is final: a task is answered once.

use vfscale_sync::Mutex;

enum State<T> {
    /// Parked, waiting for a wake-up.
    Idle(T),
    /// A thread polls or answers it; `woken`: a wake-up came meanwhile.
    Running { woken: bool },
    /// Answered.
    Done,
}

/// One parked task (see the module docs).
pub(crate) struct TaskSlot<T> {
    state: Mutex<State<T>>,
}

impl<T> TaskSlot<T> {
    /// A parked task.
    pub(crate) fn new(task: T) -> TaskSlot<T> {
        TaskSlot {
            state: Mutex::new(State::Idle(task)),
        }
    }

    /// Takes the task to poll it; `None` if it is done, or another thread has it (which
    /// is told to poll again).
    pub(crate) fn claim(&self) -> Option<T> {
        let mut st = self.state.lock();
        match std::mem::replace(&mut *st, State::Running { woken: true }) {
            State::Idle(task) => {
                *st = State::Running { woken: false };
                Some(task)
            }
            State::Running { .. } => None,
            State::Done => {
                *st = State::Done;
                None
            }
        }
    }

    /// Gives a claimed task back, parked; true if it was woken while claimed (the caller
    /// claims and polls it again).
    pub(crate) fn unclaim(&self, task: T) -> bool {
        let mut st = self.state.lock();
        let woken = matches!(*st, State::Running { woken: true });
        *st = State::Idle(task);
        woken
    }

    /// A claimed task is done: no claim gets it again.
    pub(crate) fn finish(&self) {
        let mut st = self.state.lock();
        debug_assert!(matches!(*st, State::Running { .. }), "finish without a claim");
        *st = State::Done;
    }
}

#[cfg(all(test, vfscale_loom))]
mod loom_tests {
    //! `cargo test -p vfscalefs --release --lib loom` with `RUSTFLAGS="--cfg vfscale_loom"`.

    use super::TaskSlot;
    use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use loom::sync::Arc;

    /// The model's task: what a direct hand-off recorded (its poll's result).
    struct Task {
        result: Option<bool>,
    }

    struct Model {
        slot: TaskSlot<Task>,
        /// The lock the task waits for was granted.
        ready: AtomicBool,
        answers: AtomicUsize,
    }

    impl Model {
        /// What a wake-up's thread does (the driver's or an inline scope's step): poll
        /// until the task parks again or is done; answer it when done.
        fn step(&self) {
            let Some(mut task) = self.slot.claim() else {
                return;
            };
            loop {
                let ready = task
                    .result
                    .take()
                    .unwrap_or_else(|| self.ready.load(Ordering::SeqCst));
                if ready {
                    self.slot.finish();
                    self.answers.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                if !self.slot.unclaim(task) {
                    return;
                }
                match self.slot.claim() {
                    Some(t) => task = t,
                    None => return,
                }
            }
        }

        /// A direct hand-off: polls and records the result, answering nothing; what it
        /// found done or woken meanwhile is sent on (here: stepped).
        fn hand_off(&self) {
            let Some(mut task) = self.slot.claim() else {
                return;
            };
            let ready = self.ready.load(Ordering::SeqCst);
            if ready {
                task.result = Some(true);
            }
            if self.slot.unclaim(task) || ready {
                self.step();
            }
        }
    }

    /// The first poll (the parking thread's), a grant's wake-up and a direct hand-off
    /// race: the task is answered exactly once.
    #[test]
    fn loom_a_wake_up_during_a_poll_is_not_lost() {
        loom::model(|| {
            let m = Arc::new(Model {
                slot: TaskSlot::new(Task { result: None }),
                ready: AtomicBool::new(false),
                answers: AtomicUsize::new(0),
            });
            let parker = {
                let m = m.clone();
                loom::thread::spawn(move || m.step())
            };
            let granter = {
                let m = m.clone();
                loom::thread::spawn(move || {
                    m.ready.store(true, Ordering::SeqCst);
                    m.step();
                })
            };
            m.hand_off();
            parker.join().unwrap();
            granter.join().unwrap();
            assert_eq!(m.answers.load(Ordering::SeqCst), 1);
            assert!(m.slot.claim().is_none(), "a done task was claimed");
        });
    }
}
