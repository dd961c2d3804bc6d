//! `toolgate call-approvals ...`: CallApprovalsService from the command
//! line, for the people who approve tool calls a `require_approval` rule
//! holds (not to be confused with `toolgate approve`, which approves tool
//! definitions). `list`, `show`, `approve`, `deny` and `watch`; the
//! address, token (`TOOLGATE_TOKEN` or `--token-file`: a worker's token,
//! or an approver token of the tenant), TLS, `--json` and exit codes as
//! for `toolgate tools` and `call`.

use std::io::Write;
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use tonic::transport::Channel;

use crate::pb;
use crate::pb::call_approvals_service_client::CallApprovalsServiceClient;

use super::client::{Connection, DEFAULT_TIMEOUT, authorized, fail, open, request, token, usage};
use super::when;

/// `toolgate call-approvals` subcommands.
#[derive(Debug, Subcommand)]
pub(super) enum CallApprovalsCommand {
    /// The tenant's call approvals in one state (pending by default),
    /// newest first.
    List(ListArgs),
    /// Every field of one call approval, its arguments pretty-printed.
    Show(ShowArgs),
    /// Approve a pending call approval: the held call may then run (the
    /// worker's retry with the id, or its waiting stream).
    Approve(DecideArgs),
    /// Deny a pending call approval: a worker waiting on it ends with
    /// PERMISSION_DENIED (APPROVAL_DENIED).
    Deny(DecideArgs),
    /// The pending call approvals, then every change of the tenant's
    /// approvals as it happens, until Ctrl-C.
    Watch(WatchArgs),
}

/// A state to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum State {
    /// Waiting for a decision.
    Pending,
    /// Approved, not used up yet.
    Approved,
    /// Denied by an approver.
    Denied,
    /// Not decided, or not used, in time.
    Expired,
    /// Approved and used up.
    Spent,
}

impl From<State> for pb::CallApprovalState {
    fn from(state: State) -> Self {
        match state {
            State::Pending => Self::Pending,
            State::Approved => Self::Approved,
            State::Denied => Self::Denied,
            State::Expired => Self::Expired,
            State::Spent => Self::Spent,
        }
    }
}

/// `toolgate call-approvals list` options.
#[derive(Debug, Args)]
pub(super) struct ListArgs {
    #[command(flatten)]
    connection: Connection,
    /// Which state (default pending).
    #[arg(long, value_enum)]
    state: Option<State>,
    /// Most to list (default 100, at most 1000).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    limit: Option<u32>,
}

/// `toolgate call-approvals show` options.
#[derive(Debug, Args)]
pub(super) struct ShowArgs {
    #[command(flatten)]
    connection: Connection,
    /// The approval's id (`apv_...`).
    id: String,
}

/// `toolgate call-approvals approve` and `deny` options.
#[derive(Debug, Args)]
pub(super) struct DecideArgs {
    #[command(flatten)]
    connection: Connection,
    /// The approval's id (`apv_...`).
    id: String,
    /// Why, for the audit trail and the worker (at most 1024 characters).
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
}

/// `toolgate call-approvals watch` options.
#[derive(Debug, Args)]
pub(super) struct WatchArgs {
    #[command(flatten)]
    connection: Connection,
}

/// Runs a `toolgate call-approvals` subcommand.
pub(super) async fn run(command: CallApprovalsCommand) -> ExitCode {
    let result = match command {
        CallApprovalsCommand::List(args) => list(args).await,
        CallApprovalsCommand::Show(args) => show(args).await,
        CallApprovalsCommand::Approve(args) => decide(args, true).await,
        CallApprovalsCommand::Deny(args) => decide(args, false).await,
        CallApprovalsCommand::Watch(args) => watch(args).await,
    };
    result.unwrap_or_else(|code| code)
}

/// A client of the gateway's CallApprovalsService and the caller's token.
struct Approver<'a> {
    client: CallApprovalsServiceClient<Channel>,
    token: String,
    connection: &'a Connection,
}

