//! One bearer token → one [`Principal`], by the one kind of credential the token's shape
//! says it is. A token that fails is refused: it is never tried as the other kind, and a
//! caller with a bad token is never treated as anonymous.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use koder_api_types::ErrorCode;
use parking_lot::RwLock;

use crate::jwt::{looks_like_jwt, JwtVerifier, TokenError};
use crate::{bearer_token, Identity, KeyRing, Scope, Scopes};

/// How the caller proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    ApiKey,
    Jwt,
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub identity: Identity,
    /// The token's `sub` (none for API keys).
    pub subject: Option<String>,
    pub scopes: Scopes,
    pub credential: Credential,
}

impl Principal {
    /// A static API key's caller: the tenant's full rights, nothing of the operator's.
    pub fn api_key(identity: Identity) -> Self {
        Self {
            identity,
            subject: None,
            scopes: Scopes::TENANT,
            credential: Credential::ApiKey,
        }
    }

    /// Ok when the caller's scopes cover an operation needing `needed`.
    pub fn require(&self, needed: Scope) -> Result<(), ScopeDenied> {
        if self.scopes.allows(needed) {
            Ok(())
        } else {
            Err(ScopeDenied {
                needed,
                held: self.scopes,
            })
        }
    }
}

/// 403: valid credentials whose scopes do not cover the operation.
#[derive(Debug, Clone, thiserror::Error)]
#[error("this operation needs scope {needed} (the token holds {})", held_names(*.held))]
pub struct ScopeDenied {
    pub needed: Scope,
    pub held: Scopes,
}

fn held_names(held: Scopes) -> String {
    match held.names() {
        names if names.is_empty() => "none".into(),
        names => names.join(" "),
    }
}

impl ScopeDenied {
    pub const fn code(&self) -> ErrorCode {
        ErrorCode::AuthScope
    }
}

/// 401, whatever the reason.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("missing Authorization: Bearer <token>")]
    Missing,
    #[error("invalid API key")]
    InvalidKey,
    #[error("static API keys are disabled on this server (env = \"prod\"): use a JWT")]
    KeysDisabled,
    #[error("this server does not accept JWTs ([auth] issuer_url is not set)")]
    JwtNotConfigured,
    #[error(transparent)]
    Token(#[from] TokenError),
}

impl AuthError {
    pub const fn code(&self) -> ErrorCode {
        ErrorCode::Auth
    }
}

/// The server's credentials: tenant API keys (added to at run time by the admin API) and, when
/// configured, the JWT issuer.
pub struct Authenticator {
    keys: RwLock<KeyRing>,
    static_keys: bool,
    jwt: Option<JwtVerifier>,
    source: Option<Lookups>,
}

/// Where keys live beyond this daemon's ring: the store, where another daemon sharing it may
/// have issued a key since this one started.
pub trait KeySource: Send + Sync {
    /// The tenant of the key with this hash, if the source holds it.
    fn tenant_of(
        &self,
        hash: [u8; 32],
    ) -> Pin<Box<dyn Future<Output = Option<String>> + Send + '_>>;
}

/// Look-ups of unknown keys in the source, rate-limited: every random token a client makes
/// up is one, and they must not become a flood of queries to a shared database.
struct Lookups {
    source: Arc<dyn KeySource>,
    rate: DefaultDirectRateLimiter,
}

/// Unknown keys looked up per second (beyond it they are refused unseen, until the rate
/// allows again).
const LOOKUPS_PER_SECOND: u32 = 20;

impl Authenticator {
    pub fn new(keys: KeyRing, jwt: Option<JwtVerifier>) -> Self {
        Self {
            keys: RwLock::new(keys),
            static_keys: true,
            jwt,
            source: None,
        }
    }

    /// Only JWTs (production): every static key is refused, even one in the ring.
    pub fn jwt_only(jwt: JwtVerifier) -> Self {
        Self {
            keys: RwLock::new(KeyRing::default()),
            static_keys: false,
            jwt: Some(jwt),
            source: None,
        }
    }

    /// Keys the ring does not know are looked up in `source` (and kept in the ring when found).
    pub fn with_key_source(mut self, source: Arc<dyn KeySource>) -> Self {
        let per_second = NonZeroU32::new(LOOKUPS_PER_SECOND).unwrap_or(NonZeroU32::MIN);
        self.source = Some(Lookups {
            source,
            rate: RateLimiter::direct(Quota::per_second(per_second)),
        });
        self
    }

    pub fn static_keys_enabled(&self) -> bool {
        self.static_keys
    }

    /// A key issued at run time, usable at once.
    pub fn insert_key(&self, hash: [u8; 32], tenant_id: impl Into<String>) {
        self.keys.write().insert_hash(hash, tenant_id);
    }

    /// The caller behind an `Authorization` header value (`Bearer <token>`).
    pub async fn authenticate_header(&self, header: &str) -> Result<Principal, AuthError> {
        let token = bearer_token(header).ok_or(AuthError::Missing)?;
        self.authenticate(token).await
    }

    /// The caller behind a bare token (E2B's `X-API-KEY` carries one without `Bearer`).
    pub async fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        if looks_like_jwt(token) {
            let jwt = self.jwt.as_ref().ok_or(AuthError::JwtNotConfigured)?;
            return Ok(jwt.verify(token).await?);
        }
        if !self.static_keys {
            return Err(AuthError::KeysDisabled);
        }
        let known = self.keys.read().verify_key(token);
        match known {
            Some(identity) => Ok(Principal::api_key(identity)),
            None => self.look_up(token).await.ok_or(AuthError::InvalidKey),
        }
    }

    /// A key issued elsewhere since this daemon loaded its ring.
    async fn look_up(&self, token: &str) -> Option<Principal> {
        let lookups = self.source.as_ref()?;
        lookups.rate.check().ok()?;
        let hash = crate::hash_key(token);
        let tenant = lookups.source.tenant_of(hash).await?;
        self.insert_key(hash, tenant.clone());
        Some(Principal::api_key(Identity { tenant_id: tenant }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash_key;
    use crate::jwt::JwtConfig;

    fn ring() -> KeyRing {
        let mut ring = KeyRing::default();
        ring.insert_hash(hash_key("secret-one"), "t1");
        ring
    }

    /// A store holding one key, counting look-ups.
    struct Store(std::sync::atomic::AtomicU32);

    impl KeySource for Store {
        fn tenant_of(
            &self,
            hash: [u8; 32],
        ) -> Pin<Box<dyn Future<Output = Option<String>> + Send + '_>> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Box::pin(async move { (hash == hash_key("issued-elsewhere")).then(|| "t9".into()) })
        }
    }

    #[tokio::test]
    async fn keys_issued_elsewhere_are_looked_up_once_and_guesses_are_bounded() {
        let store = Arc::new(Store(Default::default()));
        let auth = Authenticator::new(ring(), None).with_key_source(store.clone());
        let looked = || store.0.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            auth.authenticate("secret-one")
                .await
                .unwrap()
                .identity
                .tenant_id,
            "t1"
        );
        assert_eq!(looked(), 0, "a known key needs no look-up");
        for _ in 0..3 {
            let p = auth.authenticate("issued-elsewhere").await.unwrap();
            assert_eq!(
                (p.identity.tenant_id.as_str(), p.credential),
                ("t9", Credential::ApiKey)
            );
        }
        assert_eq!(looked(), 1, "kept in the ring once found");
        // Made-up keys: refused, and at most the rate's worth are looked up.
        for i in 0..100 {
            assert!(matches!(
                auth.authenticate(&format!("guess-{i}")).await,
                Err(AuthError::InvalidKey)
            ));
        }
        assert!(looked() <= 1 + LOOKUPS_PER_SECOND, "{} look-ups", looked());
        // No source: nothing is looked up.
        let plain = Authenticator::new(ring(), None);
        assert!(plain.authenticate("issued-elsewhere").await.is_err());
    }

    #[tokio::test]
    async fn keys_get_tenant_rights_and_bad_tokens_stay_bad() {
        let auth = Authenticator::new(ring(), None);
        let p = auth.authenticate_header("Bearer secret-one").await.unwrap();
        assert_eq!(p.identity.tenant_id, "t1");
        assert_eq!(p.credential, Credential::ApiKey);
        assert!(p.require(Scope::Exec).is_ok());
        let denied = p.require(Scope::Admin).unwrap_err();
        assert_eq!(denied.code(), ErrorCode::AuthScope);
        assert!(matches!(
            auth.authenticate_header("Bearer nope-nope").await,
            Err(AuthError::InvalidKey)
        ));
        assert!(matches!(
            auth.authenticate_header("Basic x").await,
            Err(AuthError::Missing)
        ));
        // Without an issuer a JWT-shaped token is refused, not looked up as a key.
        assert!(matches!(
            auth.authenticate("eyJhbGciOiJSUzI1NiJ9.e30.c2ln").await,
            Err(AuthError::JwtNotConfigured)
        ));
        auth.insert_key(hash_key("issued-later"), "t2");
        let later = auth.authenticate("issued-later").await.unwrap();
        assert_eq!(later.identity.tenant_id, "t2");
    }

    #[tokio::test]
    async fn production_refuses_static_keys() {
        let jwt = JwtVerifier::new(JwtConfig::new("https://idp.example.com")).unwrap();
        let auth = Authenticator::jwt_only(jwt);
        auth.insert_key(hash_key("secret-one"), "t1");
        assert!(matches!(
            auth.authenticate("secret-one").await,
            Err(AuthError::KeysDisabled)
        ));
        assert!(!auth.static_keys_enabled());
    }
}
