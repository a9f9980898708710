//! Replays a loop scenario against `vfscale-loop`: one [`LoopControl`] with devices 0
//! to 7 (the starting state), backing files in a fresh tmpfs directory under
//! `/dev/shm` (as the kernel runner's, so direct I/O is allowed or refused alike).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use vfscale_loop::{Errno, LoopConfig, LoopControl, LoopFile, LoopHandle, LoopInfo, OpenMode, Settings};

use super::format::{
    backing_byte, Backing, Mode, Op, Outcome, Scenario, ScenarioError, Status, Step, StepResult, Tracker,
};

/// Replays `scn` with the default settings.
///
/// ```
/// use vfscale_conformance::loop_dev::{library, render_results, Scenario};
/// let s = Scenario::parse(concat!(
///     r#"{"op":"ctl_add","index":-1}"#, "\n",
///     r#"{"op":"open","dev":8,"handle":"h","mode":"rw"}"#, "\n",
///     r#"{"op":"ctl_remove","index":8}"#, "\n",
/// )).unwrap();
/// let out = render_results(&library::replay(&s).unwrap());
/// assert_eq!(out, "{\"step\":0,\"result\":8}\n{\"step\":1,\"result\":\"ok\"}\n{\"step\":2,\"result\":\"EBUSY\"}\n");
/// ```
pub fn replay(scn: &Scenario) -> Result<Vec<StepResult>, ScenarioError> {
    replay_with(scn, Settings::default())
}

/// Replays `scn` with `settings` (the control-lock design must not change a result).
pub fn replay_with(scn: &Scenario, settings: Settings) -> Result<Vec<StepResult>, ScenarioError> {
    let mut r = LibraryReplay::new(settings)?;
    scn.steps.iter().map(|s| r.apply(s)).collect()
}

/// A replay in progress, one step at a time (for generators that pick the next step
/// from the state so far).
pub struct LibraryReplay {
    ctl: LoopControl,
    dir: PathBuf,
    tracker: Tracker,
    backings: HashMap<String, File>,
    handles: HashMap<String, LoopHandle>,
    next: usize,
}

