//! Kernel runner: replays a descriptor scenario against the running Linux kernel.
//!
//! Each scenario process is a real process running the tiny program
//! `vfscale-fd-child` (`src/bin/vfscale-fd-child.rs`, which only calls [`child_main`]);
//! each step is the real system call made by that process on its own descriptor table.
//! Files are empty files in a fresh directory on tmpfs, opened read-only.
//!
//! # The control channel has no descriptor
//!
//! The runner and the scenario processes talk through one System V shared memory
//! segment (`shmget`/`shmat`), one `Slot` per live process, with futexes on the
//! slot's sequence numbers to wait. A System V segment is named by an integer id, not a
//! descriptor, and an attachment is part of the address space, not of the descriptor
//! table. So nothing a scenario does to its table can reach the channel:
//!
//! - `close`, `close_range(0, ~0)`, `dup2` onto any number: there is no control
//!   descriptor to close or replace, and none takes a number the scenario expects;
//! - `list` shows the whole table, and the table holds only the scenario's descriptors;
//! - a lowered `RLIMIT_NOFILE` cannot make the channel fail, since it opens nothing;
//! - `exec` replaces the address space, dropping the attachment: the new image is told
//!   the segment id and its slot on its command line (`resume <shmid> <slot>`), attaches
//!   again (Linux allows attaching a segment already marked for removal) and answers the
//!   `exec` command still pending in its slot;
//! - `fork` copies the attachment; the runner gives the new process a fresh slot, which
//!   the forking process switches to in the child before returning from the command.
//!
//! The runner marks the segment for removal (`IPC_RMID`) right after attaching it, so
//! the kernel frees it when the last process detaches, even if the runner is killed.
//!
//! `list` finds the open descriptors by asking `fcntl(F_GETFD)` of every number below
//! 1024 (the hard limit a process starts with, so every descriptor is below it) rather
//! than reading `/proc/self/fd`: opening that directory would itself take the lowest
//! free descriptor, show in the listing, and fail with `EMFILE` at a full table. Each
//! descriptor's file is identified by `fstat` (device and inode), which the runner maps
//! back to the scenario's name.
//!
//! The program is built with `#![no_main]`, so Rust's runtime start-up, which reopens
//! descriptors 0-2 on `/dev/null` when they are closed, never runs after an `exec`.
//!
//! # Processes
//!
//! `spawn` starts the program with `std::process::Command` (its descriptors 0, 1, 2 are
//! three files of the scratch directory, `stdin` read-only and the others write-only, as
//! a shell leaves a terminal); the program closes anything else it inherited, sets
//! `RLIMIT_NOFILE` to 1024 and asks to be killed with the runner. Each process is known
//! by a pidfd, so signals never reach a recycled pid. The runner makes itself a child
//! subreaper (`PR_SET_CHILD_SUBREAPER`), so that a forked process whose parent exits
//! becomes the runner's child and is reaped by it, not left to whatever pid 1 does; the
//! scenario processes ignore `SIGCHLD`, so their own children are reaped by the kernel.
//! On every exit path all processes are killed with `SIGKILL` and reaped, and the
//! scratch directory is removed.

use std::collections::{BTreeMap, HashMap};
use std::ffi::CStr;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use libc::{c_char, c_int, c_long};

use super::model::{ErrName, Listed, Op, Outcome, Scenario, Step, StepResult, Tracker, STD_NAMES};

/// Where the scratch directory is made.
const SCRATCH_PARENT: &str = "/dev/shm";

/// How long a process may take to answer a command (or to start, exec or exit).
const TIMEOUT: Duration = Duration::from_secs(10);

use crate::format::At;
pub use crate::format::ReplayError;
use crate::harness::{self, ScratchDir};

/// Whether the kernel target can run here with the child program `child_exe`; `Err`
/// says why not (no tmpfs at `/dev/shm`, no System V shared memory, no pidfds, the
/// program missing, ...). It spawns one process, lists its table and ends it.
pub fn available(child_exe: &Path) -> Result<(), String> {
    let scn = Scenario::parse(concat!(
        r#"{"op":"spawn","proc":"probe"}"#,
        "\n",
        r#"{"op":"list","proc":"probe"}"#,
        "\n",
        r#"{"op":"exit","proc":"probe"}"#,
        "\n"
    ))
    .map_err(|e| e.to_string())?;
    let got = replay(&scn, child_exe).map_err(|e| e.to_string())?;
    let want = Outcome::List(
        STD_NAMES
            .iter()
            .enumerate()
            .map(|(fd, name)| Listed {
                fd: fd as i32,
                name: name.to_string(),
                cloexec: false,
            })
            .collect(),
    );
    match got.get(1) {
        Some(r) if r.result == want => Ok(()),
        other => Err(format!(
            "a fresh process lists {other:?}, not descriptors 0, 1, 2"
        )),
    }
}

/// Replays `scn` against the running kernel: one result per step, in step order.
///
/// All processes are killed and reaped, and the scratch directory removed, whatever the
/// outcome.
pub fn replay(scn: &Scenario, child_exe: &Path) -> Result<Vec<StepResult>, ReplayError> {
    let mut runner = Runner::new(child_exe).map_err(ReplayError::Kernel)?;
    let mut out = Vec::with_capacity(scn.steps.len());
    for (index, step) in scn.steps.iter().enumerate() {
        let at = At {
            step: index,
            line: step.line,
        };
        let result = runner.step(at, step)?;
        out.push(StepResult::new(index, result));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// The shared segment
// ---------------------------------------------------------------------------------------

/// Live processes per replay.
const MAX_SLOTS: usize = 64;
/// Descriptors a process can have: the initial hard limit, which scenarios only lower.
const MAX_FDS: usize = 1024;
/// Room for the scratch directory's path, NUL included.
const DIR_LEN: usize = 256;

/// The segment: a header, then one slot per process.
#[repr(C)]
struct Shared {
    /// The runner's pid: a process whose futex wait times out checks that it lives.
    runner: AtomicI32,
    /// The scratch directory, NUL-terminated.
    dir: [AtomicU64; DIR_LEN / 8],
    slots: [Slot; MAX_SLOTS],
}

/// One process's mailbox. A command is pending while `cmd_seq != reply_seq`; the runner
/// fills the arguments and then bumps `cmd_seq`, the process fills the results and then
/// sets `reply_seq` to `cmd_seq` (release, acquire: the fields travel with the numbers).
#[repr(C)]
struct Slot {
    cmd_seq: AtomicU32,
    reply_seq: AtomicU32,
    op: AtomicI32,
    errno: AtomicI32,
    args: [AtomicI64; 3],
    ret: AtomicI64,
    /// `OP_LIST`: how many entries are filled.
    count: AtomicU32,
    entries: [Entry; MAX_FDS],
}

#[repr(C)]
struct Entry {
    fd: AtomicI32,
    flags: AtomicI32,
    dev: AtomicU64,
    ino: AtomicU64,
}

const OP_START: i32 = 1;
const OP_OPEN: i32 = 2;
const OP_DUP: i32 = 3;
const OP_DUP2: i32 = 4;
const OP_DUP3: i32 = 5;
const OP_DUPFD: i32 = 6;
const OP_GETFD: i32 = 7;
const OP_SETFD: i32 = 8;
const OP_CLOSE: i32 = 9;
const OP_CLOSE_RANGE: i32 = 10;
const OP_FORK: i32 = 11;
const OP_EXEC: i32 = 12;
const OP_SETRLIMIT: i32 = 13;
const OP_LIST: i32 = 14;
const OP_EXIT: i32 = 15;

/// `errno` values of the child program's own failures, never a system call's.
const E_NO_ROOM_FOR_LOADER: i32 = -1;
const E_START_CLOSE: i32 = -2;
const E_START_RLIMIT: i32 = -3;
const E_START_SIGNALS: i32 = -4;
const E_BAD_OP: i32 = -5;

const CLOSE_RANGE_UNSHARE: i64 = 1 << 1;
const CLOSE_RANGE_CLOEXEC: i64 = 1 << 2;

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as c_long,
    };
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call (in shared
    // memory, hence FUTEX_WAIT without FUTEX_PRIVATE_FLAG); `ts` lives across the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`; FUTEX_WAKE only reads the address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        );
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Attaches segment `id`; `None` on failure.
fn attach(id: c_int) -> Option<&'static Shared> {
    // SAFETY: shmat maps the segment anywhere; we check for failure below.
    let p = unsafe { libc::shmat(id, std::ptr::null(), 0) };
    if p as isize == -1 || p.is_null() {
        return None;
    }
    // SAFETY: the segment is at least `size_of::<Shared>()` bytes (the runner made it so),
    // page-aligned, zero-initialised or written only through these atomics, and stays
    // mapped until the process execs or exits; all-zero is a valid `Shared`.
    Some(unsafe { &*(p as *const Shared) })
}

// ---------------------------------------------------------------------------------------
// The child program. It is single-threaded, so after `fork` it may do anything; it
// avoids allocation and std I/O anyway, so that it never opens a descriptor of its own.
// ---------------------------------------------------------------------------------------

/// The child program's `main` (`vfscale-fd-child start|resume <shmid> <slot>`). Not for
/// other use: it serves commands until told to exit.
///
/// # Safety
///
/// `argv` must hold `argc` valid NUL-terminated strings, as `main` receives them, and
/// the process must be single-threaded.
#[doc(hidden)]
pub unsafe fn child_main(argc: c_int, argv: *const *const c_char) -> c_int {
    let arg = |i: c_int| -> &[u8] {
        if i >= argc {
            return b"";
        }
        // SAFETY: the caller promises `argc` valid strings.
        unsafe { CStr::from_ptr(*argv.offset(i as isize)).to_bytes() }
    };
    let (Some(id), Some(slot)) = (parse_num(arg(2)), parse_num(arg(3))) else {
        return 2;
    };
    let starting = match arg(1) {
        b"start" => true,
        b"resume" => false,
        _ => return 2,
    };
    if slot < 0 || slot >= MAX_SLOTS as i64 || id < 0 || id > i64::from(c_int::MAX) {
        return 2;
    }
    let Some(shared) = attach(id as c_int) else {
        return 3;
    };
    let mut slot = slot as usize;
    if starting {
        let s = &shared.slots[slot];
        let failed = child_start();
        s.errno.store(failed, Ordering::Relaxed);
        s.reply_seq
            .store(s.cmd_seq.load(Ordering::Acquire), Ordering::Release);
        futex_wake(&s.reply_seq);
        if failed != 0 {
            return 4;
        }
    } else {
        // The `exec` that brought us here is still pending: it succeeded.
        let s = &shared.slots[slot];
        s.ret.store(0, Ordering::Relaxed);
        s.errno.store(0, Ordering::Relaxed);
        s.reply_seq
            .store(s.cmd_seq.load(Ordering::Acquire), Ordering::Release);
        futex_wake(&s.reply_seq);
    }
    let id = id as c_int;
    loop {
        let s = &shared.slots[slot];
        let done = s.reply_seq.load(Ordering::Relaxed);
        let seq = s.cmd_seq.load(Ordering::Acquire);
        if seq == done {
            futex_wait(&s.cmd_seq, done, Duration::from_secs(1));
            // SAFETY: kill with signal 0 only checks that the runner exists.
            let runner = shared.runner.load(Ordering::Relaxed);
            if s.cmd_seq.load(Ordering::Acquire) == done
                && unsafe { libc::kill(runner, 0) } != 0
                && errno() == libc::ESRCH
            {
                // The runner is gone without ending us.
                return 0;
            }
            continue;
        }
        let op = s.op.load(Ordering::Relaxed);
        let a = [0, 1, 2].map(|i| s.args[i].load(Ordering::Relaxed));
        let (mut ret, mut err) = (0i64, 0i32);
        match op {
            OP_EXIT => {
                // SAFETY: ends the process at once.
                unsafe { libc::_exit(0) }
            }
            OP_FORK => {
                let new_slot = a[0];
                if new_slot < 0 || new_slot >= MAX_SLOTS as i64 {
                    err = E_BAD_OP;
                } else {
                    // SAFETY: the process is single-threaded.
                    match unsafe { libc::fork() } {
                        -1 => err = errno(),
                        0 => {
                            // The new process serves its own slot; the forking one
                            // answers the command.
                            slot = new_slot as usize;
                            continue;
                        }
                        pid => ret = i64::from(pid),
                    }
                }
            }
            OP_EXEC => err = child_exec(id, slot),
            OP_LIST => {
                let mut n = 0usize;
                for fd in 0..MAX_FDS as c_int {
                    // SAFETY: F_GETFD on any number is harmless.
                    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
                    if flags < 0 {
                        continue;
                    }
                    // SAFETY: all-zero is a valid `stat`, which fstat fills.
                    let mut st: libc::stat = unsafe { std::mem::zeroed() };
                    // SAFETY: `st` is a valid buffer for the call.
                    if unsafe { libc::fstat(fd, &mut st) } != 0 {
                        continue;
                    }
                    let e = &s.entries[n];
                    e.fd.store(fd, Ordering::Relaxed);
                    e.flags.store(flags, Ordering::Relaxed);
                    e.dev.store(st.st_dev, Ordering::Relaxed);
                    e.ino.store(st.st_ino, Ordering::Relaxed);
                    n += 1;
                }
                s.count.store(n as u32, Ordering::Relaxed);
            }
            _ => match child_syscall(shared, op, a) {
                Ok(r) => ret = r,
                Err(e) => err = e,
            },
        }
        s.ret.store(ret, Ordering::Relaxed);
        s.errno.store(err, Ordering::Relaxed);
        s.reply_seq.store(seq, Ordering::Release);
        futex_wake(&s.reply_seq);
    }
}

fn parse_num(s: &[u8]) -> Option<i64> {
    if s.is_empty() || s.len() > 18 {
        return None;
    }
    let mut n = 0i64;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n * 10 + i64::from(c - b'0');
    }
    Some(n)
}

