//! Compiles `proto/toolgate/v1/toolgate.proto` (the workers' API),
//! `proto/toolgate/admin/v1/admin.proto` (the admin API) and
//! `proto/toolgate/guard/v1/guard.proto` (the guard API toolgate calls)
//! with protox (no system `protoc` needed) and generates the tonic server
//! and client code.
//!
//! MCP's own gRPC transport (`model_context_protocol.Mcp`, release 0.2.0
//! of `mcp-grpc-transport-proto`) comes as a descriptor set
//! (`proto-vendor/mcp_grpc/`, see its README): its messages, client and
//! server go to `OUT_DIR/model_context_protocol.rs` (`toolgate::pb::mcp`).
//!
//! Two passes over the same descriptors: the messages and the client go to
//! `OUT_DIR/toolgate.v1.rs` (`toolgate::pb`); the server alone goes to
//! `OUT_DIR/server/toolgate.v1.rs`, with every message taken from
//! `crate::pb` except `ListToolsResponse`, which the server answers as
//! `crate::grpc::reply::ListToolsReply`: the same message on the wire, with
//! the tools encoded once per catalog snapshot rather than per call.

fn main() -> anyhow::Result<()> {
    let protos = [
        "proto/toolgate/v1/toolgate.proto",
        "proto/toolgate/v1/call_approvals.proto",
        "proto/toolgate/admin/v1/admin.proto",
        "proto/toolgate/guard/v1/guard.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    println!("cargo:rerun-if-changed=migrations");
    let descriptors = protox::compile(protos, ["proto"])?;
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    // Kept for server reflection: the services the gateway serves, not the
    // guard API it calls.
    let mut served = descriptors.clone();
    served
        .file
        .retain(|file| file.package() != "toolgate.guard.v1");
    std::fs::write(
        out_dir.join("toolgate_descriptor.bin"),
        prost::Message::encode_to_vec(&served),
    )?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_fds(descriptors.clone())?;
    let server_dir = out_dir.join("server");
    std::fs::create_dir_all(&server_dir)?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(false)
        .out_dir(&server_dir)
        .extern_path(".toolgate.v1", "crate::pb")
        .extern_path(".toolgate.admin.v1", "crate::pb::admin")
        .extern_path(".toolgate.guard.v1", "crate::pb::guard")
        .extern_path(
            ".toolgate.v1.ListToolsResponse",
            "crate::grpc::reply::ListToolsReply",
        )
        .compile_fds(descriptors)?;
    mcp_transport(&out_dir)
}

/// The vendored descriptor set of MCP's gRPC transport: its code (both
/// sides) and, for reflection, the set itself.
fn mcp_transport(out_dir: &std::path::Path) -> anyhow::Result<()> {
    const SET: &str = "proto-vendor/mcp_grpc/mcp_grpc_transport_proto-0.2.0.binpb";
    println!("cargo:rerun-if-changed={SET}");
    let bytes = std::fs::read(SET)?;
    let set = <prost_types::FileDescriptorSet as prost::Message>::decode(bytes.as_slice())?;
    std::fs::write(out_dir.join("mcp_transport_descriptor.bin"), &bytes)?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(set)?;
    Ok(())
}
