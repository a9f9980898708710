//! Kernel runner: replays a lock scenario against the running Linux kernel.
//!
//! Each scenario process is a real child process, each file a real file in a fresh
//! directory on tmpfs, each lock call a real `fcntl(2)` or `flock(2)`. The results are
//! what the kernel answered, as the same [`StepResult`]s the library's runner produces,
//! so that the two streams can be compared line by line.
//!
//! # The children
//!
//! The replaying process may be multi-threaded (it is under `cargo test`), so after
//! `fork` a child may only make async-signal-safe calls: it must not allocate, take a
//! lock, use std I/O or panic. A child therefore runs `child_main`, a loop of plain
//! system calls over fixed-size records: it reads a `Command` from its command pipe,
//! performs it, and writes a `Reply` to its reply pipe. Everything it needs is prepared
//! before `fork` (`ChildSetup`). The parent refers to the child's descriptors by their
//! numbers in the child, which the replies tell it.
//!
//! # Settling
//!
//! After each step the runner waits until every outstanding blocking call has either
//! finished or is truly asleep waiting for a lock; only then can it tell `"blocked"` from
//! a call that is merely slow, and list in `completed` exactly the calls the step let
//! finish. See `Runner::settle` for the rule and why it is sound.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::Write as _;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libc::c_int;
use nix::errno::Errno as SysErrno;
use nix::fcntl::OFlag;
use nix::sys::signal::{kill, Signal};
use nix::sys::stat::Mode;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::format::{
    canonical_listing, LockPid, NamedListing, Op, OpenMode, Outcome, Resolved, Scenario, Step, StepResult,
    Tracker,
};
use vfscale_locks::{Errno, FcntlCmd, FlockOp, LockType};

/// Where the scratch directory is made unless [`KernelOptions::dir`] says otherwise.
const DEFAULT_DIR: &str = "/dev/shm";

/// Options for a kernel replay.
#[derive(Clone, Debug)]
pub struct KernelOptions {
    /// The directory in which the fresh scratch directory is made (`/dev/shm` when
    /// `None`). Any filesystem will do, a FUSE mount for one; the lock listing
    /// ([`replay_with_listing`]) is read from `/proc/locks` and so only on tmpfs, where
    /// the kernel keeps the locks: a FUSE server's locks are not in the client's
    /// `/proc/locks`.
    pub dir: Option<PathBuf>,
    /// Further directories that show the files of `dir` (a FUSE mount of it, say): the
    /// scenario's processes, numbered in the order they start, work in the scratch
    /// directory in turn as `dir` and each of these shows it, process *i* through
    /// directory *i* mod *n* (`dir` being directory 0). Empty: every process works in
    /// `dir`. Directories of one lock space (bind mounts, the mounts of servers of one
    /// cluster) give one directory's results; a source and mounts that mirror their locks
    /// on it, a *mixed* replay ([`super::mixed`]).
    pub views: Vec<PathBuf>,
    /// How long the system may take to settle after a step (and a child to start, a
    /// call that cannot block to return, an exiting child to end) before the replay
    /// gives up.
    pub settle_timeout: Duration,
    /// How long every outstanding call must have been seen asleep in its lock call,
    /// unchanged, before the system counts as settled. Zero on tmpfs, where a lock
    /// call sleeps only when it waits for a lock. On a FUSE mount a call also sleeps
    /// while its request is with the server, and a lock the server drops at `RELEASE`
    /// (sent after `close(2)` has returned) wakes waiters a little later: see
    /// [`KernelOptions::in_dir`].
    pub quiet: Duration,
}

impl Default for KernelOptions {
    fn default() -> Self {
        KernelOptions {
            dir: None,
            views: Vec::new(),
            settle_timeout: Duration::from_secs(10),
            quiet: Duration::ZERO,
        }
    }
}

/// [`KernelOptions::quiet`] off tmpfs.
pub const QUIET_OFF_TMPFS: Duration = Duration::from_millis(60);

impl KernelOptions {
    /// Options to replay in `dir`, on whatever filesystem it is: off tmpfs, the system
    /// counts as settled only after [`QUIET_OFF_TMPFS`] without change.
    pub fn in_dir(dir: &Path) -> KernelOptions {
        KernelOptions::in_dirs(std::slice::from_ref(&dir.to_owned()))
    }

    /// Options to replay with the processes spread over `dirs` (see
    /// [`KernelOptions::views`]): the scratch directory is made in the first; unless all
    /// are on tmpfs, the system counts as settled only after [`QUIET_OFF_TMPFS`] without
    /// change. No directories: the default, a fresh directory under `/dev/shm`.
    pub fn in_dirs(dirs: &[PathBuf]) -> KernelOptions {
        let Some((dir, views)) = dirs.split_first() else {
            return KernelOptions::default();
        };
        let quiet = if dirs.iter().all(|d| check_tmpfs(d).is_ok()) {
            Duration::ZERO
        } else {
            QUIET_OFF_TMPFS
        };
        KernelOptions {
            dir: Some(dir.clone()),
            views: views.to_vec(),
            quiet,
            ..KernelOptions::default()
        }
    }
}

use crate::format::At;
pub use crate::format::ReplayError;
use crate::harness::{self, ScratchDir};

/// Replays `scn` against the running kernel with default options.
pub fn replay(scn: &Scenario) -> Result<Vec<StepResult>, ReplayError> {
    replay_with(scn, &KernelOptions::default())
}

/// Replays `scn` against the running kernel: one result per step, in step order.
///
/// All children are killed and reaped, and the scratch directory removed, whatever the
/// outcome.
pub fn replay_with(scn: &Scenario, opts: &KernelOptions) -> Result<Vec<StepResult>, ReplayError> {
    replay_in(scn, opts, false).map(|(r, _)| r)
}

/// Replays `scn` and returns, with the results, the kernel's lock listing (`/proc/locks`)
/// of the scenario's files after the last step has settled, with scenario names.
/// Only on tmpfs (see [`KernelOptions::dir`]), and in one directory: a server's locks
/// through a mount are not the client's.
pub fn replay_with_listing(
    scn: &Scenario,
    opts: &KernelOptions,
) -> Result<(Vec<StepResult>, Vec<NamedListing>), ReplayError> {
    if !opts.views.is_empty() {
        return Err(ReplayError::Kernel(
            "the lock listing needs every process in one directory".into(),
        ));
    }
    let parent = opts.dir.as_deref().unwrap_or(Path::new(DEFAULT_DIR));
    check_tmpfs(parent).map_err(|e| ReplayError::Kernel(format!("the lock listing needs tmpfs: {e}")))?;
    replay_in(scn, opts, true)
}

fn replay_in(
    scn: &Scenario,
    opts: &KernelOptions,
    with_listing: bool,
) -> Result<(Vec<StepResult>, Vec<NamedListing>), ReplayError> {
    let parent = opts.dir.as_deref().unwrap_or(Path::new(DEFAULT_DIR));
    let mut runner = Runner::new(scn, opts, parent).map_err(ReplayError::Kernel)?;
    let results = scn
        .steps
        .iter()
        .enumerate()
        .map(|(index, step)| runner.step(index, step))
        .collect::<Result<Vec<_>, _>>()?;
    let listing = if with_listing {
        runner.listing().map_err(ReplayError::Kernel)?
    } else {
        Vec::new()
    };
    Ok((results, listing))
}

/// Reads `/proc/locks` in one `read(2)`. The kernel walks its lock lists under its
/// listing locks for the length of one call; several smaller reads each restart at a
/// position index, so locks that other processes take or drop in between (cargo's build
/// locks, say) would shift the entries and duplicate or skip some of ours.
fn read_proc_locks() -> Result<String, String> {
    use std::io::Read as _;
    let mut size = 1 << 20;
    loop {
        let mut f = std::fs::File::open("/proc/locks").map_err(|e| format!("/proc/locks: {e}"))?;
        let mut buf = vec![0u8; size];
        let n = f.read(&mut buf).map_err(|e| format!("/proc/locks: {e}"))?;
        if n < size {
            buf.truncate(n);
            return String::from_utf8(buf).map_err(|e| format!("/proc/locks: {e}"));
        }
        size *= 4;
    }
}

/// Parses `/proc/locks`, keeping the records of the inodes in `files` (`(major, minor,
/// ino)` → name) and naming owners through `pids`.
fn parse_proc_locks(
    text: &str,
    files: &HashMap<(u32, u32, u64), String>,
    pids: &HashMap<i32, String>,
) -> Vec<NamedListing> {
    let mut out: Vec<NamedListing> = Vec::new();
    // The id of the group being filled, when it is one of ours.
    let mut current: Option<&str> = None;
    for line in text.lines() {
        let Some((id, rest)) = line.split_once(": ") else {
            continue;
        };
        let trimmed = rest.trim_start_matches(' ');
        let (depth, body) = match trimmed.strip_prefix("-> ") {
            Some(b) => (rest.len() - trimmed.len() + 1, b),
            None => (0, rest),
        };
        let t: Vec<&str> = body.split_whitespace().collect();
        let [kind, _advisory, ty, pid, devino, start, end] = t[..] else {
            continue;
        };
        let mut dev = devino.splitn(3, ':');
        let key = (|| {
            let major = u32::from_str_radix(dev.next()?, 16).ok()?;
            let minor = u32::from_str_radix(dev.next()?, 16).ok()?;
            let ino = dev.next()?.parse().ok()?;
            Some((major, minor, ino))
        })();
        let Some(file) = key.and_then(|k| files.get(&k)) else {
            if depth == 0 {
                current = None;
            }
            continue;
        };
        let owner = match pid.parse::<i32>() {
            Ok(-1) => "-1".to_string(),
            Ok(p) => pids.get(&p).cloned().unwrap_or_else(|| p.to_string()),
            Err(_) => pid.to_string(),
        };
        let named = NamedListing::line(kind, ty, &owner, file, start, end);
        if depth == 0 {
            current = Some(id);
            out.push(NamedListing {
                lock: named,
                waiters: Vec::new(),
            });
        } else if current == Some(id) {
            if let Some(g) = out.last_mut() {
                g.waiters.push(NamedListing::waiter_prefix(depth) + &named);
            }
        }
    }
    canonical_listing(out)
}

/// Whether the kernel target can run here; `Err` says why not (no tmpfs at `/dev/shm`,
/// `fork` not permitted, `/proc/<pid>/syscall` unreadable, ...).
pub fn available() -> Result<(), String> {
    let dir = Path::new(DEFAULT_DIR);
    check_tmpfs(dir)?;
    let dir_fd = open_dir(dir)?;
    let child = Child::spawn("probe", dir_fd.as_fd(), Duration::from_secs(5))?;
    // A fresh child waits for its first command in read(2); settling depends on seeing
    // exactly that kind of thing through /proc.
    let deadline = deadline_after(Duration::from_secs(5));
    loop {
        let probe = child.probe()?;
        if probe.state == 'S' && probe.syscall == Some(libc::SYS_read) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "/proc does not show a child asleep in read(2) (state {}, syscall {:?})",
                probe.state, probe.syscall
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

// ---------------------------------------------------------------------------------------
// The pipe protocol
// ---------------------------------------------------------------------------------------

/// A fixed-size message of the pipe protocol.
///
/// # Safety
///
/// Implementors are `repr(C)` structs of integers and byte arrays without padding, so
/// that every byte pattern is a valid value and their bytes are all initialised.
unsafe trait Record: Copy + Default {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `Self` has no padding (trait contract), so all its bytes are initialised;
        // the slice covers exactly `*self` and borrows it.
        unsafe { std::slice::from_raw_parts((self as *const Self).cast(), size_of::<Self>()) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; moreover any bytes written make a valid `Self`.
        unsafe { std::slice::from_raw_parts_mut((self as *mut Self).cast(), size_of::<Self>()) }
    }
}

/// Room for a file name in the scratch directory, with its terminating NUL.
const NAME_LEN: usize = 24;

/// What a child is told to do. `op` is one of the `OP_*` values.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Command {
    /// `l_start` (`OP_FCNTL`).
    start: i64,
    /// `l_len` (`OP_FCNTL`).
    len: i64,
    op: i32,
    /// The child's descriptor (`OP_DUP`, `OP_CLOSE`, `OP_FCNTL`, `OP_FLOCK`).
    fd: c_int,
    /// Open flags (`OP_OPEN`), the `fcntl` command, or the `flock` operation.
    arg: c_int,
    /// `l_type` (`OP_FCNTL`).
    l_type: i32,
    /// The file's name in the scratch directory, NUL-terminated (`OP_OPEN`).
    name: [u8; NAME_LEN],
}

/// What a child answers: the system call's result, and for `OP_FCNTL` the `struct flock`
/// as the call left it. Also sent once when the child is ready, see [`child_main`].
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct Reply {
    l_start: i64,
    l_len: i64,
    /// 0 on success, else the `errno`.
    errno: i32,
    /// The call's return value (the new descriptor for `OP_OPEN` and `OP_DUP`).
    ret: c_int,
    l_type: i32,
    l_pid: libc::pid_t,
}

// SAFETY: both are repr(C) with 8-byte fields first, then 4-byte fields in even number,
// then bytes filling to a multiple of 8: no padding, as the assertions below check.
unsafe impl Record for Command {}
// SAFETY: as for `Command`.
unsafe impl Record for Reply {}

const _: () = assert!(size_of::<Command>() == 2 * 8 + 4 * 4 + NAME_LEN);
const _: () = assert!(size_of::<Reply>() == 2 * 8 + 4 * 4);
// Records no larger than PIPE_BUF are written atomically, so a reader never sees half.
const _: () = assert!(size_of::<Command>() <= libc::PIPE_BUF);
const _: () = assert!(size_of::<Reply>() <= libc::PIPE_BUF);

const OP_OPEN: i32 = 1;
const OP_DUP: i32 = 2;
const OP_CLOSE: i32 = 3;
const OP_FCNTL: i32 = 4;
const OP_FLOCK: i32 = 5;
const OP_EXIT: i32 = 6;

impl Command {
    /// Opens (creating it empty if new) file number `file` of the scratch directory.
    fn open(file: usize, mode: OpenMode) -> Command {
        let access = match mode {
            OpenMode::R => libc::O_RDONLY,
            OpenMode::W => libc::O_WRONLY,
            OpenMode::Rw => libc::O_RDWR,
        };
        let mut cmd = Command {
            op: OP_OPEN,
            arg: access | libc::O_CREAT,
            ..Command::default()
        };
        // "f" and at most 20 digits always fit, and leave the last byte 0 as terminator.
        let _ = write!(&mut cmd.name[..NAME_LEN - 1], "f{file}");
        cmd
    }

    fn dup(fd: c_int) -> Command {
        Command {
            op: OP_DUP,
            fd,
            ..Command::default()
        }
    }

    fn close(fd: c_int) -> Command {
        Command {
            op: OP_CLOSE,
            fd,
            ..Command::default()
        }
    }

    fn fcntl(fd: c_int, cmd: FcntlCmd, ty: LockType, start: i64, len: i64) -> Command {
        Command {
            op: OP_FCNTL,
            fd,
            arg: cmd.raw(),
            l_type: ty.raw().into(),
            start,
            len,
            ..Command::default()
        }
    }

    fn flock(fd: c_int, how: FlockOp, nb: bool) -> Command {
        Command {
            op: OP_FLOCK,
            fd,
            arg: how.raw() | if nb { libc::LOCK_NB } else { 0 },
            ..Command::default()
        }
    }

    fn exit() -> Command {
        Command {
            op: OP_EXIT,
            ..Command::default()
        }
    }

    /// The command for a lock-call step on descriptor `fd`; `None` for other steps.
    fn lock_call(op: &Op, fd: c_int) -> Option<Command> {
        match *op {
            Op::Fcntl {
                cmd, ty, start, len, ..
            } => Some(Command::fcntl(fd, cmd, ty, start, len)),
            Op::Flock { how, nb, .. } => Some(Command::flock(fd, how, nb)),
            _ => None,
        }
    }
}

/// Why a record could not be moved through a pipe.
#[derive(Debug)]
enum PipeError {
    /// End of file: the other side is gone.
    Closed,
    /// A failed system call, with its `errno`.
    Errno(i32),
}

impl fmt::Display for PipeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PipeError::Closed => f.write_str("pipe closed"),
            PipeError::Errno(e) => write!(f, "{}", SysErrno::from_raw(*e)),
        }
    }
}

/// Reads one whole record from `fd`, retrying after `EINTR`. Async-signal-safe.
fn read_record<R: Record>(fd: c_int, rec: &mut R) -> Result<(), PipeError> {
    let buf = rec.bytes_mut();
    let mut done = 0;
    while let Some(rest) = buf.get_mut(done..).filter(|r| !r.is_empty()) {
        // SAFETY: the pointer and length describe `rest`, which is writable.
        let n = unsafe { libc::read(fd, rest.as_mut_ptr().cast(), rest.len()) };
        match n {
            0 => return Err(PipeError::Closed),
            n if n > 0 => done += n.unsigned_abs(),
            _ => match SysErrno::last_raw() {
                libc::EINTR => {}
                e => return Err(PipeError::Errno(e)),
            },
        }
    }
    Ok(())
}

/// Writes one whole record to `fd`, retrying after `EINTR`. Async-signal-safe.
fn write_record<R: Record>(fd: c_int, rec: &R) -> Result<(), PipeError> {
    let buf = rec.bytes();
    let mut done = 0;
    while let Some(rest) = buf.get(done..).filter(|r| !r.is_empty()) {
        // SAFETY: the pointer and length describe `rest`, which is readable.
        let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
        match n {
            n if n > 0 => done += n.unsigned_abs(),
            0 => return Err(PipeError::Closed),
            _ => match SysErrno::last_raw() {
                libc::EINTR => {}
                e => return Err(PipeError::Errno(e)),
            },
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The child side. Everything from here to the parent side runs after fork, as do
// `read_record` and `write_record`: only async-signal-safe system calls, no allocation,
// no panics.
// ---------------------------------------------------------------------------------------

/// The child's command pipe, reply pipe and scratch directory are always these numbers;
/// every other inherited descriptor is closed, so lock files get 3 and up.
const CMD_FD: c_int = 0;
const REPLY_FD: c_int = 1;
const DIR_FD: c_int = 2;

/// The stages of [`child_setup`]; the one that failed is sent in `Reply::ret` of the
/// ready reply, and named by its index in [`SETUP_STAGES`].
const STAGE_PDEATHSIG: c_int = 0;
const STAGE_PLACE_FDS: c_int = 1;
const STAGE_CLOSE_REST: c_int = 2;
const STAGE_SIGNALS: c_int = 3;
const SETUP_STAGES: [&str; 4] = ["prctl(PR_SET_PDEATHSIG)", "dup2", "close_range", "sigaction"];

/// What a child needs, prepared before `fork` so that the child only makes system calls.
struct ChildSetup {
    commands: c_int,
    replies: c_int,
    dir: c_int,
    /// The forking process, to detect that it died before `PR_SET_PDEATHSIG` took effect.
    parent: libc::pid_t,
    /// The `SIGUSR1` action: [`on_interrupt`], without `SA_RESTART`.
    action: libc::sigaction,
    /// The empty signal mask.
    unblocked: libc::sigset_t,
}

/// The interrupt signal's handler. It does nothing: the signal's only purpose is to make
/// the blocked `fcntl` or `flock` return `EINTR`, which needs a handler (with the default
/// action the child would die) installed without `SA_RESTART` (else the call restarts).
extern "C" fn on_interrupt(_: c_int) {}

/// A child's life: set up, say ready, then serve commands until told to exit or the
/// parent goes away. Never returns.
fn child_main(setup: &ChildSetup) -> ! {
    let ready = match child_setup(setup) {
        Ok(()) => Reply::default(),
        Err((stage, errno)) => {
            let failed = Reply {
                ret: stage,
                errno,
                ..Reply::default()
            };
            // Until the descriptors are in place the reply pipe has its original number;
            // from then on that one may be closed.
            let fd = if stage > STAGE_PLACE_FDS {
                REPLY_FD
            } else {
                setup.replies
            };
            let _ = write_record(fd, &failed);
            child_exit(127)
        }
    };
    if write_record(REPLY_FD, &ready).is_err() {
        child_exit(127);
    }
    let mut cmd = Command::default();
    loop {
        if read_record(CMD_FD, &mut cmd).is_err() || cmd.op == OP_EXIT {
            child_exit(0);
        }
        if write_record(REPLY_FD, &child_execute(&cmd)).is_err() {
            child_exit(0);
        }
    }
}

/// Ends the child without running anything of the parent's (`_exit`, not `exit`).
fn child_exit(status: c_int) -> ! {
    // SAFETY: `_exit` is async-signal-safe and takes no pointers.
    unsafe { libc::_exit(status) }
}

/// Puts the child's descriptors in place, closes all others, and installs the interrupt
/// handler. On failure, the index in [`SETUP_STAGES`] and the `errno`.
fn child_setup(s: &ChildSetup) -> Result<(), (c_int, c_int)> {
    let fail = |stage: c_int| Err((stage, SysErrno::last_raw()));
    // SAFETY: plain system calls on integers and on structures owned by `s`, which lives
    // for the whole call; none of them allocates or takes a lock.
    unsafe {
        // Die with the parent (strictly: the forking thread, which outlives the replay),
        // or a child blocked in a lock call would wait forever.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
            return fail(STAGE_PDEATHSIG);
        }
        if libc::getppid() != s.parent {
            return Err((STAGE_PDEATHSIG, libc::ESRCH));
        }
        // Copy all three above 2 first, so that placing one cannot overwrite another.
        let mut places = [(s.commands, CMD_FD), (s.replies, REPLY_FD), (s.dir, DIR_FD)];
        for (fd, _) in &mut places {
            *fd = libc::fcntl(*fd, libc::F_DUPFD, DIR_FD + 1);
            if *fd < 0 {
                return fail(STAGE_PLACE_FDS);
            }
        }
        for (fd, place) in places {
            if libc::dup2(fd, place) != place {
                return fail(STAGE_PLACE_FDS);
            }
        }
        // Everything else inherited (other children's pipes, the parent's files) goes.
        let first = (DIR_FD + 1) as libc::c_uint;
        if libc::syscall(libc::SYS_close_range, first, libc::c_uint::MAX, 0) != 0 {
            return fail(STAGE_CLOSE_REST);
        }
        if libc::sigaction(libc::SIGUSR1, &s.action, std::ptr::null_mut()) != 0
            || libc::sigprocmask(libc::SIG_SETMASK, &s.unblocked, std::ptr::null_mut()) != 0
        {
            return fail(STAGE_SIGNALS);
        }
    }
    Ok(())
}

/// Performs one command (not `OP_EXIT`) and says how it went.
fn child_execute(cmd: &Command) -> Reply {
    let mut reply = Reply::default();
    // SAFETY: plain system calls on integers and on buffers owned by this frame; the
    // name is NUL-terminated by construction.
    let ret = unsafe {
        match cmd.op {
            OP_OPEN => {
                let mut name = cmd.name;
                name[NAME_LEN - 1] = 0;
                libc::openat(DIR_FD, name.as_ptr().cast(), cmd.arg, 0o600 as libc::c_uint)
            }
            OP_DUP => libc::dup(cmd.fd),
            OP_CLOSE => libc::close(cmd.fd),
            OP_FCNTL => {
                // All-zero is a valid `struct flock`; in particular `l_pid` stays 0, as
                // the OFD commands require.
                let mut fl: libc::flock = std::mem::zeroed();
                fl.l_type = cmd.l_type as libc::c_short;
                fl.l_whence = libc::SEEK_SET as libc::c_short;
                fl.l_start = cmd.start;
                fl.l_len = cmd.len;
                let ret = libc::fcntl(cmd.fd, cmd.arg, &mut fl as *mut libc::flock);
                reply.l_type = fl.l_type.into();
                reply.l_start = fl.l_start;
                reply.l_len = fl.l_len;
                reply.l_pid = fl.l_pid;
                ret
            }
            OP_FLOCK => libc::flock(cmd.fd, cmd.arg),
            _ => {
                reply.errno = libc::ENOSYS;
                return reply;
            }
        }
    };
    if ret < 0 {
        reply.errno = SysErrno::last_raw();
    } else {
        reply.ret = ret;
    }
    reply
}

// ---------------------------------------------------------------------------------------
// The parent side.
// ---------------------------------------------------------------------------------------

/// A scenario process, seen from the parent. Dropping it kills and reaps the process.
struct Child {
    /// The scenario's name for it.
    name: String,
    pid: Pid,
    /// Write end of its command pipe.
    commands: OwnedFd,
    /// Read end of its reply pipe.
    replies: OwnedFd,
    /// Whether it has been waited for (so `pid` may already name another process).
    reaped: bool,
}

impl Child {
    /// Forks a child that works in directory `dir`, and waits up to `timeout` for it to
    /// be ready (interrupt handler installed).
    fn spawn(name: &str, dir: BorrowedFd<'_>, timeout: Duration) -> Result<Child, String> {
        let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe2: {e}"));
        let (cmd_r, cmd_w) = pipe()?;
        let (reply_r, reply_w) = pipe()?;
        let setup = ChildSetup {
            commands: cmd_r.as_raw_fd(),
            replies: reply_w.as_raw_fd(),
            dir: dir.as_raw_fd(),
            parent: nix::unistd::getpid().as_raw(),
            action: interrupt_action(),
            unblocked: empty_sigset(),
        };
        // SAFETY: the child only runs `child_main`, which makes async-signal-safe system
        // calls on data prepared above and never returns, so it is sound in a child of a
        // multi-threaded process.
        let pid = match unsafe { libc::fork() } {
            -1 => return Err(format!("fork: {}", SysErrno::last())),
            0 => child_main(&setup),
            pid => pid,
        };
        // From here on dropping `child` kills and reaps the process.
        let child = Child {
            name: name.to_string(),
            pid: Pid::from_raw(pid),
            commands: cmd_w,
            replies: reply_r,
            reaped: false,
        };
        // Our copies of the child's ends must go, so that we see end of file if it dies.
        drop((cmd_r, reply_w));
        match child.reply_within(timeout)? {
            Some(r) if r.errno == 0 => Ok(child),
            Some(r) => Err(format!(
                "process {name:?} could not start: {}: {}",
                usize::try_from(r.ret)
                    .ok()
                    .and_then(|i| SETUP_STAGES.get(i))
                    .unwrap_or(&"setup"),
                SysErrno::from_raw(r.errno)
            )),
            None => Err(format!("process {name:?} did not start within {timeout:?}")),
        }
    }

    /// Sends a command.
    fn send(&self, cmd: &Command) -> Result<(), String> {
        write_record(self.commands.as_raw_fd(), cmd)
            .map_err(|e| format!("cannot reach process {:?}: {e}", self.name))
    }

    /// Sends a command that cannot block and waits up to `timeout` for its reply.
    fn call(&self, cmd: &Command, timeout: Duration) -> Result<Reply, String> {
        self.send(cmd)?;
        self.reply_within(timeout)?
            .ok_or_else(|| format!("process {:?} did not answer within {timeout:?}", self.name))
    }

    /// The reply, if one arrives within `wait` (`Duration::ZERO`: only look).
    fn reply_within(&self, wait: Duration) -> Result<Option<Reply>, String> {
        let deadline = deadline_after(wait);
        loop {
            let mut pfd = libc::pollfd {
                fd: self.replies.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // Rounded up, so as not to spin through the last fraction of a millisecond.
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = c_int::try_from(left.as_nanos().div_ceil(1_000_000)).unwrap_or(c_int::MAX);
            // SAFETY: one valid `pollfd`, for the duration of the call.
            if unsafe { libc::poll(&mut pfd, 1, ms) } < 0 {
                match SysErrno::last() {
                    SysErrno::EINTR => continue,
                    e => return Err(format!("poll: {e}")),
                }
            }
            if pfd.revents & libc::POLLIN != 0 {
                let mut reply = Reply::default();
                return read_record(self.replies.as_raw_fd(), &mut reply)
                    .map(|()| Some(reply))
                    .map_err(|e| format!("process {:?} died ({e})", self.name));
            }
            if pfd.revents != 0 {
                return Err(format!("process {:?} died", self.name));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }

    /// Interrupts the child's blocked call.
    fn interrupt(&self) -> Result<(), String> {
        kill(self.pid, Signal::SIGUSR1).map_err(|e| format!("kill {:?}: {e}", self.name))
    }

    /// Tells the child to exit and waits up to `timeout` until it has: by then it has
    /// closed all its descriptors, so every wake-up its exit causes has happened.
    fn exit(&mut self, timeout: Duration) -> Result<(), String> {
        self.send(&Command::exit())?;
        let deadline = deadline_after(timeout);
        let mut nap = FIRST_NAP;
        loop {
            match waitpid(self.pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(SysErrno::EINTR) => {}
                // ECHILD: someone else reaped it (SIGCHLD ignored); it is gone all the same.
                Ok(_) | Err(SysErrno::ECHILD) => {
                    self.reaped = true;
                    return Ok(());
                }
                Err(e) => return Err(format!("waitpid {:?}: {e}", self.name)),
            }
            if Instant::now() >= deadline {
                return Err(format!("process {:?} did not exit within {timeout:?}", self.name));
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(MAX_NAP);
        }
    }

    /// What `/proc` says about the child now.
    fn probe(&self) -> Result<Probe, String> {
        Probe::read(self.pid).map_err(|e| format!("process {:?}: {e}", self.name))
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        // SIGKILL ends the child even inside a lock wait; then reap it, so that no
        // zombie stays behind.
        let _ = kill(self.pid, Signal::SIGKILL);
        while let Err(SysErrno::EINTR) = waitpid(self.pid, None) {}
    }
}

/// The `SIGUSR1` action of a child: [`on_interrupt`], no flags (no `SA_RESTART`).
fn interrupt_action() -> libc::sigaction {
    // SAFETY: all-zero is a valid `sigaction` (no handler, no flags, empty mask).
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_interrupt as extern "C" fn(c_int) as libc::sighandler_t;
    action.sa_flags = 0;
    action.sa_mask = empty_sigset();
    action
}

fn empty_sigset() -> libc::sigset_t {
    // SAFETY: `sigemptyset` initialises the set it is given; zeroed memory is a valid
    // starting value.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        set
    }
}

/// What `/proc/<pid>` says about a child.
#[derive(Debug)]
struct Probe {
    /// `voluntary_ctxt_switches` from `status`: how many times it went to sleep.
    voluntary_switches: u64,
    /// The state letter from `stat` (`S` asleep interruptibly, `R` runnable, ...).
    state: char,
    /// The system call it is blocked in, from `syscall`; `None` for "running".
    syscall: Option<libc::c_long>,
}

impl Probe {
    /// Reads the three files, in the order [`Runner::settle`] relies on: the switch count
    /// first, then the state and the system call.
    fn read(pid: Pid) -> Result<Probe, String> {
        let read = |file: &str| {
            let path = format!("/proc/{pid}/{file}");
            std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))
        };
        let status = read("status")?;
        let stat = read("stat")?;
        let syscall = read("syscall")?;
        let voluntary_switches = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("/proc/{pid}/status: no voluntary_ctxt_switches"))?;
        // "pid (comm) S ...": the name may contain anything, so look after its last ')'.
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].trim_start().chars().next())
            .ok_or_else(|| format!("/proc/{pid}/stat: no state"))?;
        let syscall = syscall.split_whitespace().next().and_then(|n| n.parse().ok());
        Ok(Probe {
            voluntary_switches,
            state,
            syscall,
        })
    }

    /// Asleep in a lock call: interruptible sleep inside `fcntl` or `flock`.
    fn asleep_in_lock_call(&self) -> bool {
        self.state == 'S' && matches!(self.syscall, Some(libc::SYS_fcntl | libc::SYS_flock))
    }
}

