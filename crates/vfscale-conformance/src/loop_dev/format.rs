//! The loop-scenario format (`docs/scenarios/loop.md`, from
//! `shared/specs/loop-scenarios.md`): steps, results, and the rules every runner enforces
//! the same way (names of backing files and handles).

use std::collections::HashSet;

pub use crate::format::ScenarioError;
use crate::format::{field, Object, StepOp};
use serde_json::{json, Map, Value};

/// `LO_FLAGS_READ_ONLY`.
pub const LO_FLAGS_READ_ONLY: u32 = 1;
/// `LO_FLAGS_AUTOCLEAR`.
pub const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// `LO_FLAGS_PARTSCAN`.
pub const LO_FLAGS_PARTSCAN: u32 = 8;
/// `LO_FLAGS_DIRECT_IO`.
pub const LO_FLAGS_DIRECT_IO: u32 = 16;

/// The flag names of the format, sorted by name, with their bits.
pub const FLAG_NAMES: [(&str, u32); 4] = [
    ("AUTOCLEAR", LO_FLAGS_AUTOCLEAR),
    ("DIRECT_IO", LO_FLAGS_DIRECT_IO),
    ("PARTSCAN", LO_FLAGS_PARTSCAN),
    ("READ_ONLY", LO_FLAGS_READ_ONLY),
];

/// `LO_NAME_SIZE`: `lo_file_name` holds at most 63 bytes and a NUL.
pub const LO_NAME_SIZE: usize = 64;

/// Open mode of a backing file or a device handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `O_RDWR`.
    Rw,
    /// `O_RDONLY`.
    Ro,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Rw => "rw",
            Mode::Ro => "ro",
        }
    }
}

/// What backs a device in `configure`, `set_fd` and `change_fd`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// A backing file of the scenario, by name.
    File(String),
    /// Another open loop device (loop on loop), by handle.
    Handle(String),
    /// Descriptor -1.
    Null,
}

/// One operation of a scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Op {
    /// Creates and opens a backing file whose byte `i` is `i mod 251`.
    Backing { name: String, size: u64, mode: Mode },
    /// `ftruncate` of a backing file.
    TruncateBacking { name: String, size: u64 },
    /// `pread` on a backing file.
    ReadBacking { name: String, offset: u64, len: u64 },
    /// Opens `/dev/loop{dev}`.
    Open {
        dev: i64,
        handle: String,
        mode: Mode,
        excl: bool,
    },
    /// Closes a handle.
    Close { handle: String },
    /// `LOOP_CONFIGURE`.
    Configure {
        handle: String,
        backing: Backing,
        block_size: u32,
        offset: u64,
        sizelimit: u64,
        flags: u32,
    },
    /// `LOOP_SET_FD`.
    SetFd { handle: String, backing: Backing },
    /// `LOOP_CHANGE_FD`.
    ChangeFd { handle: String, backing: Backing },
    /// `LOOP_CLR_FD`.
    ClrFd { handle: String },
    /// `LOOP_SET_STATUS64`.
    SetStatus64 {
        handle: String,
        offset: u64,
        sizelimit: u64,
        flags: u32,
        file_name: String,
    },
    /// `LOOP_GET_STATUS64`.
    GetStatus64 { handle: String },
    /// `LOOP_SET_CAPACITY`.
    SetCapacity { handle: String },
    /// `LOOP_SET_BLOCK_SIZE`.
    SetBlockSize { handle: String, size: u64 },
    /// `LOOP_SET_DIRECT_IO`.
    SetDirectIo { handle: String, on: bool },
    /// `BLKGETSIZE64`.
    Size { handle: String },
    /// `BLKSSZGET`.
    BlockSize { handle: String },
    /// `BLKROGET`.
    Ro { handle: String },
    /// `pread` through the device.
    Read { handle: String, offset: u64, len: u64 },
    /// `pwrite` of `len` bytes of value `byte` through the device.
    Write {
        handle: String,
        offset: u64,
        len: u64,
        byte: u8,
    },
    /// `fsync` of the device.
    Fsync { handle: String },
    /// `LOOP_CTL_ADD`.
    CtlAdd { index: i64 },
    /// `LOOP_CTL_REMOVE`.
    CtlRemove { index: i64 },
    /// `LOOP_CTL_GET_FREE`.
    CtlGetFree,
    /// The registry.
    List,
}

