/work/main/vendor/fuser/target/debug/deps/equivalent-1a7d751ca7e2c113.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/equivalent-1.0.3/src/lib.rs

/work/main/vendor/fuser/target/debug/deps/libequivalent-1a7d751ca7e2c113.rlib: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/equivalent-1.0.3/src/lib.rs

/work/main/vendor/fuser/target/debug/deps/libequivalent-1a7d751ca7e2c113.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/equivalent-1.0.3/src/lib.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/equivalent-1.0.3/src/lib.rs:
