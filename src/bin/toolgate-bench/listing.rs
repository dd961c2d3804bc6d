//! ListTools of a 10,000-tool catalog against the floor: a bare tonic
//! server answering the very bytes the gateway answered (recorded once),
//! written as they are. Both sides are read undecoded (raw bytes) for the
//! ratio, by a tonic client and by a Python grpcio client; the decoded
//! times (what a worker waits for) are reported beside them.

use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use tokio::process::Command;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use toolgate::pb;

use crate::harness::{authed, exe, fast_http_server, free_port, gateway, repo, spawn, wait_port};
use crate::report::{fmt, verdict};

const TOOLS: usize = 10_000;
const CALLS: usize = 100;
const WARMUP: usize = 10;
const METHOD: &str = "/toolgate.v1.ToolGateway/ListTools";

/// p50s in milliseconds, gateway and floor side by side.
#[derive(Debug, Default)]
struct Pair {
    gateway: f64,
    floor: f64,
}

/// Prints the ListTools rows of the targets table.
pub async fn report() -> anyhow::Result<()> {
    let (server, port) = fast_http_server(TOOLS - 1);
    wait_port(port).await;
    let (gw, gw_port) = gateway(&format!(
        "      - name: big\n        url: \"http://127.0.0.1:{port}/mcp\"\n        max_list_pages: 20\n"
    ))
    .await;
    let gw_channel = channel(gw_port).await?;
    let recorded = whole_catalog(&gw_channel).await?;
    let dir = tempfile_dir()?;
    let recorded_path = dir.join("list-tools.bin");
    std::fs::write(&recorded_path, &recorded)?;

    let floor_port = free_port();
    let mut command = std::process::Command::new(exe());
    command
        .args(["echo-server", &floor_port.to_string(), "--list-file"])
        .arg(&recorded_path);
    let _floor = spawn(command);
    wait_port(floor_port).await;
    let floor_channel = channel(floor_port).await?;
    anyhow::ensure!(
        raw_list(&floor_channel).await? == recorded,
        "the floor does not answer the recorded bytes"
    );

    let (undecoded, decoded) = rust_client(&gw_channel, &floor_channel).await?;
    let python = python_client(gw_port, floor_port).await;
    drop((gw, server));
    let _ = std::fs::remove_dir_all(&dir);

    let bytes = recorded.len();
    let ratio = undecoded.gateway / undecoded.floor;
    println!(
        "| ListTools, {TOOLS} tools ({bytes} bytes), undecoded, tonic client: toolgate p50 {} ms / floor p50 {} ms | {} | ≤ 1.3 | {} |",
        fmt(undecoded.gateway, 2),
        fmt(undecoded.floor, 2),
        fmt(ratio, 2),
        verdict(ratio <= 1.3)
    );
    println!(
        "| ListTools, {TOOLS} tools, decoded, tonic client: toolgate p50 {} ms / floor p50 {} ms | {} | | |",
        fmt(decoded.gateway, 2),
        fmt(decoded.floor, 2),
        fmt(decoded.gateway / decoded.floor, 2),
    );
    match python {
        Ok(py) => {
            let ratio = py.undecoded.gateway / py.undecoded.floor;
            println!(
                "| ListTools, {TOOLS} tools, undecoded, Python grpcio client: toolgate p50 {} ms / floor p50 {} ms | {} | ≤ 1.3 | {} |",
                fmt(py.undecoded.gateway, 2),
                fmt(py.undecoded.floor, 2),
                fmt(ratio, 2),
                verdict(ratio <= 1.3)
            );
            println!(
                "| ListTools, {TOOLS} tools, decoded, Python grpcio client: toolgate p50 (floor p50 {} ms) | {} ms | ≤ 10 ms | {} |",
                fmt(py.decoded.floor, 2),
                fmt(py.decoded.gateway, 2),
                verdict(py.decoded.gateway <= 10.0)
            );
        }
        Err(e) => eprintln!("  Python ListTools client skipped: {e}"),
    }
    Ok(())
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("toolgate-bench-listing-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

async fn channel(port: u16) -> anyhow::Result<tonic::transport::Channel> {
    Ok(
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))?
            .tcp_nodelay(true)
            .connect()
            .await?,
    )
}

