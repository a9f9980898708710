//! Shared by the mount tests: a vfscalefs server on temporary mountpoints that is always
//! unmounted (SIGINT, then a lazy unmount as the last resort), and the skip rules.

#![allow(dead_code)]

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// `FUSE_SUPER_MAGIC`.
const FUSE_MAGIC: i64 = 0x6573_5546;

/// Printed straight to stderr so that a skip shows even when the test passes.
pub fn say(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// Why the mount tests cannot run here, if they cannot.
pub fn cannot_mount() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (the mount tests mount with mount(2))".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("no /dev/fuse".into());
    }
    None
}

/// `Some(why)` when `tool` is not on the PATH.
pub fn missing_tool(tool: &str) -> Option<String> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    (!found).then(|| format!("{tool} is not installed"))
}

/// The lock corpus's scenarios (`scenarios/locks/*.jsonl`, not those under `racy/`), in
/// name order.
pub fn lock_corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/locks");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    files
}

/// What [`replay_corpus`] found.
pub struct CorpusRun {
    /// Scenarios replayed.
    pub ran: usize,
    /// Scenarios with OFD locks, left out: FUSE carries them as POSIX locks.
    pub skipped: usize,
    /// The scenarios that differed twice from the kernel's recorded results: name, and
    /// how.
    pub failures: Vec<(String, String)>,
}

/// The lock corpus's scenarios without OFD locks replayed by the kernel runner with
/// their processes spread over `dirs` (process *i* in directory *i* mod *n*), compared
/// with the kernel's results on tmpfs (the recorded `X.expected`). Settling on a FUSE
/// mount is judged by time: a scenario that differs is replayed once more, and only a
/// difference seen twice counts.
pub fn replay_corpus(dirs: &[PathBuf]) -> CorpusRun {
    use vfscale_conformance::locks::{kernel, render_results, KernelOptions, Op, Scenario};
    let opts = KernelOptions::in_dirs(dirs);
    let mut run = CorpusRun {
        ran: 0,
        skipped: 0,
        failures: Vec::new(),
    };
    for f in lock_corpus() {
        let scn = Scenario::parse(&std::fs::read_to_string(&f).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let ofd = scn
            .steps
            .iter()
            .any(|s| matches!(&s.op, Op::Fcntl { cmd, .. } if cmd.is_ofd()));
        if ofd {
            run.skipped += 1;
            continue;
        }
        let expected = std::fs::read_to_string(f.with_extension("expected")).unwrap();
        let attempt = || match kernel::replay_with(&scn, &opts) {
            Ok(r) => {
                let got = render_results(&r);
                if got == expected {
                    Ok(())
                } else {
                    Err(format!(
                        "{}: differs from tmpfs\n--- on vfscalefs\n{got}--- on tmpfs\n{expected}",
                        f.display()
                    ))
                }
            }
            Err(e) => Err(format!("{}: {e}", f.display())),
        };
        if let Err(first) = attempt() {
            match attempt() {
                Ok(()) => say(&format!("retried (first replay differed): {first}")),
                Err(e) => {
                    let name = f.file_stem().unwrap().to_string_lossy().into_owned();
                    run.failures.push((name, e));
                }
            }
        }
        run.ran += 1;
    }
    run
}

/// Set to `io_uring` to run every server these tests start with `-o io_uring` (the
/// kernel's FUSE-over-io_uring transport; CI runs the suite once more so). A server that
/// then serves `/dev/fuse` anyway fails its test instead of passing on the other transport.
pub const TRANSPORT_VAR: &str = "VFSCALEFS_TEST_TRANSPORT";

/// Whether [`TRANSPORT_VAR`] asks for io_uring.
pub fn transport_is_io_uring() -> bool {
    std::env::var(TRANSPORT_VAR).is_ok_and(|v| v == "io_uring")
}

/// `opts` with the transport [`TRANSPORT_VAR`] asks for, unless they name one (the
/// io_uring tests do), and whether the server must then serve io_uring.
fn with_transport(opts: &str) -> (String, bool) {
    let add = transport_is_io_uring() && !opts.split(',').any(|o| o.starts_with("io_uring"));
    match (add, opts.is_empty()) {
        (false, _) => (opts.to_string(), false),
        (true, true) => ("io_uring".to_string(), true),
        (true, false) => (format!("{opts},io_uring"), true),
    }
}

/// A fresh directory under /dev/shm, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let base = if Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        };
        let p = PathBuf::from(base).join(format!(
            "vfscalefs-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn is_fuse(p: &Path) -> bool {
    nix::sys::statfs::statfs(p)
        .map(|s| s.filesystem_type().0 == FUSE_MAGIC)
        .unwrap_or(false)
}

/// How [`Mounted::launch`] starts a server.
#[derive(Default)]
pub struct Launch<'a> {
    /// Mountpoints (fresh directories; at least one).
    pub n: usize,
    /// `-o` options.
    pub opts: &'a str,
    /// More arguments (`--cluster ...`).
    pub args: &'a [String],
    /// Environment variables for the server.
    pub env: &'a [(&'a str, &'a Path)],
    /// `RLIMIT_NOFILE` (soft and hard), as by `ulimit -n`.
    pub nofile: Option<u64>,
    /// The source directory to serve (`None`: a fresh one); another server may serve it
    /// too.
    pub source: Option<&'a Path>,
    /// Where the server's stderr goes (`None`: the test's).
    pub stderr: Option<&'a Path>,
}

/// A running server with its source and mountpoints.
pub struct Mounted {
    child: Option<Child>,
    pub source: PathBuf,
    pub mounts: Vec<PathBuf>,
    dir: TempDir,
}

impl Mounted {
    /// Serves a fresh source directory on `n` fresh mountpoints with `-o opts`.
    pub fn start(n: usize, opts: &str) -> Result<Mounted, String> {
        Self::start_env(n, opts, &[])
    }

    /// As [`Mounted::start`], with environment variables for the server.
    pub fn start_env(n: usize, opts: &str, env: &[(&str, &Path)]) -> Result<Mounted, String> {
        Self::start_limited(n, opts, env, None)
    }

    /// As [`Mounted::start_env`], the server started with `RLIMIT_NOFILE` set to
    /// `nofile` (soft and hard) if given, as by `ulimit -n`.
    pub fn start_limited(
        n: usize,
        opts: &str,
        env: &[(&str, &Path)],
        nofile: Option<u64>,
    ) -> Result<Mounted, String> {
        Self::launch(&Launch {
            n,
            opts,
            env,
            nofile,
            ..Launch::default()
        })
    }

    /// A server as `how` says.
    pub fn launch(how: &Launch<'_>) -> Result<Mounted, String> {
        let dir = TempDir::new("mnt");
        let source = match how.source {
            Some(s) => s.to_owned(),
            None => {
                let source = dir.0.join("src");
                std::fs::create_dir(&source).unwrap();
                std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o777)).unwrap();
                source
            }
        };
        let mounts: Vec<PathBuf> = (0..how.n.max(1)).map(|i| dir.0.join(format!("m{i}"))).collect();
        for m in &mounts {
            std::fs::create_dir(m).unwrap();
        }
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vfscalefs"));
        cmd.arg(&source).args(&mounts).args(how.args);
        let (opts, must_use_io_uring) = with_transport(how.opts);
        if !opts.is_empty() {
            cmd.arg("-o").arg(&opts);
        }
        cmd.stdin(Stdio::null());
        if let Some(log) = how.stderr {
            let f = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
            cmd.stderr(f);
        }
        for (k, v) in how.env {
            cmd.env(k, v);
        }
        if let Some(n) = how.nofile {
            use std::os::unix::process::CommandExt as _;
            // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child
            // between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let r = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })
            };
        }
        let child = cmd.spawn().map_err(|e| format!("spawn vfscalefs: {e}"))?;
        let mut m = Mounted {
            child: Some(child),
            source,
            mounts,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !m.mounts.iter().all(|p| is_fuse(p)) {
            if let Some(st) = m.child.as_mut().unwrap().try_wait().unwrap() {
                return Err(format!("vfscalefs exited before mounting: {st}"));
            }
            if Instant::now() > deadline {
                return Err("vfscalefs did not mount within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // The queues' threads start once the mount is up.
        let deadline = Instant::now() + Duration::from_secs(5);
        while must_use_io_uring && !m.serves_io_uring() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if must_use_io_uring && !m.serves_io_uring() {
            return Err(format!(
                "{TRANSPORT_VAR}=io_uring, but the server serves /dev/fuse \
                 (is /sys/module/fuse/parameters/enable_uring Y?)"
            ));
        }
        Ok(m)
    }

    /// Whether the server runs io_uring queues (their threads are named `fuser-uring-N`).
    pub fn serves_io_uring(&self) -> bool {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{}/task", self.pid())) else {
            return false;
        };
        tasks.flatten().any(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("fuser-uring"))
        })
    }

    /// The server's pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// Sends `sig` to the server and waits up to `within` for it to exit.
    pub fn stop_with(&mut self, sig: nix::sys::signal::Signal, within: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig);
        self.wait_exit(within)
    }

    /// Sends `sig` to the server (`SIGSTOP`, `SIGCONT`, ...) and returns at once.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(c) = &self.child {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig);
        }
    }

    /// Waits up to `within` for the server to exit by itself.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                self.child = None;
                return Some(st);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether any of its mountpoints is still a FUSE mount.
    pub fn any_mounted(&self) -> bool {
        self.mounts.iter().any(|p| is_fuse(p))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A stopped server (a partition test's) takes no SIGINT until it runs again.
            self.signal(nix::sys::signal::Signal::SIGCONT);
            let _ = self.stop_with(nix::sys::signal::Signal::SIGINT, Duration::from_secs(5));
        }
        // The last resort: never leave a mount behind (one whose server died answers
        // ENOTCONN, and is still mounted).
        for p in &self.mounts {
            let dead = matches!(nix::sys::statfs::statfs(p), Err(nix::errno::Errno::ENOTCONN));
            if is_fuse(p) || dead {
                let _ = nix::mount::umount2(p.as_path(), nix::mount::MntFlags::MNT_DETACH);
            }
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The server's counters after a `SIGUSR1` (its `VFSCALEFS_STATS` line).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    /// `inodes=`: the inode table's size, the root included.
    pub inodes: u64,
    /// `lookups=`: the lookups the kernels hold.
    pub lookups: u64,
    /// `handles=`: the open files.
    pub handles: u64,
}

/// The dispatch gate's counters from the same line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DispatchStats {
    /// `dispatch_reads=`: requests the dispatch threads read.
    pub reads: u64,
    /// `dispatch_busy_reads=`: reads that found another request queued behind theirs.
    pub busy_reads: u64,
    /// `dispatch_wakes=`: parked dispatch threads woken to read.
    pub dispatch_wakes: u64,
}

