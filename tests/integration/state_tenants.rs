//! The state store's tenants (`src/state/tenants.rs`) on both backends: a
//! SQLite file and a real PostgreSQL 15 cluster (`common::PgCluster`), with
//! several `StateStore` instances over one database standing in for
//! replicas. Each scenario uses its own tenant names.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::Row as _;
use toolgate::callers::TokenDigest;
use toolgate::state::tenants::{Expect, TenantWriteError};
use toolgate::state::{KeyRing, Record, StateError, StateStore};

use crate::common::PgCluster;

const K1: [u8; 32] = [0x31; 32];

async fn store(url: &str) -> StateStore {
    StateStore::connect(url, KeyRing::new(vec![K1]).unwrap())
        .await
        .unwrap()
}

async fn raw(url: &str) -> sqlx::AnyPool {
    sqlx::any::install_default_drivers();
    sqlx::AnyPool::connect(url).await.unwrap()
}

fn digest(token: &str) -> TokenDigest {
    TokenDigest::of(token)
}

fn mismatch(result: Result<i64, TenantWriteError>) -> Option<i64> {
    match result {
        Err(TenantWriteError::VersionMismatch { current }) => current,
        other => panic!("expected a version mismatch, got {other:?}"),
    }
}

async fn behaves(url: &str) {
    put_get_and_versions(url).await;
    a_version_is_never_reused(url).await;
    token_index(url).await;
    list_count_and_versions(url).await;
    change_log(url).await;
    secrets(url).await;
    sealed_at_rest(url).await;
    one_of_two_writers_wins(url).await;
}

/// Create, replace at the right version, stale versions refused with what
/// is stored, `Any` writes whatever is there.
async fn put_get_and_versions(url: &str) {
    let s = store(url).await;
    assert_eq!(s.get_tenant("pg-acme").await.unwrap(), None);
    let v1 = s
        .put_tenant("pg-acme", "tokens: [a]\n", Expect::Absent, &[])
        .await
        .unwrap();
    let got = s.get_tenant("pg-acme").await.unwrap().unwrap();
    assert_eq!(
        (got.name.as_str(), got.version, got.spec.as_str()),
        ("pg-acme", v1, "tokens: [a]\n")
    );
    assert!(got.updated_at_ms > 1_700_000_000_000);
    // A create of an existing tenant, a replace of a missing one, a stale
    // replace: refused, saying what is stored.
    assert_eq!(
        mismatch(s.put_tenant("pg-acme", "x", Expect::Absent, &[]).await),
        Some(v1)
    );
    assert_eq!(
        mismatch(s.put_tenant("pg-none", "x", Expect::Version(v1), &[]).await),
        None
    );
    let v2 = s
        .put_tenant("pg-acme", "tokens: [b]\n", Expect::Version(v1), &[])
        .await
        .unwrap();
    assert!(v2 > v1);
    assert_eq!(
        mismatch(s.put_tenant("pg-acme", "y", Expect::Version(v1), &[]).await),
        Some(v2)
    );
    assert_eq!(
        s.get_tenant("pg-acme").await.unwrap().unwrap().spec,
        "tokens: [b]\n"
    );
    let v3 = s
        .put_tenant("pg-acme", "c", Expect::Any, &[])
        .await
        .unwrap();
    let v4 = s.put_tenant("pg-new", "d", Expect::Any, &[]).await.unwrap();
    assert!(v4 > v3 && v3 > v2);
    // Delete: a stale version refused, then the right one.
    assert_eq!(
        mismatch(s.delete_tenant("pg-acme", Expect::Version(v2)).await),
        Some(v3)
    );
    assert_eq!(
        s.delete_tenant("pg-acme", Expect::Version(v3))
            .await
            .unwrap(),
        v3
    );
    assert_eq!(
        mismatch(s.delete_tenant("pg-acme", Expect::Any).await),
        None
    );
    assert_eq!(s.delete_tenant("pg-new", Expect::Any).await.unwrap(), v4);
    assert_eq!(s.get_tenant("pg-acme").await.unwrap(), None);
    s.close().await;
}

