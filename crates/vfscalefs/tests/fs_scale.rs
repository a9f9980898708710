//! vfscalefs at real scale, its server limited to 1,024 descriptors (soft and hard, as by
//! `ulimit -n 1024`) on a tmpfs source, which makes file handles:
//!
//! * a tree of 200,000 files in 200 directories walks and stats, and a directory of
//!   100,000 files lists with `ls -l`;
//! * two client processes hold 15,000 open files each and lock through every one, with
//!   and without kernel passthrough;
//! * a client that opens files until `EMFILE` reaches its own limit to the descriptor, as
//!   on tmpfs, and `F_DUPFD` then fails with `EMFILE`;
//! * a file unlinked through the mount while open keeps working through its descriptor,
//!   and a file removed on the source behind the server's back is stale, never another;
//! * after every close, and once the kernel forgets, the server holds the descriptors it
//!   held after mounting, and never more than half of its limit.
//!
//! The client processes are this test binary run again with `VFSCALEFS_SCALE_CLIENT`
//! (see [`client_process`]).

mod common;

use std::ffi::CString;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{cannot_mount, run, say, Mounted, TempDir};

/// The server's `RLIMIT_NOFILE`.
const SERVER_NOFILE: u64 = 1024;

/// Files each client holds open.
const HELD: usize = 15_000;

/// What starts a client's line on its stdout.
const MARK: &str = "vfscalefs-client: ";

// ---------------------------------------------------------------------------------------
// The client side: a process of this binary that takes commands on stdin.

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn raise_nofile(to: u64) -> bool {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        if r.rlim_max < to {
            return false;
        }
        r.rlim_cur = to;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r) == 0
    }
}

fn flock_of(typ: i32) -> libc::flock {
    // SAFETY: a zeroed flock is valid; the fields that matter are set.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = typ as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = 0;
    fl.l_len = 1;
    fl
}

fn open_rw(p: &Path) -> i32 {
    let c = CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) }
}

/// Opens `dir/h{i}` for every `i < n`, checks each one's content through its
/// descriptor, and answers `opened` (or the first failure).
fn client_open(dir: &Path, n: usize) -> Result<Vec<i32>, String> {
    if !raise_nofile(n as u64 + 64) {
        return Err(format!("RLIMIT_NOFILE's hard limit is below {}", n + 64));
    }
    let mut fds = Vec::with_capacity(n);
    let mut buf = [0u8; 32];
    for i in 0..n {
        let fd = open_rw(&dir.join(format!("h{i}")));
        if fd < 0 {
            return Err(format!("open h{i} (after {i}): errno {}", errno()));
        }
        // SAFETY: `buf` is writable for its length.
        let got = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        let want = format!("h{i}");
        if got < 0 || &buf[..got as usize] != want.as_bytes() {
            return Err(format!("read h{i}: {got} bytes, errno {}", errno()));
        }
        fds.push(fd);
    }
    Ok(fds)
}

/// Not a test: the body of a client process. Passes at once unless run by the tests
/// below, which set `VFSCALEFS_SCALE_CLIENT` to `hold DIR N`, `probe DIR N PID` or
/// `emfile DIR LIMIT`, and talk to it on stdin and stdout.
#[test]
fn client_process() {
    let Ok(spec) = std::env::var("VFSCALEFS_SCALE_CLIENT") else {
        return;
    };
    let words: Vec<&str> = spec.split(' ').collect();
    let dir = Path::new(words[1]);
    let arg = |i: usize| words[i].parse::<usize>().unwrap();
    let mut out = std::io::stdout();
    let mut lines = std::io::stdin().lock().lines();
    let mut say = |s: String| {
        writeln!(out, "\n{MARK}{s}").unwrap();
        out.flush().unwrap();
    };
    match words[0] {
        // Opens N files, takes a write lock through each, then waits for stdin's end.
        "hold" => {
            if !raise_nofile(arg(2) as u64 + 64) {
                return say(format!(
                    "skip RLIMIT_NOFILE's hard limit is below {}",
                    arg(2) + 64
                ));
            }
            let fds = match client_open(dir, arg(2)) {
                Ok(f) => f,
                Err(e) => return say(format!("error {e}")),
            };
            for (i, &fd) in fds.iter().enumerate() {
                let fl = flock_of(libc::F_WRLCK);
                // SAFETY: fcntl with a valid flock.
                if unsafe { libc::fcntl(fd, libc::F_SETLK, &fl) } != 0 {
                    return say(format!("error F_SETLK h{i}: errno {}", errno()));
                }
            }
            say("held".into());
            while lines.next().is_some() {}
        }
        // Opens N files; through each, the holder's lock is seen (F_GETLK names its
        // pid) and refused (EAGAIN); after `retry`, each is granted.
        "probe" => {
            let holder = arg(3) as i32;
            let fds = match client_open(dir, arg(2)) {
                Ok(f) => f,
                Err(e) => return say(format!("error {e}")),
            };
            for (i, &fd) in fds.iter().enumerate() {
                let mut fl = flock_of(libc::F_WRLCK);
                // SAFETY: fcntl with a valid flock.
                if unsafe { libc::fcntl(fd, libc::F_GETLK, &mut fl) } != 0
                    || fl.l_type != libc::F_WRLCK as i16
                    || fl.l_pid != holder
                {
                    return say(format!(
                        "error F_GETLK h{i}: type {} pid {} (holder {holder}), errno {}",
                        fl.l_type,
                        fl.l_pid,
                        errno()
                    ));
                }
                let fl = flock_of(libc::F_WRLCK);
                // SAFETY: as above.
                let r = unsafe { libc::fcntl(fd, libc::F_SETLK, &fl) };
                if r == 0 || errno() != libc::EAGAIN {
                    return say(format!("error F_SETLK h{i} while held: {r}, errno {}", errno()));
                }
            }
            say("refused".into());
            if lines.next().is_none() {
                return;
            }
            for (i, &fd) in fds.iter().enumerate() {
                let fl = flock_of(libc::F_WRLCK);
                // SAFETY: as above.
                if unsafe { libc::fcntl(fd, libc::F_SETLK, &fl) } != 0 {
                    return say(format!("error F_SETLK h{i} after the release: errno {}", errno()));
                }
            }
            say("granted".into());
        }
        // With RLIMIT_NOFILE set to LIMIT, opens DIR/e until it fails: the errno, how
        // many it opened, the highest descriptor, then F_DUPFD's result and errno.
        "emfile" => {
            let limit = arg(2) as u64;
            let r = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit.max(SERVER_NOFILE),
            };
            // SAFETY: setrlimit with a valid rlimit.
            assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) }, 0);
            let mut n = 0;
            let mut max = 0;
            let err = loop {
                let fd = open_rw(&dir.join("e"));
                if fd < 0 {
                    break errno();
                }
                n += 1;
                max = max.max(fd);
            };
            // SAFETY: F_DUPFD of descriptor 0, which is open (stdin).
            let d = unsafe { libc::fcntl(0, libc::F_DUPFD, 0) };
            let derr = if d < 0 { errno() } else { 0 };
            say(format!("errno {err} opened {n} max {max} dupfd {d} errno {derr}"));
        }
        other => panic!("unknown client command {other}"),
    }
}

/// A client process running `spec` (see [`client_process`]).
struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    out: BufReader<ChildStdout>,
    /// Set when the client is done with; until then a watchdog kills it after
    /// [`CLIENT_TIMEOUT`], so that a stuck client fails its test instead of hanging it.
    done: Arc<AtomicBool>,
}

/// How long a client may take in all.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(300);

impl Client {
    fn start(spec: &str) -> Client {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["client_process", "--exact", "--nocapture", "--test-threads=1"])
            .env("VFSCALEFS_SCALE_CLIENT", spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn a client");
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().unwrap());
        let done = Arc::new(AtomicBool::new(false));
        let (flag, pid) = (done.clone(), child.id() as i32);
        std::thread::spawn(move || {
            let deadline = Instant::now() + CLIENT_TIMEOUT;
            while !flag.load(Ordering::Acquire) {
                if Instant::now() > deadline {
                    eprintln!("client {pid}: no answer within {CLIENT_TIMEOUT:?}: killed");
                    // SAFETY: kill has no memory preconditions; the client is reaped only
                    // after `done` is set, so `pid` still names it.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        });
        Client {
            child,
            stdin,
            out,
            done,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line the client says (the test harness's own lines are skipped).
    fn line(&mut self) -> String {
        loop {
            let mut l = String::new();
            if self.out.read_line(&mut l).unwrap() == 0 {
                panic!("the client ended without answering");
            }
            // The harness writes its own words around the client's.
            let Some((_, l)) = l.trim().split_once(MARK) else {
                continue;
            };
            if l.starts_with("error ") {
                panic!("client {}: {l}", self.child.id());
            }
            return l.to_owned();
        }
    }

    fn expect(&mut self, want: &str) {
        let got = self.line();
        assert_eq!(got, want, "client {}", self.child.id());
    }

    fn tell(&mut self, what: &str) {
        writeln!(self.stdin.as_mut().unwrap(), "{what}").unwrap();
    }

    /// Ends its stdin and waits for it.
    fn finish(mut self) {
        drop(self.stdin.take());
        let st = self.child.wait().unwrap();
        self.done.store(true, Ordering::Release);
        assert!(st.success(), "client exited {st}");
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        self.done.store(true, Ordering::Release);
    }
}

// ---------------------------------------------------------------------------------------
// The tests.

/// A server under `SERVER_NOFILE` on one mountpoint: its scratch directory (with the
/// stats file), the stats file, the mount, and the descriptors it holds after mounting.
struct Server {
    _dir: TempDir,
    stats: std::path::PathBuf,
    m: Mounted,
    base: usize,
}

fn start(tag: &str, opts: &str) -> Server {
    let dir = TempDir::new(tag);
    let stats = dir.0.join("stats");
    let m =
        Mounted::start_limited(1, opts, &[("VFSCALEFS_STATS", &stats)], Some(SERVER_NOFILE)).expect("mount");
    // Served (INIT answered, every dispatch thread with its descriptor), then settled.
    std::fs::read_dir(&m.mounts[0]).unwrap().for_each(drop);
    let mut base = server_fds(&m, "after mounting");
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let now = server_fds(&m, "after mounting");
        if now == base {
            break;
        }
        base = now;
    }
    Server {
        _dir: dir,
        stats,
        m,
        base,
    }
}

/// The server's descriptors, checked to be at most half of its limit.
fn server_fds(m: &Mounted, when: &str) -> usize {
    let n = m.fds().len();
    assert!(
        n as u64 <= SERVER_NOFILE / 2,
        "{when}: the server holds {n} descriptors, over half of its {SERVER_NOFILE}"
    );
    n
}

/// Once the kernel has forgotten everything, the server's descriptors are back to what
/// it held after mounting (it may take a moment for requests in flight to let go).
fn back_to(m: &Mounted, stats: &Path, base: usize) {
    let s = m.drained(stats);
    assert_eq!((s.inodes, s.lookups, s.handles), (1, 0, 0), "{s:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while m.fds().len() > base && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        m.fds().len() <= base,
        "the server holds {} descriptors, {base} after mounting: {:?}",
        m.fds().len(),
        m.fds()
    );
}

fn lines_of(cmd: &mut Command) -> Vec<String> {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_tree_far_larger_than_the_servers_descriptors() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    let srv = start("scale-tree", "");
    let (m, sf, base) = (&srv.m, &srv.stats, srv.base);
    let (src, mnt) = (&m.source, &m.mounts[0]);
    for d in 0..200 {
        let dir = src.join(format!("tree/d{d:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..1000 {
            std::fs::write(dir.join(format!("f{f}")), b"").unwrap();
        }
    }
    let big = src.join("big");
    std::fs::create_dir(&big).unwrap();
    for f in 0..100_000 {
        std::fs::File::create(big.join(format!("entry-{f:06}"))).unwrap();
    }

    // Every file found and stat'ed (`%s` and `%i` make find stat each one), with the
    // source's inode numbers and sizes.
    let find = |root: &Path| {
        let mut v = lines_of(Command::new("find").arg(root.join("tree")).args([
            "-type",
            "f",
            "-printf",
            "%P %i %s\n",
        ]));
        v.sort();
        v
    };
    let through = find(mnt);
    assert_eq!(through.len(), 200_000, "files found through the mount");
    assert_eq!(
        through,
        find(src),
        "names, inode numbers and sizes as on the source"
    );
    server_fds(m, "after the walk");

    let ls = lines_of(
        Command::new("ls")
            .arg("-l")
            .arg(mnt.join("big"))
            .env("LC_ALL", "C"),
    );
    assert_eq!(ls.len(), 100_001, "ls -l: the total line and 100,000 entries");
    assert!(ls[1..].iter().all(|l| l.starts_with("-rw")), "{:?}", &ls[1..3]);
    server_fds(m, "after ls -l");
    back_to(m, sf, base);
}

/// Two clients each hold `HELD` open files of the mount: the first locks through every
/// one; the second sees each lock (`F_GETLK` with the holder's pid), is refused, and is
/// granted every one once the first has closed them all.
fn two_clients_hold_and_lock(opts: &str) {
    let srv = start("scale-open", opts);
    let (m, sf, base) = (&srv.m, &srv.stats, srv.base);
    for i in 0..HELD {
        std::fs::write(m.source.join(format!("h{i}")), format!("h{i}")).unwrap();
    }
    let dir = m.mounts[0].display().to_string();
    let mut a = Client::start(&format!("hold {dir} {HELD}"));
    let first = a.line();
    if let Some(why) = first.strip_prefix("skip ") {
        return say(&format!("SKIP: {why}"));
    }
    assert_eq!(first, "held");
    server_fds(m, "with one client's files open");
    let mut b = Client::start(&format!("probe {dir} {HELD} {}", a.pid()));
    b.expect("refused");
    let s = m.stats(sf);
    assert_eq!(s.handles, 2 * HELD as u64, "{s:?}");
    server_fds(m, "with both clients' files open");
    a.finish();
    b.tell("retry");
    b.expect("granted");
    b.finish();
    back_to(m, sf, base);
}

#[test]
fn clients_hold_more_files_than_the_server_may_open() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    two_clients_hold_and_lock("");
}

/// Without kernel passthrough every read goes to the server, which opens the files again
/// as its cache lets them go.
#[test]
fn clients_hold_more_files_than_the_server_may_open_without_passthrough() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    two_clients_hold_and_lock("nopassthrough");
}

#[test]
fn a_client_reaches_its_own_descriptor_limit() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    let srv = start("scale-emfile", "");
    let (m, sf, base) = (&srv.m, &srv.stats, srv.base);
    std::fs::write(m.source.join("e"), b"e").unwrap();
    // Above the server's own limit: the server's descriptors must not be what ends it.
    let limit = 3 * SERVER_NOFILE;
    let mut on_tmpfs = Client::start(&format!("emfile {} {limit}", m.source.display()));
    let want = on_tmpfs.line();
    on_tmpfs.finish();
    assert!(
        want.starts_with(&format!("errno {} ", libc::EMFILE)),
        "on tmpfs: {want}"
    );
    let mut on_mount = Client::start(&format!("emfile {} {limit}", m.mounts[0].display()));
    assert_eq!(on_mount.line(), want, "through the mount, as on tmpfs");
    on_mount.finish();
    server_fds(m, "after the client's opens");
    back_to(m, sf, base);
}

fn file_ops(f: &std::fs::File, want: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt as _;
    let mut buf = vec![0u8; want.len()];
    f.read_exact_at(&mut buf, 0)?;
    assert_eq!(buf, want);
    f.write_all_at(b"more", want.len() as u64)?;
    f.sync_all()?;
    f.set_len(2)?;
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    let md = f.metadata()?;
    assert_eq!((md.len(), md.mode() & 0o777), (2, 0o600));
    Ok(())
}

/// Opens and stats `n` other files through the mount: the descriptor cache (16) moves on.
fn churn(mnt: &Path, n: usize) {
    for i in 0..n {
        let p = mnt.join(format!("churn{i}"));
        std::fs::write(&p, b"c").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"c");
    }
}

/// A file unlinked through the mount while open keeps working through its descriptor
/// (reads, writes, fsync, ftruncate, fchmod, fstat) after the cache has let its
/// descriptor go: the server kept one for it. So does one opened after its unlink.
#[test]
fn an_unlinked_open_file_keeps_working() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    for opts in ["fd_cache=16", "fd_cache=16,nopassthrough"] {
        let srv = start("scale-unlinked", opts);
        let (m, sf, base) = (&srv.m, &srv.stats, srv.base);
        let mnt = &m.mounts[0];
        std::fs::write(mnt.join("f"), b"kept data").unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(mnt.join("f"))
            .unwrap();
        std::fs::remove_file(mnt.join("f")).unwrap();
        churn(mnt, 200);
        file_ops(&f, b"kept data").unwrap_or_else(|e| panic!("{opts}: {e}"));
        drop(f);

        // Opened only after its unlink (through an O_PATH descriptor, which the client
        // kernel opens without asking the server): the OPEN finds the file linkless.
        std::fs::write(mnt.join("g"), b"late open").unwrap();
        let path_only = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(mnt.join("g"))
            .unwrap();
        std::fs::remove_file(mnt.join("g")).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", path_only.as_raw_fd()))
            .unwrap();
        drop(path_only);
        churn(mnt, 200);
        file_ops(&f, b"late open").unwrap_or_else(|e| panic!("{opts}, opened after the unlink: {e}"));
        drop(f);
        back_to(m, sf, base);
    }
}

/// A file removed on the source behind the server's back, while open through the mount,
/// is stale once its descriptor has left the cache: its handle opens nothing, and no
/// other file (the one created in its place) is ever served instead.
#[test]
fn a_file_removed_on_the_source_is_stale_never_another() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    let srv = start("scale-stale", "fd_cache=16,nopassthrough,ttl=0");
    let m = &srv.m;
    let (src, mnt) = (&m.source, &m.mounts[0]);
    std::fs::write(src.join("f"), b"old").unwrap();
    let f = std::fs::File::open(mnt.join("f")).unwrap();
    std::fs::remove_file(src.join("f")).unwrap();
    std::fs::write(src.join("f"), b"new").unwrap();
    churn(mnt, 200);
    use std::os::unix::fs::FileExt as _;
    let mut buf = [0u8; 3];
    // The old data (from the client's page cache) or a stale file, never the new one.
    match f.read_at(&mut buf, 0) {
        Ok(n) => assert_eq!(&buf[..n], b"old", "another file was served"),
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}"),
    }
    // By name, the new file.
    assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"new");
}

