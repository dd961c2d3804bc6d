//! Which files' tenants are served: the configuration file's tenants
//! first, then the files by path. A file is refused, naming both, when its
//! tenant's name or one of its tokens is already taken by the file or by a
//! file sorting earlier. Of a file, its latest valid version is served if
//! it does not conflict, else its previous one if that does not.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use super::FileState;
use crate::callers::TokenDigest;
use crate::config::{FieldError, TenantConfig, TenantOrigin};

/// Why a file's latest version is not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Every error, each with its path (`tenants[acme].servers[0].url`);
    /// never a secret.
    pub errors: Vec<FieldError>,
    /// Whether the file's previous version still serves.
    pub previous_serving: bool,
}

/// The outcome of one merge.
#[derive(Debug, Default)]
pub(super) struct Merged {
    /// The directory's tenants served, by path.
    pub(super) tenants: Vec<Arc<TenantConfig>>,
    /// Refusals not reported before (each file's is reported once).
    pub(super) refusals: Vec<(PathBuf, Refusal)>,
    /// Files refused before whose latest version is served now.
    pub(super) accepted_again: Vec<PathBuf>,
    /// Files whose latest version is served.
    pub(super) ok: usize,
    /// Every file.
    pub(super) files: usize,
}

/// Names and token digests already taken, and by whom.
#[derive(Default)]
struct Taken {
    names: HashMap<String, TenantOrigin>,
    tokens: HashMap<[u8; 32], (String, TenantOrigin)>,
}

impl Taken {
    fn add(&mut self, tenant: &TenantConfig, origin: &TenantOrigin) {
        self.names.insert(tenant.name.clone(), origin.clone());
        for token in &tenant.tokens {
            let digest = TokenDigest::of(token.expose());
            self.tokens
                .entry(*digest.as_bytes())
                .or_insert_with(|| (tenant.name.clone(), origin.clone()));
        }
    }

    /// Every conflict of `tenant` with what is taken (empty: none).
    fn conflicts(&self, tenant: &TenantConfig) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let at = format!("tenants[{}]", tenant.name);
        if let Some(origin) = self.names.get(&tenant.name) {
            errors.push(FieldError {
                path: format!("{at}.name"),
                message: format!("tenant `{}` is already defined by {origin}", tenant.name),
            });
        }
        for (index, token) in tenant.tokens.iter().enumerate() {
            let digest = TokenDigest::of(token.expose());
            if let Some((owner, origin)) = self.tokens.get(digest.as_bytes()) {
                errors.push(FieldError {
                    path: format!("{at}.tokens[{index}]"),
                    message: format!("this token is already tenant `{owner}`'s ({origin})"),
                });
            }
        }
        errors
    }
}