/// ABA: a version read before a delete never matches the tenant created
/// after it, on another replica too, also when the change log was pruned.
async fn a_version_is_never_reused(url: &str) {
    let (a, b) = (store(url).await, store(url).await);
    let mut seen = Vec::new();
    for round in 0..3 {
        let v = a
            .put_tenant("aba", &format!("round {round}"), Expect::Absent, &[])
            .await
            .unwrap();
        assert!(seen.iter().all(|old| v > *old), "{v} after {seen:?}");
        for old in &seen {
            assert_eq!(
                mismatch(
                    b.put_tenant("aba", "stale", Expect::Version(*old), &[])
                        .await
                ),
                Some(v)
            );
            assert_eq!(
                mismatch(b.delete_tenant("aba", Expect::Version(*old)).await),
                Some(v)
            );
        }
        seen.push(v);
        assert_eq!(b.delete_tenant("aba", Expect::Version(v)).await.unwrap(), v);
        // Every change pruned: numbers still go on from the newest.
        a.prune_tenant_changes(i64::MAX).await.unwrap();
    }
    a.close().await;
    b.close().await;
}

/// The token index: a digest selects one tenant; another tenant's put of
/// it is refused naming the index and the tenant; a put replaces the
/// tenant's digests; a delete removes them.
async fn token_index(url: &str) {
    let s = store(url).await;
    let (one, two, three) = (digest("ti-one"), digest("ti-two"), digest("ti-three"));
    s.put_tenant("ti-acme", "s", Expect::Absent, &[one.clone(), two.clone()])
        .await
        .unwrap();
    assert_eq!(
        s.tenant_for_token(&one).await.unwrap(),
        Some(("ti-acme".into(), 0))
    );
    assert_eq!(
        s.tenant_for_token(&two).await.unwrap(),
        Some(("ti-acme".into(), 1))
    );
    assert_eq!(s.tenant_for_token(&three).await.unwrap(), None);
    match s
        .put_tenant(
            "ti-globex",
            "s",
            Expect::Absent,
            &[three.clone(), two.clone()],
        )
        .await
    {
        Err(TenantWriteError::TokenTaken { index: 1, tenant }) => assert_eq!(tenant, "ti-acme"),
        other => panic!("{other:?}"),
    }
    // Refused as a whole: no tenant, no digest of it.
    assert_eq!(s.get_tenant("ti-globex").await.unwrap(), None);
    assert_eq!(s.tenant_for_token(&three).await.unwrap(), None);
    // The same token twice in one spec is that tenant's.
    let v = s
        .put_tenant(
            "ti-acme",
            "s2",
            Expect::Any,
            &[two.clone(), three.clone(), two.clone()],
        )
        .await
        .unwrap();
    assert_eq!(s.tenant_for_token(&one).await.unwrap(), None, "replaced");
    assert_eq!(
        s.tenant_for_token(&two).await.unwrap(),
        Some(("ti-acme".into(), 0))
    );
    assert_eq!(
        s.tenant_for_token(&three).await.unwrap(),
        Some(("ti-acme".into(), 1))
    );
    // A refused replace keeps the old spec and digests.
    s.put_tenant("ti-globex", "s", Expect::Absent, std::slice::from_ref(&one))
        .await
        .unwrap();
    assert!(matches!(
        s.put_tenant(
            "ti-acme",
            "s3",
            Expect::Version(v),
            std::slice::from_ref(&one)
        )
        .await,
        Err(TenantWriteError::TokenTaken { index: 0, .. })
    ));
    assert_eq!(s.get_tenant("ti-acme").await.unwrap().unwrap().version, v);
    assert_eq!(
        s.tenant_for_token(&two).await.unwrap(),
        Some(("ti-acme".into(), 0))
    );
    s.delete_tenant("ti-acme", Expect::Any).await.unwrap();
    assert_eq!(s.tenant_for_token(&two).await.unwrap(), None);
    assert_eq!(
        s.tenant_for_token(&one).await.unwrap(),
        Some(("ti-globex".into(), 0))
    );
    // Freed by the delete: another tenant may take it.
    s.put_tenant(
        "ti-initech",
        "s",
        Expect::Absent,
        std::slice::from_ref(&two),
    )
    .await
    .unwrap();
    assert_eq!(
        s.tenant_for_token(&two).await.unwrap(),
        Some(("ti-initech".into(), 0))
    );
    for name in ["ti-globex", "ti-initech"] {
        s.delete_tenant(name, Expect::Any).await.unwrap();
    }
    s.close().await;
}

