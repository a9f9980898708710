//! Kernel runner: replays a loop scenario against the running kernel's loop driver
//! (`/dev/loop-control`, real `/dev/loopN`), backing files in a fresh tmpfs directory
//! under `/dev/shm`.
//!
//! # The starting state and clean-up (the spec's rules, to the letter)
//!
//! 1. The runner opens `/dev/loop-control` and takes an exclusive `flock(2)` on it for
//!    the whole replay, so two runners (or a runner and the lab's kernel target) never
//!    interleave.
//! 2. It checks the starting state: the registry (`/sys/block/loop*`) holds exactly
//!    devices 0 to 7, none bound (no `/sys/block/loopN/loop/`), none with a size. A
//!    device 0–7 that is unbound but not fresh (`/sys/block/loopN/ro` is 1, or its
//!    `queue/write_cache` is `write back`: what a detached device keeps of its last
//!    binding) is removed and added again; a removal that fails (the device is open
//!    elsewhere) means the machine is not in the starting state, and the replay is
//!    refused with `SKIP`-able [`Unavailable`] error.
//! 3. After the replay, and on every error path (a [`Drop`] guard, so a panic or an
//!    early return restores too), it closes every handle, detaches every bound device
//!    (`LOOP_CLR_FD`, repeated until loop-on-loop stacks have come apart), removes every
//!    device other than 0–7, adds back any of 0–7 the scenario removed, re-adds any of
//!    0–7 that is no longer fresh, and checks the starting state again.
//! 4. [`request_stop`] (what the CLI's `SIGINT`/`SIGTERM` handler calls) makes the
//!    replay stop before its next step with an error, which restores the machine; the
//!    signal handler itself only sets a flag.
//!
//! # I/O without the page cache in the results
//!
//! Before a `read`, and before and after a `write`, the runner issues `BLKFLSBUF` (write
//! back and drop the page cache) on the device and on every loop device below it (loop
//! on loop, followed through `/sys/block/loopN/loop/backing_file`).

use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use linux_raw_sys::ioctl::{BLKFLSBUF, BLKGETSIZE64, BLKROGET, BLKSSZGET};
use linux_raw_sys::loop_device as ld;

use super::format::{backing_byte, Backing, Mode, Op, Outcome, Scenario, Status, Step, StepResult, Tracker};
use crate::format::{At, ReplayError};

/// The control device.
pub const LOOP_CONTROL: &str = "/dev/loop-control";
/// Where scratch directories are made.
const SCRATCH_PARENT: &str = "/dev/shm";
/// Devices of the starting state.
pub const START_DEVICES: std::ops::Range<u32> = 0..8;

static STOP: AtomicBool = AtomicBool::new(false);

/// Asks a replay in progress to stop before its next step (and restore the machine).
/// Async-signal-safe: it only stores to an atomic.
pub fn request_stop() {
    STOP.store(true, Ordering::SeqCst);
}

/// Whether [`request_stop`] was called.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

extern "C" fn on_signal(_sig: libc::c_int) {
    request_stop();
}

/// Installs `SIGINT` and `SIGTERM` handlers that call [`request_stop`] (for the CLI: an
/// interrupted replay restores the machine before the process exits). Without
/// `SA_RESTART`, so a blocking call returns `EINTR` and the runner notices at once.
pub fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is a valid value; the handler only stores to an
        // atomic, which is async-signal-safe; sigemptyset and sigaction get valid
        // pointers to locals.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = 0;
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Why the kernel runner cannot run here (the test and CLI print `SKIP:` and this).
#[derive(Debug)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

fn cpath(p: &str) -> CString {
    CString::new(p).expect("paths here have no NUL")
}

/// `ioctl` with an integer argument: `Ok(return value)` or `Err(errno)`.
fn ioctl_int(fd: RawFd, req: u32, arg: libc::c_ulong) -> Result<i64, i32> {
    // SAFETY: the loop and control ioctls given an integer read no memory of ours.
    let r = unsafe { libc::ioctl(fd, req as _, arg) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as i64)
    }
}

