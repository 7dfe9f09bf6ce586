use super::*;
use crate::testing::{on_both_backends, TestDb};

use chrono::TimeZone;
use koder_api_types::NetworkMode;

pub(crate) fn t(secs: i64) -> DateTime<Utc> {
    // A fixed base with a millisecond part, so round-trips are checked at ms precision.
    Utc.timestamp_millis_opt(1_750_000_000_123 + secs * 1000)
        .single()
        .expect("valid time")
}

fn tenant(id: &str) -> Tenant {
    Tenant {
        id: id.into(),
        name: format!("Tenant {id}"),
        plan: "free".into(),
        max_sessions: Some(3),
        daily_session_minutes: Some(60),
        created_at: t(0),
    }
}

pub(crate) fn session(id: &str, tenant_id: &str, created: i64) -> SessionRecord {
    SessionRecord {
        id: id.into(),
        tenant_id: tenant_id.into(),
        sandbox_id: format!("sb-{id}"),
        runtime: "jail".into(),
        language: "python".into(),
        image: "host".into(),
        image_digest: None,
        state: SessionState::Running,
        limits: Limits {
            cpu_millis: Some(500),
            memory_mib: Some(256),
            disk_mib: None,
            pids: Some(64),
        },
        network: Network::default(),
        metadata: BTreeMap::new(),
        env: BTreeMap::new(),
        created_at: t(created),
        expires_at: t(created + 600),
        ended_at: None,
        end_reason: None,
        node_id: None,
        lost: false,
    }
}

pub(crate) async fn store_with(db: &TestDb, tenants: &[&str]) -> Store {
    let store = db.open().await;
    for id in tenants {
        store.upsert_tenant(&tenant(id)).await.expect("tenant");
    }
    store
}

/// The first column of the one row `sql` returns.
async fn scalar<T: db::Value>(store: &Store, sql: &str) -> T {
    let row = query(sql).fetch_one(&store.pool).await.unwrap();
    match &row {
        DbRow::Sqlite(r) => sqlx::Row::try_get(r, 0).unwrap(),
        DbRow::Postgres(r) => sqlx::Row::try_get(r, 0).unwrap(),
    }
}

fn ids(v: &[SessionRecord]) -> Vec<&str> {
    v.iter().map(|s| s.id.as_str()).collect()
}

async fn tenants_upsert_get_list(db: TestDb) {
    let store = store_with(&db, &[]).await;
    assert_eq!(store.get_tenant("a").await.unwrap(), None);
    let a = tenant("a");
    store.upsert_tenant(&a).await.unwrap();
    assert_eq!(store.get_tenant("a").await.unwrap(), Some(a.clone()));

    // Update: quotas/plan change, created_at from the first insert stays.
    let changed = Tenant {
        name: "Renamed".into(),
        plan: "pro".into(),
        max_sessions: None,
        daily_session_minutes: None,
        created_at: t(999),
        ..a.clone()
    };
    store.upsert_tenant(&changed).await.unwrap();
    let got = store.get_tenant("a").await.unwrap().unwrap();
    assert_eq!(
        got,
        Tenant {
            created_at: a.created_at,
            ..changed
        }
    );

    store.upsert_tenant(&tenant("b")).await.unwrap();
    let all = store.list_tenants().await.unwrap();
    assert_eq!(
        all.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );

    let too_big = Tenant {
        daily_session_minutes: Some(u64::MAX),
        ..tenant("c")
    };
    let err = store.upsert_tenant(&too_big).await.unwrap_err();
    assert!(matches!(err, StoreError::Invalid(_)), "{err}");
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
}

async fn api_keys_put_list_delete(db: TestDb) {
    let store = store_with(&db, &["a", "b"]).await;
    let (k1, k2, k3) = ([1u8; 32], [2u8; 32], [0xabu8; 32]);
    store.put_api_key(&k1, "a", "cli").await.unwrap();
    store.put_api_key(&k1, "a", "cli").await.unwrap(); // idempotent
    store.put_api_key(&k2, "a", "cli").await.unwrap();
    store.put_api_key(&k3, "b", "admin").await.unwrap();

    let keys = store.api_keys().await.unwrap();
    assert_eq!(keys.len(), 3);
    let first = keys.iter().find(|k| k.key_hash == k1).unwrap().clone();
    assert_eq!(
        (first.tenant_id.as_str(), first.label.as_str()),
        ("a", "cli")
    );

    // Re-putting keeps created_at and takes the new tenant.
    store.put_api_key(&k1, "b", "cli").await.unwrap();
    let again = store.get_api_key(&k1).await.unwrap().unwrap();
    assert_eq!(again.tenant_id, "b");
    assert_eq!(again.created_at, first.created_at);
    assert_eq!(store.api_keys().await.unwrap().len(), 3);

    // Unknown tenant is refused by the foreign key.
    let err = store
        .put_api_key(&[9; 32], "nobody", "cli")
        .await
        .unwrap_err();
    assert!(
        matches!(err, StoreError::UnknownTenant(ref t) if t == "nobody"),
        "{err}"
    );

    // Only "cli" keys outside `keep` go; the "admin" key stays.
    assert_eq!(store.delete_api_keys_not_in("cli", &[k2]).await.unwrap(), 1);
    let mut left: Vec<_> = store
        .api_keys()
        .await
        .unwrap()
        .into_iter()
        .map(|k| k.key_hash)
        .collect();
    left.sort();
    assert_eq!(left, [k2, k3]);
    assert_eq!(store.delete_api_keys_not_in("cli", &[k2]).await.unwrap(), 0);
    assert_eq!(store.delete_api_keys_not_in("cli", &[]).await.unwrap(), 1);
    assert_eq!(store.get_api_key(&k2).await.unwrap(), None);
    assert!(store.delete_api_key(&k3).await.unwrap());
    assert!(!store.delete_api_key(&k3).await.unwrap());
    assert!(store.api_keys().await.unwrap().is_empty());
}

async fn sessions_insert_get_list_isolated(db: TestDb) {
    let store = store_with(&db, &["a", "b"]).await;
    let s1 = session("s1", "a", 0);
    let s2 = session("s2", "a", 10);
    let s3 = session("s3", "b", 5);
    for s in [&s1, &s2, &s3] {
        store.insert_session(s).await.unwrap();
    }
    assert_eq!(store.get_session("s1").await.unwrap(), Some(s1.clone()));
    assert_eq!(store.get_session("nope").await.unwrap(), None);

    assert_eq!(
        ids(&store.list_sessions("a", true).await.unwrap()),
        ["s2", "s1"]
    );
    assert_eq!(ids(&store.list_sessions("b", true).await.unwrap()), ["s3"]);
    assert!(store.list_sessions("c", true).await.unwrap().is_empty());

    // Duplicate id -> Conflict, even across tenants.
    let err = store
        .insert_session(&session("s1", "b", 0))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    assert_eq!(err.code(), ErrorCode::Conflict);
    assert_eq!(store.get_session("s1").await.unwrap(), Some(s1));

    let err = store
        .insert_session(&session("s9", "ghost", 0))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::UnknownTenant(_)), "{err}");

    // Stopped ones hidden unless asked for.
    store
        .set_session_state("s2", SessionState::Stopped, Some("deleted"))
        .await
        .unwrap();
    assert_eq!(ids(&store.list_sessions("a", false).await.unwrap()), ["s1"]);
    assert_eq!(
        ids(&store.list_sessions("a", true).await.unwrap()),
        ["s2", "s1"]
    );
}

