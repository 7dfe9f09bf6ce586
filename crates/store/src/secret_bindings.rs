//! The secrets bound to a session, by name, with the placeholder its environment holds, and
//! E2B's header rules it was given: both outlive the sandbox (pause to disk, restore, fork,
//! daemon restart).

use std::collections::BTreeMap;

use crate::db::query;
use crate::{from_json, get, to_json, Store, StoreError};

/// Host pattern -> headers set on requests there (E2B's `network.rules`).
pub type HeaderRules = BTreeMap<String, Vec<(String, String)>>;

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

    /// Replaces a session's header rules (none: removes them).
    pub async fn set_header_rules(
        &self,
        session_id: &str,
        rules: &HeaderRules,
    ) -> Result<(), StoreError> {
        if rules.is_empty() {
            query("DELETE FROM session_header_rules WHERE session_id = $1")
                .bind(session_id)
                .execute(&self.pool)
                .await?;
            return Ok(());
        }
        query(
            "INSERT INTO session_header_rules (session_id, rules_json) VALUES ($1, $2) \
             ON CONFLICT (session_id) DO UPDATE SET rules_json = excluded.rules_json",
        )
        .bind(session_id)
        .bind(to_json(rules)?)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// A session's header rules (none when it has none).
    pub async fn header_rules(&self, session_id: &str) -> Result<HeaderRules, StoreError> {
        let row = query("SELECT rules_json FROM session_header_rules WHERE session_id = $1")
            .bind(session_id)
            .fetch_optional(&self.pool)
            .await?;
        match row {
            Some(r) => from_json(&get::<String>(&r, "rules_json")?, "header rules"),
            None => Ok(HeaderRules::new()),
        }
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
    use super::HeaderRules;
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

    async fn header_rules_round_trip_per_session(db: TestDb) {
        let store = store_with(&db, &["t1"]).await;
        for id in ["a", "b"] {
            store.insert_session(&session(id, "t1", 0)).await.unwrap();
        }
        let rules: HeaderRules = [(
            "api.test".to_string(),
            vec![(
                "Authorization".to_string(),
                "Bearer ${e2b.secrets.k}".to_string(),
            )],
        )]
        .into();
        store.set_header_rules("a", &rules).await.unwrap();
        assert_eq!(store.header_rules("a").await.unwrap(), rules);
        assert!(store.header_rules("b").await.unwrap().is_empty());
        let other: HeaderRules = [("*.x.test".to_string(), Vec::new())].into();
        store.set_header_rules("a", &other).await.unwrap();
        assert_eq!(store.header_rules("a").await.unwrap(), other);
        store
            .set_header_rules("a", &HeaderRules::new())
            .await
            .unwrap();
        assert!(store.header_rules("a").await.unwrap().is_empty());
        assert!(store.set_header_rules("none", &rules).await.is_err());
    }

    on_both_backends!(
        bindings_round_trip_per_session,
        header_rules_round_trip_per_session,
    );
}