/// `ioctl` with a pointer argument.
///
/// # Safety
/// `arg` must point to a value of the type `req` reads or writes.
unsafe fn ioctl_ptr<T>(fd: RawFd, req: u32, arg: *mut T) -> Result<i64, i32> {
    // SAFETY: the caller passes the pointer the request expects.
    let r = unsafe { libc::ioctl(fd, req as _, arg) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as i64)
    }
}

fn open_raw(path: &str, flags: i32) -> Result<OwnedFd, i32> {
    let c = cpath(path);
    // SAFETY: a valid NUL-terminated path; the returned descriptor is owned here.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, 0o600) };
    if fd < 0 {
        Err(errno())
    } else {
        // SAFETY: fd was just returned by open and is owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

fn dev_path(i: u32) -> String {
    format!("/dev/loop{i}")
}

/// The registry as sysfs shows it: index → the last path component of the backing file
/// (`None` when unbound).
pub fn registry() -> Result<BTreeMap<u32, Option<String>>, String> {
    let mut out = BTreeMap::new();
    let rd = std::fs::read_dir("/sys/block").map_err(|e| format!("/sys/block: {e}"))?;
    for e in rd {
        let e = e.map_err(|e| format!("/sys/block: {e}"))?;
        let name = e.file_name();
        let Some(n) = name.to_str().and_then(|s| s.strip_prefix("loop")) else {
            continue;
        };
        let Ok(i) = n.parse::<u32>() else { continue };
        let bf = format!("/sys/block/loop{i}/loop/backing_file");
        let backing = match std::fs::read_to_string(&bf) {
            Ok(s) => {
                let s = s.trim_end_matches('\n');
                Some(s.rsplit('/').next().unwrap_or(s).to_string())
            }
            Err(_) => None,
        };
        out.insert(i, backing);
    }
    Ok(out)
}

fn read_sys(i: u32, what: &str) -> Option<String> {
    std::fs::read_to_string(format!("/sys/block/loop{i}/{what}"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Opens `/dev/loop{i}` with `flags` (`O_CLOEXEC` added): the descriptor or the errno.
pub fn open_device(i: u32, flags: i32) -> Result<OwnedFd, i32> {
    open_raw(&dev_path(i), flags)
}

/// Whether device `i` is bound (sysfs shows its `loop/backing_file`).
pub fn is_bound(i: u32) -> bool {
    read_sys(i, "loop/backing_file").is_some()
}

/// `LOOP_CONFIGURE` on the open device `dev`: binds it to `backing` (a descriptor, or -1)
/// with the given block size, offset, size limit, flags and file name.
pub fn configure(
    dev: BorrowedFd<'_>,
    backing: RawFd,
    block_size: u32,
    offset: u64,
    sizelimit: u64,
    flags: u32,
    name: Option<&str>,
) -> Result<(), i32> {
    // SAFETY: loop_config is plain data; all-zero is a valid value.
    let mut cfg: ld::loop_config = unsafe { std::mem::zeroed() };
    cfg.fd = backing as u32;
    cfg.block_size = block_size;
    cfg.info.lo_offset = offset;
    cfg.info.lo_sizelimit = sizelimit;
    cfg.info.lo_flags = flags;
    if let Some(n) = name {
        copy_name(&mut cfg.info.lo_file_name, n);
    }
    // SAFETY: LOOP_CONFIGURE reads a loop_config.
    unsafe { ioctl_ptr(dev.as_raw_fd(), ld::LOOP_CONFIGURE, &mut cfg) }.map(|_| ())
}

/// `LOOP_CLR_FD` on the open device `dev` (the detach happens at its last close).
pub fn clear(dev: BorrowedFd<'_>) -> Result<(), i32> {
    ioctl_int(dev.as_raw_fd(), ld::LOOP_CLR_FD, 0).map(|_| ())
}

/// Whether unbound device `i` is fresh: not read-only, no write cache.
fn is_fresh(i: u32) -> bool {
    read_sys(i, "ro").as_deref() == Some("0")
        && read_sys(i, "queue/write_cache").as_deref() == Some("write through")
}

/// The control device, open and exclusively locked (`flock(2)`) for the life of the
/// value: the one lock every user of real loop devices here (this runner, the lab's
/// kernel target, their tests) holds while it changes anything.
pub struct Control {
    fd: OwnedFd,
}

impl Control {
    /// Opens `/dev/loop-control` and waits for the exclusive lock (`Unavailable` without
    /// the device or the permission, or when [`request_stop`] interrupts the wait).
    pub fn open() -> Result<Control, Unavailable> {
        if !Path::new(LOOP_CONTROL).exists() {
            return Err(Unavailable(format!("there is no {LOOP_CONTROL}")));
        }
        let fd = open_raw(LOOP_CONTROL, libc::O_RDWR).map_err(|e| {
            Unavailable(format!(
                "cannot open {LOOP_CONTROL}: {} (run as root)",
                std::io::Error::from_raw_os_error(e)
            ))
        })?;
        loop {
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX) } == 0 {
                break;
            }
            let e = errno();
            if e == libc::EINTR && !stop_requested() {
                continue;
            }
            return Err(Unavailable(format!(
                "flock({LOOP_CONTROL}): {}",
                std::io::Error::from_raw_os_error(e)
            )));
        }
        Ok(Control { fd })
    }

    /// `LOOP_CTL_ADD`: the new index, or the errno.
    pub fn add(&self, i: i64) -> Result<i64, i32> {
        ioctl_int(self.fd.as_raw_fd(), ld::LOOP_CTL_ADD, i as libc::c_ulong)
    }

    /// `LOOP_CTL_REMOVE`.
    pub fn remove(&self, i: i64) -> Result<i64, i32> {
        ioctl_int(self.fd.as_raw_fd(), ld::LOOP_CTL_REMOVE, i as libc::c_ulong)
    }
}

/// Checks the starting state under the lock, making unbound, non-fresh devices 0–7
/// fresh (remove and add again). Err says what is wrong.
fn prepare(ctl: &Control) -> Result<(), String> {
    let reg = registry()?;
    let want: Vec<u32> = START_DEVICES.collect();
    let have: Vec<u32> = reg.keys().copied().collect();
    if have != want {
        return Err(format!(
            "the loop registry holds devices {have:?}, not exactly 0 to 7"
        ));
    }
    for (i, b) in &reg {
        if let Some(b) = b {
            return Err(format!("/dev/loop{i} is bound (to {b})"));
        }
        if read_sys(*i, "size").as_deref() != Some("0") {
            return Err(format!("/dev/loop{i} has a size but no backing file"));
        }
    }
    for i in START_DEVICES {
        if !is_fresh(i) {
            ctl.remove(i64::from(i)).map_err(|e| {
                format!(
                    "/dev/loop{i} is not fresh and cannot be removed to renew it: {} (is it open?)",
                    std::io::Error::from_raw_os_error(e)
                )
            })?;
            ctl.add(i64::from(i)).map_err(|e| {
                format!(
                    "/dev/loop{i} was removed to renew it but cannot be added back: {}",
                    std::io::Error::from_raw_os_error(e)
                )
            })?;
        }
    }
    Ok(())
}

/// Whether the machine is in the starting state now (without changing anything except
/// renewing non-fresh unbound devices 0–7); takes and drops the lock.
pub fn check_starting_state() -> Result<(), Unavailable> {
    let ctl = Control::open()?;
    prepare(&ctl).map_err(Unavailable)
}

/// Whether the kernel target can run here: `/dev/loop-control` opens, the lock is
/// taken, and the machine is in the starting state.
pub fn available() -> Result<(), String> {
    check_starting_state().map_err(|u| u.0)
}

/// Detaches every bound device, removes devices other than 0–7, adds back missing ones
/// and renews non-fresh ones, then checks the starting state.
fn restore(ctl: &Control) -> Result<(), String> {
    let mut problems = Vec::new();
    // Detach: each round clears every bound device; loop-on-loop stacks come apart one
    // level per round (a lower device's clear is lazy while an upper one holds it).
    for _round in 0..16 {
        let reg = registry()?;
        let bound: Vec<u32> = reg.iter().filter(|(_, b)| b.is_some()).map(|(i, _)| *i).collect();
        if bound.is_empty() {
            break;
        }
        for i in bound {
            if let Ok(fd) = open_raw(&dev_path(i), libc::O_RDONLY) {
                let _ = clear(fd.as_fd());
                drop(fd);
            }
        }
    }
    let reg = registry()?;
    for (i, b) in &reg {
        if let Some(b) = b {
            problems.push(format!("/dev/loop{i} is still bound to {b}"));
        }
    }
    for i in reg.keys() {
        if !START_DEVICES.contains(i) {
            if let Err(e) = ctl.remove(i64::from(*i)) {
                problems.push(format!(
                    "cannot remove /dev/loop{i}: {}",
                    std::io::Error::from_raw_os_error(e)
                ));
            }
        }
    }
    for i in START_DEVICES {
        let present = reg.contains_key(&i);
        if present && !is_fresh(i) {
            if let Err(e) = ctl.remove(i64::from(i)) {
                problems.push(format!(
                    "cannot renew /dev/loop{i}: {}",
                    std::io::Error::from_raw_os_error(e)
                ));
                continue;
            }
        }
        if !present || !is_fresh(i) {
            if let Err(e) = ctl.add(i64::from(i)) {
                problems.push(format!(
                    "cannot add /dev/loop{i} back: {}",
                    std::io::Error::from_raw_os_error(e)
                ));
            }
        }
    }
    if problems.is_empty() {
        prepare(ctl)
    } else {
        Err(problems.join("; "))
    }
}

/// A replay in progress: the lock, the scratch directory, backing files and handles.
/// Dropping it restores the machine.
struct Runner {
    ctl: Control,
    dir: PathBuf,
    tracker: Tracker,
    backings: HashMap<String, File>,
    handles: HashMap<String, (OwnedFd, u32)>,
    restored: bool,
}

impl Runner {
    fn new() -> Result<Runner, ReplayError> {
        let ctl = Control::open().map_err(|u| ReplayError::Kernel(u.0))?;
        prepare(&ctl).map_err(|m| ReplayError::Kernel(format!("not in the starting state: {m}")))?;
        let template = cpath(&format!("{SCRATCH_PARENT}/vfscale-loop-XXXXXX"));
        let mut buf = template.into_bytes_with_nul();
        // SAFETY: buf is a writable NUL-terminated template, as mkdtemp requires.
        let p = unsafe { libc::mkdtemp(buf.as_mut_ptr() as *mut libc::c_char) };
        if p.is_null() {
            return Err(ReplayError::Kernel(format!(
                "mkdtemp under {SCRATCH_PARENT}: {}",
                std::io::Error::last_os_error()
            )));
        }
        buf.pop();
        let dir = PathBuf::from(String::from_utf8(buf).expect("ASCII template"));
        Ok(Runner {
            ctl,
            dir,
            tracker: Tracker::new(),
            backings: HashMap::new(),
            handles: HashMap::new(),
            restored: false,
        })
    }

    /// Closes everything and restores the machine (once).
    fn finish(&mut self) -> Result<(), String> {
        if self.restored {
            return Ok(());
        }
        self.restored = true;
        self.handles.clear();
        self.backings.clear();
        let r = restore(&self.ctl);
        let _ = std::fs::remove_dir_all(&self.dir);
        r
    }

    fn handle(&self, at: At, h: &str) -> Result<(RawFd, u32), ReplayError> {
        self.handles
            .get(h)
            .map(|(fd, i)| (fd.as_raw_fd(), *i))
            .ok_or_else(|| at.kernel(format!("no descriptor for handle {h:?}")))
    }

    fn backing_fd(&self, at: At, b: &Backing) -> Result<i32, ReplayError> {
        Ok(match b {
            Backing::File(n) => self
                .backings
                .get(n)
                .map(|f| f.as_raw_fd())
                .ok_or_else(|| at.kernel(format!("no file for backing {n:?}")))?,
            Backing::Handle(h) => self.handle(at, h)?.0,
            Backing::Null => -1,
        })
    }

    /// The loop devices below device `i` (loop on loop), following sysfs.
    fn below(&self, i: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut cur = i;
        for _ in 0..64 {
            let Some(b) = read_sys(cur, "loop/backing_file") else {
                break;
            };
            let last = b.rsplit('/').next().unwrap_or(&b).to_string();
            let Some(n) = last.strip_prefix("loop").and_then(|s| s.parse::<u32>().ok()) else {
                break;
            };
            if !b.starts_with("/dev/") {
                break;
            }
            out.push(n);
            cur = n;
        }
        out
    }

    /// `BLKFLSBUF` on the handle's device and every loop device below it.
    fn flush_buffers(&self, fd: RawFd, i: u32) {
        let _ = ioctl_int(fd, BLKFLSBUF, 0);
        for j in self.below(i) {
            if let Ok(f) = open_raw(&dev_path(j), libc::O_RDONLY | libc::O_NONBLOCK) {
                let _ = ioctl_int(f.as_raw_fd(), BLKFLSBUF, 0);
            }
        }
    }

    fn step(&mut self, at: At, step: &Step) -> Result<Outcome, ReplayError> {
        self.tracker.check(step)?;
        let r = |x: Result<i64, i32>| match x {
            Ok(_) => Outcome::Ok,
            Err(e) => Outcome::errno(e),
        };
        Ok(match &step.op {
            Op::Backing { name, size, mode } => {
                let path = self.dir.join(name);
                let mut data = Vec::with_capacity(*size as usize);
                data.extend((0..*size).map(backing_byte));
                std::fs::write(&path, &data).map_err(|e| at.kernel(format!("{}: {e}", path.display())))?;
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(*mode == Mode::Rw)
                    .open(&path)
                    .map_err(|e| at.kernel(format!("{}: {e}", path.display())))?;
                self.backings.insert(name.clone(), f);
                Outcome::Ok
            }
            // ftruncate(2) on the scenario's descriptor: one opened read-only gives EINVAL.
            Op::TruncateBacking { name, size } => match self.backings[name].set_len(*size) {
                Ok(()) => Outcome::Ok,
                Err(e) => Outcome::errno(e.raw_os_error().unwrap_or(libc::EIO)),
            },
            Op::ReadBacking { name, offset, len } => {
                let f = &self.backings[name];
                let mut buf = vec![0u8; *len as usize];
                match read_full(|b, o| f.read_at(b, o), &mut buf, *offset) {
                    Ok(n) => Outcome::read(&buf[..n]),
                    Err(e) => Outcome::errno(e),
                }
            }
            Op::Open {
                dev,
                handle,
                mode,
                excl,
            } => {
                let Ok(i) = u32::try_from(*dev) else {
                    return Ok(Outcome::errno(libc::ENOENT));
                };
                let mut flags = match mode {
                    Mode::Rw => libc::O_RDWR,
                    Mode::Ro => libc::O_RDONLY,
                };
                if *excl {
                    flags |= libc::O_EXCL;
                }
                match open_raw(&dev_path(i), flags) {
                    Ok(fd) => {
                        self.tracker.opened(handle);
                        self.handles.insert(handle.clone(), (fd, i));
                        Outcome::Ok
                    }
                    Err(e) => Outcome::errno(e),
                }
            }
            Op::Close { handle } => {
                self.handles.remove(handle);
                Outcome::Ok
            }
            Op::Configure {
                handle,
                backing,
                block_size,
                offset,
                sizelimit,
                flags,
            } => {
                let (fd, _) = self.handle(at, handle)?;
                let bfd = self.backing_fd(at, backing)?;
                let name = match backing {
                    Backing::File(n) => Some(n.as_str()),
                    _ => None,
                };
                // SAFETY: the descriptor is the handle's, open for the whole step.
                let dev = unsafe { BorrowedFd::borrow_raw(fd) };
                r(configure(dev, bfd, *block_size, *offset, *sizelimit, *flags, name).map(|_| 0))
            }
            Op::SetFd { handle, backing } => {
                let (fd, _) = self.handle(at, handle)?;
                let bfd = self.backing_fd(at, backing)?;
                r(ioctl_int(fd, ld::LOOP_SET_FD, bfd as u32 as libc::c_ulong))
            }
            Op::ChangeFd { handle, backing } => {
                let (fd, _) = self.handle(at, handle)?;
                let bfd = self.backing_fd(at, backing)?;
                r(ioctl_int(fd, ld::LOOP_CHANGE_FD, bfd as u32 as libc::c_ulong))
            }
            Op::ClrFd { handle } => {
                let (fd, _) = self.handle(at, handle)?;
                // SAFETY: the descriptor is the handle's, open for the whole step.
                r(clear(unsafe { BorrowedFd::borrow_raw(fd) }).map(|_| 0))
            }
            Op::SetStatus64 {
                handle,
                offset,
                sizelimit,
                flags,
                file_name,
            } => {
                let (fd, _) = self.handle(at, handle)?;
                // SAFETY: loop_info64 is plain data; all-zero is a valid value.
                let mut info: ld::loop_info64 = unsafe { std::mem::zeroed() };
                info.lo_offset = *offset;
                info.lo_sizelimit = *sizelimit;
                info.lo_flags = *flags;
                copy_name(&mut info.lo_file_name, file_name);
                // SAFETY: LOOP_SET_STATUS64 reads a loop_info64.
                r(unsafe { ioctl_ptr(fd, ld::LOOP_SET_STATUS64, &mut info) })
            }
            Op::GetStatus64 { handle } => {
                let (fd, _) = self.handle(at, handle)?;
                // SAFETY: loop_info64 is plain data; all-zero is a valid value.
                let mut info: ld::loop_info64 = unsafe { std::mem::zeroed() };
                // SAFETY: LOOP_GET_STATUS64 writes a loop_info64.
                match unsafe { ioctl_ptr(fd, ld::LOOP_GET_STATUS64, &mut info) } {
                    Ok(_) => {
                        let end = info.lo_file_name.iter().position(|b| *b == 0).unwrap_or(64);
                        Outcome::Status(Status {
                            number: info.lo_number,
                            offset: info.lo_offset,
                            sizelimit: info.lo_sizelimit,
                            flags: info.lo_flags,
                            file_name: String::from_utf8_lossy(&info.lo_file_name[..end]).into_owned(),
                        })
                    }
                    Err(e) => Outcome::errno(e),
                }
            }
            Op::SetCapacity { handle } => {
                let (fd, _) = self.handle(at, handle)?;
                r(ioctl_int(fd, ld::LOOP_SET_CAPACITY, 0))
            }
            Op::SetBlockSize { handle, size } => {
                let (fd, _) = self.handle(at, handle)?;
                r(ioctl_int(fd, ld::LOOP_SET_BLOCK_SIZE, *size as libc::c_ulong))
            }
            Op::SetDirectIo { handle, on } => {
                let (fd, _) = self.handle(at, handle)?;
                r(ioctl_int(
                    fd,
                    ld::LOOP_SET_DIRECT_IO,
                    u64::from(*on) as libc::c_ulong,
                ))
            }
            Op::Size { handle } => {
                let (fd, _) = self.handle(at, handle)?;
                let mut v: u64 = 0;
                // SAFETY: BLKGETSIZE64 writes a u64.
                match unsafe { ioctl_ptr(fd, BLKGETSIZE64, &mut v) } {
                    Ok(_) => Outcome::Int(v as i64),
                    Err(e) => Outcome::errno(e),
                }
            }
            Op::BlockSize { handle } => {
                let (fd, _) = self.handle(at, handle)?;
                let mut v: libc::c_int = 0;
                // SAFETY: BLKSSZGET writes an int.
                match unsafe { ioctl_ptr(fd, BLKSSZGET, &mut v) } {
                    Ok(_) => Outcome::Int(i64::from(v)),
                    Err(e) => Outcome::errno(e),
                }
            }
            Op::Ro { handle } => {
                let (fd, _) = self.handle(at, handle)?;
                let mut v: libc::c_int = 0;
                // SAFETY: BLKROGET writes an int.
                match unsafe { ioctl_ptr(fd, BLKROGET, &mut v) } {
                    Ok(_) => Outcome::Bool(v != 0),
                    Err(e) => Outcome::errno(e),
                }
            }
            Op::Read { handle, offset, len } => {
                let (fd, i) = self.handle(at, handle)?;
                self.flush_buffers(fd, i);
                let mut buf = vec![0u8; *len as usize];
                match read_full(|b, o| pread(fd, b, o), &mut buf, *offset) {
                    Ok(n) => Outcome::read(&buf[..n]),
                    Err(e) => Outcome::errno(e),
                }
            }
            Op::Write {
                handle,
                offset,
                len,
                byte,
            } => {
                let (fd, i) = self.handle(at, handle)?;
                self.flush_buffers(fd, i);
                let buf = vec![*byte; *len as usize];
                let res = pwrite(fd, &buf, *offset);
                self.flush_buffers(fd, i);
                match res {
                    Ok(n) => Outcome::Int(n as i64),
                    Err(e) => Outcome::errno(e),
                }
            }
            Op::Fsync { handle } => {
                let (fd, _) = self.handle(at, handle)?;
                // SAFETY: fsync on a descriptor we own.
                if unsafe { libc::fsync(fd) } == 0 {
                    Outcome::Ok
                } else {
                    Outcome::errno(errno())
                }
            }
            Op::CtlAdd { index } => match self.ctl.add(*index) {
                Ok(i) => Outcome::Int(i),
                Err(e) => Outcome::errno(e),
            },
            Op::CtlRemove { index } => r(self.ctl.remove(*index)),
            Op::CtlGetFree => match ioctl_int(self.ctl.fd.as_raw_fd(), ld::LOOP_CTL_GET_FREE, 0) {
                Ok(i) => Outcome::Int(i),
                Err(e) => Outcome::errno(e),
            },
            Op::List => Outcome::List(registry().map_err(|m| at.kernel(m))?.into_iter().collect()),
        })
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Err(m) = self.finish() {
            eprintln!("vfscale loop kernel runner: restoring the loop devices: {m}");
        }
    }
}

fn copy_name(dst: &mut [u8; 64], name: &str) {
    let b = name.as_bytes();
    let n = b.len().min(63);
    dst[..n].copy_from_slice(&b[..n]);
}

fn pread(fd: RawFd, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    // SAFETY: buf is a valid writable buffer of buf.len() bytes.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), off as libc::off_t) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

fn pwrite(fd: RawFd, buf: &[u8], off: u64) -> Result<usize, i32> {
    if off > i64::MAX as u64 {
        return Err(libc::EINVAL);
    }
    // SAFETY: buf is a valid readable buffer of buf.len() bytes.
    let n = unsafe { libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), off as libc::off_t) };
    if n < 0 {
        Err(errno())
    } else {
        Ok(n as usize)
    }
}

/// Reads until `buf` is full, the end, or an error; an error after some bytes were read
/// ends the read there, as one `pread` of the whole would.
fn read_full(
    mut f: impl FnMut(&mut [u8], u64) -> std::io::Result<usize>,
    buf: &mut [u8],
    offset: u64,
) -> Result<usize, i32> {
    if offset > i64::MAX as u64 {
        return Err(libc::EINVAL);
    }
    let mut done = 0;
    while done < buf.len() {
        match f(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) if done == 0 => return Err(e.raw_os_error().unwrap_or(libc::EIO)),
            Err(_) => break,
        }
    }
    Ok(done)
}

/// Replays `scn` against the running kernel: one result per step, in step order. The
/// machine is restored afterwards whatever happens (see the module documentation); a
/// failure to restore is an error.
pub fn replay(scn: &Scenario) -> Result<Vec<StepResult>, ReplayError> {
    let mut runner = Runner::new()?;
    let mut out = Vec::with_capacity(scn.steps.len());
    let mut failed = None;
    for (index, step) in scn.steps.iter().enumerate() {
        let at = At {
            step: index,
            line: step.line,
        };
        if stop_requested() {
            failed = Some(at.kernel("interrupted"));
            break;
        }
        match runner.step(at, step) {
            Ok(result) => out.push(StepResult::new(index, result)),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let restored = runner.finish();
    if let Some(e) = failed {
        if let Err(m) = restored {
            eprintln!("vfscale loop kernel runner: restoring the loop devices: {m}");
        }
        return Err(e);
    }
    restored.map_err(|m| ReplayError::Kernel(format!("restoring the starting state: {m}")))?;
    Ok(out)
}