/// Listing by name a page at a time, counting, versions of many names.
async fn list_count_and_versions(url: &str) {
    let s = store(url).await;
    let before = s.count_tenants().await.unwrap();
    let mut written = HashMap::new();
    for i in 0..7 {
        let name = format!("ls-{i:02}");
        let v = s
            .put_tenant(&name, &format!("spec {i}"), Expect::Absent, &[])
            .await
            .unwrap();
        written.insert(name, v);
    }
    assert_eq!(s.count_tenants().await.unwrap(), before + 7);
    let mut names = Vec::new();
    let mut after: Option<String> = Some("ls-".into());
    for _ in 0..10 {
        let page = s.list_tenants(after.as_deref(), 3).await.unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 3);
        for t in &page {
            if t.name.starts_with("ls-") {
                assert_eq!(t.version, written[&t.name]);
                assert_eq!(
                    t.spec,
                    format!("spec {}", t.name[3..].parse::<u32>().unwrap())
                );
                names.push(t.name.clone());
            }
        }
        after = page.last().map(|t| t.name.clone());
    }
    let expected: Vec<String> = (0..7).map(|i| format!("ls-{i:02}")).collect();
    assert_eq!(names, expected);
    let all = s.list_tenants(None, 1000).await.unwrap();
    assert!(all.windows(2).all(|w| w[0].name < w[1].name));
    assert_eq!(all.len() as u64, s.count_tenants().await.unwrap());

    let mut asked: Vec<String> = written.keys().cloned().collect();
    asked.push("ls-missing".into());
    // More names than one statement binds.
    asked.extend((0..1200).map(|i| format!("ls-absent-{i}")));
    assert_eq!(s.tenant_versions(&asked).await.unwrap(), written);
    s.delete_tenant("ls-03", Expect::Any).await.unwrap();
    written.remove("ls-03");
    assert_eq!(s.tenant_versions(&asked).await.unwrap(), written);
    assert!(s.tenant_versions(&[]).await.unwrap().is_empty());
    for name in written.keys() {
        s.delete_tenant(name, Expect::Any).await.unwrap();
    }
    s.close().await;
}

/// Every write is one change, in order; a refused write none; a delete
/// has version 0; pruning by age keeps the newest.
async fn change_log(url: &str) {
    let (a, b) = (store(url).await, store(url).await);
    let start = b.last_tenant_change().await.unwrap();
    let v1 = a
        .put_tenant("cl-acme", "1", Expect::Absent, &[])
        .await
        .unwrap();
    let _ = a
        .put_tenant("cl-acme", "x", Expect::Absent, &[])
        .await
        .unwrap_err();
    let v2 = a
        .put_tenant("cl-acme", "2", Expect::Version(v1), &[])
        .await
        .unwrap();
    let secret = a.put_secret("cl-acme", "k", b"value", None).await.unwrap();
    assert_eq!(secret, 1);
    let v3 = a.get_tenant("cl-acme").await.unwrap().unwrap().version;
    assert!(v3 > v2, "a secret of an existing tenant writes a change");
    // A secret of a tenant that does not exist writes no change.
    a.put_secret("cl-later", "k", b"v", None).await.unwrap();
    assert_eq!(a.delete_tenant("cl-acme", Expect::Any).await.unwrap(), v3);
    let last = b.last_tenant_change().await.unwrap();
    let changes = b.tenant_changes(start, 100).await.unwrap();
    let seen: Vec<(&str, i64)> = changes
        .iter()
        .map(|c| (c.tenant.as_str(), c.version))
        .collect();
    assert_eq!(
        seen,
        [
            ("cl-acme", v1),
            ("cl-acme", v2),
            ("cl-acme", v3),
            ("cl-acme", 0)
        ]
    );
    assert_eq!(changes.last().unwrap().seq, last);
    assert!(
        changes
            .windows(2)
            .all(|w| w[0].seq < w[1].seq && w[0].at_ms <= w[1].at_ms)
    );
    let now = toolgate_now_ms();
    assert!(changes.iter().all(|c| (now - c.at_ms).abs() < 60_000));
    // Paging by sequence number.
    let first_two = b.tenant_changes(start, 2).await.unwrap();
    assert_eq!(first_two, changes[..2]);
    assert_eq!(
        b.tenant_changes(first_two[1].seq, 100).await.unwrap(),
        changes[2..]
    );
    // Pruning: nothing younger than the limit, never the newest.
    assert_eq!(b.prune_tenant_changes(0).await.unwrap(), 0);
    b.prune_tenant_changes(now + 60_000).await.unwrap();
    assert_eq!(b.tenant_changes(0, 100).await.unwrap(), changes[3..]);
    assert_eq!(b.last_tenant_change().await.unwrap(), last);
    a.delete_secret("cl-later", "k").await.unwrap();
    a.close().await;
    b.close().await;
}

fn toolgate_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Secrets: written before or after their tenant, versions by one, names
/// and versions listed (never values), values read by name; a write of an
/// existing tenant's secret moves its version (and, given, its tokens);
/// delete; a deleted tenant's secrets go with it.
async fn secrets(url: &str) {
    let s = store(url).await;
    assert_eq!(
        s.put_secret("se-acme", "api-key", b"first", None)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        s.put_secret("se-acme", "api-key", b"second", None)
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        s.put_secret("se-acme", "token", b"tok-1", None)
            .await
            .unwrap(),
        1
    );
    s.put_secret("se-globex", "api-key", b"globex's", None)
        .await
        .unwrap();
    let listed = s.list_secrets("se-acme").await.unwrap();
    let listed: Vec<(&str, i64)> = listed
        .iter()
        .map(|i| (i.name.as_str(), i.version))
        .collect();
    assert_eq!(listed, [("api-key", 2), ("token", 1)]);
    let names = vec![
        "api-key".to_owned(),
        "token".to_owned(),
        "missing".to_owned(),
    ];
    let values = s.secrets("se-acme", &names).await.unwrap();
    assert_eq!(values.len(), 2);
    assert_eq!(values["api-key"].expose(), "second");
    assert_eq!(values["token"].expose(), "tok-1");
    assert!(s.secrets("se-acme", &[]).await.unwrap().is_empty());

    let v1 = s
        .put_tenant(
            "se-acme",
            "tokens: [{stored: token}]",
            Expect::Absent,
            &[digest("tok-1")],
        )
        .await
        .unwrap();
    // The token's secret changes: the tenant's version and index follow.
    s.put_secret("se-acme", "token", b"tok-2", Some(&[digest("tok-2")]))
        .await
        .unwrap();
    let t = s.get_tenant("se-acme").await.unwrap().unwrap();
    assert!(t.version > v1);
    assert_eq!(
        t.spec, "tokens: [{stored: token}]",
        "the spec opens at its new version"
    );
    assert_eq!(s.tenant_for_token(&digest("tok-1")).await.unwrap(), None);
    assert_eq!(
        s.tenant_for_token(&digest("tok-2")).await.unwrap(),
        Some(("se-acme".into(), 0))
    );
    assert_eq!(
        mismatch(s.put_tenant("se-acme", "x", Expect::Version(v1), &[]).await),
        Some(t.version)
    );
    // Another tenant's token as this one's: refused, nothing written.
    s.put_tenant("se-other", "s", Expect::Absent, &[digest("other-token")])
        .await
        .unwrap();
    assert!(matches!(
        s.put_secret("se-acme", "token", b"other-token", Some(&[digest("other-token")])).await,
        Err(TenantWriteError::TokenTaken { index: 0, tenant }) if tenant == "se-other"
    ));
    assert_eq!(
        s.secrets("se-acme", &names).await.unwrap()["token"].expose(),
        "tok-2"
    );
    assert_eq!(
        s.get_tenant("se-acme").await.unwrap().unwrap().version,
        t.version
    );

    assert!(s.delete_secret("se-acme", "api-key").await.unwrap());
    assert!(!s.delete_secret("se-acme", "api-key").await.unwrap());
    assert_eq!(s.list_secrets("se-acme").await.unwrap().len(), 1);
    s.delete_tenant("se-acme", Expect::Any).await.unwrap();
    assert!(s.list_secrets("se-acme").await.unwrap().is_empty());
    assert_eq!(
        s.list_secrets("se-globex").await.unwrap().len(),
        1,
        "others' stay"
    );
    s.delete_tenant("se-other", Expect::Any).await.unwrap();
    s.delete_secret("se-globex", "api-key").await.unwrap();
    s.close().await;
}

