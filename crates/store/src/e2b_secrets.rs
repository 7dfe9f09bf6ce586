//! E2B's secrets (`/secrets` of its API), stored sealed: the daemon encrypts a value before the
//! store sees it and decrypts after, as for the native secrets.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use crate::db::{query, DbRow};
use crate::{db_kind, from_json, from_ms, get, to_json, to_ms, Store, StoreError};

/// A tenant's E2B secret as stored: the value only sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bSecretRecord {
    pub tenant_id: String,
    /// `sec_...`: what E2B's API names it by, besides its name.
    pub secret_id: String,
    /// Lower-cased; unique within the tenant.
    pub name: String,
    /// Nonce and ciphertext, as the daemon's sealing produced them.
    pub sealed: Vec<u8>,
    /// 1 when made, one more at each update.
    pub version: i64,
    pub metadata: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

const COLUMNS: &str =
    "tenant_id, secret_id, name, sealed, version, metadata_json, created_at_ms, updated_at_ms";

impl Store {
    /// Stores a new secret; `Conflict` when the tenant has one of that name.
    pub async fn insert_e2b_secret(&self, s: &E2bSecretRecord) -> Result<(), StoreError> {
        query(&format!(
            "INSERT INTO e2b_secrets ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        ))
        .bind(&s.tenant_id)
        .bind(&s.secret_id)
        .bind(&s.name)
        .bind(&s.sealed)
        .bind(s.version)
        .bind(to_json(&s.metadata)?)
        .bind(to_ms(s.created_at))
        .bind(to_ms(s.updated_at))
        .execute(&self.pool)
        .await
        .map_err(|e| match db_kind(&e) {
            Some(sqlx::error::ErrorKind::UniqueViolation) => {
                StoreError::Conflict(format!("a secret named {:?} exists", s.name))
            }
            Some(sqlx::error::ErrorKind::ForeignKeyViolation) => {
                StoreError::UnknownTenant(s.tenant_id.clone())
            }
            _ => e.into(),
        })?;
        Ok(())
    }

    /// The tenant's secret whose id or name is `selector` (ids start with `sec_`, which no
    /// name may).
    pub async fn e2b_secret(
        &self,
        tenant_id: &str,
        selector: &str,
    ) -> Result<Option<E2bSecretRecord>, StoreError> {
        let row = query(&format!(
            "SELECT {COLUMNS} FROM e2b_secrets WHERE tenant_id = $1 AND (secret_id = $2 OR name = $2)"
        ))
        .bind(tenant_id)
        .bind(selector)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(from_row).transpose()
    }

    /// Stores `sealed` as the secret's next version (and `metadata`, when given, in place of
    /// its own); the secret as it is now, `None` when it is gone.
    pub async fn update_e2b_secret(
        &self,
        tenant_id: &str,
        secret_id: &str,
        sealed: &[u8],
        metadata: Option<&BTreeMap<String, String>>,
        updated_at: DateTime<Utc>,
    ) -> Result<Option<E2bSecretRecord>, StoreError> {
        let metadata = metadata.map(to_json).transpose()?;
        let done = query(
            "UPDATE e2b_secrets SET sealed = $3, version = version + 1, \
             metadata_json = COALESCE($4, metadata_json), updated_at_ms = $5 \
             WHERE tenant_id = $1 AND secret_id = $2",
        )
        .bind(tenant_id)
        .bind(secret_id)
        .bind(sealed)
        .bind(metadata)
        .bind(to_ms(updated_at))
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            return Ok(None);
        }
        self.e2b_secret(tenant_id, secret_id).await
    }

    /// The tenant's secrets, oldest first.
    pub async fn list_e2b_secrets(
        &self,
        tenant_id: &str,
    ) -> Result<Vec<E2bSecretRecord>, StoreError> {
        let rows = query(&format!(
            "SELECT {COLUMNS} FROM e2b_secrets WHERE tenant_id = $1 \
             ORDER BY created_at_ms, secret_id"
        ))
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(from_row).collect()
    }

    /// `false` if the tenant had no secret of that id.
    pub async fn delete_e2b_secret(
        &self,
        tenant_id: &str,
        secret_id: &str,
    ) -> Result<bool, StoreError> {
        let done = query("DELETE FROM e2b_secrets WHERE tenant_id = $1 AND secret_id = $2")
            .bind(tenant_id)
            .bind(secret_id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}

fn from_row(row: &DbRow) -> Result<E2bSecretRecord, StoreError> {
    Ok(E2bSecretRecord {
        tenant_id: get(row, "tenant_id")?,
        secret_id: get(row, "secret_id")?,
        name: get(row, "name")?,
        sealed: get(row, "sealed")?,
        version: get(row, "version")?,
        metadata: from_json(&get::<String>(row, "metadata_json")?, "secret metadata")?,
        created_at: from_ms(get(row, "created_at_ms")?, "secret created_at")?,
        updated_at: from_ms(get(row, "updated_at_ms")?, "secret updated_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{on_both_backends, TestDb};
    use crate::tests::store_with;

    fn record(tenant: &str, id: &str, name: &str, at: i64) -> E2bSecretRecord {
        let at = DateTime::from_timestamp_millis(at).unwrap();
        E2bSecretRecord {
            tenant_id: tenant.into(),
            secret_id: id.into(),
            name: name.into(),
            sealed: vec![1, 2, 3],
            version: 1,
            metadata: BTreeMap::from([("team".to_string(), "a".to_string())]),
            created_at: at,
            updated_at: at,
        }
    }

    async fn e2b_secrets_by_id_or_name_per_tenant(db: TestDb) {
        let store = store_with(&db, &["t1", "t2"]).await;
        let a = record("t1", "sec_a", "openai-key", 2_000);
        let b = record("t1", "sec_b", "github", 1_000);
        store.insert_e2b_secret(&a).await.unwrap();
        store.insert_e2b_secret(&b).await.unwrap();
        // Another tenant may use the same name; this one may not, under any id.
        store
            .insert_e2b_secret(&record("t2", "sec_c", "openai-key", 0))
            .await
            .unwrap();
        assert!(matches!(
            store
                .insert_e2b_secret(&record("t1", "sec_d", "openai-key", 0))
                .await,
            Err(StoreError::Conflict(_))
        ));
        assert!(matches!(
            store
                .insert_e2b_secret(&record("nobody", "sec_e", "x", 0))
                .await,
            Err(StoreError::UnknownTenant(_))
        ));
        for selector in ["sec_a", "openai-key"] {
            assert_eq!(
                store.e2b_secret("t1", selector).await.unwrap(),
                Some(a.clone())
            );
        }
        assert_eq!(store.e2b_secret("t2", "sec_a").await.unwrap(), None);
        let listed = store.list_e2b_secrets("t1").await.unwrap();
        assert_eq!(listed, [b.clone(), a.clone()]);

        // An update is the next version; metadata is replaced only when given.
        let later = DateTime::from_timestamp_millis(9_000).unwrap();
        let updated = store
            .update_e2b_secret("t1", "sec_a", &[9], None, later)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                updated.version,
                updated.sealed.as_slice(),
                &updated.metadata,
                updated.updated_at
            ),
            (2, [9].as_slice(), &a.metadata, later)
        );
        assert_eq!(updated.created_at, a.created_at);
        let none = BTreeMap::new();
        let updated = store
            .update_e2b_secret("t1", "sec_a", &[8], Some(&none), later)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((updated.version, updated.metadata.len()), (3, 0));
        assert_eq!(
            store
                .update_e2b_secret("t2", "sec_a", &[8], None, later)
                .await
                .unwrap(),
            None
        );

        assert!(!store.delete_e2b_secret("t2", "sec_a").await.unwrap());
        assert!(store.delete_e2b_secret("t1", "sec_a").await.unwrap());
        assert_eq!(store.e2b_secret("t1", "openai-key").await.unwrap(), None);
        // Its name is free again.
        store
            .insert_e2b_secret(&record("t1", "sec_f", "openai-key", 3_000))
            .await
            .unwrap();
    }

    on_both_backends!(e2b_secrets_by_id_or_name_per_tenant,);
}
