/work/main/vendor/fuser/target/debug/deps/page_size-8f83216057c6baae.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/page_size-0.6.0/src/lib.rs

/work/main/vendor/fuser/target/debug/deps/libpage_size-8f83216057c6baae.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/page_size-0.6.0/src/lib.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/page_size-0.6.0/src/lib.rs:
