//! Generates the peer protocol's messages and tonic service from `proto/peer.proto`
//! (needs `protoc`: Debian `protobuf-compiler`), and says whether the etcd directory
//! (`src/etcd/`) is part of this tree: the lock service and the directory are built in
//! parallel, and each must build without the other until both are in one tree.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/peer.proto");
    println!("cargo:rerun-if-changed=src/etcd/mod.rs");
    println!("cargo::rustc-check-cfg=cfg(vfscale_etcd)");
    if std::path::Path::new("src/etcd/mod.rs").exists() {
        println!("cargo::rustc-cfg=vfscale_etcd");
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/peer.proto"], &["proto"])?;
    Ok(())
}
