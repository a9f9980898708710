//! The in-memory filesystem of the library targets: directories as name → ino maps (one
//! per task, its own lock), an "on-disk" inode table to load from on a miss, and an
//! inode table ([`super::tables`]) in between; and the phases run on it by N threads.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier, RwLock};
use std::time::Instant;

use vfscale_icache::Settings;

use super::tables::{Attrs, Counts, Dashmap, Disk, Icache, Moka, RwlockHashmap, Table};
use super::{Span, PHASES};
use crate::measure::{Sample, Skip, Target};

/// What `readdir` gives: the names in one buffer, and (start, end, ino) per entry.
struct Dents {
    names: String,
    ents: Vec<(usize, usize, u64)>,
}

impl Dents {
    fn inos(&self) -> impl Iterator<Item = u64> + '_ {
        self.ents.iter().map(|e| e.2)
    }

    fn iter(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.ents.iter().map(|&(a, b, i)| (&self.names[a..b], i))
    }
}

/// One task's directory.
#[derive(Default)]
struct Dir {
    entries: RwLock<HashMap<String, u64>>,
}

struct MemFs {
    table: Box<dyn Table>,
    disk: Disk,
    dirs: Vec<Dir>,
    counts: Vec<Counts>,
    files: u64,
}

impl MemFs {
    /// `readdir`: the entries of directory `d` (one read lock of that directory), copied
    /// into one buffer as `getdents` copies them into the caller's (not an allocation per
    /// name: that cost, common to every target, would hide the tables' own).
    fn readdir(&self, d: usize, c: &Counts) -> Dents {
        bump(&c.shard);
        let e = self.dirs[d].entries.read().unwrap();
        let mut out = Dents {
            names: String::with_capacity(e.len() * 8),
            ents: Vec::with_capacity(e.len()),
        };
        for (n, i) in e.iter() {
            let start = out.names.len();
            out.names.push_str(n);
            out.ents.push((start, out.names.len(), *i));
        }
        out
    }

    fn phase(&self, phase: &str, t: usize) {
        let c = &self.counts[t];
        match phase {
            "create" => {
                for i in 0..self.files {
                    let ino = self.disk.ino(t, i);
                    let d = self.disk.get(ino);
                    d.mode.store(0o100644, Ordering::Relaxed);
                    d.nlink.store(1, Ordering::Relaxed);
                    self.table.create(ino, &self.disk, c);
                    bump(&c.shard);
                    self.dirs[t].entries.write().unwrap().insert(format!("f{i}"), ino);
                }
            }
            "walk" => {
                for ino in self.readdir(t, c).inos() {
                    self.table.with(ino, &self.disk, c, &mut stat);
                }
            }
            "chmod" => {
                for ino in self.readdir(t, c).inos() {
                    self.table.with(ino, &self.disk, c, &mut |a| {
                        a.mode.store(0o100600, Ordering::Relaxed)
                    });
                    self.disk.get(ino).mode.store(0o100600, Ordering::Relaxed);
                }
            }
            "cold-walk" => {
                for d in 0..self.dirs.len() {
                    for ino in self.readdir(d, c).inos() {
                        self.table.with(ino, &self.disk, c, &mut stat);
                    }
                }
            }
            "unlink" => {
                let dents = self.readdir(t, c);
                for (name, ino) in dents.iter() {
                    bump(&c.shard);
                    self.dirs[t].entries.write().unwrap().remove(name);
                    self.disk.get(ino).nlink.store(0, Ordering::Relaxed);
                    self.table.unlink(ino, c);
                }
            }
            p => unreachable!("unknown phase {p}"),
        }
    }

    /// (global, shard, loads) so far, the table's own and the tasks'.
    fn totals(&self) -> (u64, u64, u64) {
        let mut t = self.table.own_counts().unwrap_or((0, 0, 0));
        for c in &self.counts {
            t.0 += c.global.load(Ordering::Relaxed);
            t.1 += c.shard.load(Ordering::Relaxed);
            t.2 += c.loads.load(Ordering::Relaxed);
        }
        t
    }
}

fn stat(a: &Attrs) {
    black_box((
        a.mode.load(Ordering::Relaxed),
        a.nlink.load(Ordering::Relaxed),
        a.size.load(Ordering::Relaxed),
    ));
}

fn bump(c: &std::sync::atomic::AtomicU64) {
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// Runs every phase once with `tasks` threads and `files` files each; returns the
/// metrics of every phase.
pub fn run(target: Target, tasks: usize, files: u64, _selected: &[&str]) -> Result<Sample, Skip> {
    let hash_bits = (64 - (tasks as u64 * files).max(1).leading_zeros()).clamp(10, 22);
    let icache = |mut s: Settings| {
        s.hash_bits = hash_bits;
        Box::new(Icache::new(s)) as Box<dyn Table>
    };
    let table: Box<dyn Table> = match target {
        Target::Library => icache(Settings::default()),
        Target::LibraryPrepatch => icache(Settings::prepatch()),
        Target::RwlockHashmap => Box::new(RwlockHashmap::default()),
        Target::Dashmap => Box::new(Dashmap::default()),
        Target::Moka => Box::new(Moka::default()),
        t => return Err(Skip(format!("inodes: {} is not an in-memory target", t.name()))),
    };
    let counts_locks = table.counts_locks();
    let fs = Arc::new(MemFs {
        table,
        disk: Disk::new(tasks, files),
        dirs: (0..tasks).map(|_| Dir::default()).collect(),
        counts: (0..tasks).map(|_| Counts::default()).collect(),
        files,
    });
    let start = Arc::new(Barrier::new(tasks + 1));
    let end = Arc::new(Barrier::new(tasks + 1));
    let span = Arc::new(Span::default());
    let mut s = Sample::new();
    std::thread::scope(|scope| {
        for t in 0..tasks {
            let (fs, start, end, span) = (fs.clone(), start.clone(), end.clone(), span.clone());
            scope.spawn(move || {
                for p in PHASES {
                    start.wait();
                    let a = Instant::now();
                    fs.phase(p, t);
                    span.record(a, Instant::now());
                    end.wait();
                }
            });
        }
        for p in PHASES {
            if p == "cold-walk" {
                // drop_caches: the cache forgets every unused inode (untimed).
                fs.table.drop_caches();
            }
            let before = fs.totals();
            start.wait();
            end.wait();
            let secs = span.take();
            let after = fs.totals();
            let per_task = if p == "cold-walk" {
                tasks as u64 * files
            } else {
                files
            };
            let ops = (per_task * tasks as u64) as f64;
            s.insert(format!("{p}/ops_per_sec"), ops / secs.max(1e-9));
            if counts_locks {
                s.insert(
                    format!("{p}/global_lock_acquisitions_per_op"),
                    (after.0 - before.0) as f64 / ops,
                );
                s.insert(
                    format!("{p}/shard_lock_acquisitions_per_op"),
                    (after.1 - before.1) as f64 / ops,
                );
            }
            if p == "cold-walk" {
                let distinct = (tasks as u64 * files) as f64;
                s.insert(
                    format!("{p}/loads_per_distinct_inode"),
                    (after.2 - before.2) as f64 / distinct,
                );
            }
        }
    });
    Ok(s)
}
