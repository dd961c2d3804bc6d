//! The state store against both of its backends: the same scenarios on a
//! SQLite file and on a real PostgreSQL 15 cluster (`common::PgCluster`),
//! with two `StateStore` instances over one database standing in for two
//! replicas.

use std::time::{Duration, Instant};

use oauth2::TokenResponse as _;
use rmcp::transport::auth::{
    OAuthTokenResponse, StoredAuthorizationState, StoredCredentials, VendorExtraTokenFields,
};
use sqlx::Row as _;
use toolgate::credentials::StateOAuthStore;
use toolgate::credentials::oauth::{OAuthStore, PendingFlow, RegisteredClient};
use toolgate::state::{
    ClientKey, KeyRing, OpenError, Record, Replaced, StateError, StateStore, TokenKey, Versioned,
};

use crate::common::PgCluster;

const K1: [u8; 32] = [0x11; 32];
const K2: [u8; 32] = [0x22; 32];

fn ring(keys: &[[u8; 32]]) -> KeyRing {
    KeyRing::new(keys.to_vec()).unwrap()
}

async fn store(url: &str, keys: &[[u8; 32]]) -> StateStore {
    StateStore::connect(url, ring(keys)).await.unwrap()
}

/// A plain sqlx pool, to look at rows as an attacker with the database would.
async fn raw(url: &str) -> sqlx::AnyPool {
    sqlx::any::install_default_drivers();
    sqlx::AnyPool::connect(url).await.unwrap()
}

