//! The command and the filesystem as a user sees them: exit statuses and messages,
//! unmounting on signals and by umount, files created as their caller, the raised
//! descriptor limit, and a round of ordinary operations through two mountpoints.

mod common;

use std::os::unix::fs::MetadataExt as _;
use std::process::Command;
use std::time::Duration;

use common::{cannot_mount, missing_tool, run, say, Mounted, TempDir};

#[test]
fn unusable_source_or_mountpoint_is_a_clear_error() {
    let d = TempDir::new("bad");
    let mp = d.0.join("mp");
    std::fs::create_dir(&mp).unwrap();
    let bin = env!("CARGO_BIN_EXE_vfscalefs");
    let out = run(Command::new(bin).arg(d.0.join("missing")).arg(&mp));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("source") && err.contains("missing"), "{err}");
    let file = d.0.join("file");
    std::fs::write(&file, b"").unwrap();
    let out = run(Command::new(bin).arg(&file).arg(&mp));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("source"));
    let out = run(Command::new(bin).arg(&d.0).arg(d.0.join("nomp")));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mountpoint") && err.contains("nomp"), "{err}");
    let out = run(Command::new(bin).arg(&d.0).arg(&mp).arg("-o").arg("bogus"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bogus"));
}

#[test]
fn signals_and_umount_end_it_cleanly() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    for sig in [
        nix::sys::signal::Signal::SIGINT,
        nix::sys::signal::Signal::SIGTERM,
    ] {
        let mut m = Mounted::start(2, "").expect("mount");
        let st = m
            .stop_with(sig, Duration::from_secs(5))
            .expect("exits on the signal");
        assert!(st.success(), "{sig}: exit status {st}");
        assert!(!m.any_mounted(), "{sig}: a mountpoint was left mounted");
    }
    // umount of every mountpoint: it exits 0 by itself after the last one.
    let mut m = Mounted::start(2, "").expect("mount");
    assert!(run(Command::new("umount").arg(&m.mounts[0])).status.success());
    assert!(
        m.wait_exit(Duration::from_millis(300)).is_none(),
        "exited with a mountpoint left"
    );
    std::fs::write(m.mounts[1].join("still"), b"served").unwrap();
    assert!(run(Command::new("umount").arg(&m.mounts[1])).status.success());
    let st = m
        .wait_exit(Duration::from_secs(5))
        .expect("exits after the last umount");
    assert!(st.success(), "exit status {st}");
}

#[test]
fn operations_through_two_mountpoints() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    let m = Mounted::start(2, "").expect("mount");
    let (a, b, s) = (&m.mounts[0], &m.mounts[1], &m.source);
    // The descriptor limit was raised.
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", m.pid())).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let soft: u64 = line.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert!(soft > 1024, "RLIMIT_NOFILE not raised: {line}");
    // Create, write, read back through the other mountpoint and on the source.
    std::fs::create_dir(a.join("d")).unwrap();
    std::fs::write(a.join("d/f"), b"hello").unwrap();
    assert_eq!(std::fs::read(b.join("d/f")).unwrap(), b"hello");
    assert_eq!(std::fs::read(s.join("d/f")).unwrap(), b"hello");
    // st_ino is the source's, the same through both mountpoints; hard links share it.
    let ino = std::fs::metadata(s.join("d/f")).unwrap().ino();
    assert_eq!(std::fs::metadata(a.join("d/f")).unwrap().ino(), ino);
    assert_eq!(std::fs::metadata(b.join("d/f")).unwrap().ino(), ino);
    std::fs::hard_link(a.join("d/f"), a.join("d/g")).unwrap();
    assert_eq!(std::fs::metadata(b.join("d/g")).unwrap().ino(), ino);
    assert_eq!(std::fs::metadata(b.join("d/g")).unwrap().nlink(), 2);
    // Rename, symlink, readdir, truncate, unlink, rmdir.
    std::fs::rename(a.join("d/g"), a.join("g2")).unwrap();
    std::os::unix::fs::symlink("d/f", a.join("l")).unwrap();
    assert_eq!(std::fs::read_link(b.join("l")).unwrap().to_str(), Some("d/f"));
    assert_eq!(std::fs::read(b.join("l")).unwrap(), b"hello");
    let mut names: Vec<String> = std::fs::read_dir(b)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["d", "g2", "l"]);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(a.join("g2"))
        .unwrap();
    f.set_len(2).unwrap();
    drop(f);
    assert_eq!(std::fs::read(s.join("d/f")).unwrap(), b"he");
    std::fs::remove_file(a.join("g2")).unwrap();
    std::fs::remove_file(a.join("l")).unwrap();
    std::fs::remove_file(a.join("d/f")).unwrap();
    std::fs::remove_dir(a.join("d")).unwrap();
    assert_eq!(std::fs::read_dir(s).unwrap().count(), 0);
    // Many directory entries (several readdir replies).
    for i in 0..500 {
        std::fs::write(a.join(format!("file-with-a-longish-name-{i:04}")), b"").unwrap();
    }
    assert_eq!(std::fs::read_dir(b).unwrap().count(), 500);
}

#[test]
fn files_are_created_as_their_caller() {
    if let Some(why) = cannot_mount().or_else(|| missing_tool("setpriv")) {
        return say(&format!("SKIP: {why}"));
    }
    let m = Mounted::start(1, "allow_other").expect("mount");
    let a = &m.mounts[0];
    let as_user = |args: &[&str]| {
        let out = run(Command::new("setpriv")
            .args(["--reuid=1", "--regid=1", "--clear-groups", "--"])
            .args(args));
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    as_user(&["touch", a.join("file").to_str().unwrap()]);
    as_user(&["mkdir", a.join("dir").to_str().unwrap()]);
    as_user(&["ln", "-s", "file", a.join("link").to_str().unwrap()]);
    as_user(&["mkfifo", a.join("fifo").to_str().unwrap()]);
    for n in ["file", "dir", "link", "fifo"] {
        let md = std::fs::symlink_metadata(m.source.join(n)).unwrap();
        assert_eq!((md.uid(), md.gid()), (1, 1), "{n} on the source");
    }
    // And a user cannot write where the source would not let it.
    std::fs::create_dir(a.join("private")).unwrap();
    std::fs::set_permissions(
        a.join("private"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = run(Command::new("setpriv")
        .args(["--reuid=1", "--regid=1", "--clear-groups", "--", "touch"])
        .arg(a.join("private/x")));
    assert!(!out.status.success(), "a user wrote into root's 0755 directory");
}
