/work/main/vendor/fuser/target/debug/deps/cfg_aliases-59d73828b2776613.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/cfg_aliases-0.2.2/src/lib.rs

/work/main/vendor/fuser/target/debug/deps/libcfg_aliases-59d73828b2776613.rlib: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/cfg_aliases-0.2.2/src/lib.rs

/work/main/vendor/fuser/target/debug/deps/libcfg_aliases-59d73828b2776613.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/cfg_aliases-0.2.2/src/lib.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/cfg_aliases-0.2.2/src/lib.rs:
