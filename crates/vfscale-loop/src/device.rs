//! One loop device (`struct loop_device`): its lock, its states, the ioctls, open and
//! release, and block I/O.

use std::os::fd::BorrowedFd;

use crate::backing::{BackingFile, FileKind};
use crate::errno::Errno;
use crate::queue::{Entered, Queue};
use crate::stats::LockKind;
use crate::sync::{Arc, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering};
use crate::{CtlLock, Shared};

/// `LO_FLAGS_READ_ONLY`.
pub const LO_FLAGS_READ_ONLY: u32 = 1;
/// `LO_FLAGS_AUTOCLEAR`.
pub const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// `LO_FLAGS_PARTSCAN`.
pub const LO_FLAGS_PARTSCAN: u32 = 8;
/// `LO_FLAGS_DIRECT_IO`.
pub const LO_FLAGS_DIRECT_IO: u32 = 16;
/// Flags `LOOP_CONFIGURE` accepts.
pub const LOOP_CONFIGURE_SETTABLE_FLAGS: u32 =
    LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR | LO_FLAGS_PARTSCAN | LO_FLAGS_DIRECT_IO;
/// Flags `LOOP_SET_STATUS64` sets.
pub const LOOP_SET_STATUS_SETTABLE_FLAGS: u32 = LO_FLAGS_AUTOCLEAR | LO_FLAGS_PARTSCAN;
/// Flags `LOOP_SET_STATUS64` clears.
pub const LOOP_SET_STATUS_CLEARABLE_FLAGS: u32 = LO_FLAGS_AUTOCLEAR;
/// `LO_NAME_SIZE`.
pub const LO_NAME_SIZE: usize = 64;

const SECTOR: u64 = 512;
const PAGE: u64 = 4096;
/// A description's first readahead window in pages: a loop device's `read_ahead_kb`
/// (128, `VM_READAHEAD_PAGES`; its queue sets no `io_opt`).
const RA_PAGES: u64 = 32;
/// `bdi->io_pages`: the device's `max_sectors_kb` (1280) in pages.
const IO_PAGES: u64 = 320;
/// `prev_pos` before the first read (Linux's -1).
const NO_PREV_POS: u64 = u64::MAX;
/// The largest logical block size (`BLK_MAX_BLOCK_SIZE`).
pub const MAX_BLOCK_SIZE: u64 = 64 << 10;

/// A device's state (`Lo_unbound`, `Lo_bound`, `Lo_rundown`, `Lo_deleting`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopState {
    /// No backing file; can be configured or removed.
    Unbound,
    /// Bound to a backing file; I/O reaches it.
    Bound,
    /// Being detached: `LOOP_CLR_FD` or auto-clear chose to detach at the last close.
    /// Opens fail with `ENXIO`, I/O with `EIO`.
    Rundown,
    /// Being removed from the registry. Opens fail with `ENXIO`.
    Deleting,
}

impl LoopState {
    fn from_u32(v: u32) -> LoopState {
        match v {
            0 => LoopState::Unbound,
            1 => LoopState::Bound,
            2 => LoopState::Rundown,
            _ => LoopState::Deleting,
        }
    }
    fn as_u32(self) -> u32 {
        match self {
            LoopState::Unbound => 0,
            LoopState::Bound => 1,
            LoopState::Rundown => 2,
            LoopState::Deleting => 3,
        }
    }
}

/// What backs a device: a file, or another loop device through one of its open handles.
#[derive(Clone)]
pub(crate) enum Backing {
    File(Arc<BackingFile>),
    Loop(Arc<OpenDesc>),
}

impl Backing {
    fn size(&self) -> Result<u64, Errno> {
        match self {
            Backing::File(f) => f.size(),
            Backing::Loop(d) => Ok(d.dev.capacity.load(Ordering::Acquire)),
        }
    }
    fn writable(&self) -> bool {
        match self {
            Backing::File(f) => f.writable,
            Backing::Loop(d) => d.write,
        }
    }
    /// `FMODE_CAN_ODIRECT`: a block device (loop on loop) always allows it.
    fn can_odirect(&self) -> bool {
        match self {
            Backing::File(f) => f.direct().is_some(),
            Backing::Loop(_) => true,
        }
    }
    /// `loop_query_min_dio_size`: `STATX_DIOALIGN`'s offset alignment; a block device
    /// reports its logical block size.
    fn min_dio(&self) -> u64 {
        match self {
            Backing::File(f) => f.min_dio(),
            Backing::Loop(d) => u64::from(d.dev.block_size()),
        }
    }
}

/// What a caller passes as the backing descriptor of `LOOP_CONFIGURE`, `LOOP_SET_FD`
/// and `LOOP_CHANGE_FD`.
#[derive(Clone, Copy)]
pub enum LoopFile<'a> {
    /// An open file (regular file or block device); the device takes its own
    /// reference to the open file description.
    Fd(BorrowedFd<'a>),
    /// Another loop device, through an open handle (loop on loop).
    Device(&'a LoopHandle),
    /// A descriptor that is not open (descriptor -1): `EBADF`.
    BadFd,
}

/// `struct loop_info64` as far as this library keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LoopInfo {
    /// `lo_number` (ignored on input).
    pub number: u32,
    /// `lo_offset`.
    pub offset: u64,
    /// `lo_sizelimit` (0: no limit).
    pub sizelimit: u64,
    /// `lo_flags`.
    pub flags: u32,
    /// `lo_file_name`: at most 63 bytes are kept.
    pub file_name: Vec<u8>,
}

/// `struct loop_config`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LoopConfig {
    /// Logical block size (0: the default, 512).
    pub block_size: u32,
    /// Offset, size limit, flags and file name.
    pub info: LoopInfo,
}

/// Open mode of a device handle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenMode {
    /// Opened for writing (`O_RDWR`/`O_WRONLY`).
    pub write: bool,
    /// An exclusive claim (`O_EXCL`), as a mounted filesystem holds.
    pub excl: bool,
}

/// What the device lock (`lo_mutex`) protects.
pub(crate) struct LoInner {
    pub(crate) offset: u64,
    pub(crate) sizelimit: u64,
    pub(crate) flags: u32,
    pub(crate) file_name: Vec<u8>,
    /// Open file descriptions of the device (`disk_openers`).
    pub(crate) openers: usize,
    /// Open file descriptions holding an exclusive claim (at most 1).
    pub(crate) excl_holders: usize,
    /// The backing (as `lo_backing_file`); the I/O path reads its copy in the queue.
    pub(crate) backing: Option<Backing>,
    /// `lo_min_dio_size`: the backing's direct-I/O alignment, taken when it is assigned
    /// (`loop_assign_backing_file`), so a later block-size change below does not move it.
    pub(crate) min_dio: u64,
}

/// What I/O reads, replaced only while the queue is frozen.
pub(crate) struct IoConfig {
    backing: Backing,
    offset: u64,
    dio: bool,
    read_only: bool,
}

/// A loop device.
pub struct LoopDevice {
    pub(crate) number: u32,
    pub(crate) shared: Arc<Shared>,
    /// `lo_mutex`.
    pub(crate) lo: Mutex<LoInner>,
    /// `lo_state`: written under `lo_mutex`, read without it (get_free, I/O, validation).
    state: AtomicU32,
    /// Registry visibility (`idr_visible`), written under the control lock.
    pub(crate) visible: AtomicBool,
    /// `lo_lock`: the backing, for the loop-on-loop walk and the listing (a leaf lock).
    lo_lock: Mutex<Option<Backing>>,
    /// Device size in bytes (the disk capacity).
    capacity: AtomicU64,
    /// Logical block size.
    block_size: AtomicU32,
    /// The disk's read-only mark (`set_disk_ro`): kept after detach.
    disk_ro: AtomicBool,
    /// The queue's write cache: kept after detach.
    write_cache: AtomicBool,
    /// Block size of the device's page cache, as Linux sets it at the first open
    /// (`set_init_blocksize`), for the answer to writes during rundown.
    cache_block: AtomicU64,
    /// Write-back failures (`mapping->wb_err`, an `errseq_t`): writes the page cache took
    /// but could not store. 0 before the first; then a counter above bit 0, which is
    /// [`WB_SEEN`] once a description has reported the latest failure.
    wb_err: AtomicU64,
    queue: Queue<IoConfig>,
    /// Live handles, for nothing but debugging leaks.
    handles: AtomicUsize,
}

/// An open file description of a device. Dropping the last reference (the handle and
/// any device it backs) is the release (`lo_release`).
pub(crate) struct OpenDesc {
    pub(crate) dev: Arc<LoopDevice>,
    pub(crate) write: bool,
    pub(crate) excl: bool,
    /// `file->f_wb_err`: the device's `wb_err` when this description last reported one
    /// (or sampled it at open).
    pub(crate) wb_seen: AtomicU64,
    /// `file->f_ra.ra_pages`: divided by 4 at each failed read.
    ra_pages: AtomicU64,
    /// `file->f_ra.prev_pos`: where the last read that returned data ended.
    prev_pos: AtomicU64,
}

/// An open handle of a loop device (`/dev/loopN` opened once). Clones share the open
/// file description, as `dup` does; the device is released when the last clone, and any
/// device this handle backs, let go of it.
#[derive(Clone)]
pub struct LoopHandle {
    pub(crate) desc: Arc<OpenDesc>,
}

/// Guard over the device lock; in [`CtlLock::Global`] also over the control lock.
pub(crate) struct DevGuard<'a> {
    pub(crate) inner: MutexGuard<'a, LoInner>,
    _ctl: Option<MutexGuard<'a, crate::CtlState>>,
}

impl std::ops::Deref for DevGuard<'_> {
    type Target = LoInner;
    fn deref(&self) -> &LoInner {
        &self.inner
    }
}
impl std::ops::DerefMut for DevGuard<'_> {
    fn deref_mut(&mut self) -> &mut LoInner {
        &mut self.inner
    }
}

/// The validation lock (when taken), held across a loop-on-loop check.
struct ValidateGuard<'a>(#[allow(dead_code)] Option<MutexGuard<'a, ()>>);

fn valid_block_size(bs: u64) -> bool {
    bs.is_power_of_two() && (SECTOR..=MAX_BLOCK_SIZE).contains(&bs)
}

/// `get_size`: bytes from `offset` to the end, limited by `sizelimit`, whole sectors.
fn window_size(file_size: u64, offset: u64, sizelimit: u64) -> u64 {
    let mut size = file_size.saturating_sub(offset);
    if sizelimit > 0 && sizelimit < size {
        size = sizelimit;
    }
    size & !(SECTOR - 1)
}

/// `ERRSEQ_SEEN` of a device's `wb_err`.
const WB_SEEN: u64 = 1;

impl LoopDevice {
    /// `mapping_set_error` -> `errseq_set`: a new failure bumps the counter only once the
    /// last one was seen, so failures nobody reported yet count as one.
    fn set_wb_err(&self) {
        let _ = self
            .wb_err
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| match v {
                0 => Some(2),
                v if v & WB_SEEN != 0 => Some((v & !WB_SEEN) + 2),
                v => Some(v),
            });
    }

    /// `errseq_sample` at open: a failure nobody has reported yet is left for the new
    /// description to report too.
    fn sample_wb_err(&self) -> u64 {
        let v = self.wb_err.load(Ordering::Acquire);
        if v & WB_SEEN == 0 {
            0
        } else {
            v
        }
    }

    /// A write whose blocks the device cannot read or store: during rundown, or when the
    /// page cache's blocks are smaller than the logical block size (Linux reads a block
    /// the write covers in part, `block_write_begin`, and writes blocks back,
    /// `block_write_full_folio`, one bio per cache block, which the device refuses:
    /// `bio_unaligned`). The folios before the first one that needs a read are taken
    /// (`EIO` when there are none) and lost at write-back.
    fn write_lost(&self, pos: u64, n: u64, cb: u64) -> Result<usize, Errno> {
        let folio = cb.max(PAGE);
        let end = pos + n;
        if !pos.is_multiple_of(cb) {
            return Err(Errno::EIO);
        }
        // Folio boundaries are cache-block boundaries: only the last folio can be partial.
        let taken = if end.is_multiple_of(cb) {
            end
        } else {
            (end / folio * folio).max(pos)
        };
        if taken == pos {
            return Err(Errno::EIO);
        }
        self.set_wb_err();
        Ok((taken - pos) as usize)
    }
}

/// The pages Linux 6.18's `page_cache_sync_ra` reads for a read of `n` bytes at `pos`
/// that finds nothing cached, as (first page, count): one page once the window is 0
/// (`force_page_cache_ra`); a fresh window (`get_init_ra_size`) at page 0, for a
/// request above the window, or for a read that follows the last one; else just the
/// request (`do_page_cache_ra`).
fn readahead_window(ra_pages: u64, prev_pos: u64, pos: u64, n: u64) -> (u64, u64) {
    let index = pos / PAGE;
    let req = (pos + n).div_ceil(PAGE) - index;
    if ra_pages == 0 {
        return (index, 1);
    }
    // ractl_max_pages
    let max = if req > ra_pages && IO_PAGES > ra_pages {
        req.min(IO_PAGES)
    } else {
        ra_pages
    };
    let follows = prev_pos != NO_PREV_POS && (prev_pos / PAGE..=prev_pos / PAGE + 1).contains(&index);
    if index != 0 && req <= max && !follows {
        return (index, req);
    }
    let want = req.next_power_of_two();
    let window = match want {
        w if w <= max / 32 => w * 4,
        w if w <= max / 4 => w * 2,
        _ => max,
    };
    (index, window)
}

fn cache_block_for(lbs: u64, size: u64) -> u64 {
    let mut b = lbs.max(SECTOR);
    while b < PAGE && size & b == 0 {
        b <<= 1;
    }
    b
}

impl LoopDevice {
    pub(crate) fn new(number: u32, shared: Arc<Shared>) -> LoopDevice {
        LoopDevice {
            number,
            shared,
            lo: Mutex::new(LoInner {
                offset: 0,
                sizelimit: 0,
                flags: 0,
                file_name: Vec::new(),
                openers: 0,
                excl_holders: 0,
                backing: None,
                min_dio: SECTOR,
            }),
            state: AtomicU32::new(0),
            visible: AtomicBool::new(true),
            lo_lock: Mutex::new(None),
            capacity: AtomicU64::new(0),
            block_size: AtomicU32::new(SECTOR as u32),
            disk_ro: AtomicBool::new(false),
            write_cache: AtomicBool::new(false),
            cache_block: AtomicU64::new(PAGE),
            wb_err: AtomicU64::new(0),
            queue: Queue::new(None),
            handles: AtomicUsize::new(0),
        }
    }

    /// The device number (`N` of `/dev/loopN`).
    pub fn number(&self) -> u32 {
        self.number
    }

    /// The configuration I/O entered on `q` works with: `EIO` unless the device is bound
    /// (read, flush and discard all start so).
    #[inline]
    fn bound_cfg<'q>(&self, q: &'q Entered<'_, IoConfig>) -> Result<&'q IoConfig, Errno> {
        if self.state() != LoopState::Bound {
            return Err(Errno::EIO);
        }
        q.cfg().ok_or(Errno::EIO)
    }

    /// The state (read without the device lock: a snapshot).
    pub fn state(&self) -> LoopState {
        LoopState::from_u32(self.state.load(Ordering::Acquire))
    }

    /// Sets the state. The caller holds the device lock.
    fn set_state(&self, g: &DevGuard<'_>, s: LoopState) {
        let _ = g;
        debug_assert!(self.lo.is_locked());
        self.state.store(s.as_u32(), Ordering::Release);
    }

    /// Takes the device lock (`lo_mutex`); in [`CtlLock::Global`] the control lock first,
    /// as every operation did before the per-device lock (Linux 5.12).
    pub(crate) fn lock(&self) -> DevGuard<'_> {
        let ctl = match self.shared.settings.ctl_lock {
            CtlLock::Global => Some(self.shared.stats.lock(LockKind::Ctl, &self.shared.ctl)),
            CtlLock::PerDevice => None,
        };
        DevGuard {
            inner: self.shared.stats.lock(LockKind::Dev, &self.lo),
            _ctl: ctl,
        }
    }

    /// `loop_global_lock_killable`: the validation lock when `global`, then the device
    /// lock (the control lock before both in [`CtlLock::Global`]).
    fn lock_global(&self, global: bool) -> (ValidateGuard<'_>, DevGuard<'_>) {
        let ctl = match self.shared.settings.ctl_lock {
            CtlLock::Global => Some(self.shared.stats.lock(LockKind::Ctl, &self.shared.ctl)),
            CtlLock::PerDevice => None,
        };
        let v = if global {
            Some(self.shared.stats.lock(LockKind::Validate, &self.shared.validate))
        } else {
            None
        };
        let g = DevGuard {
            inner: self.shared.stats.lock(LockKind::Dev, &self.lo),
            _ctl: ctl,
        };
        (ValidateGuard(v), g)
    }

    fn set_backing_visible(&self, b: Option<Backing>) -> Option<Backing> {
        std::mem::replace(&mut *self.lo_lock.lock(), b)
    }

    /// The backing file's path (`/sys/block/loopN/loop/backing_file`), `None` when no
    /// backing is attached; a loop device shows as `/dev/loopM`.
    pub fn backing_path(&self) -> Option<String> {
        let b = self.lo_lock.lock().clone();
        match b? {
            Backing::File(f) => Some(f.path().unwrap_or_default()),
            Backing::Loop(d) => Some(format!("/dev/loop{}", d.dev.number)),
        }
    }

    /// Size in bytes (`BLKGETSIZE64`).
    pub fn size(&self) -> u64 {
        self.capacity.load(Ordering::Acquire)
    }

    /// Logical block size (`BLKSSZGET`).
    pub fn block_size(&self) -> u32 {
        self.block_size.load(Ordering::Acquire)
    }

    /// The read-only mark (`BLKROGET`).
    pub fn read_only(&self) -> bool {
        self.disk_ro.load(Ordering::Acquire)
    }

    /// Whether the queue has a write cache (a detached device keeps its last one).
    pub fn write_cache(&self) -> bool {
        self.write_cache.load(Ordering::Acquire)
    }

    /// Open file descriptions of the device.
    pub fn openers(&self) -> usize {
        self.lo.lock().openers
    }

    pub(crate) fn open(this: &Arc<Self>, mode: OpenMode) -> Result<LoopHandle, Errno> {
        let mut g = this.lock();
        // bdev_open: the exclusive claim (bd_prepare_to_claim, EBUSY) comes before
        // blkdev_get_whole -> lo_open (ENXIO in rundown or while deleting).
        if mode.excl && g.excl_holders > 0 {
            return Err(Errno::EBUSY);
        }
        match this.state() {
            LoopState::Deleting | LoopState::Rundown => return Err(Errno::ENXIO),
            _ => {}
        }
        if mode.excl {
            g.excl_holders += 1;
        }
        if g.openers == 0 {
            let lbs = u64::from(this.block_size());
            this.cache_block
                .store(cache_block_for(lbs, this.size()), Ordering::Relaxed);
        }
        g.openers += 1;
        drop(g);
        this.handles.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(dev = this.number, ?mode, "loop open");
        Ok(LoopHandle {
            desc: Arc::new(OpenDesc {
                dev: this.clone(),
                write: mode.write,
                excl: mode.excl,
                wb_seen: AtomicU64::new(this.sample_wb_err()),
                ra_pages: AtomicU64::new(RA_PAGES),
                prev_pos: AtomicU64::new(NO_PREV_POS),
            }),
        })
    }

    /// `lo_release`: the last reference to an open file description went away.
    fn release(&self, excl: bool) {
        self.handles.fetch_sub(1, Ordering::Relaxed);
        let mut g = self.lock();
        g.openers -= 1;
        if excl {
            g.excl_holders -= 1;
        }
        if g.openers > 0 {
            return;
        }
        if self.state() == LoopState::Bound && g.flags & LO_FLAGS_AUTOCLEAR != 0 {
            self.set_state(&g, LoopState::Rundown);
        }
        let need_clear = self.state() == LoopState::Rundown;
        drop(g);
        if need_clear {
            self.clr_fd_final();
        }
    }

    /// `__loop_clr_fd`: detaches a device in rundown. The backing is dropped after
    /// every lock is released (dropping a loop backing can release that device).
    fn clr_fd_final(&self) {
        self.queue.freeze();
        let old_cfg = self.queue.replace(None);
        self.queue.unfreeze();
        let old_vis = self.set_backing_visible(None);
        let mut g = self.lock();
        let old = g.backing.take();
        g.offset = 0;
        g.sizelimit = 0;
        g.file_name.clear();
        g.flags = 0;
        self.block_size.store(SECTOR as u32, Ordering::Release);
        self.capacity.store(0, Ordering::Release);
        self.set_state(&g, LoopState::Unbound);
        drop(g);
        tracing::debug!(dev = self.number, "loop detached");
        drop((old, old_cfg, old_vis));
    }

    fn set_cfg(&self, g: &DevGuard<'_>, dio: bool) -> Option<Box<IoConfig>> {
        let backing = g.backing.clone()?;
        self.queue.freeze();
        let old = self.queue.replace(Some(Box::new(IoConfig {
            backing,
            offset: g.offset,
            dio,
            read_only: g.flags & LO_FLAGS_READ_ONLY != 0,
        })));
        self.queue.unfreeze();
        old
    }

    /// `lo_can_use_dio`.
    fn can_use_dio(&self, g: &DevGuard<'_>) -> bool {
        let Some(b) = &g.backing else { return false };
        let min = g.min_dio;
        b.can_odirect() && u64::from(self.block_size()) >= min && g.offset.is_multiple_of(min)
    }

    /// `loop_update_dio`: direct I/O is switched off when it can no longer be used.
    fn update_dio(&self, g: &mut DevGuard<'_>) {
        if g.flags & LO_FLAGS_DIRECT_IO != 0 && !self.can_use_dio(g) {
            g.flags &= !LO_FLAGS_DIRECT_IO;
        }
    }

    /// `loop_validate_file`: refuses cycles (`EBADF`), stacking on a device that is not
    /// bound (`EINVAL`), and files that are neither regular nor block devices. The
    /// caller holds the validation lock when `backing` is a loop device.
    fn validate(&self, backing: &Backing) -> Result<(), Errno> {
        let mut cur = backing.clone();
        while let Backing::Loop(d) = cur {
            let l = &d.dev;
            if std::ptr::eq(Arc::as_ptr(l), self) {
                return Err(Errno::EBADF);
            }
            if l.state() != LoopState::Bound {
                return Err(Errno::EINVAL);
            }
            let next = l.lo_lock.lock().clone();
            match next {
                Some(b) => cur = b,
                None => return Err(Errno::EINVAL),
            }
        }
        match backing {
            Backing::File(f) if f.kind == FileKind::Other => Err(Errno::EINVAL),
            _ => Ok(()),
        }
    }

    fn recompute_size(&self, g: &DevGuard<'_>) -> Result<(), Errno> {
        let Some(b) = &g.backing else { return Ok(()) };
        let size = window_size(b.size()?, g.offset, g.sizelimit);
        self.capacity.store(size, Ordering::Release);
        Ok(())
    }
}

fn resolve(file: LoopFile<'_>) -> Result<Backing, Errno> {
    match file {
        LoopFile::Fd(fd) => Ok(Backing::File(Arc::new(BackingFile::from_fd(fd)?))),
        LoopFile::Device(h) => Ok(Backing::Loop(h.desc.clone())),
        LoopFile::BadFd => Err(Errno::EBADF),
    }
}

fn check_info(info: &LoopInfo) -> Result<(), Errno> {
    if info.offset > i64::MAX as u64 || info.sizelimit > i64::MAX as u64 {
        return Err(Errno::EOVERFLOW);
    }
    Ok(())
}

fn name_of(info: &LoopInfo) -> Vec<u8> {
    let mut n: Vec<u8> = info.file_name.iter().copied().take_while(|b| *b != 0).collect();
    n.truncate(LO_NAME_SIZE - 1);
    n
}

impl LoopHandle {
    /// The device.
    pub fn device(&self) -> &Arc<LoopDevice> {
        &self.desc.dev
    }

    /// Whether this handle was opened for writing.
    pub fn writable(&self) -> bool {
        self.desc.write
    }

    fn dev(&self) -> &LoopDevice {
        &self.desc.dev
    }

    /// `bd_prepare_to_claim` for a handle without its own claim: `EBUSY` while
    /// another opener holds an exclusive claim.
    fn claim_check(&self, g: &DevGuard<'_>) -> Result<(), Errno> {
        if !self.desc.excl && g.excl_holders > 0 {
            return Err(Errno::EBUSY);
        }
        Ok(())
    }

    /// `LOOP_CONFIGURE`: binds the device to `file` with `config`.
    ///
    /// Errors, in Linux's order: `EBADF` (no file), `EBUSY` (claimed exclusively by
    /// another opener, or not unbound), `EBADF`/`EINVAL` (loop-on-loop check), `EINVAL`
    /// (unknown flags), `EOVERFLOW`, then `EINVAL` for a bad block size, which comes
    /// after the read-only mark was set: a failed configure can leave it.
    pub fn configure(&self, file: LoopFile<'_>, config: &LoopConfig) -> Result<(), Errno> {
        let backing = resolve(file)?;
        let is_loop = matches!(backing, Backing::Loop(_));
        let dev = self.dev();
        let (_v, mut g) = dev.lock_global(is_loop);
        self.claim_check(&g)?;
        if dev.state() != LoopState::Unbound {
            return Err(Errno::EBUSY);
        }
        dev.validate(&backing)?;
        if config.info.flags & !LOOP_CONFIGURE_SETTABLE_FLAGS != 0 {
            return Err(Errno::EINVAL);
        }
        check_info(&config.info)?;
        let mut flags = config.info.flags;
        if !backing.writable() || !self.desc.write {
            flags |= LO_FLAGS_READ_ONLY;
        }
        let ro = flags & LO_FLAGS_READ_ONLY != 0;
        dev.disk_ro.store(ro, Ordering::Release);
        // loop_assign_backing_file, then loop_update_limits: block size 0 is the
        // default (loop_default_blocksize: the direct-I/O alignment with direct I/O).
        g.min_dio = backing.min_dio();
        let bs = if config.block_size == 0 {
            default_block_size(flags, g.min_dio)
        } else {
            u64::from(config.block_size)
        };
        if !valid_block_size(bs) {
            return Err(Errno::EINVAL);
        }
        let file_size = backing.size().map_err(|_| Errno::EINVAL)?;
        g.offset = config.info.offset;
        g.sizelimit = config.info.sizelimit;
        g.file_name = name_of(&config.info);
        g.flags = flags;
        g.backing = Some(backing.clone());
        dev.block_size.store(bs as u32, Ordering::Release);
        dev.write_cache.store(!ro, Ordering::Release);
        dev.update_dio(&mut g);
        let dio = g.flags & LO_FLAGS_DIRECT_IO != 0;
        let old = dev.set_cfg(&g, dio);
        dev.capacity
            .store(window_size(file_size, g.offset, g.sizelimit), Ordering::Release);
        let old_vis = dev.set_backing_visible(Some(backing));
        dev.set_state(&g, LoopState::Bound);
        drop(g);
        drop(_v);
        drop((old, old_vis));
        tracing::debug!(dev = dev.number, "loop configured");
        Ok(())
    }

    /// `LOOP_SET_FD`: [`LoopHandle::configure`] with a zeroed configuration.
    pub fn set_fd(&self, file: LoopFile<'_>) -> Result<(), Errno> {
        self.configure(file, &LoopConfig::default())
    }

    /// `LOOP_CHANGE_FD`: swaps the backing of a bound read-only device for a file of the
    /// same size (`ENXIO` unbound, `EINVAL` not read-only or another size).
    pub fn change_fd(&self, file: LoopFile<'_>) -> Result<(), Errno> {
        let backing = resolve(file)?;
        let is_loop = matches!(backing, Backing::Loop(_));
        let dev = self.dev();
        let (v, mut g) = dev.lock_global(is_loop);
        if dev.state() != LoopState::Bound {
            return Err(Errno::ENXIO);
        }
        if g.flags & LO_FLAGS_READ_ONLY == 0 {
            return Err(Errno::EINVAL);
        }
        dev.validate(&backing)?;
        let old_b = g.backing.clone().ok_or(Errno::ENXIO)?;
        let new_size = window_size(backing.size().map_err(|_| Errno::EINVAL)?, g.offset, g.sizelimit);
        let old_size = window_size(old_b.size().map_err(|_| Errno::EINVAL)?, g.offset, g.sizelimit);
        if new_size != old_size {
            return Err(Errno::EINVAL);
        }
        g.min_dio = backing.min_dio();
        let old = g.backing.replace(backing.clone());
        dev.update_dio(&mut g);
        let dio = g.flags & LO_FLAGS_DIRECT_IO != 0;
        let old_cfg = dev.set_cfg(&g, dio);
        let old_vis = dev.set_backing_visible(Some(backing));
        drop(g);
        drop(v);
        if !is_loop {
            // Flush loop_validate_file() walks that may still look at the old file.
            drop(dev.shared.stats.lock(LockKind::Validate, &dev.shared.validate));
        }
        drop((old, old_cfg, old_vis));
        Ok(())
    }

    /// `LOOP_CLR_FD`: marks the device for detaching at its last close (auto-clear) and,
    /// when this handle is the only opener, starts the rundown now: further opens fail
    /// with `ENXIO` and I/O with `EIO`, and the detach happens when this handle closes.
    pub fn clr_fd(&self) -> Result<(), Errno> {
        let dev = self.dev();
        let (_v, mut g) = dev.lock_global(true);
        if dev.state() != LoopState::Bound {
            return Err(Errno::ENXIO);
        }
        g.flags |= LO_FLAGS_AUTOCLEAR;
        if g.openers == 1 {
            dev.set_state(&g, LoopState::Rundown);
        }
        Ok(())
    }

    /// `LOOP_SET_STATUS64`: offset, size limit, file name, and the flags `AUTOCLEAR`
    /// (set and clear) and `PARTSCAN` (set only); other flags are ignored.
    pub fn set_status64(&self, info: &LoopInfo) -> Result<(), Errno> {
        let dev = self.dev();
        let mut g = dev.lock();
        if dev.state() != LoopState::Bound {
            return Err(Errno::ENXIO);
        }
        check_info(info)?;
        let size_changed = g.offset != info.offset || g.sizelimit != info.sizelimit;
        let prev = g.flags;
        let mut flags = info.flags & LOOP_SET_STATUS_SETTABLE_FLAGS;
        flags |= prev & !LOOP_SET_STATUS_SETTABLE_FLAGS;
        flags |= prev & !LOOP_SET_STATUS_CLEARABLE_FLAGS;
        g.flags = flags;
        g.offset = info.offset;
        g.sizelimit = info.sizelimit;
        g.file_name = name_of(info);
        dev.update_dio(&mut g);
        let dio = g.flags & LO_FLAGS_DIRECT_IO != 0;
        let old = dev.set_cfg(&g, dio);
        if size_changed {
            let _ = dev.recompute_size(&g);
        }
        drop(g);
        drop(old);
        Ok(())
    }

    /// `LOOP_GET_STATUS64` (`ENXIO` unless bound).
    pub fn get_status64(&self) -> Result<LoopInfo, Errno> {
        let dev = self.dev();
        let g = dev.lock();
        if dev.state() != LoopState::Bound {
            return Err(Errno::ENXIO);
        }
        Ok(LoopInfo {
            number: dev.number,
            offset: g.offset,
            sizelimit: g.sizelimit,
            flags: g.flags,
            file_name: g.file_name.clone(),
        })
    }

    /// `LOOP_SET_CAPACITY`: re-reads the backing file's size.
    pub fn set_capacity(&self) -> Result<(), Errno> {
        let dev = self.dev();
        let g = dev.lock();
        if dev.state() != LoopState::Bound {
            return Err(Errno::ENXIO);
        }
        dev.recompute_size(&g).map_err(|_| Errno::EIO)
    }

    /// `LOOP_SET_BLOCK_SIZE`: a power of two from 512 to 64 KiB; 0 resets to the default
    /// (512, or the backing's direct-I/O alignment while direct I/O is on).
    pub fn set_block_size(&self, size: u64) -> Result<(), Errno> {
        let dev = self.dev();
        let mut g = dev.lock();
        self.claim_check(&g)?;
        if dev.state() != LoopState::Bound {
            return Err(Errno::ENXIO);
        }
        if size == u64::from(dev.block_size()) {
            return Ok(());
        }
        // Linux compares the whole argument, then hands it on as an unsigned int.
        let bs = match size as u32 {
            0 => default_block_size(g.flags, g.min_dio),
            b => u64::from(b),
        };
        if bs == u64::from(dev.block_size()) {
            return Ok(());
        }
        if !valid_block_size(bs) {
            return Err(Errno::EINVAL);
        }
        dev.queue.freeze();
        dev.block_size.store(bs as u32, Ordering::Release);
        dev.queue.unfreeze();
        dev.update_dio(&mut g);
        let dio = g.flags & LO_FLAGS_DIRECT_IO != 0;
        let old = dev.set_cfg(&g, dio);
        drop(g);
        drop(old);
        Ok(())
    }

    /// `LOOP_SET_DIRECT_IO` (`EINVAL` when the backing file or the alignment does not
    /// allow it).
    pub fn set_direct_io(&self, on: bool) -> Result<(), Errno> {
        let dev = self.dev();
        let mut g = dev.lock();
        if dev.state() != LoopState::Bound {
            return Err(Errno::ENXIO);
        }
        if on == (g.flags & LO_FLAGS_DIRECT_IO != 0) {
            return Ok(());
        }
        if on {
            if !dev.can_use_dio(&g) {
                return Err(Errno::EINVAL);
            }
            if let Some(Backing::File(f)) = &g.backing {
                let _ = f.sync();
            }
            g.flags |= LO_FLAGS_DIRECT_IO;
        } else {
            g.flags &= !LO_FLAGS_DIRECT_IO;
        }
        let old = dev.set_cfg(&g, on);
        drop(g);
        drop(old);
        Ok(())
    }

    /// Reads at byte `pos` of the device (`pread`): 0 at or past the end, a short count
    /// at the end, `EIO` when the device is running down, the backing file does not
    /// cover the range, or Linux's page cache would read blocks the device refuses (see
    /// `readahead_window`). Takes no lock: it enters the device's queue.
    pub fn read_at(&self, buf: &mut [u8], pos: u64) -> Result<usize, Errno> {
        let cap = self.dev().size();
        if pos >= cap || buf.is_empty() {
            return Ok(0);
        }
        let n = (cap - pos).min(buf.len() as u64);
        let r = if self.readahead_aligned(pos, n) {
            self.read_through(buf, pos)
        } else {
            Err(Errno::EIO)
        };
        match r {
            Ok(_) => self.desc.prev_pos.store(pos + n, Ordering::Relaxed),
            // filemap_read_folio -> shrink_readahead_size_eio: a quarter of the window.
            Err(_) => {
                let ra = self.desc.ra_pages.load(Ordering::Relaxed);
                self.desc.ra_pages.store(ra / 4, Ordering::Relaxed);
            }
        }
        r
    }

    /// Whether the bio Linux's readahead makes for this read is whole logical blocks
    /// (`bio_unaligned` in `blk_mq_submit_bio` fails it with `EIO`). The page cache reads
    /// in folios of its block size, fixed at the first open (`set_init_blocksize` sets
    /// `mapping_min_folio_order`), so only a block size above a page set after that
    /// open can be refused.
    fn readahead_aligned(&self, pos: u64, n: u64) -> bool {
        let dev = self.dev();
        let lbs = u64::from(dev.block_size());
        if lbs <= PAGE {
            return true;
        }
        let cb = dev.cache_block.load(Ordering::Relaxed);
        let folio = cb.max(PAGE);
        let (first, pages) = readahead_window(
            self.desc.ra_pages.load(Ordering::Relaxed),
            self.desc.prev_pos.load(Ordering::Relaxed),
            pos,
            n,
        );
        let start = first * PAGE / folio * folio;
        // Blocks past the end of the device are not read.
        let end = ((first + pages) * PAGE)
            .div_ceil(folio)
            .saturating_mul(folio)
            .min(dev.size().div_ceil(cb) * cb)
            .max(start);
        start.is_multiple_of(lbs) && (end - start).is_multiple_of(lbs)
    }

    /// The read itself, below the page cache.
    fn read_through(&self, buf: &mut [u8], pos: u64) -> Result<usize, Errno> {
        let dev = self.dev();
        let cap = dev.size();
        if pos >= cap || buf.is_empty() {
            return Ok(0);
        }
        let n = (cap - pos).min(buf.len() as u64) as usize;
        let q = dev.queue.enter();
        let cfg = dev.bound_cfg(&q)?;
        let buf = &mut buf[..n];
        let at = cfg.offset + pos;
        let got = match &cfg.backing {
            Backing::File(f) => f.read_at(buf, at, cfg.dio),
            Backing::Loop(d) => (LoopHandle { desc: d.clone() }).read_through(buf, at),
        };
        match got {
            Ok(k) if k == n => Ok(n),
            _ => Err(Errno::EIO),
        }
    }

