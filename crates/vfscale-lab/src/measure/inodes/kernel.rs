//! The kernel targets: the same phases as real system calls, one thread per task, each in
//! its own subdirectory.
//!
//! * `kernel`: a private tmpfs directory (or `--dir`). On tmpfs the cold walk is skipped:
//!   tmpfs keeps every inode in memory (its dentries pin them), so there is no cache to
//!   drop. On another filesystem given by `--dir` (a FUSE mount, say) it runs, as root,
//!   as `kernel-ext4`'s does.
//! * `kernel-ext4`: ext4 made by `mkfs.ext4` on a loop device the lab sets up and tears
//!   down itself (backing file on tmpfs, 256 MiB journal), under an exclusive `flock` on
//!   `/dev/loop-control` as every vfscale user of loop devices takes it. Its cold walk
//!   drops the kernel's caches (`sync`, `/proc/sys/vm/drop_caches` = 3) and then every
//!   task walks every task's directory in the same order.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use vfscale_conformance::harness::ScratchDir;

use crate::measure::{Sample, Skip, SHM_DIR};

/// Whether the tmpfs scratch directory can be used.
pub fn available() -> Result<(), Skip> {
    let p = Path::new(SHM_DIR);
    if !p.is_dir() {
        return Err(Skip(format!("{SHM_DIR} is missing")));
    }
    Ok(())
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in scratch paths")
}

