//! A sequential reference model of the loop registry and its devices, written from
//! `drivers/block/loop.c` (Linux 6.18) and the block-device code it relies on
//! (`block/bdev.c`, `block/fops.c`), independent of `vfscale-loop`. It is the oracle where
//! the kernel cannot be asked (no root, no `/dev/loop-control`): [`replay`] gives the
//! result stream of the format (`docs/scenarios/loop.md`) without touching a file.
//!
//! The model keeps what the rules read:
//! - the registry (`loop_index_idr`): devices by index, created fresh by `loop_add`;
//! - per device: `lo_state` (unbound, bound, rundown; deleting is never observable in a
//!   sequential replay, `loop_control_remove` finishes before the next step), `lo_flags`,
//!   `lo_offset`, `lo_sizelimit`, `lo_file_name`, the backing, the capacity in sectors,
//!   the logical block size, `lo_min_dio_size`, and what outlives a binding: the disk's
//!   read-only mark (`set_disk_ro`) and its write-cache feature (`BLK_FEAT_WRITE_CACHE`);
//!   the exclusive holder (`bd_holder`), the block size of the device's page cache
//!   (`set_init_blocksize`) and its write-back error sequence (`mapping->wb_err`);
//! - open file descriptions of `/dev/loopN`: a handle is one, and a device backed by a
//!   handle holds another reference to it (`fget` in `loop_configure`), so the device's
//!   openers (`disk_openers`) and the release (`lo_release`) follow the description's
//!   last reference, not the handle's close;
//! - backing files as bytes in memory (byte `i` is `i mod 251`).
//!
//! No page cache is modelled: the format's runners drop it around every I/O step, so a
//! read sees the backing file and a buffered write reaches it or fails at write-back.
//! What the page cache leaves is kept per description: its readahead window and where
//! its last read ended (`file->f_ra`), which decide whether a read at a logical block
//! size above the page size makes a bio the block layer refuses.
//!
//! ```
//! use vfscale_conformance::loop_dev::{reference, render_results, Scenario};
//! let s = Scenario::parse(concat!(
//!     r#"{"op":"open","dev":7,"handle":"h","mode":"rw"}"#, "\n",
//!     r#"{"op":"clr_fd","handle":"h"}"#, "\n",
//!     r#"{"op":"ctl_remove","index":7}"#, "\n",
//! )).unwrap();
//! let out = render_results(&reference::replay(&s).unwrap());
//! assert_eq!(out, "{\"step\":0,\"result\":\"ok\"}\n{\"step\":1,\"result\":\"ENXIO\"}\n{\"step\":2,\"result\":\"EBUSY\"}\n");
//! ```

use std::collections::{BTreeMap, HashMap};

use super::format::{
    backing_byte, Backing, Mode, Op, Outcome, Scenario, ScenarioError, Status, Step, StepResult, Tracker,
    LO_FLAGS_AUTOCLEAR, LO_FLAGS_DIRECT_IO, LO_FLAGS_PARTSCAN, LO_FLAGS_READ_ONLY, LO_NAME_SIZE,
};

const EBADF: i32 = libc::EBADF;
const EBUSY: i32 = libc::EBUSY;
const EEXIST: i32 = libc::EEXIST;
const EINVAL: i32 = libc::EINVAL;
const EIO: i32 = libc::EIO;
const ENODEV: i32 = libc::ENODEV;
const ENOENT: i32 = libc::ENOENT;
const ENOSPC: i32 = libc::ENOSPC;
const ENXIO: i32 = libc::ENXIO;
const EOVERFLOW: i32 = libc::EOVERFLOW;
const EPERM: i32 = libc::EPERM;

/// `SECTOR_SIZE`.
const SECTOR: u64 = 512;
/// `PAGE_SIZE` on the machines the corpus was recorded on.
const PAGE: u64 = 4096;
/// `BLK_MAX_BLOCK_SIZE` (64 KiB since large block sizes, 6.15).
const MAX_BLOCK: u64 = 64 << 10;
/// `MINORMASK >> part_shift` with `max_part=0`: the largest index `loop_add` accepts.
const MAX_INDEX: i64 = (1 << 20) - 1;
/// `VM_READAHEAD_PAGES`: a loop device's `read_ahead_kb` (128) in pages, whatever its
/// block size (its queue sets no `io_opt`), copied into a description at its open.
const RA_PAGES: u64 = 32;
/// `bdi->io_pages`: a loop device's `max_sectors_kb` (1280) in pages.
const IO_PAGES: u64 = 320;
/// `CONFIG_BLK_DEV_LOOP_MIN_COUNT`.
const MIN_COUNT: u32 = 8;
/// `LOOP_CONFIGURE_SETTABLE_FLAGS`.
const CONFIGURE_SETTABLE: u32 =
    LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR | LO_FLAGS_PARTSCAN | LO_FLAGS_DIRECT_IO;
/// `LOOP_SET_STATUS_SETTABLE_FLAGS`.
const STATUS_SETTABLE: u32 = LO_FLAGS_AUTOCLEAR | LO_FLAGS_PARTSCAN;
/// `LOOP_SET_STATUS_CLEARABLE_FLAGS`.
const STATUS_CLEARABLE: u32 = LO_FLAGS_AUTOCLEAR;

type Res<T> = Result<T, i32>;

/// `lo_state` (`enum { Lo_unbound, Lo_bound, Lo_rundown, Lo_deleting }`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Unbound,
    Bound,
    Rundown,
}

/// What `lo_backing_file` is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum BackRef {
    /// A regular file of the scenario.
    File(String),
    /// An open description of another loop device (loop on loop).
    Desc(usize),
}

/// One loop device.
#[derive(Clone, Debug)]
struct Dev {
    state: State,
    flags: u32,
    offset: u64,
    sizelimit: u64,
    file_name: String,
    backing: Option<BackRef>,
    /// `get_capacity(lo->lo_disk)`, in sectors.
    capacity: u64,
    /// `queue_logical_block_size(lo->lo_queue)`.
    lbs: u64,
    /// `lo->lo_min_dio_size`.
    min_dio: u64,
    /// `get_disk_ro(lo->lo_disk)`: survives `__loop_clr_fd`.
    ro: bool,
    /// `BLK_FEAT_WRITE_CACHE`: survives `__loop_clr_fd`.
    write_cache: bool,
    /// `bd_holder`: the description holding the exclusive claim.
    holder: Option<usize>,
    /// The block size of the device's page cache (`i_blkbits` of the bdev inode).
    cache_block: u64,
    /// `mapping->wb_err`: how many times a write-back failure was recorded after the
    /// last one had been reported (`errseq_set` bumps its counter only then); 0 for none.
    wb_err: u64,
    /// `ERRSEQ_SEEN` of `wb_err`: a description has reported the latest failure.
    wb_reported: bool,
}

impl Dev {
    /// `loop_add`: a fresh device.
    fn fresh() -> Dev {
        Dev {
            state: State::Unbound,
            flags: 0,
            offset: 0,
            sizelimit: 0,
            file_name: String::new(),
            backing: None,
            capacity: 0,
            lbs: SECTOR,
            min_dio: SECTOR,
            ro: false,
            write_cache: false,
            holder: None,
            cache_block: PAGE,
            wb_err: 0,
            wb_reported: false,
        }
    }

    fn size(&self) -> u64 {
        self.capacity * SECTOR
    }
}

/// An open file description of `/dev/loopN`.
#[derive(Clone, Debug)]
struct Desc {
    dev: u32,
    write: bool,
    excl: bool,
    /// The scenario's handle still names it.
    handle: bool,
    /// Devices that hold it as their backing file.
    holders: u32,
    /// `file->f_wb_err`: the device's `wb_err` this description has reported, or sampled
    /// at open (`errseq_sample`: 0 while a failure is unreported, so it reports it too).
    wb_seen: u64,
    /// `file->f_ra.ra_pages`: a quarter after each failed read.
    ra_pages: u64,
    /// `file->f_ra.prev_pos`: the end of the last read that returned data, -1 before one.
    prev_pos: i64,
}

impl Desc {
    fn alive(&self) -> bool {
        self.handle || self.holders > 0
    }
}

/// A backing file.
#[derive(Clone, Debug)]
struct BackingFile {
    data: Vec<u8>,
    writable: bool,
}

/// The model's whole state.
#[derive(Debug)]
pub struct Reference {
    devs: BTreeMap<u32, Dev>,
    descs: Vec<Desc>,
    handles: HashMap<String, usize>,
    files: HashMap<String, BackingFile>,
    tracker: Tracker,
    next: usize,
}

/// Replays `scn` on the reference model.
pub fn replay(scn: &Scenario) -> Result<Vec<StepResult>, ScenarioError> {
    let mut r = Reference::new();
    scn.steps.iter().map(|s| r.apply(s)).collect()
}

impl Default for Reference {
    fn default() -> Self {
        Self::new()
    }
}

impl Reference {
    /// The starting state: devices 0 to 7, unbound, unopened and fresh.
    pub fn new() -> Reference {
        Reference {
            devs: (0..MIN_COUNT).map(|i| (i, Dev::fresh())).collect(),
            descs: Vec::new(),
            handles: HashMap::new(),
            files: HashMap::new(),
            tracker: Tracker::new(),
            next: 0,
        }
    }

    /// Applies the next step.
    pub fn apply(&mut self, step: &Step) -> Result<StepResult, ScenarioError> {
        self.tracker.check(step)?;
        let i = self.next;
        self.next += 1;
        let out = self.run(&step.op);
        if let (Op::Open { handle, .. }, Outcome::Ok) = (&step.op, &out) {
            self.tracker.opened(handle);
        }
        Ok(StepResult::new(i, out))
    }

    /// Whether I/O through `handle` is sound in the format's sense (`docs/scenarios/loop.md`,
    /// "I/O"), so that Linux's answer does not depend on its page cache: the device is
    /// unbound or in rundown, or bound with its backing covering it and its size a whole
    /// number of logical blocks, and the same holds for every loop device below it. Every
    /// device below must also take whole bios of its page cache: its logical blocks no
    /// larger than those cache blocks, for a `read` only where the logical block is
    /// larger than a page. `false` for a handle that is not open.
    pub fn io_sound(&self, handle: &str, write: bool) -> bool {
        self.handles
            .get(handle)
            .is_some_and(|d| self.dev_sound(self.descs[*d].dev, write, false))
    }

    fn dev_sound(&self, i: u32, write: bool, below: bool) -> bool {
        let dev = &self.devs[&i];
        if dev.state != State::Bound {
            return true;
        }
        // A device below is read and written through its page cache with the upper
        // device's bios, and its failures shrink the readahead of the description the
        // upper device holds more than once each (block_read_full_folio retries).
        let refuses = dev.cache_block < dev.lbs && (write || dev.lbs > PAGE);
        if !dev.size().is_multiple_of(dev.lbs) || (below && refuses) {
            return false;
        }
        match dev.backing.as_ref().expect("bound") {
            BackRef::File(f) => dev.offset + dev.size() <= self.files[f].data.len() as u64,
            BackRef::Desc(l) => {
                let li = self.descs[*l].dev;
                dev.offset + dev.size() <= self.devs[&li].size() && self.dev_sound(li, write, true)
            }
        }
    }

    fn run(&mut self, op: &Op) -> Outcome {
        let unit = |r: Res<()>| match r {
            Ok(()) => Outcome::Ok,
            Err(e) => Outcome::errno(e),
        };
        match op {
            Op::Backing { name, size, mode } => {
                self.files.insert(
                    name.clone(),
                    BackingFile {
                        data: (0..*size).map(backing_byte).collect(),
                        writable: *mode == Mode::Rw,
                    },
                );
                Outcome::Ok
            }
            // do_ftruncate: a descriptor not open for writing is EINVAL.
            Op::TruncateBacking { name, size } => {
                let f = self.files.get_mut(name).expect("tracked");
                if !f.writable {
                    return Outcome::errno(EINVAL);
                }
                f.data.resize(*size as usize, 0);
                Outcome::Ok
            }
            Op::ReadBacking { name, offset, len } => {
                if *offset > i64::MAX as u64 {
                    return Outcome::errno(EINVAL);
                }
                Outcome::read(&file_slice(&self.files[name].data, *offset, *len))
            }
            Op::Open {
                dev,
                handle,
                mode,
                excl,
            } => unit(self.open(*dev, handle, *mode == Mode::Rw, *excl)),
            Op::Close { handle } => {
                let d = self.handles.remove(handle).expect("tracked");
                self.descs[d].handle = false;
                self.put_desc(d);
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
                let name = match backing {
                    Backing::File(n) => n.clone(),
                    _ => String::new(),
                };
                let d = self.handles[handle];
                unit(self.configure(
                    d,
                    backing,
                    u64::from(*block_size),
                    *offset,
                    *sizelimit,
                    *flags,
                    name,
                ))
            }
            Op::SetFd { handle, backing } => {
                // lo_ioctl(LOOP_SET_FD): a zeroed loop_config with only the descriptor.
                let d = self.handles[handle];
                unit(self.configure(d, backing, 0, 0, 0, 0, String::new()))
            }
            Op::ChangeFd { handle, backing } => {
                let d = self.handles[handle];
                unit(self.change_fd(d, backing))
            }
            Op::ClrFd { handle } => {
                let d = self.handles[handle];
                unit(self.clr_fd(d))
            }
            Op::SetStatus64 {
                handle,
                offset,
                sizelimit,
                flags,
                file_name,
            } => {
                let d = self.handles[handle];
                unit(self.set_status(d, *offset, *sizelimit, *flags, file_name))
            }
            Op::GetStatus64 { handle } => {
                let d = self.handles[handle];
                match self.get_status(d) {
                    Ok(s) => Outcome::Status(s),
                    Err(e) => Outcome::errno(e),
                }
            }
            Op::SetCapacity { handle } => {
                let d = self.handles[handle];
                unit(self.set_capacity(d))
            }
            Op::SetBlockSize { handle, size } => {
                let d = self.handles[handle];
                unit(self.set_block_size(d, *size))
            }
            Op::SetDirectIo { handle, on } => {
                let d = self.handles[handle];
                unit(self.set_dio(d, *on))
            }
            // BLKGETSIZE64: bdev_nr_bytes().
            Op::Size { handle } => Outcome::Int(self.dev_of(self.handles[handle]).size() as i64),
            // BLKSSZGET: bdev_logical_block_size().
            Op::BlockSize { handle } => Outcome::Int(self.dev_of(self.handles[handle]).lbs as i64),
            // BLKROGET: bdev_read_only().
            Op::Ro { handle } => Outcome::Bool(self.dev_of(self.handles[handle]).ro),
            Op::Read { handle, offset, len } => {
                let d = self.handles[handle];
                match self.handle_read(d, *offset, *len) {
                    Ok(b) => Outcome::read(&b),
                    Err(e) => Outcome::errno(e),
                }
            }
            Op::Write {
                handle,
                offset,
                len,
                byte,
            } => {
                let d = self.handles[handle];
                match self.handle_write(d, *offset, *len, *byte) {
                    Ok(n) => Outcome::Int(n as i64),
                    Err(e) => Outcome::errno(e),
                }
            }
            Op::Fsync { handle } => {
                let d = self.handles[handle];
                unit(self.fsync(d))
            }
            // LOOP_CTL_ADD and LOOP_CTL_REMOVE take an int (loop_control_ioctl).
            Op::CtlAdd { index } => match self.ctl_add(*index as i32) {
                Ok(i) => Outcome::Int(i64::from(i)),
                Err(e) => Outcome::errno(e),
            },
            Op::CtlRemove { index } => unit(self.ctl_remove(*index as i32)),
            Op::CtlGetFree => match self.ctl_get_free() {
                Ok(i) => Outcome::Int(i64::from(i)),
                Err(e) => Outcome::errno(e),
            },
            Op::List => Outcome::List(
                self.devs
                    .iter()
                    .map(|(i, d)| (*i, self.backing_file_name(d)))
                    .collect(),
            ),
        }
    }

    fn dev_of(&self, d: usize) -> &Dev {
        &self.devs[&self.descs[d].dev]
    }

    fn dev_mut(&mut self, d: usize) -> &mut Dev {
        let i = self.descs[d].dev;
        self.devs.get_mut(&i).expect("an open device is in the registry")
    }

    /// `/sys/block/loopN/loop/backing_file` (`loop_attr_backing_file_show`): present
    /// from `loop_sysfs_init` in `loop_configure` to `loop_sysfs_exit` in
    /// `__loop_clr_fd`, so a device in rundown still shows it.
    fn backing_file_name(&self, d: &Dev) -> Option<String> {
        match (&d.state, &d.backing) {
            (State::Unbound, _) | (_, None) => None,
            (_, Some(BackRef::File(n))) => Some(n.clone()),
            (_, Some(BackRef::Desc(l))) => Some(format!("loop{}", self.descs[*l].dev)),
        }
    }

    /// `disk_openers()`: live open descriptions of device `i`.
    fn openers(&self, i: u32) -> usize {
        self.descs.iter().filter(|d| d.dev == i && d.alive()).count()
    }

    // ---- the registry (loop_control_ioctl) ----

    /// `loop_add`: a given index (`EEXIST` when taken; beyond the minor space
    /// `EINVAL`), or with a negative one the lowest free index (`idr_alloc` from 0).
    fn ctl_add(&mut self, i: i32) -> Res<u32> {
        let i = if i < 0 {
            (0u32..)
                .find(|k| !self.devs.contains_key(k))
                .expect("a free index")
        } else {
            if i64::from(i) > MAX_INDEX {
                return Err(EINVAL);
            }
            if self.devs.contains_key(&(i as u32)) {
                return Err(EEXIST);
            }
            i as u32
        };
        self.devs.insert(i, Dev::fresh());
        Ok(i)
    }

    /// `loop_control_remove`: `EINVAL` for a negative index, `ENODEV` for an absent one,
    /// `EBUSY` unless the device is unbound with no openers.
    fn ctl_remove(&mut self, i: i32) -> Res<()> {
        if i < 0 {
            return Err(EINVAL);
        }
        let i = i as u32;
        let Some(d) = self.devs.get(&i) else {
            return Err(ENODEV);
        };
        if d.state != State::Unbound || self.openers(i) > 0 {
            return Err(EBUSY);
        }
        self.devs.remove(&i);
        Ok(())
    }

    /// `loop_control_get_free`: the first unbound device (open or not), else `loop_add(-1)`.
    fn ctl_get_free(&mut self) -> Res<u32> {
        if let Some((i, _)) = self.devs.iter().find(|(_, d)| d.state == State::Unbound) {
            return Ok(*i);
        }
        self.ctl_add(-1)
    }

    // ---- open and release ----

    /// `bdev_open`: the exclusive claim first (`bd_prepare_to_claim`, `EBUSY`), then
    /// `blkdev_get_whole` → `lo_open` (`ENXIO` in rundown or deleting). The first opener
    /// sets the page cache's block size (`set_init_blocksize`).
    fn open(&mut self, dev: i64, handle: &str, write: bool, excl: bool) -> Res<()> {
        let Some(i) = u32::try_from(dev).ok().filter(|i| self.devs.contains_key(i)) else {
            return Err(ENOENT);
        };
        let first = self.openers(i) == 0;
        let d = &self.devs[&i];
        if excl && d.holder.is_some() {
            return Err(EBUSY);
        }
        if d.state == State::Rundown {
            return Err(ENXIO);
        }
        let wb = if d.wb_reported { d.wb_err } else { 0 };
        let id = self.descs.len();
        self.descs.push(Desc {
            dev: i,
            write,
            excl,
            handle: true,
            holders: 0,
            wb_seen: wb,
            ra_pages: RA_PAGES,
            prev_pos: -1,
        });
        let d = self.devs.get_mut(&i).expect("present");
        if excl {
            d.holder = Some(id);
        }
        if first {
            d.cache_block = init_blocksize(d.lbs, d.size());
        }
        self.handles.insert(handle.to_string(), id);
        Ok(())
    }

    /// Drops a reference to a description; the last one runs `blkdev_release`: the
    /// exclusive claim goes (`bd_end_claim`), and when the device has no openers left,
    /// `lo_release` turns a bound device with `LO_FLAGS_AUTOCLEAR` into rundown and
    /// detaches one in rundown (`__loop_clr_fd`).
    fn put_desc(&mut self, d: usize) {
        if self.descs[d].alive() {
            return;
        }
        let i = self.descs[d].dev;
        let dev = self.devs.get_mut(&i).expect("an open device is in the registry");
        if dev.holder == Some(d) {
            dev.holder = None;
        }
        if self.openers(i) > 0 {
            return;
        }
        let dev = self.devs.get_mut(&i).expect("present");
        if dev.state == State::Bound && dev.flags & LO_FLAGS_AUTOCLEAR != 0 {
            dev.state = State::Rundown;
        }
        if dev.state == State::Rundown {
            self.clr_fd_final(i);
        }
    }

    /// `__loop_clr_fd`: offset, size limit, name and flags cleared, the block size back
    /// to 512, capacity 0, unbound; the read-only mark (`set_disk_ro` is only called by
    /// `loop_configure`) and the write cache stay. Then `fput` of the backing file, which
    /// may release a loop device below.
    fn clr_fd_final(&mut self, i: u32) {
        let dev = self.devs.get_mut(&i).expect("present");
        let backing = dev.backing.take();
        dev.offset = 0;
        dev.sizelimit = 0;
        dev.file_name.clear();
        dev.lbs = SECTOR;
        dev.capacity = 0;
        dev.flags = 0;
        dev.state = State::Unbound;
        if let Some(BackRef::Desc(l)) = backing {
            self.descs[l].holders -= 1;
            self.put_desc(l);
        }
    }

    // ---- binding ----

    /// The backing file `fget` gives, or `EBADF` for descriptor -1.
    fn fget(&self, b: &Backing) -> Res<BackRef> {
        match b {
            Backing::File(n) => Ok(BackRef::File(n.clone())),
            Backing::Handle(h) => Ok(BackRef::Desc(self.handles[h])),
            Backing::Null => Err(EBADF),
        }
    }

    /// `loop_validate_file`: walking down a stack of loop devices, reaching the device
    /// being set up is `EBADF` (a cycle), a device that is not bound is `EINVAL`.
    fn validate_file(&self, target: u32, f: &BackRef) -> Res<()> {
        let mut f = f.clone();
        while let BackRef::Desc(l) = f {
            let li = self.descs[l].dev;
            if li == target {
                return Err(EBADF);
            }
            let ld = &self.devs[&li];
            if ld.state != State::Bound {
                return Err(EINVAL);
            }
            f = ld.backing.clone().expect("a bound device has a backing file");
        }
        Ok(())
    }

