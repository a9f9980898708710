//! Cluster-wide ids of lock owners and open files: a member's own ids, made unique
//! across members and leases.
//!
//! The map is a bijection of 64-bit ids under one seed (the seed of a member's node
//! name and lease), so the home can turn an id back into the member's own id with the
//! seed, and two ids of one member never collide; ids of two members collide only as
//! two random 64-bit values do.

use std::hash::{Hash, Hasher};

/// An owner (POSIX process or open file) as every home names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GlobalOwner(pub u64);

/// The seed of one member's ids under one lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IdSeed(u64);

impl IdSeed {
    /// The seed of `node` under `lease`.
    pub fn new(node: &str, lease: i64) -> IdSeed {
        // SipHash with fixed keys: the same on every member and every build.
        #[allow(deprecated)]
        let mut h = std::hash::SipHasher::new_with_keys(0x7666_7363_616c_6521, 0x636c_7573_7465_7221);
        node.hash(&mut h);
        lease.hash(&mut h);
        IdSeed(h.finish())
    }

    /// The seed as one word (kept in an atomic by the service).
    pub fn raw(self) -> u64 {
        self.0
    }

    /// A seed from [`IdSeed::raw`].
    pub fn from_raw(v: u64) -> IdSeed {
        IdSeed(v)
    }

    /// The global id of this member's id `local`.
    #[inline]
    pub fn global(self, local: u64) -> GlobalOwner {
        GlobalOwner(mix(local ^ self.0))
    }

    /// This member's id behind `g` (the inverse of [`IdSeed::global`]).
    pub fn local(self, g: GlobalOwner) -> u64 {
        unmix(g.0) ^ self.0
    }
}

/// splitmix64's finalizer: a bijection that spreads every input bit.
#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The inverse of [`mix`].
fn unmix(mut z: u64) -> u64 {
    z = unshift(z, 31);
    z = unshift(z.wrapping_mul(inverse(0x94d0_49bb_1331_11eb)), 27);
    unshift(z.wrapping_mul(inverse(0xbf58_476d_1ce4_e5b9)), 30)
}

/// The inverse of `z ^ (z >> s)`.
fn unshift(z: u64, s: u32) -> u64 {
    let mut x = z;
    let mut i = s;
    while i < 64 {
        x = z ^ (x >> s);
        i += s;
    }
    x
}

/// The multiplicative inverse of an odd `a` modulo 2^64 (Newton's iteration).
fn inverse(a: u64) -> u64 {
    let mut x = a;
    for _ in 0..6 {
        x = x.wrapping_mul(2u64.wrapping_sub(a.wrapping_mul(x)));
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_ids_invert_and_differ_by_member_and_lease() {
        let a = IdSeed::new("a", 1);
        for local in [0u64, 1, 2, 77, u64::MAX, 0x8000_0000_0000_0000] {
            assert_eq!(a.local(a.global(local)), local);
        }
        assert_ne!(a.global(5), IdSeed::new("b", 1).global(5));
        assert_ne!(a.global(5), IdSeed::new("a", 2).global(5));
        assert_ne!(a.global(5), a.global(6));
    }
}