/// The server says at mount how it keeps inodes; on a source whose handles do not last
/// (a FUSE mount: here, vfscalefs itself) `prefer` falls back to descriptors and says
/// why, and `mandatory` refuses to serve.
#[test]
fn the_inode_mode_is_said_and_mandatory_refuses() {
    if let Some(why) = cannot_mount() {
        return say(&format!("SKIP: {why}"));
    }
    let srv = start("scale-mode", "");
    let lower = &srv.m;
    std::fs::write(lower.source.join("f"), b"x").unwrap();
    let t = TempDir::new("scale-mode-upper");
    let upper = t.0.join("upper");
    std::fs::create_dir(&upper).unwrap();
    let bin = env!("CARGO_BIN_EXE_vfscalefs");
    let out = run(Command::new(bin)
        .arg(&lower.mounts[0])
        .arg(&upper)
        .args(["-o", "inode_handles=mandatory"]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "mandatory served a FUSE source: {err}");
    assert!(
        err.contains("inode_handles=mandatory") && err.contains("FUSE"),
        "{err}"
    );

    let mut child = Command::new(bin)
        .arg(&lower.mounts[0])
        .arg(&upper)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(std::fs::read(upper.join("f")).unwrap(), b"x");
    let _ = nix::mount::umount2(upper.as_path(), nix::mount::MntFlags::MNT_DETACH);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        line.starts_with("vfscalefs: inodes by descriptor") && line.contains("FUSE"),
        "{line}"
    );
}
