//! Scratch directories: a fresh directory per run, removed with everything in it when
//! dropped, so that a run never sees another's files and leaves none behind.

use std::io;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A fresh directory `<parent>/<prefix>.<pid>.<n>` (mode 0700), removed with everything
/// in it on drop.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// Makes a fresh directory under `parent`. The name is unique among live
    /// processes; a stale one left by a process that had the same pid only costs
    /// another try.
    pub fn create(parent: &Path, prefix: &str) -> io::Result<ScratchDir> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        for _ in 0..100 {
            let path = parent.join(format!(
                "{prefix}.{}.{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(ScratchDir { path }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("cannot create a directory in {}: {e}", parent.display()),
                    ))
                }
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "cannot create a fresh directory in {}: all names taken",
                parent.display()
            ),
        ))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Creates the empty file `name` (mode 0600; it must not exist); its path.
    pub fn create_file(&self, name: &str) -> io::Result<PathBuf> {
        let path = self.path.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot create {}: {e}", path.display())))?;
        Ok(path)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// `Ok` when `dir` is on tmpfs.
pub fn check_tmpfs(dir: &Path) -> io::Result<()> {
    let fs = nix::sys::statfs::statfs(dir).map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("statfs {}: {e}", dir.display()),
        )
    })?;
    if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
        return Err(io::Error::other(format!(
            "{} is not on tmpfs (filesystem type {:#x})",
            dir.display(),
            fs.filesystem_type().0
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scratch_directory_is_fresh_and_removed_on_drop() {
        let parent = std::env::temp_dir();
        let a = ScratchDir::create(&parent, "vfscale-harness-test").unwrap();
        let b = ScratchDir::create(&parent, "vfscale-harness-test").unwrap();
        assert_ne!(a.path(), b.path());
        let f = a.create_file("f0").unwrap();
        assert!(f.is_file());
        assert!(a.create_file("f0").is_err(), "a file is created only once");
        let path = a.path().to_path_buf();
        drop(a);
        assert!(!path.exists());
    }
}
