//! Egress state a session's policy is built from: the session's network (replaced at run
//! time) and the tenant's secrets, stored sealed (the daemon encrypts before the store sees
//! a value and decrypts after).

use chrono::{DateTime, Utc};
use koder_api_types::Network;

use crate::db::{query, DbRow};
use crate::{db_kind, from_json, from_ms, get, to_json, to_ms, Store, StoreError};

/// A tenant's secret as stored: the value only sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRecord {
    pub tenant_id: String,
    pub name: String,
    /// Nonce and ciphertext, as the daemon's sealing produced them.
    pub sealed: Vec<u8>,
    /// Host patterns the secret may be sent to.
    pub hosts: Vec<String>,
    pub created_at: DateTime<Utc>,
}

const SECRET_COLUMNS: &str = "tenant_id, name, sealed, hosts_json, created_at_ms";

impl Store {
    /// Replaces a session's network policy (`PUT .../network`).
    pub async fn set_session_network(&self, id: &str, network: &Network) -> Result<(), StoreError> {
        let done = query("UPDATE sessions SET network_json = $2 WHERE id = $1")
            .bind(id)
            .bind(to_json(network)?)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::NotFound);
        }
        Ok(())
    }

    /// Creates or replaces the tenant's secret of that name.
    pub async fn put_secret(&self, s: &SecretRecord) -> Result<(), StoreError> {
        query(&format!(
            "INSERT INTO secrets ({SECRET_COLUMNS}) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (tenant_id, name) DO UPDATE SET sealed = excluded.sealed, \
             hosts_json = excluded.hosts_json, created_at_ms = excluded.created_at_ms"
        ))
        .bind(&s.tenant_id)
        .bind(&s.name)
        .bind(&s.sealed)
        .bind(to_json(&s.hosts)?)
        .bind(to_ms(s.created_at))
        .execute(&self.pool)
        .await
        .map_err(|e| match db_kind(&e) {
            Some(sqlx::error::ErrorKind::ForeignKeyViolation) => {
                StoreError::UnknownTenant(s.tenant_id.clone())
            }
            _ => e.into(),
        })?;
        Ok(())
    }

    pub async fn get_secret(
        &self,
        tenant_id: &str,
        name: &str,
    ) -> Result<Option<SecretRecord>, StoreError> {
        let row = query(&format!(
            "SELECT {SECRET_COLUMNS} FROM secrets WHERE tenant_id = $1 AND name = $2"
        ))
        .bind(tenant_id)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(secret_from_row).transpose()
    }

    /// The tenant's secrets by name.
    pub async fn list_secrets(&self, tenant_id: &str) -> Result<Vec<SecretRecord>, StoreError> {
        let rows = query(&format!(
            "SELECT {SECRET_COLUMNS} FROM secrets WHERE tenant_id = $1 ORDER BY name"
        ))
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(secret_from_row).collect()
    }

    /// `false` if the tenant had no secret of that name.
    pub async fn delete_secret(&self, tenant_id: &str, name: &str) -> Result<bool, StoreError> {
        let done = query("DELETE FROM secrets WHERE tenant_id = $1 AND name = $2")
            .bind(tenant_id)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}

fn secret_from_row(row: &DbRow) -> Result<SecretRecord, StoreError> {
    Ok(SecretRecord {
        tenant_id: get(row, "tenant_id")?,
        name: get(row, "name")?,
        sealed: get(row, "sealed")?,
        hosts: from_json(&get::<String>(row, "hosts_json")?, "secret hosts")?,
        created_at: from_ms(get(row, "created_at_ms")?, "secret created_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{on_both_backends, TestDb};
    use crate::Tenant;

    async fn secrets_round_trip_per_tenant(db: TestDb) {
        let store = db.open().await;
        for t in ["t1", "t2"] {
            store
                .upsert_tenant(&Tenant {
                    id: t.into(),
                    name: t.into(),
                    plan: "dev".into(),
                    max_sessions: None,
                    daily_session_minutes: None,
                    created_at: DateTime::from_timestamp_millis(0).unwrap(),
                })
                .await
                .unwrap();
        }
        let mut s = SecretRecord {
            tenant_id: "t1".into(),
            name: "gh".into(),
            sealed: vec![1, 2, 3],
            hosts: vec!["api.example.com".into()],
            created_at: DateTime::from_timestamp_millis(1_000).unwrap(),
        };
        store.put_secret(&s).await.unwrap();
        s.sealed = vec![4, 5];
        store.put_secret(&s).await.unwrap();
        assert_eq!(store.get_secret("t1", "gh").await.unwrap(), Some(s.clone()));
        assert_eq!(store.get_secret("t2", "gh").await.unwrap(), None);
        assert_eq!(store.list_secrets("t1").await.unwrap(), vec![s]);
        assert!(store.list_secrets("t2").await.unwrap().is_empty());
        assert!(!store.delete_secret("t2", "gh").await.unwrap());
        assert!(store.delete_secret("t1", "gh").await.unwrap());
        assert_eq!(store.get_secret("t1", "gh").await.unwrap(), None);
        let orphan = SecretRecord {
            tenant_id: "nobody".into(),
            ..store_default()
        };
        assert!(matches!(
            store.put_secret(&orphan).await,
            Err(StoreError::UnknownTenant(_))
        ));
    }

    fn store_default() -> SecretRecord {
        SecretRecord {
            tenant_id: String::new(),
            name: "x".into(),
            sealed: Vec::new(),
            hosts: Vec::new(),
            created_at: DateTime::from_timestamp_millis(0).unwrap(),
        }
    }

    on_both_backends!(secrets_round_trip_per_tenant,);
}