    /// `FMODE_WRITE` of a backing file.
    fn backing_writable(&self, f: &BackRef) -> bool {
        match f {
            BackRef::File(n) => self.files[n].writable,
            BackRef::Desc(l) => self.descs[*l].write,
        }
    }

    /// `lo_calculate_size`: the backing's size less the offset (0 when the offset is
    /// beyond it), capped by the size limit, in sectors.
    fn calculate_size(&self, offset: u64, sizelimit: u64, f: &BackRef) -> u64 {
        let size = match f {
            BackRef::File(n) => self.files[n].data.len() as u64,
            BackRef::Desc(l) => self.devs[&self.descs[*l].dev].size(),
        };
        let mut size = size.saturating_sub(offset);
        if sizelimit > 0 && sizelimit < size {
            size = sizelimit;
        }
        size / SECTOR
    }

    /// `loop_query_min_dio_size`: `STATX_DIOALIGN` of the backing file — a block device
    /// reports its logical block size; tmpfs reports nothing and has no `s_bdev`: 512.
    fn min_dio_size(&self, f: &BackRef) -> u64 {
        match f {
            BackRef::File(_) => SECTOR,
            BackRef::Desc(l) => self.devs[&self.descs[*l].dev].lbs,
        }
    }

    /// `lo_can_use_dio`: the backing allows `O_DIRECT` (tmpfs and block devices do), the
    /// block size is at least the backing's direct-I/O alignment, and so is the offset.
    fn can_use_dio(dev: &Dev) -> bool {
        dev.lbs >= dev.min_dio && dev.offset.is_multiple_of(dev.min_dio)
    }

    /// `loop_update_dio`: direct I/O is silently turned off when it cannot be used.
    fn update_dio(dev: &mut Dev) {
        if dev.flags & LO_FLAGS_DIRECT_IO != 0 && !Self::can_use_dio(dev) {
            dev.flags &= !LO_FLAGS_DIRECT_IO;
        }
    }

    /// `loop_update_limits` + `queue_limits_commit_update`: block size 0 means the
    /// default (`loop_default_blocksize`: the direct-I/O alignment with direct I/O, else
    /// 512); the size is taken as an `unsigned int`; `blk_validate_limits` refuses a
    /// block size that is not a power of two from 512 to `BLK_MAX_BLOCK_SIZE`. The write
    /// cache follows the binding: on unless the device is read-only.
    fn commit_limits(dev: &mut Dev, bsize: u64) -> Res<()> {
        let mut bsize = u64::from(bsize as u32);
        if bsize == 0 {
            bsize = if dev.flags & LO_FLAGS_DIRECT_IO != 0 {
                dev.min_dio
            } else {
                SECTOR
            };
        }
        if !(SECTOR..=MAX_BLOCK).contains(&bsize) || !bsize.is_power_of_two() {
            return Err(EINVAL);
        }
        dev.lbs = bsize;
        dev.write_cache = dev.flags & LO_FLAGS_READ_ONLY == 0;
        Ok(())
    }

    /// `bd_prepare_to_claim` for an ioctl through a handle not opened `O_EXCL`
    /// (`loop_configure`, `loop_set_block_size`): `EBUSY` while another holds the device.
    fn claim(&self, d: usize) -> Res<()> {
        if !self.descs[d].excl && self.dev_of(d).holder.is_some() {
            return Err(EBUSY);
        }
        Ok(())
    }

    /// `loop_configure` (also `LOOP_SET_FD` with a zeroed config), in its order: `fget`
    /// (`EBADF`), the exclusive claim, `EBUSY` unless unbound, `loop_validate_file`,
    /// unknown flags `EINVAL`, `loop_set_status_from_info` (`EOVERFLOW`), the read-only
    /// flag and `set_disk_ro` (which a later failure leaves in place), the queue limits
    /// (`EINVAL` for a bad block size), direct I/O, the size, bound.
    #[allow(clippy::too_many_arguments)]
    fn configure(
        &mut self,
        d: usize,
        backing: &Backing,
        block_size: u64,
        offset: u64,
        sizelimit: u64,
        flags: u32,
        name: String,
    ) -> Res<()> {
        let f = self.fget(backing)?;
        self.claim(d)?;
        let i = self.descs[d].dev;
        if self.devs[&i].state != State::Unbound {
            return Err(EBUSY);
        }
        self.validate_file(i, &f)?;
        if flags & !CONFIGURE_SETTABLE != 0 {
            return Err(EINVAL);
        }
        // loop_set_status_from_info.
        if offset > i64::MAX as u64 || sizelimit > i64::MAX as u64 {
            return Err(EOVERFLOW);
        }
        let read_only = !self.backing_writable(&f) || !self.descs[d].write;
        let min_dio = self.min_dio_size(&f);
        let dev = self.devs.get_mut(&i).expect("present");
        dev.offset = offset;
        dev.sizelimit = sizelimit;
        dev.file_name = lo_name(&name);
        dev.flags = flags;
        if read_only {
            dev.flags |= LO_FLAGS_READ_ONLY;
        }
        dev.ro = dev.flags & LO_FLAGS_READ_ONLY != 0;
        // loop_assign_backing_file.
        dev.min_dio = min_dio;
        Self::commit_limits(dev, block_size)?;
        Self::update_dio(dev);
        let cap = self.calculate_size(offset, sizelimit, &f);
        if let BackRef::Desc(l) = f {
            self.descs[l].holders += 1;
        }
        let dev = self.devs.get_mut(&i).expect("present");
        dev.backing = Some(f);
        dev.capacity = cap;
        dev.state = State::Bound;
        Ok(())
    }

