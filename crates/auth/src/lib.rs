//! Who is calling and whether they may: a bearer token becomes a [`Principal`] (an [`Identity`]
//! bound to one tenant, with a subject and [`Scopes`]), and [`limits::Limiter`] admits or
//! refuses the tenant's next request, exec or stream.
//!
//! A token is either a static API key ([`KeyRing`]) or a JWT verified against the issuer's
//! JWKS ([`jwt::JwtVerifier`]); [`Authenticator`] decides which by the token's shape and never
//! tries the other kind for a token that failed. Nothing here knows a transport: REST, E2B and
//! gRPC map the errors' [`koder_api_types::ErrorCode`] onto their wire.

mod authn;
pub mod jwt;
mod keys;
pub mod limits;
mod scope;
#[cfg(feature = "test-support")]
pub mod testing;

pub use authn::{AuthError, Authenticator, Credential, KeySource, Principal, ScopeDenied};
pub use keys::{
    bearer_token, generate_key, hash_key, parse_key_spec, KeyRing, KeySpecError, MIN_KEY_LEN,
};
pub use scope::{Scope, Scopes};

/// The tenant a request acts for: what the session manager checks ownership against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub tenant_id: String,
}

/// Tenant ids name rows, metrics labels and directories: keep them plain.
pub const MAX_TENANT_LEN: usize = 64;

pub fn valid_tenant(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_TENANT_LEN
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}
