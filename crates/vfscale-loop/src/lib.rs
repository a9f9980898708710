//! Linux `drivers/block/loop.c` in userspace: the loop registry (`/dev/loop-control`),
//! loop devices with Linux's states, ioctls and errnos, block I/O to real backing
//! files, and the scalability design of Pasha Tatashin's 2021 "scale loop device lock"
//! (Linux 5.12): a lock per device (`lo_mutex`) instead of one control lock
//! (`loop_ctl_mutex`) for open, release and every ioctl.
//!
//! For userspace block stacks, test harnesses and storage simulators: a [`LoopControl`]
//! is the registry; [`LoopControl::open`] gives a [`LoopHandle`] (an open file
//! description of `/dev/loopN`), whose methods are the ioctls and the I/O.
//!
//! ```
//! use std::os::fd::AsFd;
//! use vfscale_loop::*;
//!
//! let dir = std::env::temp_dir().join(format!("vfscale-loop-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir).unwrap();
//! let path = dir.join("image");
//! std::fs::write(&path, vec![7u8; 65536]).unwrap();
//! let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
//!
//! let ctl = LoopControl::new(Settings::default());      // loop0..loop7, per-device locks
//! let i = ctl.get_free().unwrap();                       // 0
//! let h = ctl.open(i, OpenMode { write: true, excl: false }).unwrap();
//! let cfg = LoopConfig {
//!     block_size: 4096,
//!     info: LoopInfo { offset: 4096, flags: LO_FLAGS_AUTOCLEAR, file_name: b"image".to_vec(), ..LoopInfo::default() },
//! };
//! h.configure(LoopFile::Fd(file.as_fd()), &cfg).unwrap();
//! assert_eq!(h.size(), 61440);                           // the file past the offset
//! assert_eq!(h.write_at(&[1u8; 512], 0).unwrap(), 512);  // lands at byte 4096 of the file
//! let mut buf = [0u8; 4];
//! assert_eq!(h.read_at(&mut buf, 510).unwrap(), 4);
//! assert_eq!(buf, [1, 1, 7, 7]);
//! assert_eq!(h.write_at(&[1u8; 512], 61440), Err(Errno::ENOSPC));   // at the end
//! assert_eq!(ctl.remove(i as i32), Err(Errno::EBUSY));   // bound
//! drop(h);                                               // last close: auto-clear detaches
//! assert_eq!(ctl.list()[0], (0, None));
//! ctl.remove(i as i32).unwrap();
//! std::fs::remove_dir_all(&dir).unwrap();
//! ```
//!
//! # Where to find what
//!
//! | concept | file |
//! |---|---|
//! | the registry (`/dev/loop-control`): add, remove, get_free, lookup | `control.rs` |
//! | one device (`struct loop_device`): states, ioctls, open/release, block I/O | `device.rs` |
//! | the request queue's freeze (I/O without a lock) | `queue.rs` |
//! | a backing file and its `O_DIRECT` twin | `backing.rs` |
//! | lock counters for the lab | `stats.rs` |
//! | error numbers | `errno.rs` |
//! | the std/loom/shuttle primitives | `sync.rs` |
//!
//! # States
//!
//! ```text
//!            LOOP_CONFIGURE / LOOP_SET_FD
//!  Unbound ───────────────────────────────▶ Bound ──── LOOP_CLR_FD (only opener),
//!   ▲   │                                     │        or last close with AUTOCLEAR
//!   │   │ LOOP_CTL_REMOVE                     ▼
//!   │   ▼ (no openers)                     Rundown ── last close: detach ──▶ Unbound
//!   │  Deleting ──▶ gone
//! ```
//!
//! * `LOOP_CLR_FD` always sets `AUTOCLEAR`; with other openers the device stays bound and
//!   detaches at its last close (Linux 6.11's lazy detach). In `Rundown` opens fail with
//!   `ENXIO`, I/O with `EIO`, ioctls that need a bound device with `ENXIO`.
//! * A detached device keeps the read-only mark and the write cache of its last binding
//!   (a write then gives `EPERM`, a flush `EIO`), until a new binding sets them; a fresh
//!   device (just added) has neither.
//! * An open file description of a device ([`LoopHandle`], shared by its clones) is one
//!   opener; a device backed by another loop device holds that handle's description, so
//!   the lower device is released only when the upper one lets go of it.
//!
//! # What each lock protects
//!
//! | lock | Linux | protects |
//! |---|---|---|
//! | control lock | `loop_ctl_mutex` | the registry's index (add, remove, get_free) and devices' `visible` mark; in [`CtlLock::Global`] also every device operation (as before Linux 5.12) |
//! | validation lock | `loop_validate_mutex` | loop-on-loop checks: held by `LOOP_CONFIGURE`/`LOOP_SET_FD`/`LOOP_CHANGE_FD` with a loop device as backing and always by `LOOP_CLR_FD`, so a cycle check never races a change of the chain (`validate_lock_acquisitions` counts it) |
//! | device lock | `lo_mutex` | the device's state transitions, flags, offset, size limit, file name, opener count, exclusive claims and backing |
//! | `lo_lock` (leaf) | `lo_lock` | the backing as seen by the loop-on-loop walk and the listing |
//! | lookup shard (leaf) | (the block layer's node lookup) | finding device N for `open` |
//! | queue freeze | `blk_mq_freeze_queue` | the I/O configuration (backing, offset, direct I/O): changed only while no I/O is in flight; I/O takes **no lock**, only a per-CPU in-flight count |
//!
//! # Lock order
//!
//! control lock → validation lock → device lock → `lo_lock`; the control lock → a
//! lookup shard. A lookup shard and `lo_lock` are leaves. The device lock is never held
//! while a backing reference is dropped (dropping a loop backing releases that device,
//! which takes its own device lock), and no path takes the control lock while holding a
//! device lock.
//!
//! # Scalability: a lock per device (Tatashin, 2021)
//!
//! With [`CtlLock::PerDevice`] (the default), open, release, I/O and per-device
//! configuration never touch the control lock; I/O touches no lock at all. With
//! [`CtlLock::Global`] every operation takes the control lock first, as Linux did before
//! 5.12. [`LoopControl::stats`] counts acquisitions and waiting time of each lock.
//!
//! The caller is treated as `CAP_SYS_ADMIN` (a read-only handle may still change the
//! status and block size, as root's may).

