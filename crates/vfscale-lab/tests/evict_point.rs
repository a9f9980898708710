//! The inodes workload's evict point (the 1,000,000-inode point) at a small size.
//!
//! In a test binary of its own: `bytes_per_inode` is the allocator's process-wide growth
//! while the inodes are cached, so no other test may allocate or free beside it (the
//! library's unit tests run in parallel threads and once made it negative).

use vfscale_lab::measure::inodes::million::{run, MODE};
use vfscale_lab::measure::Target;

#[test]
fn every_cached_inode_is_evicted_and_bookkeeping_is_counted() {
    for (target, tasks) in [(Target::Library, 2), (Target::LibraryPrepatch, 1)] {
        let s = run(target, tasks, 20_000).unwrap();
        let g = |k: &str| s.get_in(MODE, k).unwrap_or_else(|| panic!("no {k} in {s:?}"));
        assert_eq!(g("cached_inodes"), 20_000.0, "{}", target.name());
        assert_eq!(g("unused_inodes"), 20_000.0, "{}", target.name());
        assert_eq!(g("evicted_inodes"), 20_000.0, "{}", target.name());
        assert_eq!(g("left_after_umount"), 0.0, "{}", target.name());
        // The allocator saw at least the struct's bookkeeping, and not absurdly more
        // (an LRU entry and a list slot are tens of bytes, not hundreds).
        let b = g("bytes_per_inode");
        let floor = g("struct_bytes_per_inode");
        assert!(
            b >= floor && b < floor + 256.0,
            "{} {b} vs {floor}",
            target.name()
        );
        // 2^15 chains of 8 bytes for 20,000 inodes: at least 13.1 B each.
        let table = g("hash_table_bytes_per_inode");
        assert!(table >= 8.0 * 32768.0 / 20_000.0, "{table}");
        assert!((g("inode_bytes_per_inode") + table - b).abs() < 1e-6);
        assert!(g("evict_ns_per_inode") > 0.0);
    }
}