/// Specs and secrets are sealed: not in the clear in the database, and a
/// value moved to another row (or an older spec put back) does not open.
async fn sealed_at_rest(url: &str) {
    let s = store(url).await;
    let spec = "tokens: [literal-hunter2]\n";
    let v1 = s
        .put_tenant("sa-acme", spec, Expect::Absent, &[])
        .await
        .unwrap();
    s.put_tenant("sa-globex", "tokens: [g]\n", Expect::Absent, &[])
        .await
        .unwrap();
    let pool = raw(url).await;
    let sealed = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query(sql)
                .fetch_all(&pool)
                .await
                .unwrap()
                .iter()
                .map(|r| r.get::<Vec<u8>, _>(0))
                .collect::<Vec<_>>()
        }
    };
    let contains = |h: &[u8], n: &[u8]| h.windows(n.len()).any(|w| w == n);
    let acme = sealed("SELECT sealed FROM toolgate_tenants WHERE name = 'sa-acme'").await;
    // Secrets written move the version: the spec sealed at v1 put back
    // opens at v1 only, not at the current version.
    s.put_secret("sa-acme", "key", b"secret-hunter3", None)
        .await
        .unwrap();
    s.put_secret("sa-acme", "other", b"x", None).await.unwrap();
    let v3 = s.get_tenant("sa-acme").await.unwrap().unwrap().version;
    assert!(v3 > v1);
    for value in sealed("SELECT sealed FROM toolgate_tenants").await {
        assert!(!contains(&value, b"hunter2"));
    }
    for value in sealed("SELECT sealed FROM toolgate_tenant_secrets").await {
        assert!(!contains(&value, b"hunter3"));
    }
    for version in [v1, v3] {
        sqlx::query("UPDATE toolgate_tenants SET sealed = $1, version = $2 WHERE name = 'sa-acme'")
            .bind(&acme[0])
            .bind(version)
            .execute(&pool)
            .await
            .unwrap();
        let result = s.get_tenant("sa-acme").await;
        if version == v1 {
            assert_eq!(
                result.unwrap().unwrap().spec,
                spec,
                "at its own version it opens"
            );
        } else {
            assert!(
                matches!(
                    result,
                    Err(StateError::Decrypt {
                        record: Record::Tenant,
                        ..
                    })
                ),
                "{result:?}"
            );
        }
    }
    // acme's spec in globex's row does not open.
    sqlx::query("UPDATE toolgate_tenants SET sealed = $1, version = $2 WHERE name = 'sa-globex'")
        .bind(&acme[0])
        .bind(v1)
        .execute(&pool)
        .await
        .unwrap();
    assert!(matches!(
        s.get_tenant("sa-globex").await,
        Err(StateError::Decrypt {
            record: Record::Tenant,
            ..
        })
    ));
    // A secret moved to another name does not open.
    let key = sealed(
        "SELECT sealed FROM toolgate_tenant_secrets WHERE tenant = 'sa-acme' AND name = 'key'",
    )
    .await;
    sqlx::query("UPDATE toolgate_tenant_secrets SET sealed = $1 WHERE tenant = 'sa-acme' AND name = 'other'")
        .bind(&key[0])
        .execute(&pool)
        .await
        .unwrap();
    assert!(matches!(
        s.secrets("sa-acme", &["other".to_owned()]).await,
        Err(StateError::Decrypt {
            record: Record::TenantSecret,
            ..
        })
    ));
    pool.close().await;
    for name in ["sa-acme", "sa-globex"] {
        s.delete_tenant(name, Expect::Any).await.unwrap();
    }
    s.close().await;
}

