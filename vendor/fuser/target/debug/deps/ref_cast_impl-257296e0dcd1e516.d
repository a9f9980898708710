/work/main/vendor/fuser/target/debug/deps/ref_cast_impl-257296e0dcd1e516.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-impl-1.0.27/src/lib.rs

/work/main/vendor/fuser/target/debug/deps/libref_cast_impl-257296e0dcd1e516.so: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-impl-1.0.27/src/lib.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-impl-1.0.27/src/lib.rs:

# env-dep:CARGO_PKG_VERSION_PATCH=27