    /// `loop_change_fd`: `EBADF` for descriptor -1, `ENXIO` unless bound, `EINVAL` unless
    /// read-only, `loop_validate_file`, `EINVAL` unless the new file gives the same size
    /// (`lo_calculate_size` of both with the device's offset and size limit). The old
    /// file is put afterwards.
    fn change_fd(&mut self, d: usize, backing: &Backing) -> Res<()> {
        let f = self.fget(backing)?;
        let i = self.descs[d].dev;
        let dev = &self.devs[&i];
        if dev.state != State::Bound {
            return Err(ENXIO);
        }
        if dev.flags & LO_FLAGS_READ_ONLY == 0 {
            return Err(EINVAL);
        }
        self.validate_file(i, &f)?;
        let old = dev.backing.clone().expect("bound");
        let (off, lim) = (dev.offset, dev.sizelimit);
        if self.calculate_size(off, lim, &f) != self.calculate_size(off, lim, &old) {
            return Err(EINVAL);
        }
        let min_dio = self.min_dio_size(&f);
        if let BackRef::Desc(l) = f {
            self.descs[l].holders += 1;
        }
        let dev = self.devs.get_mut(&i).expect("present");
        dev.backing = Some(f);
        dev.min_dio = min_dio;
        Self::update_dio(dev);
        if let BackRef::Desc(l) = old {
            self.descs[l].holders -= 1;
            self.put_desc(l);
        }
        Ok(())
    }

    /// `loop_clr_fd`: `ENXIO` unless bound; marks the device for detach at the last
    /// close (`LO_FLAGS_AUTOCLEAR`), and with one opener enters rundown at once (which
    /// refuses new opens; the detach itself runs at the last close, 6.11+).
    fn clr_fd(&mut self, d: usize) -> Res<()> {
        let i = self.descs[d].dev;
        let openers = self.openers(i);
        let dev = self.devs.get_mut(&i).expect("present");
        if dev.state != State::Bound {
            return Err(ENXIO);
        }
        dev.flags |= LO_FLAGS_AUTOCLEAR;
        if openers == 1 {
            dev.state = State::Rundown;
        }
        Ok(())
    }

    /// `loop_set_status`: `ENXIO` unless bound; `loop_set_status_from_info` (`EOVERFLOW`,
    /// nothing changed); `AUTOCLEAR` follows the request, `PARTSCAN` can only be set, the
    /// other flags are ignored; a new offset or size limit re-checks direct I/O and sets
    /// the size.
    fn set_status(&mut self, d: usize, offset: u64, sizelimit: u64, flags: u32, name: &str) -> Res<()> {
        let i = self.descs[d].dev;
        let dev = &self.devs[&i];
        if dev.state != State::Bound {
            return Err(ENXIO);
        }
        let size_changed = dev.offset != offset || dev.sizelimit != sizelimit;
        if offset > i64::MAX as u64 || sizelimit > i64::MAX as u64 {
            return Err(EOVERFLOW);
        }
        let f = dev.backing.clone().expect("bound");
        let cap = self.calculate_size(offset, sizelimit, &f);
        let dev = self.devs.get_mut(&i).expect("present");
        dev.offset = offset;
        dev.sizelimit = sizelimit;
        dev.file_name = lo_name(name);
        dev.flags &= !STATUS_CLEARABLE;
        dev.flags |= flags & STATUS_SETTABLE;
        if size_changed {
            Self::update_dio(dev);
            dev.capacity = cap;
        }
        Ok(())
    }

    /// `loop_get_status`: `ENXIO` unless bound.
    fn get_status(&self, d: usize) -> Res<Status> {
        let i = self.descs[d].dev;
        let dev = &self.devs[&i];
        if dev.state != State::Bound {
            return Err(ENXIO);
        }
        Ok(Status {
            number: i,
            offset: dev.offset,
            sizelimit: dev.sizelimit,
            flags: dev.flags,
            file_name: dev.file_name.clone(),
        })
    }

    /// `loop_set_capacity`: `ENXIO` unless bound; the size from the backing file now.
    fn set_capacity(&mut self, d: usize) -> Res<()> {
        let dev = self.dev_of(d);
        if dev.state != State::Bound {
            return Err(ENXIO);
        }
        let f = dev.backing.clone().expect("bound");
        let cap = self.calculate_size(dev.offset, dev.sizelimit, &f);
        self.dev_mut(d).capacity = cap;
        Ok(())
    }

    /// `loop_set_block_size`: the exclusive claim first (so even a no-op through a
    /// non-exclusive handle is `EBUSY` under a holder), `ENXIO` unless bound, nothing to
    /// do when the (64-bit) argument equals the block size, else the limits with the
    /// argument truncated to 32 bits (so 2^32 is 0, the default) and direct I/O
    /// re-checked.
    fn set_block_size(&mut self, d: usize, arg: u64) -> Res<()> {
        self.claim(d)?;
        let dev = self.dev_mut(d);
        if dev.state != State::Bound {
            return Err(ENXIO);
        }
        if dev.lbs == arg {
            return Ok(());
        }
        let r = Self::commit_limits(dev, arg);
        Self::update_dio(dev);
        r
    }

    /// `loop_set_dio`: `ENXIO` unless bound, nothing when unchanged, `EINVAL` when direct
    /// I/O cannot be used.
    fn set_dio(&mut self, d: usize, on: bool) -> Res<()> {
        let dev = self.dev_mut(d);
        if dev.state != State::Bound {
            return Err(ENXIO);
        }
        if on == (dev.flags & LO_FLAGS_DIRECT_IO != 0) {
            return Ok(());
        }
        if on {
            if !Self::can_use_dio(dev) {
                return Err(EINVAL);
            }
            dev.flags |= LO_FLAGS_DIRECT_IO;
        } else {
            dev.flags &= !LO_FLAGS_DIRECT_IO;
        }
        Ok(())
    }

    // ---- block I/O ----

    /// `pread` on a device handle (`blkdev_read_iter`): nothing at or past the end, the
    /// rest cut at the end; the data come from the backing (`loop_queue_rq` →
    /// `lo_rw_aio`), which fails with `EIO` unless the device (and every one below) is
    /// bound, or when the readahead window is not whole logical blocks
    /// ([`Reference::readahead_aligned`]). A failed read shrinks the description's
    /// readahead; one that returns data moves its `prev_pos`.
    fn handle_read(&mut self, d: usize, pos: u64, len: u64) -> Res<Vec<u8>> {
        if pos > i64::MAX as u64 || pos.checked_add(len).is_none_or(|e| e > i64::MAX as u64) {
            return Err(EINVAL);
        }
        let size = self.dev_of(d).size();
        if pos >= size || len == 0 {
            return Ok(Vec::new());
        }
        let n = len.min(size - pos);
        let r = if self.readahead_aligned(d, pos, n) {
            self.dev_read(self.descs[d].dev, pos, len)
        } else {
            Err(EIO)
        };
        let desc = &mut self.descs[d];
        match r {
            Ok(_) => desc.prev_pos = (pos + n) as i64,
            // filemap_read_folio: shrink_readahead_size_eio.
            Err(_) => desc.ra_pages /= 4,
        }
        r
    }

    /// Whether the block layer accepts the read that a buffered read of `n` bytes at
    /// `pos` through description `d` makes, the page cache being empty: the readahead
    /// window ([`sync_ra_window`]) is read in folios of the page cache's block size (at
    /// least a page, `mapping_min_folio_order` from `set_init_blocksize` at the first
    /// open), and `blk_mq_submit_bio` fails a bio that is not whole logical blocks
    /// (`bio_unaligned`) with `EIO`. Only a block size above the page size, set after
    /// the first open, can make such a bio.
    fn readahead_aligned(&self, d: usize, pos: u64, n: u64) -> bool {
        let desc = &self.descs[d];
        let dev = self.dev_of(d);
        if dev.lbs <= PAGE {
            return true;
        }
        let folio = dev.cache_block.max(PAGE);
        let (first, pages) = sync_ra_window(desc.ra_pages, desc.prev_pos, pos, n);
        let start = first * PAGE / folio * folio;
        // Blocks past the end are not read (block_read_full_folio, do_mpage_readpage).
        let eof = dev.size().div_ceil(dev.cache_block) * dev.cache_block;
        let end = ((first + pages) * PAGE).div_ceil(folio) * folio;
        let end = end.min(eof).max(start);
        start.is_multiple_of(dev.lbs) && (end - start).is_multiple_of(dev.lbs)
    }

    fn dev_read(&self, i: u32, pos: u64, len: u64) -> Res<Vec<u8>> {
        let dev = &self.devs[&i];
        let size = dev.size();
        if pos >= size || len == 0 {
            return Ok(Vec::new());
        }
        let end = size.min(pos + len);
        if dev.state != State::Bound {
            return Err(EIO);
        }
        let at = dev.offset + pos;
        let n = end - pos;
        match dev.backing.as_ref().expect("bound") {
            BackRef::File(f) => {
                // A short read of the backing file is zero-filled (lo_rw_aio_complete).
                let mut b = file_slice(&self.files[f].data, at, n);
                b.resize(n as usize, 0);
                Ok(b)
            }
            BackRef::Desc(l) => {
                let mut b = self.dev_read(self.descs[*l].dev, at, n)?;
                b.resize(n as usize, 0);
                Ok(b)
            }
        }
    }

    /// Whether a write of `[at, at + n)` through device `i`'s queue reaches its backing:
    /// every device down the stack bound, not read-only, and covering the range.
    fn dev_writable(&self, i: u32, at: u64, n: u64) -> bool {
        let dev = &self.devs[&i];
        if dev.state != State::Bound || dev.ro || at + n > dev.size() {
            return false;
        }
        match dev.backing.as_ref().expect("bound") {
            BackRef::File(f) => self.files[f].writable,
            BackRef::Desc(l) => self.dev_writable(self.descs[*l].dev, dev.offset + at, n),
        }
    }

    /// Whether device `i` can read `[at, at + n)` for a read-modify-write.
    fn dev_readable(&self, i: u32, at: u64, n: u64) -> bool {
        self.dev_read(i, at, n).is_ok()
    }

    /// Writes `[at, at + data.len())` of device `i` into its backing (known writable).
    fn dev_store(&mut self, i: u32, at: u64, data: &[u8]) {
        let dev = &self.devs[&i];
        let at = dev.offset + at;
        match dev.backing.clone().expect("bound") {
            BackRef::File(f) => {
                let file = &mut self.files.get_mut(&f).expect("tracked").data;
                let end = at as usize + data.len();
                if file.len() < end {
                    file.resize(end, 0);
                }
                file[at as usize..end].copy_from_slice(data);
            }
            BackRef::Desc(l) => {
                let li = self.descs[l].dev;
                self.dev_store(li, at, data);
            }
        }
    }

