//! TLS on the gateway's gRPC port against plaintext (`--only-tls`): three
//! gateways in front of the fast stdio server: one with `grpc.tls` (a
//! P-256 certificate for 127.0.0.1 made for the run by the `openssl` CLI),
//! one without, and one whose callers are identified by their client
//! certificate (`callers.mtls`, a SPIFFE ID, no token). Interleaved rounds,
//! each on a connection reused for every call: InvokeTool p50, calls/s at
//! 16 in flight and the gateway's CPU per call at 16 in flight. Then the
//! handshake: a new connection for each call (TCP, and the TLS handshake
//! on the TLS gateways), its p50 and the gateway's CPU per connection.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use toolgate::pb;

use super::measure::{self, CallFn, median};

const PLAIN: &str = "plaintext";
const TLS: &str = "TLS 1.3";
const MTLS: &str = "TLS 1.3, certificate caller";

/// New connections (one call each) per round of the handshake figure.
const HANDSHAKES: usize = 300;

type Client = pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>;

/// How a client reaches one gateway: plaintext, or TLS trusting `ca`
/// (presenting `identity`, certificate and key files, when given); with
/// the tenant's token, or none (a certificate caller).
struct ClientSide<'a> {
    ca: Option<&'a Path>,
    identity: Option<(&'a Path, &'a Path)>,
    token: bool,
}

/// The endpoint of a gateway on `port`.
fn endpoint(port: u16, side: &ClientSide<'_>) -> anyhow::Result<tonic::transport::Endpoint> {
    let scheme = if side.ca.is_some() { "https" } else { "http" };
    let mut endpoint =
        tonic::transport::Endpoint::from_shared(format!("{scheme}://127.0.0.1:{port}"))?
            .tcp_nodelay(true);
    if let Some(ca) = side.ca {
        let mut tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(std::fs::read(ca)?));
        if let Some((cert, key)) = side.identity {
            tls = tls.identity(tonic::transport::Identity::from_pem(
                std::fs::read(cert)?,
                std::fs::read(key)?,
            ));
        }
        endpoint = endpoint.tls_config(tls)?;
    }
    Ok(endpoint)
}

/// One InvokeTool of `fast__echo` on `client`.
fn invoke(client: Client, token: bool) -> CallFn {
    Arc::new(move || {
        let mut client = client.clone();
        Box::pin(async move {
            client.invoke_tool(request(token)).await?;
            Ok(())
        })
    })
}

/// A new connection, then one InvokeTool on it.
fn connect_and_invoke(endpoint: tonic::transport::Endpoint, token: bool) -> CallFn {
    Arc::new(move || {
        let endpoint = endpoint.clone();
        Box::pin(async move {
            let mut client = Client::new(endpoint.connect().await?);
            client.invoke_tool(request(token)).await?;
            Ok(())
        })
    })
}

fn request(token: bool) -> tonic::Request<pb::InvokeToolRequest> {
    let message = pb::InvokeToolRequest {
        name: "fast__echo".into(),
        arguments_json: r#"{"message":"hello"}"#.into(),
        ..Default::default()
    };
    if token {
        super::harness::authed(message)
    } else {
        tonic::Request::new(message)
    }
}

