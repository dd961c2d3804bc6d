//! Client verbs for skills (SEP-2640): `toolgate skills` (the caller's
//! skills with their files) and `toolgate skill NAME [--files] [--path
//! P]...` (fetched and verified by the gateway: `SKILL.md`, then the files
//! asked for). Tokens, addresses, `--json` and exit codes as for
//! `toolgate prompts` and `prompt`.

use std::io::Write;
use std::process::ExitCode;

use clap::Args;

use super::client::{Connection, DEFAULT_TIMEOUT, connect, fail, request, token, usage};
use crate::pb;

/// `toolgate skills` options.
#[derive(Debug, Args)]
pub(super) struct SkillsArgs {
    #[command(flatten)]
    connection: Connection,
    /// Only skills of this server (repeatable).
    #[arg(long = "server")]
    servers: Vec<String>,
    /// Only skills whose exposed name matches this glob (repeatable).
    #[arg(long = "glob")]
    globs: Vec<String>,
}

/// `toolgate skill` options.
#[derive(Debug, Args)]
pub(super) struct SkillArgs {
    #[command(flatten)]
    connection: Connection,
    /// The exposed skill name, as `toolgate skills` lists it.
    name: String,
    /// Every file of the skill, not only `SKILL.md`.
    #[arg(long)]
    files: bool,
    /// This file too (its path in the skill, as `toolgate skills` lists
    /// it; repeatable).
    #[arg(long = "path")]
    paths: Vec<String>,
}

/// `toolgate skills`: the caller's skills and their files.
pub(super) async fn skills(args: SkillsArgs) -> ExitCode {
    let c = &args.connection;
    let message = pb::ListSkillsRequest {
        servers: args.servers.clone(),
        name_globs: args.globs.clone(),
    };
    let listing = match unary(c, message, |mut client, request| async move {
        client.list_skills(request).await
    })
    .await
    {
        Ok(listing) => listing,
        Err(code) => return code,
    };
    let mut out = std::io::stdout().lock();
    if c.json {
        let skills: Vec<_> = listing
            .skills
            .iter()
            .map(|s| {
                serde_json::json!({
                    "name": s.name, "server": s.server, "uri": s.uri,
                    "description": s.description, "dynamic": s.dynamic,
                    "frontmatter": serde_json::from_str::<serde_json::Value>(&s.frontmatter_json).unwrap_or_default(),
                    "definition_hash": s.definition_hash,
                    "files": s.files.iter().map(|f| serde_json::json!({
                        "path": f.path, "uri": f.uri, "digest": f.digest, "size": f.size,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let value = serde_json::json!({
            "skills_version": listing.skills_version, "skills": skills,
        });
        let _ = writeln!(out, "{value}");
        return ExitCode::SUCCESS;
    }
    let width = listing
        .skills
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let _ = writeln!(out, "{:<width$}  FILES  DESCRIPTION", "SKILL");
    for skill in &listing.skills {
        let files = if skill.dynamic {
            "dyn".to_owned()
        } else {
            skill.files.len().to_string()
        };
        let description = skill.description.lines().next().unwrap_or_default();
        let _ = writeln!(out, "{:<width$}  {files:>5}  {description}", skill.name);
    }
    let _ = writeln!(out, "\n{} skill(s)", listing.skills.len());
    for s in &listing.servers {
        if !s.skills_error.is_empty() {
            let _ = writeln!(out, "server {}: {}", s.name, s.skills_error);
        }
        for withheld in &s.withheld_skills {
            let _ = writeln!(out, "skill {withheld} is withheld: awaiting approval");
        }
    }
    ExitCode::SUCCESS
}

/// `toolgate skill`: fetches one skill and prints its files (text files
/// in full, binary ones by size and digest).
pub(super) async fn skill(args: SkillArgs) -> ExitCode {
    let c = &args.connection;
    let message = pb::GetSkillRequest {
        name: args.name.clone(),
        with_files: args.files,
        paths: args.paths.clone(),
        ..Default::default()
    };
    let fetched = match unary(c, message, |mut client, request| async move {
        client.get_skill(request).await
    })
    .await
    {
        Ok(fetched) => fetched,
        Err(code) => return code,
    };
    let mut out = std::io::stdout().lock();
    let text = |file: &pb::SkillFileContent| match &file.content {
        Some(pb::skill_file_content::Content::Text(text)) => Some(text.clone()),
        _ => None,
    };
    if c.json {
        let files: Vec<_> = fetched
            .files
            .iter()
            .map(|f| {
                serde_json::json!({
                    "path": f.path, "uri": f.uri, "mime_type": f.mime_type,
                    "digest": f.digest, "size": f.size, "text": text(f),
                })
            })
            .collect();
        let value = serde_json::json!({"verified": fetched.verified, "files": files});
        let _ = writeln!(out, "{value}");
        return ExitCode::SUCCESS;
    }
    if !fetched.verified {
        let _ = writeln!(
            out,
            "# dynamic skill: SKILL.md only, no digest to check it against"
        );
    }
    for file in &fetched.files {
        match text(file) {
            Some(text) => {
                let _ = writeln!(out, "==> {} ({}) <==\n{text}", file.path, file.digest);
            }
            None => {
                let _ = writeln!(
                    out,
                    "==> {} ({}, {} bytes, binary) <==",
                    file.path, file.digest, file.size
                );
            }
        }
    }
    ExitCode::SUCCESS
}

/// Connects and runs one unary RPC (`call`) with the connection's token
/// and deadline; a failure as its exit code.
async fn unary<T, R, F, Fut>(c: &Connection, message: T, call: F) -> Result<R, ExitCode>
where
    F: FnOnce(
        pb::tool_gateway_client::ToolGatewayClient<tonic::transport::Channel>,
        tonic::Request<T>,
    ) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>>,
{
    let token = token(c).map_err(|e| usage(&e))?;
    let request =
        request(message, &token, c.timeout.unwrap_or(DEFAULT_TIMEOUT)).map_err(|e| usage(&e))?;
    let client = connect(c).await.map_err(|status| fail(&status, c.json))?;
    call(client, request)
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| fail(&status, c.json))
}
