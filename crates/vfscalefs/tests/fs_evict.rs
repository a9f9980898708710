//! An inode the kernel has forgotten gives its source descriptor up at once: after
//! files and directories are removed (through the mount or on the source) and the
//! kernel forgets them, or after a connection ends with files still open and looked up,
//! the server holds no descriptor under its source but the root's, and none of a deleted
//! file (whose space would otherwise stay allocated), however idle it is afterwards.
//!
//! `vfscale-icache` frees an evicted inode's memory a grace period later, in per-thread
//! batches of 32 retired inodes; the server releases the inode's descriptor and lock
//! context at eviction (`evict_inode`), not when the memory goes. Before it did, the
//! last partial batch of each dispatch thread kept its inodes' descriptors open in an
//! idle server for good. The counts below are not multiples of 32, so at least one
//! thread's batch is partial whatever the spread.

mod common;

use std::io::Write as _;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{cannot_mount, say, Mounted, Stats, TempDir};

/// Files (and as many directories) removed in the first test.
const FILES: usize = 40;

/// Each file's size: its space stays allocated while a descriptor is open.
const SIZE: usize = 1 << 20;

const EMPTY: Stats = Stats {
    inodes: 1,
    lookups: 0,
    handles: 0,
};

/// Waits up to 10 s for the server's table to hold only the root and no open file.
fn emptied(m: &Mounted, file: &Path) -> Stats {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = m.stats(file);
        if s == EMPTY || Instant::now() > deadline {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The server's descriptors under the source once `ok` accepts them, or as they are after
/// 10 s. A handle leaves the table (and the stats) at `RELEASE`, but a request that was
/// still using it holds it until that request's handler returns, which may be a little
/// after its reply: the descriptor goes then.
fn source_fds_when(m: &Mounted, ok: impl Fn(&[(u32, String)]) -> bool) -> Vec<(u32, String)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let fds = m.source_fds();
        if ok(&fds) || Instant::now() > deadline {
            return fds;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A server on `n` mountpoints with its stats file (in the returned directory), settled:
/// every connection answered (INIT, the dispatch threads) and the table back to the
/// root, before descriptors are counted.
fn start(n: usize) -> (TempDir, PathBuf, Mounted) {
    let t = TempDir::new("evict-stats");
    let sf = t.0.join("stats");
    let m = Mounted::start_env(n, "", &[("VFSCALEFS_STATS", &sf)]).expect("mount");
    for mnt in &m.mounts {
        assert_eq!(std::fs::read_dir(mnt).unwrap().count(), 0);
    }
    // (RELEASEDIR comes in the background.)
    assert_eq!(emptied(&m, &sf), EMPTY, "a fresh server holds the root only");
    (t, sf, m)
}

#[test]
fn forgotten_inodes_close_their_source_descriptors() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    let (_t, sf, m) = start(1);
    let (src, mnt) = (&m.source, &m.mounts[0]);
    let base = source_fds_when(&m, |f| f.len() == 1);
    assert_eq!(base.len(), 1, "the source root only: {base:?}");
    let nfds = m.fds().len();

    let data = vec![0x5a_u8; SIZE];
    for i in 0..FILES {
        std::fs::write(mnt.join(format!("f{i}")), &data).unwrap();
        std::fs::create_dir(mnt.join(format!("d{i}"))).unwrap();
    }
    // (At most: a drop_caches elsewhere on the machine may make the kernel forget some.)
    let s = m.stats(&sf);
    assert!(s.inodes <= 1 + 2 * FILES as u64, "{s:?}");
    // Half removed through the mount (the kernel forgets them at once), half on the
    // source (the kernel forgets them at drop_caches).
    for i in 0..FILES {
        let dir = if i % 2 == 0 { mnt } else { src };
        std::fs::remove_file(dir.join(format!("f{i}"))).unwrap();
        std::fs::remove_dir(dir.join(format!("d{i}"))).unwrap();
    }
    assert_eq!(m.drained(&sf), EMPTY, "the kernel forgot every inode");

    let left = source_fds_when(&m, |f| f == base.as_slice());
    assert_eq!(
        left, base,
        "forgotten inodes kept their source descriptors (the deleted files' space stays allocated)"
    );
    assert_eq!(
        m.fds().len(),
        nfds,
        "the server's descriptor count is back where it was: {:?}",
        m.fds()
    );
}

#[test]
fn a_connection_that_ends_gives_up_its_files() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    let (_t, sf, m) = start(2);
    let (src, m0, m1) = (&m.source, &m.mounts[0], &m.mounts[1]);
    let base = source_fds_when(&m, |f| f.len() == 1);

    // Through mountpoint 0: three files open (one with a POSIX lock and one with a
    // flock lock: lock contexts) and three only looked up, all unlinked on the source.
    let data = vec![0xa5_u8; SIZE];
    let mut open = Vec::new();
    for i in 0..3 {
        let mut f = std::fs::OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(m0.join(format!("open{i}")))
            .unwrap();
        f.write_all(&data).unwrap();
        open.push(f);
        std::fs::write(m0.join(format!("looked{i}")), &data).unwrap();
    }
    // SAFETY: a zeroed flock is valid; the fields that matter are set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_len = 10;
    // SAFETY: fcntl on an open descriptor with a valid flock.
    let r = unsafe { libc::fcntl(open[0].as_raw_fd(), libc::F_SETLK, &fl) };
    assert_eq!(r, 0, "F_SETLK: {}", std::io::Error::last_os_error());
    // SAFETY: flock on an open descriptor.
    let r = unsafe { libc::flock(open[1].as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(r, 0, "flock: {}", std::io::Error::last_os_error());
    for i in 0..3 {
        std::fs::remove_file(src.join(format!("open{i}"))).unwrap();
        std::fs::remove_file(src.join(format!("looked{i}"))).unwrap();
    }
    // (The other test's drop_caches may make the kernel forget a looked-up one, and
    // the written ones' RELEASE comes in the background.)
    let s = m.stats(&sf);
    assert!(s.inodes >= 4 && s.handles >= 3, "{s:?}");

    // Detached, then its last user goes: the kernel aborts the connection (neither
    // RELEASE nor FORGET need come), and the server ends it with its handles and
    // lookups.
    nix::mount::umount2(m0.as_path(), nix::mount::MntFlags::MNT_DETACH).unwrap();
    drop(open);
    assert_eq!(
        emptied(&m, &sf),
        EMPTY,
        "the ended connection's files and lookups are gone"
    );
    assert_eq!(
        source_fds_when(&m, |f| f == base.as_slice()),
        base,
        "the ended connection's inodes kept their source descriptors"
    );

    // The other mountpoint is still served.
    std::fs::write(m1.join("still"), b"served").unwrap();
    assert_eq!(std::fs::read(src.join("still")).unwrap(), b"served");
}
