/work/main/vendor/fuser/target/debug/deps/ref_cast-e40542d92cafa278.d: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-1.0.27/src/lib.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-1.0.27/src/custom.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-1.0.27/src/layout.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-1.0.27/src/trivial.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-1.0.27/src/private.rs /work/main/vendor/fuser/target/debug/build/ref-cast-9f18cfd9ed482a1f/out/private.rs

/work/main/vendor/fuser/target/debug/deps/libref_cast-e40542d92cafa278.rmeta: /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-1.0.27/src/lib.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-1.0.27/src/custom.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-1.0.27/src/layout.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-1.0.27/src/trivial.rs /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-1.0.27/src/private.rs /work/main/vendor/fuser/target/debug/build/ref-cast-9f18cfd9ed482a1f/out/private.rs

/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-1.0.27/src/lib.rs:
/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-1.0.27/src/custom.rs:
/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-1.0.27/src/layout.rs:
/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-1.0.27/src/trivial.rs:
/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/ref-cast-1.0.27/src/private.rs:
/work/main/vendor/fuser/target/debug/build/ref-cast-9f18cfd9ed482a1f/out/private.rs:

# env-dep:OUT_DIR=/work/main/vendor/fuser/target/debug/build/ref-cast-9f18cfd9ed482a1f/out