    /// Writes at byte `pos` (`pwrite`): `EBADF` through a handle not opened for
    /// writing, `EPERM` on a read-only device, `ENOSPC` at or
    /// past the end, a short count at the end; never outside the device's window of the
    /// backing file.
    pub fn write_at(&self, buf: &[u8], pos: u64) -> Result<usize, Errno> {
        let dev = self.dev();
        if !self.desc.write {
            return Err(Errno::EBADF);
        }
        if dev.read_only() {
            return Err(Errno::EPERM);
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let cap = dev.size();
        if pos >= cap {
            return Err(Errno::ENOSPC);
        }
        let n = (cap - pos).min(buf.len() as u64) as usize;
        let q = dev.queue.enter();
        if dev.state() != LoopState::Bound {
            // Linux's page cache takes whole cached blocks and loses them at the detach;
            // a partial block needs a read, which fails.
            return dev.write_lost(pos, n as u64, dev.cache_block.load(Ordering::Relaxed));
        }
        let Some(cfg) = q.cfg() else {
            return Err(Errno::EIO);
        };
        if cfg.read_only {
            return Err(Errno::EIO);
        }
        let cb = dev.cache_block.load(Ordering::Relaxed);
        if cb < u64::from(dev.block_size()) {
            return dev.write_lost(pos, n as u64, cb);
        }
        let at = cfg.offset + pos;
        let put = match &cfg.backing {
            Backing::File(f) => f.write_at(&buf[..n], at, cfg.dio),
            Backing::Loop(d) => (LoopHandle { desc: d.clone() }).write_at(&buf[..n], at),
        };
        match put {
            Ok(k) if k == n => Ok(n),
            _ => {
                // Linux takes the write into this device's page cache (a block it
                // covers only in part is read first, which must succeed) and its
                // write-back fails: the data are lost and the next fsync of each open
                // description says EIO (mapping_set_error, errseq).
                let cb = dev.cache_block.load(Ordering::Relaxed);
                if !pos.is_multiple_of(cb) || !(n as u64).is_multiple_of(cb) {
                    let start = pos / cb * cb;
                    let end = (pos + n as u64).div_ceil(cb) * cb;
                    let mut tmp = vec![0u8; (end.min(cap) - start) as usize];
                    let got = match &cfg.backing {
                        Backing::File(f) => f.read_at(&mut tmp, cfg.offset + start, cfg.dio),
                        Backing::Loop(d) => {
                            (LoopHandle { desc: d.clone() }).read_through(&mut tmp, cfg.offset + start)
                        }
                    };
                    if got.is_err() {
                        return Err(Errno::EIO);
                    }
                }
                dev.set_wb_err();
                Ok(n)
            }
        }
    }

    /// `fsync`: `EIO` once per open description for writes whose write-back failed; then
    /// a flush reaches the backing file when the device has a write cache; `EIO` when
    /// that cache belongs to a device that is no longer bound.
    pub fn flush(&self) -> Result<(), Errno> {
        let dev = self.dev();
        // file_write_and_wait_range -> errseq_check_and_advance: a write-back failure
        // this description has not reported yet, which is then marked seen.
        let failed = dev.wb_err.load(Ordering::Acquire);
        if self.desc.wb_seen.load(Ordering::Acquire) != failed {
            let seen = failed | WB_SEEN;
            let _ = dev
                .wb_err
                .compare_exchange(failed, seen, Ordering::AcqRel, Ordering::Acquire);
            self.desc.wb_seen.store(seen, Ordering::Release);
            return Err(Errno::EIO);
        }
        if !dev.write_cache() {
            return Ok(());
        }
        let q = dev.queue.enter();
        let cfg = dev.bound_cfg(&q)?;
        match &cfg.backing {
            Backing::File(f) => f.sync().map_err(|_| Errno::EIO),
            Backing::Loop(d) => (LoopHandle { desc: d.clone() }).flush(),
        }
    }

    /// Discard (`BLKDISCARD`): punches a hole in the backing file. `EINVAL` unless
    /// 512-aligned and inside the device; `EPERM` on a read-only device;
    /// `EOPNOTSUPP` when the backing file cannot punch holes.
    pub fn discard(&self, pos: u64, len: u64) -> Result<(), Errno> {
        let dev = self.dev();
        if !self.desc.write {
            return Err(Errno::EBADF);
        }
        if !pos.is_multiple_of(SECTOR) || !len.is_multiple_of(SECTOR) {
            return Err(Errno::EINVAL);
        }
        let end = pos.checked_add(len).ok_or(Errno::EINVAL)?;
        if end > dev.size() {
            return Err(Errno::EINVAL);
        }
        if dev.read_only() {
            return Err(Errno::EPERM);
        }
        if len == 0 {
            return Ok(());
        }
        let q = dev.queue.enter();
        let cfg = dev.bound_cfg(&q)?;
        if cfg.read_only {
            return Err(Errno::EIO);
        }
        match &cfg.backing {
            Backing::File(f) => f.punch(cfg.offset + pos, len).map_err(|e| {
                if e.0 == libc::EOPNOTSUPP || e.0 == libc::EINVAL {
                    Errno::EOPNOTSUPP
                } else {
                    Errno::EIO
                }
            }),
            Backing::Loop(d) => (LoopHandle { desc: d.clone() }).discard(cfg.offset + pos, len),
        }
    }

    /// Size in bytes (`BLKGETSIZE64`).
    pub fn size(&self) -> u64 {
        self.dev().size()
    }

    /// Logical block size (`BLKSSZGET`).
    pub fn block_size(&self) -> u32 {
        self.dev().block_size()
    }

    /// The read-only mark (`BLKROGET`).
    pub fn read_only(&self) -> bool {
        self.dev().read_only()
    }
}

impl Drop for OpenDesc {
    fn drop(&mut self) {
        self.dev.release(self.excl);
    }
}

impl std::fmt::Debug for LoopHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopHandle")
            .field("dev", &self.desc.dev.number)
            .field("write", &self.desc.write)
            .field("excl", &self.desc.excl)
            .finish()
    }
}

impl LoopDevice {
    /// Checks the device lock is free and the state can be removed (`Lo_unbound`, no
    /// openers); marks it `Lo_deleting`.
    pub(crate) fn begin_remove(&self) -> Result<(), Errno> {
        let g = self.shared.stats.lock(LockKind::Dev, &self.lo);
        if self.state() != LoopState::Unbound || g.openers > 0 {
            return Err(Errno::EBUSY);
        }
        self.state.store(LoopState::Deleting.as_u32(), Ordering::Release);
        Ok(())
    }

    /// Live handles of this device (for leak checks in tests).
    pub fn live_handles(&self) -> usize {
        self.handles.load(Ordering::Relaxed)
    }
}

/// `loop_default_blocksize`: with direct I/O, the backing's direct-I/O alignment
/// (`lo_min_dio_size`), else 512.
fn default_block_size(flags: u32, min_dio: u64) -> u64 {
    if flags & LO_FLAGS_DIRECT_IO != 0 {
        min_dio
    } else {
        SECTOR
    }
}
