//! The FUSE-over-io_uring structures of `include/uapi/linux/fuse.h` (ABI 7.42, Linux
//! 6.14+) and the one SQE this transport submits.

use std::mem::size_of;
use std::os::fd::RawFd;

use io_uring::opcode;
use io_uring::squeue::Entry128;
use io_uring::types;

/// `FUSE_URING_IN_OUT_HEADER_SZ`: room for `fuse_in_header` / `fuse_out_header`.
pub(crate) const IN_OUT_HEADER_SZ: usize = 128;
/// `FUSE_URING_OP_IN_OUT_SZ`: room for the per-opcode struct (`in_args[0]`).
pub(crate) const OP_IN_OUT_SZ: usize = 128;

/// `enum fuse_uring_cmd`: register an entry's buffers and fetch a request into it.
pub(crate) const CMD_REGISTER: u32 = 1;
/// `enum fuse_uring_cmd`: commit the reply in an entry and fetch the next request.
pub(crate) const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `struct fuse_uring_ent_in_out`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EntInOut {
    pub(crate) flags: u64,
    /// Set by the kernel with a request; echoed in the commit's `fuse_uring_cmd_req`.
    pub(crate) commit_id: u64,
    /// Bytes of the payload buffer in use, in either direction.
    pub(crate) payload_sz: u32,
    pub(crate) padding: u32,
    pub(crate) reserved: u64,
}

/// `struct fuse_uring_req_header`: `iov[0]` of a registration.
#[repr(C)]
#[derive(Debug)]
pub(crate) struct ReqHeader {
    /// `fuse_in_header` with a request, `fuse_out_header` with a reply.
    pub(crate) in_out: [u8; IN_OUT_HEADER_SZ],
    /// The request's first argument when it has a size (the per-opcode struct).
    pub(crate) op_in: [u8; OP_IN_OUT_SZ],
    pub(crate) ent_in_out: EntInOut,
}

/// `struct fuse_uring_cmd_req`, at the start of the SQE128's 80-byte command area.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct CmdReq {
    flags: u64,
    commit_id: u64,
    qid: u16,
    padding: [u8; 6],
}

// The kernel's layout (checked against fs/fuse/dev_uring.c and the uapi header).
const _: () = assert!(size_of::<EntInOut>() == 32);
const _: () = assert!(size_of::<ReqHeader>() == 288);
const _: () = assert!(size_of::<CmdReq>() == 24);
const _: () = assert!(size_of::<Entry128>() == 128);

/// Offset of `len` in `struct io_uring_sqe`.
const SQE_LEN_OFFSET: usize = 24;

/// An `IORING_OP_URING_CMD` on `/dev/fuse` descriptor `fd`: `cmd` is [`CMD_REGISTER`] or
/// [`CMD_COMMIT_AND_FETCH`], `iov` the entry's two iovecs (header, payload), which must stay
/// valid until the command completes (the kernel reads them when it issues a
/// registration).
pub(crate) fn uring_cmd(
    fd: RawFd,
    cmd: u32,
    qid: u16,
    commit_id: u64,
    iov: *const libc::iovec,
    user_data: u64,
) -> Entry128 {
    let req = CmdReq {
        flags: 0,
        commit_id,
        qid,
        padding: [0; 6],
    };
    let mut area = [0u8; 80];
    area[0..8].copy_from_slice(&req.flags.to_ne_bytes());
    area[8..16].copy_from_slice(&req.commit_id.to_ne_bytes());
    area[16..18].copy_from_slice(&req.qid.to_ne_bytes());
    let sqe = opcode::UringCmd80::new(types::Fd(fd), cmd)
        .cmd(area)
        .addr(Some(iov as u64))
        .build()
        .user_data(user_data);
    // The builder has no setter for `len`, which FUSE wants as the iovec count (2).
    // SAFETY: `Entry128` is `#[repr(C)]` over the kernel's 128-byte SQE (plain integers
    // and unions of them, no padding, asserted above), so its bytes may be viewed and
    // changed as an array and any byte pattern is a valid value.
    let mut bytes: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    bytes[SQE_LEN_OFFSET..SQE_LEN_OFFSET + 4].copy_from_slice(&2u32.to_ne_bytes());
    // SAFETY: as above, the same bytes back into the same type.
    unsafe { std::mem::transmute::<[u8; 128], Entry128>(bytes) }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn cmd_sqe_layout() {
        let iov = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 2];
        let sqe = uring_cmd(7, CMD_COMMIT_AND_FETCH, 3, 0x1122, iov.as_ptr(), 9);
        // SAFETY: see `uring_cmd`.
        let b: [u8; 128] = unsafe { std::mem::transmute(sqe) };
        assert_eq!(b[0], opcode::UringCmd80::CODE);
        assert_eq!(i32::from_ne_bytes(b[4..8].try_into().unwrap()), 7, "fd");
        assert_eq!(
            u64::from_ne_bytes(b[16..24].try_into().unwrap()),
            iov.as_ptr() as u64
        );
        assert_eq!(u32::from_ne_bytes(b[24..28].try_into().unwrap()), 2, "len");
        assert_eq!(
            u32::from_ne_bytes(b[8..12].try_into().unwrap()),
            2,
            "cmd_op"
        );
        assert_eq!(
            u64::from_ne_bytes(b[32..40].try_into().unwrap()),
            9,
            "user_data"
        );
        // The command area starts at byte 48.
        assert_eq!(u64::from_ne_bytes(b[56..64].try_into().unwrap()), 0x1122);
        assert_eq!(u16::from_ne_bytes(b[64..66].try_into().unwrap()), 3);
    }
}