/// The first start: close whatever was inherited above 2, set the limit, die with the
/// runner, let the kernel reap our children. Returns 0 or one of the `E_START_*`.
fn child_start() -> i32 {
    // SAFETY: plain system calls on integers and on a local struct.
    unsafe {
        if libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            0 as libc::c_uint,
        ) != 0
        {
            return E_START_CLOSE;
        }
        let lim = libc::rlimit {
            rlim_cur: MAX_FDS as libc::rlim_t,
            rlim_max: MAX_FDS as libc::rlim_t,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
            return E_START_RLIMIT;
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0
            || libc::signal(libc::SIGCHLD, libc::SIG_IGN) == libc::SIG_ERR
        {
            return E_START_SIGNALS;
        }
    }
    0
}

/// Writes `n` in decimal into `buf` followed by NUL; returns the used part.
fn fmt_num(buf: &mut [u8; 24], mut n: u64) -> &[u8] {
    let mut digits = [0u8; 20];
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[i] = digits[len - 1 - i];
    }
    buf[len] = 0;
    &buf[..=len]
}

/// `execve("/proc/self/exe", ["vfscale-fd-child", "resume", id, slot], [])`; returns
/// the errno if it fails. The dynamic loader of the new image opens its libraries one
/// at a time, so it needs one free descriptor below the soft limit: without one the
/// exec would kill the process, so it is refused with [`E_NO_ROOM_FOR_LOADER`].
fn child_exec(id: c_int, slot: usize) -> i32 {
    // SAFETY: plain system calls; every pointer passed is to a NUL-terminated local
    // buffer, and the argument vectors end with a null pointer.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return errno();
        }
        let room = (0..lim.rlim_cur.min(MAX_FDS as libc::rlim_t) as c_int)
            .any(|fd| libc::fcntl(fd, libc::F_GETFD) < 0);
        if !room {
            return E_NO_ROOM_FOR_LOADER;
        }
        let mut idbuf = [0u8; 24];
        let mut slotbuf = [0u8; 24];
        let id = fmt_num(&mut idbuf, id as u64).as_ptr();
        let slot = fmt_num(&mut slotbuf, slot as u64).as_ptr();
        let argv: [*const c_char; 5] = [
            c"vfscale-fd-child".as_ptr(),
            c"resume".as_ptr(),
            id.cast(),
            slot.cast(),
            std::ptr::null(),
        ];
        let envp: [*const c_char; 1] = [std::ptr::null()];
        libc::execve(c"/proc/self/exe".as_ptr(), argv.as_ptr(), envp.as_ptr());
        errno()
    }
}