async fn raw_sealed(url: &str, sql: &str) -> Vec<Vec<u8>> {
    let pool = raw(url).await;
    let rows = sqlx::query(sql).fetch_all(&pool).await.unwrap();
    pool.close().await;
    rows.iter().map(|r| r.get::<Vec<u8>, _>(0)).collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Every scenario, each on its own tenant, in one database.
async fn behaves(url: &str) {
    round_trip_and_isolation(url).await;
    compare_and_swap_between_replicas(url).await;
    pending_taken_once(url).await;
    pending_expiry(url).await;
    encrypted_at_rest(url).await;
    key_rotation_across_instances(url).await;
    row_moved_does_not_decrypt(url).await;
    leases_between_replicas(url).await;
    subjects_by_age_per_tenant_and_server(url).await;
    pending_read_in_place(url).await;
    oauth_store_round_trip(url).await;
    oauth_store_keeps_the_first_save_of_a_race(url).await;
    older_version_put_back_does_not_open(url).await;
    concurrent_puts_each_get_a_version(url).await;
    tasks_are_bound_to_their_id_and_tenant(url).await;
    racing_task_puts_stop_at_the_cap(url).await;
}

/// Puts racing for a tenant's last places of open tasks: exactly as many
/// as there are places are stored (the count and the insert are one step),
/// on several connections and, for PostgreSQL, several stores.
async fn racing_task_puts_stop_at_the_cap(url: &str) {
    let stores = [store(url, &[K1]).await, store(url, &[K1]).await];
    let far = 4_102_444_800_000; // 2100-01-01
    const CAP: u64 = 5;
    let mut puts = Vec::new();
    for i in 0..40 {
        let s = stores[i % 2].clone();
        puts.push(tokio::spawn(async move {
            s.put_task(&format!("tgt_race{i}"), "tasks-race", b"{}", far, CAP)
                .await
        }));
    }
    let mut stored = 0;
    for put in puts {
        if put.await.unwrap().unwrap() {
            stored += 1;
        }
    }
    assert_eq!(stored, CAP, "stored past the cap");
    assert_eq!(stores[0].count_tasks("tasks-race").await.unwrap(), CAP);
    // Another tenant has its own places.
    assert!(
        stores[0]
            .put_task("tgt_race_other", "tasks-race-other", b"{}", far, CAP)
            .await
            .unwrap()
    );
    for s in stores {
        s.close().await;
    }
}

/// A task row opens for its id and tenant only, holds no live id, and is
/// gone once expired; a row copied to another id does not open.
async fn tasks_are_bound_to_their_id_and_tenant(url: &str) {
    let s = store(url, &[K1]).await;
    let far = 4_102_444_800_000; // 2100-01-01
    s.put_task("tgt_first", "tasks-acme", b"alice's task", far, u64::MAX)
        .await
        .unwrap();
    assert_eq!(
        s.get_task("tgt_first", "tasks-acme").await.unwrap(),
        Some((b"alice's task".to_vec(), far))
    );
    assert_eq!(s.get_task("tgt_first", "tasks-globex").await.unwrap(), None);
    assert_eq!(s.get_task("tgt_other", "tasks-acme").await.unwrap(), None);
    assert_eq!(s.count_tasks("tasks-acme").await.unwrap(), 1);
    assert!(
        s.replace_task("tgt_first", "tasks-acme", b"done")
            .await
            .unwrap()
    );
    assert!(
        !s.replace_task("tgt_first", "tasks-globex", b"x")
            .await
            .unwrap()
    );
    assert_eq!(
        s.get_task("tgt_first", "tasks-acme").await.unwrap(),
        Some((b"done".to_vec(), far))
    );
    // The table never holds the id, only its SHA-256.
    let hash = |id: &str| -> String {
        use sha2::Digest as _;
        sha2::Sha256::digest(id.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let pool = raw(url).await;
    let rows =
        sqlx::query("SELECT task_hash, sealed FROM toolgate_tasks WHERE tenant = 'tasks-acme'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<String, _>(0), hash("tgt_first"));
    let first_sealed: Vec<u8> = rows[0].get(1);
    // A sealed value moved to another id's row does not open.
    s.put_task("tgt_second", "tasks-acme", b"bob's task", far, u64::MAX)
        .await
        .unwrap();
    sqlx::query("UPDATE toolgate_tasks SET sealed = $1 WHERE task_hash = $2")
        .bind(first_sealed)
        .bind(hash("tgt_second"))
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    assert!(matches!(
        s.get_task("tgt_second", "tasks-acme").await,
        Err(StateError::Decrypt { .. })
    ));
    // Expired: not returned, purged.
    s.put_task("tgt_old", "tasks-acme", b"old", 1, u64::MAX)
        .await
        .unwrap();
    assert_eq!(s.get_task("tgt_old", "tasks-acme").await.unwrap(), None);
    assert!(s.purge_expired_tasks().await.unwrap() >= 1);
    s.close().await;
}

async fn round_trip_and_isolation(url: &str) {
    let s = store(url, &[K1]).await;
    let alice = TokenKey::new("rt", "alice", "github");
    let bob = TokenKey::new("rt", "bob", "github");
    let tenant = TokenKey::tenant_wide("rt", "github");
    assert_eq!(s.get_token(&alice).await.unwrap(), None);
    assert_eq!(s.put_token(&alice, b"alice-1").await.unwrap(), 1);
    assert_eq!(s.put_token(&alice, b"alice-2").await.unwrap(), 2);
    assert_eq!(
        s.get_token(&alice).await.unwrap(),
        Some(Versioned {
            version: 2,
            value: b"alice-2".to_vec()
        })
    );
    // One subject's token never serves another, nor the tenant itself.
    assert_eq!(s.get_token(&bob).await.unwrap(), None);
    assert_eq!(s.get_token(&tenant).await.unwrap(), None);
    assert_eq!(
        s.get_token(&TokenKey::new("other", "alice", "github"))
            .await
            .unwrap(),
        None
    );
    assert!(s.delete_token(&alice).await.unwrap());
    assert!(!s.delete_token(&alice).await.unwrap());
    assert_eq!(s.get_token(&alice).await.unwrap(), None);

    let client = ClientKey::new("rt", "github", "https://issuer.example");
    let other_issuer = ClientKey::new("rt", "github", "https://other.example");
    assert_eq!(s.get_client(&client).await.unwrap(), None);
    s.put_client(&client, b"{\"client_id\":\"a\"}")
        .await
        .unwrap();
    s.put_client(&client, b"{\"client_id\":\"b\"}")
        .await
        .unwrap();
    assert_eq!(
        s.get_client(&client).await.unwrap().unwrap(),
        b"{\"client_id\":\"b\"}"
    );
    assert_eq!(s.get_client(&other_issuer).await.unwrap(), None);
    assert!(s.delete_client(&client).await.unwrap());
    assert_eq!(s.get_client(&client).await.unwrap(), None);
    s.close().await;
}

/// Two stores (replicas) with several refreshers each race on one version:
/// exactly one wins each round, every loser gets the winner's token.
async fn compare_and_swap_between_replicas(url: &str) {
    let replicas = [store(url, &[K1]).await, store(url, &[K1]).await];
    let key = TokenKey::new("cas", "alice", "github");
    replicas[0].put_token(&key, b"token-0").await.unwrap();
    for round in 0..5 {
        let current = replicas[1].get_token(&key).await.unwrap().unwrap();
        let mut tasks = Vec::new();
        for n in 0..8 {
            let s = replicas[n % 2].clone();
            let key = key.clone();
            let value = format!("token-{round}-{n}").into_bytes();
            tasks.push(tokio::spawn(async move {
                let outcome = s
                    .replace_token(&key, current.version, &value)
                    .await
                    .unwrap();
                (value, outcome)
            }));
        }
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.unwrap());
        }
        let winners: Vec<_> = outcomes
            .iter()
            .filter_map(|(value, o)| match o {
                Replaced::Won(version) => Some((value.clone(), *version)),
                Replaced::Lost(_) => None,
            })
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {outcomes:?}");
        let (won_value, won_version) = winners[0].clone();
        assert_eq!(won_version, current.version + 1);
        for (_, outcome) in &outcomes {
            if let Replaced::Lost(seen) = outcome {
                assert_eq!(
                    seen.as_ref(),
                    Some(&Versioned {
                        version: won_version,
                        value: won_value.clone()
                    }),
                    "a loser reads the winner's token"
                );
            }
        }
        let stored = replicas[0].get_token(&key).await.unwrap().unwrap();
        assert_eq!((stored.version, stored.value), (won_version, won_value));
    }
    // A refresh of a token deleted meanwhile loses with nothing to read.
    let version = replicas[0].get_token(&key).await.unwrap().unwrap().version;
    replicas[1].delete_token(&key).await.unwrap();
    assert_eq!(
        replicas[0]
            .replace_token(&key, version, b"late")
            .await
            .unwrap(),
        Replaced::Lost(None)
    );
    for s in replicas {
        s.close().await;
    }
}

/// A callback is consumed once, even when two replicas race for it.
async fn pending_taken_once(url: &str) {
    let replicas = [store(url, &[K1]).await, store(url, &[K1]).await];
    for round in 0..5 {
        let state = format!("state-{round}-Xk2j9");
        replicas[round % 2]
            .put_pending(&state, b"pkce-verifier", Duration::from_secs(600))
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for n in 0..8 {
            let s = replicas[n % 2].clone();
            let state = state.clone();
            tasks.push(tokio::spawn(async move {
                s.take_pending(&state).await.unwrap()
            }));
        }
        let mut got = Vec::new();
        for task in tasks {
            if let Some(value) = task.await.unwrap() {
                got.push(value);
            }
        }
        assert_eq!(got, vec![b"pkce-verifier".to_vec()], "round {round}");
        assert_eq!(replicas[0].take_pending(&state).await.unwrap(), None);
    }
    // The same state cannot be registered twice while live.
    replicas[0]
        .put_pending("dup-state", b"a", Duration::from_secs(600))
        .await
        .unwrap();
    let err = replicas[1]
        .put_pending("dup-state", b"b", Duration::from_secs(600))
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::Database(_)), "{err:?}");
    assert_eq!(
        replicas[1]
            .take_pending("dup-state")
            .await
            .unwrap()
            .unwrap(),
        b"a"
    );
    for s in replicas {
        s.close().await;
    }
}

