//! Measures the lock service's two paths in one process over the in-memory directory:
//! the home-here path against `vfscale-locks` alone (per-thread inodes, F_SETLK and
//! unlock), and one member's calls to a remote home over loopback.
//!
//! `cargo run --release -p vfscale-cluster --example cluster_paths [THREADS] [SECS]`;
//! `... cluster_paths 1 0 plain|cluster N` runs N operations of one path on one thread
//! and exits (for `perf stat -e instructions`: the difference of two N over their
//! difference is the instructions per operation, immune to a busy machine).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use vfscale_cluster::memdir::MemCluster;
use vfscale_cluster::{ClusterFile, ClusterLocks, ClusterProcess, Directory, InodeId};
use vfscale_locks::{
    AccessMode, FcntlCmd, FileLockContext, Flock, InodeKey, LockManager, LockType, OpenFile, Process,
};

static ERRORS: AtomicU64 = AtomicU64::new(0);

/// Even operations lock, odd ones unlock.
fn lock_or_unlock(n: u64) -> LockType {
    if n.is_multiple_of(2) {
        LockType::Write
    } else {
        LockType::Unlock
    }
}

/// One fcntl call of `owner` (its own file, pid = owner) on `ino`, waited for;
/// failures are counted.
fn call_and_wait(m: &ClusterLocks, ino: u64, owner: u64, cmd: FcntlCmd, fl: Flock) {
    let (tx, rx) = mpsc::sync_channel(1);
    let _ = m.fcntl(
        InodeId(ino),
        ClusterProcess {
            owner,
            pid: owner as i32,
        },
        ClusterFile {
            id: owner,
            mode: AccessMode::ReadWrite,
        },
        cmd,
        fl,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    if rx.recv().unwrap().is_err() {
        ERRORS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Lock and unlock per second over `threads` threads, each on its own inode.
fn run(threads: usize, secs: f64, op: impl Fn(u64, u64) + Sync) -> f64 {
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..threads {
            let (stop, total, op) = (&stop, &total, &op);
            s.spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..256 {
                        op(t as u64, n);
                        n += 1;
                    }
                }
                total.fetch_add(n, Ordering::Relaxed);
            });
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
    });
    total.load(Ordering::Relaxed) as f64 / secs
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2);
    let secs: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2.0);

    // vfscale-locks alone, each inode's context found in a table as a server does.
    let mgr = LockManager::new();
    let table: RwLock<HashMap<u64, Arc<FileLockContext>>> = RwLock::new(
        (0..threads as u64)
            .map(|i| {
                (
                    1000 + i,
                    FileLockContext::new(
                        &mgr,
                        InodeKey {
                            major: 0,
                            minor: 0,
                            ino: 1000 + i,
                        },
                    ),
                )
            })
            .collect(),
    );
    let plain = |t: u64, n: u64| {
        let ctx = table.read().get(&(1000 + t)).cloned().unwrap();
        let who = Process::new(t as u32 + 1);
        let f = OpenFile::new(t + 1, AccessMode::ReadWrite);
        let ty = lock_or_unlock(n);
        if ctx
            .fcntl(who, f, FcntlCmd::SetLk, &mut Flock::new(ty, 0, 1))
            .is_err()
        {
            ERRORS.fetch_add(1, Ordering::Relaxed);
        }
    };

    let mem = MemCluster::new();
    let join = |name: &'static str| {
        let c = mem.clone();
        ClusterLocks::with_directory("127.0.0.1:0".parse().unwrap(), move |addr| async move {
            Ok(c.join(name, addr) as Arc<dyn Directory>)
        })
        .unwrap()
    };
    let (a, b) = (join("a"), join("b"));
    let cluster = |t: u64, n: u64| {
        let ty = lock_or_unlock(n);
        let _ = a.fcntl(
            InodeId(1000 + t),
            ClusterProcess {
                owner: t + 1,
                pid: t as i32 + 1,
            },
            ClusterFile {
                id: t + 1,
                mode: AccessMode::ReadWrite,
            },
            FcntlCmd::SetLk,
            Flock::new(ty, 0, 1),
            Box::new(|r| {
                if r.is_err() {
                    ERRORS.fetch_add(1, Ordering::Relaxed);
                }
            }),
        );
    };
    // Claim every inode at A first (the first call of each goes through the runtime).
    for t in 0..threads as u64 {
        cluster(t, 1);
    }
    std::thread::sleep(Duration::from_millis(100));

    if let (Some(which), Some(n)) = (args.get(3), args.get(4).and_then(|s| s.parse::<u64>().ok())) {
        for i in 0..n {
            match which.as_str() {
                "plain" => plain(0, i),
                _ => cluster(0, i),
            }
        }
        println!(
            "{which}: {n} operations, errors {}",
            ERRORS.load(Ordering::Relaxed)
        );
        return;
    }

    println!("threads {threads}, {secs} s per run, paired runs (plain, cluster):");
    let mut ratios = Vec::new();
    for _ in 0..3 {
        let p = run(threads, secs, plain);
        let c = run(threads, secs, cluster);
        println!("  plain {:>12.0}/s  cluster {:>12.0}/s  ratio {:.3}", p, c, c / p);
        ratios.push(c / p);
    }
    ratios.sort_by(|x, y| x.partial_cmp(y).unwrap());
    println!("home-here ratio, median of 3: {:.3}", ratios[1]);

    // B's calls to A's home, one at a time (each waits for its answer).
    let remote_ino = 5000;
    let serial = |m: &ClusterLocks, owner: u64, n: u64| {
        call_and_wait(
            m,
            remote_ino,
            owner,
            FcntlCmd::SetLk,
            Flock::new(lock_or_unlock(n), owner as i64 * 10, 1),
        )
    };
    serial(&a, 1, 0); // home A
    let lat = Mutex::new(Vec::new());
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs_f64(secs) {
        let t = Instant::now();
        serial(&b, 2, n);
        lat.lock().push(t.elapsed());
        n += 1;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let mut l = lat.into_inner();
    l.sort();
    println!(
        "remote calls (one at a time): {:.0}/s, p50 {:?}, p99 {:?}",
        rate,
        l[l.len() / 2],
        l[l.len() * 99 / 100]
    );
    // Samba's ping_pong (3 one-byte locks, F_SETLKW) with one process on each member:
    // lock i+1, unlock i; the home is A.
    let pp_ino = 6000;
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let blocking = |m: &ClusterLocks, owner: u64, ty: LockType, at: i64| {
        call_and_wait(m, pp_ino, owner, FcntlCmd::SetLkW, Flock::new(ty, at, 1))
    };
    blocking(&a, 77, LockType::Unlock, 0); // home A
    let start = Instant::now();
    std::thread::scope(|s| {
        for (m, owner) in [(&a, 71u64), (&b, 72u64)] {
            let (stop, total, blocking) = (&stop, &total, &blocking);
            s.spawn(move || {
                let mut i = 0i64;
                blocking(m, owner, LockType::Write, 0);
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    blocking(m, owner, LockType::Write, (i + 1) % 3);
                    blocking(m, owner, LockType::Unlock, i % 3);
                    i += 1;
                    n += 1;
                }
                blocking(m, owner, LockType::Unlock, i % 3);
                total.fetch_add(n, Ordering::Relaxed);
            });
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
    });
    println!(
        "ping_pong across two members (home on one): {:.0} locks/s",
        total.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
    );
    println!("errors: {}", ERRORS.load(Ordering::Relaxed));
    let s = b.stats();
    println!(
        "B: remote_calls {} local_calls {}; A: {:?}",
        s.remote_calls,
        s.local_calls,
        a.stats()
    );
}