#![warn(missing_docs)]

mod backing;
mod control;
mod device;
mod errno;
mod queue;
mod stats;
pub(crate) mod sync;

pub use control::{LoopControl, LOOP_MAX_DEVICES};
pub use device::{
    LoopConfig, LoopDevice, LoopFile, LoopHandle, LoopInfo, LoopState, OpenMode,
    LOOP_CONFIGURE_SETTABLE_FLAGS, LOOP_SET_STATUS_CLEARABLE_FLAGS, LOOP_SET_STATUS_SETTABLE_FLAGS,
    LO_FLAGS_AUTOCLEAR, LO_FLAGS_DIRECT_IO, LO_FLAGS_PARTSCAN, LO_FLAGS_READ_ONLY, LO_NAME_SIZE,
    MAX_BLOCK_SIZE,
};
pub use errno::Errno;
pub use stats::LoopStats;

use stats::Stats;
use sync::Mutex;

/// How the control lock is used: the setting that compares Linux before and after the
/// per-device lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CtlLock {
    /// Every operation under the one control lock (Linux up to 5.11).
    Global,
    /// A lock per device; the control lock keeps only the registry (Linux 5.12 on).
    #[default]
    PerDevice,
}

/// Registry settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The control-lock design.
    pub ctl_lock: CtlLock,
    /// Devices made at start (`CONFIG_BLK_DEV_LOOP_MIN_COUNT`, 8).
    pub initial_devices: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            ctl_lock: CtlLock::PerDevice,
            initial_devices: 8,
        }
    }
}

/// The registry's state the devices share.
pub(crate) struct Shared {
    pub(crate) settings: Settings,
    /// `loop_ctl_mutex` and the index it protects.
    pub(crate) ctl: Mutex<control::Idr>,
    /// `loop_validate_mutex`.
    pub(crate) validate: Mutex<()>,
    pub(crate) stats: Stats,
}

pub(crate) type CtlState = control::Idr;

impl Shared {
    fn new(settings: Settings) -> Shared {
        Shared {
            settings,
            ctl: Mutex::new(control::Idr::default()),
            validate: Mutex::new(()),
            stats: Stats::new(),
        }
    }
}