/// First and longest pause between two passes of [`Runner::settle`] (and between two
/// looks at an exiting child).
const FIRST_NAP: Duration = Duration::from_micros(200);
const MAX_NAP: Duration = Duration::from_millis(4);

/// The instant `after` from now; a timeout too large to represent waits (practically)
/// forever instead of overflowing.
fn deadline_after(after: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(after)
        .or_else(|| now.checked_add(Duration::from_secs(1 << 32)))
        .unwrap_or(now)
}

/// The scratch directory `scratch` as the directory `view` shows it.
fn open_view(scratch: &ScratchDir, view: &Path) -> Result<OwnedFd, String> {
    let name = scratch.path().file_name().unwrap_or_default();
    open_dir(&view.join(name)).map_err(|e| {
        format!(
            "{} does not show the files of {}: {e}",
            view.display(),
            scratch.path().parent().unwrap_or(Path::new("/")).display()
        )
    })
}

/// `Ok` when `dir` is on tmpfs.
fn check_tmpfs(dir: &Path) -> Result<(), String> {
    harness::check_tmpfs(dir).map_err(|e| e.to_string())
}

fn open_dir(dir: &Path) -> Result<OwnedFd, String> {
    nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("open {}: {e}", dir.display()))
}

/// The state of one replay.
struct Runner<'a> {
    scn: &'a Scenario,
    opts: &'a KernelOptions,
    /// The live processes by name. Declared before `dir` because fields drop in order:
    /// children are killed and reaped before their directory is removed.
    children: BTreeMap<String, Child>,
    /// The scratch directory through each of [`KernelOptions::views`].
    views: Vec<OwnedFd>,
    /// The scratch directory, open; `dir` removes it with its files when dropped.
    dir_fd: OwnedFd,
    dir: ScratchDir,
    /// How many processes have started.
    started: usize,
    tracker: Tracker,
    /// Each open descriptor's number in its process.
    fds: HashMap<String, c_int>,
    /// Each file's number; file `n` is `f<n>` in the scratch directory, so that any
    /// name the scenario chooses is safe.
    files: HashMap<String, usize>,
}

