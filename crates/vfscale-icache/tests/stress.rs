//! Real threads loading, dropping, unlinking, pruning at once on a few keys: no double
//! load of one key, every waiter sees a loaded inode, every object evicted and destroyed
//! once, nothing left after unmount. Small on purpose (2 shared cores).

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use common::TestFs;
use vfscale_icache::*;

const KEYS: u64 = 8;

fn stress(settings: Settings) {
    let fs = TestFs::default();
    let cache = InodeCache::new(settings);
    let sb = Arc::new(cache.mount(fs.clone()));
    let loading: Arc<Vec<AtomicBool>> = Arc::new((0..KEYS).map(|_| AtomicBool::new(false)).collect());
    let hs: Vec<_> = (0..4u64)
        .map(|t| {
            let (sb, loading) = (sb.clone(), loading.clone());
            thread::spawn(move || {
                let mut x = t * 7 + 1;
                for i in 0..3000u64 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let key = (x >> 33) % KEYS;
                    match sb.iget_locked(key) {
                        Some(Iget::New(n)) => {
                            assert!(
                                !loading[key as usize].swap(true, Ordering::SeqCst),
                                "key {key} loaded twice at once"
                            );
                            n.data().loaded.store(key + 1, Ordering::SeqCst);
                            loading[key as usize].store(false, Ordering::SeqCst);
                            if i % 11 == 0 {
                                n.iget_failed();
                            } else {
                                let r = n.unlock_new_inode();
                                if i % 5 == 0 {
                                    r.clear_nlink();
                                }
                            }
                        }
                        Some(Iget::Cached(r)) => {
                            assert_eq!(
                                r.data().loaded.load(Ordering::SeqCst),
                                key + 1,
                                "unloaded inode returned"
                            );
                            assert!(!r.state().flags.contains(InodeFlags::FREEING));
                            if i % 7 == 0 {
                                r.mark_dontcache();
                            }
                        }
                        None => panic!("no I_CREATING here"),
                    }
                    if i % 13 == 0 {
                        sb.prune_icache_sb(3);
                    }
                    if i % 97 == 0 {
                        sb.for_each_inode(|r| assert!(r.data().loaded.load(Ordering::SeqCst) > 0));
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let sb = Arc::try_unwrap(sb).unwrap();
    assert_eq!(sb.umount(), 0, "no busy inode");
    let st = cache.stats();
    assert_eq!(st.nr_inodes, 0);
    assert_eq!(st.nr_unused, 0);
    let c = &fs.counts;
    assert_eq!(c.allocs.load(Ordering::SeqCst), c.destroys.load(Ordering::SeqCst));
    assert_eq!(
        c.evicts.load(Ordering::SeqCst) as u64,
        st.loads,
        "every loaded inode evicted once"
    );
    c.check_once();
    let _ = AtomicU64::new(0);
}

#[test]
fn stress_scalable() {
    stress(Settings::default());
}

#[test]
fn stress_prepatch() {
    stress(Settings::prepatch());
}

#[test]
fn stress_locked_lookup_per_chain() {
    stress(Settings {
        lookup: Lookup::Locked,
        hash_bits: 1,
        ..Settings::default()
    });
}
