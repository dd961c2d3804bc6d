//! `tenants_dir`: tenants from a watched directory of one-tenant files,
//! merged with the configuration file's tenants into what a generation is
//! built from ([`TenantSources`]).
//!
//! Each `*.yaml`, `*.yml` or `*.json` file directly in the directory (names
//! starting with `.` skipped: Kubernetes' `..data` links) holds one tenant,
//! named by the file name without its extension. A scan reads only the
//! files whose size, times or inode changed (symlinks followed, so the
//! swap of a projected volume's `..data` link shows as a new inode),
//! validates each like a tenant of the file ([`Config::validate_tenant`]),
//! and keeps per file the last valid version: a file that stops validating
//! is refused with every error, naming the file, and its previous version
//! keeps serving. Precedence: the configuration file over `tenants_dir`; of
//! two files naming one tenant, or giving one token, the one sorting later
//! by path is refused; each refusal names both.

mod merge;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::{Registry, ReloadSummary};
use crate::config::{
    Config, Environment, FieldError, MAX_SPEC_BYTES, SpecSource, TenantConfig, TenantSpec,
};
use crate::telemetry::Metrics;

pub use merge::Refusal;

/// The file extensions read, without the dot.
const EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

/// A file modified this recently may change again within the same
/// timestamp tick: it is read again at the next scan (its content digest
/// says whether it changed).
const RACY: Duration = Duration::from_secs(1);

/// What says a file may have changed: its size, times and inode (of the
/// file a symlink points to).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    ino: u64,
    dev: u64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            ino: meta.ino(),
            dev: meta.dev(),
        }
    }
}

/// One file of the directory and what it last held.
#[derive(Debug)]
struct FileState {
    /// `None`: read again at the next scan (modified very recently).
    stamp: Option<Stamp>,
    /// The SHA-256 of the content last validated.
    digest: [u8; 32],
    /// The last read's outcome: the tenant, or every error.
    outcome: Result<Arc<TenantConfig>, Vec<FieldError>>,
    /// The version in the generation (the last valid one that does not
    /// conflict), if any.
    serving: Option<Arc<TenantConfig>>,
    /// The refusal last logged, so each is logged once.
    reported: Option<Vec<FieldError>>,
}

/// The files of one directory, by path (the order precedence follows).
#[derive(Debug, Default)]
struct DirFiles {
    /// The directory these files were read from.
    dir: Option<PathBuf>,
    files: BTreeMap<PathBuf, FileState>,
}

/// Whether `name` is a tenant file's name: not hidden, one of
/// [`EXTENSIONS`]; its stem (the tenant's name) if so.
fn tenant_stem(name: &str) -> Option<&str> {
    if name.starts_with('.') {
        return None;
    }
    let (stem, extension) = name.rsplit_once('.')?;
    EXTENSIONS.contains(&extension).then_some(stem)
}

/// What reading one file found.
enum Read {
    /// Its content is what was validated last time.
    Unchanged,
    /// Its content's digest, and the tenant or every error.
    Validated([u8; 32], Result<Arc<TenantConfig>, Vec<FieldError>>),
}

/// Reads one tenant file and, unless its content's digest is `previous`,
/// validates it against `config`. The file's name without its extension
/// is the tenant's name; a `name:` written in the file must equal it.
fn read_tenant(
    path: &Path,
    previous: Option<[u8; 32]>,
    config: &Config,
    env: &dyn Environment,
) -> Read {
    let stem = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(tenant_stem)
        .unwrap_or_default();
    let bytes = match read_bounded(path) {
        Ok(bytes) => bytes,
        Err(message) => return Read::Validated([0; 32], Err(vec![whole_file(message)])),
    };
    let digest: [u8; 32] = Sha256::digest(&bytes).into();
    if previous == Some(digest) {
        return Read::Unchanged;
    }
    let outcome = validate_bytes(&bytes, stem, path, config, env).map(Arc::new);
    Read::Validated(digest, outcome)
}

