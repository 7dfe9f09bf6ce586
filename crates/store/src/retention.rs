//! Pruning what only grows: stopped sessions' records (their event logs, pauses, bindings and
//! header rules go with them, by `ON DELETE CASCADE`), the network audit and the webhook
//! delivery log, each past its own age.

use chrono::{DateTime, Utc};

use crate::db::query;
use crate::{to_ms, Store, StoreError};

/// The oldest moment each kind of row is kept from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cutoffs {
    /// Stopped sessions (lost ones too, acknowledged or not) that ended before it.
    pub stopped_sessions: DateTime<Utc>,
    /// Connection attempts and lookups made before it.
    pub network_audit: DateTime<Utc>,
    /// Delivered and failed deliveries last attempted before it (pending ones are the queue
    /// and stay until they are delivered or fail).
    pub webhook_deliveries: DateTime<Utc>,
}

/// How many rows of each kind one pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub sessions: u64,
    pub audit: u64,
    pub deliveries: u64,
}

/// Rows per `DELETE`: a backlog of millions goes in many short statements, so the one SQLite
/// writer (and Postgres row locks) are never held for long and the daemon's own writes
/// interleave.
const BATCH: i64 = 1000;

impl Store {
    /// Deletes every row older than its cutoff, in batches.
    pub async fn prune(&self, cutoffs: &Cutoffs) -> Result<Pruned, StoreError> {
        // A mount claim of a stopped session (a crash between its end and its release) would
        // keep its volume busy once the session's row is gone.
        self.release_stopped_volume_mounts().await?;
        Ok(Pruned {
            sessions: self
                .delete_in_batches(
                    "DELETE FROM sessions WHERE id IN (SELECT id FROM sessions \
                     WHERE state = 'stopped' AND ended_at_ms < $1 LIMIT $2)",
                    cutoffs.stopped_sessions,
                )
                .await?,
            audit: self
                .delete_in_batches(
                    "DELETE FROM network_audit WHERE id IN (SELECT id FROM network_audit \
                     WHERE at_ms < $1 LIMIT $2)",
                    cutoffs.network_audit,
                )
                .await?,
            deliveries: self
                .delete_in_batches(
                    "DELETE FROM webhook_deliveries WHERE id IN (SELECT id FROM \
                     webhook_deliveries WHERE state IN ('delivered', 'failed') \
                     AND updated_at_ms < $1 LIMIT $2)",
                    cutoffs.webhook_deliveries,
                )
                .await?,
        })
    }

    /// Runs `sql` (binding the cutoff and the batch size) until a batch deletes fewer rows
    /// than it may.
    async fn delete_in_batches(&self, sql: &str, before: DateTime<Utc>) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let done = query(sql)
                .bind(to_ms(before))
                .bind(BATCH)
                .execute(&self.pool)
                .await?
                .rows_affected();
            total += done;
            if done < BATCH as u64 {
                return Ok(total);
            }
            tokio::task::yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{on_both_backends, TestDb};
    use crate::tests::{session, store_with, t};
    use crate::webhooks::tests::hook;
    use crate::{Attempt, AuditRecord, DeliveryState, NewEvent, SessionEventRecord, SessionState};

    fn all_at(at: DateTime<Utc>) -> Cutoffs {
        Cutoffs {
            stopped_sessions: at,
            network_audit: at,
            webhook_deliveries: at,
        }
    }

    async fn stopped(store: &Store, id: &str, ended: i64) {
        store.insert_session(&session(id, "a", 0)).await.unwrap();
        store
            .set_session_state_at(id, SessionState::Stopped, Some("test"), t(ended))
            .await
            .unwrap();
    }

