//! Generates the peer protocol's messages and tonic service from `proto/peer.proto`
//! (needs `protoc`: Debian `protobuf-compiler`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/peer.proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/peer.proto"], &["proto"])?;
    Ok(())
}
