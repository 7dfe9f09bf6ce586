//! JWTs from an OpenID issuer: verified against the issuer's JWKS (RS256/384/512, PS256/384/512,
//! ES256/384, EdDSA; never HMAC, never `none`), `exp`/`nbf`/`iss`/`aud` enforced with a small
//! leeway, and the claims projected onto a [`Principal`]: the tenant from the configured claim,
//! `sub`, and the scopes claim.
//!
//! Keys are cached. A token naming a `kid` the cache lacks (the issuer rotated) triggers a
//! refetch, at most one per `min_refresh` however many such tokens arrive, so a flood of
//! made-up kids costs the issuer one request per interval. A cache older than `max_age` is
//! refreshed on the next request; while the issuer is unreachable the old keys keep working.

mod jwks;

use std::time::{Duration, Instant};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{AlgorithmFamily, Validation};
use parking_lot::RwLock;
use serde_json::{Map, Value};

use crate::authn::{Credential, Principal};
use crate::{valid_tenant, Identity, Scopes};
use jwks::{Fetcher, KeySet, VerifyKey};

/// `[auth]`'s JWT settings.
#[derive(Debug, Clone)]
pub struct JwtConfig {
    /// The `iss` every token must carry, exactly; also where discovery starts.
    pub issuer: String,
    /// Where the keys are; `None`: the `jwks_uri` of the issuer's
    /// `/.well-known/openid-configuration`.
    pub jwks_url: Option<String>,
    /// An `aud` every token must include.
    pub audience: String,
    /// The claim naming the tenant.
    pub tenant_claim: String,
    /// The claim listing scopes: a space-separated string (OAuth's `scope`) or an array.
    pub scopes_claim: String,
    /// Clock skew tolerated on `exp` and `nbf`.
    pub leeway: Duration,
    /// Least time between two fetches of the key set.
    pub min_refresh: Duration,
    /// Keys older than this are refetched.
    pub max_age: Duration,
    /// Bound on one fetch.
    pub fetch_timeout: Duration,
}

impl JwtConfig {
    /// Defaults for everything but the issuer.
    pub fn new(issuer: impl Into<String>) -> Self {
        Self {
            issuer: issuer.into(),
            jwks_url: None,
            audience: "sandbox".into(),
            tenant_claim: "tenant".into(),
            scopes_claim: "scope".into(),
            leeway: Duration::from_secs(30),
            min_refresh: Duration::from_secs(30),
            max_age: Duration::from_secs(600),
            fetch_timeout: Duration::from_secs(10),
        }
    }
}

/// A configuration the verifier cannot work with.
#[derive(Debug, thiserror::Error)]
#[error("[auth] JWT settings: {0}")]
pub struct JwtSetupError(String);

/// Why a token was refused. Every variant is a 401: the token is never retried as anything
/// else.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("malformed token: {0}")]
    Malformed(String),
    #[error("token algorithm refused: {0}")]
    Algorithm(String),
    #[error("token signed by an unknown key (kid {0:?})")]
    UnknownKey(Option<String>),
    #[error("the issuer's keys are unavailable: {0}")]
    Keys(String),
    #[error("token rejected: {0}")]
    Rejected(&'static str),
    #[error("token has no valid tenant in claim {0:?} (1-64 characters of [A-Za-z0-9_-])")]
    Tenant(String),
}

/// Verifies tokens of one issuer.
pub struct JwtVerifier {
    cfg: JwtConfig,
    fetcher: Fetcher,
    keys: RwLock<KeySet>,
    /// Held while fetching, so concurrent misses wait for one fetch instead of each making one.
    refresh: tokio::sync::Mutex<RefreshState>,
}

#[derive(Default)]
struct RefreshState {
    last_attempt: Option<Instant>,
    /// Why that attempt failed, if it did: told again to callers within the interval.
    last_error: Option<String>,
    discovered_jwks_url: Option<String>,
}

impl JwtVerifier {
    pub fn new(cfg: JwtConfig) -> Result<Self, JwtSetupError> {
        jwks::check_url(&cfg.issuer).map_err(|e| JwtSetupError(format!("issuer_url {e}")))?;
        if let Some(url) = &cfg.jwks_url {
            jwks::check_url(url).map_err(|e| JwtSetupError(format!("jwks_url {e}")))?;
        }
        for (name, value) in [
            ("audience", &cfg.audience),
            ("tenant_claim", &cfg.tenant_claim),
            ("scopes_claim", &cfg.scopes_claim),
        ] {
            if value.is_empty() {
                return Err(JwtSetupError(format!("{name} must not be empty")));
            }
        }
        Ok(Self {
            fetcher: Fetcher::new(cfg.fetch_timeout).map_err(JwtSetupError)?,
            cfg,
            keys: RwLock::new(KeySet::default()),
            refresh: tokio::sync::Mutex::new(RefreshState::default()),
        })
    }

    /// Fetches the key set now (at start-up, so a wrong URL shows at once); the number of
    /// usable keys.
    pub async fn prefetch(&self) -> Result<usize, String> {
        let mut state = self.refresh.lock().await;
        self.fetch(&mut state).await?;
        Ok(self.keys.read().keys.len())
    }

    /// The caller a token speaks for, if it verifies.
    pub async fn verify(&self, token: &str) -> Result<Principal, TokenError> {
        // An unknown `alg` (`none` among them) does not parse into a header at all.
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| TokenError::Malformed(e.to_string()))?;
        if header.alg.family() == AlgorithmFamily::Hmac {
            return Err(TokenError::Algorithm(format!(
                "{:?}: only the issuer's public keys verify tokens",
                header.alg
            )));
        }
        let key = self.key(header.kid.as_deref()).await?;
        if !key.algorithms.contains(&header.alg) {
            return Err(TokenError::Algorithm(format!(
                "{:?} is not an algorithm of key {:?}",
                header.alg, key.kid
            )));
        }
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.cfg.leeway.as_secs();
        validation.validate_nbf = true;
        validation.set_issuer(&[&self.cfg.issuer]);
        validation.set_audience(&[&self.cfg.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &validation)
            .map_err(|e| TokenError::Rejected(rejection(e.kind())))?;
        self.project(&data.claims)
    }

    /// Claims → principal.
    fn project(&self, claims: &Map<String, Value>) -> Result<Principal, TokenError> {
        let tenant = claims
            .get(&self.cfg.tenant_claim)
            .and_then(Value::as_str)
            .filter(|t| valid_tenant(t))
            .ok_or_else(|| TokenError::Tenant(self.cfg.tenant_claim.clone()))?;
        let scopes = match claims.get(&self.cfg.scopes_claim) {
            Some(Value::String(s)) => Scopes::from_names(s.split_whitespace()),
            Some(Value::Array(items)) => Scopes::from_names(items.iter().filter_map(Value::as_str)),
            _ => Scopes::NONE,
        };
        Ok(Principal {
            identity: Identity {
                tenant_id: tenant.to_string(),
            },
            subject: claims.get("sub").and_then(Value::as_str).map(String::from),
            scopes,
            credential: Credential::Jwt,
        })
    }

    /// The key for `kid`, refreshing the set when it lacks the key or is old.
    async fn key(&self, kid: Option<&str>) -> Result<VerifyKey, TokenError> {
        let cached = {
            let keys = self.keys.read();
            match keys.find(kid) {
                Some(key) if !keys.is_stale(self.cfg.max_age) => return Ok(key.clone()),
                found => found.cloned(),
            }
        };
        if let Err(e) = self.refresh().await {
            tracing::warn!(error = %e, "refreshing the issuer's keys");
            if cached.is_none() {
                return Err(TokenError::Keys(e));
            }
        }
        self.keys
            .read()
            .find(kid)
            .cloned()
            .or(cached)
            .ok_or_else(|| TokenError::UnknownKey(kid.map(String::from)))
    }

    /// Fetches the set unless one was fetched (or tried) within `min_refresh`.
    async fn refresh(&self) -> Result<(), String> {
        let mut state = self.refresh.lock().await;
        if state
            .last_attempt
            .is_some_and(|at| at.elapsed() < self.cfg.min_refresh)
        {
            return state.last_error.clone().map_or(Ok(()), Err);
        }
        self.fetch(&mut state).await
    }

    async fn fetch(&self, state: &mut RefreshState) -> Result<(), String> {
        state.last_attempt = Some(Instant::now());
        let fetched = self.fetch_keys(state).await;
        state.last_error = fetched.as_ref().err().cloned();
        let keys = fetched?;
        tracing::info!(keys = keys.len(), "fetched the issuer's signing keys");
        *self.keys.write() = KeySet {
            keys,
            fetched_at: Some(Instant::now()),
        };
        Ok(())
    }

    async fn fetch_keys(&self, state: &mut RefreshState) -> Result<Vec<VerifyKey>, String> {
        let url = match (&self.cfg.jwks_url, &state.discovered_jwks_url) {
            (Some(url), _) | (None, Some(url)) => url.clone(),
            (None, None) => {
                let url = self.fetcher.discover(&self.cfg.issuer).await?;
                state.discovered_jwks_url = Some(url.clone());
                url
            }
        };
        self.fetcher.keys(&url).await
    }
}

/// What failed, in words that help the token's owner and tell an attacker nothing new.
fn rejection(kind: &ErrorKind) -> &'static str {
    match kind {
        ErrorKind::ExpiredSignature => "expired",
        ErrorKind::ImmatureSignature => "not valid yet (nbf)",
        ErrorKind::InvalidIssuer => "wrong issuer",
        ErrorKind::InvalidAudience => "wrong audience",
        ErrorKind::MissingRequiredClaim(_) => "missing exp, iss or aud",
        ErrorKind::InvalidSignature => "bad signature",
        ErrorKind::InvalidAlgorithm => "algorithm mismatch",
        _ => "malformed or unverifiable",
    }
}

/// Whether a bearer token has a JWT's shape: three dot-separated parts, the first a base64url
/// JSON object. Static keys never do (`ksk_` and hex, or an operator's string without dots).
pub fn looks_like_jwt(token: &str) -> bool {
    use base64::Engine as _;
    let mut parts = token.split('.');
    let (Some(header), Some(_), Some(_), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header.trim_end_matches('='))
        .is_ok_and(|h| h.first() == Some(&b'{'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwt_shape() {
        assert!(looks_like_jwt("eyJhbGciOiJub25lIn0.e30."));
        assert!(looks_like_jwt("eyJhbGciOiJSUzI1NiJ9.e30.c2ln"));
        for not in [
            "ksk_0123456789abcdef",
            "key-one-1234",
            "a.b.c",
            "eyJhbGciOiJSUzI1NiJ9.e30",
            "eyJhbGciOiJSUzI1NiJ9.e30.x.y",
        ] {
            assert!(!looks_like_jwt(not), "{not}");
        }
    }

    #[test]
    fn configuration_is_checked() {
        assert!(JwtVerifier::new(JwtConfig::new("https://idp.example.com")).is_ok());
        let plain = JwtVerifier::new(JwtConfig::new("http://idp.example.com")).err();
        assert!(plain.unwrap().to_string().contains("https"));
        let mut cfg = JwtConfig::new("https://idp.example.com");
        cfg.tenant_claim.clear();
        assert!(JwtVerifier::new(cfg).is_err());
    }
}
