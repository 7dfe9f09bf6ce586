//! E2B's secrets (`/secrets` of its API) for `koder-e2b`: a tenant's named, versioned,
//! write-only values with metadata, sealed at rest under the server's key as the native
//! secrets are (bound to the tenant and the secret's id). No read gives a value back.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use koder_auth::Identity;
use koder_store::E2bSecretRecord;

use super::Manager;
use crate::secrets::{check_value, e2b_aad};
use crate::Error;

/// What E2B's API shows of a secret: everything but its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct E2bSecret {
    pub id: String,
    pub name: String,
    pub version: i64,
    pub metadata: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Where E2B's ids start; no name may.
const ID_PREFIX: &str = "sec_";
const MAX_NAME_BYTES: usize = 128;
/// E2B's bounds of a secret's metadata.
const MAX_METADATA_ENTRIES: usize = 32;
const MAX_METADATA_KEY: usize = 128;
const MAX_METADATA_VALUE: usize = 1024;
const MAX_METADATA_TOTAL: usize = 8192;
/// A tenant's E2B secrets: each is a row and a sealed value the tenant keeps for free.
const MAX_SECRETS: usize = 1000;

impl Manager {
    /// Stores a new secret, its value sealed; its name lower-cased (E2B's canonical form).
    pub async fn create_e2b_secret(
        &self,
        who: &Identity,
        name: &str,
        value: &str,
        metadata: BTreeMap<String, String>,
    ) -> Result<E2bSecret, Error> {
        let name = checked_name(name)?;
        check_value(value)?;
        check_metadata(&metadata)?;
        if self.store.list_e2b_secrets(&who.tenant_id).await?.len() >= MAX_SECRETS {
            return Err(Error::InvalidArgument(format!(
                "a tenant holds at most {MAX_SECRETS} secrets: destroy one first"
            )));
        }
        let secret_id = format!("{ID_PREFIX}{}", uuid::Uuid::new_v4().simple());
        let now = self.now();
        let record = E2bSecretRecord {
            sealed: self.seal_e2b(&who.tenant_id, &secret_id, value)?,
            tenant_id: who.tenant_id.clone(),
            secret_id,
            name,
            version: 1,
            metadata,
            created_at: now,
            updated_at: now,
        };
        self.store.insert_e2b_secret(&record).await?;
        Ok(shown(record))
    }

    /// Stores `value` as the secret's next version, and `metadata`, when given, in place of
    /// its own.
    pub async fn update_e2b_secret(
        &self,
        who: &Identity,
        selector: &str,
        value: &str,
        metadata: Option<BTreeMap<String, String>>,
    ) -> Result<E2bSecret, Error> {
        check_value(value)?;
        if let Some(m) = &metadata {
            check_metadata(m)?;
        }
        let current = self.e2b_record(who, selector).await?;
        let sealed = self.seal_e2b(&who.tenant_id, &current.secret_id, value)?;
        self.store
            .update_e2b_secret(
                &who.tenant_id,
                &current.secret_id,
                &sealed,
                metadata.as_ref(),
                self.now(),
            )
            .await?
            .map(shown)
            .ok_or_else(|| Error::SecretNotFound(selector.into()))
    }

    /// The tenant's secret of that id or name.
    pub async fn e2b_secret(&self, who: &Identity, selector: &str) -> Result<E2bSecret, Error> {
        self.e2b_record(who, selector).await.map(shown)
    }

    /// The tenant's secrets, oldest first.
    pub async fn e2b_secrets(&self, who: &Identity) -> Result<Vec<E2bSecret>, Error> {
        let records = self.store.list_e2b_secrets(&who.tenant_id).await?;
        Ok(records.into_iter().map(shown).collect())
    }

    /// Destroys the secret of that id or name: every version of it.
    pub async fn delete_e2b_secret(&self, who: &Identity, selector: &str) -> Result<(), Error> {
        let current = self.e2b_record(who, selector).await?;
        match self
            .store
            .delete_e2b_secret(&who.tenant_id, &current.secret_id)
            .await?
        {
            true => Ok(()),
            false => Err(Error::SecretNotFound(selector.into())),
        }
    }

    async fn e2b_record(&self, who: &Identity, selector: &str) -> Result<E2bSecretRecord, Error> {
        // A name is looked up as stored: lower-cased.
        let selector_key = match selector.starts_with(ID_PREFIX) {
            true => selector.to_string(),
            false => selector.to_lowercase(),
        };
        self.store
            .e2b_secret(&who.tenant_id, &selector_key)
            .await?
            .ok_or_else(|| Error::SecretNotFound(bounded(selector)))
    }

