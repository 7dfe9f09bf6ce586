//! Webhook endpoints and the durable queue of their deliveries (at-least-once: a delivery stays
//! `pending` until a receiver answered 2xx or its attempts ran out, across restarts).

use chrono::{DateTime, Utc};

use crate::db::{query, DbRow};
use crate::{db_kind, from_json, from_ms, get, to_json, to_ms, Store, StoreError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookRecord {
    pub id: String,
    pub tenant_id: String,
    pub url: String,
    /// Event types delivered; empty: every type.
    pub events: Vec<String>,
    /// The HMAC key deliveries are signed with.
    pub secret: String,
    pub created_at: DateTime<Utc>,
}

impl WebhookRecord {
    pub fn wants(&self, event_type: &str) -> bool {
        self.events.is_empty() || self.events.iter().any(|e| e == event_type)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    Pending,
    Delivered,
    /// Every attempt failed.
    Failed,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [Self::Pending, Self::Delivered, Self::Failed]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRecord {
    pub id: String,
    pub webhook_id: String,
    pub event_id: String,
    pub event_type: String,
    /// The JSON body sent, exactly as signed.
    pub body: String,
    pub state: DeliveryState,
    pub attempts: u32,
    pub next_attempt_at: DateTime<Utc>,
    /// The receiver's last HTTP status, if it answered.
    pub last_status: Option<u16>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// An event to queue for every endpoint of its tenant that wants its type.
#[derive(Debug, Clone)]
pub struct NewEvent<'a> {
    pub tenant_id: &'a str,
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub body: &'a str,
    pub at: DateTime<Utc>,
}

/// The outcome of one attempt.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub state: DeliveryState,
    pub next_attempt_at: DateTime<Utc>,
    pub status: Option<u16>,
    pub error: Option<String>,
    pub at: DateTime<Utc>,
}

const WEBHOOK_COLUMNS: &str = "id, tenant_id, url, events_json, secret, created_at_ms";
const DELIVERY_COLUMNS: &str = "d.id, d.webhook_id, d.event_id, d.event_type, d.body, d.state, \
     d.attempts, d.next_attempt_ms, d.last_status, d.last_error, d.created_at_ms, d.updated_at_ms";

impl Store {
    /// `UnknownTenant` if no such tenant.
    pub async fn insert_webhook(&self, w: &WebhookRecord) -> Result<(), StoreError> {
        query(&format!(
            "INSERT INTO webhooks ({WEBHOOK_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)"
        ))
        .bind(&w.id)
        .bind(&w.tenant_id)
        .bind(&w.url)
        .bind(to_json(&w.events)?)
        .bind(&w.secret)
        .bind(to_ms(w.created_at))
        .execute(&self.pool)
        .await
        .map_err(|e| match db_kind(&e) {
            Some(sqlx::error::ErrorKind::ForeignKeyViolation) => {
                StoreError::UnknownTenant(w.tenant_id.clone())
            }
            _ => e.into(),
        })?;
        Ok(())
    }

    /// The tenant's endpoints, oldest first.
    pub async fn list_webhooks(&self, tenant_id: &str) -> Result<Vec<WebhookRecord>, StoreError> {
        let rows = query(&format!(
            "SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE tenant_id = $1 ORDER BY created_at_ms, id"
        ))
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(webhook_from_row).collect()
    }

    /// The tenant's endpoint `id`; another tenant's is `None`.
    pub async fn get_webhook(
        &self,
        tenant_id: &str,
        id: &str,
    ) -> Result<Option<WebhookRecord>, StoreError> {
        let row = query(&format!(
            "SELECT {WEBHOOK_COLUMNS} FROM webhooks WHERE tenant_id = $1 AND id = $2"
        ))
        .bind(tenant_id)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(webhook_from_row).transpose()
    }

    /// Deletes the tenant's endpoint with its deliveries; whether there was one.
    pub async fn delete_webhook(&self, tenant_id: &str, id: &str) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        query(
            "DELETE FROM webhook_deliveries WHERE webhook_id IN \
             (SELECT id FROM webhooks WHERE tenant_id = $1 AND id = $2)",
        )
        .bind(tenant_id)
        .bind(id)
        .execute(&mut tx)
        .await?;
        let done = query("DELETE FROM webhooks WHERE tenant_id = $1 AND id = $2")
            .bind(tenant_id)
            .bind(id)
            .execute(&mut tx)
            .await?;
        tx.commit().await?;
        Ok(done.rows_affected() > 0)
    }

    /// Queues `event` (due now) for each of its tenant's endpoints that wants it, in one
    /// transaction; how many deliveries were queued. Queuing an event twice queues it once.
    pub async fn enqueue_event(&self, event: &NewEvent<'_>) -> Result<usize, StoreError> {
        let hooks = self.list_webhooks(event.tenant_id).await?;
        let mut tx = self.pool.begin().await?;
        let mut queued = 0;
        for hook in hooks.iter().filter(|h| h.wants(event.event_type)) {
            let id = format!("dlv_{}_{}", hook.id, event.event_id);
            let done = query(
                "INSERT INTO webhook_deliveries (id, webhook_id, event_id, event_type, body, state, \
                 attempts, next_attempt_ms, created_at_ms, updated_at_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, 0, $7, $7, $7) \
                 ON CONFLICT (webhook_id, event_id) DO NOTHING",
            )
            .bind(&id)
            .bind(&hook.id)
            .bind(event.event_id)
            .bind(event.event_type)
            .bind(event.body)
            .bind(DeliveryState::Pending.as_str())
            .bind(to_ms(event.at))
            .execute(&mut tx)
            .await?;
            queued += done.rows_affected() as usize;
        }
        tx.commit().await?;
        Ok(queued)
    }

    /// Pending deliveries due at `now` with their endpoints, oldest due first.
    pub async fn due_deliveries(
        &self,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<Vec<(DeliveryRecord, WebhookRecord)>, StoreError> {
        let rows = query(&format!(
            "SELECT {DELIVERY_COLUMNS}, w.id AS w_id, w.tenant_id AS w_tenant_id, w.url AS w_url, \
             w.events_json AS w_events_json, w.secret AS w_secret, \
             w.created_at_ms AS w_created_at_ms \
             FROM webhook_deliveries d JOIN webhooks w ON w.id = d.webhook_id \
             WHERE d.state = $1 AND d.next_attempt_ms <= $2 \
             ORDER BY d.next_attempt_ms, d.id LIMIT $3"
        ))
        .bind(DeliveryState::Pending.as_str())
        .bind(to_ms(now))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((delivery_from_row(r)?, webhook_from_prefixed(r, "w_")?)))
            .collect()
    }

    /// When the next pending delivery is due, if any is.
    pub async fn next_delivery_due(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let row =
            query("SELECT MIN(next_attempt_ms) AS ms FROM webhook_deliveries WHERE state = $1")
                .bind(DeliveryState::Pending.as_str())
                .fetch_one(&self.pool)
                .await?;
        let ms: Option<i64> = get(&row, "ms")?;
        ms.map(|ms| from_ms(ms, "next delivery")).transpose()
    }

    /// Records one attempt of delivery `id` (counted).
    pub async fn record_attempt(&self, id: &str, a: &Attempt) -> Result<(), StoreError> {
        query(
            "UPDATE webhook_deliveries SET state = $1, attempts = attempts + 1, \
             next_attempt_ms = $2, last_status = $3, last_error = $4, updated_at_ms = $5 \
             WHERE id = $6",
        )
        .bind(a.state.as_str())
        .bind(to_ms(a.next_attempt_at))
        .bind(a.status.map(i64::from))
        .bind(&a.error)
        .bind(to_ms(a.at))
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The delivery log of the tenant's endpoint, newest first; `None` if the tenant has no
    /// such endpoint.
    pub async fn list_deliveries(
        &self,
        tenant_id: &str,
        webhook_id: &str,
        limit: u32,
    ) -> Result<Option<Vec<DeliveryRecord>>, StoreError> {
        if self.get_webhook(tenant_id, webhook_id).await?.is_none() {
            return Ok(None);
        }
        let rows = query(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries d WHERE d.webhook_id = $1 \
             ORDER BY d.created_at_ms DESC, d.id DESC LIMIT $2"
        ))
        .bind(webhook_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(delivery_from_row)
            .collect::<Result<_, _>>()
            .map(Some)
    }
}

fn webhook_from_row(row: &DbRow) -> Result<WebhookRecord, StoreError> {
    webhook_from_prefixed(row, "")
}

fn webhook_from_prefixed(row: &DbRow, p: &str) -> Result<WebhookRecord, StoreError> {
    let id: String = get(row, &format!("{p}id"))?;
    let what = |col: &str| format!("webhook {id:?} {col}");
    Ok(WebhookRecord {
        tenant_id: get(row, &format!("{p}tenant_id"))?,
        url: get(row, &format!("{p}url"))?,
        events: from_json(
            &get::<String>(row, &format!("{p}events_json"))?,
            &what("events"),
        )?,
        secret: get(row, &format!("{p}secret"))?,
        created_at: from_ms(get(row, &format!("{p}created_at_ms"))?, &what("created_at"))?,
        id,
    })
}

fn delivery_from_row(row: &DbRow) -> Result<DeliveryRecord, StoreError> {
    let id: String = get(row, "id")?;
    let what = |col: &str| format!("delivery {id:?} {col}");
    let state: String = get(row, "state")?;
    let state = DeliveryState::parse(&state)
        .ok_or_else(|| StoreError::Corrupt(format!("{}: {state:?}", what("state"))))?;
    let attempts: i64 = get(row, "attempts")?;
    let last_status = get::<Option<i64>>(row, "last_status")?
        .map(|s| u16::try_from(s).map_err(|_| StoreError::Corrupt(what("last_status"))))
        .transpose()?;
    Ok(DeliveryRecord {
        webhook_id: get(row, "webhook_id")?,
        event_id: get(row, "event_id")?,
        event_type: get(row, "event_type")?,
        body: get(row, "body")?,
        state,
        attempts: u32::try_from(attempts).map_err(|_| StoreError::Corrupt(what("attempts")))?,
        next_attempt_at: from_ms(get(row, "next_attempt_ms")?, &what("next_attempt"))?,
        last_status,
        last_error: get(row, "last_error")?,
        created_at: from_ms(get(row, "created_at_ms")?, &what("created_at"))?,
        updated_at: from_ms(get(row, "updated_at_ms")?, &what("updated_at"))?,
        id,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::testing::{on_both_backends, TestDb};
    use crate::Tenant;

    async fn store_with(db: &TestDb, tenants: &[&str]) -> Store {
        let store = db.open().await;
        for t in tenants {
            store
                .upsert_tenant(&Tenant {
                    id: t.to_string(),
                    name: t.to_string(),
                    plan: "dev".into(),
                    max_sessions: None,
                    daily_session_minutes: None,
                    created_at: Utc::now(),
                })
                .await
                .unwrap();
        }
        store
    }

    pub(crate) fn hook(id: &str, tenant: &str, events: &[&str]) -> WebhookRecord {
        WebhookRecord {
            id: id.into(),
            tenant_id: tenant.into(),
            url: "http://127.0.0.1:9/hook".into(),
            events: events.iter().map(|e| e.to_string()).collect(),
            secret: "s".into(),
            created_at: DateTime::from_timestamp_millis(1_000).unwrap(),
        }
    }

    fn event<'a>(tenant: &'a str, id: &'a str, kind: &'a str) -> NewEvent<'a> {
        NewEvent {
            tenant_id: tenant,
            event_id: id,
            event_type: kind,
            body: "{}",
            at: DateTime::from_timestamp_millis(2_000).unwrap(),
        }
    }

    async fn events_queue_for_the_tenants_matching_endpoints_once(db: TestDb) {
        let store = store_with(&db, &["a", "b"]).await;
        store.insert_webhook(&hook("w1", "a", &[])).await.unwrap();
        store
            .insert_webhook(&hook("w2", "a", &["session.stopped"]))
            .await
            .unwrap();
        store.insert_webhook(&hook("w3", "b", &[])).await.unwrap();
        let created = event("a", "e1", "session.created");
        assert_eq!(store.enqueue_event(&created).await.unwrap(), 1);
        assert_eq!(store.enqueue_event(&created).await.unwrap(), 0, "deduped");
        assert_eq!(
            store
                .enqueue_event(&event("a", "e2", "session.stopped"))
                .await
                .unwrap(),
            2
        );
        let now = DateTime::from_timestamp_millis(2_000).unwrap();
        let due = store.due_deliveries(now, 10).await.unwrap();
        assert_eq!(due.len(), 3);
        assert!(due.iter().all(|(_, w)| w.tenant_id == "a"));
        assert!(store
            .list_deliveries("b", "w1", 10)
            .await
            .unwrap()
            .is_none());
        assert_eq!(
            store
                .list_deliveries("a", "w2", 10)
                .await
                .unwrap()
                .unwrap()
                .len(),
            1
        );
    }

    async fn attempts_move_a_delivery_out_of_the_queue(db: TestDb) {
        let store = store_with(&db, &["a"]).await;
        store.insert_webhook(&hook("w1", "a", &[])).await.unwrap();
        store.enqueue_event(&event("a", "e1", "x")).await.unwrap();
        let at = DateTime::from_timestamp_millis(2_000).unwrap();
        let (d, _) = store.due_deliveries(at, 10).await.unwrap().remove(0);
        let later = DateTime::from_timestamp_millis(5_000).unwrap();
        let retry = Attempt {
            state: DeliveryState::Pending,
            next_attempt_at: later,
            status: Some(500),
            error: Some("HTTP 500".into()),
            at,
        };
        store.record_attempt(&d.id, &retry).await.unwrap();
        assert!(store.due_deliveries(at, 10).await.unwrap().is_empty());
        assert_eq!(store.next_delivery_due().await.unwrap(), Some(later));
        let done = Attempt {
            state: DeliveryState::Delivered,
            status: Some(200),
            error: None,
            ..retry
        };
        store.record_attempt(&d.id, &done).await.unwrap();
        let log = store.list_deliveries("a", "w1", 10).await.unwrap().unwrap();
        assert_eq!(log[0].state, DeliveryState::Delivered);
        assert_eq!(log[0].attempts, 2);
        assert_eq!(log[0].last_status, Some(200));
        assert_eq!(store.next_delivery_due().await.unwrap(), None);
        assert!(store.delete_webhook("a", "w1").await.unwrap());
        assert!(!store.delete_webhook("a", "w1").await.unwrap());
    }

    on_both_backends!(
        events_queue_for_the_tenants_matching_endpoints_once,
        attempts_move_a_delivery_out_of_the_queue,
    );
}