/// Replicas writing one tenant at once: of the puts expecting the same
/// version exactly one wins, the others see the winner's version; of the
/// creates exactly one wins. Several rounds, since a race needs luck.
async fn one_of_two_writers_wins(url: &str) {
    const WRITERS: usize = 4;
    let replicas: Vec<StateStore> = futures_join(url, WRITERS).await;
    for round in 0..5 {
        let name = format!("race-{round}");
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(WRITERS));
        let mut tasks = Vec::new();
        for (i, s) in replicas.iter().enumerate() {
            let (s, name, barrier) = (s.clone(), name.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                s.put_tenant(&name, &format!("creator {i}"), Expect::Absent, &[])
                    .await
            }));
        }
        let results = join_all(tasks).await;
        let won: Vec<i64> = results
            .iter()
            .filter_map(|r| r.as_ref().ok().copied())
            .collect();
        assert_eq!(won.len(), 1, "round {round}: {results:?}");
        let v = won[0];
        for r in results.iter().filter(|r| r.is_err()) {
            assert!(
                matches!(r, Err(TenantWriteError::VersionMismatch { current: Some(c) }) if *c == v)
            );
        }
        let mut tasks = Vec::new();
        for (i, s) in replicas.iter().enumerate() {
            let (s, name, barrier) = (s.clone(), name.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                s.put_tenant(&name, &format!("writer {i}"), Expect::Version(v), &[])
                    .await
            }));
        }
        let results = join_all(tasks).await;
        let won: Vec<(usize, i64)> = results
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().ok().map(|v| (i, *v)))
            .collect();
        assert_eq!(won.len(), 1, "round {round}: {results:?}");
        let (winner, v2) = won[0];
        for r in results.iter().filter(|r| r.is_err()) {
            assert!(
                matches!(r, Err(TenantWriteError::VersionMismatch { current: Some(c) }) if *c == v2)
            );
        }
        let stored = replicas[0].get_tenant(&name).await.unwrap().unwrap();
        assert_eq!(
            (stored.version, stored.spec),
            (v2, format!("writer {winner}"))
        );
    }
    for s in replicas {
        s.close().await;
    }
}

async fn futures_join(url: &str, n: usize) -> Vec<StateStore> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(store(url).await);
    }
    out
}

async fn join_all<T: std::fmt::Debug>(tasks: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::new();
    for task in tasks {
        out.push(
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_tenants() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("state.db").display());
    behaves(&url).await;
    // No notices on SQLite: followers poll the change log.
    assert!(store(&url).await.listen_tenants().await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_tenants() {
    let pg = PgCluster::start();
    behaves(&pg.url()).await;
    notices(&pg.url()).await;
}

/// PostgreSQL: every committed write is a notice naming its tenant, to a
/// listener of another replica; a refused write none.
async fn notices(url: &str) {
    let (a, b) = (store(url).await, store(url).await);
    let mut notices = b
        .listen_tenants()
        .await
        .unwrap()
        .expect("PostgreSQL listens");
    let v = a
        .put_tenant("no-acme", "s", Expect::Absent, &[])
        .await
        .unwrap();
    assert_eq!(next(&mut notices).await, "no-acme");
    let _ = a
        .put_tenant("no-acme", "s", Expect::Absent, &[])
        .await
        .unwrap_err();
    a.put_secret("no-globex", "k", b"v", None).await.unwrap(); // no tenant: no notice
    a.put_secret("no-acme", "k", b"v", None).await.unwrap();
    assert_eq!(next(&mut notices).await, "no-acme");
    a.put_tenant("no-initech", "s", Expect::Any, &[])
        .await
        .unwrap();
    assert_eq!(next(&mut notices).await, "no-initech");
    a.delete_tenant("no-acme", Expect::Any).await.unwrap();
    assert_eq!(next(&mut notices).await, "no-acme");
    let _ = v;
    a.close().await;
    b.close().await;
}

async fn next(notices: &mut toolgate::state::Notices) -> String {
    tokio::time::timeout(Duration::from_secs(10), notices.next())
        .await
        .expect("a notice in time")
        .unwrap()
}
