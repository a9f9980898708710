//! A ring entry: the memory one request and its reply travel through, and who may touch
//! it when.
//!
//! Layout of one anonymous mapping: `[prefix page | payload]`. The prefix page starts
//! with the kernel's 288-byte `fuse_uring_req_header` (`iov[0]`); the payload (`iov[1]`)
//! starts at the next page. A request is rebuilt in `/dev/fuse` order by writing its
//! `fuse_in_header` and first argument at the end of the prefix, right before the
//! payload, so the request is one contiguous slice without copying the payload.
//! The mapping is lazily backed: an entry that never carried a large request costs
//! address space, not memory.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;

use crate::uring::abi;
use crate::uring::abi::ReqHeader;
use crate::uring::reply::Phase;
use crate::uring::reply::Slot;

/// An anonymous mapping, unmapped on drop.
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave NULL"))?;
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping `new` made, unmapped only here.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// One ring entry of a queue.
///
/// Who touches the memory, by [`Phase`]: the kernel while `Fetching`; the queue thread
/// while `Dispatching` (a reply then is kept in the slot) and when it commits, or the
/// worker it handed a `Parked` entry to, which makes it `Dispatching` in turn; the one
/// reply that moves a `Parked` entry to `Replied`, until it hands the entry over.
#[derive(Debug)]
pub(crate) struct RingEntry {
    /// Index in its queue's entry table; the SQE's `user_data`.
    pub(crate) index: u32,
    /// Keeps the memory mapped as long as the entry lives.
    _mem: Mapping,
    prefix: usize,
    payload_size: usize,
    /// `iov[0]` = header, `iov[1]` = payload; read by the kernel at registration.
    iov: [libc::iovec; 2],
    /// The phase, and a reply made during dispatch.
    pub(crate) slot: Mutex<Slot>,
    /// `unique` of the request in the entry (0: none yet).
    pub(crate) unique: AtomicU64,
    /// `pid` of that request's caller (0: not visible to the server).
    pub(crate) pid: AtomicU32,
}

// SAFETY: the raw pointers refer to the entry's own mapping, whose accesses follow the
// phase protocol documented on `RingEntry` (one party at a time, handed over under the
// slot's lock or through the queue's commit list, which order the accesses).
unsafe impl Send for RingEntry {}
// SAFETY: as above.
unsafe impl Sync for RingEntry {}

impl RingEntry {
    /// A new entry of `payload_size` bytes of payload.
    pub(crate) fn new(index: u32, payload_size: usize) -> io::Result<RingEntry> {
        let prefix = page_size::get().max(4096);
        let mem = Mapping::new(prefix + payload_size)?;
        let base = mem.ptr.as_ptr();
        let iov = [
            libc::iovec {
                iov_base: base.cast(),
                iov_len: size_of::<ReqHeader>(),
            },
            libc::iovec {
                // SAFETY: `prefix` is within the mapping of `prefix + payload_size` bytes.
                iov_base: unsafe { base.add(prefix) }.cast(),
                iov_len: payload_size,
            },
        ];
        Ok(RingEntry {
            index,
            _mem: mem,
            prefix,
            payload_size,
            iov,
            slot: Mutex::new(Slot {
                phase: Phase::Fetching,
                pending: Vec::new(),
                offloaded: false,
            }),
            unique: AtomicU64::new(0),
            pid: AtomicU32::new(0),
        })
    }

    /// The two iovecs to register.
    pub(crate) fn iov(&self) -> *const libc::iovec {
        self.iov.as_ptr()
    }

    fn base(&self) -> *mut u8 {
        self.iov[0].iov_base.cast()
    }

    fn header(&self) -> *mut ReqHeader {
        self.base().cast()
    }

    /// The request the kernel put in the entry, as `/dev/fuse` would have delivered it,
    /// or why it cannot be read.
    ///
    /// # Safety
    /// Only the queue thread, after the completion that brought the request and before
    /// the entry is replied to, may call it; the slice must be dropped before the reply.
    pub(crate) unsafe fn request(&self) -> Result<(&[u8], u64), String> {
        // SAFETY: the caller has the entry (see above); the header is in the mapping.
        let h = unsafe { &*self.header() };
        let ent = h.ent_in_out;
        let payload = ent.payload_sz as usize;
        if payload > self.payload_size {
            return Err(format!(
                "payload of {payload} bytes in a {} byte buffer",
                self.payload_size
            ));
        }
        let in_len = size_of::<crate::ll::fuse_abi::fuse_in_header>();
        let len = u32::from_ne_bytes([h.in_out[0], h.in_out[1], h.in_out[2], h.in_out[3]]) as usize;
        let arg0 = len
            .checked_sub(in_len + payload)
            .filter(|a| *a <= abi::OP_IN_OUT_SZ)
            .ok_or_else(|| format!("request length {len} with a payload of {payload}"))?;
        if arg0 % 8 != 0 {
            // Every per-opcode struct is a multiple of 8 bytes; the parser needs alignment.
            return Err(format!("first argument of {arg0} bytes"));
        }
        let start = self.prefix - in_len - arg0;
        // SAFETY: `start..prefix` lies in the prefix page past the header (288 + 40 + 128
        // bytes fit in one page); the sources are the header's own arrays.
        unsafe {
            let dst = self.base().add(start);
            std::ptr::copy_nonoverlapping(h.in_out.as_ptr(), dst, in_len);
            std::ptr::copy_nonoverlapping(h.op_in.as_ptr(), dst.add(in_len), arg0);
            Ok((std::slice::from_raw_parts(dst, len), ent.commit_id))
        }
    }

