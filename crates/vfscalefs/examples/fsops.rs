//! Metadata and streaming throughput of a directory, for comparing filesystems (vfscalefs,
//! bindfs, tmpfs): `cargo run --release -p vfscalefs --example fsops -- DIR THREADS FILES MIB`.
//!
//! Each of THREADS threads works in its own subdirectory of DIR: it creates FILES empty
//! files, `stat`s each, unlinks each (each phase timed from a common start to the last
//! thread's end), then writes a MIB MiB file sequentially in 1 MiB writes and `fsync`s
//! it, drops it from the page cache (`posix_fadvise(DONTNEED)`, and of the source where
//! the filesystem passes through), and reads it back. Prints one line per phase:
//! `phase threads value unit`.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn phase(threads: usize, dirs: &[PathBuf], f: impl Fn(&Path) + Sync) -> Duration {
    let barrier = Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for d in dirs {
            let (barrier, f) = (&barrier, &f);
            s.spawn(move || {
                barrier.wait();
                f(d);
            });
        }
        barrier.wait();
        let t = Instant::now();
        // Scope end joins every thread.
        t
    })
    .elapsed()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        eprintln!("usage: fsops DIR THREADS FILES MIB");
        std::process::exit(2);
    }
    let base = PathBuf::from(&args[1]);
    let threads: usize = args[2].parse().expect("THREADS");
    let files: usize = args[3].parse().expect("FILES");
    let mib: usize = args[4].parse().expect("MIB");
    let root = base.join(format!("fsops-{}", std::process::id()));
    let dirs: Vec<PathBuf> = (0..threads).map(|t| root.join(format!("t{t}"))).collect();
    for d in &dirs {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    let names: Arc<Vec<CString>> = Arc::new(
        (0..files)
            .map(|i| CString::new(format!("f{i:07}")).unwrap())
            .collect(),
    );
    let n = (threads * files) as f64;

    let cpath = |d: &Path, name: &CString| {
        let mut p = d.as_os_str().as_bytes().to_vec();
        p.push(b'/');
        p.extend_from_slice(name.as_bytes());
        CString::new(p).unwrap()
    };
    let t = phase(threads, &dirs, |d| {
        for name in names.iter() {
            let p = cpath(d, name);
            // SAFETY: a NUL-terminated path; the descriptor is closed at once.
            let fd = unsafe {
                libc::open(
                    p.as_ptr(),
                    libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o644,
                )
            };
            assert!(fd >= 0, "create: {}", std::io::Error::last_os_error());
            // SAFETY: ours.
            unsafe { libc::close(fd) };
        }
    });
    println!("create {threads} {:.0} ops/s", n / t.as_secs_f64());
    let t = phase(threads, &dirs, |d| {
        for name in names.iter() {
            let p = cpath(d, name);
            // SAFETY: a NUL-terminated path and a stat buffer.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            assert_eq!(unsafe { libc::stat(p.as_ptr(), &mut st) }, 0);
        }
    });
    println!("stat {threads} {:.0} ops/s", n / t.as_secs_f64());
    let t = phase(threads, &dirs, |d| {
        for name in names.iter() {
            let p = cpath(d, name);
            // SAFETY: a NUL-terminated path.
            assert_eq!(unsafe { libc::unlink(p.as_ptr()) }, 0);
        }
    });
    println!("unlink {threads} {:.0} ops/s", n / t.as_secs_f64());

    let block = vec![0x5au8; 1 << 20];
    let bytes = (threads * mib) as f64 * 1048576.0;
    let t = phase(threads, &dirs, |d| {
        let mut f = std::fs::File::create(d.join("big")).expect("create big");
        for _ in 0..mib {
            f.write_all(&block).expect("write");
        }
        f.sync_all().expect("fsync");
    });
    println!(
        "seq-write {threads} {:.0} MiB/s",
        bytes / 1048576.0 / t.as_secs_f64()
    );
    for d in &dirs {
        let f = std::fs::File::open(d.join("big")).unwrap();
        // SAFETY: advice on a descriptor we hold.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    let t = phase(threads, &dirs, |d| {
        let mut f = std::fs::File::open(d.join("big")).expect("open big");
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0;
        loop {
            let k = f.read(&mut buf).expect("read");
            if k == 0 {
                break;
            }
            total += k;
        }
        assert_eq!(total, mib << 20);
    });
    println!(
        "seq-read {threads} {:.0} MiB/s",
        bytes / 1048576.0 / t.as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&root);
}