/// The file's bytes, refusing one larger than a spec may be and anything
/// but a regular file. The file is opened without blocking (`O_NONBLOCK`:
/// a named pipe with no writer would block the open, and so every scan and
/// the shutdown) and its type checked on the open file, so what is read is
/// what was checked.
fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| format!("cannot be read: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot be read: {e}"))?;
    if !meta.is_file() {
        return Err(format!(
            "is {}, not a regular file: only regular files (or symlinks to them) are read",
            file_kind(&meta.file_type())
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_SPEC_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot be read: {e}"))?;
    if bytes.len() > MAX_SPEC_BYTES {
        return Err(format!(
            "is larger than {MAX_SPEC_BYTES} bytes, the most a tenant file may hold"
        ));
    }
    Ok(bytes)
}

/// What a file that is not a regular file is, for its refusal.
fn file_kind(kind: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_fifo() {
        "a named pipe (FIFO)"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_dir() {
        "a directory"
    } else {
        "a special file"
    }
}

fn validate_bytes(
    bytes: &[u8],
    stem: &str,
    path: &Path,
    config: &Config,
    env: &dyn Environment,
) -> Result<TenantConfig, Vec<FieldError>> {
    let text = std::str::from_utf8(bytes).map_err(|_| vec![whole_file("is not UTF-8 text")])?;
    let spec = TenantSpec::parse(text, Some(stem)).map_err(|e| e.errors)?;
    config
        .validate_tenant(spec, SpecSource::Dir { file: path }, env)
        .map_err(|e| e.errors)
}

/// An error about the file as a whole (it names no field).
fn whole_file(message: impl Into<String>) -> FieldError {
    FieldError {
        path: String::new(),
        message: message.into(),
    }
}

impl DirFiles {
    /// Reads the files of `dir` that changed since the last scan (every
    /// file when `all`), validating each against `config`; forgets removed
    /// ones. A directory that does not exist holds no files. Returns
    /// whether a file was added, changed or removed.
    ///
    /// # Errors
    /// The directory exists but cannot be listed (nothing is changed).
    fn scan(
        &mut self,
        dir: &Path,
        config: &Config,
        env: &dyn Environment,
        all: bool,
    ) -> std::io::Result<bool> {
        if self.dir.as_deref() != Some(dir) {
            // Another directory: every file is new.
            self.files.clear();
            self.dir = Some(dir.to_owned());
        }
        let started = SystemTime::now();
        let mut seen: Vec<(PathBuf, Stamp)> = Vec::new();
        match std::fs::read_dir(dir) {
            Ok(entries) => {
                for entry in entries {
                    let entry = entry?;
                    let name = entry.file_name();
                    if name.to_str().and_then(tenant_stem).is_none() {
                        continue;
                    }
                    let path = entry.path();
                    // Follows symlinks; a dangling one is read (and
                    // refused) below.
                    let stamp = match std::fs::metadata(&path) {
                        Ok(meta) if meta.is_dir() => continue,
                        Ok(meta) => Stamp::of(&meta),
                        Err(_) => Stamp {
                            len: 0,
                            mtime: (0, 0),
                            ctime: (0, 0),
                            ino: 0,
                            dev: 0,
                        },
                    };
                    seen.push((path, stamp));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let present: std::collections::HashSet<&Path> =
            seen.iter().map(|(p, _)| p.as_path()).collect();
        let before = self.files.len();
        self.files
            .retain(|path, _| present.contains(path.as_path()));
        let mut changed = self.files.len() != before;
        let work: Vec<Work> = seen
            .into_iter()
            .filter_map(|(path, stamp)| {
                let state = self.files.get(&path);
                if !all && state.is_some_and(|s| s.stamp == Some(stamp)) {
                    return None;
                }
                let previous = state
                    .filter(|s| !all && s.outcome.is_ok())
                    .map(|s| s.digest);
                Some(Work {
                    path,
                    stamp,
                    previous,
                })
            })
            .collect();
        let read = read_all(&work, config, env);
        for (work, read) in work.into_iter().zip(read) {
            let modified = SystemTime::UNIX_EPOCH
                + Duration::new(
                    u64::try_from(work.stamp.mtime.0).unwrap_or(0),
                    u32::try_from(work.stamp.mtime.1).unwrap_or(0),
                );
            let stamp = (modified + RACY <= started).then_some(work.stamp);
            match (self.files.get_mut(&work.path), read) {
                (Some(state), Read::Unchanged) => state.stamp = stamp,
                (Some(state), Read::Validated(digest, outcome)) => {
                    changed = true;
                    state.stamp = stamp;
                    state.digest = digest;
                    state.outcome = outcome;
                }
                (None, Read::Validated(digest, outcome)) => {
                    changed = true;
                    self.files.insert(
                        work.path,
                        FileState {
                            stamp,
                            digest,
                            outcome,
                            serving: None,
                            reported: None,
                        },
                    );
                }
                (None, Read::Unchanged) => unreachable!("a new file has no previous digest"),
            }
        }
        Ok(changed)
    }
}

/// A file to read: its path, its stamp now, and the digest of the valid
/// content read before (when it need not be validated again).
struct Work {
    path: PathBuf,
    stamp: Stamp,
    previous: Option<[u8; 32]>,
}

/// Reads and validates `work`, on every core when there is much of it
/// (10,000 files at start).
fn read_all(work: &[Work], config: &Config, env: &dyn Environment) -> Vec<Read> {
    const PER_THREAD: usize = 256;
    let read = |w: &Work| read_tenant(&w.path, w.previous, config, env);
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(work.len().div_ceil(PER_THREAD))
        .max(1);
    if threads == 1 {
        return work.iter().map(read).collect();
    }
    let chunk = work.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = work
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(read).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a tenants_dir reader panicked"))
            .collect()
    })
}

/// The tenants of the configuration file and of `tenants_dir`, merged into
/// the configuration a generation is built from ([`Registry::apply`]).
/// Holds the file configuration (with its tenants) only while it has a
/// `tenants_dir`; without one a configuration is applied as it is.
#[derive(Debug)]
pub struct TenantSources {
    env: Arc<dyn Environment>,
    metrics: Arc<Metrics>,
    inner: Mutex<Inner>,
    /// The directory's `poll_interval` in milliseconds, 0 without one
    /// (read without waiting for a scan).
    poll_ms: AtomicU64,
}

#[derive(Debug, Default)]
struct Inner {
    /// The configuration in force, while it has a `tenants_dir`.
    config: Option<Config>,
    files: DirFiles,
    /// The directory's tenants in the generation last built.
    applied: Vec<Arc<TenantConfig>>,
}

impl TenantSources {
    /// Reads `config.tenants_dir` (when set), every file validated against
    /// `config`. Returns the sources and the configuration to start the
    /// registry with: the file's tenants, then the directory's.
    pub fn start(
        config: Config,
        env: Arc<dyn Environment>,
        metrics: Arc<Metrics>,
    ) -> (Arc<TenantSources>, Config) {
        let sources = Arc::new(TenantSources {
            env,
            metrics,
            inner: Mutex::new(Inner::default()),
            poll_ms: AtomicU64::new(0),
        });
        let merged = {
            let mut inner = sources.inner.lock().expect("tenant sources lock");
            sources.configure(&mut inner, config)
        };
        (sources, merged)
    }

    /// How often the directory is scanned, while one is configured.
    pub fn poll_interval(&self) -> Option<Duration> {
        match self.poll_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// Puts a reloaded configuration in force: every file of its
    /// `tenants_dir` is read and validated against it again, and the
    /// registry switches to the file's tenants and the directory's.
    pub fn reload(&self, config: Config, registry: &Arc<Registry>) -> ReloadSummary {
        let mut inner = self.inner.lock().expect("tenant sources lock");
        let merged = self.configure(&mut inner, config);
        // Under the lock: a scan never applies over a newer configuration.
        registry.apply(&merged)
    }

    /// Reads the files changed since the last scan and, when the tenants
    /// served change, applies them. `None` when nothing was applied.
    pub fn rescan(&self, registry: &Arc<Registry>) -> Option<ReloadSummary> {
        let mut inner = self.inner.lock().expect("tenant sources lock");
        let inner = &mut *inner;
        let config = inner.config.as_ref()?;
        let dir = config.tenants_dir.as_ref()?.path.clone();
        match inner.files.scan(&dir, config, self.env.as_ref(), false) {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => {
                tracing::error!(dir = %dir.display(), error = %e, "cannot list tenants_dir; its tenants stay as they were");
                return None;
            }
        }
        if !self.merge(inner) {
            return None;
        }
        // Under the lock: a scan never applies over a newer configuration.
        Some(registry.apply(&with_applied(inner)))
    }

    /// Sets `config` in force and reads its directory again (every file).
    /// Returns the configuration to apply.
    fn configure(&self, inner: &mut Inner, config: Config) -> Config {
        let poll = config.tenants_dir.as_ref().map_or(0, |d| {
            u64::try_from(d.poll_interval.as_millis())
                .unwrap_or(u64::MAX)
                .max(1)
        });
        self.poll_ms.store(poll, Ordering::Relaxed);
        let Some(dir) = config.tenants_dir.as_ref().map(|d| d.path.clone()) else {
            *inner = Inner::default();
            self.metrics.tenants_dir_files(0, 0);
            return config;
        };
        if let Err(e) = inner.files.scan(&dir, &config, self.env.as_ref(), true) {
            tracing::error!(dir = %dir.display(), error = %e, "cannot list tenants_dir; its tenants stay as they were");
        }
        inner.config = Some(config);
        self.merge(inner);
        with_applied(inner)
    }

    /// Decides which files' tenants are served, logs each refusal once and
    /// counts the files; whether the tenants served changed.
    fn merge(&self, inner: &mut Inner) -> bool {
        let Some(config) = inner.config.as_ref() else {
            return false;
        };
        let merged = merge::merge(&config.tenants, &mut inner.files.files);
        for (path, refusal) in &merged.refusals {
            log_refusal(path, refusal);
        }
        for path in &merged.accepted_again {
            tracing::info!(file = %path.display(), "tenants_dir file accepted");
        }
        self.metrics
            .tenants_dir_files(merged.ok, merged.files - merged.ok);
        let changed = merged.tenants.len() != inner.applied.len()
            || merged
                .tenants
                .iter()
                .zip(&inner.applied)
                .any(|(a, b)| !Arc::ptr_eq(a, b));
        inner.applied = merged.tenants;
        changed
    }
}

/// The configuration in force with the directory's tenants in the
/// generation after the file's.
fn with_applied(inner: &Inner) -> Config {
    let mut config = inner
        .config
        .clone()
        .expect("a configuration with tenants_dir");
    config
        .tenants
        .extend(inner.applied.iter().map(|t| TenantConfig::clone(t)));
    config
}

/// Logs a file refused (ERROR, with every error) and whether its previous
/// version still serves.
fn log_refusal(path: &Path, refusal: &Refusal) {
    let errors = refusal
        .errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    if refusal.previous_serving {
        tracing::error!(file = %path.display(), %errors, "tenants_dir file refused; its previous version keeps serving");
    } else {
        tracing::error!(file = %path.display(), %errors, "tenants_dir file refused; its tenant is not served");
    }
}

/// Scans the directory every `poll_interval` until `stop` is cancelled
/// (a SIGHUP reloads the configuration, which reads every file again).
pub async fn watch(sources: Arc<TenantSources>, registry: Arc<Registry>, stop: CancellationToken) {
    loop {
        let interval = sources
            .poll_interval()
            .unwrap_or(crate::config::DEFAULT_TENANTS_DIR_POLL_INTERVAL);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        let (s, r) = (sources.clone(), registry.clone());
        // A scan stuck in the file system (a hung network mount) does not
        // hold up the shutdown: it is left behind.
        let applied = tokio::select! {
            () = stop.cancelled() => return,
            applied = tokio::task::spawn_blocking(move || s.rescan(&r)) => applied,
        };
        let Ok(applied) = applied else {
            continue;
        };
        if let Some(summary) = applied {
            tracing::info!(
                tenants_added = ?summary.tenants_added,
                tenants_removed = ?summary.tenants_removed,
                servers_started = ?summary.servers_started,
                servers_retired = ?summary.servers_retired,
                servers_kept = summary.servers_kept.len(),
                "tenants_dir changes applied"
            );
        }
    }
}

/// What `toolgate check` found of one tenant file.
#[derive(Debug)]
pub struct FileReport {
    /// The file.
    pub file: PathBuf,
    /// The tenant it defines, when valid and not refused.
    pub tenant: Option<Arc<TenantConfig>>,
    /// Every error (empty when the tenant is accepted).
    pub errors: Vec<FieldError>,
}

/// Validates tenant files offline, as the gateway would: each against
/// `config`, then the precedence rules (the file's tenants first, then the
/// files by path). For `toolgate check`.
pub fn check_files(config: &Config, paths: &[PathBuf], env: &dyn Environment) -> Vec<FileReport> {
    let mut files = DirFiles::default();
    for path in paths {
        let Read::Validated(digest, outcome) = read_tenant(path, None, config, env) else {
            unreachable!("read without a previous digest")
        };
        files.files.insert(
            path.clone(),
            FileState {
                stamp: None,
                digest,
                outcome,
                serving: None,
                reported: None,
            },
        );
    }
    reports(config, files)
}

/// Validates every file of `config.tenants_dir` offline (no files when it
/// is not configured or does not exist). For `toolgate check`.
///
/// # Errors
/// The directory exists but cannot be listed.
pub fn check_dir(config: &Config, env: &dyn Environment) -> std::io::Result<Vec<FileReport>> {
    let mut files = DirFiles::default();
    if let Some(dir) = &config.tenants_dir {
        files.scan(&dir.path, config, env, true)?;
    }
    Ok(reports(config, files))
}

fn reports(config: &Config, mut files: DirFiles) -> Vec<FileReport> {
    let merged = merge::merge(&config.tenants, &mut files.files);
    let mut refusals: BTreeMap<PathBuf, Refusal> = merged.refusals.into_iter().collect();
    files
        .files
        .into_iter()
        .map(|(file, state)| FileReport {
            errors: refusals.remove(&file).map(|r| r.errors).unwrap_or_default(),
            tenant: state.serving,
            file,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_files_are_yaml_yml_or_json_and_not_hidden() {
        assert_eq!(tenant_stem("acme.yaml"), Some("acme"));
        assert_eq!(tenant_stem("acme.prod.yml"), Some("acme.prod"));
        assert_eq!(tenant_stem("acme.json"), Some("acme"));
        assert_eq!(tenant_stem("acme.yaml.bak"), None);
        assert_eq!(tenant_stem("acme"), None);
        assert_eq!(tenant_stem("..data"), None);
        assert_eq!(tenant_stem(".acme.yaml"), None);
    }

    fn config() -> Config {
        let yaml = "tenants_dir: {path: .}\ntenants: []\n";
        Config::from_yaml(yaml, "t.yaml", Path::new("."), &env()).unwrap()
    }

    fn env() -> std::collections::HashMap<String, String> {
        std::collections::HashMap::new()
    }

    /// Writes `text` to `path`, modified an hour ago (so that its stamp is
    /// trusted: only a new stamp makes it read again).
    fn write_old(path: &Path, text: &str) {
        std::fs::write(path, text).unwrap();
        let hour_ago = SystemTime::now() - Duration::from_secs(3600);
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(hour_ago).unwrap();
    }

    fn tokens(files: &DirFiles, file: &Path) -> Vec<String> {
        let tenant = files.files[file].outcome.as_ref().unwrap();
        tenant
            .tokens
            .iter()
            .map(|t| t.expose().to_owned())
            .collect()
    }

    #[test]
    fn scans_read_changed_files_only_and_follow_the_kubernetes_swap() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (config, env) = (config(), env());
        let mut files = DirFiles::default();
        assert!(!files.scan(&d.join("absent"), &config, &env, false).unwrap());

        // The projected volume's layout: only `acme.yaml` is a tenant file.
        std::fs::create_dir(d.join("..v1")).unwrap();
        write_old(&d.join("..v1/acme.yaml"), "tokens: [one]\nservers: []\n");
        std::os::unix::fs::symlink("..v1", d.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/acme.yaml", d.join("acme.yaml")).unwrap();
        std::fs::write(d.join("notes.txt"), "not a tenant").unwrap();
        std::fs::create_dir(d.join("sub.yaml")).unwrap();
        assert!(files.scan(d, &config, &env, false).unwrap());
        let acme = d.join("acme.yaml");
        assert_eq!(files.files.keys().collect::<Vec<_>>(), [&acme]);
        assert_eq!(tokens(&files, &acme), ["one"]);

        // Nothing changed: nothing is read again.
        assert!(!files.scan(d, &config, &env, false).unwrap());
        assert!(files.files[&acme].stamp.is_some());

        // `..data` swapped to a new directory.
        std::fs::create_dir(d.join("..v2")).unwrap();
        // The same size and modification time: only the inode (of the
        // file the links lead to) differs.
        write_old(&d.join("..v2/acme.yaml"), "tokens: [two]\nservers: []\n");
        let old = std::fs::metadata(d.join("..v1/acme.yaml"))
            .unwrap()
            .modified();
        let file = std::fs::File::options()
            .write(true)
            .open(d.join("..v2/acme.yaml"));
        file.unwrap().set_modified(old.unwrap()).unwrap();
        std::os::unix::fs::symlink("..v2", d.join("..tmp")).unwrap();
        std::fs::rename(d.join("..tmp"), d.join("..data")).unwrap();
        assert!(files.scan(d, &config, &env, false).unwrap());
        assert_eq!(tokens(&files, &acme), ["two"]);

        // Every file is read again at a configuration reload.
        files.files.get_mut(&acme).unwrap().digest = [1; 32];
        assert!(files.scan(d, &config, &env, true).unwrap());
        assert_eq!(tokens(&files, &acme), ["two"]);

        // A file just written is read at every scan until its time is a
        // second old (a write within the same timestamp tick is not
        // missed); unchanged content is not validated again.
        std::fs::write(d.join("..v2/acme.yaml"), "tokens: [new]\nservers: []\n").unwrap();
        assert!(files.scan(d, &config, &env, false).unwrap());
        assert!(files.files[&acme].stamp.is_none());
        assert!(!files.scan(d, &config, &env, false).unwrap());
        assert_eq!(tokens(&files, &acme), ["new"]);

        // Removed.
        std::fs::remove_file(&acme).unwrap();
        assert!(files.scan(d, &config, &env, false).unwrap());
        assert!(files.files.is_empty());
    }

    #[test]
    fn a_file_is_named_by_its_file_name() {
        let dir = tempfile::tempdir().unwrap();
        let (config, env) = (config(), env());
        let file = dir.path().join("acme.yaml");
        std::fs::write(&file, "name: globex\ntokens: [t]\nservers: []\n").unwrap();
        let Read::Validated(_, Err(errors)) = read_tenant(&file, None, &config, &env) else {
            panic!("a name other than the file's is refused");
        };
        assert_eq!(errors[0].path, "tenants[acme].name");
        std::fs::write(&file, "name: acme\ntokens: [t]\nservers: []\n").unwrap();
        let Read::Validated(_, Ok(tenant)) = read_tenant(&file, None, &config, &env) else {
            panic!("the file's own name is accepted");
        };
        assert_eq!(tenant.name, "acme");
        assert_eq!(tenant.origin, crate::config::TenantOrigin::Dir(file));
    }
}