/// An expired flow is never returned, and expired rows are purged.
async fn pending_expiry(url: &str) {
    let s = store(url, &[K1]).await;
    s.put_pending("expired-1", b"v", Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(s.take_pending("expired-1").await.unwrap(), None);

    s.put_pending("live-1", b"live", Duration::from_secs(600))
        .await
        .unwrap();
    s.put_pending("expired-2", b"v", Duration::ZERO)
        .await
        .unwrap();
    assert!(s.purge_expired().await.unwrap() >= 1);
    let now_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let pool = raw(url).await;
    let stale: i64 =
        sqlx::query("SELECT COUNT(*) FROM toolgate_pending_flows WHERE expires_at_ms <= $1")
            .bind(now_ms)
            .fetch_one(&pool)
            .await
            .unwrap()
            .get(0);
    pool.close().await;
    assert_eq!(stale, 0, "expired flows are purged");
    assert_eq!(s.take_pending("expired-2").await.unwrap(), None);
    assert_eq!(s.take_pending("live-1").await.unwrap().unwrap(), b"live");
    s.close().await;
}

/// Values, client secrets and `state` values are not readable from the rows.
async fn encrypted_at_rest(url: &str) {
    let s = store(url, &[K1]).await;
    s.put_token(
        &TokenKey::new("rest", "alice", "github"),
        b"PLAINTEXT-ACCESS-TOKEN",
    )
    .await
    .unwrap();
    s.put_client(
        &ClientKey::new("rest", "github", "https://issuer.example"),
        b"PLAINTEXT-CLIENT-SECRET",
    )
    .await
    .unwrap();
    s.put_pending(
        "PLAINTEXT-STATE",
        b"PLAINTEXT-VERIFIER",
        Duration::from_secs(600),
    )
    .await
    .unwrap();
    s.close().await;

    let tokens = raw_sealed(url, "SELECT sealed_with_version FROM toolgate_tokens").await;
    let clients = raw_sealed(url, "SELECT sealed FROM toolgate_oauth_clients").await;
    let pending = raw_sealed(url, "SELECT sealed FROM toolgate_pending_flows").await;
    assert!(!tokens.is_empty() && !clients.is_empty() && !pending.is_empty());
    for sealed in tokens.iter().chain(&clients).chain(&pending) {
        assert!(!contains(sealed, b"PLAINTEXT"), "plaintext at rest");
    }
    let pool = raw(url).await;
    let hashes: Vec<String> = sqlx::query("SELECT state_hash FROM toolgate_pending_flows")
        .fetch_all(&pool)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    pool.close().await;
    assert!(
        hashes.iter().all(|h| !h.contains("PLAINTEXT")),
        "{hashes:?}"
    );
}

/// Rotation: a replica with a new first key reads old rows and writes new
/// ones with the new key; a replica without the new key cannot read those;
/// once the old key is dropped, only rewritten rows read.
async fn key_rotation_across_instances(url: &str) {
    let old_key = TokenKey::new("rotate", "alice", "github");
    let new_key = TokenKey::new("rotate", "bob", "github");
    let old = store(url, &[K1]).await;
    old.put_token(&old_key, b"sealed-with-k1").await.unwrap();

    let rotated = store(url, &[K2, K1]).await;
    assert_eq!(
        rotated.get_token(&old_key).await.unwrap().unwrap().value,
        b"sealed-with-k1"
    );
    rotated
        .put_token(&new_key, b"sealed-with-k2")
        .await
        .unwrap();

    let pool = raw(url).await;
    let sealed: Vec<u8> = sqlx::query(
        "SELECT sealed_with_version FROM toolgate_tokens WHERE tenant = 'rotate' AND subject = 'bob'",
    )
    .fetch_one(&pool)
    .await
    .unwrap()
    .get(0);
    pool.close().await;
    let id: String = sealed[1..9].iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        id,
        ring(&[K2]).key_ids()[0].to_string(),
        "new rows use the new key"
    );

    match old.get_token(&new_key).await {
        Err(StateError::Decrypt {
            record: Record::Token,
            cause: OpenError::UnknownKey { .. },
        }) => {}
        other => panic!("expected Decrypt(UnknownKey), got {other:?}"),
    }

    let new_only = store(url, &[K2]).await;
    assert!(matches!(
        new_only.get_token(&old_key).await,
        Err(StateError::Decrypt { .. })
    ));
    assert_eq!(
        new_only.get_token(&new_key).await.unwrap().unwrap().value,
        b"sealed-with-k2"
    );
    // Rewriting the old row under the rotated ring moves it to the new key.
    let current = rotated.get_token(&old_key).await.unwrap().unwrap();
    assert!(matches!(
        rotated
            .replace_token(&old_key, current.version, &current.value)
            .await
            .unwrap(),
        Replaced::Won(_)
    ));
    assert_eq!(
        new_only.get_token(&old_key).await.unwrap().unwrap().value,
        b"sealed-with-k1"
    );
    for s in [old, rotated, new_only] {
        s.close().await;
    }
}

