//! Runs `lockmany`'s library operations in a loop, for instruction and cache-miss
//! counters (`valgrind --tool=cachegrind`, `perf stat`): `lockmany_probe HELD OP N`
//! sets up HELD one-byte OFD write locks (bytes 0, 2, 4, …), then does N of OP:
//! `pair` (set and unset a write lock at a random free byte), `test` (`F_OFD_GETLK` at
//! a random held byte) or `none`. Run it with N and 2N and subtract.

use vfscale_locks::*;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let held: u64 = a[1].parse().expect("HELD");
    let op = a[2].as_str();
    let n: u64 = a[3].parse().expect("N");
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
