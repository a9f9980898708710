//! A lock call in progress: how its caller interrupts it, and how the service ends it
//! (fencing, `EDEADLK` across members).

use std::sync::Arc;

use vfscale_locks::{Errno, Interrupter};

use crate::sync::Mutex;

/// Called exactly once with a call's result.
pub type LockDone<T> = Box<dyn FnOnce(Result<T, Errno>) + Send>;

/// How an interrupt reaches a waiting call.
pub(crate) enum Hook {
    /// Not waiting yet (resolving its home, or on its way there).
    None,
    /// Waiting in a wait tree of this member.
    Local(Interrupter),
    /// Waiting at a remote home: runs the interrupt request to it.
    Remote(Box<dyn Fn() + Send + Sync>),
    /// Answered: interrupts have no effect.
    Finished,
}

struct CtlState {
    /// The errno an interrupted wait ends with (`EINTR`, or the service's `EIO` /
    /// `EDEADLK`); the first reason wins.
    reason: Option<Errno>,
    hook: Hook,
}

/// The shared control of one call that may wait.
pub(crate) struct CallCtl {
    state: Mutex<CtlState>,
}

impl CallCtl {
    pub fn new() -> Arc<CallCtl> {
        Arc::new(CallCtl {
            state: Mutex::new(CtlState {
                reason: None,
                hook: Hook::None,
            }),
        })
    }

    /// Ends the wait with `why` (unless it was answered or already ended): the wait
    /// answers `why` instead of a plain `EINTR`.
    pub fn interrupt(&self, why: Errno) {
        let mut st = self.state.lock();
        if matches!(st.hook, Hook::Finished) {
            return;
        }
        if st.reason.is_none() {
            st.reason = Some(why);
        }
        match &st.hook {
            Hook::Local(i) => i.interrupt(),
            Hook::Remote(f) => f(),
            Hook::None | Hook::Finished => {}
        }
    }

    /// Sets how to interrupt the wait from now on; runs it at once if an interrupt
    /// came first.
    pub fn set_hook(&self, hook: Hook) {
        let mut st = self.state.lock();
        if matches!(st.hook, Hook::Finished) {
            return;
        }
        st.hook = hook;
        if st.reason.is_some() {
            match &st.hook {
                Hook::Local(i) => i.interrupt(),
                Hook::Remote(f) => f(),
                Hook::None | Hook::Finished => {}
            }
        }
    }

    /// The reason of an interrupt that came, if any.
    pub fn reason(&self) -> Option<Errno> {
        self.state.lock().reason
    }

    /// The call is answered: `r` with an `EINTR` turned into the interrupt's reason.
    pub fn finish<T>(&self, r: Result<T, Errno>) -> Result<T, Errno> {
        let mut st = self.state.lock();
        st.hook = Hook::Finished;
        match r {
            Err(Errno::EINTR) => Err(st.reason.unwrap_or(Errno::EINTR)),
            r => r,
        }
    }
}

/// A call that may still be waiting. Dropping it does not cancel the call.
#[must_use = "keep it to interrupt the call"]
pub struct LockCall {
    ctl: Option<Arc<CallCtl>>,
}

impl LockCall {
    /// A call answered before it returned.
    pub(crate) fn answered() -> LockCall {
        LockCall { ctl: None }
    }

    pub(crate) fn waiting(ctl: Arc<CallCtl>) -> LockCall {
        LockCall { ctl: Some(ctl) }
    }

    /// Interrupts a waiting call, as a signal does: it answers `EINTR` unless it was
    /// granted (or answered) first. No effect on a call already answered.
    pub fn interrupt(&self) {
        if let Some(c) = &self.ctl {
            c.interrupt(Errno::EINTR);
        }
    }

    /// Whether the call was answered before it returned (so there is nothing to
    /// interrupt).
    pub fn is_answered(&self) -> bool {
        self.ctl.is_none()
    }
}

impl std::fmt::Debug for LockCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockCall")
            .field("answered", &self.ctl.is_none())
            .finish()
    }
}

#[cfg(all(test, vfscale_loom))]
mod loom_models {
    use super::*;
    use vfscale_sync::{Precedence, Waiter};

    /// The service ends a call (`EDEADLK` across members) while the call is parking in
    /// a wait tree: the wait is interrupted whichever comes first, and the call answers
    /// the service's reason, not a plain `EINTR`.
    #[test]
    fn loom_an_end_racing_the_park_reaches_the_wait() {
        loom::model(|| {
            let w = vfscale_sync::Arc::new(Waiter::new(Precedence::Interrupt, ()));
            let ctl = CallCtl::new();
            let c = ctl.clone();
            let t = loom::thread::spawn(move || c.interrupt(Errno::EDEADLK));
            ctl.set_hook(Hook::Local(Interrupter::new(&w)));
            t.join().unwrap();
            assert!(w.lock().interrupted());
            assert_eq!(ctl.finish::<()>(Err(Errno::EINTR)), Err(Errno::EDEADLK));
        });
    }
}
