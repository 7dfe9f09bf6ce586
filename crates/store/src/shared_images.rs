//! Images the nodes of a cluster share: each build archived once to the blob store (its
//! manifest, and the archive's size and sha256 to check the download against), and the names
//! pointing at builds. A deleted name stays as a row without a digest, so a node that still
//! holds a copy of the name learns to drop it.

use chrono::{DateTime, Utc};

use crate::db::query;
use crate::{get, to_ms, Store, StoreError};

/// One shared build of an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedImage {
    pub digest: String,
    /// The image's manifest as its store wrote it.
    pub manifest_json: String,
    pub blob_size: u64,
    pub blob_sha256: String,
    /// The node that archived it.
    pub node_id: String,
}

/// What the cluster says of an image name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SharedName {
    /// Never shared: a name of this node alone (a language pack, an operator's local import).
    Unknown,
    /// Deleted: no node may serve it any more.
    Deleted,
    /// The build it points at.
    Points(String),
}

impl Store {
    /// Records a shared build; one already recorded stays as it is (same digest, same build).
    pub async fn put_shared_image(
        &self,
        image: &SharedImage,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        query(
            "INSERT INTO shared_images \
             (digest, manifest_json, blob_size, blob_sha256, node_id, created_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (digest) DO NOTHING",
        )
        .bind(&image.digest)
        .bind(&image.manifest_json)
        .bind(i64::try_from(image.blob_size).unwrap_or(i64::MAX))
        .bind(&image.blob_sha256)
        .bind(&image.node_id)
        .bind(to_ms(now))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn shared_image(&self, digest: &str) -> Result<Option<SharedImage>, StoreError> {
        let row = query(
            "SELECT digest, manifest_json, blob_size, blob_sha256, node_id \
             FROM shared_images WHERE digest = $1",
        )
        .bind(digest)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| {
            Ok(SharedImage {
                digest: get(&r, "digest")?,
                manifest_json: get(&r, "manifest_json")?,
                blob_size: u64::try_from(get::<i64>(&r, "blob_size")?).unwrap_or(0),
                blob_sha256: get(&r, "blob_sha256")?,
                node_id: get(&r, "node_id")?,
            })
        })
        .transpose()
    }

    /// Forgets a shared build (its image deleted), every name pointing at it marked deleted.
    pub async fn delete_shared_image(
        &self,
        digest: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        query("UPDATE shared_image_names SET digest = NULL, updated_at_ms = $2 WHERE digest = $1")
            .bind(digest)
            .bind(to_ms(now))
            .execute(&self.pool)
            .await?;
        query("DELETE FROM shared_images WHERE digest = $1")
            .bind(digest)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The shared builds no name points at, recorded before `before` (a build is recorded
    /// just before its first name).
    pub async fn unnamed_shared_images(
        &self,
        before: DateTime<Utc>,
    ) -> Result<Vec<String>, StoreError> {
        let rows = query(
            "SELECT digest FROM shared_images s WHERE created_at_ms < $1 AND NOT EXISTS \
             (SELECT 1 FROM shared_image_names n WHERE n.digest = s.digest) ORDER BY digest",
        )
        .bind(to_ms(before))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| get(r, "digest")).collect()
    }

    /// Points the shared `name` at `digest` (a recorded shared build), or marks it deleted.
    pub async fn set_shared_name(
        &self,
        name: &str,
        digest: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        query(
            "INSERT INTO shared_image_names (name, digest, updated_at_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET digest = excluded.digest, \
             updated_at_ms = excluded.updated_at_ms",
        )
        .bind(name)
        .bind(digest)
        .bind(to_ms(now))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The shared names starting with `prefix` and their builds (`None`: deleted), by name.
    pub async fn shared_names_with_prefix(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        // Not LIKE: `_` in a prefix would match any character.
        let rows = query(
            "SELECT name, digest FROM shared_image_names \
             WHERE substr(name, 1, length($1)) = $1 ORDER BY name",
        )
        .bind(prefix)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((get(r, "name")?, get(r, "digest")?)))
            .collect()
    }

    /// Every shared name, by name, with its build's digest and manifest (`None`: deleted).
    pub async fn shared_names_and_manifests(
        &self,
    ) -> Result<Vec<(String, Option<(String, String)>)>, StoreError> {
        let rows = query(
            "SELECT n.name, n.digest, s.manifest_json FROM shared_image_names n \
             LEFT JOIN shared_images s ON s.digest = n.digest ORDER BY n.name",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let digest: Option<String> = get(r, "digest")?;
                let manifest: Option<String> = get(r, "manifest_json")?;
                Ok((get(r, "name")?, digest.zip(manifest)))
            })
            .collect()
    }