/// The gateway's answer, raw, once it lists the whole catalog.
async fn whole_catalog(channel: &tonic::transport::Channel) -> anyhow::Result<Bytes> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let raw = raw_list(channel).await?;
        let listed = <pb::ListToolsResponse as prost::Message>::decode(raw.clone())?;
        if listed.tools.len() == TOOLS {
            return Ok(raw);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the {TOOLS}-tool catalog never appeared"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One ListTools, its answer as bytes (not decoded).
async fn raw_list(channel: &tonic::transport::Channel) -> anyhow::Result<Bytes> {
    let mut grpc = tonic::client::Grpc::new(channel.clone()).max_decoding_message_size(usize::MAX);
    grpc.ready().await?;
    let answer = grpc
        .unary(
            authed(Bytes::new()),
            http::uri::PathAndQuery::from_static(METHOD),
            RawCodec,
        )
        .await?;
    Ok(answer.into_inner())
}

/// One ListTools, decoded.
async fn decoded_list(channel: &tonic::transport::Channel) -> anyhow::Result<usize> {
    let mut client = pb::tool_gateway_client::ToolGatewayClient::new(channel.clone())
        .max_decoding_message_size(usize::MAX);
    let listed = client
        .list_tools(authed(pb::ListToolsRequest::default()))
        .await?
        .into_inner();
    Ok(listed.tools.len())
}

/// Sequential calls alternating between the two sides: (undecoded,
/// decoded) p50s.
async fn rust_client(
    gateway: &tonic::transport::Channel,
    floor: &tonic::transport::Channel,
) -> anyhow::Result<(Pair, Pair)> {
    let mut samples: [Vec<f64>; 4] = Default::default();
    for i in 0..WARMUP + CALLS {
        for (slot, channel) in [gateway, floor].into_iter().enumerate() {
            let started = Instant::now();
            raw_list(channel).await?;
            let undecoded = started.elapsed().as_secs_f64() * 1000.0;
            let started = Instant::now();
            anyhow::ensure!(decoded_list(channel).await? == TOOLS, "a short listing");
            let decoded = started.elapsed().as_secs_f64() * 1000.0;
            if i >= WARMUP {
                samples[slot].push(undecoded);
                samples[2 + slot].push(decoded);
            }
        }
    }
    let [gu, fu, gd, fd] = samples.map(crate::measure::median);
    Ok((
        Pair {
            gateway: gu,
            floor: fu,
        },
        Pair {
            gateway: gd,
            floor: fd,
        },
    ))
}

struct PythonFigures {
    undecoded: Pair,
    decoded: Pair,
}

/// bench/python/listing.py against both sides.
async fn python_client(gateway: u16, floor: u16) -> anyhow::Result<PythonFigures> {
    let python = repo().join(".venv/bin/python");
    anyhow::ensure!(python.exists(), "no .venv (run tests/setup.sh)");
    let output = Command::new(python)
        .arg(repo().join("bench/python/listing.py"))
        .args(["--gateway", &format!("127.0.0.1:{gateway}")])
        .args(["--floor", &format!("127.0.0.1:{floor}")])
        .args([
            "--calls",
            &CALLS.to_string(),
            "--warmup",
            &WARMUP.to_string(),
        ])
        .output()
        .await?;
    anyhow::ensure!(
        output.status.success(),
        "bench/python/listing.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let f = |k: &str| {
        v[k].as_f64()
            .ok_or_else(|| anyhow::anyhow!("no {k} in {v}"))
    };
    Ok(PythonFigures {
        undecoded: Pair {
            gateway: f("gateway_undecoded_p50_ms")?,
            floor: f("floor_undecoded_p50_ms")?,
        },
        decoded: Pair {
            gateway: f("gateway_decoded_p50_ms")?,
            floor: f("floor_decoded_p50_ms")?,
        },
    })
}

/// Sends bytes as they are and hands the answer over undecoded.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        let len = src.remaining();
        Ok(Some(src.copy_to_bytes(len)))
    }
}
