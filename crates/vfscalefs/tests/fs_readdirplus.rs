//! READDIRPLUS: a directory of a few thousand entries listed and stat'ed through the
//! mount matches the source, every entry handed out is a lookup the kernel later forgets
//! (the server's inode table drains to the root), with inodes kept by handle and by
//! descriptor; and, by descriptor, with no descriptor to spare beyond the reserve the
//! listing still goes on, one looked-up entry per reply.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{cannot_mount, run, say, Mounted, TempDir};

const FILES: usize = 3000;

/// A source directory with files of many sizes and modes, directories, symlinks, a FIFO.
fn populate(dir: &Path) {
    std::fs::create_dir(dir).unwrap();
    for i in 0..FILES {
        let p = dir.join(format!("entry-with-a-longish-name-{i:05}"));
        std::fs::write(&p, vec![b'x'; i % 300]).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600 + (i % 0o100) as u32)).unwrap();
    }
    for i in 0..20 {
        std::fs::create_dir(dir.join(format!("sub{i}"))).unwrap();
        std::os::unix::fs::symlink(format!("sub{i}"), dir.join(format!("link{i}"))).unwrap();
    }
    nix::unistd::mkfifo(&dir.join("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o640)).unwrap();
}

/// name → (size, mode, nlink, d_ino == st_ino) from a readdir + lstat walk.
fn walk(dir: &Path) -> BTreeMap<String, (u64, u32, u64, bool)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let md = std::fs::symlink_metadata(e.path()).unwrap();
            let name = e.file_name().into_string().unwrap();
            let ino_ok = std::os::unix::fs::DirEntryExt::ino(&e) == md.ino();
            (name, (md.size(), md.mode(), md.nlink(), ino_ok))
        })
        .collect()
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn ls(dir: &Path) -> String {
    let out = run(Command::new("ls")
        .args(["-ln", "--time-style=full-iso"])
        .arg(dir)
        .env("LC_ALL", "C"));
    assert!(
        out.status.success(),
        "ls: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The server's `(inodes, lookups)` after a `SIGUSR1`.
fn stats(m: &Mounted, file: &Path) -> (u64, u64) {
    let s = m.stats(file);
    (s.inodes, s.lookups)
}

/// Makes the kernel forget every unused inode and waits for the table to drain.
fn drained(m: &Mounted, file: &Path) -> (u64, u64) {
    let s = m.drained(file);
    (s.inodes, s.lookups)
}

/// One mount at a time: a drain's `drop_caches` makes every kernel forget what it can, so
/// one test's drain would take the entries another just listed.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn check_mount(opts: &str, expect_instantiated: bool) {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let t = TempDir::new("rdplus-stats");
    let sf = t.0.join("stats");
    let mut m = Mounted::start_env(1, opts, &[("VFSCALEFS_STATS", &sf)]).expect("mount");
    let (src, mnt) = (m.source.join("d"), m.mounts[0].join("d"));
    populate(&src);
    assert_eq!(stats(&m, &sf), (1, 0), "a fresh server holds the root only");

    // Names only (one getdents walk, first read at offset 0: READDIRPLUS).
    assert_eq!(names(&mnt), names(&src));
    let (inodes, lookups) = stats(&m, &sf);
    if expect_instantiated {
        // READDIRPLUS_AUTO: the first reply carries attributes; the rest are plain
        // READDIR unless lookups follow (the walk below).
        assert!(
            inodes > 50 && lookups + 1 == inodes,
            "READDIRPLUS did not hand out entries: inodes={inodes} lookups={lookups}"
        );
    } else {
        // Only the directory itself was looked up: no descriptor was spared.
        assert!(
            inodes <= 2,
            "entries were looked up without budget: inodes={inodes}"
        );
    }

    // A readdir + lstat walk and ls -l: names, sizes, modes, link counts as on the source.
    let (a, b) = (walk(&mnt), walk(&src));
    assert_eq!(a.len(), FILES + 41);
    assert_eq!(a, b);
    assert_eq!(ls(&mnt), ls(&src));

    // Every lookup handed out comes back: the table drains to the root.
    assert_eq!(drained(&m, &sf), (1, 0), "lookup counts do not balance");
    // And again after a second walk, now with the entries' attributes cached.
    assert_eq!(walk(&mnt), b);
    assert_eq!(
        drained(&m, &sf),
        (1, 0),
        "lookup counts do not balance (second walk)"
    );

    let st = m
        .stop_with(nix::sys::signal::Signal::SIGTERM, Duration::from_secs(10))
        .expect("exits");
    assert!(st.success(), "exit status {st}");
    assert!(!m.any_mounted());
}

#[test]
fn readdirplus_matches_the_source_and_balances_lookups() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    check_mount("", true);
    // Inodes kept by descriptor, as on a source without file handles.
    check_mount("inode_handles=never", true);
}

/// Inodes kept by descriptor (by handle a lookup keeps none, and the budget is not
/// asked).
#[test]
fn without_descriptors_to_spare_the_listing_goes_on() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    check_mount("inode_handles=never,fd_reserve=4294967295", false);
}