/// A sealed value copied into another row does not decrypt there.
async fn row_moved_does_not_decrypt(url: &str) {
    let s = store(url, &[K1]).await;
    let alice = TokenKey::new("moved", "alice", "github");
    let mallory = TokenKey::new("moved", "mallory", "github");
    s.put_token(&alice, b"alice-token").await.unwrap();
    s.put_token(&mallory, b"mallory-token").await.unwrap();

    let pool = raw(url).await;
    sqlx::query(
        "UPDATE toolgate_tokens SET sealed_with_version = \
         (SELECT sealed_with_version FROM toolgate_tokens WHERE tenant = 'moved' AND subject = 'alice') \
         WHERE tenant = 'moved' AND subject = 'mallory'",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;

    match s.get_token(&mallory).await {
        Err(
            err @ StateError::Decrypt {
                cause: OpenError::Tampered { .. },
                ..
            },
        ) => assert!(!err.to_string().contains("alice-token")),
        other => panic!("expected Decrypt(Tampered), got {other:?}"),
    }
    assert_eq!(
        s.get_token(&alice).await.unwrap().unwrap().value,
        b"alice-token"
    );
    s.close().await;
}

/// The sealed value of a token row written at `key`, as the database holds it.
async fn raw_token(url: &str, key: &TokenKey) -> (i64, Vec<u8>) {
    let pool = raw(url).await;
    let row = sqlx::query(
        "SELECT version, sealed_with_version FROM toolgate_tokens \
         WHERE tenant = $1 AND subject = $2 AND server = $3",
    )
    .bind(&key.tenant)
    .bind(&key.subject)
    .bind(&key.server)
    .fetch_one(&pool)
    .await
    .unwrap();
    pool.close().await;
    (row.get(0), row.get(1))
}

/// Writes the row of `key` as someone with write access to the database
/// would: any sealed bytes, any version.
async fn raw_set_token(url: &str, key: &TokenKey, version: i64, sealed: &[u8]) {
    let pool = raw(url).await;
    let done = sqlx::query(
        "UPDATE toolgate_tokens SET version = $1, sealed_with_version = $2 \
         WHERE tenant = $3 AND subject = $4 AND server = $5",
    )
    .bind(version)
    .bind(sealed)
    .bind(&key.tenant)
    .bind(&key.subject)
    .bind(&key.server)
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    assert_eq!(done.rows_affected(), 1);
}

fn assert_tampered<T: std::fmt::Debug>(result: Result<T, StateError>) {
    match result {
        Err(StateError::Decrypt {
            record: Record::Token,
            cause: OpenError::Tampered { .. },
        }) => {}
        other => panic!("expected Decrypt(Tampered), got {other:?}"),
    }
}

/// A token's seal binds the row's version: the sealed bytes of an older
/// version (an already rotated refresh token) put back into the row do not
/// open, nor does the current value under a bumped version. The gateway's
/// adapter reports an error (not a token); the next write repairs the row.
async fn older_version_put_back_does_not_open(url: &str) {
    let s = store(url, &[K1]).await;
    let key = TokenKey::new("rollback", "alice", "github");
    assert_eq!(s.put_token(&key, b"refresh-token-1").await.unwrap(), 1);
    let (_, v1) = raw_token(url, &key).await;
    assert_eq!(
        s.replace_token(&key, 1, b"refresh-token-2").await.unwrap(),
        Replaced::Won(2)
    );
    let (version, v2) = raw_token(url, &key).await;
    assert_eq!(version, 2);

    // v1's bytes under v2's version.
    raw_set_token(url, &key, 2, &v1).await;
    assert_tampered(s.get_token(&key).await);
    let oauth = StateOAuthStore::new(s.clone());
    let error = oauth.load_credentials(&key).await.unwrap_err();
    assert!(
        error.0.contains("stored token cannot be decrypted"),
        "{error}"
    );
    assert!(!error.0.contains("refresh-token"), "{error}");
    // v2's bytes under another version.
    raw_set_token(url, &key, 3, &v2).await;
    assert_tampered(s.get_token(&key).await);
    // Put back as they were, they open.
    raw_set_token(url, &key, 2, &v2).await;
    assert_eq!(
        s.get_token(&key).await.unwrap().unwrap(),
        Versioned {
            version: 2,
            value: b"refresh-token-2".to_vec()
        }
    );

    // A broken row does not stop the next write (a new consent), which
    // seals for the version it writes.
    raw_set_token(url, &key, 2, &v1).await;
    assert_eq!(s.put_token(&key, b"refresh-token-3").await.unwrap(), 3);
    assert_eq!(
        s.get_token(&key).await.unwrap().unwrap().value,
        b"refresh-token-3"
    );
    raw_set_token(url, &key, 3, &v1).await;
    assert!(matches!(
        s.replace_token(&key, 3, b"refresh-token-4").await.unwrap(),
        Replaced::Won(4)
    ));
    assert_eq!(
        s.get_token(&key).await.unwrap().unwrap().value,
        b"refresh-token-4"
    );
    s.close().await;
}

/// Unconditional writes racing on one row (two replicas, several tasks
/// each) all succeed, each with its own version, and the row opens.
async fn concurrent_puts_each_get_a_version(url: &str) {
    let replicas = [store(url, &[K1]).await, store(url, &[K1]).await];
    let key = TokenKey::new("puts", "alice", "github");
    let mut tasks = Vec::new();
    for n in 0..8 {
        let s = replicas[n % 2].clone();
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let value = format!("token-{n}").into_bytes();
            (s.put_token(&key, &value).await.unwrap(), value)
        }));
    }
    let mut written = Vec::new();
    for task in tasks {
        written.push(task.await.unwrap());
    }
    let mut versions: Vec<i64> = written.iter().map(|(v, _)| *v).collect();
    versions.sort_unstable();
    assert_eq!(versions, (1..=8).collect::<Vec<_>>());
    let last = written.iter().find(|(v, _)| *v == 8).unwrap().1.clone();
    assert_eq!(
        replicas[1].get_token(&key).await.unwrap().unwrap(),
        Versioned {
            version: 8,
            value: last
        }
    );
    for s in replicas {
        s.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_store_behaves() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let url = format!("sqlite://{}", path.display());
    behaves(&url).await;
    assert!(path.exists(), "the SQLite file is created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_store_behaves() {
    let pg = PgCluster::start();
    behaves(&pg.url()).await;
}

/// A database for one scenario: a new SQLite file in `dir`, or a new
/// database in `pg`.
async fn fresh_database(dir: &std::path::Path, pg: Option<&PgCluster>, name: &str) -> String {
    match pg {
        None => format!(
            "sqlite://{}?mode=rwc",
            dir.join(format!("{name}.db")).display()
        ),
        Some(pg) => {
            let pool = raw(&pg.url()).await;
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&pool)
                .await
                .unwrap();
            pool.close().await;
            let url = pg.url();
            let base = url.strip_suffix("/postgres").unwrap();
            format!("{base}/{name}")
        }
    }
}

/// The associated data tokens were sealed with before migration 0003 (the
/// row's key only), as the earlier release wrote it.
fn aad_before_versions(key: &TokenKey) -> Vec<u8> {
    let mut out = b"toolgate-state-v1\0token\0".to_vec();
    for field in [&key.tenant, &key.subject, &key.server] {
        out.extend_from_slice(&(field.len() as u64).to_be_bytes());
        out.extend_from_slice(field.as_bytes());
    }
    out
}

/// A database as the release before migration 0003 left it: its first two
/// migrations, and token rows sealed for their key only.
async fn database_before_versions(url: &str, rows: &[(&TokenKey, i64, Vec<u8>)]) {
    let backend = if url.starts_with("sqlite") {
        "sqlite"
    } else {
        "postgres"
    };
    let dir = tempfile::tempdir().unwrap();
    for file in ["0001_state.sql", "0002_leases.sql"] {
        std::fs::copy(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("migrations")
                .join(backend)
                .join(file),
            dir.path().join(file),
        )
        .unwrap();
    }
    let pool = raw(url).await;
    sqlx::migrate::Migrator::new(dir.path())
        .await
        .unwrap()
        .run(&pool)
        .await
        .unwrap();
    for (key, version, sealed) in rows {
        sqlx::query(
            "INSERT INTO toolgate_tokens (tenant, subject, server, version, sealed, updated_at_ms) \
             VALUES ($1, $2, $3, $4, $5, 0)",
        )
        .bind(&key.tenant)
        .bind(&key.subject)
        .bind(&key.server)
        .bind(version)
        .bind(sealed)
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;
}

async fn migrations_applied(url: &str) -> Vec<i64> {
    let pool = raw(url).await;
    let versions = sqlx::query("SELECT version FROM _sqlx_migrations ORDER BY version")
        .fetch_all(&pool)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    pool.close().await;
    versions
}

/// Tokens stored by the earlier release (sealed without their version) are
/// re-sealed for their version by the migration, once: afterwards they read
/// as before, and the earlier ciphertext put back does not open, also
/// after a restart (nothing accepts the old format any more). A row no key
/// opens stays unreadable.
async fn rows_before_versions_are_resealed_once(url: &str) {
    let alice = TokenKey::new("legacy", "alice", "github");
    let bob = TokenKey::new("legacy", "bob", "github");
    let alice_before = ring(&[K1]).seal(b"alice-refresh-1", &aad_before_versions(&alice));
    let bob_before = ring(&[K2]).seal(b"bob-refresh-1", &aad_before_versions(&bob));
    database_before_versions(
        url,
        &[(&alice, 3, alice_before.clone()), (&bob, 1, bob_before)],
    )
    .await;
    assert_eq!(migrations_applied(url).await, [1, 2]);

    let s = store(url, &[K1]).await;
    assert_eq!(migrations_applied(url).await, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(
        s.get_token(&alice).await.unwrap().unwrap(),
        Versioned {
            version: 3,
            value: b"alice-refresh-1".to_vec()
        }
    );
    let (_, resealed) = raw_token(url, &alice).await;
    assert_ne!(resealed, alice_before);
    assert!(matches!(
        s.get_token(&bob).await,
        Err(StateError::Decrypt {
            cause: OpenError::UnknownKey { .. },
            ..
        })
    ));
    // The refresh goes on from the re-sealed row.
    assert_eq!(
        s.replace_token(&alice, 3, b"alice-refresh-2")
            .await
            .unwrap(),
        Replaced::Won(4)
    );

    // The earlier release's ciphertext put back, at any version: refused,
    // by this store and by one opened later (no second re-seal).
    for version in [3, 4] {
        raw_set_token(url, &alice, version, &alice_before).await;
        assert_tampered(s.get_token(&alice).await);
    }
    s.close().await;
    let restarted = store(url, &[K1]).await;
    assert_tampered(restarted.get_token(&alice).await);
    assert_eq!(migrations_applied(url).await, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
    restarted.close().await;
}

/// Gateways starting together on one fresh database: every
/// `StateStore::connect` succeeds and each migration is applied once.
/// Several rounds, each on a new database, since a race needs luck.
async fn concurrent_starts_migrate_once(dir: &std::path::Path, pg: Option<&PgCluster>) {
    const STARTS: usize = 6;
    for round in 0..6 {
        let url = fresh_database(dir, pg, &format!("starts_{round}")).await;
        let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(STARTS));
        let mut tasks = Vec::new();
        for _ in 0..STARTS {
            let url = url.clone();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                StateStore::connect(&url, ring(&[K1])).await
            }));
        }
        let mut stores = Vec::new();
        for task in tasks {
            match task.await.unwrap() {
                Ok(s) => stores.push(s),
                Err(e) => panic!("round {round}: a concurrent start failed: {e:?}"),
            }
        }
        assert_eq!(
            migrations_applied(&url).await,
            [1, 2, 3, 4, 5, 6, 7, 8, 9],
            "round {round}"
        );
        let key = TokenKey::new("starts", "alice", "github");
        stores[0].put_token(&key, b"t").await.unwrap();
        assert_eq!(
            stores[STARTS - 1]
                .get_token(&key)
                .await
                .unwrap()
                .unwrap()
                .value,
            b"t"
        );
        for s in stores {
            s.close().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_migrations() {
    let dir = tempfile::tempdir().unwrap();
    let legacy = fresh_database(dir.path(), None, "legacy").await;
    rows_before_versions_are_resealed_once(&legacy).await;
    concurrent_starts_migrate_once(dir.path(), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_migrations() {
    let pg = PgCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let legacy = fresh_database(dir.path(), Some(&pg), "legacy").await;
    rows_before_versions_are_resealed_once(&legacy).await;
    concurrent_starts_migrate_once(dir.path(), Some(&pg)).await;
}

/// PostgreSQL stopped: operations, fresh connects and lazy stores fail fast
/// with `Unavailable`; a lazy store works once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_is_unavailable_quickly() {
    let mut pg = PgCluster::start();
    let url = pg.url();
    let key = TokenKey::new("down", "alice", "github");
    let s = store(&url, &[K1]).await;
    s.put_token(&key, b"before").await.unwrap();
    pg.stop();

    let started = Instant::now();
    let err = s.get_token(&key).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    let started = Instant::now();
    let err = s.put_token(&key, b"during").await.unwrap_err();
    assert!(matches!(err, StateError::Unavailable(_)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));

    let started = Instant::now();
    let err = StateStore::connect(&url, ring(&[K1])).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(5));

    let lazy = StateStore::open_lazy(&url, ring(&[K1])).unwrap();
    let err = lazy.take_pending("x").await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");

    pg.restart();
    assert_eq!(
        lazy.get_token(&key).await.unwrap().unwrap().value,
        b"before"
    );
    assert_eq!(s.get_token(&key).await.unwrap().unwrap().value, b"before");
}

/// Holders on two replicas race for one lease: exactly one gets it, each
/// round, also when the lease they race for has run out. The holder renews
/// it; others cannot take or release it; released, it is free.
async fn leases_between_replicas(url: &str) {
    let replicas = [store(url, &[K1]).await, store(url, &[K1]).await];
    let long = Duration::from_secs(30);
    for round in 0..5 {
        let name = format!("race-{round}");
        if round % 2 == 1 {
            // The race is for a lease whose holder's time has run out.
            assert!(
                replicas[0]
                    .try_lease(&name, "gone", Duration::ZERO)
                    .await
                    .unwrap()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let mut tasks = Vec::new();
        for n in 0..8 {
            let s = replicas[n % 2].clone();
            let name = name.clone();
            tasks.push(tokio::spawn(async move {
                let holder = format!("holder-{n}");
                let won = s.try_lease(&name, &holder, long).await.unwrap();
                (holder, won)
            }));
        }
        let mut winners = Vec::new();
        for task in tasks {
            let (holder, won) = task.await.unwrap();
            if won {
                winners.push(holder);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        let winner = &winners[0];
        let other = if winner == "holder-0" {
            "holder-1"
        } else {
            "holder-0"
        };
        // The holder renews; nobody else takes or releases it.
        assert!(replicas[1].try_lease(&name, winner, long).await.unwrap());
        assert!(!replicas[0].try_lease(&name, other, long).await.unwrap());
        assert!(!replicas[0].release_lease(&name, other).await.unwrap());
        assert!(!replicas[1].try_lease(&name, other, long).await.unwrap());
        // Released, it is free.
        assert!(replicas[0].release_lease(&name, winner).await.unwrap());
        assert!(!replicas[0].release_lease(&name, winner).await.unwrap());
        assert!(replicas[1].try_lease(&name, other, long).await.unwrap());
        assert!(!replicas[0].try_lease(&name, winner, long).await.unwrap());
    }
    // A lease runs out: another holder takes it, and the former holder can
    // no longer renew or release it.
    assert!(
        replicas[0]
            .try_lease("short", "a", Duration::from_millis(50))
            .await
            .unwrap()
    );
    assert!(!replicas[1].try_lease("short", "b", long).await.unwrap());
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert!(replicas[1].try_lease("short", "b", long).await.unwrap());
    assert!(!replicas[0].try_lease("short", "a", long).await.unwrap());
    assert!(!replicas[0].release_lease("short", "a").await.unwrap());
    // Token lease names are per key and name no subject.
    let alice = TokenKey::new("lease", "alice", "github");
    assert!(!alice.lease_name().contains("alice"));
    assert!(
        replicas[0]
            .try_lease(&alice.lease_name(), "a", long)
            .await
            .unwrap()
    );
    assert!(
        replicas[1]
            .try_lease(
                &TokenKey::new("lease", "bob", "github").lease_name(),
                "b",
                long
            )
            .await
            .unwrap()
    );
    let pool = raw(url).await;
    let names: Vec<String> = sqlx::query("SELECT name FROM toolgate_leases")
        .fetch_all(&pool)
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    pool.close().await;
    assert!(names.contains(&alice.lease_name()), "{names:?}");
    assert!(
        names
            .iter()
            .all(|n| !n.contains("alice") && !n.contains("bob"))
    );
    for s in replicas {
        s.close().await;
    }
}

/// `subjects` lists who holds a token for one (tenant, server), the least
/// recently written first, bounded, never another tenant's or server's.
async fn subjects_by_age_per_tenant_and_server(url: &str) {
    let s = store(url, &[K1]).await;
    for subject in ["carol", "alice", "bob"] {
        s.put_token(&TokenKey::new("subj", subject, "github"), b"t")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    s.put_token(&TokenKey::new("subj", "dave", "gitlab"), b"t")
        .await
        .unwrap();
    s.put_token(&TokenKey::new("subj-other", "erin", "github"), b"t")
        .await
        .unwrap();
    assert_eq!(
        s.subjects("subj", "github", 10).await.unwrap(),
        ["carol", "alice", "bob"]
    );
    // A rewrite (a refresh) moves a subject to the back.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let carol = TokenKey::new("subj", "carol", "github");
    let version = s.get_token(&carol).await.unwrap().unwrap().version;
    s.replace_token(&carol, version, b"t2").await.unwrap();
    assert_eq!(
        s.subjects("subj", "github", 10).await.unwrap(),
        ["alice", "bob", "carol"]
    );
    assert_eq!(
        s.subjects("subj", "github", 2).await.unwrap(),
        ["alice", "bob"]
    );
    assert!(s.subjects("subj", "github", 0).await.unwrap().is_empty());
    // The tenant itself comes first, however recently it was written and
    // however small the limit.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let own = TokenKey::tenant_wide("subj", "github");
    s.put_token(&own, b"t").await.unwrap();
    assert_eq!(s.subjects("subj", "github", 1).await.unwrap(), [""]);
    assert_eq!(
        s.subjects("subj", "github", 10).await.unwrap(),
        ["", "alice", "bob", "carol"]
    );
    s.delete_token(&own).await.unwrap();
    assert_eq!(s.subjects("subj", "gitlab", 10).await.unwrap(), ["dave"]);
    assert_eq!(
        s.subjects("subj-other", "github", 10).await.unwrap(),
        ["erin"]
    );
    assert!(s.subjects("subj", "jira", 10).await.unwrap().is_empty());
    assert!(s.subjects("nobody", "github", 10).await.unwrap().is_empty());
    // A deleted token no longer counts.
    s.delete_token(&TokenKey::new("subj", "alice", "github"))
        .await
        .unwrap();
    assert_eq!(
        s.subjects("subj", "github", 10).await.unwrap(),
        ["bob", "carol"]
    );
    s.close().await;
}

/// `get_pending` reads a flow without consuming it, on any replica; an
/// expired flow is not returned.
async fn pending_read_in_place(url: &str) {
    let replicas = [store(url, &[K1]).await, store(url, &[K1]).await];
    replicas[0]
        .put_pending("peek-1", b"verifier-1", Duration::from_secs(600))
        .await
        .unwrap();
    for s in replicas.iter().chain(&replicas) {
        assert_eq!(
            s.get_pending("peek-1").await.unwrap().unwrap(),
            b"verifier-1"
        );
    }
    assert_eq!(
        replicas[1].take_pending("peek-1").await.unwrap().unwrap(),
        b"verifier-1"
    );
    assert_eq!(replicas[0].get_pending("peek-1").await.unwrap(), None);
    assert_eq!(replicas[0].get_pending("peek-unknown").await.unwrap(), None);
    replicas[0]
        .put_pending("peek-expired", b"v", Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(replicas[1].get_pending("peek-expired").await.unwrap(), None);
    for s in replicas {
        s.close().await;
    }
}

fn credentials(access: &str) -> StoredCredentials {
    let mut response = OAuthTokenResponse::new(
        oauth2::AccessToken::new(access.to_owned()),
        oauth2::basic::BasicTokenType::Bearer,
        VendorExtraTokenFields::default(),
    );
    response.set_expires_in(Some(&Duration::from_secs(3600)));
    StoredCredentials::new(
        "client-1".to_owned(),
        Some(response),
        vec!["mcp:read".to_owned()],
        Some(1_700_000_000),
    )
    .with_issuer(Some("https://issuer.example".to_owned()))
}

fn access_of(credentials: &StoredCredentials) -> String {
    credentials
        .token_response
        .as_ref()
        .unwrap()
        .access_token()
        .secret()
        .clone()
}

/// The OAuth client's store over the state store: credentials, client
/// registrations and pending flows round-trip (sealed), and the refresh
/// lease excludes another replica.
async fn oauth_store_round_trip(url: &str) {
    let s = store(url, &[K1]).await;
    let oauth = StateOAuthStore::with_holder(s.clone(), "replica-a");
    let key = TokenKey::new("adapter", "alice", "github");
    assert!(oauth.load_credentials(&key).await.unwrap().is_none());
    oauth
        .save_grant(&key, credentials("ACCESS-ALICE-1"))
        .await
        .unwrap();
    let loaded = oauth.load_credentials(&key).await.unwrap().unwrap();
    assert_eq!(access_of(&loaded), "ACCESS-ALICE-1");
    assert_eq!(loaded.client_id, "client-1");
    assert_eq!(loaded.granted_scopes, ["mcp:read"]);
    assert_eq!(loaded.issuer.as_deref(), Some("https://issuer.example"));
    oauth
        .save_refreshed(&key, credentials("ACCESS-ALICE-2"))
        .await
        .unwrap();
    let other = StateOAuthStore::new(s.clone());
    assert_eq!(
        access_of(&other.load_credentials(&key).await.unwrap().unwrap()),
        "ACCESS-ALICE-2"
    );
    assert!(
        other
            .load_credentials(&TokenKey::new("adapter", "bob", "github"))
            .await
            .unwrap()
            .is_none()
    );
    let tokens = raw_sealed(
        url,
        "SELECT sealed_with_version FROM toolgate_tokens WHERE tenant = 'adapter'",
    )
    .await;
    assert!(tokens.iter().all(|t| !contains(t, b"ACCESS-ALICE")));
    oauth.clear_credentials(&key).await.unwrap();
    assert!(other.load_credentials(&key).await.unwrap().is_none());

    let client_key = ClientKey::new("adapter", "github", "https://issuer.example");
    oauth
        .save_client(
            &client_key,
            RegisteredClient {
                client_id: "dyn-1".into(),
                client_secret: Some("CLIENT-SECRET-1".into()),
            },
        )
        .await
        .unwrap();
    let client = other.load_client(&client_key).await.unwrap().unwrap();
    assert_eq!(client.client_id, "dyn-1");
    assert_eq!(client.client_secret.as_deref(), Some("CLIENT-SECRET-1"));

    let flow = PendingFlow {
        tenant: "adapter".into(),
        subject: "alice".into(),
        server: "github".into(),
        authorization: StoredAuthorizationState::new(
            &oauth2::PkceCodeVerifier::new("PKCE-VERIFIER-0123456789".into()),
            &oauth2::CsrfToken::new("adapter-state".into()),
        ),
        challenge: Some("Bearer resource_metadata=\"x\"".into()),
        client_id: "dyn-1".into(),
    };
    oauth.save_pending("adapter-state", flow).await.unwrap();
    for _ in 0..2 {
        let found = other.load_pending("adapter-state").await.unwrap().unwrap();
        assert_eq!(found.key(), key);
        assert_eq!(
            found.authorization.pkce_verifier,
            "PKCE-VERIFIER-0123456789"
        );
        assert_eq!(found.client_id, "dyn-1");
    }
    let taken = other.take_pending("adapter-state").await.unwrap().unwrap();
    assert_eq!(taken.key(), key);
    assert!(oauth.take_pending("adapter-state").await.unwrap().is_none());
    assert!(oauth.load_pending("adapter-state").await.unwrap().is_none());

    // The refresh lease, between two replicas.
    let replica = store(url, &[K1]).await;
    let b = StateOAuthStore::with_holder(replica.clone(), "replica-b");
    let ttl = Duration::from_secs(30);
    assert!(oauth.lock_refresh(&key, ttl).await.unwrap());
    assert!(!b.lock_refresh(&key, ttl).await.unwrap());
    assert!(
        !oauth.lock_refresh(&key, ttl).await.unwrap(),
        "not reentrant"
    );
    b.unlock_refresh(&key).await.unwrap();
    assert!(!b.lock_refresh(&key, ttl).await.unwrap(), "b never held it");
    oauth.unlock_refresh(&key).await.unwrap();
    assert!(b.lock_refresh(&key, ttl).await.unwrap());
    b.unlock_refresh(&key).await.unwrap();
    replica.close().await;
    s.close().await;
}

/// Two adapters (replicas refreshing the same token) both load, then both
/// save: the first save wins, the second leaves the first's value in place.
async fn oauth_store_keeps_the_first_save_of_a_race(url: &str) {
    let s = store(url, &[K1]).await;
    let replica = store(url, &[K1]).await;
    let a = StateOAuthStore::with_holder(s.clone(), "a");
    let b = StateOAuthStore::with_holder(s.clone(), "b");
    let c = StateOAuthStore::with_holder(replica.clone(), "c");
    let key = TokenKey::new("adapter-cas", "alice", "github");
    a.save_grant(&key, credentials("stale")).await.unwrap();
    for adapter in [&a, &b, &c] {
        let stale = adapter.load_credentials(&key).await.unwrap().unwrap();
        assert_eq!(access_of(&stale), "stale");
    }
    a.save_refreshed(&key, credentials("from-a")).await.unwrap();
    b.save_refreshed(&key, credentials("from-b")).await.unwrap();
    c.save_refreshed(&key, credentials("from-c")).await.unwrap();
    let stored = s.get_token(&key).await.unwrap().unwrap();
    assert_eq!(stored.version, 2, "only the first save was written");
    for adapter in [&a, &b, &c] {
        let now = adapter.load_credentials(&key).await.unwrap().unwrap();
        assert_eq!(access_of(&now), "from-a");
    }
    // Having read the winner's version, the next save goes through.
    b.save_refreshed(&key, credentials("from-b-2"))
        .await
        .unwrap();
    assert_eq!(
        access_of(&c.load_credentials(&key).await.unwrap().unwrap()),
        "from-b-2"
    );
    // Without a read, a refresh's save is unconditional.
    let fresh = StateOAuthStore::new(replica.clone());
    fresh
        .save_refreshed(&key, credentials("refreshed"))
        .await
        .unwrap();
    assert_eq!(
        access_of(&a.load_credentials(&key).await.unwrap().unwrap()),
        "refreshed"
    );
    // A new grant is written whatever the row became since c read it (a
    // consent after another replica's refresh, or after the row was
    // deleted): never dropped as a lost race.
    c.load_credentials(&key).await.unwrap();
    fresh
        .save_refreshed(&key, credentials("rewritten"))
        .await
        .unwrap();
    c.save_grant(&key, credentials("consented")).await.unwrap();
    assert_eq!(
        access_of(&a.load_credentials(&key).await.unwrap().unwrap()),
        "consented"
    );
    c.load_credentials(&key).await.unwrap();
    s.delete_token(&key).await.unwrap();
    c.save_grant(&key, credentials("consented-after-delete"))
        .await
        .unwrap();
    assert_eq!(
        access_of(&a.load_credentials(&key).await.unwrap().unwrap()),
        "consented-after-delete"
    );
    replica.close().await;
    s.close().await;
}
