//! One vfscalefs server the cluster workload starts: a child process serving a source
//! directory on one mountpoint, its stderr in a log file, stopped (and its mountpoint
//! unmounted) on drop, whatever state it is in.

use std::fs::File;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to mount, and to unmount and exit after `SIGTERM`.
const START_TIMEOUT: Duration = Duration::from_secs(20);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The vfscalefs binary: `$VFSCALEFS` when set, else the one next to this executable
/// (`target/release/vfscalefs` next to `vfscale`, as the lab's scripts find it; a test
/// binary in `deps/` looks one level up).
pub fn binary() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("VFSCALEFS") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("VFSCALEFS={}: no such file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("where is this program: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let mut candidates = vec![dir.join("vfscalefs")];
    if dir.file_name().is_some_and(|n| n == "deps") {
        candidates.extend(dir.parent().map(|p| p.join("vfscalefs")));
    }
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        format!(
            "no vfscalefs next to {} (build it: cargo build --release -p vfscalefs)",
            exe.display()
        )
    })
}

/// Whether `bin --help` lists `flag`: a vfscalefs built before a flag existed is said
/// so, not started with an argument it refuses.
pub fn has_flag(bin: &Path, flag: &str) -> Result<bool, String> {
    let out = Command::new(bin)
        .arg("--help")
        .output()
        .map_err(|e| format!("{} --help: {e}", bin.display()))?;
    Ok(String::from_utf8_lossy(&out.stdout).contains(flag))
}

/// A running server.
pub struct Server {
    /// A name for messages (`a`, `b`, `single`).
    pub name: String,
    mnt: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Server {
    /// Starts `bin SOURCE MNT ARGS...` with its stderr in `log`, and waits until MNT is
    /// mounted. The server gets `SIGTERM` (it unmounts and exits) if the thread that
    /// started it dies, so an interrupted lab leaves no server behind.
    pub fn start(
        name: &str,
        bin: &Path,
        source: &Path,
        mnt: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<Server, String> {
        let err = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.arg(source)
            .arg(mnt)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| format!("start {}: {e}", bin.display()))?;
        let mut s = Server {
            name: name.to_string(),
            mnt: mnt.to_path_buf(),
            log: log.to_path_buf(),
            child: Some(child),
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if mounted(mnt) {
                return Ok(s);
            }
            let exited = s.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                s.child = None;
                return Err(format!("server {name} exited ({status}): {}", s.log_tail()));
            }
            if crate::measure::interrupt::interrupted() {
                return Err("interrupted".into());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "server {name} did not mount {} within {START_TIMEOUT:?}: {}",
                    mnt.display(),
                    s.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The mountpoint.
    pub fn mnt(&self) -> &Path {
        &self.mnt
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The last lines of its log, for an error message.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(5)..].join(" | ");
        if tail.is_empty() {
            format!("(nothing in {})", self.log.display())
        } else {
            tail
        }
    }

    /// `SIGKILL`s the server (a crash: it leaves nothing, its lease runs out) and
    /// detaches its dead mount.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        unmount(&self.mnt);
    }

    /// Stops the server in order (`SIGTERM`: it unmounts and leaves the cluster); one
    /// that does not exit in time is killed. The mountpoint is unmounted either way.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child, which is not reaped yet.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + STOP_TIMEOUT;
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        unmount(&self.mnt);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether `mnt` is a mountpoint now (`/proc/self/mountinfo`, field 5).
pub fn mounted(mnt: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = mnt.to_string_lossy();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|p| unescape_mountinfo(p) == want)
}

/// A mountinfo path with its octal escapes (`\040` for a space) decoded.
fn unescape_mountinfo(p: &str) -> String {
    let mut out = Vec::with_capacity(p.len());
    let b = p.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            let digits = std::str::from_utf8(&b[i + 1..i + 4]).ok();
            if let Some(v) = digits.and_then(|d| u8::from_str_radix(d, 8).ok()) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Detaches whatever is mounted on `mnt` (lazily: a dead server's mount answers
/// `ENOTCONN` until then).
pub fn unmount(mnt: &Path) {
    use std::os::unix::ffi::OsStrExt as _;
    let Ok(c) = std::ffi::CString::new(mnt.as_os_str().as_bytes()) else {
        return;
    };
    while mounted(mnt) {
        // SAFETY: a NUL-terminated path; umount2 reads it only.
        if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo("/dev/shm/a\\040b"), "/dev/shm/a b");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
        assert_eq!(unescape_mountinfo("/end\\"), "/end\\");
    }

    #[test]
    fn the_root_is_mounted_and_a_fresh_directory_is_not() {
        assert!(mounted(Path::new("/")));
        assert!(!mounted(
            &std::env::temp_dir().join("vfscale-surely-not-a-mountpoint")
        ));
    }
}
