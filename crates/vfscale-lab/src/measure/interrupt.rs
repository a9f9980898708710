//! `SIGINT`, `SIGTERM` and `SIGHUP` during a workload that set something up on the
//! machine (loop devices, an etcd cluster and mounted servers): the signal only asks the
//! workload to stop, so its guards can undo what it set up; dropping the
//! [`SignalGuard`] then puts the previous dispositions back and raises the signal again,
//! so the process still ends as the user asked.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

/// The signal that interrupted a workload (0: none).
static INTERRUPTED_BY: AtomicI32 = AtomicI32::new(0);

/// A `fn()` the handler calls after recording the signal (0: none): it must be
/// async-signal-safe (store to atomics only).
static HOOK: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    INTERRUPTED_BY.store(sig, Ordering::SeqCst);
    let hook = HOOK.load(Ordering::SeqCst);
    if hook != 0 {
        // SAFETY: HOOK only ever holds 0 or a `fn()` stored by `SignalGuard::install`.
        let f: fn() = unsafe { std::mem::transmute::<usize, fn()>(hook) };
        f();
    }
}

const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Whether a signal asked the running workload to stop.
pub fn interrupted() -> bool {
    INTERRUPTED_BY.load(Ordering::SeqCst) != 0
}

/// The installed handlers (without `SA_RESTART`, so a blocked call returns `EINTR`);
/// dropping the guard puts the previous dispositions back and, if a signal came, raises
/// it again.
pub struct SignalGuard {
    old: Vec<(libc::c_int, libc::sigaction)>,
}

impl SignalGuard {
    /// Installs the handlers; `hook` (async-signal-safe: it may only store to atomics)
    /// runs in the handler after the signal is recorded, to wake the workload's own
    /// stop flag.
    pub fn install(hook: Option<fn()>) -> SignalGuard {
        HOOK.store(hook.map_or(0, |f| f as usize), Ordering::SeqCst);
        let mut old = Vec::new();
        for sig in SIGNALS {
            // SAFETY: zeroed sigactions are valid values; the handler only stores to
            // atomics (and calls the hook, which does the same), which is
            // async-signal-safe; the pointers are to locals.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
                libc::sigemptyset(&mut sa.sa_mask);
                let mut prev: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut prev) != 0
                    || prev.sa_sigaction == libc::SIG_IGN
                {
                    // An ignored signal (a background job's SIGINT) stays ignored.
                    continue;
                }
                if libc::sigaction(sig, &sa, std::ptr::null_mut()) == 0 {
                    old.push((sig, prev));
                }
            }
        }
        SignalGuard { old }
    }
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (sig, prev) in &self.old {
            // SAFETY: restores a disposition sigaction returned for this signal.
            unsafe {
                libc::sigaction(*sig, prev, std::ptr::null_mut());
            }
        }
        HOOK.store(0, Ordering::SeqCst);
        let sig = INTERRUPTED_BY.swap(0, Ordering::SeqCst);
        if sig != 0 {
            // SAFETY: raising a signal in this process, with its previous disposition.
            unsafe {
                libc::raise(sig);
            }
        }
    }
}
