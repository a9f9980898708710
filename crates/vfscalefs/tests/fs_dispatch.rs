//! The dispatch gate on a real mount: a client that sends one request at a time is
//! served by one thread (no spare is woken for it), and clients that send requests at
//! the same time get more threads reading.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{cannot_mount, say, Mounted, TempDir};

const FILES: usize = 2000;

fn populate(dir: &Path) {
    for i in 0..FILES {
        std::fs::write(dir.join(format!("f{i}")), b"").unwrap();
    }
}

/// A mount with `ttl=0` (every `lstat` is a `LOOKUP`) over a populated source, its stats
/// file in the returned directory.
fn mount(tag: &str) -> Option<(TempDir, PathBuf, Mounted)> {
    if common::transport_is_io_uring() {
        say("SKIP: the dispatch gate is /dev/fuse's; over io_uring each CPU's queue has a thread");
        return None;
    }
    if let Some(why) = cannot_mount() {
        say(&format!("SKIP: {why}"));
        return None;
    }
    let t = TempDir::new(tag);
    let sf = t.0.join("stats");
    let m = Mounted::start_env(1, "ttl=0", &[("VFSCALEFS_STATS", &sf)]).expect("mount");
    populate(&m.source);
    Some((t, sf, m))
}

/// A serial `lstat` walk: thousands of requests, and (almost) no spare thread woken. With
/// every read that returns at once taken for load, a fast client woke one for about a
/// third of its requests.
#[test]
fn a_serial_stream_is_served_by_one_thread() {
    let Some((_t, sf, m)) = mount("dispatch-serial") else {
        return;
    };
    let before = m.dispatch_stats(&sf);
    for _ in 0..3 {
        for i in 0..FILES {
            std::fs::symlink_metadata(m.mounts[0].join(format!("f{i}"))).unwrap();
        }
    }
    let after = m.dispatch_stats(&sf);
    let reads = after.reads - before.reads;
    let wakes = after.dispatch_wakes - before.dispatch_wakes;
    say(&format!("serial walk: {reads} reads, {wakes} spare wake-ups"));
    assert!(
        reads >= 3 * FILES as u64,
        "every lstat is a LOOKUP with ttl=0: {reads}"
    );
    assert!(
        wakes * 100 <= reads,
        "a serial stream woke spares: {wakes} in {reads} reads"
    );
}

/// Eight clients at once: requests queue up behind each other, and spares are woken to
/// read them.
#[test]
fn clients_at_once_wake_spares() {
    let Some((_t, sf, m)) = mount("dispatch-parallel") else {
        return;
    };
    let before = m.dispatch_stats(&sf);
    let stop = Arc::new(AtomicBool::new(false));
    let until = Instant::now() + Duration::from_secs(2);
    let hs: Vec<_> = (0..8)
        .map(|c| {
            let dir = m.mounts[0].clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut i = c;
                while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                    std::fs::symlink_metadata(dir.join(format!("f{}", i % FILES))).unwrap();
                    i += 8;
                }
            })
        })
        .collect();
    let after = loop {
        std::thread::sleep(Duration::from_millis(200));
        let s = m.dispatch_stats(&sf);
        if s.dispatch_wakes > before.dispatch_wakes || Instant::now() >= until {
            break s;
        }
    };
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.join().unwrap();
    }
    say(&format!(
        "8 clients: {} reads, {} found more queued, {} spare wake-ups",
        after.reads - before.reads,
        after.busy_reads - before.busy_reads,
        after.dispatch_wakes - before.dispatch_wakes
    ));
    assert!(after.busy_reads > before.busy_reads, "no read found a queue");
    assert!(after.dispatch_wakes > before.dispatch_wakes, "no spare was woken");
}
