//! Compiles `proto/toolgate/v1/toolgate.proto` with protox (no system `protoc`
//! needed) and generates the tonic server and client code.

fn main() -> anyhow::Result<()> {
    let proto = "proto/toolgate/v1/toolgate.proto";
    println!("cargo:rerun-if-changed={proto}");
    println!("cargo:rerun-if-changed=migrations");
    let descriptors = protox::compile([proto], ["proto"])?;
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    // Kept for server reflection.
    std::fs::write(
        out_dir.join("toolgate_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
