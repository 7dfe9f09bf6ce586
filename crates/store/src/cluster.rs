//! What the nodes sharing this store need to know of each other's sessions: where sandboxes
//! are (placement), how many a tenant holds elsewhere (quotas across nodes), and moving a
//! session that holds no sandbox to the node that boots it again (a durable pause resumed on
//! another node).
//!
//! A session "holds a sandbox" while it is not stopped and not paused durably (to disk, or its
//! VM saved to a file): those hold nothing on any node.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use crate::db::query;
use crate::{get, to_ms, Store, StoreError};

const HOLDS_SANDBOX: &str = "state <> 'stopped' AND pause_kind IS NULL AND node_id IS NOT NULL";

fn count(n: i64) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("negative count {n}")))
}

impl Store {
    /// Per node, the sessions holding a sandbox there.
    pub async fn sandboxes_by_node(&self) -> Result<HashMap<String, u64>, StoreError> {
        let rows = query(&format!(
            "SELECT node_id, COUNT(*) AS n FROM sessions WHERE {HOLDS_SANDBOX} GROUP BY node_id"
        ))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((get(r, "node_id")?, count(get(r, "n")?)?)))
            .collect()
    }

    /// Per node, the tenant's sessions holding a sandbox there (placement spreads a tenant).
    pub async fn tenant_sandboxes_by_node(
        &self,
        tenant_id: &str,
    ) -> Result<HashMap<String, u64>, StoreError> {
        let rows = query(&format!(
            "SELECT node_id, COUNT(*) AS n FROM sessions WHERE tenant_id = $1 AND {HOLDS_SANDBOX} \
             GROUP BY node_id"
        ))
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((get(r, "node_id")?, count(get(r, "n")?)?)))
            .collect()
    }

    /// The tenant's sessions holding a sandbox on a node other than `node`.
    pub async fn count_tenant_sandboxes_elsewhere(
        &self,
        tenant_id: &str,
        node: &str,
    ) -> Result<u64, StoreError> {
        let row = query(&format!(
            "SELECT COUNT(*) AS n FROM sessions WHERE tenant_id = $1 AND node_id <> $2 \
             AND {HOLDS_SANDBOX}"
        ))
        .bind(tenant_id)
        .bind(node)
        .fetch_one(&self.pool)
        .await?;
        count(get(&row, "n")?)
    }

    /// Records the session on `to` if it is still recorded on `from` (`None`: on no node) and
    /// not stopped; whether it moved. Of two nodes resuming one paused session at once, exactly
    /// one moves it.
    pub async fn move_session_node(
        &self,
        id: &str,
        from: Option<&str>,
        to: &str,
    ) -> Result<bool, StoreError> {
        let done = query(
            "UPDATE sessions SET node_id = $3 WHERE id = $1 AND state <> 'stopped' \
             AND (node_id = $2 OR (node_id IS NULL AND CAST($2 AS TEXT) IS NULL))",
        )
        .bind(id)
        .bind(from)
        .bind(to)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Ends the session with its lost node (`reason` says which): stopped at `at` and shown
    /// as lost until a delete acknowledges it. `false` when it had ended already.
    pub async fn lose_session(
        &self,
        id: &str,
        reason: &str,
        at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let done = query(
            "UPDATE sessions SET state = 'stopped', lost = 1, end_reason = $2, \
             ended_at_ms = COALESCE(ended_at_ms, $3) WHERE id = $1 AND state <> 'stopped'",
        )
        .bind(id)
        .bind(reason)
        .bind(to_ms(at))
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// The tenant deleted the lost session: an ordinary stopped one from now on (no longer
    /// listed).
    pub async fn acknowledge_lost(&self, id: &str) -> Result<(), StoreError> {
        query("UPDATE sessions SET lost = 0 WHERE id = $1")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{on_both_backends, TestDb};
    use crate::tests::{session, store_with};
    use crate::{DurablePause, SessionDurable};
    use koder_api_types::SessionState;

    async fn seed(store: &Store, id: &str, tenant: &str, node: Option<&str>) {
        let mut s = session(id, tenant, 0);
        s.node_id = node.map(Into::into);
        store.insert_session(&s).await.unwrap();
    }

    async fn counts_follow_sandboxes_not_rows(db: TestDb) {
        let store = store_with(&db, &["a", "b"]).await;
        seed(&store, "a1", "a", Some("n1")).await;
        seed(&store, "a2", "a", Some("n2")).await;
        seed(&store, "a3", "a", Some("n2")).await;
        seed(&store, "b1", "b", Some("n2")).await;
        seed(&store, "old", "a", None).await;
        // Stopped, and paused to disk: no sandbox anywhere.
        seed(&store, "gone", "a", Some("n1")).await;
        store
            .set_session_state("gone", SessionState::Stopped, Some("done"))
            .await
            .unwrap();
        seed(&store, "disk", "a", Some("n2")).await;
        let durable = SessionDurable {
            pause: Some(DurablePause::Disk),
            ..Default::default()
        };
        store.set_session_durable("disk", &durable).await.unwrap();

        let by_node = store.sandboxes_by_node().await.unwrap();
        assert_eq!(
            by_node,
            HashMap::from([("n1".to_string(), 1), ("n2".to_string(), 3)])
        );
        assert_eq!(
            store.tenant_sandboxes_by_node("a").await.unwrap(),
            HashMap::from([("n1".to_string(), 1), ("n2".to_string(), 2)])
        );
        assert_eq!(
            store.tenant_sandboxes_by_node("b").await.unwrap(),
            HashMap::from([("n2".to_string(), 1)])
        );
        assert!(store
            .tenant_sandboxes_by_node("c")
            .await
            .unwrap()
            .is_empty());
        assert_eq!(
            store
                .count_tenant_sandboxes_elsewhere("a", "n1")
                .await
                .unwrap(),
            2
        );
        assert_eq!(
            store
                .count_tenant_sandboxes_elsewhere("a", "n2")
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            store
                .count_tenant_sandboxes_elsewhere("b", "n2")
                .await
                .unwrap(),
            0
        );
    }

    async fn a_session_moves_once(db: TestDb) {
        let store = store_with(&db, &["a"]).await;
        seed(&store, "s", "a", Some("n1")).await;
        seed(&store, "old", "a", None).await;
        // Only from where it is: the loser of two resumes sees false.
        assert!(!store
            .move_session_node("s", Some("n9"), "n2")
            .await
            .unwrap());
        assert!(store
            .move_session_node("s", Some("n1"), "n2")
            .await
            .unwrap());
        assert!(!store
            .move_session_node("s", Some("n1"), "n3")
            .await
            .unwrap());
        let node = |id: &'static str| {
            let store = store.clone();
            async move { store.get_session(id).await.unwrap().unwrap().node_id }
        };
        assert_eq!(node("s").await.as_deref(), Some("n2"));
        assert!(store.move_session_node("old", None, "n3").await.unwrap());
        assert_eq!(node("old").await.as_deref(), Some("n3"));
        // A stopped session stays where it ended.
        store
            .set_session_state("s", SessionState::Stopped, Some("done"))
            .await
            .unwrap();
        assert!(!store
            .move_session_node("s", Some("n2"), "n3")
            .await
            .unwrap());
    }

    async fn a_lost_session_is_listed_until_deleted(db: TestDb) {
        let store = store_with(&db, &["a"]).await;
        seed(&store, "s", "a", Some("n1")).await;
        let at = crate::tests::t(5);
        assert!(store
            .lose_session("s", "its node n1 was lost", at)
            .await
            .unwrap());
        assert!(!store.lose_session("s", "again", at).await.unwrap());
        let s = store.get_session("s").await.unwrap().unwrap();
        assert_eq!(
            (s.state, s.lost, s.end_reason.as_deref(), s.ended_at),
            (
                SessionState::Stopped,
                true,
                Some("its node n1 was lost"),
                Some(at)
            )
        );
        let listed = |store: Store| async move {
            store
                .list_sessions("a", false)
                .await
                .unwrap()
                .into_iter()
                .map(|s| s.id)
                .collect::<Vec<_>>()
        };
        assert_eq!(listed(store.clone()).await, ["s"]);
        // It holds no sandbox anywhere.
        assert!(store.sandboxes_by_node().await.unwrap().is_empty());
        store.acknowledge_lost("s").await.unwrap();
        assert!(listed(store.clone()).await.is_empty());
        assert!(!store.get_session("s").await.unwrap().unwrap().lost);
        // An ended session is not lost afterwards.
        seed(&store, "done", "a", Some("n1")).await;
        store
            .set_session_state("done", SessionState::Stopped, Some("deleted"))
            .await
            .unwrap();
        assert!(!store.lose_session("done", "late", at).await.unwrap());
    }

    on_both_backends!(
        counts_follow_sandboxes_not_rows,
        a_session_moves_once,
        a_lost_session_is_listed_until_deleted,
    );
}