fn errno_skip(what: &str, p: &Path) -> Skip {
    Skip(format!(
        "{what} {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    ))
}

/// Task `t`'s part of phase `p` in its directory `dir`; each operation done ticks `span`.
fn phase(
    p: &str,
    dir: &Path,
    files: u64,
    all: &[PathBuf],
    (span, t): (&super::Span, usize),
) -> Result<(), Skip> {
    match p {
        "create" => {
            for i in 0..files {
                let f = cpath(&dir.join(format!("f{i}")));
                // SAFETY: a valid C path; the descriptor is closed at once.
                let fd = unsafe {
                    libc::open(
                        f.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o644,
                    )
                };
                if fd < 0 {
                    return Err(errno_skip("create in", dir));
                }
                // SAFETY: our own descriptor.
                unsafe { libc::close(fd) };
                span.tick(t);
            }
        }
        "cold-walk" => {
            for d in all {
                phase("walk", d, files, &[], (span, t))?;
            }
        }
        "walk" | "chmod" | "unlink" => {
            let names: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|e| Skip(format!("readdir {}: {e}", dir.display())))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect();
            for n in names {
                let c = cpath(&n);
                // SAFETY: valid C paths; `st` is written by the kernel.
                let r = unsafe {
                    match p {
                        "walk" => {
                            let mut st: libc::stat = std::mem::zeroed();
                            libc::lstat(c.as_ptr(), &mut st)
                        }
                        "chmod" => libc::chmod(c.as_ptr(), 0o600),
                        _ => libc::unlink(c.as_ptr()),
                    }
                };
                if r != 0 {
                    return Err(errno_skip(p, &n));
                }
                span.tick(t);
            }
        }
        _ => {}
    }
    Ok(())
}

/// Runs the phases with `tasks` threads and `files` files each: `warmup` untimed passes,
/// then the measured one, each in a fresh directory.
pub fn run(
    tasks: usize,
    files: u64,
    phases: &[&str],
    dir: Option<&Path>,
    warmup: usize,
) -> Result<Sample, Skip> {
    let base = dir.unwrap_or(Path::new(SHM_DIR));
    // Another filesystem (`--dir`) has a cache to drop, unless it is tmpfs; its warm-up
    // is at most 100,000 files a task: it warms this process (a kernel target's heap is
    // one readdir buffer), and a million files through FUSE would double a run.
    let cold = dir.is_some() && can_drop_caches() && !is_tmpfs(base);
    let warm_files = if dir.is_some() { files.min(100_000) } else { files };
    for _ in 0..warmup {
        run_in(tasks, warm_files, phases, base, cold)?;
    }
    run_in(tasks, files, phases, base, cold)
}

/// Whether `p` is on tmpfs, which pins its inodes (nothing to drop).
fn is_tmpfs(p: &Path) -> bool {
    nix::sys::statfs::statfs(p).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

/// Whether this process may drop the kernel's caches (root).
fn can_drop_caches() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    (unsafe { libc::geteuid() }) == 0
}

/// Runs the phases in a fresh directory under `base`; `drop_caches`: also the cold walk,
/// after dropping the kernel's caches.
fn run_in(tasks: usize, files: u64, phases: &[&str], base: &Path, drop_caches: bool) -> Result<Sample, Skip> {
    let scratch = ScratchDir::create(base, "vfscale-inodes")?;
    let root = scratch.path();
    let dirs: Vec<PathBuf> = (0..tasks).map(|t| root.join(format!("d{t}"))).collect();
    for d in &dirs {
        std::fs::create_dir(d).map_err(|e| Skip(format!("mkdir {}: {e}", d.display())))?;
    }
    let kernel_phases: Vec<&str> = if drop_caches {
        vec!["create", "walk", "chmod", "cold-walk", "unlink"]
    } else {
        vec!["create", "walk", "chmod", "unlink"]
    };
    let dirs = &dirs;
    let start = Arc::new(Barrier::new(tasks + 1));
    let end = Arc::new(Barrier::new(tasks + 1));
    let span = Arc::new(super::Span::new(tasks));
    let gates = Arc::new(super::phase_gates());
    let mut s = Sample::new();
    let mut failed: Option<Skip> = None;
    std::thread::scope(|scope| {
        let hs: Vec<_> = dirs
            .iter()
            .enumerate()
            .map(|(t, d)| {
                let (start, end, kp, span, gates) = (
                    start.clone(),
                    end.clone(),
                    kernel_phases.clone(),
                    span.clone(),
                    gates.clone(),
                );
                scope.spawn(move || {
                    let mut err = None;
                    for (k, p) in kp.into_iter().enumerate() {
                        start.wait();
                        gates[k].arrive_and_spin();
                        let a = super::Span::start();
                        if err.is_none() {
                            err = phase(p, d, files, dirs, (&span, t)).err();
                        }
                        span.record(a);
                        end.wait();
                    }
                    err
                })
            })
            .collect();
        for (k, p) in kernel_phases.iter().enumerate() {
            if *p == "cold-walk" {
                if let Err(e) = drop_kernel_caches() {
                    failed.get_or_insert(e);
                }
            }
            start.wait();
            super::open_phase(&gates[k], dirs.len());
            end.wait();
            let per_task = if *p == "cold-walk" {
                files * tasks as u64
            } else {
                files
            };
            span.finish(p, tasks, per_task * tasks as u64, &mut s);
        }
        for h in hs {
            if let Some(e) = h.join().expect("an inodes task panicked") {
                failed.get_or_insert(e);
            }
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    if phases.contains(&"cold-walk") && !drop_caches {
        s.skip("cold-walk: tmpfs pins its inodes (no cache to drop)".into());
    }
    Ok(s)
}

/// `sync` and `echo 3 > /proc/sys/vm/drop_caches` (root only).
fn drop_kernel_caches() -> Result<(), Skip> {
    // SAFETY: sync takes no arguments.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(|e| Skip(format!("drop_caches: {e}")))
}

fn tool(name: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
}

/// Whether ext4 on a loop device can be set up here.
pub fn available_ext4() -> Result<(), Skip> {
    // SAFETY: geteuid has no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Skip(
            "kernel-ext4 needs root (loop devices, mount, drop_caches)".into(),
        ));
    }
    for t in ["mkfs.ext4", "losetup"] {
        if tool(t).is_none() {
            return Err(Skip(format!("kernel-ext4 needs {t} (e2fsprogs, util-linux)")));
        }
    }
    if !Path::new("/dev/loop-control").exists() {
        return Err(Skip("kernel-ext4 needs /dev/loop-control".into()));
    }
    available()
}

fn command(args: &[&str]) -> Result<String, Skip> {
    let bin = tool(args[0]).ok_or_else(|| Skip(format!("{} is missing", args[0])))?;
    let out = std::process::Command::new(bin)
        .args(&args[1..])
        .output()
        .map_err(|e| Skip(format!("{}: {e}", args[0])))?;
    if !out.status.success() {
        return Err(Skip(format!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The ext4 setup, undone in reverse order when dropped: the `/dev/loop-control` lock,
/// the backing file, the loop device, the mount.
struct Ext4 {
    ctl: Option<std::fs::File>,
    backing: PathBuf,
    dev: Option<String>,
    mnt: PathBuf,
    mounted: bool,
}

impl Drop for Ext4 {
    fn drop(&mut self) {
        if self.mounted {
            let m = cpath(&self.mnt);
            // A mount can be busy for a moment (another process scanning /dev/shm, say):
            // retry, then detach it lazily (the kernel finishes the unmount when it is no
            // longer busy, and the loop device, cleared below, auto-clears then).
            let mut done = false;
            for _ in 0..50 {
                // SAFETY: a valid C path.
                if unsafe { libc::umount2(m.as_ptr(), 0) } == 0 {
                    done = true;
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            if !done {
                // SAFETY: as above.
                unsafe { libc::umount2(m.as_ptr(), libc::MNT_DETACH) };
            }
        }
        if let Some(d) = &self.dev {
            let _ = command(&["losetup", "-d", d]);
        }
        let _ = std::fs::remove_dir(&self.mnt);
        let _ = std::fs::remove_file(&self.backing);
        drop(self.ctl.take()); // releases the flock last
    }
}

/// `kernel-ext4`: sets up ext4 on a loop device, runs `warmup` untimed passes and then
/// the measured one on it (each in a fresh directory), tears it down.
pub fn run_ext4(tasks: usize, files: u64, phases: &[&str], warmup: usize) -> Result<Sample, Skip> {
    use std::os::fd::AsRawFd;
    let ctl =
        std::fs::File::open("/dev/loop-control").map_err(|e| Skip(format!("/dev/loop-control: {e}")))?;
    // SAFETY: our own descriptor; LOCK_EX waits for other loop-device users to finish.
    if unsafe { libc::flock(ctl.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(Skip(format!(
            "flock /dev/loop-control: {}",
            std::io::Error::last_os_error()
        )));
    }
    let tag = format!("{}.{}", std::process::id(), Instant::now().elapsed().as_nanos());
    let mut fs = Ext4 {
        ctl: Some(ctl),
        backing: Path::new(SHM_DIR).join(format!("vfscale-inodes-ext4.{tag}.img")),
        dev: None,
        mnt: Path::new(SHM_DIR).join(format!("vfscale-inodes-ext4.{tag}.mnt")),
        mounted: false,
    };
    // Room for every inode (256 bytes each) and a 256 MiB journal.
    let inodes = (tasks as u64 * files + 1024) * 5 / 4;
    let size = 512 * 1024 * 1024 + inodes * 4096;
    let f = std::fs::File::create(&fs.backing).map_err(|e| Skip(format!("{}: {e}", fs.backing.display())))?;
    f.set_len(size)
        .map_err(|e| Skip(format!("{}: {e}", fs.backing.display())))?;
    drop(f);
    let backing = fs.backing.to_string_lossy().into_owned();
    fs.dev = Some(command(&["losetup", "--find", "--show", &backing])?);
    let dev = fs.dev.clone().expect("set");
    command(&[
        "mkfs.ext4",
        "-q",
        "-F",
        "-N",
        &inodes.to_string(),
        "-J",
        "size=256",
        "-E",
        "lazy_itable_init=0,lazy_journal_init=0",
        &dev,
    ])?;
    std::fs::create_dir(&fs.mnt).map_err(|e| Skip(format!("mkdir {}: {e}", fs.mnt.display())))?;
    let (d, m, t) = (
        cpath(Path::new(&dev)),
        cpath(&fs.mnt),
        CString::new("ext4").expect("no NUL"),
    );
    // SAFETY: valid C strings; no mount data.
    if unsafe { libc::mount(d.as_ptr(), m.as_ptr(), t.as_ptr(), 0, std::ptr::null()) } != 0 {
        return Err(Skip(format!("mount {dev}: {}", std::io::Error::last_os_error())));
    }
    fs.mounted = true;
    let mnt = fs.mnt.clone();
    let mut r = Err(Skip("no pass ran".into()));
    for _ in 0..=warmup {
        r = run_in(tasks, files, phases, &mnt, true);
        if r.is_err() {
            break;
        }
    }
    drop(fs);
    r
}