impl LibraryReplay {
    /// A fresh replay: a new registry and a new scratch directory.
    pub fn new(settings: Settings) -> Result<LibraryReplay, ScenarioError> {
        let parent = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let dir = parent.join(format!(
            "vfscale-loop-lib-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| ScenarioError::at(0, format!("library: {}: {e}", dir.display())))?;
        Ok(LibraryReplay {
            ctl: LoopControl::new(settings),
            dir,
            tracker: Tracker::new(),
            backings: HashMap::new(),
            handles: HashMap::new(),
            next: 0,
        })
    }

    /// The registry.
    pub fn control(&self) -> &LoopControl {
        &self.ctl
    }

    /// The open handles' names, sorted.
    pub fn handles(&self) -> Vec<String> {
        crate::format::sorted_names(self.handles.keys())
    }

    /// Applies the next step.
    pub fn apply(&mut self, step: &Step) -> Result<StepResult, ScenarioError> {
        self.tracker.check(step)?;
        StepResult::numbered(self.run(&step.op), step.line, &mut self.next)
    }

    fn file(&self, b: &Backing) -> LoopFile<'_> {
        match b {
            Backing::File(n) => LoopFile::Fd(self.backings[n].as_fd()),
            Backing::Handle(h) => LoopFile::Device(&self.handles[h]),
            Backing::Null => LoopFile::BadFd,
        }
    }

    fn run(&mut self, op: &Op) -> Result<Outcome, String> {
        let res = |r: Result<(), Errno>| match r {
            Ok(()) => Outcome::Ok,
            Err(e) => Outcome::errno(e.raw()),
        };
        Ok(match op {
            Op::Backing { name, size, mode } => {
                let path = self.dir.join(name);
                let data: Vec<u8> = (0..*size).map(backing_byte).collect();
                std::fs::write(&path, data).map_err(|e| format!("library: {}: {e}", path.display()))?;
                let f = File::options()
                    .read(true)
                    .write(*mode == Mode::Rw)
                    .open(&path)
                    .map_err(|e| format!("library: {}: {e}", path.display()))?;
                self.backings.insert(name.clone(), f);
                Outcome::Ok
            }
            // ftruncate(2) on the scenario's descriptor, as the kernel runner does.
            Op::TruncateBacking { name, size } => match self.backings[name].set_len(*size) {
                Ok(()) => Outcome::Ok,
                Err(e) => Outcome::errno(e.raw_os_error().unwrap_or(libc::EIO)),
            },
            Op::ReadBacking { name, offset, len } => {
                if *offset > i64::MAX as u64 {
                    return Ok(Outcome::errno(libc::EINVAL));
                }
                let f = &self.backings[name];
                let mut buf = vec![0u8; *len as usize];
                let mut done = 0;
                while done < buf.len() {
                    match f.read_at(&mut buf[done..], offset + done as u64) {
                        Ok(0) => break,
                        Ok(n) => done += n,
                        Err(e) if done == 0 => {
                            return Ok(Outcome::errno(e.raw_os_error().unwrap_or(libc::EIO)))
                        }
                        Err(_) => break,
                    }
                }
                Outcome::read(&buf[..done])
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
                let m = OpenMode {
                    write: *mode == Mode::Rw,
                    excl: *excl,
                };
                match self.ctl.open(i, m) {
                    Ok(h) => {
                        self.tracker.opened(handle);
                        self.handles.insert(handle.clone(), h);
                        Outcome::Ok
                    }
                    Err(e) => Outcome::errno(e.raw()),
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
                let name = match backing {
                    Backing::File(n) => n.as_bytes().to_vec(),
                    _ => Vec::new(),
                };
                let cfg = LoopConfig {
                    block_size: *block_size,
                    info: LoopInfo {
                        number: 0,
                        offset: *offset,
                        sizelimit: *sizelimit,
                        flags: *flags,
                        file_name: name,
                    },
                };
                res(self.handles[handle].configure(self.file(backing), &cfg))
            }
            Op::SetFd { handle, backing } => res(self.handles[handle].set_fd(self.file(backing))),
            Op::ChangeFd { handle, backing } => res(self.handles[handle].change_fd(self.file(backing))),
            Op::ClrFd { handle } => res(self.handles[handle].clr_fd()),
            Op::SetStatus64 {
                handle,
                offset,
                sizelimit,
                flags,
                file_name,
            } => res(self.handles[handle].set_status64(&LoopInfo {
                number: 0,
                offset: *offset,
                sizelimit: *sizelimit,
                flags: *flags,
                file_name: file_name.as_bytes().to_vec(),
            })),
            Op::GetStatus64 { handle } => match self.handles[handle].get_status64() {
                Ok(i) => Outcome::Status(Status {
                    number: i.number,
                    offset: i.offset,
                    sizelimit: i.sizelimit,
                    flags: i.flags,
                    file_name: String::from_utf8_lossy(&i.file_name).into_owned(),
                }),
                Err(e) => Outcome::errno(e.raw()),
            },
            Op::SetCapacity { handle } => res(self.handles[handle].set_capacity()),
            Op::SetBlockSize { handle, size } => res(self.handles[handle].set_block_size(*size)),
            Op::SetDirectIo { handle, on } => res(self.handles[handle].set_direct_io(*on)),
            Op::Size { handle } => Outcome::Int(self.handles[handle].size() as i64),
            Op::BlockSize { handle } => Outcome::Int(i64::from(self.handles[handle].block_size())),
            Op::Ro { handle } => Outcome::Bool(self.handles[handle].read_only()),
            Op::Read { handle, offset, len } => {
                let mut buf = vec![0u8; *len as usize];
                match self.handles[handle].read_at(&mut buf, *offset) {
                    Ok(n) => Outcome::read(&buf[..n]),
                    Err(e) => Outcome::errno(e.raw()),
                }
            }
            Op::Write {
                handle,
                offset,
                len,
                byte,
            } => {
                let buf = vec![*byte; *len as usize];
                match self.handles[handle].write_at(&buf, *offset) {
                    Ok(n) => Outcome::Int(n as i64),
                    Err(e) => Outcome::errno(e.raw()),
                }
            }
            Op::Fsync { handle } => res(self.handles[handle].flush()),
            // LOOP_CTL_ADD and _REMOVE take an int: the kernel truncates the argument.
            Op::CtlAdd { index } => match self.ctl.add(*index as i32) {
                Ok(i) => Outcome::Int(i64::from(i)),
                Err(e) => Outcome::errno(e.raw()),
            },
            Op::CtlRemove { index } => res(self.ctl.remove(*index as i32)),
            Op::CtlGetFree => match self.ctl.get_free() {
                Ok(i) => Outcome::Int(i64::from(i)),
                Err(e) => Outcome::errno(e.raw()),
            },
            Op::List => Outcome::List(
                self.ctl
                    .list()
                    .into_iter()
                    .map(|(i, p)| (i, p.map(|p| p.rsplit('/').next().unwrap_or(&p).to_string())))
                    .collect(),
            ),
        })
    }
}

impl Drop for LibraryReplay {
    fn drop(&mut self) {
        self.handles.clear();
        self.backings.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