/// The largest `len` of a `read`, `write` or `read_backing` (16 MiB): the runners
/// allocate the buffer.
pub const MAX_IO_LEN: u64 = 16 << 20;
/// The largest backing file a scenario may create (256 MiB, on tmpfs).
pub const MAX_BACKING_SIZE: u64 = 256 << 20;

impl Op {
    /// The op's name in the format.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Backing { .. } => "backing",
            Op::TruncateBacking { .. } => "truncate_backing",
            Op::ReadBacking { .. } => "read_backing",
            Op::Open { .. } => "open",
            Op::Close { .. } => "close",
            Op::Configure { .. } => "configure",
            Op::SetFd { .. } => "set_fd",
            Op::ChangeFd { .. } => "change_fd",
            Op::ClrFd { .. } => "clr_fd",
            Op::SetStatus64 { .. } => "set_status64",
            Op::GetStatus64 { .. } => "get_status64",
            Op::SetCapacity { .. } => "set_capacity",
            Op::SetBlockSize { .. } => "set_block_size",
            Op::SetDirectIo { .. } => "set_direct_io",
            Op::Size { .. } => "size",
            Op::BlockSize { .. } => "block_size",
            Op::Ro { .. } => "ro",
            Op::Read { .. } => "read",
            Op::Write { .. } => "write",
            Op::Fsync { .. } => "fsync",
            Op::CtlAdd { .. } => "ctl_add",
            Op::CtlRemove { .. } => "ctl_remove",
            Op::CtlGetFree => "ctl_get_free",
            Op::List => "list",
        }
    }

    /// The device handle the step acts on, if any.
    pub fn handle(&self) -> Option<&str> {
        match self {
            Op::Open { handle, .. }
            | Op::Close { handle }
            | Op::Configure { handle, .. }
            | Op::SetFd { handle, .. }
            | Op::ChangeFd { handle, .. }
            | Op::ClrFd { handle }
            | Op::SetStatus64 { handle, .. }
            | Op::GetStatus64 { handle }
            | Op::SetCapacity { handle }
            | Op::SetBlockSize { handle, .. }
            | Op::SetDirectIo { handle, .. }
            | Op::Size { handle }
            | Op::BlockSize { handle }
            | Op::Ro { handle }
            | Op::Read { handle, .. }
            | Op::Write { handle, .. }
            | Op::Fsync { handle } => Some(handle),
            _ => None,
        }
    }

    /// The step as one line of JSON, the inverse of parsing.
    pub fn to_json(&self) -> Value {
        let mut o = Map::new();
        o.insert("op".into(), json!(self.name()));
        let mut put = |k: &str, v: Value| {
            o.insert(k.into(), v);
        };
        match self {
            Op::Backing { name, size, mode } => {
                put("name", json!(name));
                put("size", json!(size));
                put("mode", json!(mode.name()));
            }
            Op::TruncateBacking { name, size } => {
                put("name", json!(name));
                put("size", json!(size));
            }
            Op::ReadBacking { name, offset, len } => {
                put("name", json!(name));
                put("offset", json!(offset));
                put("len", json!(len));
            }
            Op::Open {
                dev,
                handle,
                mode,
                excl,
            } => {
                put("dev", json!(dev));
                put("handle", json!(handle));
                put("mode", json!(mode.name()));
                if *excl {
                    put("excl", json!(true));
                }
            }
            Op::Close { handle }
            | Op::ClrFd { handle }
            | Op::GetStatus64 { handle }
            | Op::SetCapacity { handle }
            | Op::Size { handle }
            | Op::BlockSize { handle }
            | Op::Ro { handle }
            | Op::Fsync { handle } => put("handle", json!(handle)),
            Op::Configure {
                handle,
                backing,
                block_size,
                offset,
                sizelimit,
                flags,
            } => {
                put("handle", json!(handle));
                put_backing(&mut put, backing);
                put("block_size", json!(block_size));
                put("offset", json!(offset));
                put("sizelimit", json!(sizelimit));
                put_flags(&mut put, *flags);
            }
            Op::SetFd { handle, backing } | Op::ChangeFd { handle, backing } => {
                put("handle", json!(handle));
                put_backing(&mut put, backing);
            }
            Op::SetStatus64 {
                handle,
                offset,
                sizelimit,
                flags,
                file_name,
            } => {
                put("handle", json!(handle));
                put("offset", json!(offset));
                put("sizelimit", json!(sizelimit));
                put_flags(&mut put, *flags);
                put("file_name", json!(file_name));
            }
            Op::SetBlockSize { handle, size } => {
                put("handle", json!(handle));
                put("size", json!(size));
            }
            Op::SetDirectIo { handle, on } => {
                put("handle", json!(handle));
                put("on", json!(on));
            }
            Op::Read { handle, offset, len } => {
                put("handle", json!(handle));
                put("offset", json!(offset));
                put("len", json!(len));
            }
            Op::Write {
                handle,
                offset,
                len,
                byte,
            } => {
                put("handle", json!(handle));
                put("offset", json!(offset));
                put("len", json!(len));
                put("byte", json!(byte));
            }
            Op::CtlAdd { index } | Op::CtlRemove { index } => put("index", json!(index)),
            Op::CtlGetFree | Op::List => {}
        }
        Value::Object(o)
    }
}

