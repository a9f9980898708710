//! The registry (`/dev/loop-control`, `loop_index_idr`): add, remove, get_free, lookup.

use std::collections::{BTreeMap, HashMap};

use crate::device::{LoopDevice, LoopHandle, LoopState, OpenMode};
use crate::errno::Errno;
use crate::stats::{LockKind, LoopStats};
use crate::sync::{Arc, Mutex, Ordering};
use crate::{CtlLock, Settings, Shared};

/// Lookup shards: a device is found by `number % LOOKUP_SHARDS`, so opens of different
/// devices share no lock (the block layer's lookup of a `/dev/loopN` node takes no loop
/// lock either).
const LOOKUP_SHARDS: usize = if cfg!(any(vfscale_loom, vfscale_shuttle)) {
    2
} else {
    64
};

/// The largest index plus one (`1 << MINORBITS`).
pub const LOOP_MAX_DEVICES: u32 = 1 << 20;

#[repr(align(128))]
struct LookupShard(Mutex<HashMap<u32, Arc<LoopDevice>>>);

struct Registry {
    shared: Arc<Shared>,
    lookup: Box<[LookupShard]>,
}

/// The loop registry: what `/dev/loop-control` manages. Cheap to clone (shared).
///
/// ```
/// use vfscale_loop::{LoopControl, Settings, Errno};
/// let ctl = LoopControl::new(Settings::default());
/// assert_eq!(ctl.list().len(), 8);                       // loop0..loop7
/// assert_eq!(ctl.add(9), Ok(9));
/// assert_eq!(ctl.add(9), Err(Errno::EEXIST));
/// assert_eq!(ctl.add(-1), Ok(8));                        // the registry chooses
/// assert_eq!(ctl.remove(100), Err(Errno::ENODEV));
/// assert_eq!(ctl.remove(-1), Err(Errno::EINVAL));
/// assert_eq!(ctl.get_free(), Ok(0));                     // the first unbound device
/// ```
#[derive(Clone)]
pub struct LoopControl {
    reg: Arc<Registry>,
}

impl LoopControl {
    /// A registry with `settings.initial_devices` devices (Linux's
    /// `CONFIG_BLK_DEV_LOOP_MIN_COUNT`, 8 by default).
    pub fn new(settings: Settings) -> LoopControl {
        let shared = Arc::new(Shared::new(settings));
        let reg = Registry {
            shared,
            lookup: (0..LOOKUP_SHARDS)
                .map(|_| LookupShard(Mutex::new(HashMap::new())))
                .collect(),
        };
        let ctl = LoopControl { reg: Arc::new(reg) };
        for i in 0..settings.initial_devices.min(LOOP_MAX_DEVICES) {
            let _ = ctl.add(i as i32);
        }
        ctl
    }

    /// The settings.
    pub fn settings(&self) -> Settings {
        self.reg.shared.settings
    }

    /// Lock counters since the registry was made.
    pub fn stats(&self) -> LoopStats {
        self.reg.shared.stats.snapshot()
    }

    fn shard(&self, i: u32) -> &Mutex<HashMap<u32, Arc<LoopDevice>>> {
        &self.reg.lookup[i as usize % LOOKUP_SHARDS].0
    }

    /// `LOOP_CTL_ADD`: adds device `index`, or the lowest free index when `index` is
    /// negative; returns the index. `EEXIST` when taken, `EINVAL` past the last minor.
    pub fn add(&self, index: i32) -> Result<u32, Errno> {
        if index >= 0 && index as u32 >= LOOP_MAX_DEVICES {
            return Err(Errno::EINVAL);
        }
        let sh = &self.reg.shared;
        let mut idr = sh.stats.lock(LockKind::Ctl, &sh.ctl);
        let i = if index >= 0 {
            let i = index as u32;
            if idr.devices.contains_key(&i) {
                return Err(Errno::EEXIST);
            }
            i
        } else {
            let mut i = 0u32;
            for k in idr.devices.keys() {
                if *k != i {
                    break;
                }
                i += 1;
            }
            if i >= LOOP_MAX_DEVICES {
                return Err(Errno::ENOSPC);
            }
            i
        };
        let dev = Arc::new(LoopDevice::new(i, sh.clone()));
        idr.devices.insert(i, dev.clone());
        self.shard(i).lock().insert(i, dev);
        Ok(i)
    }

