//! Tenant admission: plan tier, concurrent sessions and daily session-minutes.
//!
//! Concurrent sessions are counted in memory (live sessions plus creates in flight, under one
//! lock) so that parallel creates cannot overshoot; on a node sharing its store with others,
//! the sessions holding a sandbox on the other nodes are read from the store and added (a
//! create racing one on another node in the same instant may overshoot by one each). Minutes
//! come from the store, which meters the wall time of every session that overlapped the
//! current UTC day.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use koder_store::{Store, Tenant};
use parking_lot::Mutex;

use crate::Error;

/// The plan tier whose tenants have no sandbox access.
pub const NO_ACCESS_PLAN: &str = "none";

/// Where "now" comes from; tests inject their own to cross day boundaries.
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

pub fn system_clock() -> Clock {
    Arc::new(Utc::now)
}

/// Midnight UTC starting the day of `now`.
pub fn day_start(now: DateTime<Utc>) -> DateTime<Utc> {
    now.date_naive()
        .and_hms_opt(0, 0, 0)
        .map_or(now, |midnight| midnight.and_utc())
}

/// Session-minutes `tenant` used today, up to `now`.
pub async fn minutes_used(store: &Store, tenant: &str, now: DateTime<Utc>) -> Result<u64, Error> {
    Ok(store
        .session_seconds_since(tenant, day_start(now), now)
        .await?
        / 60)
}

#[derive(Default)]
pub struct Admission {
    /// Per tenant: live sessions and creates in flight.
    counts: Mutex<HashMap<String, u32>>,
}

impl Admission {
    /// Admits one more session of `tenant` on `node` (`None`: a manager that is no node) or
    /// says which quota forbids it. The returned ticket holds the slot; `Ticket::forget` keeps
    /// it for a session that now lives, dropping it gives the slot back.
    pub async fn admit(
        self: &Arc<Self>,
        store: &Store,
        tenant: &Tenant,
        node: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Ticket, Error> {
        if tenant.plan == NO_ACCESS_PLAN {
            return Err(Error::PlanRequired(format!(
                "the plan of tenant {} does not include sandboxes",
                tenant.id
            )));
        }
        if let Some(budget) = tenant.daily_session_minutes {
            let used = minutes_used(store, &tenant.id, now).await?;
            if used >= budget {
                return Err(Error::QuotaMinutes(format!(
                    "daily session-minutes used up ({used} of {budget}); resets at 00:00 UTC"
                )));
            }
        }
        let elsewhere = match (node, tenant.max_sessions) {
            (Some(node), Some(_)) => {
                store
                    .count_tenant_sandboxes_elsewhere(&tenant.id, node)
                    .await?
            }
            _ => 0,
        };
        let mut counts = self.counts.lock();
        let n = counts.entry(tenant.id.clone()).or_default();
        if let Some(max) = tenant.max_sessions {
            if u64::from(*n) + elsewhere >= u64::from(max) {
                return Err(Error::QuotaSessions(format!(
                    "at most {max} concurrent sessions for tenant {}",
                    tenant.id
                )));
            }
        }
        *n += 1;
        Ok(Ticket {
            admission: self.clone(),
            tenant: tenant.id.clone(),
            armed: true,
        })
    }

    /// A live session of `tenant` ended.
    pub fn release(&self, tenant: &str) {
        let mut counts = self.counts.lock();
        if let Some(n) = counts.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(tenant);
            }
        }
    }
}

pub struct Ticket {
    admission: Arc<Admission>,
    tenant: String,
    armed: bool,
}

impl Ticket {
    /// The session started: its slot is now released by [`Admission::release`] when it ends.
    pub fn forget(mut self) {
        self.armed = false;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.armed {
            self.admission.release(&self.tenant);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn tenant(max_sessions: Option<u32>, minutes: Option<u64>, plan: &str) -> Tenant {
        Tenant {
            id: "t".into(),
            name: "t".into(),
            plan: plan.into(),
            max_sessions,
            daily_session_minutes: minutes,
            created_at: Utc::now(),
        }
    }

    #[test]
    fn day_starts_at_utc_midnight() {
        let t = Utc.with_ymd_and_hms(2026, 3, 4, 23, 59, 59).unwrap();
        assert_eq!(
            day_start(t),
            Utc.with_ymd_and_hms(2026, 3, 4, 0, 0, 0).unwrap()
        );
    }

    #[tokio::test]
    async fn concurrent_sessions_are_capped_and_released() {
        let store = Store::open_in_memory().await.unwrap();
        let adm = Arc::new(Admission::default());
        let t = tenant(Some(2), None, "standard");
        let a = adm.admit(&store, &t, None, Utc::now()).await.unwrap();
        let b = adm.admit(&store, &t, None, Utc::now()).await.unwrap();
        let third = adm.admit(&store, &t, None, Utc::now()).await;
        assert!(matches!(third, Err(Error::QuotaSessions(_))));
        drop(b); // a create that failed gives its slot back
        a.forget(); // a session that started keeps it
        let c = adm.admit(&store, &t, None, Utc::now()).await.unwrap();
        c.forget();
        assert!(adm.admit(&store, &t, None, Utc::now()).await.is_err());
        adm.release("t");
        assert!(adm.admit(&store, &t, None, Utc::now()).await.is_ok());
    }

    #[tokio::test]
    async fn sessions_on_other_nodes_count() {
        let store = Store::open_in_memory().await.unwrap();
        let t = tenant(Some(2), None, "standard");
        store.upsert_tenant(&t).await.unwrap();
        let now = Utc::now();
        store
            .insert_session(&koder_store::SessionRecord {
                id: "s1".into(),
                tenant_id: "t".into(),
                sandbox_id: "sb".into(),
                runtime: "jail".into(),
                language: "bash".into(),
                image: "host".into(),
                image_digest: None,
                state: koder_api_types::SessionState::Running,
                limits: Default::default(),
                network: Default::default(),
                metadata: Default::default(),
                env: Default::default(),
                created_at: now,
                expires_at: now,
                ended_at: None,
                end_reason: None,
                node_id: Some("other".into()),
                lost: false,
            })
            .await
            .unwrap();
        let adm = Arc::new(Admission::default());
        adm.admit(&store, &t, Some("me"), now)
            .await
            .unwrap()
            .forget();
        let full = adm.admit(&store, &t, Some("me"), now).await;
        assert!(matches!(full, Err(Error::QuotaSessions(_))));
        // The node holding it counts it in memory, not from the store as well.
        let other = Arc::new(Admission::default());
        assert!(other.admit(&store, &t, Some("other"), now).await.is_ok());
    }

    #[tokio::test]
    async fn plan_without_sandboxes_is_refused() {
        let store = Store::open_in_memory().await.unwrap();
        let adm = Arc::new(Admission::default());
        let r = adm
            .admit(
                &store,
                &tenant(None, None, NO_ACCESS_PLAN),
                None,
                Utc::now(),
            )
            .await;
        assert!(matches!(r, Err(Error::PlanRequired(_))));
    }
}