/// A client certificate of the run's CA whose SPIFFE ID names the tenant
/// `bench` (`spiffe://cluster.local/ns/bench/sa/agent`), by the `openssl`
/// CLI: `client.pem` and `client.key` in `dir`.
fn make_client_cert(dir: &Path) -> anyhow::Result<()> {
    std::fs::write(
        dir.join("client.ext"),
        "subjectAltName=URI:spiffe://cluster.local/ns/bench/sa/agent\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
    )?;
    for step in [
        "req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout client.key -out client.csr -subj /CN=agent",
        "x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 -extfile client.ext",
    ] {
        let output = std::process::Command::new("openssl")
            .args(step.split_whitespace())
            .current_dir(dir)
            .output()?;
        anyhow::ensure!(
            output.status.success(),
            "openssl {step}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// One row of the table: a figure of two paths, and how they compare.
struct Row {
    what: &'static str,
    digits: usize,
    a: (&'static str, f64),
    b: (&'static str, f64),
    compare: Compare,
}

/// How a row compares its two figures.
#[derive(Clone, Copy)]
enum Compare {
    /// The difference, with what it is.
    Added(&'static str),
    /// The ratio.
    Ratio,
}

/// One measured gateway and its figures over rounds.
struct Path_ {
    name: &'static str,
    gateway: super::harness::Proc,
    reused: CallFn,
    fresh: CallFn,
    p50: Vec<f64>,
    rps: Vec<f64>,
    cpu_ms: Vec<f64>,
    connect_p50: Vec<f64>,
    connect_cpu_ms: Vec<f64>,
}

impl Path_ {
    async fn measure(&mut self, sequential: usize, duration: Duration) -> anyhow::Result<()> {
        let pid = self.gateway.pid();
        self.p50
            .push(measure::sequential(&self.reused, sequential).await?.p50);
        let before = measure::cpu_seconds(pid);
        let (rate, calls) = measure::throughput(&self.reused, 16, duration).await?;
        let after = measure::cpu_seconds(pid);
        self.rps.push(rate);
        self.cpu_ms
            .push((after - before) * 1000.0 / calls.max(1) as f64);
        let before = measure::cpu_seconds(pid);
        let latency = measure::sequential(&self.fresh, HANDSHAKES).await?;
        let after = measure::cpu_seconds(pid);
        self.connect_p50.push(latency.p50);
        self.connect_cpu_ms
            .push((after - before) * 1000.0 / HANDSHAKES as f64);
        Ok(())
    }
}

/// Runs the figures and prints their rows of the targets table.
///
/// # Errors
/// When the certificates cannot be made, a gateway does not start, or a
/// call fails.
pub async fn report(rounds: usize, sequential: usize, duration: Duration) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!(
        "toolgate-bench-listener-tls-{}",
        std::process::id()
    ));
    super::https::make_certs(&dir)?;
    let exe = super::harness::exe().display().to_string();
    let servers = format!("      - name: fast\n        command: [\"{exe}\", \"mcp-server\"]\n");
    let tls_block = format!(
        "grpc:\n  tls:\n    cert_file: \"{}\"\n    key_file: \"{}\"\n",
        dir.join("server.pem").display(),
        dir.join("server.key").display()
    );
    make_client_cert(&dir)?;
    let ca = dir.join("ca.pem");
    let mtls_block = format!(
        "{tls_block}    client_ca_file: \"{}\"\n    client_auth: optional\n\
         callers:\n  mtls:\n    - trust_domain: cluster.local\n      tenant: 'cert.spiffe_id.path.split(\"/\")[2]'\n",
        ca.display()
    );
    let (cert, key) = (dir.join("client.pem"), dir.join("client.key"));
    let plain = ClientSide {
        ca: None,
        identity: None,
        token: true,
    };
    let tls = ClientSide {
        ca: Some(&ca),
        identity: None,
        token: true,
    };
    let mtls = ClientSide {
        ca: Some(&ca),
        identity: Some((&cert, &key)),
        token: false,
    };
    let mut paths = Vec::new();
    for (name, top, side) in [
        (PLAIN, String::new(), plain),
        (TLS, tls_block, tls),
        (MTLS, mtls_block, mtls),
    ] {
        let (gateway, port) = super::harness::gateway_with(|_| top.clone(), &servers).await;
        let endpoint = endpoint(port, &side)?;
        let client = Client::new(endpoint.connect().await?);
        let reused = invoke(client, side.token);
        // Until the server is listed (connected), then warm up.
        let started = std::time::Instant::now();
        while reused().await.is_err() {
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(30),
                "{name}: fast__echo never listed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        measure::sequential(&reused, 200).await?;
        paths.push(Path_ {
            name,
            gateway,
            reused,
            fresh: connect_and_invoke(endpoint, side.token),
            p50: Vec::new(),
            rps: Vec::new(),
            cpu_ms: Vec::new(),
            connect_p50: Vec::new(),
            connect_cpu_ms: Vec::new(),
        });
    }
    for round in 0..rounds.max(1) {
        for path in &mut paths {
            eprintln!("round {}: listener TLS: {}", round + 1, path.name);
            path.measure(sequential, duration).await?;
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let fig = |p: &Path_| {
        [
            median(p.p50.clone()),
            median(p.rps.clone()),
            median(p.cpu_ms.clone()),
            median(p.connect_p50.clone()),
            median(p.connect_cpu_ms.clone()),
        ]
    };
    let [plain, tls, mtls] = [fig(&paths[0]), fig(&paths[1]), fig(&paths[2])];
    let row = |index,
               what,
               digits,
               a: (&'static str, &[f64; 5]),
               b: (&'static str, &[f64; 5]),
               compare| Row {
        what,
        digits,
        a: (a.0, a.1[index]),
        b: (b.0, b.1[index]),
        compare,
    };
    let added = Compare::Added("ms added");
    let handshake = Compare::Added("ms for the handshake");
    let rows = [
        row(
            0,
            "InvokeTool p50 ms, reused connection",
            3,
            ("TLS", &tls),
            ("plaintext", &plain),
            added,
        ),
        row(
            1,
            "calls/s @16, reused connection",
            0,
            ("TLS", &tls),
            ("plaintext", &plain),
            Compare::Ratio,
        ),
        row(
            2,
            "gateway CPU ms/call @16",
            3,
            ("TLS", &tls),
            ("plaintext", &plain),
            Compare::Ratio,
        ),
        row(
            3,
            "new connection + InvokeTool p50 ms",
            3,
            ("TLS", &tls),
            ("plaintext", &plain),
            handshake,
        ),
        row(
            4,
            "gateway CPU ms per new connection + call",
            3,
            ("TLS", &tls),
            ("plaintext", &plain),
            handshake,
        ),
        row(
            0,
            "InvokeTool p50 ms",
            3,
            ("certificate caller (callers.mtls, no token)", &mtls),
            ("TLS with a token", &tls),
            added,
        ),
        row(
            2,
            "gateway CPU ms/call @16",
            3,
            ("certificate caller", &mtls),
            ("TLS with a token", &tls),
            added,
        ),
        row(
            3,
            "new connection + InvokeTool p50 ms",
            3,
            ("certificate caller (mutual TLS)", &mtls),
            ("TLS", &tls),
            added,
        ),
    ];
    let fmt = super::report::fmt;
    for Row {
        what,
        digits,
        a: (a_name, a),
        b: (b_name, b),
        compare,
    } in rows
    {
        let compared = match compare {
            Compare::Added(unit) => format!("{} {unit}", fmt(a - b, 3)),
            Compare::Ratio => fmt(a / b, 2),
        };
        println!(
            "| {what}: {a_name} {} / {b_name} {} | {compared} | | |",
            fmt(a, digits),
            fmt(b, digits)
        );
    }
    drop(paths);
    Ok(())
}
