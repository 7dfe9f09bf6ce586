//! Daily session-minutes across a day boundary, with an injected clock. The runtime is
//! `koder_runtime_memory::MemoryRuntime`: these tests are about the manager's metering, not
//! isolation (the daemon tests cover quotas against real sandboxes).

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, TimeZone, Utc};
use koder_api_types::{CreateSession, SessionState};
use koder_auth::Identity;
use koder_runtime_memory::MemoryRuntime;
use koder_sessions::{Error, Manager, SessionConfig};
use koder_store::{Store, Tenant};

struct Fixture {
    manager: Arc<Manager>,
    now: Arc<Mutex<DateTime<Utc>>>,
    who: Identity,
}

async fn fixture(tenant: Tenant) -> Fixture {
    let store = Store::open_in_memory().await.unwrap();
    store.upsert_tenant(&tenant).await.unwrap();
    let now = Arc::new(Mutex::new(
        Utc.with_ymd_and_hms(2026, 5, 1, 23, 50, 0).unwrap(),
    ));
    let clock_now = now.clone();
    let cfg = SessionConfig {
        pool: Default::default(),
        max_timeout_s: 7 * 24 * 3600,
        ..SessionConfig::default()
    };
    let manager = Manager::start_with_clock(
        store,
        Arc::new(MemoryRuntime::new()),
        cfg,
        Arc::new(move || *clock_now.lock().unwrap()),
    )
    .await
    .unwrap();
    Fixture {
        manager,
        now,
        who: Identity {
            tenant_id: tenant.id,
        },
    }
}

fn tenant(minutes: Option<u64>, max_sessions: Option<u32>, plan: &str) -> Tenant {
    Tenant {
        id: "acme".into(),
        name: "Acme".into(),
        plan: plan.into(),
        max_sessions,
        daily_session_minutes: minutes,
        created_at: Utc::now(),
    }
}

fn long() -> CreateSession {
    CreateSession {
        timeout_s: Some(24 * 3600),
        ..Default::default()
    }
}

#[tokio::test]
async fn minutes_budget_stops_sessions_and_resets_at_midnight() {
    let f = fixture(tenant(Some(5), None, "standard")).await;
    let first = f.manager.create(&f.who, long()).await.unwrap();
    *f.now.lock().unwrap() += Duration::minutes(4);
    // 4 of 5 minutes used: still admitted.
    let second = f.manager.create(&f.who, long()).await.unwrap();
    *f.now.lock().unwrap() += Duration::seconds(40);
    // 4m40s + 40s = 5m20s used: budget gone.
    let refused = f.manager.create(&f.who, long()).await;
    assert!(
        matches!(refused, Err(Error::QuotaMinutes(_))),
        "{refused:?}"
    );

    f.manager.enforce_minutes().await;
    for s in [&first, &second] {
        let got = f.manager.get(&f.who, &s.id).await.unwrap();
        assert_eq!(got.state, SessionState::Stopped, "running past the budget");
    }
    // 23:54:40 → a new UTC day.
    *f.now.lock().unwrap() = Utc.with_ymd_and_hms(2026, 5, 2, 0, 0, 30).unwrap();
    f.manager
        .create(&f.who, long())
        .await
        .expect("budget resets at midnight");
}

#[tokio::test]
async fn concurrent_session_cap_and_plan_tier() {
    let f = fixture(tenant(None, Some(2), "standard")).await;
    let a = f.manager.create(&f.who, long()).await.unwrap();
    f.manager.create(&f.who, long()).await.unwrap();
    let third = f.manager.create(&f.who, long()).await;
    assert!(matches!(third, Err(Error::QuotaSessions(_))), "{third:?}");
    f.manager.destroy(&f.who, &a.id).await.unwrap();
    f.manager
        .create(&f.who, long())
        .await
        .expect("a slot freed by delete");

    let none = fixture(tenant(None, None, koder_sessions::NO_ACCESS_PLAN)).await;
    let refused = none.manager.create(&none.who, long()).await;
    assert!(
        matches!(refused, Err(Error::PlanRequired(_))),
        "{refused:?}"
    );
}

#[tokio::test]
async fn plan_maxima_are_tighter_than_the_servers() {
    let f = fixture(tenant(None, None, "small")).await;
    // The fixture's config has no plan "small": server maxima apply.
    let big = CreateSession {
        limits: Some(koder_api_types::Limits {
            memory_mib: Some(4096),
            ..Default::default()
        }),
        ..long()
    };
    f.manager
        .create(&f.who, big.clone())
        .await
        .expect("within server maxima");

    let store = Store::open_in_memory().await.unwrap();
    store
        .upsert_tenant(&tenant(None, None, "small"))
        .await
        .unwrap();
    let mut cfg = SessionConfig {
        pool: Default::default(),
        ..SessionConfig::default()
    };
    cfg.plans.insert(
        "small".into(),
        koder_sessions::config::PlanConfig {
            max_limits: koder_api_types::Limits {
                memory_mib: Some(1024),
                ..Default::default()
            },
        },
    );
    let manager = Manager::start(store, Arc::new(MemoryRuntime::new()), cfg)
        .await
        .unwrap();
    let refused = manager.create(&f.who, big).await;
    assert!(
        matches!(&refused, Err(Error::InvalidArgument(m)) if m.contains("memory_mib")),
        "{refused:?}"
    );
}

#[tokio::test]
async fn expiry_follows_the_injected_clock() {
    let f = fixture(tenant(None, None, "standard")).await;
    let s = f
        .manager
        .create(
            &f.who,
            CreateSession {
                timeout_s: Some(60),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    f.manager.reap_expired().await;
    assert_eq!(
        f.manager.get(&f.who, &s.id).await.unwrap().state,
        SessionState::Running
    );
    *f.now.lock().unwrap() += Duration::seconds(61);
    f.manager.reap_expired().await;
    assert_eq!(
        f.manager.get(&f.who, &s.id).await.unwrap().state,
        SessionState::Stopped
    );
}
