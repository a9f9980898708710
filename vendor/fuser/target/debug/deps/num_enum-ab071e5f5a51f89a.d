/work/main/vendor/fuser/target/debug/deps/num_enum-ab071e5f5a51f89a.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/num_enum-0.7.6/src/lib.rs

/work/main/vendor/fuser/target/debug/deps/libnum_enum-ab071e5f5a51f89a.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/num_enum-0.7.6/src/lib.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/num_enum-0.7.6/src/lib.rs:
