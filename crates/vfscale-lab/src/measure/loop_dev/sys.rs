//! The two loop systems a workload drives through one interface: `vfscale-loop`'s
//! registry (the library targets) and the running kernel's `/dev/loop-control` and
//! `/dev/loopN` (the kernel target, through the conformance kernel runner's device
//! calls, under the lock [`KernelLab`] holds).
//!
//! [`KernelLab`] is the kernel target's guard: the exclusive `flock` on
//! `/dev/loop-control` for the whole workload, the indices it reserved (checked free,
//! at [`FIRST_INDEX`] and above), and the clean-up that detaches and removes every one
//! of them, also on an error path, a panic or `SIGINT`/`SIGTERM`/`SIGHUP` (the signal
//! only asks the workload to stop; the guard restores the devices, puts the previous
//! signal dispositions back and raises the signal again).

use std::collections::BTreeSet;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use vfscale_conformance::loop_dev::kernel;

use crate::measure::interrupt::SignalGuard;
use vfscale_loop::{
    CtlLock, LoopConfig, LoopControl, LoopFile, LoopHandle, LoopInfo, LoopState, LoopStats, OpenMode,
    Settings, LO_FLAGS_READ_ONLY,
};

/// The first device index a workload uses (devices below it are the machine's).
pub const FIRST_INDEX: u32 = 64;
/// How long the clean-up waits for one device to detach and go.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// How a device is opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Open {
    /// `O_RDWR` instead of `O_RDONLY`.
    pub write: bool,
    /// `O_EXCL`: an exclusive claim, as `mount` holds.
    pub excl: bool,
    /// `O_DIRECT` (kernel only: reads then reach the loop driver, not the device's page
    /// cache; the library has no page cache in front of a device).
    pub direct: bool,
}

impl Open {
    /// Read-only.
    pub const RO: Open = Open {
        write: false,
        excl: false,
        direct: false,
    };
}

/// What a workload does to loop devices.
pub trait LoopSys: Sync {
    /// An open device (closed when dropped).
    type Handle: Send;
    /// Opens device `index`.
    fn open(&self, index: u32, how: Open) -> Result<Self::Handle, String>;
    /// `LOOP_CONFIGURE` with `backing`, read-only when `read_only`.
    fn configure(&self, h: &Self::Handle, backing: &File, read_only: bool) -> Result<(), String>;
    /// Reads `buf.len()` bytes at `pos` of the device (all of them, or an error).
    fn read(&self, h: &Self::Handle, buf: &mut [u8], pos: u64) -> Result<(), String>;
    /// `LOOP_CLR_FD` (the device detaches at its last close).
    fn clear(&self, h: &Self::Handle) -> Result<(), String>;
    /// `LOOP_CTL_ADD` of `index`.
    fn add(&self, index: u32) -> Result<(), String>;
    /// `LOOP_CTL_REMOVE` of `index`.
    fn remove(&self, index: u32) -> Result<(), String>;
    /// Whether device `index` is bound.
    fn is_bound(&self, index: u32) -> bool;
    /// The indices in the registry.
    fn present(&self) -> Result<BTreeSet<u32>, String>;
    /// Lock counters (`None`: the kernel's cannot be observed from userspace).
    fn stats(&self) -> Option<LoopStats>;
}

/// The first `k` indices at [`FIRST_INDEX`] and above that are not in `present`.
pub fn pick_free(present: &BTreeSet<u32>, k: usize) -> Vec<u32> {
    (FIRST_INDEX..vfscale_loop::LOOP_MAX_DEVICES)
        .filter(|i| !present.contains(i))
        .take(k)
        .collect()
}

// ---------------------------------------------------------------------------------------
// The library

/// A `vfscale-loop` registry with the target's control-lock design.
pub struct Library {
    ctl: LoopControl,
}

impl Library {
    /// A registry with Linux's 8 devices at start; `prepatch`: [`CtlLock::Global`].
    pub fn new(prepatch: bool) -> Library {
        let ctl_lock = if prepatch {
            CtlLock::Global
        } else {
            CtlLock::PerDevice
        };
        Library {
            ctl: LoopControl::new(Settings {
                ctl_lock,
                ..Settings::default()
            }),
        }
    }
}

impl LoopSys for Library {
    type Handle = LoopHandle;

    fn open(&self, index: u32, how: Open) -> Result<LoopHandle, String> {
        let mode = OpenMode {
            write: how.write,
            excl: how.excl,
        };
        self.ctl
            .open(index, mode)
            .map_err(|e| format!("open loop{index}: {e}"))
    }

    fn configure(&self, h: &LoopHandle, backing: &File, read_only: bool) -> Result<(), String> {
        let cfg = LoopConfig {
            block_size: 0,
            info: LoopInfo {
                flags: if read_only { LO_FLAGS_READ_ONLY } else { 0 },
                ..LoopInfo::default()
            },
        };
        h.configure(LoopFile::Fd(backing.as_fd()), &cfg)
            .map_err(|e| format!("LOOP_CONFIGURE loop{}: {e}", h.device().number()))
    }

