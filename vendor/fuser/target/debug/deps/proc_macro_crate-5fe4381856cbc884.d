/work/main/vendor/fuser/target/debug/deps/proc_macro_crate-5fe4381856cbc884.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/proc-macro-crate-3.5.0/src/lib.rs

/work/main/vendor/fuser/target/debug/deps/libproc_macro_crate-5fe4381856cbc884.rlib: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/proc-macro-crate-3.5.0/src/lib.rs

/work/main/vendor/fuser/target/debug/deps/libproc_macro_crate-5fe4381856cbc884.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/proc-macro-crate-3.5.0/src/lib.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/proc-macro-crate-3.5.0/src/lib.rs:
