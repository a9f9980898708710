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
    /// All-zero bytes must be a valid `T` (atomics and arrays of them are), and `T` must
    /// need no alignment beyond a page's.
    pub unsafe fn new(n: usize) -> io::Result<SharedArray<T>> {
        let len = n.max(1) * std::mem::size_of::<T>().max(1);
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
        // SAFETY: unmaps exactly the mapping made in `new`; callers keep no pointer past
        // `self` (workers are reaped before it drops).
        unsafe { libc::munmap(self.base, self.len) };
    }
}
