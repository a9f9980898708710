//! The scenario process of the descriptor-scenario kernel runner
//! (`vfscale_conformance::fd::kernel`): it makes the steps' system calls on its own
//! descriptor table, as commands arrive through shared memory. Not meant to be run by
//! hand.
//!
//! `#![no_main]`: Rust's runtime start-up reopens descriptors 0-2 on `/dev/null` when
//! they are closed, which would change the table a scenario left across `exec`; a C
//! `main` skips it. (Under `cargo test` the harness brings its own `main`, with no tests.)
#![cfg_attr(not(test), no_main)]

#[cfg(not(test))]
#[no_mangle]
extern "C" fn main(argc: libc::c_int, argv: *const *const libc::c_char) -> libc::c_int {
    // SAFETY: `main` receives `argc` valid strings, and the process is single-threaded.
    unsafe { vfscale_conformance::fd::kernel::child_main(argc, argv) }
}
