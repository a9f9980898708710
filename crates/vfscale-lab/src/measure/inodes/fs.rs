//! The in-memory filesystem of the library targets: directories as name → ino maps (one
//! per task, its own lock), an "on-disk" inode table to load from on a miss, and an
//! inode table ([`super::tables`]) in between; and the phases run on it by N threads.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier, RwLock};

use vfscale_icache::Settings;

use super::tables::{Attrs, Counts, Dashmap, Disk, Icache, Moka, Partitioned, RwlockHashmap, Table};
use super::{bump, open_phase, phase_gates, Span, PHASES};
use crate::measure::{Sample, Skip, Target};

/// What `readdir` gives: the names in one buffer, and (start, end, ino) per entry.
struct Dents {
    names: String,
    ents: Vec<(usize, usize, u64)>,
}

impl Dents {
    /// A task's buffer for a directory of up to `entries` entries whose names are up to
    /// `name_len` bytes, its pages touched now (untimed), so no phase grows it or faults
    /// it in: a program reuses one `getdents` buffer too, and an allocation of megabytes
    /// inside a timed phase would measure the allocator's and the kernel's page faults,
    /// which depend on what ran before, not the table.
    fn with_room(entries: usize, name_len: usize) -> Dents {
        let mut d = Dents {
            names: String::new(),
            ents: Vec::new(),
        };
        d.names.extend(std::iter::repeat_n('x', entries * name_len));
        d.ents.resize(entries, (1, 1, 1));
        d.names.clear();
        d.ents.clear();
        d
    }

    fn inos(&self) -> impl Iterator<Item = u64> + '_ {
        self.ents.iter().map(|e| e.2)
    }

    fn iter(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.ents.iter().map(|&(a, b, i)| (&self.names[a..b], i))
    }
}

/// One task's directory, on cache lines of its own: create and unlink take its write
/// lock and update its map's header (item count, growth room) on every file, and two
/// tasks' directories side by side in `MemFs::dirs` (64 bytes each) shared a line, so
/// every target paid a cache-line transfer between the tasks per create and unlink
/// (128: x86's adjacent-line prefetch pairs lines).
#[derive(Default)]
#[repr(align(128))]
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
    /// into the task's buffer `out` as `getdents` copies them into the caller's (not an
    /// allocation per name: that cost, common to every target, would hide the tables'
    /// own).
    fn readdir<'a>(&self, d: usize, c: &Counts, out: &'a mut Dents) -> &'a Dents {
        bump(&c.shard);
        let e = self.dirs[d].entries.read().unwrap();
        out.names.clear();
        out.ents.clear();
        for (n, i) in e.iter() {
            let start = out.names.len();
            out.names.push_str(n);
            out.ents.push((start, out.names.len(), *i));
        }
        out
    }

    /// Task `t`'s part of `phase`; `buf` is the task's `readdir` buffer; each operation
    /// done ticks `span`.
    fn phase(&self, phase: &str, t: usize, buf: &mut Dents, span: &Span) {
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
                    span.tick(t);
                }
            }
            "walk" => {
                for ino in self.readdir(t, c, buf).inos() {
                    self.table.with(ino, &self.disk, c, &mut stat);
                    span.tick(t);
                }
            }
            "chmod" => {
                for ino in self.readdir(t, c, buf).inos() {
                    self.table.with(ino, &self.disk, c, &mut |a| {
                        a.mode.store(0o100600, Ordering::Relaxed)
                    });
                    self.disk.get(ino).mode.store(0o100600, Ordering::Relaxed);
                    span.tick(t);
                }
            }
            "cold-walk" => {
                for d in 0..self.dirs.len() {
                    for ino in self.readdir(d, c, buf).inos() {
                        self.table.with(ino, &self.disk, c, &mut stat);
                        span.tick(t);
                    }
                }
            }
            "unlink" => {
                let dents = self.readdir(t, c, buf);
                for (name, ino) in dents.iter() {
                    bump(&c.shard);
                    self.dirs[t].entries.write().unwrap().remove(name);
                    self.disk.get(ino).nlink.store(0, Ordering::Relaxed);
                    self.table.unlink(ino, c);
                    span.tick(t);
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

/// Runs every phase with `tasks` threads and `files` files each: `warmup` untimed
/// passes, then the measured one, each on a fresh filesystem and table; returns the
/// metrics of the measured pass's phases.
pub fn run(target: Target, tasks: usize, files: u64, warmup: usize) -> Result<Sample, Skip> {
    for _ in 0..warmup {
        pass(target, tasks, files)?;
    }
    pass(target, tasks, files)
}

/// One pass: every phase once on a fresh filesystem.
fn pass(target: Target, tasks: usize, files: u64) -> Result<Sample, Skip> {
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
        Target::Partitioned => Box::new(Partitioned::new(tasks, files)),
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
    let span = Arc::new(Span::new(tasks));
    let gates = Arc::new(phase_gates());
    let mut s = Sample::new();
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(tasks);
        for t in 0..tasks {
            let (fs, start, end, span, gates) = (
                fs.clone(),
                start.clone(),
                end.clone(),
                span.clone(),
                gates.clone(),
            );
            handles.push(scope.spawn(move || {
                // Room for the cold walk's largest directory (every one is `files` long).
                let mut buf = Dents::with_room(files as usize, 2 + files.to_string().len());
                for (k, p) in PHASES.into_iter().enumerate() {
                    start.wait();
                    gates[k].arrive_and_spin();
                    let a = Span::start();
                    fs.phase(p, t, &mut buf, &span);
                    span.record(a);
                    end.wait();
                }
            }));
        }
        for (k, p) in PHASES.into_iter().enumerate() {
            if p == "cold-walk" {
                // drop_caches: the cache forgets every unused inode (untimed).
                fs.table.drop_caches();
            }
            let before = fs.totals();
            start.wait();
            open_phase(&gates[k], tasks);
            end.wait();
            let per_task = if p == "cold-walk" {
                tasks as u64 * files
            } else {
                files
            };
            span.finish(p, tasks, per_task * tasks as u64, &mut s);
            let after = fs.totals();
            let ops = (per_task * tasks as u64) as f64;
            if counts_locks {
                s.insert_in(
                    p,
                    "global_lock_acquisitions_per_op".into(),
                    (after.0 - before.0) as f64 / ops,
                );
                s.insert_in(
                    p,
                    "shard_lock_acquisitions_per_op".into(),
                    (after.1 - before.1) as f64 / ops,
                );
            }
            if p == "cold-walk" {
                let distinct = (tasks as u64 * files) as f64;
                s.insert_in(
                    p,
                    "loads_per_distinct_inode".into(),
                    (after.2 - before.2) as f64 / distinct,
                );
            }
        }
        // Joined, not left to the scope: a join waits for the thread's exit, which hands
        // its malloc arena back, so the next pass's tasks reuse the arenas (and their
        // memory) instead of racing an exiting thread for a new one.
        for h in handles {
            h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        }
    });
    Ok(s)
}
