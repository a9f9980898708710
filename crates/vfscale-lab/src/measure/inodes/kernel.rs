//! The `kernel` target: the same phases as real system calls on a private tmpfs directory
//! (or `--dir`), one thread per task, each in its own subdirectory. The cold walk is
//! skipped: tmpfs keeps every inode in memory (its dentries pin them), so there is no
//! cache to drop.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use crate::measure::{Sample, Skip, SHM_DIR, SKIP_PREFIX};

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

/// Removes the scratch directory when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn phase(p: &str, dir: &Path, files: u64) -> Result<(), Skip> {
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
            }
        }
        _ => {}
    }
    Ok(())
}

/// Runs the phases with `tasks` threads and `files` files each.
pub fn run(tasks: usize, files: u64, phases: &[&str], dir: Option<&Path>) -> Result<Sample, Skip> {
    let base = dir.unwrap_or(Path::new(SHM_DIR));
    let root = base.join(format!(
        "vfscale-inodes.{}.{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    std::fs::create_dir(&root).map_err(|e| Skip(format!("mkdir {}: {e}", root.display())))?;
    let _scratch = Scratch(root.clone());
    let dirs: Vec<PathBuf> = (0..tasks).map(|t| root.join(format!("d{t}"))).collect();
    for d in &dirs {
        std::fs::create_dir(d).map_err(|e| Skip(format!("mkdir {}: {e}", d.display())))?;
    }
    let kernel_phases: Vec<&str> = ["create", "walk", "chmod", "unlink"].into_iter().collect();
    let start = Arc::new(Barrier::new(tasks + 1));
    let end = Arc::new(Barrier::new(tasks + 1));
    let mut s = Sample::new();
    let mut failed: Option<Skip> = None;
    std::thread::scope(|scope| {
        let hs: Vec<_> = dirs
            .iter()
            .map(|d| {
                let (start, end, kp) = (start.clone(), end.clone(), kernel_phases.clone());
                scope.spawn(move || {
                    let mut err = None;
                    for p in kp {
                        start.wait();
                        if err.is_none() {
                            err = phase(p, d, files).err();
                        }
                        end.wait();
                    }
                    err
                })
            })
            .collect();
        for p in &kernel_phases {
            start.wait();
            let t0 = Instant::now();
            end.wait();
            let secs = t0.elapsed().as_secs_f64();
            s.insert(
                format!("{p}/ops_per_sec"),
                (files * tasks as u64) as f64 / secs.max(1e-9),
            );
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
    if phases.contains(&"cold-walk") {
        s.insert(
            format!("{SKIP_PREFIX}cold-walk: tmpfs pins its inodes (no cache to drop)"),
            0.0,
        );
    }
    let _ = dir;
    Ok(s)
}