impl<'a> Runner<'a> {
    /// The kernel's lock listing of this replay's files, with scenario names.
    fn listing(&self) -> Result<Vec<NamedListing>, String> {
        use std::os::unix::fs::MetadataExt as _;
        let mut files = HashMap::new();
        for (name, n) in &self.files {
            let path = self.dir.path().join(format!("f{n}"));
            let m = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let dev = m.dev();
            files.insert((libc::major(dev), libc::minor(dev), m.ino()), name.clone());
        }
        let pids = self
            .children
            .values()
            .filter(|c| !c.reaped)
            .map(|c| (c.pid.as_raw(), c.name.clone()))
            .collect();
        Ok(parse_proc_locks(&read_proc_locks()?, &files, &pids))
    }

    fn new(scn: &'a Scenario, opts: &'a KernelOptions, parent: &Path) -> Result<Self, String> {
        let dir = ScratchDir::create(parent, "vfscale").map_err(|e| e.to_string())?;
        let dir_fd = open_dir(dir.path())?;
        let views = opts
            .views
            .iter()
            .map(|v| open_view(&dir, v))
            .collect::<Result<_, _>>()?;
        Ok(Runner {
            scn,
            opts,
            children: BTreeMap::new(),
            views,
            dir_fd,
            dir,
            started: 0,
            tracker: Tracker::new(),
            fds: HashMap::new(),
            files: HashMap::new(),
        })
    }

    /// The directory the next process to start works in.
    fn next_dir(&mut self) -> BorrowedFd<'_> {
        let i = super::mixed::dir_of(self.started, 1 + self.views.len());
        self.started += 1;
        match i.checked_sub(1) {
            None => self.dir_fd.as_fd(),
            Some(v) => self.views[v].as_fd(),
        }
    }

    /// Runs step `index`, lets the system settle, and reports.
    fn step(&mut self, index: usize, step: &Step) -> Result<StepResult, ReplayError> {
        let at = At {
            step: index,
            line: step.line,
        };
        let (mut result, mut waiting) = self.start(at, index, step)?;
        let mut completed = Vec::new();
        for (proc, reply) in self.settle(at, waiting.as_deref())? {
            if waiting.as_ref() == Some(&proc) {
                result = self.outcome(&step.op, &reply).map_err(|e| at.kernel(e))?;
                waiting = None;
                continue;
            }
            let blocked = self.tracker.blocked().find(|(p, _)| *p == proc).map(|(_, s)| s);
            let op = blocked.and_then(|s| self.scn.steps.get(s)).map(|s| &s.op);
            let (Some(s), Some(op)) = (blocked, op) else {
                return Err(at.kernel(format!("internal error: {proc:?} answered unasked")));
            };
            completed.push((s, self.outcome(op, &reply).map_err(|e| at.kernel(e))?));
            self.tracker.clear_blocked(&proc);
        }
        if let Some(proc) = waiting {
            self.tracker.set_blocked(&proc, index);
        }
        completed.sort_by_key(|&(s, _)| s);
        Ok(StepResult {
            step: index,
            result,
            completed,
        })
    }

    /// Performs step `index` itself: its result so far (`Blocked` for a call that may
    /// wait, until settling says otherwise), and the process that may now be waiting.
    fn start(&mut self, at: At, index: usize, step: &Step) -> Result<(Outcome, Option<String>), ReplayError> {
        let timeout = self.opts.settle_timeout;
        Ok(match self.tracker.resolve(index, step)? {
            Resolved::Open {
                proc,
                file,
                fd,
                mode,
                new_proc,
            } => {
                if new_proc {
                    let child = Child::spawn(&proc, self.next_dir(), timeout);
                    self.children
                        .insert(proc.clone(), child.map_err(|e| at.kernel(e))?);
                }
                let next = self.files.len();
                let file = *self.files.entry(file).or_insert(next);
                let new = self.call_ok(at, &proc, &Command::open(file, mode), "open")?;
                self.fds.insert(fd, new);
                (Outcome::Ok, None)
            }
            Resolved::Dup { proc, fd, new } => {
                let cmd = Command::dup(self.fd_number(at, &fd)?);
                let new_fd = self.call_ok(at, &proc, &cmd, "dup")?;
                self.fds.insert(new, new_fd);
                (Outcome::Ok, None)
            }
            Resolved::Close { proc, fd, .. } => {
                let cmd = Command::close(self.fd_number(at, &fd)?);
                self.fds.remove(&fd);
                self.call_ok(at, &proc, &cmd, "close")?;
                (Outcome::Ok, None)
            }
            Resolved::Exit { proc, fds } => {
                for fd in &fds {
                    self.fds.remove(fd);
                }
                let mut child = self.children.remove(&proc).ok_or_else(|| unknown(at, &proc))?;
                child.exit(timeout).map_err(|e| at.kernel(e))?;
                (Outcome::Ok, None)
            }
            Resolved::Call { proc, fd, .. } => {
                let cmd = Command::lock_call(&step.op, self.fd_number(at, &fd)?)
                    .ok_or_else(|| at.kernel("internal error: not a lock call"))?;
                let child = self.child(at, &proc)?;
                if step.op.may_block() {
                    child.send(&cmd).map_err(|e| at.kernel(e))?;
                    (Outcome::Blocked, Some(proc))
                } else {
                    let reply = child.call(&cmd, timeout).map_err(|e| at.kernel(e))?;
                    (self.outcome(&step.op, &reply).map_err(|e| at.kernel(e))?, None)
                }
            }
            Resolved::Interrupt { proc, blocked } => {
                // Without a blocked call there is nothing to interrupt, and a signal
                // would only risk disturbing the process: send none.
                if blocked.is_some() {
                    self.child(at, &proc)?.interrupt().map_err(|e| at.kernel(e))?;
                }
                (Outcome::Ok, None)
            }
        })
    }

    /// Waits until the system has settled after step `at`, and returns the outstanding
    /// calls that finished meanwhile (the blocked ones and `stepping`, the process whose
    /// blocking call the step just started), with their replies.
    ///
    /// The system is settled when no outstanding call is still on its way: each has
    /// either finished (its reply arrived) or is asleep waiting for a lock, and will stay
    /// asleep until a later step changes something. The rule: take passes over the
    /// outstanding children; the system is settled after two consecutive passes in which
    /// no reply arrived and every child was asleep in its lock call (`stat` state `S`,
    /// `syscall` `fcntl` or `flock`) with the same `voluntary_ctxt_switches` in both.
    ///
    /// Why this is sound:
    /// - Every wake-up the step causes happens inside the step's system call (or, for
    ///   `exit`, before `waitpid` reports the child gone), and that has returned before
    ///   the first pass. A blocking call the step started counts as woken too: it is not
    ///   asleep in its lock call until it has made its first attempt.
    /// - A woken task is `R` until it sleeps again (a task being woken shows `R` as well),
    ///   and each sleep bumps its voluntary switch count. `/proc/<pid>/syscall` names the
    ///   call only once the task is really off the CPU and off the run queue, so a task
    ///   preempted on its way to sleep is not taken as asleep.
    /// - A pass polls a child's reply pipe, then reads its switch count, then its state
    ///   and system call. Call a child's *reaction* the time from its wake-up to its next
    ///   sleep or its reply. A reaction under way at either pass's look at the state
    ///   shows as not asleep (a reply written after the poll leaves the child in read(2),
    ///   not in a lock call); one that happens between the first pass's count and the
    ///   second's changes the count or sends a reply. So a reaction that escapes both
    ///   passes either was over before the first pass reached the child, which is fine,
    ///   or began after the second pass began reading it. But a task is only woken by
    ///   another's reaction under way, which would then also have begun after the first
    ///   pass ended; following wakers back must end at the step (or the signal, or the
    ///   call the step started), all before the first pass: a contradiction.
    ///
    /// Gives up after [`KernelOptions::settle_timeout`].
    fn settle(&self, at: At, stepping: Option<&str>) -> Result<Vec<(String, Reply)>, ReplayError> {
        let mut outstanding: Vec<String> = self
            .tracker
            .blocked()
            .map(|(p, _)| p.to_string())
            .chain(stepping.map(str::to_string))
            .collect();
        let mut finished = Vec::new();
        let deadline = deadline_after(self.opts.settle_timeout);
        let mut nap = FIRST_NAP;
        let mut previous = None;
        // When the current run of unchanged quiet passes began.
        let mut quiet_since = Instant::now();
        while !outstanding.is_empty() {
            let quiet = self.pass(at, &mut outstanding, &mut finished)?;
            if quiet.is_some() && quiet == previous {
                if quiet_since.elapsed() >= self.opts.quiet {
                    break;
                }
            } else {
                quiet_since = Instant::now();
            }
            previous = quiet;
            if Instant::now() >= deadline {
                return Err(at.kernel(format!(
                    "the system did not settle within {:?}; still busy: {}",
                    self.opts.settle_timeout,
                    outstanding.join(", ")
                )));
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(MAX_NAP);
        }
        Ok(finished)
    }

    /// One pass of [`Runner::settle`]: moves the replies that arrived from `outstanding`
    /// to `finished`; if none did and every remaining child is asleep in its lock call,
    /// returns their switch counts.
    fn pass(
        &self,
        at: At,
        outstanding: &mut Vec<String>,
        finished: &mut Vec<(String, Reply)>,
    ) -> Result<Option<Vec<(Pid, u64)>>, ReplayError> {
        let mut counts = Some(Vec::with_capacity(outstanding.len()));
        let mut busy = Vec::with_capacity(outstanding.len());
        for proc in outstanding.drain(..) {
            let child = self.child(at, &proc)?;
            if let Some(reply) = child.reply_within(Duration::ZERO).map_err(|e| at.kernel(e))? {
                finished.push((proc, reply));
                counts = None;
                continue;
            }
            if let Some(c) = &mut counts {
                let probe = child.probe().map_err(|e| at.kernel(e))?;
                if matches!(probe.state, 'Z' | 'X') {
                    return Err(at.kernel(format!("process {proc:?} died")));
                }
                if probe.asleep_in_lock_call() {
                    c.push((child.pid, probe.voluntary_switches));
                } else {
                    counts = None;
                }
            }
            busy.push(proc);
        }
        *outstanding = busy;
        Ok(counts)
    }

    /// Runs a command that cannot block in `proc` and requires it to succeed; returns the
    /// call's return value.
    fn call_ok(&self, at: At, proc: &str, cmd: &Command, what: &str) -> Result<c_int, ReplayError> {
        let reply = self
            .child(at, proc)?
            .call(cmd, self.opts.settle_timeout)
            .map_err(|e| at.kernel(e))?;
        if reply.errno != 0 {
            return Err(at.kernel(format!("{what} failed: {}", SysErrno::from_raw(reply.errno))));
        }
        Ok(reply.ret)
    }

    /// A lock call's outcome from its reply.
    fn outcome(&self, op: &Op, reply: &Reply) -> Result<Outcome, String> {
        if reply.errno != 0 {
            return Ok(Outcome::Err(Errno::from_raw(reply.errno)));
        }
        match op {
            Op::Fcntl { cmd, .. } if cmd.is_get() => self.lock_found(reply),
            _ => Ok(Outcome::Ok),
        }
    }

    /// The `F_GETLK` / `F_OFD_GETLK` answer, with the owner's pid mapped to its name.
    fn lock_found(&self, reply: &Reply) -> Result<Outcome, String> {
        let ty = i16::try_from(reply.l_type)
            .ok()
            .and_then(|t| LockType::from_raw(t).ok())
            .ok_or_else(|| format!("F_GETLK returned l_type {}", reply.l_type))?;
        if ty == LockType::Unlock {
            return Ok(Outcome::NoLock);
        }
        let pid = if reply.l_pid == -1 {
            LockPid::Ofd
        } else {
            let owner = self.children.iter().find(|(_, c)| c.pid.as_raw() == reply.l_pid);
            let (name, _) = owner.ok_or_else(|| {
                format!(
                    "F_GETLK returned pid {}, which is no scenario process",
                    reply.l_pid
                )
            })?;
            LockPid::Proc(name.clone())
        };
        Ok(Outcome::Lock {
            ty,
            start: reply.l_start,
            len: reply.l_len,
            pid,
        })
    }

    fn child(&self, at: At, proc: &str) -> Result<&Child, ReplayError> {
        self.children.get(proc).ok_or_else(|| unknown(at, proc))
    }

    fn fd_number(&self, at: At, fd: &str) -> Result<c_int, ReplayError> {
        self.fds
            .get(fd)
            .copied()
            .ok_or_else(|| at.kernel(format!("internal error: no descriptor {fd:?}")))
    }
}

/// The tracker knows a process the runner does not: a bug, not a scenario error.
fn unknown(at: At, proc: &str) -> ReplayError {
    at.kernel(format!("internal error: no process {proc:?}"))
}

#[cfg(test)]
mod tests {
    use super::super::format::render_results;
    use super::*;

    /// Replays `text`; `None` (after saying why) when the kernel target cannot run here.
    fn replay_text(text: &str) -> Option<Result<String, ReplayError>> {
        if let Err(why) = available() {
            println!("SKIP: {why}");
            return None;
        }
        let scn = Scenario::parse(text).expect("test scenario parses");
        Some(replay(&scn).map(|r| render_results(&r)))
    }

    /// Asserts that `text` replays to `expected`, one result line per step, compared as
    /// JSON values (key order does not matter).
    fn check(text: &str, expected: &[&str]) {
        let Some(got) = replay_text(text) else { return };
        let got = got.unwrap_or_else(|e| panic!("replay failed: {e}"));
        let values = |lines: Vec<&str>| -> Vec<serde_json::Value> {
            lines
                .into_iter()
                .map(|l| serde_json::from_str(l).expect("JSON line"))
                .collect()
        };
        assert_eq!(
            values(got.lines().collect()),
            values(expected.to_vec()),
            "got:\n{got}"
        );
    }

    const OPEN_BOTH: &str = r#"
{"op":"open","proc":"p1","file":"a","fd":"d1","mode":"rw"}
{"op":"open","proc":"p2","file":"a","fd":"d2","mode":"rw"}
"#;

    /// Asserts that `steps`, after the two opens of [`OPEN_BOTH`], replay to `expected`.
    fn check_after_open_both(steps: &[&str], expected: &[&str]) {
        check(&format!("{OPEN_BOTH}{}\n", steps.join("\n")), expected);
    }

    #[test]
    fn conflict_is_eagain() {
        check_after_open_both(
            &[
                r#"{"op":"fcntl","fd":"d1","cmd":"F_SETLK","type":"F_WRLCK","start":0,"len":10}"#,
                r#"{"op":"fcntl","fd":"d2","cmd":"F_SETLK","type":"F_RDLCK","start":5,"len":10}"#,
            ],
            &[
                r#"{"step":0,"result":"ok"}"#,
                r#"{"step":1,"result":"ok"}"#,
                r#"{"step":2,"result":"ok"}"#,
                r#"{"step":3,"result":"EAGAIN"}"#,
            ],
        );
    }

    #[test]
    fn blocked_setlkw_completes_on_unlock() {
        check_after_open_both(
            &[
                r#"{"op":"fcntl","fd":"d1","cmd":"F_SETLK","type":"F_WRLCK","start":0,"len":10}"#,
                r#"{"op":"fcntl","fd":"d2","cmd":"F_SETLKW","type":"F_WRLCK","start":0,"len":10}"#,
                r#"{"op":"fcntl","fd":"d1","cmd":"F_SETLK","type":"F_UNLCK","start":0,"len":10}"#,
            ],
            &[
                r#"{"step":0,"result":"ok"}"#,
                r#"{"step":1,"result":"ok"}"#,
                r#"{"step":2,"result":"ok"}"#,
                r#"{"step":3,"result":"blocked"}"#,
                r#"{"step":4,"result":"ok","completed":[{"step":3,"result":"ok"}]}"#,
            ],
        );
    }

    #[test]
    fn interrupt_fails_the_blocked_call_with_eintr() {
        check_after_open_both(
            &[
                r#"{"op":"flock","fd":"d1","how":"LOCK_EX","nb":true}"#,
                r#"{"op":"flock","fd":"d2","how":"LOCK_SH"}"#,
                r#"{"op":"interrupt","proc":"p2"}"#,
                r#"{"op":"interrupt","proc":"p2"}"#,
                r#"{"op":"flock","fd":"d2","how":"LOCK_SH","nb":true}"#,
            ],
            &[
                r#"{"step":0,"result":"ok"}"#,
                r#"{"step":1,"result":"ok"}"#,
                r#"{"step":2,"result":"ok"}"#,
                r#"{"step":3,"result":"blocked"}"#,
                r#"{"step":4,"result":"ok","completed":[{"step":3,"result":"EINTR"}]}"#,
                r#"{"step":5,"result":"ok"}"#,
                r#"{"step":6,"result":"EAGAIN"}"#,
            ],
        );
    }

    #[test]
    fn getlk_names_the_owner_and_len_zero_runs_to_eof() {
        check_after_open_both(
            &[
                r#"{"op":"fcntl","fd":"d1","cmd":"F_SETLK","type":"F_WRLCK","start":5,"len":0}"#,
                r#"{"op":"fcntl","fd":"d2","cmd":"F_GETLK","type":"F_RDLCK","start":0,"len":100}"#,
            ],
            &[
                r#"{"step":0,"result":"ok"}"#,
                r#"{"step":1,"result":"ok"}"#,
                r#"{"step":2,"result":"ok"}"#,
                r#"{"step":3,"result":{"type":"F_WRLCK","start":5,"len":0,"pid":"p1"}}"#,
            ],
        );
    }

    #[test]
    fn ofd_lock_is_reported_with_pid_minus_one() {
        check_after_open_both(
            &[
                r#"{"op":"fcntl","fd":"d1","cmd":"F_OFD_SETLK","type":"F_RDLCK","start":0,"len":10}"#,
                r#"{"op":"fcntl","fd":"d2","cmd":"F_OFD_GETLK","type":"F_WRLCK","start":0,"len":0}"#,
                r#"{"op":"fcntl","fd":"d2","cmd":"F_GETLK","type":"F_WRLCK","start":3,"len":1}"#,
            ],
            &[
                r#"{"step":0,"result":"ok"}"#,
                r#"{"step":1,"result":"ok"}"#,
                r#"{"step":2,"result":"ok"}"#,
                r#"{"step":3,"result":{"type":"F_RDLCK","start":0,"len":10,"pid":-1}}"#,
                r#"{"step":4,"result":{"type":"F_RDLCK","start":0,"len":10,"pid":-1}}"#,
            ],
        );
    }

    #[test]
    fn unknown_descriptor_is_a_scenario_error_naming_the_line() {
        let text = r#"# a comment, so that lines and steps differ
{"op":"open","proc":"p1","file":"a","fd":"d1","mode":"rw"}
{"op":"fcntl","fd":"nope","cmd":"F_SETLK","type":"F_WRLCK","start":0,"len":1}
"#;
        let Some(got) = replay_text(text) else { return };
        match got {
            Err(ReplayError::Scenario(e)) => {
                assert_eq!(e.to_string(), r#"line 3: unknown descriptor "nope""#)
            }
            other => panic!("expected a scenario error, got {other:?}"),
        }
    }
}
