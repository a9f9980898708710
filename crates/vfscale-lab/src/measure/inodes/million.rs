//! `inodes --mode evict`: the 1,000,000-inode point. Not one of the default
//! phases (`vfscale run` never runs it): `vfscale bench inodes --mode evict --files
//! 1000000,4000000` caches `--files` inodes in all (split over the tasks, each task
//! caching its share the way a lookup of a linked file does: `iget_locked` miss, fill,
//! `unlock_new_inode`, `iput`, so the inode sits unused on the LRU), then unmounts:
//! `evict_inodes` of every one of them, timed.
//!
//! Memory, measured three ways and cross-checked:
//! * `bytes_per_inode`: everything, the figure the cache's budget bounds (≤ 128):
//!   `inode_bytes_per_inode` + `hash_table_bytes_per_inode`.
//! * `inode_bytes_per_inode`: the allocator's bytes in use (glibc `mallinfo2`: `uordblks +
//!   hblkhd`, every arena, chunk headers and the slack of grown vectors included) grown
//!   while the inodes were cached into an already mounted superblock, ÷ inodes, minus the
//!   filesystem's own data (`size_of::<Data>()`, 32 bytes here, which the cache keeps
//!   inline in its inode). That is the inode struct's bookkeeping (its LRU links
//!   included: the LRU is intrusive), its superblock list slot, and malloc's overhead.
//! * `hash_table_bytes_per_inode`: what `InodeCache::new` and `mount` allocated (the hash
//!   table, 8 bytes per chain, and the per-CPU shards), ÷ inodes. The lab sizes the table
//!   for the run: one chain per inode, rounded up to a power of two, as fs.rs does
//!   (Linux sizes its own at boot, `ihash_entries`).
//! * `rss_bytes_per_inode`: the same interval's growth of the resident set
//!   (`/proc/self/statm`), minus the data: what the kernel had to give. Freed memory of
//!   earlier runs is handed back first (`malloc_trim`), so it is not reused unseen.
//! * `struct_bytes_per_inode`: `size_of::<Inode<F>>()` minus the data, the floor the two
//!   above must exceed (the library's own layout).
//!
//! Time: `evict_ns_per_inode` (the `evict_inodes` call ÷ inodes evicted) and
//! `cache_ns_per_inode` (filling, for scale). Linearity is read across sizes (the
//! headline divides ns/inode at the largest size by ns/inode at the smallest of the
//! sizes that do not fit the last-level cache, `llc_bytes`, read from sysfs: below it
//! a walk hits the cache and costs a third of what it costs beyond).

use std::hint::black_box;
use std::time::Instant;

use vfscale_icache::{flush_deferred, Iget, Inode, InodeCache, Settings, SuperOperations};

use crate::measure::{Sample, Skip, Target};

/// The mode's name (`--mode evict`, the rows' `mode`).
pub const MODE: &str = "evict";

/// The filesystem's own data per inode: what a small filesystem keeps in memory (mode,
/// nlink, size, mtime), inline in the cache's inode.
type Data = [u64; 4];

struct Ops;

impl SuperOperations for Ops {
    type Data = Data;
    fn alloc_inode(&self, ino: u64) -> Data {
        [ino, 0o100644, 1, 0]
    }
}

/// Heap bytes in use (every arena, mmapped chunks included) and resident bytes.
#[derive(Clone, Copy, Debug)]
struct Mem {
    heap: f64,
    rss: f64,
}

fn snapshot() -> Mem {
    // SAFETY: mallinfo2 only reads the allocator's statistics (under its arena locks).
    let m = unsafe { libc::mallinfo2() };
    Mem {
        heap: (m.uordblks + m.hblkhd) as f64,
        rss: rss_bytes(),
    }
}

fn rss_bytes() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as f64;
    pages * page
}

/// Frees what earlier runs left (inodes awaiting their grace period, free heap pages),
/// so the interval measured next sees neither a late free nor a silent reuse.
fn settle() {
    let mut last = f64::MAX;
    for _ in 0..20 {
        flush_deferred();
        let h = snapshot().heap;
        if h >= last {
            break;
        }
        last = h;
    }
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
}

/// Whether `target` can run the evict point (vfscale-icache only: the user
/// alternatives are maps with neither an LRU nor `evict_inodes`).
pub fn settings_of(target: Target) -> Result<Settings, Skip> {
    match target {
        Target::Library => Ok(Settings::default()),
        Target::LibraryPrepatch => Ok(Settings::prepatch()),
        t => Err(Skip(format!(
            "evict: {} has no LRU and no evict_inodes (a plain map); the point measures vfscale-icache",
            t.name()
        ))),
    }
}

/// Caches `inodes` unused inodes with `tasks` threads, measures their bookkeeping, and
/// times `evict_inodes` over all of them. Metrics are named `evict/...`.
pub fn run(target: Target, tasks: usize, inodes: u64) -> Result<Sample, Skip> {
    let mut settings = settings_of(target)?;
    let inodes = inodes.max(1);
    let tasks = tasks.max(1);
    settings.hash_bits = (64 - inodes.leading_zeros()).clamp(10, 22);
    settle();
    let m0 = snapshot();
    let cache: InodeCache<Ops> = InodeCache::new(settings);
    let sb = cache.mount(Ops);
    let m1 = snapshot();

    // Fill: task t caches inodes t*per+1 ..= min((t+1)*per, inodes); each ends unused on
    // the LRU (nlink 1, superblock active: iput_final keeps it).
    let per = inodes.div_ceil(tasks as u64);
    let t_fill = Instant::now();
    std::thread::scope(|s| {
        for t in 0..tasks as u64 {
            let sb = &sb;
            s.spawn(move || {
                for ino in t * per + 1..=((t + 1) * per).min(inodes) {
                    match sb.iget_locked(ino) {
                        Some(Iget::New(n)) => drop(n.unlock_new_inode()),
                        other => panic!("evict: inode {ino} was already cached ({other:?})"),
                    }
                }
            });
        }
    });
    let fill = t_fill.elapsed().as_secs_f64();
    let m2 = snapshot();
    let stats = cache.stats();
    let cached = sb.count_objects() as u64;

    let t_evict = Instant::now();
    let evicted = black_box(sb.evict_inodes()) as u64;
    let evict = t_evict.elapsed().as_secs_f64();
    let busy = sb.umount();
    let left = cache.stats().nr_inodes;
    drop(sb);
    drop(cache);
    settle();

    let n = inodes as f64;
    let data = std::mem::size_of::<Data>() as f64;
    let mut out = Sample::new();
    let mut put = |k: &str, v: f64| out.insert_in(MODE, k.into(), v);
    let own = (m2.heap - m1.heap) / n - data;
    let table = (m1.heap - m0.heap) / n;
    put("bytes_per_inode", own + table);
    put("inode_bytes_per_inode", own);
    put("rss_bytes_per_inode", (m2.rss - m1.rss) / n - data);
    put(
        "struct_bytes_per_inode",
        (std::mem::size_of::<Inode<Ops>>() - std::mem::size_of::<Data>()) as f64,
    );
    put("hash_table_bytes_per_inode", table);
    put("data_bytes_per_inode", data);
    put("cached_inodes", stats.nr_inodes as f64);
    put("unused_inodes", cached as f64);
    put("evicted_inodes", evicted as f64);
    put("left_after_umount", (busy as u64 + left) as f64);
    put("evict_sec", evict);
    put("evict_ns_per_inode", evict * 1e9 / (evicted.max(1) as f64));
    put("cache_ns_per_inode", fill * 1e9 / n);
    if let Some(llc) = llc_bytes() {
        put("llc_bytes", llc as f64);
    }
    Ok(out)
}

/// The size of this CPU's last-level cache (the highest-level data or unified cache in
/// `/sys/devices/system/cpu/cpu0/cache`), if the kernel says.
fn llc_bytes() -> Option<u64> {
    let dir = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache").ok()?;
    let mut best: Option<(u32, u64)> = None;
    for e in dir.flatten() {
        let p = e.path();
        let read = |f: &str| std::fs::read_to_string(p.join(f)).ok();
        let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size")) else {
            continue;
        };
        if kind.trim() == "Instruction" {
            continue;
        }
        let (Ok(level), Some(size)) = (level.trim().parse::<u32>(), parse_cache_size(size.trim())) else {
            continue;
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, size));
        }
    }
    best.map(|(_, s)| s)
}

/// sysfs's cache size (`32768K`, `2M`, `512`) in bytes.
fn parse_cache_size(s: &str) -> Option<u64> {
    let (num, mult) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

#[cfg(test)]
mod tests {
    use super::*;

    // `every_cached_inode_is_evicted_and_bookkeeping_is_counted` is in
    // tests/evict_point.rs: the bytes are the allocator's process-wide growth, which
    // tests running beside it in this binary would disturb.

    #[test]
    fn cache_sizes_parse_as_sysfs_writes_them() {
        assert_eq!(parse_cache_size("32768K"), Some(32 << 20));
        assert_eq!(parse_cache_size("2M"), Some(2 << 20));
        assert_eq!(parse_cache_size("512"), Some(512));
        assert_eq!(parse_cache_size("K"), None);
        assert_eq!(parse_cache_size("x1K"), None);
        assert_eq!(parse_cache_size(""), None);
    }

    #[test]
    fn alternatives_are_skipped_with_a_reason() {
        for t in [
            Target::RwlockHashmap,
            Target::Dashmap,
            Target::Moka,
            Target::Partitioned,
        ] {
            let Err(Skip(why)) = run(t, 1, 10) else {
                panic!("{} ran the evict point", t.name())
            };
            assert!(why.contains("evict_inodes"), "{why}");
        }
    }
}
