/work/main/vendor/fuser/target/debug/deps/pkg_config-e098199d344fbb6b.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/pkg-config-0.3.34/src/lib.rs

/work/main/vendor/fuser/target/debug/deps/libpkg_config-e098199d344fbb6b.rlib: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/pkg-config-0.3.34/src/lib.rs

/work/main/vendor/fuser/target/debug/deps/libpkg_config-e098199d344fbb6b.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/pkg-config-0.3.34/src/lib.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/pkg-config-0.3.34/src/lib.rs:
