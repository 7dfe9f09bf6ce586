//! The secrets bound to a session, by name, with the placeholder its environment holds: the
//! binding outlives the sandbox (pause to disk, restore, fork, daemon restart).

use crate::db::query;
use crate::{get, Store, StoreError};

impl Store {
    /// Records a session's bindings (`(name, placeholder)`), replacing any of the same names.
    pub async fn put_secret_bindings(
        &self,
        session_id: &str,
        bindings: &[(String, String)],
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        for (name, placeholder) in bindings {
            query(
                "INSERT INTO session_secrets (session_id, name, placeholder) VALUES ($1, $2, $3) \
                 ON CONFLICT (session_id, name) DO UPDATE SET placeholder = excluded.placeholder",
            )
            .bind(session_id)
            .bind(name)
            .bind(placeholder)
            .execute(&mut tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// A session's bindings `(name, placeholder)`, by name.
    pub async fn secret_bindings(
        &self,
        session_id: &str,
    ) -> Result<Vec<(String, String)>, StoreError> {
        let rows = query(
            "SELECT name, placeholder FROM session_secrets WHERE session_id = $1 ORDER BY name",
        )
        .bind(session_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((get(r, "name")?, get(r, "placeholder")?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::{on_both_backends, TestDb};
    use crate::tests::{session, store_with};

    async fn bindings_round_trip_per_session(db: TestDb) {
        let store = store_with(&db, &["t1"]).await;
        for id in ["a", "b"] {
            store.insert_session(&session(id, "t1", 0)).await.unwrap();
        }
        let pair = |n: &str, p: &str| (n.to_string(), p.to_string());
        store
            .put_secret_bindings("a", &[pair("TOKEN", "KSECRET_1"), pair("API", "KSECRET_2")])
            .await
            .unwrap();
        store
            .put_secret_bindings("b", &[pair("TOKEN", "KSECRET_3")])
            .await
            .unwrap();
        assert_eq!(
            store.secret_bindings("a").await.unwrap(),
            [pair("API", "KSECRET_2"), pair("TOKEN", "KSECRET_1")]
        );
        store
            .put_secret_bindings("a", &[pair("TOKEN", "KSECRET_4")])
            .await
            .unwrap();
        assert_eq!(
            store.secret_bindings("a").await.unwrap()[1],
            pair("TOKEN", "KSECRET_4")
        );
        assert_eq!(store.secret_bindings("b").await.unwrap().len(), 1);
        assert!(store.secret_bindings("none").await.unwrap().is_empty());
        // A binding of a session that does not exist is refused.
        assert!(store
            .put_secret_bindings("none", &[pair("X", "Y")])
            .await
            .is_err());
    }

    on_both_backends!(bindings_round_trip_per_session,);
}