async fn state_changes_and_expiry(db: TestDb) {
    let store = store_with(&db, &["a", "b"]).await;
    store.insert_session(&session("s1", "a", 0)).await.unwrap();
    store.insert_session(&session("s2", "a", 1)).await.unwrap();
    store.insert_session(&session("s3", "b", 2)).await.unwrap();
    assert_eq!(store.count_live_sessions("a").await.unwrap(), 2);
    assert_eq!(store.count_live_sessions("b").await.unwrap(), 1);
    assert_eq!(store.count_live_sessions("z").await.unwrap(), 0);

    store
        .set_session_state("s1", SessionState::Paused, None)
        .await
        .unwrap();
    let s1 = store.get_session("s1").await.unwrap().unwrap();
    assert_eq!((s1.state, s1.ended_at), (SessionState::Paused, None));

    let before = Utc::now();
    store
        .set_session_state("s1", SessionState::Stopped, Some("timeout"))
        .await
        .unwrap();
    let s1 = store.get_session("s1").await.unwrap().unwrap();
    assert_eq!(s1.state, SessionState::Stopped);
    assert_eq!(s1.end_reason.as_deref(), Some("timeout"));
    let ended = s1.ended_at.expect("ended_at set");
    assert!(ended >= before - chrono::Duration::milliseconds(1) && ended <= Utc::now());

    // Stopping again keeps the first ended_at; reason kept when none given.
    store
        .set_session_state_at("s1", SessionState::Stopped, None, t(99_999))
        .await
        .unwrap();
    let again = store.get_session("s1").await.unwrap().unwrap();
    assert_eq!(
        (again.ended_at, again.end_reason),
        (Some(ended), Some("timeout".into()))
    );

    // Stopped is final.
    let err = store
        .set_session_state("s1", SessionState::Running, None)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Conflict(_)), "{err}");
    let err = store
        .set_session_state("nope", SessionState::Stopped, None)
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::NotFound), "{err}");
    assert_eq!(err.code(), ErrorCode::NotFound);

    assert_eq!(store.count_live_sessions("a").await.unwrap(), 1);
    assert_eq!(ids(&store.live_sessions().await.unwrap()), ["s2", "s3"]);

    // Expiry: s2 expires at t(601), s3 at t(602); s1 (stopped, t(600)) never listed.
    assert!(store
        .expired_sessions(t(600), None)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(
        ids(&store.expired_sessions(t(601), None).await.unwrap()),
        ["s2"]
    );
    assert_eq!(store.next_expiry(None).await.unwrap(), Some(t(601)));
    assert_eq!(
        ids(&store.expired_sessions(t(10_000), None).await.unwrap()),
        ["s2", "s3"]
    );
    store.set_session_expiry("s2", t(5_000)).await.unwrap();
    assert_eq!(
        store.get_session("s2").await.unwrap().unwrap().expires_at,
        t(5_000)
    );
    assert_eq!(
        ids(&store.expired_sessions(t(4_999), None).await.unwrap()),
        ["s3"]
    );
    assert_eq!(
        ids(&store.expired_sessions(t(5_000), None).await.unwrap()),
        ["s3", "s2"]
    );
    assert_eq!(store.next_expiry(None).await.unwrap(), Some(t(602)));
    let err = store.set_session_expiry("nope", t(0)).await.unwrap_err();
    assert!(matches!(err, StoreError::NotFound), "{err}");

    // Retention: ended before the cutoff, not at it.
    let at = |cutoff| crate::Cutoffs {
        stopped_sessions: cutoff,
        network_audit: t(0),
        webhook_deliveries: t(0),
    };
    assert_eq!(store.prune(&at(ended)).await.unwrap().sessions, 0);
    assert_eq!(
        store
            .prune(&at(ended + chrono::Duration::milliseconds(1)))
            .await
            .unwrap()
            .sessions,
        1
    );
    assert_eq!(store.get_session("s1").await.unwrap(), None);
}