/// The io_uring queues' counters from the same line, summed over the connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UringStats {
    /// `uring_parked=`: requests parked now, each holding a ring entry.
    pub parked: u64,
    /// `uring_entries=`: ring entries registered.
    pub entries: u64,
}

impl Mounted {
    /// The server's counters: sends `SIGUSR1` and reads the line it appends to `file`
    /// (the server's `VFSCALEFS_STATS`).
    pub fn stats(&self, file: &Path) -> Stats {
        let field = self.stats_line(file);
        let s = Stats {
            inodes: field("inodes"),
            lookups: field("lookups"),
            handles: field("handles"),
        };
        eprintln!("stats: {s:?}");
        s
    }

    /// The dispatch gate's counters, as [`Mounted::stats`] reads the others.
    pub fn dispatch_stats(&self, file: &Path) -> DispatchStats {
        let field = self.stats_line(file);
        DispatchStats {
            reads: field("dispatch_reads"),
            busy_reads: field("dispatch_busy_reads"),
            dispatch_wakes: field("dispatch_wakes"),
        }
    }

    /// The io_uring queues' counters, as [`Mounted::stats`] reads the others.
    pub fn uring_stats(&self, file: &Path) -> UringStats {
        let field = self.stats_line(file);
        UringStats {
            parked: field("uring_parked"),
            entries: field("uring_entries"),
        }
    }

