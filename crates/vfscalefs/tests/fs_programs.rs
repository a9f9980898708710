//! Real programs on a vfscalefs mount: sqlite3 with eight writers (rollback journal and
//! WAL), flock(1) (an interrupted waiter, a second mountpoint), stress-ng's lock
//! stressors with verification.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{cannot_mount, missing_tool, run, say, sqlite, Mounted};

/// 8 processes × 200 inserts, each its own transaction, with a busy timeout.
fn sqlite_writers(dir: &std::path::Path, mode: &str) {
    const PROCS: usize = 8;
    const ROWS: usize = 200;
    let db = dir.join(format!("test-{mode}.db"));
    let first = sqlite(
        &db,
        &format!("PRAGMA journal_mode={mode}; CREATE TABLE t(p INTEGER, i INTEGER, pad TEXT);"),
    );
    assert_eq!(first.to_lowercase(), mode.to_lowercase(), "journal mode");
    let start = Instant::now();
    let children: Vec<_> = (0..PROCS).map(|p| common::sqlite_writer(&db, p, ROWS)).collect();
    common::sqlite_writers_done(children, mode);
    let took = start.elapsed();
    assert_eq!(sqlite(&db, "SELECT count(*) FROM t;"), (PROCS * ROWS).to_string());
    assert_eq!(
        sqlite(&db, "SELECT count(DISTINCT p*1000+i) FROM t;"),
        (PROCS * ROWS).to_string()
    );
    assert_eq!(sqlite(&db, "PRAGMA integrity_check;"), "ok");
    say(&format!(
        "sqlite3 {mode}: {PROCS} processes x {ROWS} inserts, count(*) = {}, integrity_check ok, in {:.1} s",
        PROCS * ROWS,
        took.as_secs_f64()
    ));
}

#[test]
fn sqlite_eight_writers_rollback_journal_and_wal() {
    if let Some(why) = cannot_mount().or_else(|| missing_tool("sqlite3")) {
        return say(&format!("SKIP: {why}"));
    }
    let m = Mounted::start(1, "").expect("mount");
    sqlite_writers(&m.mounts[0], "delete");
    sqlite_writers(&m.mounts[0], "wal");
}

#[test]
fn flock_tool_interrupt_and_second_mountpoint() {
    if let Some(why) = cannot_mount()
        .or_else(|| missing_tool("flock"))
        .or_else(|| missing_tool("timeout"))
    {
        return say(&format!("SKIP: {why}"));
    }
    let m = Mounted::start(2, "").expect("mount");
    let f0 = m.mounts[0].join("lock");
    let f1 = m.mounts[1].join("lock");
    std::fs::write(&f0, b"").unwrap();
    // The holder: flock(1) keeps the lock (-o: not the sleep it runs) for 5 s.
    let mut holder = Command::new("flock")
        .arg("-o")
        .arg(&f0)
        .arg("sleep")
        .arg("5")
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while run(Command::new("flock").arg("-n").arg(&f0).arg("true"))
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "the holder never got its lock");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A waiter interrupted by SIGINT after 2 s comes back within 3 s.
    let took = common::flock_interrupted(&f0, 2);
    // Through the second mountpoint, a non-blocking flock conflicts.
    let out = run(Command::new("flock").arg("-n").arg(&f1).arg("true"));
    assert_eq!(
        out.status.code(),
        Some(1),
        "flock -n through the second mountpoint must fail"
    );
    // Once the holder is gone, it succeeds (RELEASE is sent after close, so retry).
    let _ = holder.kill();
    let _ = holder.wait();
    let deadline = Instant::now() + Duration::from_secs(3);
    while !run(Command::new("flock").arg("-n").arg(&f1).arg("true"))
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "the lock outlived its holder");
        std::thread::sleep(Duration::from_millis(20));
    }
    say(&format!(
        "flock(1): interrupted waiter back in {:.2} s; flock -n through the second mountpoint refused while held, granted after",
        took.as_secs_f64()
    ));
}

/// stress-ng's lock stressors with `--verify` through the mount.
///
/// The `--lockf`, `--lockofd` and `--fcntl` stressors fork a child that waits for locks
/// its parent holds, while the parent, at the timeout, kills the child and waits for
/// it. Over io_uring that needs the server's sweep for lost interrupts (see fuser's
/// `uring/sweep.rs`): Linux 6.18 sends no `INTERRUPT` for a request signalled between
/// its assignment to a ring entry and its copy-out, and without the sweep the child
/// would wait for ever for its parent's lock, and the parent for the child.
#[test]
fn stress_ng_lock_stressors_verify() {
    if let Some(why) = cannot_mount().or_else(|| missing_tool("stress-ng")) {
        return say(&format!("SKIP: {why}"));
    }
    let m = Mounted::start(1, "").expect("mount");
    let stressors: &[&str] = &["--flock", "2", "--lockf", "2", "--lockofd", "2", "--fcntl", "2"];
    let out = run(Command::new("stress-ng")
        .args(stressors)
        .args(["--verify", "--timeout", "5s", "--metrics-brief", "--temp-path"])
        .arg(&m.mounts[0]));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "stress-ng failed ({}):\n{text}", out.status);
    assert!(
        !text.contains("fail:") && !text.contains("FAILED"),
        "stress-ng reported failures:\n{text}"
    );
    let summary: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.contains("flock")
                || l.contains("lockf")
                || l.contains("lockofd")
                || l.contains("fcntl")
                || l.contains("passed")
        })
        .collect();
    say(&format!("stress-ng on vfscalefs:\n{}", summary.join("\n")));
}
