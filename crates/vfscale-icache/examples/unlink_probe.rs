//! A probe of the lab's unlink phase (`vfscale bench inodes`): each thread creates `files`
//! inodes, the cache is dropped and the inodes are loaded again (by every thread in
//! lockstep, as the lab's cold walk does, or each thread its own), then each thread
//! unlinks its own inodes (timed). Rounds alternate 1 and 2 threads. Besides the rates it
//! prints each thread's time on a CPU per unlink (`CLOCK_THREAD_CPUTIME_ID`) and, at 2
//! threads, the share of the phase the threads spent off a CPU: on a noisy 2-vCPU guest
//! those separate "more work per unlink" (cache lines shared between the threads) from
//! "waiting" (sleeps on a lock), where the rates alone move by 30% between rounds.
//!
//! `cargo run --release -p vfscale-icache --example unlink_probe -- [files] [rounds] [mode]`
//!
//! `mode`: `lockstep` (the lab: both threads look up every inode in the same order, so
//! about half of a thread's inodes are allocated and listed by the other), `own` (each
//! thread loads its own), `none` (no drop: the inodes its create left). With `names` in
//! the mode (`lockstep,names`) the threads also keep the lab's name maps (a `String` per
//! file, removed in unlink, in the map's order).
//!
//! `PROBE_THREADS=1|2`: only those rounds; `PROBE_VERBOSE=1`: each thread's times;
//! `PROBE_SHARDS=N`: the cache's shard count (`Settings::shards`);
//! `PROBE_PERF_CTL=FIFO`: a profile of the unlink phases alone, with
//! `perf record -D -1 --control=fifo:FIFO ...`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use vfscale_icache::{Iget, InodeCache, Settings, SuperBlock, SuperOperations};

struct Fs;

impl SuperOperations for Fs {
    type Data = [AtomicU32; 4];
    fn alloc_inode(&self, _ino: u64) -> [AtomicU32; 4] {
        Default::default()
    }
}

fn get(sb: &SuperBlock<Fs>, ino: u64) {
    match sb.iget_locked(ino).expect("not I_CREATING") {
        Iget::Cached(r) => drop(r),
        Iget::New(n) => {
            n.data()[0].store(1, Ordering::Relaxed);
            drop(n.unlock_new_inode());
        }
    }
}

/// One round's unlink phase: its rate over the slowest thread (M ops/s), and per thread
/// the seconds on the clock and on a CPU (`CLOCK_THREAD_CPUTIME_ID`).
struct Round {
    rate: f64,
    wall: Vec<f64>,
    on_cpu: Vec<f64>,
}

/// One round with `threads` threads.
fn round(threads: usize, files: u64, load: &str, names: bool) -> Round {
    let cache = InodeCache::new(Settings {
        hash_bits: (64 - (threads as u64 * files).leading_zeros()).clamp(10, 22),
        // PROBE_SHARDS=1: one superblock-list and LRU shard, whose lock lines every unlink
        // of either thread takes (what the lockstep cold walk does to half of them).
        shards: std::env::var("PROBE_SHARDS").map_or(0, |v| v.parse().expect("PROBE_SHARDS")),
        ..Settings::default()
    });
    let sb = Arc::new(cache.mount(Fs));
    // This thread takes its counter slot (and so its shard) before any worker exists: it
    // drops the cache below (`evict_inodes`), and a slot it first took there, after the
    // first round's worker had slot 0, was slot 1, so that the workers of every later
    // 2-thread round had slots 0 and 2, one shard with 2 shards (nothing foreign in
    // `lockstep`, and both on the same shard locks). An empty walk claims it.
    sb.evict_inodes();
    let bar = Arc::new(Barrier::new(threads + 1));
    let secs = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let (sb, bar) = (sb.clone(), bar.clone());
                let load = load.to_string();
                s.spawn(move || {
                    let base = t as u64 * files + 1;
                    let mut map = HashMap::new();
                    for i in 0..files {
                        let n = sb.insert_inode_locked(sb.new_inode(base + i)).expect("new");
                        drop(n.unlock_new_inode());
                        if names {
                            map.insert(format!("f{i}"), base + i);
                        }
                    }
                    bar.wait(); // main drops the cache
                    bar.wait();
                    match load.as_str() {
                        "lockstep" => (1..=threads as u64 * files).for_each(|ino| get(&sb, ino)),
                        "own" => (base..base + files).for_each(|ino| get(&sb, ino)),
                        _ => {}
                    }
                    // readdir: the order of the unlinks.
                    let order: Vec<(String, u64)> = if names {
                        map.iter().map(|(k, v)| (k.clone(), *v)).collect()
                    } else {
                        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                        let mut v: Vec<_> = (base..base + files).map(|i| (String::new(), i)).collect();
                        for i in (1..v.len()).rev() {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            v.swap(i, (x % (i as u64 + 1)) as usize);
                        }
                        v
                    };
                    bar.wait();
                    bar.wait(); // main enables the profile
                    let s0 = schedstat();
                    let a = Instant::now();
                    for (name, ino) in &order {
                        if names {
                            map.remove(name);
                        }
                        if let Some(Iget::Cached(r)) = sb.iget_locked(*ino) {
                            r.clear_nlink();
                        }
                    }
                    let e = a.elapsed().as_secs_f64();
                    let s1 = schedstat();
                    if std::env::var_os("PROBE_VERBOSE").is_some() {
                        eprintln!(
                            "    thread {t}: wall {e:.3} s, on cpu {:.3} s, runqueue wait {:.3} s, slices {}",
                            (s1[0] - s0[0]) as f64 / 1e9,
                            (s1[1] - s0[1]) as f64 / 1e9,
                            s1[2] - s0[2]
                        );
                    }
                    bar.wait();
                    (e, (s1[0] - s0[0]) as f64 / 1e9)
                })
            })
            .collect();
        bar.wait();
        if load != "none" {
            sb.evict_inodes();
        }
        bar.wait();
        bar.wait();
        perf_ctl("enable");
        bar.wait();
        bar.wait();
        perf_ctl("disable");
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .unzip::<_, _, Vec<_>, Vec<_>>()
    });
    let slowest = secs.0.iter().copied().fold(0.0, f64::max);
    Round {
        rate: threads as f64 * files as f64 / slowest / 1e6,
        wall: secs.0,
        on_cpu: secs.1,
    }
}

/// This thread's time on a CPU (`CLOCK_THREAD_CPUTIME_ID`, ns), and from its /proc
/// schedstat the time it waited on a runqueue (ns) and its slices. The schedstat's own
/// CPU time is not used: the kernel brings it up to date only at a tick or a switch, so a
/// thread reading its own lags by up to a tick (4 ms here; a 3 ms busy loop read 0.01–2.7
/// ms), which made phases of a few ms look a quarter off a CPU.
fn schedstat() -> [u64; 3] {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let mut v = s.split_whitespace().map(|x| x.parse().unwrap_or(0));
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; the clock id is a constant the kernel knows.
    let cpu = if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    } else {
        0
    };
    let _ = v.next();
    [cpu, v.next().unwrap_or(0), v.next().unwrap_or(0)]
}

/// With `PROBE_PERF_CTL=FIFO`, writes `cmd` to `perf record --control=fifo:FIFO`: a
/// profile of the unlink phases only (`perf record -D -1 --control ...`).
fn perf_ctl(cmd: &str) {
    if let Ok(p) = std::env::var("PROBE_PERF_CTL") {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(p)
            .expect("perf control fifo");
        writeln!(f, "{cmd}").expect("perf control");
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let files: u64 = args.next().map_or(200_000, |a| a.parse().expect("files"));
    let rounds: usize = args.next().map_or(5, |a| a.parse().expect("rounds"));
    let mode = args.next().unwrap_or_else(|| "lockstep".into());
    let names = mode.contains("names");
    let load = mode.split(',').next().unwrap_or("lockstep").to_string();
    // PROBE_THREADS=1 or 2: only those rounds (for a profile of one of them).
    let only: usize = std::env::var("PROBE_THREADS").map_or(0, |v| v.parse().expect("PROBE_THREADS"));
    let (mut one, mut two) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        if only != 2 {
            one.push(round(1, files, &load, names));
        }
        if only != 1 {
            two.push(round(2, files, &load, names));
        }
    }
    let mean = |v: &mut dyn Iterator<Item = f64>| {
        let (s, n) = v.fold((0.0, 0), |(s, n), x| (s + x, n + 1));
        s / n as f64
    };
    let rate = |v: &[Round]| mean(&mut v.iter().map(|r| r.rate));
    let cpu = |v: &[Round]| mean(&mut v.iter().flat_map(|r| r.on_cpu.iter().copied()));
    // Of the 2-thread rounds' thread-seconds, the share spent off a CPU (blocked: on the
    // runqueue is counted apart by the kernel and was ~0 here) or finished early.
    let off = |v: &[Round]| {
        mean(&mut v.iter().map(|r| {
            let slowest = r.wall.iter().copied().fold(0.0, f64::max);
            1.0 - r.on_cpu.iter().sum::<f64>() / (slowest * r.wall.len() as f64)
        }))
    };
    print!("{mode} files {files}:");
    if !one.is_empty() {
        print!(
            " 1 thread {:.2} M/s, on cpu {:.0} ns/op;",
            rate(&one),
            cpu(&one) / files as f64 * 1e9
        );
    }
    if !two.is_empty() {
        print!(
            " 2 threads {:.2} M/s, on cpu {:.0} ns/op, idle {:.1}% of the phase;",
            rate(&two),
            cpu(&two) / files as f64 * 1e9,
            off(&two) * 100.0
        );
    }
    if !one.is_empty() && !two.is_empty() {
        let ratios: Vec<f64> = one.iter().zip(&two).map(|(a, b)| b.rate / a.rate).collect();
        print!(
            " 2/1 {:.2} (per round {:?}), on-cpu time per op 2 vs 1 {:.2}",
            mean(&mut ratios.iter().copied()),
            ratios
                .iter()
                .map(|r| (r * 100.0).round() / 100.0)
                .collect::<Vec<_>>(),
            cpu(&two) / cpu(&one)
        );
    }
    println!();
}
