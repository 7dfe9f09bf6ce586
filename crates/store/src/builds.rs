//! Image builds: their status (as the API shows it) and, once ended, their whole log, so a
//! build's record outlives the daemon that ran it. A build still queued or running when its
//! daemon stopped cannot go on (its sandbox is gone): the next start of that node ends it.

use koder_api_types::{Build, BuildState};

use crate::db::query;
use crate::{from_json, get, to_json, to_ms, Store, StoreError};

/// A stored build: its status, and its log once it ended.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildRecord {
    pub status: Build,
    pub log: Option<String>,
}

fn ended(state: BuildState) -> bool {
    matches!(state, BuildState::Succeeded | BuildState::Failed)
}

impl Store {
    /// Records a build's status (and its log, once it ended), replacing what was recorded.
    pub async fn put_build(
        &self,
        node_id: Option<&str>,
        status: &Build,
        log: Option<&str>,
    ) -> Result<(), StoreError> {
        query(
            "INSERT INTO image_builds (id, node_id, finished, status_json, log, created_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (id) DO UPDATE SET finished = excluded.finished, \
             status_json = excluded.status_json, log = excluded.log",
        )
        .bind(&status.build_id)
        .bind(node_id)
        .bind(ended(status.state))
        .bind(to_json(status)?)
        .bind(log)
        .bind(to_ms(status.created_at))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn get_build(&self, id: &str) -> Result<Option<BuildRecord>, StoreError> {
        let row = query("SELECT status_json, log FROM image_builds WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| {
            Ok(BuildRecord {
                status: from_json(&get::<String>(&r, "status_json")?, "build status")?,
                log: get(&r, "log")?,
            })
        })
        .transpose()
    }

    /// The builds of `node_id` (or of no node) recorded as queued or running.
    pub async fn unfinished_builds(&self, node_id: Option<&str>) -> Result<Vec<Build>, StoreError> {
        let rows = query(
            "SELECT status_json FROM image_builds WHERE NOT finished \
             AND (node_id = $1 OR node_id IS NULL OR $1 IS NULL) ORDER BY created_at_ms",
        )
        .bind(node_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| from_json(&get::<String>(r, "status_json")?, "build status"))
            .collect()
    }

    /// Forgets the ended builds but the newest `keep`; returns how many went.
    pub async fn prune_builds(&self, keep: u64) -> Result<u64, StoreError> {
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        let done = query(
            "DELETE FROM image_builds WHERE finished AND id NOT IN \
             (SELECT id FROM image_builds WHERE finished \
              ORDER BY created_at_ms DESC, id DESC LIMIT $1)",
        )
        .bind(keep)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};
    use koder_api_types::{Build, BuildState, BuildStep};

    use crate::testing::{on_both_backends, TestDb};
    use crate::tests::store_with;

    fn build(id: &str, state: BuildState, at_s: i64) -> Build {
        Build {
            build_id: id.into(),
            name: "img".into(),
            state,
            steps: vec![BuildStep {
                step: "RUN true".into(),
                key: "k1".into(),
                status: "pending".into(),
            }],
            failed_step: None,
            error: None,
            digest: None,
            log_tail: String::new(),
            created_at: Utc.timestamp_opt(at_s, 0).unwrap(),
            finished_at: None,
        }
    }

    async fn builds_are_kept_ended_and_pruned(db: TestDb) {
        let store = store_with(&db, &[]).await;
        let node = Some("node-a");
        let mut b = build("b1", BuildState::Running, 10);
        store.put_build(node, &b, None).await.unwrap();
        store
            .put_build(Some("node-b"), &build("b2", BuildState::Queued, 11), None)
            .await
            .unwrap();
        let open: Vec<String> = store
            .unfinished_builds(node)
            .await
            .unwrap()
            .into_iter()
            .map(|b| b.build_id)
            .collect();
        assert_eq!(open, ["b1"], "another node's builds are its own");

        b.state = BuildState::Succeeded;
        b.steps[0].status = "built".into();
        store
            .put_build(node, &b, Some("line 1\nline 2\n"))
            .await
            .unwrap();
        let got = store.get_build("b1").await.unwrap().unwrap();
        assert_eq!(got.status, b);
        assert_eq!(got.log.as_deref(), Some("line 1\nline 2\n"));
        assert!(store.unfinished_builds(node).await.unwrap().is_empty());
        assert!(store.get_build("none").await.unwrap().is_none());

        for (i, id) in ["b3", "b4"].iter().enumerate() {
            let done = build(id, BuildState::Failed, 20 + i as i64);
            store.put_build(node, &done, Some("")).await.unwrap();
        }
        assert_eq!(store.prune_builds(2).await.unwrap(), 1);
        assert!(
            store.get_build("b1").await.unwrap().is_none(),
            "the oldest ended"
        );
        for id in ["b2", "b3", "b4"] {
            assert!(store.get_build(id).await.unwrap().is_some(), "{id}");
        }
    }
    on_both_backends!(builds_are_kept_ended_and_pruned);
}