    fn read(&self, h: &LoopHandle, buf: &mut [u8], pos: u64) -> Result<(), String> {
        match h.read_at(buf, pos) {
            Ok(n) if n == buf.len() => Ok(()),
            Ok(n) => Err(format!(
                "read loop{} at {pos}: {n} of {} bytes",
                h.device().number(),
                buf.len()
            )),
            Err(e) => Err(format!("read loop{} at {pos}: {e}", h.device().number())),
        }
    }

    fn clear(&self, h: &LoopHandle) -> Result<(), String> {
        h.clr_fd()
            .map_err(|e| format!("LOOP_CLR_FD loop{}: {e}", h.device().number()))
    }

    fn add(&self, index: u32) -> Result<(), String> {
        self.ctl
            .add(index as i32)
            .map(|_| ())
            .map_err(|e| format!("LOOP_CTL_ADD {index}: {e}"))
    }

    fn remove(&self, index: u32) -> Result<(), String> {
        self.ctl
            .remove(index as i32)
            .map_err(|e| format!("LOOP_CTL_REMOVE {index}: {e}"))
    }

    fn is_bound(&self, index: u32) -> bool {
        self.ctl
            .lookup(index)
            .is_some_and(|d| d.state() != LoopState::Unbound)
    }

    fn present(&self) -> Result<BTreeSet<u32>, String> {
        Ok(self.ctl.list().into_iter().map(|(i, _)| i).collect())
    }

    fn stats(&self) -> Option<LoopStats> {
        Some(self.ctl.stats())
    }
}

// ---------------------------------------------------------------------------------------
// The kernel

fn os_error(e: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(e)
}

/// The running kernel's loop driver, driven while a [`KernelLab`] holds the lock.
pub struct Kernel<'a> {
    ctl: &'a kernel::Control,
}

impl LoopSys for Kernel<'_> {
    type Handle = OwnedFd;

    fn open(&self, index: u32, how: Open) -> Result<OwnedFd, String> {
        let mut flags = if how.write { libc::O_RDWR } else { libc::O_RDONLY };
        if how.excl {
            flags |= libc::O_EXCL;
        }
        if how.direct {
            flags |= libc::O_DIRECT;
        }
        loop {
            match kernel::open_device(index, flags) {
                Ok(fd) => return Ok(fd),
                Err(libc::EINTR) if !kernel::stop_requested() => continue,
                Err(e) => return Err(format!("open /dev/loop{index}: {}", os_error(e))),
            }
        }
    }

    fn configure(&self, h: &OwnedFd, backing: &File, read_only: bool) -> Result<(), String> {
        let flags = if read_only { LO_FLAGS_READ_ONLY } else { 0 };
        kernel::configure(h.as_fd(), backing.as_raw_fd(), 0, 0, 0, flags, None)
            .map_err(|e| format!("LOOP_CONFIGURE: {}", os_error(e)))
    }

    fn read(&self, h: &OwnedFd, buf: &mut [u8], pos: u64) -> Result<(), String> {
        let mut done = 0;
        while done < buf.len() {
            let rest = &mut buf[done..];
            // SAFETY: `rest` is a valid writable buffer of `rest.len()` bytes.
            let n = unsafe {
                libc::pread(
                    h.as_raw_fd(),
                    rest.as_mut_ptr().cast(),
                    rest.len(),
                    (pos + done as u64) as libc::off_t,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) && !kernel::stop_requested() {
                    continue;
                }
                return Err(format!("pread at {pos}: {e}"));
            }
            if n == 0 {
                return Err(format!("pread at {pos}: {done} of {} bytes", buf.len()));
            }
            done += n as usize;
        }
        Ok(())
    }

    fn clear(&self, h: &OwnedFd) -> Result<(), String> {
        kernel::clear(h.as_fd()).map_err(|e| format!("LOOP_CLR_FD: {}", os_error(e)))
    }

    fn add(&self, index: u32) -> Result<(), String> {
        self.ctl
            .add(i64::from(index))
            .map(|_| ())
            .map_err(|e| format!("LOOP_CTL_ADD {index}: {}", os_error(e)))
    }

    fn remove(&self, index: u32) -> Result<(), String> {
        loop {
            match self.ctl.remove(i64::from(index)) {
                Ok(_) => return Ok(()),
                Err(libc::EINTR) if !kernel::stop_requested() => continue,
                Err(e) => return Err(format!("LOOP_CTL_REMOVE {index}: {}", os_error(e))),
            }
        }
    }

    fn is_bound(&self, index: u32) -> bool {
        kernel::is_bound(index)
    }

    fn present(&self) -> Result<BTreeSet<u32>, String> {
        Ok(kernel::registry()?.into_keys().collect())
    }

    fn stats(&self) -> Option<LoopStats> {
        None
    }
}

/// The kernel target's hold on the machine's loop devices: the exclusive `flock` on
/// `/dev/loop-control`, the signal handlers, and the indices it reserved. Dropping it
/// (or [`KernelLab::finish`]) detaches and removes every reserved device that exists.
pub struct KernelLab {
    ctl: Option<kernel::Control>,
    reserved: Vec<u32>,
    signals: Option<SignalGuard>,
    finished: bool,
}

impl KernelLab {
    /// Takes the lock (waiting for any other user of real loop devices here to finish)
    /// and installs the signal handlers.
    pub fn open() -> Result<KernelLab, String> {
        let ctl = kernel::Control::open().map_err(|u| u.0)?;
        Ok(KernelLab {
            ctl: Some(ctl),
            reserved: Vec::new(),
            signals: Some(SignalGuard::install(Some(kernel::request_stop))),
            finished: false,
        })
    }

    fn control(&self) -> &kernel::Control {
        self.ctl
            .as_ref()
            .expect("the lock is held until the guard is dropped")
    }

    /// The kernel's loop driver.
    pub fn sys(&self) -> Kernel<'_> {
        Kernel { ctl: self.control() }
    }

    /// Reserves `k` indices that are not in the registry now (at [`FIRST_INDEX`] and
    /// above): nobody else adds them while the lock is held, so whatever is there at the
    /// end is this workload's and is removed.
    pub fn reserve(&mut self, k: usize) -> Result<Vec<u32>, String> {
        let present: BTreeSet<u32> = kernel::registry()?.into_keys().collect();
        let taken: BTreeSet<u32> = present
            .union(&self.reserved.iter().copied().collect())
            .copied()
            .collect();
        let got = pick_free(&taken, k);
        if got.len() < k {
            return Err(format!("only {} free loop indices from {FIRST_INDEX}", got.len()));
        }
        self.reserved.extend(&got);
        Ok(got)
    }

    /// Detaches and removes every reserved device that exists (in parallel: a removal
    /// sleeps tens of milliseconds in the kernel), and checks none is left.
    pub fn finish(&mut self) -> Result<(), String> {
        if self.finished {
            return Ok(());
        }
        self.finished = true;
        let ctl = self.control();
        let present = kernel::registry()?;
        let mine: Vec<u32> = self
            .reserved
            .iter()
            .copied()
            .filter(|i| present.contains_key(i))
            .collect();
        let mut problems: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = mine.iter().map(|&i| s.spawn(move || release(ctl, i))).collect();
            handles
                .into_iter()
                .filter_map(|h| match h.join() {
                    Ok(r) => r.err(),
                    Err(_) => Some("a clean-up thread panicked".to_string()),
                })
                .collect()
        });
        let after = kernel::registry()?;
        for i in &self.reserved {
            if after.contains_key(i) && problems.iter().all(|p| !p.contains(&format!("loop{i}"))) {
                problems.push(format!("/dev/loop{i} is still there"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

/// Detaches device `i` if it is bound and removes it, waiting while it is busy.
fn release(ctl: &kernel::Control, i: u32) -> Result<(), String> {
    let deadline = Instant::now() + RELEASE_TIMEOUT;
    loop {
        if kernel::is_bound(i) {
            // LOOP_CLR_FD through our own descriptor: the detach happens when it closes.
            if let Ok(fd) = kernel::open_device(i, libc::O_RDONLY | libc::O_NONBLOCK) {
                let _ = kernel::clear(fd.as_fd());
            }
        }
        match ctl.remove(i64::from(i)) {
            Ok(_) | Err(libc::ENODEV) => return Ok(()),
            Err(libc::EINTR) => continue,
            Err(libc::EBUSY) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(format!("cannot remove /dev/loop{i}: {}", os_error(e))),
        }
    }
}

impl Drop for KernelLab {
    fn drop(&mut self) {
        if let Err(m) = self.finish() {
            eprintln!("vfscale loop workload: restoring the loop devices: {m}");
        }
        // Release the lock before a re-raised signal ends the process.
        drop(self.ctl.take());
        drop(self.signals.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_indices_start_at_64_and_skip_taken_ones() {
        let present: BTreeSet<u32> = [0, 1, 7, 64, 66].into_iter().collect();
        assert_eq!(pick_free(&present, 3), vec![65, 67, 68]);
        assert_eq!(pick_free(&BTreeSet::new(), 0), Vec::<u32>::new());
    }

    #[test]
    fn the_library_counts_locks_by_design() {
        // Per device: an open and a close take no control lock; prepatch: each takes it.
        for prepatch in [false, true] {
            let sys = Library::new(prepatch);
            sys.add(64).unwrap();
            let before = sys.stats().unwrap();
            drop(sys.open(64, Open::RO).unwrap());
            let d = sys.stats().unwrap().since(&before);
            assert_eq!(d.ctl_lock_acquisitions, if prepatch { 2 } else { 0 });
            assert_eq!(d.device_lock_acquisitions, 2);
            sys.remove(64).unwrap();
            assert!(!sys.present().unwrap().contains(&64));
        }
    }
}