    /// `pwrite` on a device handle: `EBADF` on a read-only handle (`vfs_write`),
    /// `EINVAL` for a negative position (`rw_verify_area`), then `blkdev_write_iter`:
    /// `EPERM` on a read-only disk, 0 for nothing, `ENOSPC` at or past the end, the rest
    /// cut at the end. The write is buffered: a page-cache block the write covers only in
    /// part is read first (`block_write_begin`), which fails with `EIO` when the device
    /// cannot read (rundown, or a device below not bound): the folios before the first
    /// such one are written, or `EIO` when there are none. What the runner's write-back
    /// then cannot store (the device or one below not bound or read-only) is lost and
    /// recorded as a write-back error (`mapping_set_error`).
    fn handle_write(&mut self, d: usize, pos: u64, len: u64, byte: u8) -> Res<u64> {
        let desc = &self.descs[d];
        if !desc.write {
            return Err(EBADF);
        }
        if pos > i64::MAX as u64 || pos.checked_add(len).is_none_or(|e| e > i64::MAX as u64) {
            return Err(EINVAL);
        }
        let i = desc.dev;
        let dev = &self.devs[&i];
        if dev.ro {
            return Err(EPERM);
        }
        if len == 0 {
            return Ok(0);
        }
        let size = dev.size();
        if pos >= size {
            return Err(ENOSPC);
        }
        let end = size.min(pos + len);
        // The page cache's block size is fixed at the first open (set_init_blocksize), a
        // later LOOP_SET_BLOCK_SIZE does not change it.
        let block = dev.cache_block;
        let folio = block.max(PAGE);
        // Buffer heads of the cache's block size are read (block_write_begin) and written
        // back (block_write_full_folio) one bio each: below the logical block size such a
        // bio is refused (bio_unaligned), a partial block cannot be read and whole blocks
        // are lost at write-back.
        let whole_blocks = block >= dev.lbs;
        // generic_perform_write, one folio at a time.
        let mut done = pos;
        while done < end {
            let chunk_end = end.min((done / folio + 1) * folio);
            let partial = !done.is_multiple_of(block) || !chunk_end.is_multiple_of(block);
            if partial {
                let rb = done / block * block;
                let re = chunk_end.div_ceil(block) * block;
                if !whole_blocks || !self.dev_readable(i, rb, re - rb) {
                    break;
                }
            }
            done = chunk_end;
        }
        if done == pos {
            return Err(EIO);
        }
        let n = done - pos;
        if whole_blocks && self.dev_writable(i, pos, n) {
            self.dev_store(i, pos, &vec![byte; n as usize]);
        } else {
            // errseq_set
            let dev = self.devs.get_mut(&i).expect("present");
            if dev.wb_err == 0 || dev.wb_reported {
                dev.wb_err += 1;
                dev.wb_reported = false;
            }
        }
        Ok(n)
    }

    /// `blkdev_fsync`: a write-back error this description has not seen is `EIO`
    /// (`file_write_and_wait_range`); then the flush (`blkdev_issue_flush`), a no-op
    /// without a write cache, else `loop_queue_rq`: `EIO` unless bound, else
    /// `vfs_fsync` of the backing file.
    fn fsync(&mut self, d: usize) -> Res<()> {
        let i = self.descs[d].dev;
        // errseq_check_and_advance
        let wb = self.devs[&i].wb_err;
        if self.descs[d].wb_seen != wb {
            self.descs[d].wb_seen = wb;
            self.devs.get_mut(&i).expect("present").wb_reported = true;
            return Err(EIO);
        }
        self.flush(i)
    }

    fn flush(&mut self, i: u32) -> Res<()> {
        let dev = &self.devs[&i];
        if !dev.write_cache {
            return Ok(());
        }
        if dev.state != State::Bound {
            return Err(EIO);
        }
        match dev.backing.clone().expect("bound") {
            BackRef::File(_) => Ok(()),
            BackRef::Desc(l) => self.fsync(l).map_err(|_| EIO),
        }
    }
}

/// `set_init_blocksize`: the largest power of two from the logical block size up to
/// `PAGE_SIZE` that divides the size.
fn init_blocksize(lbs: u64, size: u64) -> u64 {
    let mut b = lbs;
    while b < PAGE {
        if size & b != 0 {
            break;
        }
        b <<= 1;
    }
    b
}

/// `page_cache_sync_ra` (Linux 6.18) for a read of `n` bytes at `pos` that finds nothing
/// cached: the pages it reads, as (first page, count), given the description's
/// `ra_pages` and `prev_pos` (-1 before its first read).
fn sync_ra_window(ra_pages: u64, prev_pos: i64, pos: u64, n: u64) -> (u64, u64) {
    let index = pos / PAGE;
    let req_count = (pos + n).div_ceil(PAGE) - index;
    if ra_pages == 0 {
        // force_page_cache_ra(ractl, 1)
        return (index, 1);
    }
    let max_pages = ractl_max_pages(ra_pages, req_count);
    let prev_index = prev_pos as u64 / PAGE;
    if index == 0 || req_count > max_pages || index.wrapping_sub(prev_index) <= 1 {
        return (index, init_ra_size(req_count, max_pages));
    }
    // page_cache_prev_miss finds page index - 1 missing (the cache was dropped), so
    // contig_count is 0: do_page_cache_ra of the request.
    (index, req_count)
}

/// `ractl_max_pages`: a request above the window may grow it to the device's `io_pages`.
fn ractl_max_pages(ra_pages: u64, req_size: u64) -> u64 {
    if req_size > ra_pages && IO_PAGES > ra_pages {
        IO_PAGES.min(req_size)
    } else {
        ra_pages
    }
}

/// `get_init_ra_size`: the first readahead window for a request of `req` pages.
fn init_ra_size(req: u64, max: u64) -> u64 {
    let size = req.next_power_of_two();
    if size <= max / 32 {
        size * 4
    } else if size <= max / 4 {
        size * 2
    } else {
        max
    }
}

/// `lo_file_name`: at most `LO_NAME_SIZE - 1` bytes, up to the first NUL.
fn lo_name(name: &str) -> String {
    let b = name.as_bytes();
    let b = &b[..b.len().min(LO_NAME_SIZE - 1)];
    String::from_utf8_lossy(b).into_owned()
}

/// `pread` on a backing file: the bytes from `at`, cut at the end.
fn file_slice(data: &[u8], at: u64, len: u64) -> Vec<u8> {
    let n = data.len() as u64;
    if at >= n {
        return Vec::new();
    }
    let end = n.min(at.saturating_add(len));
    data[at as usize..end as usize].to_vec()
}