fn put_backing(put: &mut impl FnMut(&str, Value), b: &Backing) {
    match b {
        Backing::File(n) => put("backing", json!(n)),
        Backing::Handle(h) => put("backing_handle", json!(h)),
        Backing::Null => put("backing", Value::Null),
    }
}

fn put_flags(put: &mut impl FnMut(&str, Value), flags: u32) {
    let mut names = Vec::new();
    let mut rest = flags;
    for (n, bit) in FLAG_NAMES {
        if flags & bit != 0 {
            names.push(n);
            rest &= !bit;
        }
    }
    put("flags", json!(names));
    if rest != 0 {
        put("flags_raw", json!(rest));
    }
}

/// The flag names of `flags`, sorted by name; bits without a name are left out.
pub fn flag_names(flags: u32) -> Vec<&'static str> {
    FLAG_NAMES
        .iter()
        .filter(|(_, b)| flags & b != 0)
        .map(|(n, _)| *n)
        .collect()
}

/// One step of a scenario.
pub type Step = crate::format::Step<Op>;

/// A parsed scenario.
pub type Scenario = crate::format::Scenario<Op>;

fn u64_field(o: &Object, line: usize, k: &str) -> Result<u64, ScenarioError> {
    field::int(o, line, k, "an unsigned 64-bit integer")
}

fn u64_or_zero(o: &Object, line: usize, k: &str) -> Result<u64, ScenarioError> {
    if o.contains_key(k) {
        u64_field(o, line, k)
    } else {
        Ok(0)
    }
}

fn len_field(o: &Object, line: usize) -> Result<u64, ScenarioError> {
    let len = u64_field(o, line, "len")?;
    if len > MAX_IO_LEN {
        return Err(ScenarioError::at(
            line,
            format!("field `len`: {len} is more than the format allows ({MAX_IO_LEN})"),
        ));
    }
    Ok(len)
}

fn mode_field(o: &Object, line: usize) -> Result<Mode, ScenarioError> {
    match field::str(o, line, "mode")? {
        "rw" => Ok(Mode::Rw),
        "ro" => Ok(Mode::Ro),
        other => Err(ScenarioError::at(
            line,
            format!("field `mode` must be \"rw\" or \"ro\", not {other:?}"),
        )),
    }
}

fn flags_field(o: &Object, line: usize) -> Result<u32, ScenarioError> {
    let mut flags = 0u32;
    match o.get("flags") {
        None => {}
        Some(Value::Array(a)) => {
            for f in a {
                let bit = f
                    .as_str()
                    .and_then(|s| FLAG_NAMES.iter().find(|(n, _)| *n == s))
                    .map(|(_, b)| *b)
                    .ok_or_else(|| {
                        ScenarioError::at(
                            line,
                            format!(
                                "field `flags`: unknown flag {f} (READ_ONLY, AUTOCLEAR, PARTSCAN or DIRECT_IO)"
                            ),
                        )
                    })?;
                flags |= bit;
            }
        }
        Some(v) => {
            return Err(ScenarioError::at(
                line,
                format!("field `flags` must be a list of flag names, not {v}"),
            ))
        }
    }
    if o.contains_key("flags_raw") {
        flags |= field::int::<u32>(o, line, "flags_raw", "an unsigned 32-bit integer")?;
    }
    Ok(flags)
}

fn backing_field(o: &Object, line: usize) -> Result<Backing, ScenarioError> {
    match (o.get("backing"), o.get("backing_handle")) {
        (Some(_), Some(_)) => Err(ScenarioError::at(
            line,
            "fields `backing` and `backing_handle`: give one, not both",
        )),
        (Some(Value::Null), None) => Ok(Backing::Null),
        (Some(_), None) => Ok(Backing::File(field::str(o, line, "backing")?.to_string())),
        (None, Some(_)) => Ok(Backing::Handle(
            field::str(o, line, "backing_handle")?.to_string(),
        )),
        (None, None) => Err(ScenarioError::at(
            line,
            "missing field `backing` (or `backing_handle`)",
        )),
    }
}