/// The plain system calls. `Ok` is the call's return value.
fn child_syscall(shared: &Shared, op: i32, a: [i64; 3]) -> Result<i64, i32> {
    let fd = a[0] as c_int;
    // SAFETY: plain system calls on integers and on NUL-terminated local buffers.
    let r: c_long = unsafe {
        match op {
            OP_OPEN => {
                // "<dir>/f<n>"
                let mut path = [0u8; DIR_LEN + 32];
                let mut len = 0;
                'dir: for w in &shared.dir {
                    for b in w.load(Ordering::Relaxed).to_le_bytes() {
                        if b == 0 {
                            break 'dir;
                        }
                        path[len] = b;
                        len += 1;
                    }
                }
                path[len] = b'/';
                path[len + 1] = b'f';
                let mut num = [0u8; 24];
                let digits = fmt_num(&mut num, a[0] as u64);
                path[len + 2..len + 2 + digits.len()].copy_from_slice(digits);
                let flags = libc::O_RDONLY | if a[1] != 0 { libc::O_CLOEXEC } else { 0 };
                c_long::from(libc::open(path.as_ptr().cast(), flags))
            }
            OP_DUP => c_long::from(libc::dup(fd)),
            OP_DUP2 => c_long::from(libc::dup2(fd, a[1] as c_int)),
            OP_DUP3 => c_long::from(libc::dup3(
                fd,
                a[1] as c_int,
                if a[2] != 0 { libc::O_CLOEXEC } else { 0 },
            )),
            OP_DUPFD => {
                let cmd = if a[2] != 0 {
                    libc::F_DUPFD_CLOEXEC
                } else {
                    libc::F_DUPFD
                };
                // The kernel takes the minimum as an unsigned long: a negative one is huge.
                libc::syscall(libc::SYS_fcntl, fd, cmd, a[1] as c_long)
            }
            OP_GETFD => c_long::from(libc::fcntl(fd, libc::F_GETFD)),
            OP_SETFD => c_long::from(libc::fcntl(
                fd,
                libc::F_SETFD,
                if a[1] != 0 { libc::FD_CLOEXEC } else { 0 },
            )),
            OP_CLOSE => c_long::from(libc::close(fd)),
            OP_CLOSE_RANGE => libc::syscall(
                libc::SYS_close_range,
                a[0] as libc::c_uint,
                a[1] as libc::c_uint,
                a[2] as libc::c_uint,
            ),
            OP_SETRLIMIT => {
                let lim = libc::rlimit {
                    rlim_cur: a[0] as libc::rlim_t,
                    rlim_max: a[0] as libc::rlim_t,
                };
                c_long::from(libc::setrlimit(libc::RLIMIT_NOFILE, &lim))
            }
            _ => return Err(E_BAD_OP),
        }
    };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as i64)
    }
}

