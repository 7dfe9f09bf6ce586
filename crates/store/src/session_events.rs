//! A session's event log: the lifecycle events the manager emitted for it, kept with its
//! record (deleted with it) so what happened to a sandbox can be read after it is gone.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::db::{query, DbRow};
use crate::{db_kind, from_json, from_ms, get, to_json, to_ms, Store, StoreError};

/// One event of a session's log.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionEventRecord {
    pub session_id: String,
    /// `evt_...`: the id webhook deliveries of the same event carry.
    pub event_id: String,
    /// `session.created`, `exec.verdict`, ...
    pub kind: String,
    pub at: DateTime<Utc>,
    pub data: Value,
}

impl Store {
    /// Appends `e` to its session's log and drops what lies beyond the newest `keep`.
    /// `NotFound` when the session has no record (never made, or deleted by retention).
    pub async fn append_session_event(
        &self,
        e: &SessionEventRecord,
        keep: u32,
    ) -> Result<(), StoreError> {
        // Each daemon appends from one task, and a session's events come from the node that
        // runs it, so two appends racing for one `seq` do not happen; the primary key would
        // refuse the second rather than reorder the log.
        query(
            "INSERT INTO session_events (session_id, seq, event_id, kind, at_ms, data_json) \
             SELECT $1, COALESCE(MAX(seq), 0) + 1, $2, $3, $4, $5 \
             FROM session_events WHERE session_id = $1",
        )
        .bind(&e.session_id)
        .bind(&e.event_id)
        .bind(&e.kind)
        .bind(to_ms(e.at))
        .bind(to_json(&e.data)?)
        .execute(&self.pool)
        .await
        .map_err(|err| match db_kind(&err) {
            Some(sqlx::error::ErrorKind::ForeignKeyViolation) => StoreError::NotFound,
            _ => err.into(),
        })?;
        query(
            "DELETE FROM session_events WHERE session_id = $1 AND seq <= \
             (SELECT MAX(seq) FROM session_events WHERE session_id = $1) - $2",
        )
        .bind(&e.session_id)
        .bind(i64::from(keep))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The session's events numbered above `after`, oldest first, at most `limit`, each with
    /// its number in the log (1 for the first ever appended; numbers stay when older events
    /// are dropped). Paged here rather than by the caller: followers ask again every few
    /// seconds for what came after the last event they saw.
    pub async fn session_events(
        &self,
        session_id: &str,
        after: i64,
        limit: i64,
    ) -> Result<Vec<(i64, SessionEventRecord)>, StoreError> {
        let rows = query(
            "SELECT seq, session_id, event_id, kind, at_ms, data_json FROM session_events \
             WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
        )
        .bind(session_id)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(from_row).collect()
    }
}

fn from_row(row: &DbRow) -> Result<(i64, SessionEventRecord), StoreError> {
    let event = SessionEventRecord {
        session_id: get(row, "session_id")?,
        event_id: get(row, "event_id")?,
        kind: get(row, "kind")?,
        at: from_ms(get(row, "at_ms")?, "session event time")?,
        data: from_json(&get::<String>(row, "data_json")?, "session event data")?,
    };
    Ok((get(row, "seq")?, event))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{on_both_backends, TestDb};
    use crate::tests::{session, store_with, t};

    fn event(session_id: &str, n: i64) -> SessionEventRecord {
        SessionEventRecord {
            session_id: session_id.into(),
            event_id: format!("evt_{session_id}_{n}"),
            kind: "exec.verdict".into(),
            at: t(n),
            data: serde_json::json!({"session_id": session_id, "n": n, "note": "π ✓"}),
        }
    }

    async fn a_session_s_log_is_ordered_bounded_and_goes_with_it(db: TestDb) {
        let store = store_with(&db, &["t1"]).await;
        store.insert_session(&session("s1", "t1", 0)).await.unwrap();
        store.insert_session(&session("s2", "t1", 0)).await.unwrap();
        // Out of time order on purpose: the log keeps the order events were appended in.
        for n in [5, 3, 9, 1] {
            store
                .append_session_event(&event("s1", n), 3)
                .await
                .unwrap();
        }
        store
            .append_session_event(&event("s2", 7), 3)
            .await
            .unwrap();
        let log = store.session_events("s1", 0, 10).await.unwrap();
        let ns: Vec<_> = log
            .iter()
            .map(|(_, e)| e.data["n"].as_i64().unwrap())
            .collect();
        assert_eq!(ns, [3, 9, 1], "the newest three, in the order appended");
        let seqs: Vec<_> = log.iter().map(|(seq, _)| *seq).collect();
        assert_eq!(seqs, [2, 3, 4], "numbers stay when older events go");
        assert_eq!(log[0].1, event("s1", 3), "a row round-trips whole");
        let page = store.session_events("s1", 2, 1).await.unwrap();
        assert_eq!(
            page.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(),
            [3],
            "after, limit"
        );
        assert_eq!(store.session_events("s2", 0, 10).await.unwrap().len(), 1);
        assert!(store
            .session_events("nobody", 0, 10)
            .await
            .unwrap()
            .is_empty());

        // No record, no log: an event of a session never stored (or already pruned).
        assert!(matches!(
            store.append_session_event(&event("ghost", 1), 3).await,
            Err(StoreError::NotFound)
        ));
        // Retention deleting the record takes its log along.
        query("DELETE FROM sessions WHERE id = 's1'")
            .execute(&store.pool)
            .await
            .unwrap();
        assert!(store.session_events("s1", 0, 10).await.unwrap().is_empty());
        assert_eq!(store.session_events("s2", 0, 10).await.unwrap().len(), 1);
    }

    on_both_backends!(a_session_s_log_is_ordered_bounded_and_goes_with_it);
}