impl StepOp for Op {
    /// Parses one step. Unknown fields are rejected; `excl`, `flags`, `flags_raw`,
    /// `block_size`, `offset`, `sizelimit` and `file_name` are optional.
    ///
    /// ```
    /// use vfscale_conformance::loop_dev::{Op, Scenario};
    /// let s = Scenario::parse(r#"{"op":"open","dev":3,"handle":"h1","mode":"rw"}"#).unwrap();
    /// assert!(matches!(s.steps[0].op, Op::Open { dev: 3, excl: false, .. }));
    /// let e = Scenario::parse("# header\n{\"op\":\"read\",\"handle\":\"h1\",\"offset\":0}").unwrap_err();
    /// assert_eq!(e.to_string(), "line 2: missing field `len`");
    /// ```
    fn parse(o: &Object, line: usize) -> Result<Op, ScenarioError> {
        let op = field::str(o, line, "op")?;
        let fields: &[&str] = match op {
            "backing" => &["name", "size", "mode"],
            "truncate_backing" => &["name", "size"],
            "read_backing" => &["name", "offset", "len"],
            "open" => &["dev", "handle", "mode", "excl"],
            "close" | "clr_fd" | "get_status64" | "set_capacity" | "size" | "block_size" | "ro" | "fsync" => {
                &["handle"]
            }
            "configure" => &[
                "handle",
                "backing",
                "backing_handle",
                "block_size",
                "offset",
                "sizelimit",
                "flags",
                "flags_raw",
            ],
            "set_fd" | "change_fd" => &["handle", "backing", "backing_handle"],
            "set_status64" => &["handle", "offset", "sizelimit", "flags", "flags_raw", "file_name"],
            "set_block_size" => &["handle", "size"],
            "set_direct_io" => &["handle", "on"],
            "read" => &["handle", "offset", "len"],
            "write" => &["handle", "offset", "len", "byte"],
            "ctl_add" | "ctl_remove" => &["index"],
            "ctl_get_free" | "list" => &[],
            other => return Err(field::unknown_op(line, other)),
        };
        field::only(o, line, op, fields)?;
        let name = || field::str(o, line, "name").map(str::to_string);
        let handle = || field::str(o, line, "handle").map(str::to_string);
        Ok(match op {
            "backing" => {
                let size = u64_field(o, line, "size")?;
                if size > MAX_BACKING_SIZE {
                    return Err(ScenarioError::at(
                        line,
                        format!("field `size`: {size} is more than the format allows ({MAX_BACKING_SIZE})"),
                    ));
                }
                Op::Backing {
                    name: backing_name(o, line)?,
                    size,
                    mode: mode_field(o, line)?,
                }
            }
            "truncate_backing" => {
                let size = u64_field(o, line, "size")?;
                if size > MAX_BACKING_SIZE {
                    return Err(ScenarioError::at(
                        line,
                        format!("field `size`: {size} is more than the format allows ({MAX_BACKING_SIZE})"),
                    ));
                }
                Op::TruncateBacking { name: name()?, size }
            }
            "read_backing" => Op::ReadBacking {
                name: name()?,
                offset: u64_field(o, line, "offset")?,
                len: len_field(o, line)?,
            },
            "open" => Op::Open {
                dev: field::int(o, line, "dev", "a device index (a 64-bit integer)")?,
                handle: handle()?,
                mode: mode_field(o, line)?,
                excl: field::bool(o, line, "excl")?,
            },
            "close" => Op::Close { handle: handle()? },
            "clr_fd" => Op::ClrFd { handle: handle()? },
            "get_status64" => Op::GetStatus64 { handle: handle()? },
            "set_capacity" => Op::SetCapacity { handle: handle()? },
            "size" => Op::Size { handle: handle()? },
            "block_size" => Op::BlockSize { handle: handle()? },
            "ro" => Op::Ro { handle: handle()? },
            "fsync" => Op::Fsync { handle: handle()? },
            "configure" => Op::Configure {
                handle: handle()?,
                backing: backing_field(o, line)?,
                block_size: if o.contains_key("block_size") {
                    field::int(o, line, "block_size", "an unsigned 32-bit integer")?
                } else {
                    0
                },
                offset: u64_or_zero(o, line, "offset")?,
                sizelimit: u64_or_zero(o, line, "sizelimit")?,
                flags: flags_field(o, line)?,
            },
            "set_fd" => Op::SetFd {
                handle: handle()?,
                backing: backing_field(o, line)?,
            },
            "change_fd" => Op::ChangeFd {
                handle: handle()?,
                backing: backing_field(o, line)?,
            },
            "set_status64" => {
                let file_name = match o.get("file_name") {
                    None => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(v) => {
                        return Err(ScenarioError::at(
                            line,
                            format!("field `file_name` must be a string, not {v}"),
                        ))
                    }
                };
                if file_name.contains('\0') {
                    return Err(ScenarioError::at(line, "field `file_name` must not contain NUL"));
                }
                Op::SetStatus64 {
                    handle: handle()?,
                    offset: u64_or_zero(o, line, "offset")?,
                    sizelimit: u64_or_zero(o, line, "sizelimit")?,
                    flags: flags_field(o, line)?,
                    file_name,
                }
            }
            "set_block_size" => Op::SetBlockSize {
                handle: handle()?,
                size: u64_field(o, line, "size")?,
            },
            "set_direct_io" => Op::SetDirectIo {
                handle: handle()?,
                on: field::bool_required(o, line, "on")?,
            },
            "read" => Op::Read {
                handle: handle()?,
                offset: u64_field(o, line, "offset")?,
                len: len_field(o, line)?,
            },
            "write" => Op::Write {
                handle: handle()?,
                offset: u64_field(o, line, "offset")?,
                len: len_field(o, line)?,
                byte: field::int(o, line, "byte", "a byte value (0 to 255)")?,
            },
            "ctl_add" => Op::CtlAdd {
                index: field::int(o, line, "index", "a 64-bit integer")?,
            },
            "ctl_remove" => Op::CtlRemove {
                index: field::int(o, line, "index", "a 64-bit integer")?,
            },
            "ctl_get_free" => Op::CtlGetFree,
            "list" => Op::List,
            _ => unreachable!("checked above"),
        })
    }

    fn to_json(&self) -> Value {
        Op::to_json(self)
    }
}

/// A backing file's name is one path component of at most 63 bytes (so `lo_file_name`
/// and `/sys/block/loopN/loop/backing_file` both show it whole).
fn backing_name(o: &Object, line: usize) -> Result<String, ScenarioError> {
    let n = field::str(o, line, "name")?;
    if n.contains('/')
        || n == "."
        || n == ".."
        || n.contains('\0')
        || n.len() >= LO_NAME_SIZE
        || n.ends_with(" (deleted)")
    {
        return Err(ScenarioError::at(
            line,
            format!("field `name`: {n:?} is not a file name of at most 63 bytes"),
        ));
    }
    Ok(n.to_string())
}

/// The errors a step can report.
pub const ERRNO_NAMES: [(i32, &str); 17] = [
    (libc::EBUSY, "EBUSY"),
    (libc::ENXIO, "ENXIO"),
    (libc::EINVAL, "EINVAL"),
    (libc::EBADF, "EBADF"),
    (libc::EEXIST, "EEXIST"),
    (libc::ENODEV, "ENODEV"),
    (libc::ENOENT, "ENOENT"),
    (libc::EPERM, "EPERM"),
    (libc::EACCES, "EACCES"),
    (libc::EOVERFLOW, "EOVERFLOW"),
    (libc::EFBIG, "EFBIG"),
    (libc::EROFS, "EROFS"),
    (libc::ENOSPC, "ENOSPC"),
    (libc::EIO, "EIO"),
    (libc::ENOTTY, "ENOTTY"),
    (libc::EOPNOTSUPP, "EOPNOTSUPP"),
    (libc::ENOMEM, "ENOMEM"),
];

/// The name of an errno value as results spell it (`"errno 123"` for one without a name
/// in this table).
pub fn errno_name(e: i32) -> String {
    ERRNO_NAMES
        .iter()
        .find(|(v, _)| *v == e)
        .map(|(_, n)| n.to_string())
        .unwrap_or_else(|| format!("errno {e}"))
}

/// What `get_status64` reports.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Status {
    /// `lo_number`.
    pub number: u32,
    /// `lo_offset`.
    pub offset: u64,
    /// `lo_sizelimit`.
    pub sizelimit: u64,
    /// `lo_flags`.
    pub flags: u32,
    /// `lo_file_name`, up to its first NUL.
    pub file_name: String,
}

/// What a step resulted in.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// `"ok"`.
    Ok,
    /// An integer (an index, a size, a count).
    Int(i64),
    /// `true` or `false`.
    Bool(bool),
    /// An errno name.
    Err(String),
    /// `get_status64`.
    Status(Status),
    /// `read`, `read_backing`: the count and the FNV-1a hash of the bytes.
    Read {
        /// Bytes read.
        len: u64,
        /// Their 64-bit FNV-1a hash.
        fnv1a64: u64,
    },
    /// `list`: `[index, backing]`, sorted by index.
    List(Vec<(u32, Option<String>)>),
}

impl Outcome {
    /// The error outcome for an errno value.
    pub fn errno(e: i32) -> Outcome {
        Outcome::Err(errno_name(e))
    }

    /// The `read` outcome of `bytes`.
    pub fn read(bytes: &[u8]) -> Outcome {
        Outcome::Read {
            len: bytes.len() as u64,
            fnv1a64: fnv1a64(bytes),
        }
    }
}

impl StepOutcome for Outcome {
    /// The `result` value as the spec renders it.
    fn to_json(&self) -> Value {
        match self {
            Outcome::Ok => json!("ok"),
            Outcome::Int(i) => json!(i),
            Outcome::Bool(b) => json!(b),
            Outcome::Err(e) => json!(e),
            Outcome::Status(s) => {
                json!({"number":s.number,"offset":s.offset,"sizelimit":s.sizelimit,"flags":flag_names(s.flags),"file_name":s.file_name})
            }
            Outcome::Read { len, fnv1a64 } => json!({"len":len,"fnv1a64":format!("{fnv1a64:016x}")}),
            Outcome::List(l) => Value::Array(l.iter().map(|(i, b)| json!([i, b])).collect()),
        }
    }
}

