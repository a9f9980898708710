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
        let dir = TempDir::new("mnt");
        let source = dir.0.join("src");
        std::fs::create_dir(&source).unwrap();
        std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o777)).unwrap();
        let mounts: Vec<PathBuf> = (0..n).map(|i| dir.0.join(format!("m{i}"))).collect();
        for m in &mounts {
            std::fs::create_dir(m).unwrap();
        }
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vfscalefs"));
        cmd.arg(&source).args(&mounts);
        if !opts.is_empty() {
            cmd.arg("-o").arg(opts);
        }
        cmd.stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
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
        Ok(m)
    }

    /// The server's pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// Sends `sig` to the server and waits up to `within` for it to exit.
    pub fn stop_with(&mut self, sig: nix::sys::signal::Signal, within: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig);
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
            let _ = self.stop_with(nix::sys::signal::Signal::SIGINT, Duration::from_secs(5));
        }
        // The last resort: never leave a mount behind.
        for p in &self.mounts {
            if is_fuse(p) {
                let _ = nix::mount::umount2(p.as_path(), nix::mount::MntFlags::MNT_DETACH);
            }
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `cmd`, returning its status and output; panics if it cannot start.
pub fn run(cmd: &mut Command) -> std::process::Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}
