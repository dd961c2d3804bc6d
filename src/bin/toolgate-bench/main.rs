//! `toolgate-bench`: measures, side by side in one run, what a tool call
//! costs through toolgate against the floor of a gRPC hop (a bare tonic
//! server), a direct rmcp client, and mcpo; plus ListTools of a large
//! catalog and many-tenant figures. Prints a table and the target ratios.
//!
//! ```text
//! cargo run --release --bin toolgate-bench            # everything, 3 rounds
//! cargo run --release --bin toolgate-bench -- --help  # options
//! ```
//! See docs/performance.md.

mod alloc;
mod args;
mod ask_server;
mod floor;
mod floor_ratio;
mod guards;
mod harness;
mod https;
mod input;
mod lean_client;
mod listener_tls;
mod listing;
mod mcp_transport;
mod measure;
mod memory;
mod offerings;
mod offerings_server;
mod pairs;
mod paths;
mod policy;
mod policy_audit;
mod python;
mod report;
mod scale;
mod steps;
mod store;
mod tenants;
mod upstream;

use clap::Parser;

use args::{Args, Cmd};
use harness::toolgate_exe;
use paths::{Figures, Path_, build_paths, mcpo, measure};
use tenants::many_tenants;

/// Counts live heap bytes for `--only-idle-pairs` ([`alloc`]).
#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    match &args.command {
        Some(Cmd::McpServer {
            http: None, tools, ..
        }) => return upstream::serve_stdio(*tools).await,
        Some(Cmd::McpServer {
            http: Some(port),
            tools,
            tls: Some(dir),
        }) => return https::serve(*port, *tools, dir).await,
        Some(Cmd::McpServer {
            http: Some(port),
            tools,
            tls: None,
        }) => return upstream::serve_http(*port, *tools).await,
        Some(Cmd::AskServer { http: None }) => return ask_server::serve_stdio().await,
        Some(Cmd::OfferingsServer) => return offerings_server::serve_stdio().await,
        Some(Cmd::AskServer { http: Some(port) }) => return ask_server::serve_http(*port).await,
        Some(Cmd::DirectClient {
            url,
            in_flight,
            duration,
            client,
        }) => {
            return floor_ratio::direct_client(url.as_deref(), *client, *in_flight, *duration)
                .await;
        }
        Some(Cmd::EchoServer { port, list_file }) => {
            return floor::serve(*port, list_file.as_deref()).await;
        }
        None => {}
    }
    anyhow::ensure!(
        toolgate_exe().exists(),
        "build the gateway first: cargo build --release"
    );
    if args.only_idle_pairs {
        println!("| target | figure | goal | |");
        println!("| --- | --- | --- | --- |");
        return pairs::report(args.rounds, args.pairs_tenants).await;
    }
    if args.only_floor {
        println!("| target | figure | goal | |");
        println!("| --- | --- | --- | --- |");
        return floor_ratio::report(args.rounds, args.duration).await;
    }
    if args.only_steps {
        return steps::report(args.rounds, args.sequential, args.duration).await;
    }
    if args.only_tenants {
        return memory::report(args.rounds).await;
    }
    if args.only_store {
        println!("| target | figure | goal | |");
        println!("| --- | --- | --- | --- |");
        return store::report().await;
    }
    if args.only_policy {
        println!("| target | figure | goal | |");
        println!("| --- | --- | --- | --- |");
        return policy::report(args.rounds).await;
    }
    if args.only_listing {
        println!("| target | figure | goal | |");
        println!("| --- | --- | --- | --- |");
        return listing::report().await;
    }
    if args.only_http {
        return https::report(&args).await;
    }
    if args.only_tls {
        println!("| target | figure | goal | |");
        println!("| --- | --- | --- | --- |");
        return listener_tls::report(args.rounds, args.sequential, args.duration).await;
    }
    if args.only_python
        || args.only_scale
        || args.only_policy_audit
        || args.only_mcp_transport
        || args.only_input
        || args.only_offerings
        || args.only_guards
    {
        println!("| target | figure | goal | |");
        println!("| --- | --- | --- | --- |");
        return extras(&args, true).await;
    }
    eprintln!(
        "toolgate-bench: {} round(s), {:?} per throughput run, {} sequential calls",
        args.rounds, args.duration, args.sequential
    );
    let paths = build_paths().await?;
    let (figures, mcpo_runs) = rounds(&args, &paths).await?;
    let (summary, mcpo_rps16) = report::table(&paths, &figures, &mcpo_runs);
    report::targets(&summary, mcpo_rps16);
    listing::report().await?;
    if !args.skip_tenants {
        let (serving_ms, idle_rss, live_rss) = many_tenants().await?;
        report::tenants(serving_ms, idle_rss, live_rss);
    }
    extras(&args, false).await?;
    policy::report(args.rounds).await?;
    Ok(())
}

/// The Python-client, policy + audit, questions and tasks, resources and
/// prompts, one guard, and large-scale figures: those asked
/// for with `--only-*` when `only`, else those not skipped.
async fn extras(args: &Args, only: bool) -> anyhow::Result<()> {
    if (only && args.only_python) || (!only && !args.skip_python) {
        python::report(args.rounds, args.duration).await?;
    }
    if (only && args.only_policy_audit) || (!only && !args.skip_policy_audit) {
        policy_audit::report(args.rounds, args.sequential, args.duration).await?;
    }
    if (only && args.only_mcp_transport) || (!only && !args.skip_mcp_transport) {
        mcp_transport::report(args.rounds, args.sequential, args.duration).await?;
    }
    if (only && args.only_input) || (!only && !args.skip_input) {
        input::report(args.rounds).await?;
    }
    if (only && args.only_offerings) || (!only && !args.skip_offerings) {
        offerings::report(args.rounds).await?;
    }
    if (only && args.only_guards) || (!only && !args.skip_guards) {
        guards::report(args.rounds, args.sequential, args.duration).await?;
    }
    if (only && args.only_scale) || (!only && !args.skip_scale) {
        scale::report(args.scale_duration).await?;
    }
    Ok(())
}

/// Measures every path `args.rounds` times, interleaved (and mcpo each
/// round unless skipped): the figures of each path, and mcpo's runs.
async fn rounds(
    args: &Args,
    paths: &[Path_],
) -> anyhow::Result<(Vec<Figures>, Vec<serde_json::Value>)> {
    let mut figures: Vec<Figures> = vec![Figures::default(); paths.len()];
    let mut mcpo_runs = Vec::new();
    for round in 0..args.rounds {
        for (path, figures) in paths.iter().zip(figures.iter_mut()) {
            eprintln!("round {}: {}", round + 1, path.name);
            measure(path, args, figures).await?;
        }
        if !args.skip_mcpo {
            eprintln!("round {}: mcpo", round + 1);
            match mcpo(args) {
                Ok(v) => mcpo_runs.push(v),
                Err(e) => eprintln!("  mcpo skipped: {e}"),
            }
        }
    }

    Ok((figures, mcpo_runs))
}