/// The 64-bit FNV-1a hash.
///
/// ```
/// assert_eq!(vfscale_conformance::loop_dev::fnv1a64(b""), 0xcbf29ce484222325);
/// ```
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Byte `i` of a new backing file.
pub fn backing_byte(i: u64) -> u8 {
    (i % 251) as u8
}

/// The result line of one step.
pub type StepResult = crate::format::StepResult<Outcome>;

pub use crate::format::{render_results, StepOutcome};

/// The names every runner tracks the same way: backing files (created once, never
/// removed) and open handles. Every runner calls [`Tracker::check`] before a step, so
/// both reject the same scenarios with the same messages.
#[derive(Debug, Default)]
pub struct Tracker {
    backings: HashSet<String>,
    handles: HashSet<String>,
}

impl Tracker {
    /// A tracker for a fresh replay.
    pub fn new() -> Self {
        Self::default()
    }

    fn backing(&self, line: usize, name: &str) -> Result<(), ScenarioError> {
        if self.backings.contains(name) {
            Ok(())
        } else {
            Err(ScenarioError::at(line, format!("unknown backing file {name:?}")))
        }
    }

    fn handle(&self, line: usize, h: &str) -> Result<(), ScenarioError> {
        if self.handles.contains(h) {
            Ok(())
        } else {
            Err(ScenarioError::at(line, format!("unknown handle {h:?}")))
        }
    }

    fn backing_ref(&self, line: usize, b: &Backing) -> Result<(), ScenarioError> {
        match b {
            Backing::File(n) => self.backing(line, n),
            Backing::Handle(h) => self.handle(line, h),
            Backing::Null => Ok(()),
        }
    }

    /// Checks a step against the names known before it. `open` records its handle only
    /// through [`Tracker::opened`] (a failed open makes no handle), `close` forgets it.
    pub fn check(&mut self, step: &Step) -> Result<(), ScenarioError> {
        let line = step.line;
        match &step.op {
            Op::Backing { name, .. } => {
                if !self.backings.insert(name.clone()) {
                    return Err(ScenarioError::at(
                        line,
                        format!("backing file {name:?} already exists"),
                    ));
                }
            }
            Op::TruncateBacking { name, .. } | Op::ReadBacking { name, .. } => self.backing(line, name)?,
            Op::Open { handle, .. } => {
                if self.handles.contains(handle) {
                    return Err(ScenarioError::at(
                        line,
                        format!("handle {handle:?} is already open"),
                    ));
                }
            }
            Op::Close { handle } => {
                self.handle(line, handle)?;
                self.handles.remove(handle);
            }
            Op::Configure { handle, backing, .. }
            | Op::SetFd { handle, backing }
            | Op::ChangeFd { handle, backing } => {
                self.handle(line, handle)?;
                self.backing_ref(line, backing)?;
            }
            op => {
                if let Some(h) = op.handle() {
                    self.handle(line, h)?;
                }
            }
        }
        Ok(())
    }