// ---------------------------------------------------------------------------------------
// The runner side
// ---------------------------------------------------------------------------------------

/// The segment, attached by the runner; detached on drop (it is already marked for
/// removal, so the kernel frees it once no process has it attached).
struct Segment {
    id: c_int,
    shared: &'static Shared,
}

impl Segment {
    fn create() -> Result<Segment, String> {
        let size = size_of::<Shared>();
        // SAFETY: plain system call.
        let id = unsafe { libc::shmget(libc::IPC_PRIVATE, size, libc::IPC_CREAT | 0o600) };
        if id < 0 {
            return Err(format!("shmget: {}", std::io::Error::last_os_error()));
        }
        let shared = attach(id);
        // SAFETY: plain system call; a null buffer is allowed for IPC_RMID.
        let rm = unsafe { libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()) };
        let Some(shared) = shared else {
            return Err(format!("shmat: {}", std::io::Error::last_os_error()));
        };
        let seg = Segment { id, shared };
        if rm != 0 {
            return Err(format!("shmctl(IPC_RMID): {}", std::io::Error::last_os_error()));
        }
        Ok(seg)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: the address came from shmat; nothing refers to it after this (the
        // runner that owns the segment is being dropped).
        unsafe {
            libc::shmdt((self.shared as *const Shared).cast());
        }
    }
}

/// A scenario process, seen from the runner.
struct Proc {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    slot: usize,
}

impl Proc {
    /// Whether the process has ended.
    fn gone(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n > 0
    }

    fn kill(&self) {
        // SAFETY: plain system call on a pidfd we own.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                libc::SIGKILL,
                0usize,
                0u32,
            );
        }
    }

    /// Waits until the process has ended, then reaps it if it is the runner's child.
    fn wait_gone(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let mut pfd = libc::pollfd {
                fd: self.pidfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let left = deadline.saturating_duration_since(Instant::now());
            // SAFETY: one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(1000) as c_int) };
            if n > 0 {
                break;
            }
            if Instant::now() >= deadline {
                return false;
            }
        }
        self.reap();
        true
    }

    /// Reaps the process if it is (now) the runner's child; a process whose parent is
    /// another scenario process was reaped by the kernel (`SIGCHLD` ignored).
    fn reap(&self) {
        loop {
            // SAFETY: all-zero is a valid siginfo_t, which waitid fills.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: plain system call with a valid out-buffer.
            let r = unsafe {
                libc::waitid(
                    libc::P_PIDFD,
                    self.pidfd.as_raw_fd() as libc::id_t,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG,
                )
            };
            if r == 0 || errno() != libc::EINTR {
                return;
            }
        }
    }
}

/// The replay's scratch directory on tmpfs; dropping it removes it with its files.
fn scratch_dir() -> Result<ScratchDir, String> {
    let parent = Path::new(SCRATCH_PARENT);
    harness::check_tmpfs(parent).map_err(|e| e.to_string())?;
    ScratchDir::create(parent, "vfscale-fd").map_err(|e| e.to_string())
}

/// The state of one replay. Fields drop in order: processes are killed and reaped (in
/// `Drop`), then the segment detached, then the directory removed.
struct Runner {
    exe: PathBuf,
    procs: BTreeMap<String, Proc>,
    seg: Segment,
    dir: ScratchDir,
    /// The three files every process starts with, kept open to hand to new processes.
    std_files: [File; 3],
    tracker: Tracker,
    /// File `n` of the scratch directory is `f<n>`, so any scenario name is safe.
    files: HashMap<String, usize>,
    /// Each file's (device, inode) and scenario name, to read listings.
    names: HashMap<(u64, u64), String>,
}

impl Drop for Runner {
    fn drop(&mut self) {
        for p in self.procs.values() {
            p.kill();
        }
        for p in self.procs.values() {
            p.wait_gone(TIMEOUT);
        }
    }
}

fn subreaper() -> Result<(), String> {
    // SAFETY: plain system call.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong) } != 0 {
        return Err(format!(
            "prctl(PR_SET_CHILD_SUBREAPER): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

impl Runner {
    fn new(exe: &Path) -> Result<Runner, String> {
        subreaper()?;
        let seg = Segment::create()?;
        let dir = scratch_dir()?;
        let bytes = dir.path().as_os_str().as_encoded_bytes();
        if bytes.len() >= DIR_LEN || bytes.contains(&0) {
            return Err(format!("scratch path {} is too long", dir.path().display()));
        }
        let mut padded = [0u8; DIR_LEN];
        padded[..bytes.len()].copy_from_slice(bytes);
        for (w, chunk) in seg.shared.dir.iter().zip(padded.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(chunk);
            w.store(u64::from_le_bytes(b), Ordering::Relaxed);
        }
        seg.shared
            .runner
            .store(std::process::id() as i32, Ordering::Release);
        let mut names = HashMap::new();
        let open_std =
            |names: &mut HashMap<(u64, u64), String>, i: usize, write: bool| -> Result<File, String> {
                let path = dir.path().join(STD_NAMES[i]);
                let f = std::fs::OpenOptions::new()
                    .read(!write)
                    .write(write)
                    .create(write)
                    .truncate(false)
                    .open(&path)
                    .map_err(|e| format!("open {}: {e}", path.display()))?;
                let m = f
                    .metadata()
                    .map_err(|e| format!("stat {}: {e}", path.display()))?;
                names.insert((m.dev(), m.ino()), STD_NAMES[i].to_string());
                Ok(f)
            };
        // `create` needs write access: make stdin first, then open it read-only.
        drop(open_std(&mut names, 0, true)?);
        let std_files = [
            open_std(&mut names, 0, false)?,
            open_std(&mut names, 1, true)?,
            open_std(&mut names, 2, true)?,
        ];
        Ok(Runner {
            exe: exe.to_path_buf(),
            procs: BTreeMap::new(),
            seg,
            dir,
            std_files,
            tracker: Tracker::new(),
            files: HashMap::new(),
            names,
        })
    }

    fn free_slot(&self) -> Option<usize> {
        (0..MAX_SLOTS).find(|s| !self.procs.values().any(|p| p.slot == *s))
    }

    /// Makes `slot` idle with `op` pending (`None`: nothing pending).
    fn prepare_slot(&self, slot: usize, pending: Option<i32>) {
        let s = &self.seg.shared.slots[slot];
        let seq = s.cmd_seq.load(Ordering::Relaxed);
        s.reply_seq.store(seq, Ordering::Relaxed);
        if let Some(op) = pending {
            s.op.store(op, Ordering::Relaxed);
            s.errno.store(0, Ordering::Relaxed);
            s.ret.store(0, Ordering::Relaxed);
            s.cmd_seq.store(seq.wrapping_add(1), Ordering::Release);
        }
    }

    /// Sends a command to `p` and waits for the answer: `Ok(ret)` or `Err(errno)`.
    fn call(&self, at: At, name: &str, op: i32, args: [i64; 3]) -> Result<Result<i64, i32>, ReplayError> {
        let p = self.proc(at, name)?;
        let s = &self.seg.shared.slots[p.slot];
        for (a, v) in s.args.iter().zip(args) {
            a.store(v, Ordering::Relaxed);
        }
        s.op.store(op, Ordering::Relaxed);
        let seq = s.cmd_seq.load(Ordering::Relaxed).wrapping_add(1);
        s.cmd_seq.store(seq, Ordering::Release);
        futex_wake(&s.cmd_seq);
        self.wait_reply(at, name, p, seq)?;
        let err = s.errno.load(Ordering::Relaxed);
        Ok(if err != 0 {
            Err(err)
        } else {
            Ok(s.ret.load(Ordering::Relaxed))
        })
    }

    fn wait_reply(&self, at: At, name: &str, p: &Proc, seq: u32) -> Result<(), ReplayError> {
        let s = &self.seg.shared.slots[p.slot];
        let deadline = Instant::now() + TIMEOUT;
        loop {
            let got = s.reply_seq.load(Ordering::Acquire);
            if got == seq {
                return Ok(());
            }
            if p.gone() {
                // It may have answered just before ending.
                if s.reply_seq.load(Ordering::Acquire) == seq {
                    return Ok(());
                }
                return Err(at.kernel(format!("process {name:?} died")));
            }
            if Instant::now() >= deadline {
                return Err(at.kernel(format!("process {name:?} did not answer within {TIMEOUT:?}")));
            }
            futex_wait(&s.reply_seq, got, Duration::from_millis(20));
        }
    }

    fn proc(&self, at: At, name: &str) -> Result<&Proc, ReplayError> {
        self.procs
            .get(name)
            .ok_or_else(|| at.kernel(format!("internal error: no process {name:?}")))
    }

    fn pidfd(pid: libc::pid_t) -> Result<OwnedFd, String> {
        // SAFETY: plain system call.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) };
        if fd < 0 {
            return Err(format!("pidfd_open: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: a fresh descriptor (close-on-exec, as pidfd_open makes them) we own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as c_int) })
    }

    fn spawn(&mut self, at: At, name: &str) -> Result<(), ReplayError> {
        let slot = self
            .free_slot()
            .ok_or_else(|| at.kernel(format!("more than {MAX_SLOTS} live processes")))?;
        self.prepare_slot(slot, Some(OP_START));
        let stdio = |i: usize| -> Result<std::process::Stdio, ReplayError> {
            let f: &File = &self.std_files[i];
            Ok(f.try_clone().map_err(|e| at.kernel(format!("dup: {e}")))?.into())
        };
        let child = std::process::Command::new(&self.exe)
            .arg("start")
            .arg(self.seg.id.to_string())
            .arg(slot.to_string())
            .env_clear()
            .stdin(stdio(0)?)
            .stdout(stdio(1)?)
            .stderr(stdio(2)?)
            .spawn()
            .map_err(|e| at.kernel(format!("cannot start {}: {e}", self.exe.display())))?;
        let pid = child.id() as libc::pid_t;
        // `child` is dropped without waiting: the process is reaped through its pidfd.
        let pidfd = match Self::pidfd(pid) {
            Ok(fd) => fd,
            Err(e) => {
                // SAFETY: plain system calls on our own unreaped child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, std::ptr::null_mut(), 0);
                }
                return Err(at.kernel(e));
            }
        };
        let p = Proc { pid, pidfd, slot };
        let seq = self.seg.shared.slots[slot].cmd_seq.load(Ordering::Relaxed);
        self.procs.insert(name.to_string(), p);
        let p = &self.procs[name];
        self.wait_reply(at, name, p, seq)?;
        match self.seg.shared.slots[slot].errno.load(Ordering::Relaxed) {
            0 => Ok(()),
            e => Err(at.kernel(format!(
                "process {name:?} could not start: {}",
                match e {
                    E_START_CLOSE => "close_range",
                    E_START_RLIMIT => "setrlimit(RLIMIT_NOFILE, 1024)",
                    _ => "signal set-up",
                }
            ))),
        }
    }

    fn fork(&mut self, at: At, parent: &str, child: &str) -> Result<(), ReplayError> {
        let slot = self
            .free_slot()
            .ok_or_else(|| at.kernel(format!("more than {MAX_SLOTS} live processes")))?;
        self.prepare_slot(slot, None);
        let pid = match self.call(at, parent, OP_FORK, [slot as i64, 0, 0])? {
            Ok(pid) => pid as libc::pid_t,
            Err(e) => return Err(at.kernel(format!("fork failed: {}", describe(e)))),
        };
        // The new process waits for commands, so its pid cannot have been recycled.
        let pidfd = Self::pidfd(pid).map_err(|e| at.kernel(e))?;
        self.procs.insert(child.to_string(), Proc { pid, pidfd, slot });
        Ok(())
    }

    fn exit(&mut self, at: At, name: &str) -> Result<(), ReplayError> {
        let p = self.proc(at, name)?;
        let s = &self.seg.shared.slots[p.slot];
        s.op.store(OP_EXIT, Ordering::Relaxed);
        s.cmd_seq.store(
            s.cmd_seq.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Release,
        );
        futex_wake(&s.cmd_seq);
        let ok = p.wait_gone(TIMEOUT);
        let pid = p.pid;
        if !ok {
            return Err(at.kernel(format!(
                "process {name:?} (pid {pid}) did not exit within {TIMEOUT:?}"
            )));
        }
        self.procs.remove(name);
        Ok(())
    }

    fn file_number(&mut self, at: At, name: &str) -> Result<usize, ReplayError> {
        if let Some(n) = self.files.get(name) {
            return Ok(*n);
        }
        let n = self.files.len();
        let path = self.dir.path().join(format!("f{n}"));
        let f = File::create(&path).map_err(|e| at.kernel(format!("create {}: {e}", path.display())))?;
        let m = f
            .metadata()
            .map_err(|e| at.kernel(format!("stat {}: {e}", path.display())))?;
        self.names.insert((m.dev(), m.ino()), name.to_string());
        self.files.insert(name.to_string(), n);
        Ok(n)
    }

    fn list(&self, at: At, name: &str) -> Result<Outcome, ReplayError> {
        if let Err(e) = self.call(at, name, OP_LIST, [0; 3])? {
            return Err(at.kernel(format!("list failed: {}", describe(e))));
        }
        let s = &self.seg.shared.slots[self.proc(at, name)?.slot];
        let n = (s.count.load(Ordering::Relaxed) as usize).min(MAX_FDS);
        let mut out = Vec::with_capacity(n);
        for e in &s.entries[..n] {
            let fd = e.fd.load(Ordering::Relaxed);
            let key = (e.dev.load(Ordering::Relaxed), e.ino.load(Ordering::Relaxed));
            let name = self.names.get(&key).ok_or_else(|| {
                at.kernel(format!(
                    "descriptor {fd} refers to a file the scenario never opened"
                ))
            })?;
            out.push(Listed {
                fd,
                name: name.clone(),
                cloexec: e.flags.load(Ordering::Relaxed) & libc::FD_CLOEXEC != 0,
            });
        }
        Ok(Outcome::List(out))
    }

    fn step(&mut self, at: At, step: &Step) -> Result<Outcome, ReplayError> {
        self.tracker.check(step)?;
        let b = |x: bool| i64::from(x);
        let (proc, op, args) = match &step.op {
            Op::Spawn { proc } => {
                self.spawn(at, proc)?;
                return Ok(Outcome::Ok);
            }
            Op::Fork { proc, child } => {
                self.fork(at, proc, child)?;
                return Ok(Outcome::Ok);
            }
            Op::Exit { proc } => {
                self.exit(at, proc)?;
                return Ok(Outcome::Ok);
            }
            Op::List { proc } => return self.list(at, proc),
            Op::Open { proc, name, cloexec } => {
                let n = self.file_number(at, name)?;
                (proc, OP_OPEN, [n as i64, b(*cloexec), 0])
            }
            Op::Dup { proc, fd } => (proc, OP_DUP, [i64::from(*fd), 0, 0]),
            Op::Dup2 { proc, fd, newfd } => (proc, OP_DUP2, [i64::from(*fd), i64::from(*newfd), 0]),
            Op::Dup3 {
                proc,
                fd,
                newfd,
                cloexec,
            } => (proc, OP_DUP3, [i64::from(*fd), i64::from(*newfd), b(*cloexec)]),
            Op::FcntlDupfd {
                proc,
                fd,
                min,
                cloexec,
            } => (proc, OP_DUPFD, [i64::from(*fd), i64::from(*min), b(*cloexec)]),
            Op::Getfd { proc, fd } => (proc, OP_GETFD, [i64::from(*fd), 0, 0]),
            Op::Setfd { proc, fd, cloexec } => (proc, OP_SETFD, [i64::from(*fd), b(*cloexec), 0]),
            Op::Close { proc, fd } => (proc, OP_CLOSE, [i64::from(*fd), 0, 0]),
            Op::CloseRange {
                proc,
                first,
                last,
                cloexec,
                unshare,
            } => {
                let flags = if *cloexec { CLOSE_RANGE_CLOEXEC } else { 0 }
                    | if *unshare { CLOSE_RANGE_UNSHARE } else { 0 };
                (proc, OP_CLOSE_RANGE, [i64::from(*first), i64::from(*last), flags])
            }
            Op::Exec { proc } => (proc, OP_EXEC, [0; 3]),
            Op::Setrlimit { proc, nofile } => {
                let n = i64::try_from(*nofile).map_err(|_| at.kernel("limit out of range"))?;
                (proc, OP_SETRLIMIT, [n, 0, 0])
            }
        };
        match self.call(at, proc, op, args)? {
            Ok(ret) => Ok(match &step.op {
                Op::Open { .. } | Op::Dup { .. } | Op::Dup2 { .. } | Op::Dup3 { .. } | Op::FcntlDupfd { .. } => {
                    Outcome::Fd(ret as i32)
                }
                Op::Getfd { .. } => Outcome::Cloexec(ret & i64::from(libc::FD_CLOEXEC) != 0),
                _ => Outcome::Ok,
            }),
            Err(E_NO_ROOM_FOR_LOADER) => Err(at.kernel(
                "exec with no free descriptor below RLIMIT_NOFILE: the dynamic loader of the new image could not open its libraries, so the kernel runner cannot replay this",
            )),
            Err(e) => match ErrName::from_raw(e) {
                Some(name) => Ok(Outcome::Err(name)),
                None => Err(at.kernel(format!("{} failed with {}, which results cannot name", step.op.name(), describe(e)))),
            },
        }
    }
}

fn describe(e: i32) -> String {
    if e < 0 {
        format!("internal error {e} of the child program")
    } else {
        nix::errno::Errno::from_raw(e).to_string()
    }
}