    /// `LOOP_CTL_REMOVE`: `EINVAL` for a negative index, `ENODEV` when absent, `EBUSY`
    /// when bound or open.
    pub fn remove(&self, index: i32) -> Result<(), Errno> {
        if index < 0 {
            return Err(Errno::EINVAL);
        }
        let i = index as u32;
        let sh = &self.reg.shared;
        let dev = {
            let idr = sh.stats.lock(LockKind::Ctl, &sh.ctl);
            let dev = match idr.devices.get(&i) {
                Some(d) if d.visible.load(Ordering::Acquire) => d.clone(),
                _ => return Err(Errno::ENODEV),
            };
            dev.visible.store(false, Ordering::Release);
            if sh.settings.ctl_lock == CtlLock::Global {
                // Before Linux 5.12 the whole removal ran under the control lock.
                let r = dev.begin_remove();
                if let Err(e) = r {
                    dev.visible.store(true, Ordering::Release);
                    return Err(e);
                }
                drop(idr);
                return self.finish_remove(i);
            }
            dev
        };
        if let Err(e) = dev.begin_remove() {
            let _idr = sh.stats.lock(LockKind::Ctl, &sh.ctl);
            dev.visible.store(true, Ordering::Release);
            return Err(e);
        }
        self.finish_remove(i)
    }

    fn finish_remove(&self, i: u32) -> Result<(), Errno> {
        let removed = self.shard(i).lock().remove(&i);
        let sh = &self.reg.shared;
        let mut idr = sh.stats.lock(LockKind::Ctl, &sh.ctl);
        idr.devices.remove(&i);
        drop(idr);
        drop(removed);
        Ok(())
    }

    /// `LOOP_CTL_GET_FREE`: the first visible unbound device, or a new one.
    pub fn get_free(&self) -> Result<u32, Errno> {
        let sh = &self.reg.shared;
        {
            let idr = sh.stats.lock(LockKind::Ctl, &sh.ctl);
            for (i, d) in idr.devices.iter() {
                if d.visible.load(Ordering::Acquire) && d.state() == LoopState::Unbound {
                    return Ok(*i);
                }
            }
        }
        self.add(-1)
    }

    /// The device `index`, if it exists.
    pub fn lookup(&self, index: u32) -> Option<Arc<LoopDevice>> {
        self.shard(index).lock().get(&index).cloned()
    }

    /// Opens `/dev/loop{index}`: `ENOENT` when there is no such device, `ENXIO` while it
    /// runs down or is being removed, `EBUSY` for an exclusive open of a device that
    /// another opener claims (checked first: `bdev_open` claims before `lo_open`). In [`CtlLock::PerDevice`] this takes only the device's
    /// lock (and a lookup shard's, briefly).
    pub fn open(&self, index: u32, mode: OpenMode) -> Result<LoopHandle, Errno> {
        let dev = self.lookup(index).ok_or(Errno::ENOENT)?;
        LoopDevice::open(&dev, mode)
    }

    /// The registry: `(index, backing path)`, sorted by index; the path is `None` for
    /// an unbound device (as `/sys/block/loopN/loop/backing_file`).
    pub fn list(&self) -> Vec<(u32, Option<String>)> {
        let mut devs: Vec<Arc<LoopDevice>> = Vec::new();
        for s in self.reg.lookup.iter() {
            devs.extend(s.0.lock().values().cloned());
        }
        devs.sort_by_key(|d| d.number());
        devs.iter().map(|d| (d.number(), d.backing_path())).collect()
    }
}

/// The registry's index (`loop_index_idr`), protected by the control lock.
#[derive(Default)]
pub(crate) struct Idr {
    pub(crate) devices: BTreeMap<u32, Arc<LoopDevice>>,
}

impl std::fmt::Debug for LoopControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopControl")
            .field("settings", &self.reg.shared.settings)
            .finish()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // Devices point at the shared part, whose index points back at them: break the
        // cycle when the last registry handle goes. Open handles keep their devices.
        let sh = &self.shared;
        let taken = std::mem::take(&mut sh.ctl.lock().devices);
        drop(taken);
    }
}
