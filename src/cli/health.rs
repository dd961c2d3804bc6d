//! `toolgate health`: the standard gRPC health check of a running gateway,
//! over the same channel as the client verbs (TLS and a client certificate
//! included). Kubernetes' native gRPC probes speak plaintext only, so a
//! gateway with `grpc.tls` is probed with this verb as an exec probe
//! (deploy/kubernetes/components/tls).

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// `toolgate health` options.
#[derive(Debug, Args)]
pub(super) struct HealthArgs {
    /// The gateway's gRPC address (`host:port`, `http://...` or
    /// `https://...`).
    #[arg(long, default_value = "http://127.0.0.1:50051", env = "TOOLGATE_ADDR")]
    addr: String,
    /// TLS to the gateway.
    #[command(flatten)]
    tls: super::channel::ClientTls,
    /// The service whose status is asked: `toolgate.v1.ToolGateway` (the
    /// readiness a load balancer wants: NOT_SERVING once shutdown starts),
    /// or empty for the server as a whole.
    #[arg(long, default_value = "")]
    service: String,
    /// Deadline of the whole check, connecting included.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// Exit 0 when the service is SERVING; 1 when it is not (its status
/// printed); 14 when the gateway cannot be reached in time; 64 for a
/// usage problem.
pub(super) async fn run(args: HealthArgs) -> ExitCode {
    match tokio::time::timeout(args.timeout, check(&args)).await {
        Ok(code) => code,
        Err(_) => {
            eprintln!("toolgate health: no answer within {:?}", args.timeout);
            ExitCode::from(tonic::Code::Unavailable as u8)
        }
    }
}

async fn check(args: &HealthArgs) -> ExitCode {
    use super::channel::ChannelError;
    let channel = match super::channel::open(&args.addr, &args.tls, "the gateway").await {
        Ok(channel) => channel,
        Err(ChannelError::Usage(message)) => return super::client::usage(&message),
        Err(ChannelError::Unavailable(message)) => {
            eprintln!("toolgate health: {message}");
            return ExitCode::from(tonic::Code::Unavailable as u8);
        }
    };
    let request = HealthCheckRequest {
        service: args.service.clone(),
    };
    match HealthClient::new(channel).check(request).await {
        Ok(response) => {
            let status = response.into_inner().status();
            println!("{}", status.as_str_name());
            if status == ServingStatus::Serving {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(status) => {
            eprintln!("toolgate health: {:?}: {}", status.code(), status.message());
            ExitCode::from(status.code() as u8)
        }
    }
}
