//! [`SharedArray`]: per-worker records in memory that forked workers share with the
//! parent (a herd worker's wait histogram, a ring worker's futex word).

use std::io;

use super::map_shared;

/// `n` values of `T` in one anonymous `MAP_SHARED` mapping, all zero at first; forked
/// children inherit it, and it is unmapped on drop.
pub struct SharedArray<T> {
    base: *mut libc::c_void,
    len: usize,
    n: usize,
    _t: std::marker::PhantomData<T>,
}

impl<T> SharedArray<T> {
    /// Maps `n` zeroed values (at least one, so that the mapping is never empty).
    ///
    /// # Safety
    ///
    /// All-zero bytes must be a valid `T`, and `T` must be changed only through shared
    /// references (atomics, and arrays of them): children write the values while the
    /// parent reads them.
    pub unsafe fn new(n: usize) -> io::Result<SharedArray<T>> {
        // A mapping is page-aligned; no T here needs more.
        const { assert!(std::mem::align_of::<T>() <= 4096) };
        let len = n
            .max(1)
            .checked_mul(std::mem::size_of::<T>().max(1))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{n} shared entries: too large"),
                )
            })?;
        let base = map_shared(len)?;
        Ok(SharedArray {
            base,
            len,
            n,
            _t: std::marker::PhantomData,
        })
    }

    /// Entry `i`; the pointer is valid while `self` lives (and in a child forked while it
    /// did, until that child exits).
    pub fn get(&self, i: usize) -> *const T {
        assert!(i < self.n, "entry {i} of {}", self.n);
        // SAFETY: entry `i < n` lies inside the mapping, which is page-aligned and so
        // aligned for `T` (`new`'s contract).
        unsafe { (self.base as *const T).add(i) }
    }
}

impl<T> Drop for SharedArray<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new` (a child keeps its own); the
        // parent keeps no pointer from `get` past `self`.
        unsafe { libc::munmap(self.base, self.len) };
    }
}