/// Decides what each file serves (updating its `serving` and `reported`)
/// after `file_tenants`.
pub(super) fn merge(
    file_tenants: &[TenantConfig],
    files: &mut BTreeMap<PathBuf, FileState>,
) -> Merged {
    let mut taken = Taken::default();
    for tenant in file_tenants {
        taken.add(tenant, &TenantOrigin::File);
    }
    let mut merged = Merged {
        files: files.len(),
        ..Merged::default()
    };
    for (path, state) in files.iter_mut() {
        let (latest, mut errors) = match &state.outcome {
            Ok(tenant) => (Some(tenant.clone()), Vec::new()),
            Err(errors) => (None, errors.clone()),
        };
        let mut serving = None;
        if let Some(tenant) = latest {
            errors = taken.conflicts(&tenant);
            if errors.is_empty() {
                serving = Some(tenant);
                merged.ok += 1;
            }
        }
        if serving.is_none() {
            serving = state
                .serving
                .take()
                .filter(|previous| taken.conflicts(previous).is_empty());
        }
        if let Some(tenant) = &serving {
            taken.add(tenant, &TenantOrigin::Dir(path.clone()));
            merged.tenants.push(tenant.clone());
        }
        state.serving = serving;
        if errors.is_empty() {
            if state.reported.take().is_some() {
                merged.accepted_again.push(path.clone());
            }
        } else if state.reported.as_ref() != Some(&errors) {
            state.reported = Some(errors.clone());
            merged.refusals.push((
                path.clone(),
                Refusal {
                    errors,
                    previous_serving: state.serving.is_some(),
                },
            ));
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use super::*;
    use crate::config::{Config, SpecSource, TenantSpec};

    fn config(file_tenants: &str) -> Config {
        let yaml = format!("tenants_dir: {{path: .}}\ntenants:\n{file_tenants}");
        Config::from_yaml(&yaml, "t.yaml", Path::new("."), &HashMap::new()).unwrap()
    }

    fn tenant(config: &Config, file: &str, text: &str) -> Arc<TenantConfig> {
        let path = Path::new(file);
        let stem = path.file_stem().unwrap().to_str().unwrap();
        let spec = TenantSpec::parse(text, Some(stem)).unwrap();
        let source = SpecSource::Dir { file: path };
        Arc::new(
            config
                .validate_tenant(spec, source, &HashMap::new())
                .unwrap(),
        )
    }

    fn state(outcome: Result<Arc<TenantConfig>, Vec<FieldError>>) -> FileState {
        FileState {
            stamp: None,
            digest: [0; 32],
            outcome,
            serving: None,
            reported: None,
        }
    }

    fn messages(merged: &Merged) -> Vec<String> {
        merged
            .refusals
            .iter()
            .flat_map(|(p, r)| {
                r.errors
                    .iter()
                    .map(move |e| format!("{}: {e}", p.display()))
            })
            .collect()
    }

    #[test]
    fn the_file_wins_then_the_earlier_path_and_tokens_are_never_shared() {
        let config = config("  - {name: filed, tokens: [file-token], servers: []}\n");
        let mut files = BTreeMap::new();
        for (file, text) in [
            ("/d/filed.yaml", "tokens: [t1]\nservers: []\n"),
            ("/d/beta.json", "tokens: [t2]\nservers: []\n"),
            ("/d/beta.yaml", "tokens: [t3]\nservers: []\n"),
            (
                "/d/gamma.yaml",
                "tokens: [t4, file-token, t2]\nservers: []\n",
            ),
            ("/d/delta.yaml", "tokens: [t5]\nservers: []\n"),
        ] {
            files.insert(PathBuf::from(file), state(Ok(tenant(&config, file, text))));
        }
        let merged = merge(&config.tenants, &mut files);
        let served: Vec<&str> = merged.tenants.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(served, ["beta", "delta"]);
        assert_eq!((merged.ok, merged.files), (2, 5));
        assert_eq!(
            messages(&merged),
            [
                "/d/beta.yaml: tenants[beta].name: tenant `beta` is already defined by \
                 tenants_dir file /d/beta.json",
                "/d/filed.yaml: tenants[filed].name: tenant `filed` is already defined by the \
                 configuration file",
                "/d/gamma.yaml: tenants[gamma].tokens[1]: this token is already tenant \
                 `filed`'s (the configuration file)",
                "/d/gamma.yaml: tenants[gamma].tokens[2]: this token is already tenant `beta`'s \
                 (tenants_dir file /d/beta.json)",
            ]
        );
        // Reported once: the same refusals are not reported again.
        let again = merge(&config.tenants, &mut files);
        assert!(again.refusals.is_empty());
        assert_eq!(again.tenants.len(), 2);
    }

    #[test]
    fn a_refused_version_leaves_the_previous_one_serving() {
        let config = config("  - {name: filed, tokens: [file-token], servers: []}\n");
        let path = PathBuf::from("/d/acme.yaml");
        let v1 = tenant(&config, "/d/acme.yaml", "tokens: [a1]\nservers: []\n");
        let mut files = BTreeMap::from([(path.clone(), state(Ok(v1.clone())))]);
        assert_eq!(merge(&config.tenants, &mut files).ok, 1);

        // Invalid: v1 still serves.
        files.get_mut(&path).unwrap().outcome = Err(vec![FieldError {
            path: "tenants[acme].servers[0].url".into(),
            message: "not a valid URL".into(),
        }]);
        let merged = merge(&config.tenants, &mut files);
        assert!(Arc::ptr_eq(&merged.tenants[0], &v1));
        assert_eq!(merged.ok, 0);
        assert!(merged.refusals[0].1.previous_serving);

        // Valid but giving the file tenant's token: v1 still serves.
        let v2 = tenant(
            &config,
            "/d/acme.yaml",
            "tokens: [file-token]\nservers: []\n",
        );
        files.get_mut(&path).unwrap().outcome = Ok(v2);
        let merged = merge(&config.tenants, &mut files);
        assert!(Arc::ptr_eq(&merged.tenants[0], &v1));
        assert_eq!(merged.refusals.len(), 1);

        // Fixed: the new version serves, and that is said.
        let v3 = tenant(&config, "/d/acme.yaml", "tokens: [a3]\nservers: []\n");
        files.get_mut(&path).unwrap().outcome = Ok(v3.clone());
        let merged = merge(&config.tenants, &mut files);
        assert!(Arc::ptr_eq(&merged.tenants[0], &v3));
        assert_eq!(merged.accepted_again, [path]);
    }
}