    /// Writes a reply (`fuse_out_header` then its payload, as gathered slices) into the
    /// entry. A reply too large for the payload becomes an `EIO` reply.
    ///
    /// # Safety
    /// Only the party that moved the entry to [`Phase::Replied`] may call it, once,
    /// before the commit; no request slice of the entry may be alive.
    pub(crate) unsafe fn write_reply(&self, data: &[std::io::IoSlice<'_>]) {
        let out_len = size_of::<crate::ll::fuse_abi::fuse_out_header>();
        let total: usize = data.iter().map(|d| d.len()).sum();
        let h = self.header();
        // SAFETY: the caller owns the entry; the header and payload are in the mapping
        // and `copied` stays within `out_len` and `payload_size` below. `copy` (memmove)
        // because a reply may carry bytes of the request it answers.
        unsafe {
            let in_out = (*h).in_out.as_mut_ptr();
            let payload = self.base().add(self.prefix);
            if total < out_len || total - out_len > self.payload_size {
                log::error!(
                    "io_uring reply of {total} bytes does not fit an entry of {}: answering EIO",
                    self.payload_size
                );
                let unique = gather_prefix(data, out_len);
                let hdr = crate::ll::fuse_abi::fuse_out_header {
                    len: out_len as u32,
                    error: -libc::EIO,
                    unique: u64::from_ne_bytes(unique[8..16].try_into().unwrap_or([0; 8])),
                };
                std::ptr::copy_nonoverlapping(
                    (&hdr as *const crate::ll::fuse_abi::fuse_out_header).cast::<u8>(),
                    in_out,
                    out_len,
                );
                (*h).ent_in_out.payload_sz = 0;
                return;
            }
            let mut copied = 0usize;
            for d in data {
                let mut src = d.as_ptr();
                let mut n = d.len();
                if copied < out_len {
                    let k = n.min(out_len - copied);
                    std::ptr::copy(src, in_out.add(copied), k);
                    copied += k;
                    src = src.add(k);
                    n -= k;
                }
                if n > 0 {
                    std::ptr::copy(src, payload.add(copied - out_len), n);
                    copied += n;
                }
            }
            (*h).ent_in_out.payload_sz = (total - out_len) as u32;
        }
    }

    /// Writes the reply kept in `slot` (made during dispatch) into the entry, keeping the
    /// slot's buffer for the next one.
    ///
    /// # Safety
    /// As for [`RingEntry::write_reply`]; `slot` is this entry's, locked.
    pub(crate) unsafe fn write_pending(&self, slot: &mut Slot) {
        let pending = std::mem::take(&mut slot.pending);
        // SAFETY: as the caller promises.
        unsafe { self.write_reply(&[std::io::IoSlice::new(&pending)]) };
        slot.pending = pending;
    }

    /// `pid` of the caller of the request the kernel put in the entry.
    ///
    /// # Safety
    /// As for [`RingEntry::request`].
    pub(crate) unsafe fn header_pid(&self) -> u32 {
        // SAFETY: the caller has the entry; the header is in the mapping.
        let h = unsafe { &*self.header() };
        u32::from_ne_bytes(h.in_out[32..36].try_into().unwrap_or([0; 4]))
    }

    /// `opcode` of the request the kernel put in the entry.
    ///
    /// # Safety
    /// As for [`RingEntry::request`].
    pub(crate) unsafe fn header_opcode(&self) -> u32 {
        // SAFETY: the caller has the entry; the header is in the mapping.
        let h = unsafe { &*self.header() };
        u32::from_ne_bytes(h.in_out[4..8].try_into().unwrap_or([0; 4]))
    }

    /// `unique` of the request the kernel put in the entry.
    ///
    /// # Safety
    /// As for [`RingEntry::request`].
    pub(crate) unsafe fn header_unique(&self) -> u64 {
        // SAFETY: the caller has the entry; the header is in the mapping.
        let h = unsafe { &*self.header() };
        u64::from_ne_bytes(h.in_out[8..16].try_into().unwrap_or([0; 8]))
    }
}

/// The first `n` bytes of gathered slices (zero-filled if shorter).
fn gather_prefix(data: &[std::io::IoSlice<'_>], n: usize) -> Vec<u8> {
    let mut v: Vec<u8> = data
        .iter()
        .flat_map(|d| d.iter().copied())
        .take(n)
        .collect();
    v.resize(n, 0);
    v
}