    pub async fn shared_name(&self, name: &str) -> Result<SharedName, StoreError> {
        let row = query("SELECT digest FROM shared_image_names WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            None => SharedName::Unknown,
            Some(r) => match get::<Option<String>>(&r, "digest")? {
                None => SharedName::Deleted,
                Some(digest) => SharedName::Points(digest),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::{SharedImage, SharedName};
    use crate::testing::{on_both_backends, TestDb};
    use crate::tests::store_with;

    fn image(digest: &str, node: &str) -> SharedImage {
        SharedImage {
            digest: digest.into(),
            manifest_json: format!("{{\"digest\":\"{digest}\"}}"),
            blob_size: 5_000_000_000,
            blob_sha256: "ab".repeat(32),
            node_id: node.into(),
        }
    }

    async fn shared_images_and_names(db: TestDb) {
        let store = store_with(&db, &[]).await;
        let now = Utc::now();
        assert_eq!(store.shared_image("d1").await.unwrap(), None);
        store
            .put_shared_image(&image("d1", "n1"), now)
            .await
            .unwrap();
        // The same build archived by a second node keeps the first record.
        store
            .put_shared_image(&image("d1", "n2"), now)
            .await
            .unwrap();
        assert_eq!(
            store.shared_image("d1").await.unwrap(),
            Some(image("d1", "n1"))
        );

        assert_eq!(store.shared_name("app").await.unwrap(), SharedName::Unknown);
        store.set_shared_name("app", Some("d1"), now).await.unwrap();
        assert_eq!(
            store.shared_name("app").await.unwrap(),
            SharedName::Points("d1".into())
        );
        store.set_shared_name("app", Some("d2"), now).await.unwrap();
        assert_eq!(
            store.shared_name("app").await.unwrap(),
            SharedName::Points("d2".into())
        );
        store.set_shared_name("app", None, now).await.unwrap();
        assert_eq!(store.shared_name("app").await.unwrap(), SharedName::Deleted);
        assert_eq!(
            store.shared_names_and_manifests().await.unwrap(),
            [("app".to_string(), None)]
        );
        store
            .set_shared_name("a_p:v1", Some("d1"), now)
            .await
            .unwrap();
        store
            .set_shared_name("abp:v1", Some("d1"), now)
            .await
            .unwrap();
        assert_eq!(
            store.shared_names_with_prefix("a_p:").await.unwrap(),
            [("a_p:v1".to_string(), Some("d1".to_string()))],
            "`_` is no wildcard"
        );
        assert_eq!(
            store.shared_names_with_prefix("app").await.unwrap(),
            [("app".to_string(), None)]
        );
        let manifest = Some(("d1".to_string(), image("d1", "n1").manifest_json));
        assert_eq!(
            store.shared_names_and_manifests().await.unwrap(),
            [
                ("a_p:v1".to_string(), manifest.clone()),
                ("abp:v1".to_string(), manifest),
                ("app".to_string(), None)
            ]
        );

        // A deleted build takes every name pointing at it along.
        for name in ["x", "x:v2"] {
            store.set_shared_name(name, Some("d1"), now).await.unwrap();
        }
        store.set_shared_name("y", Some("d2"), now).await.unwrap();
        store
            .put_shared_image(&image("d2", "n1"), now)
            .await
            .unwrap();
        store
            .put_shared_image(&image("d3", "n1"), now)
            .await
            .unwrap();
        let later = now + chrono::Duration::seconds(1);
        assert_eq!(
            store.unnamed_shared_images(later).await.unwrap(),
            ["d3"],
            "d1 and d2 are named"
        );
        assert!(store.unnamed_shared_images(now).await.unwrap().is_empty());
        store.delete_shared_image("d1", now).await.unwrap();
        assert_eq!(store.shared_image("d1").await.unwrap(), None);
        for name in ["x", "x:v2"] {
            assert_eq!(store.shared_name(name).await.unwrap(), SharedName::Deleted);
        }
        assert_eq!(
            store.shared_name("y").await.unwrap(),
            SharedName::Points("d2".into())
        );
    }
    on_both_backends!(shared_images_and_names);
}
