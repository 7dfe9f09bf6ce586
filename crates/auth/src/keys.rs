//! Static API keys are high-entropy secrets, so storing their SHA-256 is enough to make a leaked
//! database useless for authentication; lookups go by hash and the final comparison is
//! constant-time.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::{valid_tenant, Identity, MAX_TENANT_LEN};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeySpecError {
    #[error("expected TENANT:KEY")]
    Shape,
    #[error("tenant id must be 1-{MAX_TENANT_LEN} characters of [A-Za-z0-9_-]")]
    Tenant,
    #[error("API keys must be at least {MIN_KEY_LEN} characters")]
    ShortKey,
}

pub const MIN_KEY_LEN: usize = 8;

pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Parses a `TENANT:KEY` flag value.
pub fn parse_key_spec(spec: &str) -> Result<(String, String), KeySpecError> {
    let (tenant, key) = spec.split_once(':').ok_or(KeySpecError::Shape)?;
    if !valid_tenant(tenant) {
        return Err(KeySpecError::Tenant);
    }
    if key.len() < MIN_KEY_LEN {
        return Err(KeySpecError::ShortKey);
    }
    Ok((tenant.to_string(), key.to_string()))
}

/// The token of an `Authorization: Bearer <token>` header value.
pub fn bearer_token(header: &str) -> Option<&str> {
    let token = header
        .strip_prefix("Bearer ")
        .or_else(|| header.strip_prefix("bearer "))?
        .trim();
    (!token.is_empty()).then_some(token)
}

/// A new random key: `ksk_` and 32 random bytes in hex.
pub fn generate_key() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("ksk_{}", hex::encode(bytes))
}

/// The set of valid keys, by hash.
#[derive(Debug, Default, Clone)]
pub struct KeyRing {
    keys: HashMap<[u8; 32], String>,
}

impl KeyRing {
    pub fn insert_hash(&mut self, hash: [u8; 32], tenant_id: impl Into<String>) {
        self.keys.insert(hash, tenant_id.into());
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The identity behind `Authorization: <header>`, if it carries a known bearer key.
    pub fn authenticate(&self, header: &str) -> Option<Identity> {
        self.verify_key(bearer_token(header)?)
    }

    pub fn verify_key(&self, key: &str) -> Option<Identity> {
        let hash = hash_key(key);
        let (stored, tenant) = self.keys.get_key_value(&hash)?;
        bool::from(stored.ct_eq(&hash)).then(|| Identity {
            tenant_id: tenant.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_authenticate_their_tenant_only() {
        let mut ring = KeyRing::default();
        ring.insert_hash(hash_key("secret-one"), "t1");
        ring.insert_hash(hash_key("secret-two"), "t2");
        assert_eq!(
            ring.authenticate("Bearer secret-one").unwrap().tenant_id,
            "t1"
        );
        assert_eq!(
            ring.authenticate("Bearer secret-two").unwrap().tenant_id,
            "t2"
        );
        for bad in [
            "Bearer secret-on",
            "secret-one",
            "Basic secret-one",
            "Bearer ",
            "",
        ] {
            assert!(ring.authenticate(bad).is_none(), "{bad:?} accepted");
        }
    }

    #[test]
    fn key_specs() {
        assert_eq!(
            parse_key_spec("t1:abcdefgh").unwrap(),
            ("t1".into(), "abcdefgh".into())
        );
        assert_eq!(parse_key_spec("t1:ab:cdefgh").unwrap().1, "ab:cdefgh");
        assert_eq!(parse_key_spec("nokey"), Err(KeySpecError::Shape));
        assert_eq!(parse_key_spec("a/b:abcdefgh"), Err(KeySpecError::Tenant));
        assert_eq!(parse_key_spec(":abcdefgh"), Err(KeySpecError::Tenant));
        assert_eq!(parse_key_spec("t:short"), Err(KeySpecError::ShortKey));
    }

    #[test]
    fn generated_keys_are_unique_and_long() {
        let a = generate_key();
        assert!(a.starts_with("ksk_") && a.len() == 68);
        assert_ne!(a, generate_key());
    }
}