impl<'a> Approver<'a> {
    /// The token (a usage error without one), then the channel.
    async fn connect(connection: &'a Connection) -> Result<Approver<'a>, ExitCode> {
        let token = token(connection).map_err(|e| usage(&e))?;
        // A token that cannot be an HTTP header is a usage error before
        // anything is sent.
        authorized((), &token).map_err(|e| usage(&e))?;
        let channel = open(connection)
            .await
            .map_err(|status| fail(&status, connection.json))?;
        Ok(Approver {
            client: CallApprovalsServiceClient::new(channel),
            token,
            connection,
        })
    }

    /// `message` with the token and the deadline of a unary RPC.
    fn request<T>(&self, message: T) -> Result<tonic::Request<T>, ExitCode> {
        let timeout = self.connection.timeout.unwrap_or(DEFAULT_TIMEOUT);
        request(message, &self.token, timeout).map_err(|e| usage(&e))
    }

    /// A failed RPC, printed, as the exit code.
    fn fail(&self, status: &tonic::Status) -> ExitCode {
        fail(status, self.connection.json)
    }
}

/// `list`: a table, or a JSON object per line.
async fn list(args: ListArgs) -> Result<ExitCode, ExitCode> {
    let c = &args.connection;
    let mut approver = Approver::connect(c).await?;
    let state = args
        .state
        .map_or(pb::CallApprovalState::Pending, pb::CallApprovalState::from);
    let message = pb::ListCallApprovalsRequest {
        state: state as i32,
        // 0: the gateway's default.
        limit: args.limit.unwrap_or_default(),
    };
    let request = approver.request(message)?;
    let listing = match approver.client.list_call_approvals(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => return Err(approver.fail(&status)),
    };
    let mut out = std::io::stdout().lock();
    if c.json {
        for approval in &listing.approvals {
            let _ = writeln!(out, "{}", json(approval));
        }
    } else {
        let shown = table(&listing.approvals, state_name(state as i32), when::now_ms());
        let _ = write!(out, "{shown}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `show`: every field.
async fn show(args: ShowArgs) -> Result<ExitCode, ExitCode> {
    let mut approver = Approver::connect(&args.connection).await?;
    let request = approver.request(pb::GetCallApprovalRequest {
        approval_id: args.id.clone(),
    })?;
    match approver.client.get_call_approval(request).await {
        Ok(response) => print_one(response.into_inner().approval, args.connection.json),
        Err(status) => Err(approver.fail(&status)),
    }
}

/// `approve` or `deny`: the approval as decided.
async fn decide(args: DecideArgs, approve: bool) -> Result<ExitCode, ExitCode> {
    let mut approver = Approver::connect(&args.connection).await?;
    let (approval_id, reason) = (args.id.clone(), args.reason.clone().unwrap_or_default());
    let decided = if approve {
        let request = approver.request(pb::ApproveCallRequest {
            approval_id,
            reason,
        })?;
        approver
            .client
            .approve_call(request)
            .await
            .map(|r| r.into_inner().approval)
    } else {
        let request = approver.request(pb::DenyCallRequest {
            approval_id,
            reason,
        })?;
        approver
            .client
            .deny_call(request)
            .await
            .map(|r| r.into_inner().approval)
    };
    match decided {
        Ok(approval) => print_one(approval, args.connection.json),
        Err(status) => Err(approver.fail(&status)),
    }
}

/// Prints one approval: [`details`], or [`json`] on one line.
fn print_one(approval: Option<pb::CallApproval>, json_out: bool) -> Result<ExitCode, ExitCode> {
    let Some(approval) = approval else {
        let status = tonic::Status::unknown("the gateway answered without the approval");
        return Err(fail(&status, json_out));
    };
    let mut out = std::io::stdout().lock();
    if json_out {
        let _ = writeln!(out, "{}", json(&approval));
    } else {
        let _ = write!(out, "{}", details(&approval, when::now_ms()));
    }
    Ok(ExitCode::SUCCESS)
}

/// `watch`: a line (or a JSON object) per message until Ctrl-C (exit 0),
/// the stream's failure, or its end (`UNAVAILABLE`: watch again).
async fn watch(args: WatchArgs) -> Result<ExitCode, ExitCode> {
    let c = &args.connection;
    let mut approver = Approver::connect(c).await?;
    // No deadline unless one is asked for: a watch runs until Ctrl-C.
    let request = match c.timeout {
        Some(_) => approver.request(pb::WatchCallApprovalsRequest {})?,
        None => {
            authorized(pb::WatchCallApprovalsRequest {}, &approver.token).map_err(|e| usage(&e))?
        }
    };
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut stream = tokio::select! {
        _ = &mut ctrl_c => return Ok(ExitCode::SUCCESS),
        opened = approver.client.watch_call_approvals(request) => match opened {
            Ok(response) => response.into_inner(),
            Err(status) => return Err(approver.fail(&status)),
        },
    };
    loop {
        let message = tokio::select! {
            _ = &mut ctrl_c => return Ok(ExitCode::SUCCESS),
            message = stream.message() => message,
        };
        let approval = match message {
            Ok(Some(message)) => message.approval.unwrap_or_default(),
            Ok(None) => {
                let ended = tonic::Status::unavailable("the gateway ended the watch: watch again");
                return Err(approver.fail(&ended));
            }
            Err(status) => return Err(approver.fail(&status)),
        };
        let mut out = std::io::stdout().lock();
        let line = if c.json {
            json(&approval).to_string()
        } else {
            watch_line(&approval, when::now_ms())
        };
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// The state as the verbs write it (`pending`, ...).
fn state_name(state: i32) -> &'static str {
    match pb::CallApprovalState::try_from(state) {
        Ok(pb::CallApprovalState::Pending) => "pending",
        Ok(pb::CallApprovalState::Approved) => "approved",
        Ok(pb::CallApprovalState::Denied) => "denied",
        Ok(pb::CallApprovalState::Expired) => "expired",
        Ok(pb::CallApprovalState::Spent) => "spent",
        Ok(pb::CallApprovalState::Unspecified) | Err(_) => "unknown",
    }
}

/// The subject as shown: `(tenant)` for a call of the tenant itself.
fn subject(approval: &pb::CallApproval) -> &str {
    if approval.subject.is_empty() {
        "(tenant)"
    } else {
        &approval.subject
    }
}

/// `yes` or `no`.
fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

/// The cells of one row of `list`'s table.
fn cells(approval: &pb::CallApproval, now_ms: i64) -> [String; 7] {
    [
        approval.approval_id.clone(),
        state_name(approval.state).to_owned(),
        approval.tool.clone(),
        subject(approval).to_owned(),
        approval.rule.clone(),
        when::relative(approval.expires_at_unix_ms, now_ms),
        yes_no(approval.may_decide).to_owned(),
    ]
}

/// `list`'s table: a header, a row per approval, and the count (`state`
/// names what was listed).
fn table(approvals: &[pb::CallApproval], state: &str, now_ms: i64) -> String {
    const HEADER: [&str; 7] = [
        "ID",
        "STATE",
        "TOOL",
        "SUBJECT",
        "RULE",
        "EXPIRES",
        "MAY DECIDE",
    ];
    if approvals.is_empty() {
        return format!("no {state} call approvals\n");
    }
    let rows: Vec<[String; 7]> = approvals.iter().map(|a| cells(a, now_ms)).collect();
    let mut widths = HEADER.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 7]| {
        let mut line = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  "));
            }
        }
        line.push('\n');
        line
    };
    let mut text = line(HEADER);
    for row in &rows {
        text.push_str(&line(row.each_ref().map(String::as_str)));
    }
    text.push_str(&format!("\n{} {state} call approval(s)\n", rows.len()));
    text
}

/// The arguments pretty-printed (as sent, when they are not JSON).
fn pretty_arguments(arguments_json: &str) -> String {
    serde_json::from_str::<serde_json::Value>(arguments_json)
        .ok()
        .and_then(|value| serde_json::to_string_pretty(&value).ok())
        .unwrap_or_else(|| arguments_json.to_owned())
}

/// Every field, one per line, then the arguments pretty-printed.
fn details(approval: &pb::CallApproval, now_ms: i64) -> String {
    let or_none = |text: &str| {
        if text.is_empty() {
            "-".to_owned()
        } else {
            text.to_owned()
        }
    };
    let decided_at = if approval.decided_at_unix_ms == 0 {
        "-".to_owned()
    } else {
        when::at(approval.decided_at_unix_ms, now_ms)
    };
    let fields = [
        ("approval_id", approval.approval_id.clone()),
        ("state", state_name(approval.state).to_owned()),
        ("tool", approval.tool.clone()),
        ("server", approval.server.clone()),
        ("definition_hash", approval.definition_hash.clone()),
        ("subject", subject(approval).to_owned()),
        ("rule", approval.rule.clone()),
        ("created_at", when::at(approval.created_at_unix_ms, now_ms)),
        ("expires_at", when::at(approval.expires_at_unix_ms, now_ms)),
        ("uses_left", approval.uses_left.to_string()),
        ("may_decide", yes_no(approval.may_decide).to_owned()),
        ("decided_by", or_none(&approval.decided_by)),
        ("decided_at", decided_at),
        ("reason", or_none(&approval.reason)),
        ("arguments_sha256", approval.arguments_sha256.clone()),
    ];
    let mut text = String::new();
    for (name, value) in fields {
        text.push_str(&format!("{:<17} {value}\n", format!("{name}:")));
    }
    text.push_str("arguments:\n");
    for line in pretty_arguments(&approval.arguments_json).lines() {
        text.push_str(&format!("  {line}\n"));
    }
    text
}

/// One line of `watch`: the state, id, tool, subject, rule and expiry;
/// who decided and why once decided; whether the caller may decide.
fn watch_line(approval: &pb::CallApproval, now_ms: i64) -> String {
    let mut line = format!(
        "{:<8}  {}  {}  subject {}  rule {}  expires {}",
        state_name(approval.state),
        approval.approval_id,
        approval.tool,
        subject(approval),
        approval.rule,
        when::relative(approval.expires_at_unix_ms, now_ms)
    );
    if !approval.decided_by.is_empty() {
        line.push_str(&format!("  decided by {}", approval.decided_by));
        if !approval.reason.is_empty() {
            line.push_str(&format!(": {}", approval.reason));
        }
    }
    if approval.may_decide {
        line.push_str("  (you may decide)");
    }
    line
}

/// One approval as a JSON object: the proto's fields, the arguments as
/// JSON, the times as RFC 3339 (`decided_at` null while undecided).
fn json(approval: &pb::CallApproval) -> serde_json::Value {
    let arguments = serde_json::from_str::<serde_json::Value>(&approval.arguments_json)
        .unwrap_or_else(|_| serde_json::Value::String(approval.arguments_json.clone()));
    let decided_at =
        (approval.decided_at_unix_ms != 0).then(|| when::rfc3339(approval.decided_at_unix_ms));
    serde_json::json!({
        "approval_id": approval.approval_id,
        "state": state_name(approval.state),
        "tool": approval.tool,
        "server": approval.server,
        "definition_hash": approval.definition_hash,
        "arguments": arguments,
        "arguments_sha256": approval.arguments_sha256,
        "subject": approval.subject,
        "rule": approval.rule,
        "created_at": when::rfc3339(approval.created_at_unix_ms),
        "expires_at": when::rfc3339(approval.expires_at_unix_ms),
        "uses_left": approval.uses_left,
        "decided_by": approval.decided_by,
        "reason": approval.reason,
        "decided_at": decided_at,
        "may_decide": approval.may_decide,
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<CallApprovalsCommand, clap::Error> {
        let mut argv = vec!["toolgate", "call-approvals"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv)?.command {
            Command::CallApprovals { command } => Ok(command),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn the_subcommands_parse() {
        let CallApprovalsCommand::List(list) =
            parse(&["list", "--state", "denied", "--limit", "5", "--json"]).unwrap()
        else {
            panic!("not list")
        };
        assert_eq!(list.state, Some(State::Denied));
        assert_eq!(list.limit, Some(5));
        assert!(list.connection.json);
        let CallApprovalsCommand::List(list) = parse(&["list"]).unwrap() else {
            panic!("not list")
        };
        assert_eq!((list.state, list.limit), (None, None));
        for bad in [
            &["list", "--state", "waiting"][..],
            &["list", "--limit", "0"],
            &["list", "--limit", "1001"],
            &["show"],
            &["approve"],
            &["nope"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
        let CallApprovalsCommand::Show(show) = parse(&["show", "apv_1", "--json"]).unwrap() else {
            panic!("not show")
        };
        assert_eq!(show.id, "apv_1");
        let CallApprovalsCommand::Approve(approve) =
            parse(&["approve", "apv_1", "--reason", "looks right"]).unwrap()
        else {
            panic!("not approve")
        };
        assert_eq!(
            (approve.id.as_str(), approve.reason.as_deref()),
            ("apv_1", Some("looks right"))
        );
        let CallApprovalsCommand::Deny(deny) = parse(&["deny", "apv_2"]).unwrap() else {
            panic!("not deny")
        };
        assert_eq!((deny.id.as_str(), deny.reason), ("apv_2", None));
        let CallApprovalsCommand::Watch(watch) = parse(&[
            "watch",
            "--json",
            "--addr",
            "https://gw:1",
            "--timeout",
            "1h",
        ])
        .unwrap() else {
            panic!("not watch")
        };
        assert_eq!(watch.connection.addr, "https://gw:1");
        assert_eq!(
            watch.connection.timeout,
            Some(std::time::Duration::from_secs(3600))
        );
        assert_eq!(
            pb::CallApprovalState::from(State::Spent),
            pb::CallApprovalState::Spent
        );
    }

    const NOW: i64 = 1_777_636_800_000;

    fn approval() -> pb::CallApproval {
        pb::CallApproval {
            approval_id: "apv_0123456789abcdefghijkl".into(),
            state: pb::CallApprovalState::Pending as i32,
            tool: "everything__echo".into(),
            server: "everything".into(),
            definition_hash: "d41d8c".into(),
            arguments_json: r#"{"message":"hi","n":[1,2]}"#.into(),
            arguments_sha256: "abc123".into(),
            subject: "token:worker".into(),
            rule: "tenants[0].policy[0]".into(),
            created_at_unix_ms: NOW - 60_000,
            expires_at_unix_ms: NOW + 14 * 60_000 + 30_000,
            uses_left: 1,
            decided_by: String::new(),
            reason: String::new(),
            decided_at_unix_ms: 0,
            may_decide: true,
        }
    }

    #[test]
    fn list_prints_a_table() {
        let mut tenant_call = approval();
        tenant_call.subject.clear();
        tenant_call.may_decide = false;
        tenant_call.approval_id = "apv_2".into();
        let text = table(&[approval(), tenant_call], "pending", NOW);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "ID                          STATE    TOOL              SUBJECT       RULE                  EXPIRES  MAY DECIDE"
        );
        assert_eq!(
            lines[1],
            "apv_0123456789abcdefghijkl  pending  everything__echo  token:worker  tenants[0].policy[0]  in 14m   yes"
        );
        assert!(lines[2].starts_with("apv_2 "), "{}", lines[2]);
        assert!(lines[2].contains("(tenant)") && lines[2].ends_with("no"));
        assert_eq!(lines[4], "2 pending call approval(s)");
        assert_eq!(table(&[], "denied", NOW), "no denied call approvals\n");
    }

    #[test]
    fn show_prints_every_field_and_the_arguments_pretty() {
        let text = details(&approval(), NOW);
        for line in [
            "approval_id:      apv_0123456789abcdefghijkl",
            "state:            pending",
            "server:           everything",
            "definition_hash:  d41d8c",
            "created_at:       2026-05-01T11:59:00Z (1m ago)",
            "expires_at:       2026-05-01T12:14:30Z (in 14m)",
            "uses_left:        1",
            "may_decide:       yes",
            "decided_by:       -",
            "decided_at:       -",
            "arguments_sha256: abc123",
            "arguments:",
            "  {",
            "    \"message\": \"hi\",",
            "    \"n\": [",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
        }
        let mut decided = approval();
        decided.state = pb::CallApprovalState::Denied as i32;
        decided.decided_by = "approver:alice".into();
        decided.reason = "not today".into();
        decided.decided_at_unix_ms = NOW;
        decided.arguments_json = "not json".into();
        let text = details(&decided, NOW);
        assert!(text.contains("decided_at:       2026-05-01T12:00:00Z (now)\n"));
        assert!(text.contains("reason:           not today\n"));
        assert!(text.ends_with("arguments:\n  not json\n"), "{text}");
        let line = watch_line(&decided, NOW);
        assert_eq!(
            line,
            "denied    apv_0123456789abcdefghijkl  everything__echo  subject token:worker  \
             rule tenants[0].policy[0]  expires in 14m  decided by approver:alice: not today  \
             (you may decide)"
        );
    }

    #[test]
    fn json_has_the_fields_and_rfc3339_times() {
        let value = json(&approval());
        assert_eq!(value["state"], "pending");
        assert_eq!(value["arguments"]["n"][1], 2);
        assert_eq!(value["expires_at"], "2026-05-01T12:14:30Z");
        assert_eq!(value["decided_at"], serde_json::Value::Null);
        assert_eq!(value["may_decide"], true);
        let mut odd = approval();
        odd.arguments_json = "{".into();
        odd.state = 42;
        assert_eq!(json(&odd)["arguments"], "{");
        assert_eq!(json(&odd)["state"], "unknown");
    }
}
