//! Locks that agree with the processes on the source (`-o source_locks=mirror`, the
//! default): real processes on both sides of the mount, a tmpfs source. Each side's
//! process is a small lock agent (python3) that takes commands on stdin and answers one
//! line each, with the time it finished.

mod common;

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::fd::AsRawFd as _;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use common::{cannot_mount, missing_tool, say, Mounted};

const AGENT: &str = r#"
import fcntl, os, signal, struct, sys, time
def intr(*a):
    raise InterruptedError()
signal.signal(signal.SIGUSR1, intr)
fd = os.open(sys.argv[1], os.O_RDWR)
FMT = 'hhxxxxqqixxxx'
def out(*w):
    print(*w, repr(time.time()), flush=True)
for line in sys.stdin:
    w = line.split()
    try:
        if w[0] == 'lk':
            b = struct.pack(FMT, int(w[2]), 0, int(w[3]), int(w[4]), 0)
            t, _, s, l, p = struct.unpack(FMT, fcntl.fcntl(fd, int(w[1]), b))
            out('ok', t, s, l, p)
        elif w[0] == 'flock':
            fcntl.flock(fd, int(w[1]))
            out('ok')
        elif w[0] == 'close':
            os.close(fd)
            out('ok')
        elif w[0] == 'pid':
            out('ok', os.getpid())
    except InterruptedError:
        out('err', 4)
    except OSError as e:
        out('err', e.errno)
"#;

/// A process that locks one file on command.
struct Agent {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Agent {
    fn start(file: &Path) -> Agent {
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(AGENT)
            .arg(file)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn python3");
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        let mut a = Agent { child, input, output };
        // Running, its signal handler set and its file open: a signal may come now.
        a.pid();
        a
    }

    fn send(&mut self, cmd: &str) {
        writeln!(self.input, "{cmd}").unwrap();
        self.input.flush().unwrap();
    }

    /// The answer to the last command, within `within`, as words (the time last).
    fn answer(&mut self, within: Duration) -> Option<Vec<String>> {
        if self.output.buffer().is_empty() {
            let mut p = libc::pollfd {
                fd: self.output.get_ref().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll on one valid pollfd.
            let n = unsafe { libc::poll(&mut p, 1, within.as_millis() as i32) };
            if n <= 0 {
                return None;
            }
        }
        let mut line = String::new();
        self.output.read_line(&mut line).unwrap();
        Some(line.split_whitespace().map(str::to_owned).collect())
    }

    fn run(&mut self, cmd: &str) -> Vec<String> {
        self.send(cmd);
        self.answer(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{cmd:?}: no answer within 10 s"))
    }

    /// `ok` or the errno.
    fn status(&mut self, cmd: &str) -> Result<(), i32> {
        let w = self.run(cmd);
        match w[0].as_str() {
            "ok" => Ok(()),
            _ => Err(w[1].parse().unwrap()),
        }
    }

    fn pid(&mut self) -> i32 {
        self.run("pid")[1].parse().unwrap()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn time_of(w: &[String]) -> f64 {
    w.last().unwrap().parse().unwrap()
}

/// `waiter`'s request is granted within 50 ms of the unlock at `unlocked`.
fn prompt(waiter: &mut Agent, unlocked: f64, what: &str) {
    let w = waiter
        .answer(Duration::from_secs(5))
        .unwrap_or_else(|| panic!("{what}: never granted"));
    assert_eq!(w[0], "ok", "{what}: {w:?}");
    let late = time_of(&w) - unlocked;
    assert!(
        late < 0.05,
        "{what}: granted {:.1} ms after the unlock",
        late * 1e3
    );
}

const SETLK: i32 = libc::F_SETLK;
const SETLKW: i32 = libc::F_SETLKW;
const GETLK: i32 = libc::F_GETLK;
const OFD_SETLK: i32 = libc::F_OFD_SETLK;
const OFD_GETLK: i32 = libc::F_OFD_GETLK;
const RD: i32 = libc::F_RDLCK;
const WR: i32 = libc::F_WRLCK;
const UN: i32 = libc::F_UNLCK;
const EAGAIN: i32 = libc::EAGAIN;

fn lk(cmd: i32, ty: i32, start: i64, len: i64) -> String {
    format!("lk {cmd} {ty} {start} {len}")
}

fn skip() -> Option<String> {
    cannot_mount().or_else(|| missing_tool("python3"))
}

/// A mount and one file, with an agent on the source and one through the mount.
fn setup(opts: &str) -> (Mounted, Agent, Agent) {
    let m = Mounted::start(1, opts).expect("mount");
    std::fs::write(m.source.join("f"), vec![0u8; 4096]).unwrap();
    let host = Agent::start(&m.source.join("f"));
    let client = Agent::start(&m.mounts[0].join("f"));
    (m, host, client)
}

/// Agent `h` and the other one.
fn pair(agents: &mut [Agent; 2], h: usize) -> (&mut Agent, &mut Agent) {
    let (a, b) = agents.split_at_mut(1);
    if h == 0 {
        (&mut a[0], &mut b[0])
    } else {
        (&mut b[0], &mut a[0])
    }
}

/// POSIX, OFD and flock locks, in both directions: a holder on one side makes a
/// conflicting request on the other fail with EAGAIN, a compatible one is granted.
#[test]
fn conflicts_in_both_directions() {
    if let Some(why) = skip() {
        return say(&format!("SKIP: {why}"));
    }
    let (_m, host, client) = setup("");
    let mut agents = [host, client];
    const DIRS: [(usize, &str); 2] = [(0, "host holds, client asks"), (1, "client holds, host asks")];
    for (name, set) in [("POSIX", SETLK), ("OFD", OFD_SETLK)] {
        for (h, dir) in DIRS {
            let (holder, other) = pair(&mut agents, h);
            holder.status(&lk(set, WR, 0, 10)).unwrap();
            assert_eq!(
                other.status(&lk(set, WR, 5, 1)),
                Err(EAGAIN),
                "{name}, {dir}: write over write"
            );
            assert_eq!(
                other.status(&lk(set, RD, 0, 1)),
                Err(EAGAIN),
                "{name}, {dir}: read over write"
            );
            other
                .status(&lk(set, WR, 10, 10))
                .unwrap_or_else(|e| panic!("{name}, {dir}: beside: {e}"));
            other.status(&lk(set, UN, 10, 10)).unwrap();
            // Down to a read lock: reads are granted, writes still not.
            holder.status(&lk(set, RD, 0, 10)).unwrap();
            other
                .status(&lk(set, RD, 0, 20))
                .unwrap_or_else(|e| panic!("{name}, {dir}: read by read: {e}"));
            other.status(&lk(set, UN, 0, 20)).unwrap();
            assert_eq!(
                other.status(&lk(set, WR, 9, 1)),
                Err(EAGAIN),
                "{name}, {dir}: write over read"
            );
            holder.status(&lk(set, UN, 0, 10)).unwrap();
            other
                .status(&lk(set, WR, 0, 10))
                .unwrap_or_else(|e| panic!("{name}, {dir}: after unlock: {e}"));
            other.status(&lk(set, UN, 0, 10)).unwrap();
        }
    }
    let (ex, sh, un, nb) = (libc::LOCK_EX, libc::LOCK_SH, libc::LOCK_UN, libc::LOCK_NB);
    for (h, dir) in DIRS {
        let (holder, other) = pair(&mut agents, h);
        holder.status(&format!("flock {ex}")).unwrap();
        assert_eq!(
            other.status(&format!("flock {}", sh | nb)),
            Err(EAGAIN),
            "flock, {dir}"
        );
        holder.status(&format!("flock {sh}")).unwrap();
        other
            .status(&format!("flock {}", sh | nb))
            .unwrap_or_else(|e| panic!("flock, {dir}: shared: {e}"));
        other.status(&format!("flock {un}")).unwrap();
        assert_eq!(
            other.status(&format!("flock {}", ex | nb)),
            Err(EAGAIN),
            "flock, {dir}: ex over sh"
        );
        holder.status(&format!("flock {un}")).unwrap();
        other
            .status(&format!("flock {}", ex | nb))
            .unwrap_or_else(|e| panic!("flock, {dir}: after unlock: {e}"));
        other.status(&format!("flock {un}")).unwrap();
    }
}

/// Waits end within 50 ms of the unlock that ends them, both ways, and an interrupted wait
/// through the mount returns EINTR.
#[test]
fn waits_end_promptly_and_can_be_interrupted() {
    if let Some(why) = skip() {
        return say(&format!("SKIP: {why}"));
    }
    let (_m, mut host, mut client) = setup("");
    let short = Duration::from_millis(300);
    // A client's F_SETLKW behind a host holder.
    host.status(&lk(SETLK, WR, 0, 10)).unwrap();
    client.send(&lk(SETLKW, WR, 5, 10));
    assert!(
        client.answer(short).is_none(),
        "the client's wait ended while the host held"
    );
    let t = time_of(&host.run(&lk(SETLK, UN, 0, 10)));
    prompt(&mut client, t, "client behind host");
    client.status(&lk(SETLK, UN, 0, 0)).unwrap();
    // A read wait (it waits on a description of its own), behind a host writer, beside
    // the client's own write lock, over part of which it reaches.
    client.status(&lk(SETLK, WR, 0, 5)).unwrap();
    host.status(&lk(SETLK, WR, 20, 10)).unwrap();
    client.send(&lk(SETLKW, RD, 3, 30));
    assert!(
        client.answer(short).is_none(),
        "the client's read wait ended while the host wrote"
    );
    let t = time_of(&host.run(&lk(SETLK, UN, 20, 10)));
    prompt(&mut client, t, "client read behind host");
    assert_eq!(
        host.status(&lk(SETLK, WR, 4, 1)),
        Err(EAGAIN),
        "the client's read lock on the source"
    );
    host.status(&lk(SETLK, RD, 0, 40))
        .expect_err("the client's write lock at 0-2 on the source");
    host.status(&lk(SETLK, RD, 3, 40))
        .expect("reads beside the client's reads");
    host.status(&lk(SETLK, UN, 0, 0)).unwrap();
    // A host F_SETLKW behind the client's lock, ended by an unlock.
    host.send(&lk(SETLKW, RD, 0, 100));
    assert!(
        host.answer(short).is_none(),
        "the host's wait ended while the client held"
    );
    let t = time_of(&client.run(&lk(SETLK, UN, 0, 100)));
    prompt(&mut host, t, "host behind client (unlock)");
    host.status(&lk(SETLK, UN, 0, 100)).unwrap();
    // ... and by a close.
    client.status(&lk(SETLK, WR, 0, 0)).unwrap();
    host.send(&lk(SETLKW, WR, 0, 1));
    assert!(
        host.answer(short).is_none(),
        "the host's wait ended while the client held"
    );
    let t = time_of(&client.run("close"));
    prompt(&mut host, t, "host behind client (close)");
    // An interrupted wait through the mount: EINTR, and nothing left behind.
    let mut client = Agent::start(&_m.mounts[0].join("f"));
    client.send(&lk(SETLKW, WR, 0, 1));
    assert!(
        client.answer(short).is_none(),
        "the client's wait ended while the host held"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(client.child.id() as i32),
        nix::sys::signal::Signal::SIGUSR1,
    )
    .unwrap();
    let w = client
        .answer(Duration::from_secs(2))
        .expect("the interrupted wait did not end");
    assert_eq!(w[..2], ["err".to_string(), "4".to_string()], "interrupted: {w:?}");
    let t = time_of(&host.run(&lk(SETLK, UN, 0, 1)));
    // A flock wait through the mount behind the host.
    host.status(&format!("flock {}", libc::LOCK_EX)).unwrap();
    client.send(&format!("flock {}", libc::LOCK_SH));
    assert!(
        client.answer(short).is_none(),
        "the client's flock wait ended while the host held"
    );
    let t2 = time_of(&host.run(&format!("flock {}", libc::LOCK_UN)));
    prompt(&mut client, t2.max(t), "client flock behind host");
}

/// F_GETLK through the mount reports a holder on the source: a POSIX holder with its
/// pid, an OFD holder with pid 0 (-1 through F_OFD_GETLK); on the source, the client's
/// lock shows as the server's OFD lock (pid -1).
#[test]
fn getlk_sees_across() {
    if let Some(why) = skip() {
        return say(&format!("SKIP: {why}"));
    }
    let (_m, mut host, mut client) = setup("");
    let pid = host.pid();
    host.status(&lk(SETLK, WR, 5, 10)).unwrap();
    let w = client.run(&lk(GETLK, RD, 0, 100));
    assert_eq!(
        w[..5],
        ["ok", "1", "5", "10", &pid.to_string()].map(String::from),
        "POSIX holder"
    );
    host.status(&lk(SETLK, UN, 0, 0)).unwrap();
    host.status(&lk(OFD_SETLK, RD, 20, 0)).unwrap();
    let w = client.run(&lk(GETLK, WR, 0, 100));
    assert_eq!(
        w[..5],
        ["ok", "0", "20", "0", "0"].map(String::from),
        "OFD holder via F_GETLK"
    );
    let w = client.run(&lk(OFD_GETLK, WR, 0, 100));
    assert_eq!(
        w[..5],
        ["ok", "0", "20", "0", "-1"].map(String::from),
        "OFD holder via F_OFD_GETLK"
    );
    host.status(&lk(OFD_SETLK, UN, 0, 0)).unwrap();
    let w = client.run(&lk(GETLK, WR, 0, 100));
    assert_eq!(w[1], UN.to_string(), "nothing held: {w:?}");
    // The other way.
    client.status(&lk(SETLK, RD, 0, 50)).unwrap();
    let w = host.run(&lk(GETLK, WR, 10, 1));
    assert_eq!(
        w[..5],
        ["ok", "0", "0", "50", "-1"].map(String::from),
        "the client's lock on the source"
    );
}

/// sqlite3, 4 writers on the source and 4 through the mount, rollback journal, then WAL:
/// every row is there and the database is sound.
#[test]
fn sqlite_writers_on_both_sides() {
    if let Some(why) = skip().or_else(|| missing_tool("sqlite3")) {
        return say(&format!("SKIP: {why}"));
    }
    const ROWS: usize = 200;
    let m = Mounted::start(1, "").expect("mount");
    let sql = |db: &Path, sql: &str| {
        let out = common::run(Command::new("sqlite3").arg(db).arg(sql));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // WAL maps its index (-shm) on both sides: coherent only with kernel passthrough
    // (Linux 6.9 and later, as root).
    let modes: &[&str] = if passthrough_kernel() {
        &["delete", "wal"]
    } else {
        say("sqlite3 wal on both sides: SKIP (no FUSE passthrough before Linux 6.9)");
        &["delete"]
    };
    for &mode in modes {
        let name = format!("t-{mode}.db");
        let src = m.source.join(&name);
        sql(
            &src,
            &format!("PRAGMA journal_mode={mode}; CREATE TABLE t(p INTEGER, i INTEGER, pad TEXT);"),
        );
        let start = Instant::now();
        let children: Vec<_> = (0..8)
            .map(|p| {
                // Even writers on the source, odd ones through the mount.
                let dir = if p % 2 == 0 { &m.source } else { &m.mounts[0] };
                common::sqlite_writer(&dir.join(&name), p, ROWS)
            })
            .collect();
        common::sqlite_writers_done(children, mode);
        assert_eq!(
            sql(&src, "SELECT count(*) FROM t;"),
            (8 * ROWS).to_string(),
            "{mode}"
        );
        assert_eq!(
            sql(&src, "SELECT count(DISTINCT p*1000+i) FROM t;"),
            (8 * ROWS).to_string(),
            "{mode}"
        );
        assert_eq!(sql(&src, "PRAGMA integrity_check;"), "ok", "{mode}");
        say(&format!(
            "sqlite3 {mode}: 4 writers on the source and 4 through the mount, {} rows, integrity_check ok, in {:.1} s",
            8 * ROWS,
            start.elapsed().as_secs_f64()
        ));
    }
}

/// Whether the kernel has FUSE passthrough (6.9 and later).
fn passthrough_kernel() -> bool {
    let rel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = rel.split(['.', '-']).map(|x| x.parse::<u32>().unwrap_or(0));
    let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
    (major, minor) >= (6, 9)
}

/// After SIGKILL of the server a host process gets every lock at once: nothing is left
/// held on the source.
#[test]
fn nothing_held_after_the_server_dies() {
    if let Some(why) = skip() {
        return say(&format!("SKIP: {why}"));
    }
    let (mut m, mut host, mut client) = setup("");
    client.status(&lk(SETLK, WR, 0, 10)).unwrap();
    client.status(&lk(OFD_SETLK, RD, 100, 10)).unwrap();
    client.status(&format!("flock {}", libc::LOCK_EX)).unwrap();
    assert_eq!(
        host.status(&lk(SETLK, WR, 0, 0)),
        Err(EAGAIN),
        "held before the kill"
    );
    m.stop_with(nix::sys::signal::Signal::SIGKILL, Duration::from_secs(5))
        .expect("the server did not die");
    host.status(&lk(SETLK, WR, 0, 0))
        .expect("a record lock is still held");
    host.status(&format!("flock {}", libc::LOCK_EX | libc::LOCK_NB))
        .expect("a flock lock is still held");
}

/// With `-o source_locks=off` the mount's locks are the server's alone, as before.
#[test]
fn source_locks_off_keeps_them_apart() {
    if let Some(why) = skip() {
        return say(&format!("SKIP: {why}"));
    }
    let (_m, mut host, mut client) = setup("source_locks=off");
    host.status(&lk(SETLK, WR, 0, 10)).unwrap();
    client
        .status(&lk(SETLK, WR, 0, 10))
        .expect("off: the host's lock is not seen");
    let w = client.run(&lk(GETLK, WR, 0, 10));
    assert_eq!(w[1], UN.to_string(), "off: F_GETLK sees no host holder: {w:?}");
    host.status(&format!("flock {}", libc::LOCK_EX)).unwrap();
    client
        .status(&format!("flock {}", libc::LOCK_EX | libc::LOCK_NB))
        .expect("off: the host's flock lock is not seen");
}

/// The server's descriptions of `file` opened for source locks (`O_NONBLOCK`, which the
/// server's other opens of a regular file do not use).
fn lock_descriptions(m: &Mounted, file: &Path) -> usize {
    let name = file.to_string_lossy().into_owned();
    m.source_fds()
        .into_iter()
        .filter(|(fd, t)| {
            *t == name
                && std::fs::read_to_string(format!("/proc/{}/fdinfo/{fd}", m.pid())).is_ok_and(|i| {
                    i.lines()
                        .find_map(|l| l.strip_prefix("flags:"))
                        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
                        .is_some_and(|f| f & libc::O_NONBLOCK as u32 != 0)
                })
        })
        .count()
}

/// A description held for locks on the source stays while the client's file is open
/// (a lock and unlock cycle opens nothing) and closes with it once it holds nothing: a
/// file locked once keeps no descriptor (and, deleted, no space) while the client
/// caches it.
#[test]
fn lock_descriptions_close_with_the_file() {
    if let Some(why) = skip() {
        return say(&format!("SKIP: {why}"));
    }
    let (m, _host, mut client) = setup("");
    let f = m.source.join("f");
    for _ in 0..3 {
        client.status(&lk(SETLK, WR, 0, 10)).unwrap();
        client.status(&format!("flock {}", libc::LOCK_SH)).unwrap();
        assert_eq!(
            lock_descriptions(&m, &f),
            2,
            "the record-lock and the flock descriptions"
        );
        client.status(&lk(SETLK, UN, 0, 10)).unwrap();
        client.status(&format!("flock {}", libc::LOCK_UN)).unwrap();
        assert_eq!(lock_descriptions(&m, &f), 2, "kept for the next lock");
    }
    client.status(&lk(OFD_SETLK, RD, 0, 0)).unwrap();
    client.status("close").unwrap();
    descriptions_close(&m, &f);
}

/// The descriptions held for locks on `file` close within 3 s (`RELEASE` comes just
/// after `close(2)`).
fn descriptions_close(m: &Mounted, file: &Path) {
    let deadline = Instant::now() + Duration::from_secs(3);
    while lock_descriptions(m, file) != 0 {
        assert!(
            Instant::now() < deadline,
            "the descriptions outlived the file's RELEASE"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A client granted a lock sees what a process on the source changed under its own: the
/// file's size, and an entry of its directory that it deleted (a journal), whether the
/// client had looked it up before the first grant in the directory or after.
#[test]
fn a_grant_sees_the_hosts_changes() {
    if let Some(why) = skip() {
        return say(&format!("SKIP: {why}"));
    }
    let (m, mut host, mut client) = setup("");
    let (src, mnt) = (&m.source, &m.mounts[0]);
    // Looked up before the first grant, which marks the directory.
    host.status(&lk(SETLK, WR, 0, 0)).unwrap();
    std::fs::write(src.join("f-journal"), b"j").unwrap();
    assert!(mnt.join("f-journal").exists(), "the journal through the mount");
    std::fs::remove_file(src.join("f-journal")).unwrap();
    host.status(&lk(SETLK, UN, 0, 0)).unwrap();
    client.status(&lk(SETLK, WR, 0, 0)).unwrap();
    assert!(
        !mnt.join("f-journal").exists(),
        "the journal the host deleted still shows through the mount after the first grant"
    );
    client.status(&lk(SETLK, UN, 0, 0)).unwrap();
    assert_eq!(std::fs::metadata(mnt.join("f")).unwrap().len(), 4096);
    host.status(&lk(SETLK, WR, 0, 0)).unwrap();
    std::fs::write(src.join("f-journal"), b"j").unwrap();
    assert!(mnt.join("f-journal").exists(), "the journal through the mount");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(src.join("f"))
        .unwrap();
    f.write_all(&[1u8; 100]).unwrap();
    drop(f);
    std::fs::remove_file(src.join("f-journal")).unwrap();
    host.status(&lk(SETLK, UN, 0, 0)).unwrap();
    client.status(&lk(SETLK, RD, 0, 0)).unwrap();
    assert_eq!(
        std::fs::metadata(mnt.join("f")).unwrap().len(),
        4196,
        "the size the host left, after the grant"
    );
    assert!(
        !mnt.join("f-journal").exists(),
        "the journal the host deleted still shows through the mount"
    );
}

/// Each process takes write or read locks (`F_SETLKW`, POSIX or OFD; or whole-file
/// flock locks with `flock` as its fourth argument) on random small ranges of one file;
/// under a write lock it writes its mark and checks it is still there, under a read lock
/// it checks the bytes do not change.
const TORTURE: &str = r#"
import fcntl, os, random, struct, sys, time
path, seed, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
random.seed(seed)
fd = os.open(path, os.O_RDWR)
me = bytes([seed + 1])
FMT = 'hhxxxxqqixxxx'
SET, SETW = (fcntl.F_OFD_SETLK, fcntl.F_OFD_SETLKW) if seed % 3 == 0 else (fcntl.F_SETLK, fcntl.F_SETLKW)
bad = 0
for i in range(n):
    a, l = random.randrange(0, 64), random.randrange(1, 32)
    wr = random.random() < 0.5
    if sys.argv[4] == 'flock':
        fcntl.flock(fd, fcntl.LOCK_EX if wr else fcntl.LOCK_SH)
    else:
        fcntl.fcntl(fd, SETW, struct.pack(FMT, fcntl.F_WRLCK if wr else fcntl.F_RDLCK, 0, a, l, 0))
    if wr:
        os.pwrite(fd, me * l, a)
    before = os.pread(fd, l, a)
    time.sleep(0.0005)
    if os.pread(fd, l, a) != before or (wr and before != me * l):
        bad += 1
    if sys.argv[4] == 'flock':
        fcntl.flock(fd, fcntl.LOCK_UN)
    else:
        fcntl.fcntl(fd, SET, struct.pack(FMT, fcntl.F_UNLCK, 0, a, l, 0))
print(bad)
"#;

/// Mutual exclusion holds across the mount under contention: four processes on the
/// source and four through the mount, POSIX and OFD locks, then flock locks, waits on
/// both sides.
#[test]
fn exclusion_holds_under_contention() {
    if let Some(why) = skip() {
        return say(&format!("SKIP: {why}"));
    }
    let m = Mounted::start(1, "").expect("mount");
    std::fs::write(m.source.join("f"), vec![0u8; 4096]).unwrap();
    for kind in ["fcntl", "flock"] {
        contend(&m, kind);
    }
}

fn contend(m: &Mounted, kind: &str) {
    let start = Instant::now();
    let procs: Vec<_> = (0..8)
        .map(|p| {
            let dir = if p % 2 == 0 { &m.source } else { &m.mounts[0] };
            Command::new("python3")
                .arg("-c")
                .arg(TORTURE)
                .arg(dir.join("f"))
                .arg(p.to_string())
                .arg("500")
                .arg(kind)
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn python3")
        })
        .collect();
    for (p, c) in procs.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "process {p}: {}", out.status);
        let bad = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert_eq!(
            bad, "0",
            "{kind}: process {p} saw its locked bytes change {bad} times"
        );
    }
    say(&format!(
        "{kind}: 4 + 4 processes x 500 locked ranges, no overlap seen, in {:.1} s",
        start.elapsed().as_secs_f64()
    ));
}

/// An exclusive flock lock handed from one client to another stays held on the source
/// (the next client takes the server's description over), shows there while the new
/// holder has it, and goes with the last client's unlock; a host waiter then gets it
/// promptly.
#[test]
fn flock_hand_off_among_clients_holds_the_source() {
    if let Some(why) = skip() {
        return say(&format!("SKIP: {why}"));
    }
    let (m, mut host, mut first) = setup("");
    let mut second = Agent::start(&m.mounts[0].join("f"));
    let (ex, un, nb) = (libc::LOCK_EX, libc::LOCK_UN, libc::LOCK_NB);
    for round in 0..3 {
        first.status(&format!("flock {ex}")).unwrap();
        second.send(&format!("flock {ex}"));
        assert!(
            second.answer(Duration::from_millis(200)).is_none(),
            "round {round}: the second client was granted while the first held"
        );
        first.status(&format!("flock {un}")).unwrap();
        let w = second
            .answer(Duration::from_secs(5))
            .unwrap_or_else(|| panic!("round {round}: the second client never granted"));
        assert_eq!(w[0], "ok", "round {round}: {w:?}");
        assert_eq!(
            host.status(&format!("flock {}", ex | nb)),
            Err(EAGAIN),
            "round {round}: the handed-off lock on the source"
        );
        assert_eq!(
            first.status(&format!("flock {}", ex | nb)),
            Err(EAGAIN),
            "round {round}: the first client after the hand-off"
        );
        // A host waiter gets it at the last client's unlock.
        host.send(&format!("flock {ex}"));
        assert!(
            host.answer(Duration::from_millis(200)).is_none(),
            "round {round}: the host's wait ended while a client held"
        );
        let t = time_of(&second.run(&format!("flock {un}")));
        prompt(
            &mut host,
            t,
            &format!("round {round}: host behind the last client"),
        );
        assert_eq!(
            first.status(&format!("flock {}", ex | nb)),
            Err(EAGAIN),
            "round {round}: the host's lock through the mount"
        );
        host.status(&format!("flock {un}")).unwrap();
    }
    drop((first, second));
    // The pool closes with the files.
    descriptions_close(&m, &m.source.join("f"));
}

/// A client waiting for another client's lock holds nothing on the source, as a waiter
/// holds nothing in Linux: a host reader waiting behind a client writer is granted when
/// that writer goes down to read, though another client still waits to write part of the
/// range, and a host `F_SETLK` there is granted too.
#[test]
fn a_client_waiter_holds_nothing_on_the_source() {
    if let Some(why) = skip() {
        return say(&format!("SKIP: {why}"));
    }
    let (m, mut host, mut writer) = setup("");
    let mut other_host = Agent::start(&m.source.join("f"));
    let mut waiter = Agent::start(&m.mounts[0].join("f"));
    writer.status(&lk(SETLK, WR, 0, 10)).unwrap();
    host.send(&lk(SETLKW, RD, 0, 10));
    assert!(
        host.answer(Duration::from_millis(200)).is_none(),
        "the host reader was granted while a client held the range for writing"
    );
    waiter.send(&lk(SETLKW, WR, 5, 1));
    assert!(
        waiter.answer(Duration::from_millis(200)).is_none(),
        "the client writer was granted while another client held the range"
    );
    let t = time_of(&writer.run(&lk(SETLK, RD, 0, 10)));
    prompt(
        &mut host,
        t,
        "the host reader after the client writer went down to read",
    );
    assert_eq!(
        other_host.status(&lk(SETLK, RD, 5, 1)),
        Ok(()),
        "a host F_SETLK for reading where a client only waits to write"
    );
    assert!(
        waiter.answer(Duration::from_millis(100)).is_none(),
        "the client writer was granted while readers held the range"
    );
    // The waiting client is granted once every reader has gone, and holds the source.
    other_host.status(&lk(SETLK, UN, 0, 0)).unwrap();
    host.status(&lk(SETLK, UN, 0, 0)).unwrap();
    let t = time_of(&writer.run(&lk(SETLK, UN, 0, 0)));
    prompt(&mut waiter, t, "the client writer after the last reader");
    assert_eq!(
        host.status(&lk(SETLK, RD, 5, 1)),
        Err(EAGAIN),
        "the granted client writer's range on the source"
    );
    assert_eq!(
        host.status(&lk(SETLK, RD, 0, 5)),
        Ok(()),
        "beside the client writer's range"
    );
}

/// A host process waiting for a flock lock that clients hand on among themselves without
/// a break gets it, as a waiter in Linux races for it at every unlock: within a second,
/// while eight client threads lock and unlock it in a loop.
#[test]
fn a_host_flock_waiter_is_not_starved_by_a_client_herd() {
    if let Some(why) = skip() {
        return say(&format!("SKIP: {why}"));
    }
    let (m, mut host, client) = setup("");
    drop(client);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let herd: Vec<_> = (0..8)
        .map(|_| {
            let file = std::fs::File::open(m.mounts[0].join("f")).unwrap();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // SAFETY: flock on a descriptor this thread holds.
                    unsafe {
                        assert_eq!(libc::flock(file.as_raw_fd(), libc::LOCK_EX), 0);
                        assert_eq!(libc::flock(file.as_raw_fd(), libc::LOCK_UN), 0);
                    }
                    n += 1;
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    host.send(&format!("flock {}", libc::LOCK_EX));
    let got = host.answer(Duration::from_secs(1));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if got.is_some() {
        host.status(&format!("flock {}", libc::LOCK_UN)).unwrap();
    }
    let rounds: u64 = herd.into_iter().map(|t| t.join().unwrap()).sum();
    let got =
        got.unwrap_or_else(|| panic!("the host waiter was not granted within 1 s ({rounds} client rounds)"));
    assert_eq!(got[0], "ok", "{got:?}");
    say(&format!(
        "host waiter granted during a herd of {rounds} client rounds"
    ));
}

/// Whether the filesystem of `dir` shows every change made right after a `stat` in the
/// change time (multigrain timestamps): an unnamed file's mode set again and again.
fn fine_ctime(dir: &Path) -> bool {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
    else {
        return false;
    };
    let ctime = |f: &std::fs::File| {
        use std::os::unix::fs::MetadataExt as _;
        f.metadata().map(|m| (m.ctime(), m.ctime_nsec())).unwrap()
    };
    let mut last = ctime(&f);
    (0..32).all(|_| {
        f.set_permissions(std::fs::Permissions::from_mode(0o600)).unwrap();
        let now = ctime(&f);
        std::mem::replace(&mut last, now) != now
    })
}

/// Whether the first page of `f` is in the client's page cache (`mincore` of a mapping).
fn first_page_cached(f: &std::fs::File) -> bool {
    // SAFETY: a fresh shared read-only mapping of one page of a file held open, unmapped
    // below; `mincore` writes one byte for it.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "mmap through the mount");
        let mut v = 0u8;
        assert_eq!(libc::mincore(p, 4096, &mut v), 0, "mincore");
        libc::munmap(p, 4096);
        v & 1 == 1
    }
}

/// A client's own change through the mount (a truncate to the same size) is no host's:
/// its next grant keeps its cached data. But a host change under a host lock before
/// that own change still shows after the grant: the own change does not vouch for it.
#[test]
fn a_clients_own_change_is_not_taken_for_the_hosts() {
    if let Some(why) = skip() {
        return say(&format!("SKIP: {why}"));
    }
    use std::os::unix::fs::FileExt as _;
    // Without passthrough the client caches the file's data.
    let (m, mut host, mut client) = setup("nopassthrough");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.mounts[0].join("f"))
        .unwrap();
    let read4 = |f: &std::fs::File| {
        let mut b = [0u8; 4];
        f.read_exact_at(&mut b, 0).unwrap();
        b
    };
    client.status(&lk(SETLK, WR, 0, 0)).unwrap();
    client.status(&lk(SETLK, UN, 0, 0)).unwrap();
    assert_eq!(read4(&f), [0; 4]);
    if fine_ctime(&m.source) {
        f.set_len(4096).unwrap();
        client.status(&lk(SETLK, WR, 0, 0)).unwrap();
        assert!(
            first_page_cached(&f),
            "the client's own truncate was taken for a host change: its cache went at the grant"
        );
        client.status(&lk(SETLK, UN, 0, 0)).unwrap();
    } else {
        say("SKIP (part): the source's change times are coarse: an own change is vouched for only a tick later");
    }
    // A host change under a host lock, then the client's own change, then its grant.
    host.status(&lk(SETLK, WR, 0, 0)).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(m.source.join("f"))
        .unwrap()
        .write_all_at(b"host", 0)
        .unwrap();
    host.status(&lk(SETLK, UN, 0, 0)).unwrap();
    f.set_len(4096).unwrap();
    client.status(&lk(SETLK, RD, 0, 0)).unwrap();
    assert_eq!(
        &read4(&f),
        b"host",
        "the host's write under its lock is hidden by the client's own change after it"
    );
}

/// A grant is answered once its cache invalidation is done, and waiting for it holds no
/// dispatch thread: with one dispatch thread, a read through the mount that is queued
/// behind the grant holds the page that the invalidation must lock. The read is served,
/// then the invalidation ends and the grant is answered, promptly: a grant that waited
/// in the dispatch thread for its invalidation would be answered only after giving up
/// on it (unanswered, or after a bound), and before the read.
/// Over io_uring the requests of one CPU share its queue's one thread: the client and
/// the reader are pinned to CPU 0 so that the read waits for that thread as it waits for
/// the one dispatch thread over /dev/fuse.
#[test]
fn a_grant_waits_for_its_invalidation_in_no_dispatch_thread() {
    if let Some(why) = skip() {
        return say(&format!("SKIP: {why}"));
    }
    use nix::sys::signal::{kill, Signal};
    use std::os::unix::fs::FileExt as _;
    let (m, mut host, mut client) = setup("nopassthrough,threads=1");
    let server = nix::unistd::Pid::from_raw(m.pid());
    let cpu0 = || {
        let mut set = nix::sched::CpuSet::new();
        set.set(0).unwrap();
        set
    };
    let client_pid = nix::unistd::Pid::from_raw(client.pid());
    nix::sched::sched_setaffinity(client_pid, &cpu0()).unwrap();
    let since = |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    // The directory's first grant is done.
    client.status(&lk(SETLK, WR, 0, 0)).unwrap();
    client.status(&lk(SETLK, UN, 0, 0)).unwrap();
    // Timing on 2 loaded vCPUs: the fastest of three attempts is judged.
    let (mut fastest, mut best_gap) = (f64::MAX, f64::MAX);
    for attempt in 0..3u8 {
        // A host change makes the next grant invalidate.
        host.status(&lk(SETLK, WR, 0, 0)).unwrap();
        std::fs::write(m.source.join("f"), vec![7 + attempt; 4096]).unwrap();
        host.status(&lk(SETLK, UN, 0, 0)).unwrap();
        let f = std::fs::File::open(m.mounts[0].join("f")).unwrap();
        f.metadata().unwrap(); // fresh attributes: the read asks for its pages at once
                               // Queued while the server is stopped: the grant first, then the read, whose
                               // page stays locked until the one dispatch thread serves it.
        kill(server, Signal::SIGSTOP).unwrap();
        client.send(&lk(SETLK, WR, 0, 0));
        std::thread::sleep(Duration::from_millis(200));
        let reader = std::thread::spawn(move || {
            nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &cpu0()).unwrap();
            let mut b = [0u8; 16];
            let r = f.read_exact_at(&mut b, 0).map(|_| b[0]);
            (r, std::time::SystemTime::now())
        });
        std::thread::sleep(Duration::from_millis(200));
        let resumed = std::time::SystemTime::now();
        kill(server, Signal::SIGCONT).unwrap();
        let w = client
            .answer(Duration::from_secs(10))
            .expect("the grant is never answered while its invalidation waits for the read");
        assert_eq!(w[0], "ok", "{w:?}");
        let granted = time_of(&w);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !reader.is_finished() {
            assert!(Instant::now() < deadline, "the read is never answered");
            std::thread::sleep(Duration::from_millis(10));
        }
        let (r, read_at) = reader.join().unwrap();
        assert_eq!(r.unwrap(), 7 + attempt, "the read through the mount");
        // The two processes' clocks are read after their wake-ups, in either order (and
        // on a loaded machine a wake-up may come late: the best attempt is judged).
        let gap = since(read_at) - granted;
        best_gap = best_gap.min(gap);
        fastest = fastest.min(granted - since(resumed));
        client.status(&lk(SETLK, UN, 0, 0)).unwrap();
        if fastest < 0.05 && gap < 0.05 {
            break;
        }
    }
    assert!(
        best_gap < 0.05,
        "the grant was answered {:.1} ms before the read whose page its invalidation \
         waits for, at best: it did not wait for the invalidation",
        best_gap * 1e3
    );
    assert!(
        fastest < 0.05,
        "the grant took {:.1} ms after the server resumed at best: it waited for its \
         invalidation in the dispatch thread that the read needs",
        fastest * 1e3
    );
}