    async fn old_stopped_sessions_go_with_their_logs(db: TestDb) {
        let store = store_with(&db, &["a"]).await;
        stopped(&store, "old", 10).await;
        stopped(&store, "edge", 20).await;
        store
            .insert_session(&session("live", "a", 0))
            .await
            .unwrap();
        store
            .insert_session(&session("paused", "a", 0))
            .await
            .unwrap();
        store
            .set_session_state_at("paused", SessionState::Paused, None, t(5))
            .await
            .unwrap();
        store
            .append_session_event(
                &SessionEventRecord {
                    session_id: "old".into(),
                    event_id: "evt_1".into(),
                    kind: "session.stopped".into(),
                    at: t(10),
                    data: serde_json::json!({}),
                },
                10,
            )
            .await
            .unwrap();

        let pruned = store.prune(&all_at(t(20))).await.unwrap();
        assert_eq!(pruned.sessions, 1, "ended before the cutoff, not at it");
        assert_eq!(store.get_session("old").await.unwrap(), None);
        assert!(store.session_events("old", 0, 10).await.unwrap().is_empty());
        for kept in ["edge", "live", "paused"] {
            assert!(store.get_session(kept).await.unwrap().is_some(), "{kept}");
        }
        // Nothing left to prune: a second pass deletes nothing.
        assert_eq!(
            store.prune(&all_at(t(20))).await.unwrap(),
            Pruned::default()
        );
    }

    async fn a_backlog_goes_in_batches(db: TestDb) {
        let store = store_with(&db, &["a"]).await;
        let n = BATCH as usize * 2 + 7;
        for i in 0..n {
            store
                .insert_audit(&AuditRecord {
                    id: 0,
                    at: t(i64::try_from(i % 50).unwrap()),
                    tenant_id: "a".into(),
                    session_id: "s".into(),
                    proto: "tcp".into(),
                    dest: "127.0.0.1".into(),
                    port: 80,
                    name: None,
                    allowed: false,
                    reason: "test".into(),
                })
                .await
                .unwrap();
        }
        let mut cutoffs = all_at(t(0));
        cutoffs.network_audit = t(50);
        assert_eq!(store.prune(&cutoffs).await.unwrap().audit, n as u64);
        assert!(store
            .audit("a", None, None, None, 10)
            .await
            .unwrap()
            .is_empty());
    }

    async fn only_finished_deliveries_go(db: TestDb) {
        let store = store_with(&db, &["a"]).await;
        store.insert_webhook(&hook("w1", "a", &[])).await.unwrap();
        for id in ["e1", "e2", "e3", "e4"] {
            let event = NewEvent {
                tenant_id: "a",
                event_id: id,
                event_type: "session.created",
                body: "{}",
                at: t(0),
            };
            store.enqueue_event(&event).await.unwrap();
        }
        let attempt = |state, at| Attempt {
            state,
            next_attempt_at: t(at),
            status: Some(200),
            error: None,
            at: t(at),
        };
        let record = |event: &str, a: Attempt| {
            let store = store.clone();
            let id = format!("dlv_w1_{event}");
            async move { store.record_attempt(&id, &a).await.unwrap() }
        };
        record("e1", attempt(DeliveryState::Delivered, 10)).await;
        record("e2", attempt(DeliveryState::Failed, 10)).await;
        record("e3", attempt(DeliveryState::Delivered, 30)).await;
        // e4 stays pending, retried since long ago: the queue is never pruned.
        record("e4", attempt(DeliveryState::Pending, 10)).await;

        let mut cutoffs = all_at(t(0));
        cutoffs.webhook_deliveries = t(20);
        assert_eq!(store.prune(&cutoffs).await.unwrap().deliveries, 2);
        let mut left: Vec<_> = store
            .list_deliveries("a", "w1", 10)
            .await
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|d| d.event_id)
            .collect();
        left.sort();
        assert_eq!(left, ["e3", "e4"]);
    }

    on_both_backends!(old_stopped_sessions_go_with_their_logs);
    on_both_backends!(a_backlog_goes_in_batches);
    on_both_backends!(only_finished_deliveries_go);
}
