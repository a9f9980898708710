//! A probe of the lab's cold walk (`vfscale bench inodes`): every thread looks up every
//! inode of the superblock in the same order after the cache was dropped, so threads meet
//! on the same misses. Prints the cache's counters: loads per distinct inode and how the
//! lookups that found an inode `I_NEW` ended (spinning, or registered to sleep).
//!
//! `cargo run --release -p vfscale-icache --example cold_walk_probe -- [threads] [inodes]`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use vfscale_icache::{Iget, InodeCache, Settings, SuperOperations};

/// Counts `->destroy_inode` calls: during the walk (nothing is evicted) each one is a
/// miss that lost the insert race after allocating.
#[derive(Default)]
struct Fs {
    destroyed: AtomicU64,
}

impl SuperOperations for Fs {
    type Data = AtomicU64;
    fn alloc_inode(&self, _ino: u64) -> AtomicU64 {
        AtomicU64::new(0)
    }
    fn destroy_inode(&self, _inode: &vfscale_icache::Inode<Self>) {
        self.destroyed.fetch_add(1, Ordering::Relaxed);
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().map_or(2, |a| a.parse().expect("threads"));
    let inodes: u64 = args.next().map_or(200_000, |a| a.parse().expect("inodes"));
    let cache = InodeCache::new(Settings {
        hash_bits: 20,
        ..Settings::default()
    });
    let sb = Arc::new(cache.mount(Fs::default()));
    for ino in 1..=inodes {
        let n = sb.insert_inode_locked(sb.new_inode(ino)).expect("a new number");
        n.data().store(ino, Ordering::Relaxed);
        drop(n.unlock_new_inode());
    }
    sb.evict_inodes();
    let before = cache.stats();
    let destroyed = sb.ops().destroyed.load(Ordering::Relaxed);
    let start = Arc::new(Barrier::new(threads));
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            let (sb, start) = (sb.clone(), start.clone());
            s.spawn(move || {
                start.wait();
                for ino in 1..=inodes {
                    let r = match sb.iget_locked(ino).expect("not I_CREATING") {
                        Iget::Cached(r) => r,
                        Iget::New(n) => {
                            n.data().store(ino, Ordering::Relaxed);
                            n.unlock_new_inode()
                        }
                    };
                    assert_eq!(r.data().load(Ordering::Relaxed), ino, "a half-loaded inode");
                }
            });
        }
    });
    let secs = t0.elapsed().as_secs_f64();
    let after = cache.stats();
    let lookups = threads as u64 * inodes;
    let lost = sb.ops().destroyed.load(Ordering::Relaxed) - destroyed;
    println!(
        "  misses that lost the insert race after allocating: {lost} ({:.4} per lookup)",
        lost as f64 / lookups as f64
    );
    println!(
        "threads {threads} inodes {inodes}: {:.2} M lookups/s, loads/inode {:.3}, I_NEW met {} \
         (spun {}, registered {}), per lookup {:.4} spun {:.4} registered",
        lookups as f64 / secs / 1e6,
        (after.loads - before.loads) as f64 / inodes as f64,
        (after.new_waits_spun - before.new_waits_spun) + (after.new_waits_slept - before.new_waits_slept),
        after.new_waits_spun - before.new_waits_spun,
        after.new_waits_slept - before.new_waits_slept,
        (after.new_waits_spun - before.new_waits_spun) as f64 / lookups as f64,
        (after.new_waits_slept - before.new_waits_slept) as f64 / lookups as f64,
    );
}