    /// Records that `open` made `handle`.
    pub fn opened(&mut self, handle: &str) {
        self.handles.insert(handle.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_render_as_the_spec_says() {
        let line = |result| StepResult::new(4, result).to_json_line();
        assert_eq!(line(Outcome::Ok), r#"{"step":4,"result":"ok"}"#);
        assert_eq!(line(Outcome::Int(9)), r#"{"step":4,"result":9}"#);
        assert_eq!(
            line(Outcome::errno(libc::EBUSY)),
            r#"{"step":4,"result":"EBUSY"}"#
        );
        assert_eq!(line(Outcome::Bool(true)), r#"{"step":4,"result":true}"#);
        assert_eq!(
            line(Outcome::Status(Status {
                number: 3,
                offset: 0,
                sizelimit: 0,
                flags: LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR,
                file_name: "a".into()
            })),
            r#"{"step":4,"result":{"number":3,"offset":0,"sizelimit":0,"flags":["AUTOCLEAR","READ_ONLY"],"file_name":"a"}}"#
        );
        assert_eq!(
            line(Outcome::read(b"")),
            r#"{"step":4,"result":{"len":0,"fnv1a64":"cbf29ce484222325"}}"#
        );
        assert_eq!(
            line(Outcome::List(vec![(0, None), (3, Some("a".into()))])),
            r#"{"step":4,"result":[[0,null],[3,"a"]]}"#
        );
    }

    #[test]
    fn every_op_round_trips_through_json() {
        let text = r#"{"op":"backing","name":"a","size":65536,"mode":"rw"}
{"op":"truncate_backing","name":"a","size":32768}
{"op":"read_backing","name":"a","offset":0,"len":4096}
{"op":"open","dev":3,"handle":"h1","mode":"rw","excl":true}
{"op":"configure","handle":"h1","backing":"a","block_size":0,"offset":0,"sizelimit":0,"flags":["AUTOCLEAR","READ_ONLY"],"flags_raw":64}
{"op":"configure","handle":"h1","backing_handle":"h2","block_size":4096,"offset":512,"sizelimit":0,"flags":[]}
{"op":"set_fd","handle":"h1","backing":null}
{"op":"change_fd","handle":"h1","backing":"b"}
{"op":"clr_fd","handle":"h1"}
{"op":"set_status64","handle":"h1","offset":0,"sizelimit":0,"flags":["AUTOCLEAR"],"file_name":"a"}
{"op":"get_status64","handle":"h1"}
{"op":"set_capacity","handle":"h1"}
{"op":"set_block_size","handle":"h1","size":4096}
{"op":"set_direct_io","handle":"h1","on":true}
{"op":"size","handle":"h1"}
{"op":"block_size","handle":"h1"}
{"op":"ro","handle":"h1"}
{"op":"read","handle":"h1","offset":0,"len":4096}
{"op":"write","handle":"h1","offset":0,"len":512,"byte":171}
{"op":"fsync","handle":"h1"}
{"op":"close","handle":"h1"}
{"op":"ctl_add","index":-1}
{"op":"ctl_remove","index":9}
{"op":"ctl_get_free"}
{"op":"list"}
"#;
        let s = Scenario::parse(text).unwrap();
        assert_eq!(s.steps.len(), 25);
        assert_eq!(s.to_jsonl(), text);
    }

    #[test]
    fn bad_values_name_the_line_and_field() {
        let err = |t: &str| Scenario::parse(t).unwrap_err().to_string();
        assert_eq!(
            err(r#"{"op":"open","dev":3,"handle":"h1","mode":"rx"}"#),
            "line 1: field `mode` must be \"rw\" or \"ro\", not \"rx\""
        );
        assert_eq!(
            err(r#"{"op":"configure","handle":"h1","backing":"a","flags":["RO"]}"#),
            "line 1: field `flags`: unknown flag \"RO\" (READ_ONLY, AUTOCLEAR, PARTSCAN or DIRECT_IO)"
        );
        assert_eq!(
            err(r#"{"op":"write","handle":"h1","offset":0,"len":1,"byte":256}"#),
            "line 1: field `byte` must be a byte value (0 to 255), not 256"
        );
        assert_eq!(
            err(r#"{"op":"configure","handle":"h1"}"#),
            "line 1: missing field `backing` (or `backing_handle`)"
        );
        assert_eq!(
            err(r#"{"op":"list","x":1}"#),
            "line 1: unknown field `x` for op `list`"
        );
        assert_eq!(
            err(r#"{"op":"backing","name":"a/b","size":1,"mode":"rw"}"#),
            "line 1: field `name`: \"a/b\" is not a file name of at most 63 bytes"
        );
    }

    #[test]
    fn the_tracker_names_unknown_handles_and_backings() {
        let s = Scenario::parse(
            "{\"op\":\"open\",\"dev\":0,\"handle\":\"h\",\"mode\":\"rw\"}\n{\"op\":\"set_fd\",\"handle\":\"h\",\"backing\":\"zz\"}\n",
        )
        .unwrap();
        let mut t = Tracker::new();
        t.check(&s.steps[0]).unwrap();
        t.opened("h");
        assert_eq!(
            t.check(&s.steps[1]).unwrap_err().to_string(),
            "line 2: unknown backing file \"zz\""
        );
    }
}