    /// Sends `SIGUSR1`, waits for the line the server appends to `file`, and returns a
    /// reader of its `key=value` fields.
    pub fn stats_line(&self, file: &Path) -> impl Fn(&str) -> u64 {
        let before = std::fs::read_to_string(file).unwrap_or_default().lines().count();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid()),
            nix::sys::signal::Signal::SIGUSR1,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let line = loop {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            if let Some(line) = text.lines().nth(before) {
                break line.to_owned();
            }
            assert!(Instant::now() < deadline, "no stats line after SIGUSR1");
            std::thread::sleep(Duration::from_millis(10));
        };
        move |k: &str| -> u64 {
            line.split_whitespace()
                .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {k}= in the stats line {line:?}"))
        }
    }

    /// Makes the kernel forget every unused inode (`drop_caches` 2, again until it
    /// holds) and waits up to 10 s for the server's table to drain to the root: the
    /// counters last read.
    pub fn drained(&self, file: &Path) -> Stats {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            std::fs::write("/proc/sys/vm/drop_caches", b"2").unwrap();
            let s = self.stats(file);
            if (s.inodes, s.lookups) == (1, 0) || Instant::now() > deadline {
                return s;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The server's open descriptors (`/proc/PID/fd`): number and link target.
    pub fn fds(&self) -> Vec<(u32, String)> {
        let dir = format!("/proc/{}/fd", self.pid());
        let mut v: Vec<(u32, String)> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .filter_map(|e| {
                let e = e.ok()?;
                let n = e.file_name().to_str()?.parse().ok()?;
                // A descriptor closed since the listing is not open.
                let t = std::fs::read_link(e.path()).ok()?;
                Some((n, t.to_string_lossy().into_owned()))
            })
            .collect();
        v.sort();
        v
    }

    /// The server's descriptors of files under its source (the source directory itself
    /// included) or of deleted files.
    pub fn source_fds(&self) -> Vec<(u32, String)> {
        let src = self.source.to_string_lossy().into_owned();
        self.fds()
            .into_iter()
            .filter(|(_, t)| t.starts_with(&src) || t.ends_with(" (deleted)"))
            .collect()
    }
}

/// `flock(1)` on `path`, waiting for a lock another holds, interrupted by `SIGINT`
/// after `secs` seconds: it must fail, and come back within a second of the signal.
/// Returns how long it took.
pub fn flock_interrupted(path: &Path, secs: u64) -> Duration {
    let t = Instant::now();
    let out = run(Command::new("timeout")
        .args(["-s", "INT", &secs.to_string(), "flock"])
        .arg(path)
        .arg("true"));
    let took = t.elapsed();
    assert!(!out.status.success(), "the waiter got a lock that is held");
    assert!(
        took < Duration::from_secs(secs + 1),
        "timeout -s INT {secs} flock took {took:?}"
    );
    took
}

/// `sqlite3 db sql`, which must succeed: its output, trimmed.
pub fn sqlite(db: &Path, sql: &str) -> String {
    let out = run(Command::new("sqlite3").arg(db).arg(sql));
    assert!(
        out.status.success(),
        "sqlite3 {sql:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Runs `cmd`, returning its status and output; panics if it cannot start.
pub fn run(cmd: &mut Command) -> std::process::Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

/// A sqlite3 process inserting `rows` rows (`p`, i, 64 random bytes) into table `t` of
/// `db`, each its own transaction, with a busy timeout of 60 s.
pub fn sqlite_writer(db: &Path, p: usize, rows: usize) -> Child {
    let mut c = Command::new("sqlite3")
        .arg(db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sqlite3");
    let mut script = String::from(".timeout 60000\n");
    for i in 0..rows {
        script.push_str(&format!("INSERT INTO t VALUES({p}, {i}, hex(randomblob(64)));\n"));
    }
    c.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
    c
}

/// Waits for the writers of [`sqlite_writer`]: each must succeed without a word on
/// stderr.
pub fn sqlite_writers_done(children: Vec<Child>, what: &str) {
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "a writer failed ({what}): {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