    fn seal_e2b(&self, tenant_id: &str, secret_id: &str, value: &str) -> Result<Vec<u8>, Error> {
        self.seal_key()?
            .seal(&e2b_aad(tenant_id, secret_id), value.as_bytes())
    }
}

fn shown(r: E2bSecretRecord) -> E2bSecret {
    E2bSecret {
        id: r.secret_id,
        name: r.name,
        version: r.version,
        metadata: r.metadata,
        created_at: r.created_at,
        updated_at: r.updated_at,
    }
}

/// At most 64 characters of what a caller sent, for a message.
fn bounded(s: &str) -> String {
    s.chars().take(64).collect()
}

/// Characters E2B's placeholder `${e2b.secrets.<name>}` cannot hold: braces and control
/// characters (C0, DEL and C1).
fn unusable(c: char) -> bool {
    matches!(c, '{' | '}' | '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}')
}

/// The name as stored (lower-cased), or why it cannot be one: 1-128 bytes, no braces or
/// control characters (it goes into a placeholder), no `/` (it names the secret in a URL
/// path), not starting with `sec_` (E2B's ids do).
fn checked_name(name: &str) -> Result<String, Error> {
    let lower = name.to_lowercase();
    let bad = |why: &str| {
        Err(Error::InvalidArgument(format!(
            "secret name {:?}: {why}",
            bounded(name)
        )))
    };
    if lower.trim().is_empty() || lower.len() > MAX_NAME_BYTES {
        return bad(&format!("1-{MAX_NAME_BYTES} bytes, not all spaces"));
    }
    if lower.chars().any(|c| unusable(c) || c == '/') {
        return bad("no '{', '}', '/' or control characters (it goes into the ${e2b.secrets.<name>} placeholder and into URLs)");
    }
    if lower.starts_with(ID_PREFIX) {
        return bad("the sec_ prefix is reserved for secret ids");
    }
    Ok(lower)
}

fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), Error> {
    let total: usize = metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
    let fits = metadata.len() <= MAX_METADATA_ENTRIES
        && total <= MAX_METADATA_TOTAL
        && metadata.iter().all(|(k, v)| {
            !k.is_empty() && k.len() <= MAX_METADATA_KEY && v.len() <= MAX_METADATA_VALUE
        });
    if !fits {
        return Err(Error::InvalidArgument(format!(
            "secret metadata: at most {MAX_METADATA_ENTRIES} entries, keys of 1-{MAX_METADATA_KEY} bytes, values of at most {MAX_METADATA_VALUE}, {MAX_METADATA_TOTAL} bytes in all"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lower_cased_and_checked() {
        assert_eq!(checked_name("OpenAI-Key").unwrap(), "openai-key");
        assert_eq!(checked_name("clé secrète").unwrap(), "clé secrète");
        let long = "a".repeat(MAX_NAME_BYTES + 1);
        for bad in [
            "",
            "   ",
            "a{b",
            "a}b",
            "a/b",
            "tab\there",
            "nul\0",
            "c1\u{85}",
            "sec_x",
            "SEC_X",
            &long,
        ] {
            assert!(checked_name(bad).is_err(), "{bad:?}");
        }
        // The refusal echoes a bounded name.
        let huge = format!("{{{}", "x".repeat(10_000));
        let Err(Error::InvalidArgument(m)) = checked_name(&huge) else {
            panic!("accepted");
        };
        assert!(m.len() < 400, "{m}");
    }

    #[test]
    fn metadata_is_bounded_as_e2b_bounds_it() {
        let m = |pairs: &[(&str, String)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect()
        };
        assert!(check_metadata(&BTreeMap::new()).is_ok());
        assert!(check_metadata(&m(&[("team", "a".into())])).is_ok());
        assert!(check_metadata(&m(&[("", "a".into())])).is_err());
        assert!(check_metadata(&m(&[("k", "v".repeat(MAX_METADATA_VALUE + 1))])).is_err());
        let many: BTreeMap<String, String> = (0..=MAX_METADATA_ENTRIES)
            .map(|i| (format!("k{i}"), String::new()))
            .collect();
        assert!(check_metadata(&many).is_err());
        let big: BTreeMap<String, String> = (0..9)
            .map(|i| (format!("k{i}"), "v".repeat(1000)))
            .collect();
        assert!(check_metadata(&big).is_err());
    }
}
