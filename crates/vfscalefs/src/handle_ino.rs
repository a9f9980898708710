//! Where a source's file handles carry the inode number, learned from handles the server
//! checked, so that a new inode's handle can be checked against its `stat` without a
//! second `stat`.
//!
//! A lookup of a name the table does not have takes the name's `stat`, then its handle
//! (`name_to_handle_at`). Were the name replaced in between, the handle would name
//! another file; a second `stat` that agrees with the first rules that out. The handles
//! of the filesystems that make lasting ones (tmpfs: generation, then the inode number
//! in two 32-bit words; ext4, xfs: the 32-bit inode number, then the generation; btrfs:
//! the 64-bit object id first) carry the inode number at a fixed place, so the handle
//! itself can say whether it is the stat's file.
//!
//! The place is not assumed: the places where the root's handle holds the root's inode
//! number are the candidates, and each lookup checked with the second `stat` (of an inode
//! number other than the one checked before) keeps only the candidates that hold its
//! number too. After [`CONFIRMATIONS`] such lookups the widest, first candidate left is
//! used; if none is left, every lookup keeps its second `stat`. A handle whose field
//! disagrees takes the second `stat` as before, and if that shows the handle was the
//! stat's file after all, the layout was wrong: the next candidate that fits every
//! checked handle replaces it, or none is used. Handles of another
//! type than the root's (an NFS export's root handle is shorter than its files') are not
//! learned from; after [`CONFIRMATIONS`] of them, learning stops.
//! A wrong layout would at worst keep a handle of another file with the same inode
//! number, the case a second `stat` does not catch either: every open by handle is
//! checked against the inode's `(st_dev, st_ino)`, so another file is never served.

use std::sync::atomic::{AtomicU32, Ordering};

use parking_lot::Mutex;

use crate::sys::FileHandle;

/// Lookups checked with a second `stat`, of distinct inode numbers, before the layout is
/// trusted.
pub const CONFIRMATIONS: u32 = 16;

/// `known`: not learned yet.
const LEARNING: u32 = u32::MAX;
/// `known`: the handles carry no inode number this can find.
const NONE: u32 = u32::MAX - 1;

/// A field of a handle: byte offset and width (4 or 8), packed as `offset << 4 | width`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Field {
    offset: usize,
    width: usize,
}

impl Field {
    fn pack(self) -> u32 {
        ((self.offset as u32) << 4) | self.width as u32
    }

    fn unpack(v: u32) -> Field {
        Field {
            offset: (v >> 4) as usize,
            width: (v & 0xf) as usize,
        }
    }

    /// Whether `h`'s bytes at this field hold `ino` (native byte order, as the kernel
    /// writes them). A 4-byte field cannot hold an inode number past 32 bits.
    fn holds(self, h: &[u8], ino: u64) -> bool {
        let Some(b) = h.get(self.offset..self.offset + self.width) else {
            return false;
        };
        match self.width {
            8 => u64::from_ne_bytes(b.try_into().expect("8 bytes")) == ino,
            _ => ino <= u32::MAX as u64 && u32::from_ne_bytes(b.try_into().expect("4 bytes")) as u64 == ino,
        }
    }
}

/// What is being learned.
#[derive(Debug)]
struct Learn {
    /// Fields that held the inode number of every handle checked so far, widest first.
    candidates: Vec<Field>,
    confirmed: u32,
    /// Handles of another type than the root's seen while learning.
    other_types: u32,
    last_ino: u64,
}

/// Where the source's handles carry the inode number (see the module's first page).
#[derive(Debug)]
pub struct HandleIno {
    /// The field, packed, once learned; or [`LEARNING`] or [`NONE`].
    known: AtomicU32,
    /// The root's handle type, the layout's (another type is another layout).
    ty: i32,
    learn: Mutex<Learn>,
}

impl HandleIno {
    /// Starts from the root's handle and inode number.
    pub fn new(root: &FileHandle, root_ino: u64) -> HandleIno {
        let b = root.bytes();
        let mut candidates = Vec::new();
        for width in [8, 4] {
            for offset in (0..b.len()).step_by(4) {
                let f = Field { offset, width };
                if f.holds(b, root_ino) {
                    candidates.push(f);
                }
            }
        }
        let known = if candidates.is_empty() { NONE } else { LEARNING };
        HandleIno {
            known: AtomicU32::new(known),
            ty: root.ty(),
            learn: Mutex::new(Learn {
                candidates,
                confirmed: 0,
                other_types: 0,
                last_ino: root_ino,
            }),
        }
    }

    /// Whether `h` is the handle of inode number `ino`: `Some` once the layout is known,
    /// `None` while it is learned or where it cannot be.
    pub fn carries(&self, h: &FileHandle, ino: u64) -> Option<bool> {
        let k = self.known.load(Ordering::Acquire);
        if k == LEARNING || k == NONE || h.ty() != self.ty {
            return None;
        }
        Some(Field::unpack(k).holds(h.bytes(), ino))
    }

