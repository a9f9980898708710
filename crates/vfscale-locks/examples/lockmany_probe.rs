//! Runs `lockmany`'s library operations in a loop, for instruction and cache-miss
//! counters (`valgrind --tool=cachegrind`, `perf stat`): `lockmany_probe HELD OP N`
//! sets up HELD one-byte OFD write locks (bytes 0, 2, 4, …), then does N of OP:
//! `pair` (set and unset a write lock at a random free byte), `test` (`F_OFD_GETLK` at
//! a random held byte) or `none`. Run it with N and 2N and subtract.
//!
//! `lockmany_probe HELD ratio ROUNDS` times tests instead: an inode with 10 locks and
//! one with HELD, batches of 100,000 tests on each in turn, ROUNDS times; prints the
//! median ns per test of each and the median of the per-round ratios (a noisy machine
//! slows both sides of a round alike), and the least ns of each (the quietest batch)
//! with their ratio. `LOCKMANY_SPREAD=N` tests only N distinct held bytes, whose
//! lines then stay in cache: what the descent computes, without its misses.
//! `LOCKMANY_GAPS=G` places the locks at irregular bytes instead (gaps of 2 to G + 1
//! bytes, drawn at random; G ≥ 2): where interpolation guesses wrong.

use vfscale_locks::*;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let held: u64 = a[1].parse().expect("HELD");
    let op = a[2].as_str();
    let n: u64 = a[3].parse().expect("N");
    if op == "ratio" {
        return ratio(held, n);
    }
    let mgr = LockManager::new();
    let ctx = FileLockContext::new(&mgr, InodeKey::default());
    let p = Process::new(1);
    for i in 0..held {
        let f = OpenFile::new(i + 1, AccessMode::ReadWrite);
        let mut fl = Flock::new(LockType::Write, 2 * i as i64, 1);
        ctx.fcntl(p, f, FcntlCmd::OfdSetLk, &mut fl).unwrap();
    }
    let f = OpenFile::new(held + 1, AccessMode::ReadWrite);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = (x % held) as i64;
        match op {
            "pair" => {
                let mut fl = Flock::new(LockType::Write, 2 * j + 1, 1);
                ctx.fcntl(p, f, FcntlCmd::OfdSetLk, &mut fl).unwrap();
                let mut fl = Flock::new(LockType::Unlock, 2 * j + 1, 1);
                ctx.fcntl(p, f, FcntlCmd::OfdSetLk, &mut fl).unwrap();
            }
            "test" => {
                let mut fl = Flock::new(LockType::Write, 2 * j, 1);
                ctx.fcntl(p, f, FcntlCmd::OfdGetLk, &mut fl).unwrap();
                assert_eq!(fl.l_start, 2 * j);
            }
            _ => {}
        }
    }
}

/// The bytes of `held` locks: 0, 2, 4, …, or with `LOCKMANY_GAPS=G` gaps of 2 to G + 1
/// bytes drawn at random.
fn starts(held: u64) -> Vec<i64> {
    let gaps: u64 = std::env::var("LOCKMANY_GAPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut at = 0i64;
    (0..held)
        .map(|_| {
            let s = at;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            at += if gaps >= 2 { 2 + (x % gaps) as i64 } else { 2 };
            s
        })
        .collect()
}

/// One-byte OFD write locks at `starts` on a fresh inode.
fn set_up(starts: &[i64]) -> std::sync::Arc<FileLockContext> {
    let mgr = LockManager::new();
    let ctx = FileLockContext::new(&mgr, InodeKey::default());
    for (i, &s) in starts.iter().enumerate() {
        let f = OpenFile::new(i as u64 + 1, AccessMode::ReadWrite);
        let mut fl = Flock::new(LockType::Write, s, 1);
        ctx.fcntl(Process::new(1), f, FcntlCmd::OfdSetLk, &mut fl)
            .unwrap();
    }
    ctx
}

fn ratio(held: u64, rounds: u64) {
    const BATCH: u64 = 100_000;
    // LOCKMANY_SPREAD=N: test only N distinct held bytes (spread over the file), so the
    // lines a test reads stay in cache: the compute part of a test, without misses.
    let spread: u64 = std::env::var("LOCKMANY_SPREAD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let bytes = [starts(10), starts(held)];
    let sides = [(10, set_up(&bytes[0])), (held, set_up(&bytes[1]))];
    let f = OpenFile::new(u32::MAX as u64, AccessMode::ReadWrite);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut ns = [Vec::new(), Vec::new()];
    for _ in 0..rounds {
        for (s, (h, ctx)) in sides.iter().enumerate() {
            let t = std::time::Instant::now();
            for _ in 0..BATCH {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let j = if spread > 0 && spread < *h {
                    ((x % spread) * (h / spread)) as i64
                } else {
                    (x % h) as i64
                };
                let at = bytes[s][j as usize];
                let mut fl = Flock::new(LockType::Write, at, 1);
                ctx.fcntl(Process::new(2), f, FcntlCmd::OfdGetLk, &mut fl)
                    .unwrap();
                assert_eq!(fl.l_start, at);
            }
            ns[s].push(t.elapsed().as_nanos() as f64 / BATCH as f64);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut r: Vec<f64> = ns[1].iter().zip(&ns[0]).map(|(b, a)| b / a).collect();
    let (a, b) = (median(&mut ns[0].clone()), median(&mut ns[1].clone()));
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    println!(
        "test ns: 10 held {a:.1}, {held} held {b:.1}; ratio {:.2} (medians); minima {:.1}, {:.1}: {:.2}",
        median(&mut r),
        min(&ns[0]),
        min(&ns[1]),
        min(&ns[1]) / min(&ns[0])
    );
}
