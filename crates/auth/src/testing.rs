//! For tests (feature `test-support`): signing keys made on the spot (RSA, EC P-256, Ed25519)
//! and an OpenID issuer on loopback that serves their JWKS and counts how often it is asked.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use base64::Engine as _;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use parking_lot::Mutex;
use serde_json::{json, Value};

/// A private key and the public JWK an issuer publishes for it.
pub struct SigningKey {
    pub kid: String,
    pub alg: Algorithm,
    key: EncodingKey,
    /// RSA keys only: the public key as PEM, what an `HS256`-confusion attacker would use as
    /// the HMAC secret.
    pub public_pem: Option<String>,
}

impl SigningKey {
    /// RSA 2048, RS256.
    pub fn rsa(kid: &str) -> Self {
        use rsa::pkcs1::EncodeRsaPrivateKey as _;
        use rsa::pkcs8::EncodePublicKey as _;
        let private = rsa::PrivateKey::new(&mut getrandom::SysRng, 2048).expect("RSA key");
        let der = private.to_pkcs1_der().expect("PKCS#1");
        let spki = private
            .to_public_key()
            .to_public_key_der()
            .expect("public key");
        let b64 = base64::engine::general_purpose::STANDARD.encode(spki.as_bytes());
        let lines: Vec<&str> = b64
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).unwrap_or_default())
            .collect();
        Self {
            kid: kid.into(),
            alg: Algorithm::RS256,
            key: EncodingKey::from_rsa_der(der.as_bytes()),
            public_pem: Some(format!(
                "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
                lines.join("\n")
            )),
        }
    }

    /// EC P-256, ES256.
    pub fn ec(kid: &str) -> Self {
        use p256::pkcs8::EncodePrivateKey as _;
        let secret = loop {
            // A random 32-byte string is a valid scalar but with negligible probability.
            if let Ok(s) = p256::SecretKey::from_slice(&rand::random::<[u8; 32]>()) {
                break s;
            }
        };
        Self {
            kid: kid.into(),
            alg: Algorithm::ES256,
            key: EncodingKey::from_ec_der(secret.to_pkcs8_der().expect("PKCS#8").as_bytes()),
            public_pem: None,
        }
    }

    /// Ed25519, EdDSA.
    pub fn ed25519(kid: &str) -> Self {
        // PKCS#8 v1 of an Ed25519 seed (RFC 8410): a fixed 16-byte prefix and the 32-byte seed.
        let mut der = hex::decode("302e020100300506032b657004220420").expect("prefix");
        der.extend_from_slice(&rand::random::<[u8; 32]>());
        Self {
            kid: kid.into(),
            alg: Algorithm::EdDSA,
            key: EncodingKey::from_ed_der(&der),
            public_pem: None,
        }
    }

    /// The public JWK, with `kid`, `alg` and `use`.
    pub fn jwk(&self) -> Value {
        let mut jwk = Jwk::from_encoding_key(&self.key, self.alg).expect("public JWK");
        jwk.common.key_id = Some(self.kid.clone());
        jwk.common.public_key_use = Some(jsonwebtoken::jwk::PublicKeyUse::Signature);
        serde_json::to_value(jwk).expect("JWK JSON")
    }

    /// A token over `claims` naming this key.
    pub fn sign(&self, claims: &Value) -> String {
        self.sign_as(&self.kid, claims)
    }

    /// A token over `claims` naming key `kid` (signed with this key whatever `kid` says).
    pub fn sign_as(&self, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(kid.into());
        jsonwebtoken::encode(&header, claims, &self.key).expect("signing")
    }
}

/// A token with `alg: none` and no signature.
pub fn unsigned(kid: &str, claims: &Value) -> String {
    let b64 = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    let header = json!({"alg": "none", "typ": "JWT", "kid": kid});
    format!("{}.{}.", b64(&header), b64(claims))
}

/// A token signed with HMAC-SHA256 under `secret`, naming key `kid`.
pub fn hs256(kid: &str, secret: &[u8], claims: &Value) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(kid.into());
    let key = EncodingKey::from_secret(secret).expect("HMAC key");
    jsonwebtoken::encode(&header, claims, &key).expect("signing")
}

/// `token` with its payload replaced by `claims`, the signature kept.
pub fn tampered(token: &str, claims: &Value) -> String {
    let mut parts: Vec<String> = token.split('.').map(String::from).collect();
    parts[1] = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(claims.to_string());
    parts.join(".")
}

/// Seconds since the epoch.
pub fn now() -> i64 {
    jsonwebtoken::get_current_timestamp() as i64
}

/// An OpenID issuer on `127.0.0.1`: `/.well-known/openid-configuration` and `/jwks`.
pub struct Issuer {
    /// The issuer URL, as tokens' `iss` carries it.
    pub url: String,
    keys: Arc<Mutex<Vec<Value>>>,
    fetches: Arc<AtomicUsize>,
    server: tokio::task::JoinHandle<()>,
}

impl Issuer {
    pub async fn start(keys: &[&SigningKey]) -> Issuer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let published: Arc<Mutex<Vec<Value>>> =
            Arc::new(Mutex::new(keys.iter().map(|k| k.jwk()).collect()));
        let fetches = Arc::new(AtomicUsize::new(0));
        let discovery = json!({"issuer": url, "jwks_uri": format!("{url}/jwks")});
        let app = {
            let (published, fetches) = (published.clone(), fetches.clone());
            axum::Router::new()
                .route(
                    "/.well-known/openid-configuration",
                    axum::routing::get(move || async move { axum::Json(discovery) }),
                )
                .route(
                    "/jwks",
                    axum::routing::get(move || async move {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        let keys = published.lock().clone();
                        axum::Json(json!({ "keys": keys }))
                    }),
                )
        };
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Issuer {
            url,
            keys: published,
            fetches,
            server,
        }
    }

    /// Replaces the published key set.
    pub fn publish(&self, keys: &[&SigningKey]) {
        *self.keys.lock() = keys.iter().map(|k| k.jwk()).collect();
    }

    /// How many times the JWKS was fetched.
    pub fn jwks_fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    /// Claims this issuer would put in a token for `tenant` with `scope`, valid for 5 minutes.
    pub fn claims(&self, tenant: &str, scope: &str) -> Value {
        json!({
            "iss": self.url,
            "aud": "sandbox",
            "sub": format!("user-of-{tenant}"),
            "tenant": tenant,
            "scope": scope,
            "iat": now(),
            "exp": now() + 300,
        })
    }
}

impl Drop for Issuer {
    fn drop(&mut self) {
        self.server.abort();
    }
}