async fn session_seconds_arithmetic(db: TestDb) {
    let store = store_with(&db, &["a", "b"]).await;
    let since = t(1_000);
    let now = t(2_000);

    // Started 100 s before `since`, ended 50 s after it: 50 s count.
    store
        .insert_session(&session("early", "a", 900))
        .await
        .unwrap();
    store
        .set_session_state_at("early", SessionState::Stopped, None, t(1_050))
        .await
        .unwrap();
    // Still live, started 300 s before now: 300 s.
    store
        .insert_session(&session("live", "a", 1_700))
        .await
        .unwrap();
    // Started and ended inside the window: 120 s.
    store
        .insert_session(&session("ended", "a", 1_100))
        .await
        .unwrap();
    store
        .set_session_state_at("ended", SessionState::Stopped, Some("deleted"), t(1_220))
        .await
        .unwrap();
    // Ended before `since`: nothing.
    store
        .insert_session(&session("old", "a", 100))
        .await
        .unwrap();
    store
        .set_session_state_at("old", SessionState::Stopped, None, t(999))
        .await
        .unwrap();
    // Live and started before `since`: the whole window, 1000 s... but for tenant b only.
    store
        .insert_session(&session("other", "b", 0))
        .await
        .unwrap();
    // Created after `now`: nothing.
    store
        .insert_session(&session("future", "a", 2_500))
        .await
        .unwrap();

    assert_eq!(
        store.session_seconds_since("a", since, now).await.unwrap(),
        50 + 300 + 120
    );
    assert_eq!(
        store.session_seconds_since("b", since, now).await.unwrap(),
        1_000
    );
    assert_eq!(
        store.session_seconds_since("z", since, now).await.unwrap(),
        0
    );
    assert_eq!(
        store.session_seconds_since("a", now, since).await.unwrap(),
        0
    );
    // Sub-second parts are summed before rounding down.
    store
        .insert_session(&session("half1", "b", 3_000))
        .await
        .unwrap();
    store
        .set_session_state_at(
            "half1",
            SessionState::Stopped,
            None,
            t(3_000) + chrono::Duration::milliseconds(500),
        )
        .await
        .unwrap();
    store
        .insert_session(&session("half2", "b", 3_001))
        .await
        .unwrap();
    store
        .set_session_state_at(
            "half2",
            SessionState::Stopped,
            None,
            t(3_001) + chrono::Duration::milliseconds(700),
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .session_seconds_since("b", t(2_999), t(2_999) + chrono::Duration::seconds(2))
            .await
            .unwrap(),
        2 // 1 s of "other" + 0.5 + 0.7 -> 2.2 s
    );
}

async fn json_fields_unicode_round_trip(db: TestDb) {
    let store = store_with(&db, &["ä租户"]).await;
    let mut s = session("ü-1", "ä租户", 0);
    s.metadata = BTreeMap::from([
        ("name".into(), "日本語 ✓ 🚀".into()),
        ("quote\"and\\slash".into(), "line\nbreak\u{0}nul".into()),
    ]);
    s.env = BTreeMap::from([("GREETING".into(), "héllo wörld".into())]);
    s.network = Network {
        mode: NetworkMode::Allowlist,
        allow: vec!["pypi.org".into(), "bücher.example".into()],
        deny: vec!["*.bad.example".into()],
    };
    s.limits = Limits::default();
    s.end_reason = Some("erreur: ünicode".into());
    s.state = SessionState::Stopped;
    s.ended_at = Some(t(5));
    store.insert_session(&s).await.unwrap();
    assert_eq!(store.get_session("ü-1").await.unwrap(), Some(s));
}

async fn times_round_trip_at_millisecond_precision(db: TestDb) {
    let store = store_with(&db, &["a"]).await;
    let mut s = session("s", "a", 0);
    s.created_at = Utc
        .timestamp_millis_opt(-62_000_000_000_001)
        .single()
        .unwrap();
    s.expires_at = Utc
        .timestamp_millis_opt(253_402_300_799_999)
        .single()
        .unwrap();
    s.ended_at = Some(Utc.timestamp_millis_opt(1).single().unwrap());
    store.insert_session(&s).await.unwrap();
    assert_eq!(store.get_session("s").await.unwrap(), Some(s));
}

async fn corrupt_rows_are_errors_not_panics(db: TestDb) {
    let store = store_with(&db, &["a"]).await;
    store
        .insert_session(&session("good", "a", 0))
        .await
        .unwrap();
    for (id, col, value) in [
        ("bad-json", "metadata_json", "{not json"),
        ("bad-type", "metadata_json", r#"{"k": 1}"#),
        ("bad-limits", "limits_json", r#"{"bogus": 1}"#),
        ("bad-env", "env_json", "[]"),
    ] {
        store.insert_session(&session(id, "a", 1)).await.unwrap();
        query(&format!("UPDATE sessions SET {col} = $1 WHERE id = $2"))
            .bind(value)
            .bind(id)
            .execute(&store.pool)
            .await
            .unwrap();
        let err = store.get_session(id).await.unwrap_err();
        assert!(matches!(err, StoreError::Corrupt(_)), "{id}: {err}");
        assert_eq!(err.code(), ErrorCode::Internal);
        assert!(err.to_string().contains(id), "{err}");
        let err = store.list_sessions("a", true).await.unwrap_err();
        assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
        query("DELETE FROM sessions WHERE id = $1")
            .bind(id)
            .execute(&store.pool)
            .await
            .unwrap();
    }
    // Wrong column type: SQLite stores whatever it is given (Postgres refuses the update).
    if db.backend() == Backend::Sqlite {
        query("UPDATE sessions SET created_at_ms = 'yesterday' WHERE id = 'good'")
            .execute(&store.pool)
            .await
            .unwrap();
        let err = store.get_session("good").await.unwrap_err();
        assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
    }

    query("UPDATE tenants SET max_sessions = -1 WHERE id = 'a'")
        .execute(&store.pool)
        .await
        .unwrap();
    let err = store.get_tenant("a").await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");

    query("INSERT INTO api_keys (key_hash, tenant_id, label, created_at_ms) VALUES ('zz', 'a', 'x', 0)")
        .execute(&store.pool)
        .await
        .unwrap();
    let err = store.api_keys().await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
}

#[tokio::test]
async fn file_database_persists_and_migrations_are_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/dir/koder.db");
    let s = {
        let store = Store::open_sqlite(&path).await.unwrap();
        store.upsert_tenant(&tenant("a")).await.unwrap();
        store.put_api_key(&[7; 32], "a", "cli").await.unwrap();
        let mut s = session("s1", "a", 0);
        s.metadata.insert("k".into(), "välue".into());
        store.insert_session(&s).await.unwrap();
        let mode: String = scalar(&store, "PRAGMA journal_mode").await;
        assert_eq!(mode.to_lowercase(), "wal");
        let fk: i64 = scalar(&store, "PRAGMA foreign_keys").await;
        assert_eq!(fk, 1);
        store.close().await;
        s
    };
    assert!(path.exists());

    for _ in 0..2 {
        let store = Store::open_sqlite(&path).await.unwrap();
        assert_eq!(store.get_tenant("a").await.unwrap(), Some(tenant("a")));
        assert_eq!(store.get_session("s1").await.unwrap(), Some(s.clone()));
        let keys = store.api_keys().await.unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].key_hash, [7; 32]);
        let applied: i64 = scalar(&store, "SELECT COUNT(*) AS n FROM _sqlx_migrations").await;
        assert_eq!(applied, MIGRATOR.iter().count() as i64);
        // Clones share the pool.
        let clone = store.clone();
        clone.insert_session(&session("s2", "a", 1)).await.ok();
        assert_eq!(store.count_live_sessions("a").await.unwrap(), 2);
        store.close().await;
    }
}

/// Daemons starting together on one Postgres database migrate it once (sqlx's advisory lock)
/// and all see the same rows.
#[tokio::test]
async fn postgres_daemons_starting_together_share_one_schema() {
    crate::testing::run(Backend::Postgres, |db| async move {
        let (a, b, c) = tokio::join!(db.open(), db.open(), db.open());
        let applied: i64 = scalar(&a, "SELECT COUNT(*) AS n FROM _sqlx_migrations").await;
        assert_eq!(applied, MIGRATOR.iter().count() as i64);
        a.upsert_tenant(&tenant("x")).await.unwrap();
        b.insert_session(&session("s", "x", 0)).await.unwrap();
        assert_eq!(c.count_live_sessions("x").await.unwrap(), 1);
        for s in [a, b, c] {
            s.close().await;
        }
    })
    .await;
}

#[tokio::test]
async fn in_memory_stores_are_separate_and_persist_across_clones() {
    let a = store_with(&TestDb::Sqlite, &["x"]).await;
    let b = Store::open_in_memory().await.unwrap();
    assert!(b.get_tenant("x").await.unwrap().is_none());
    let a2 = a.clone();
    drop(a);
    // The single connection outlives idle periods; data stays.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(a2.get_tenant("x").await.unwrap().is_some());
}

async fn time_paused_to_disk_is_not_session_time(db: TestDb) {
    let store = store_with(&db, &["a"]).await;
    store.insert_session(&session("s1", "a", 0)).await.unwrap();
    store.begin_disk_pause("s1", t(100)).await.unwrap();
    // A second begin while paused changes nothing.
    store.begin_disk_pause("s1", t(150)).await.unwrap();
    store.end_disk_pause("s1", t(400)).await.unwrap();
    store.begin_disk_pause("s1", t(500)).await.unwrap();
    // [0, 1000] minus [100, 400] minus the open pause [500, 1000].
    assert_eq!(
        store
            .session_seconds_since("a", t(0), t(1000))
            .await
            .unwrap(),
        200
    );
    // A window starting inside the first pause subtracts only its part of it.
    assert_eq!(
        store
            .session_seconds_since("a", t(200), t(1000))
            .await
            .unwrap(),
        100
    );
    store.end_disk_pause("s1", t(700)).await.unwrap();
    store
        .set_session_state_at("s1", SessionState::Stopped, Some("test"), t(800))
        .await
        .unwrap();
    // [0, 800] minus [100, 400] and [500, 700].
    assert_eq!(
        store
            .session_seconds_since("a", t(0), t(1000))
            .await
            .unwrap(),
        300
    );
}

async fn sessions_belong_to_their_node(db: TestDb) {
    let store = store_with(&db, &["a"]).await;
    assert_eq!(store.next_expiry(Some("n1")).await.unwrap(), None);
    for (id, node) in [("s1", Some("n1")), ("s2", Some("n2")), ("s3", None)] {
        let mut s = session(id, "a", 0);
        s.node_id = node.map(str::to_string);
        store.insert_session(&s).await.unwrap();
    }
    assert_eq!(
        store
            .get_session("s1")
            .await
            .unwrap()
            .unwrap()
            .node_id
            .as_deref(),
        Some("n1")
    );
    // A node owns its own and the ones from before nodes; no node owns them all.
    assert_eq!(
        ids(&store.live_sessions_of(Some("n1")).await.unwrap()),
        ["s1", "s3"]
    );
    assert_eq!(
        ids(&store.live_sessions_of(None).await.unwrap()),
        ["s1", "s2", "s3"]
    );
    assert_eq!(
        ids(&store.expired_sessions(t(10_000), Some("n2")).await.unwrap()),
        ["s2", "s3"]
    );
    // Taking over a lost node: exactly its sessions, and only unstopped ones.
    assert_eq!(
        ids(&store.live_sessions_on_node("n2").await.unwrap()),
        ["s2"]
    );
    store
        .set_session_state("s2", SessionState::Stopped, Some("gone"))
        .await
        .unwrap();
    assert!(store.live_sessions_on_node("n2").await.unwrap().is_empty());
    assert!(store.live_sessions_on_node("n3").await.unwrap().is_empty());
}

on_both_backends!(
    sessions_belong_to_their_node,
    tenants_upsert_get_list,
    api_keys_put_list_delete,
    sessions_insert_get_list_isolated,
    state_changes_and_expiry,
    session_seconds_arithmetic,
    json_fields_unicode_round_trip,
    times_round_trip_at_millisecond_precision,
    corrupt_rows_are_errors_not_panics,
    time_paused_to_disk_is_not_session_time,
);
