//! `toolgate check` for one-tenant files: `--tenant FILE...` validates
//! files offline (against `--config`, or an empty configuration), and a
//! configuration with `tenants_dir` has every file of it validated as the
//! gateway would (precedence included).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::EXIT_CONFIG;
use crate::config::{Config, ProcessEnv, TenantConfig};
use crate::registry::tenants_dir::{FileReport, check_dir, check_files};

/// The configuration tenant files are checked against without `--config`:
/// nothing but the defaults.
const EMPTY_CONFIG: &str = "tenants_dir: {path: .}\n";

/// `toolgate check --tenant FILE... [--config FILE]`: prints each file's
/// tenant or every error (`FILE: tenants[acme].servers[0].url: ...`);
/// exit 64 when any file is refused.
pub(super) fn check_tenant_files(config: Option<&Path>, files: &[PathBuf]) -> ExitCode {
    let config = match config {
        Some(path) => match super::load(path) {
            Ok(config) => config,
            Err(code) => return code,
        },
        None => Config::from_yaml(EMPTY_CONFIG, "<empty>", Path::new("."), &ProcessEnv)
            .expect("the empty configuration is valid"),
    };
    let reports = check_files(&config, files, &ProcessEnv);
    if print(&reports) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_CONFIG)
    }
}

/// Validates every file of `config.tenants_dir` (when set) and prints what
/// it found. Returns `config` with the directory's tenants after the
/// file's (what `serve` would serve), or exit 64 when a file is refused.
pub(super) fn check_tenants_dir(mut config: Config) -> Result<Config, ExitCode> {
    let Some(dir) = config.tenants_dir.clone() else {
        return Ok(config);
    };
    let reports = match check_dir(&config, &ProcessEnv) {
        Ok(reports) => reports,
        Err(e) => {
            eprintln!(
                "toolgate: tenants_dir {}: cannot be listed: {e}",
                dir.path.display()
            );
            return Err(ExitCode::from(EXIT_CONFIG));
        }
    };
    let valid = reports.iter().filter(|r| r.errors.is_empty()).count();
    println!(
        "tenants_dir {}: {} file(s), {valid} valid",
        dir.path.display(),
        reports.len()
    );
    if !print(&reports) {
        return Err(ExitCode::from(EXIT_CONFIG));
    }
    config.tenants.extend(
        reports
            .into_iter()
            .filter_map(|r| r.tenant)
            .map(|t| TenantConfig::clone(&t)),
    );
    Ok(config)
}

/// Prints each valid file on stdout and each error on stderr; whether
/// every file is valid.
fn print(reports: &[FileReport]) -> bool {
    let mut valid = true;
    for report in reports {
        let file = report.file.display();
        match (&report.tenant, report.errors.is_empty()) {
            (Some(tenant), true) => {
                println!(
                    "{file}: tenant {} is valid ({} server(s))",
                    tenant.name,
                    tenant.servers.len()
                );
                for line in call_time_lines(tenant) {
                    println!("{file}: {line}");
                }
            }
            _ => {
                valid = false;
                for error in &report.errors {
                    eprintln!("{file}: {error}");
                }
            }
        }
    }
    valid
}

/// Prints, for every tenant of `config`, the policy rules decided at call
/// time (what `toolgate check` tells beside validity).
pub(super) fn print_call_time_rules(config: &Config) {
    for tenant in &config.tenants {
        for line in call_time_lines(tenant) {
            println!("{line}");
        }
    }
}

/// `tenants[0].policy[2]: decided at call time (reads args)` for each
/// rule of the tenant's policy decided at call time, in order.
fn call_time_lines(tenant: &TenantConfig) -> Vec<String> {
    let Some(rules) = &tenant.policy else {
        return Vec::new();
    };
    crate::policy::Policy::new(rules)
        .call_time_rules()
        .into_iter()
        .map(|(path, why)| format!("{path}: decided at call time ({why})"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_time_rules_are_named_with_why() {
        let yaml = "tenants:\n  - name: t\n    tokens: [tok]\n    policy:\n      \
                    - deny: \"db__*\"\n        when: \"claims.x == 1\"\n      \
                    - deny: db__query\n        when: \"args.sql.contains('payroll.')\"\n      \
                    - require_approval: [\"pay__send_*\"]\n";
        let config = Config::from_yaml(
            yaml,
            "test.yaml",
            Path::new("."),
            &std::collections::HashMap::<String, String>::new(),
        )
        .unwrap();
        assert_eq!(
            call_time_lines(&config.tenants[0]),
            [
                "tenants[0].policy[1]: decided at call time (reads args)",
                "tenants[0].policy[2]: decided at call time (require_approval)",
            ]
        );
    }
}