    /// `h` was checked, by a second `stat`, to be the handle of inode number `ino`.
    pub fn confirm(&self, h: &FileHandle, ino: u64) {
        match self.known.load(Ordering::Acquire) {
            NONE => return,
            LEARNING => {}
            k => {
                // The layout said no to a handle that was the stat's file: it is wrong, and
                // the next candidate that still fits every checked handle takes its place.
                if h.ty() == self.ty && !Field::unpack(k).holds(h.bytes(), ino) {
                    let mut l = self.learn.lock();
                    l.candidates.retain(|f| f.holds(h.bytes(), ino));
                    let next = l.candidates.first().map_or(NONE, |f| f.pack());
                    self.known.store(next, Ordering::Release);
                }
                return;
            }
        }
        let mut l = self.learn.lock();
        if self.known.load(Ordering::Acquire) != LEARNING || ino == l.last_ino {
            return;
        }
        if h.ty() != self.ty {
            l.other_types += 1;
            if l.other_types >= CONFIRMATIONS {
                self.known.store(NONE, Ordering::Release);
            }
            return;
        }
        l.candidates.retain(|f| f.holds(h.bytes(), ino));
        l.last_ino = ino;
        l.confirmed += 1;
        if l.candidates.is_empty() {
            self.known.store(NONE, Ordering::Release);
        } else if l.confirmed >= CONFIRMATIONS {
            self.known.store(l.candidates[0].pack(), Ordering::Release);
        }
    }

    /// Whether the layout is learned and used.
    pub fn learned(&self) -> bool {
        let k = self.known.load(Ordering::Acquire);
        k != LEARNING && k != NONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::fd::AsFd;

    fn tmpfs_like(gen: u32, ino: u64) -> FileHandle {
        let mut b = Vec::new();
        b.extend_from_slice(&gen.to_ne_bytes());
        b.extend_from_slice(&(ino as u32).to_ne_bytes());
        b.extend_from_slice(&((ino >> 32) as u32).to_ne_bytes());
        FileHandle::new(1, &b)
    }

    #[test]
    fn learns_a_layout_only_after_confirmations() {
        let h = HandleIno::new(&tmpfs_like(7, 2), 2);
        assert_eq!(h.carries(&tmpfs_like(1, 5), 5), None, "learning");
        for i in 0..CONFIRMATIONS as u64 {
            h.confirm(&tmpfs_like(9, 100 + i), 100 + i);
        }
        assert!(h.learned());
        assert_eq!(h.carries(&tmpfs_like(3, 1 << 40), 1 << 40), Some(true));
        assert_eq!(h.carries(&tmpfs_like(3, 77), 78), Some(false));
    }

    #[test]
    fn a_handle_without_the_inode_number_is_never_trusted() {
        // The root's number appears by chance (its generation); the next handle rules it out.
        let h = HandleIno::new(&FileHandle::new(1, &[2, 0, 0, 0, 9, 9, 9, 9]), 2);
        h.confirm(&FileHandle::new(1, &[3, 3, 3, 3, 9, 9, 9, 9]), 5);
        assert!(!h.learned());
        assert_eq!(h.carries(&FileHandle::new(1, &[5, 0, 0, 0]), 5), None);
    }

    #[test]
    fn a_layout_proved_wrong_is_replaced_and_other_types_stop_learning() {
        // Learned on handles whose second word was always 0 (generation 0 everywhere).
        let ext4 = |ino: u32, gen: u32| {
            let mut b = ino.to_ne_bytes().to_vec();
            b.extend_from_slice(&gen.to_ne_bytes());
            FileHandle::new(1, &b)
        };
        let h = HandleIno::new(&ext4(2, 0), 2);
        for i in 0..CONFIRMATIONS {
            h.confirm(&ext4(100 + i, 0), (100 + i) as u64);
        }
        assert!(h.learned());
        // A file with a generation: the 8-byte field says no, the second stat says yes.
        assert_eq!(h.carries(&ext4(500, 7), 500), Some(false));
        h.confirm(&ext4(500, 7), 500);
        assert!(h.learned(), "the 4-byte field replaces the 8-byte one");
        assert_eq!(h.carries(&ext4(501, 9), 501), Some(true));
        // A handle no candidate fits: nothing is used any more.
        h.confirm(&ext4(7, 7), 600);
        assert!(!h.learned());
        assert_eq!(h.carries(&ext4(601, 0), 601), None);

        let nfs = HandleIno::new(&FileHandle::new(3, &[2, 0, 0, 0]), 2);
        for i in 0..CONFIRMATIONS as u64 {
            nfs.confirm(&FileHandle::new(7, &[9; 28]), 100 + i);
        }
        assert_eq!(nfs.carries(&FileHandle::new(3, &[5, 0, 0, 0]), 5), None);
        assert!(
            nfs.learn.lock().candidates.len() == 1,
            "nothing learned from other types"
        );
        assert_eq!(nfs.known.load(Ordering::Acquire), NONE);
    }

    /// On the filesystem the tests run on (tmpfs under /dev/shm), the layout is learned
    /// from real handles and agrees with every file's inode number.
    #[test]
    fn learns_tmpfs_handles() {
        let d = std::path::PathBuf::from(format!("/dev/shm/vfscalefs-handle-ino-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let root = crate::sys::open_root(&d).unwrap();
        let Ok((rh, _)) = crate::sys::handle_of(root.as_fd()) else {
            eprintln!("SKIP: no file handles on /dev/shm");
            return;
        };
        let rst = crate::sys::stat_fd(root.as_fd()).unwrap();
        let h = HandleIno::new(&rh, rst.st_ino);
        let mut files = Vec::new();
        for i in 0..(CONFIRMATIONS + 8) {
            let name = CString::new(format!("f{i}")).unwrap();
            std::fs::write(d.join(format!("f{i}")), b"").unwrap();
            let st = crate::sys::stat_at(root.as_fd(), &name).unwrap();
            let (fh, _) = crate::sys::handle_at(root.as_fd(), &name).unwrap();
            files.push((fh.clone(), st.st_ino));
            h.confirm(&fh, st.st_ino);
        }
        assert!(h.learned(), "tmpfs handles carry the inode number");
        for (fh, ino) in &files {
            assert_eq!(h.carries(fh, *ino), Some(true));
            assert_eq!(h.carries(fh, ino + 1), Some(false));
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
