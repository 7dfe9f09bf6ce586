//! The issuer's signing keys: found through its discovery document (or a configured JWKS URL),
//! fetched with a bounded body, each JWK turned into a verification key with the algorithms it
//! may verify. Keys for encryption, symmetric keys and keys of unknown types are left out, so
//! no token can be checked against a secret an attacker could know.

use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey};
use serde::Deserialize;

/// A JWKS or discovery document larger than this is refused: key sets are a few KiB.
const MAX_DOCUMENT_BYTES: usize = 256 * 1024;

/// One key of the issuer's set.
#[derive(Clone)]
pub(crate) struct VerifyKey {
    pub kid: Option<String>,
    pub key: DecodingKey,
    /// The algorithms a token signed with this key may name: the JWK's own `alg` when it has
    /// one, else those of its type and curve.
    pub algorithms: Vec<Algorithm>,
}

/// The keys as last fetched.
#[derive(Clone, Default)]
pub(crate) struct KeySet {
    pub keys: Vec<VerifyKey>,
    pub fetched_at: Option<Instant>,
}

impl KeySet {
    /// The key a token's `kid` names; a token without one can only mean a set of one key.
    pub fn find(&self, kid: Option<&str>) -> Option<&VerifyKey> {
        match kid {
            Some(kid) => self.keys.iter().find(|k| k.kid.as_deref() == Some(kid)),
            None => match self.keys.as_slice() {
                [only] => Some(only),
                _ => None,
            },
        }
    }

    pub fn is_stale(&self, max_age: Duration) -> bool {
        self.fetched_at.is_none_or(|at| at.elapsed() >= max_age)
    }
}

#[derive(Deserialize)]
struct JwksDocument {
    keys: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct Discovery {
    issuer: String,
    jwks_uri: String,
}

/// The usable keys of a JWKS document; a key that does not parse is skipped (and logged), not
/// a reason to drop the others.
pub(crate) fn parse_jwks(body: &[u8]) -> Result<Vec<VerifyKey>, String> {
    let doc: JwksDocument =
        serde_json::from_slice(body).map_err(|e| format!("not a JWKS document: {e}"))?;
    Ok(doc
        .keys
        .into_iter()
        .filter_map(|raw| match serde_json::from_value::<Jwk>(raw) {
            Ok(jwk) => verify_key(&jwk),
            Err(e) => {
                tracing::warn!(error = %e, "JWKS: skipping a key that does not parse");
                None
            }
        })
        .collect())
}

fn verify_key(jwk: &Jwk) -> Option<VerifyKey> {
    if matches!(&jwk.common.public_key_use, Some(u) if *u != PublicKeyUse::Signature) {
        return None;
    }
    let by_type: &[Algorithm] = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => AlgorithmFamily::Rsa.algorithms(),
        AlgorithmParameters::EllipticCurve(p) => match p.curve {
            EllipticCurve::P256 => &[Algorithm::ES256],
            EllipticCurve::P384 => &[Algorithm::ES384],
            _ => return None,
        },
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            &[Algorithm::EdDSA]
        }
        // Symmetric (`oct`) keys never verify here: an HS256 token must not be checked
        // against anything published.
        _ => return None,
    };
    let algorithms = match jwk.common.key_algorithm {
        Some(named) => {
            let alg = Algorithm::try_from(named).ok()?;
            // A key's `alg` outside its own type is a broken (or hostile) set.
            by_type.contains(&alg).then(|| vec![alg])?
        }
        None => by_type.to_vec(),
    };
    let key = DecodingKey::from_jwk(jwk)
        .map_err(|e| tracing::warn!(error = %e, kid = ?jwk.common.key_id, "JWKS: unusable key"))
        .ok()?;
    Some(VerifyKey {
        kid: jwk.common.key_id.clone(),
        key,
        algorithms,
    })
}

/// Fetches the issuer's documents.
pub(crate) struct Fetcher {
    http: reqwest::Client,
}

impl Fetcher {
    pub fn new(timeout: Duration) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            // A key set is fetched from where the configuration (or the issuer's own discovery
            // document) says, not from wherever a response points.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Self { http })
    }

    /// The `jwks_uri` of `issuer`'s OpenID discovery document, which must name `issuer` itself.
    pub async fn discover(&self, issuer: &str) -> Result<String, String> {
        let url = format!(
            "{}/.well-known/openid-configuration",
            issuer.trim_end_matches('/')
        );
        let body = self.get(&url).await?;
        let doc: Discovery = serde_json::from_slice(&body)
            .map_err(|e| format!("{url}: not an OpenID discovery document: {e}"))?;
        if doc.issuer != issuer {
            return Err(format!(
                "{url} describes issuer {:?}, not {issuer:?}",
                doc.issuer
            ));
        }
        check_url(&doc.jwks_uri)?;
        Ok(doc.jwks_uri)
    }

    pub async fn keys(&self, jwks_url: &str) -> Result<Vec<VerifyKey>, String> {
        let body = self.get(jwks_url).await?;
        parse_jwks(&body).map_err(|e| format!("{jwks_url}: {e}"))
    }

    async fn get(&self, url: &str) -> Result<Vec<u8>, String> {
        let mut resp = self
            .http
            .get(url)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| format!("{url}: {e}"))?;
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| format!("{url}: {e}"))? {
            if body.len() + chunk.len() > MAX_DOCUMENT_BYTES {
                return Err(format!("{url}: larger than {MAX_DOCUMENT_BYTES} bytes"));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// Keys must come over TLS; plain HTTP only from this host (a local issuer, tests).
pub(crate) fn check_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("{url:?}: {e}"))?;
    let host = parsed.host_str().unwrap_or("");
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    match parsed.scheme() {
        "https" => Ok(()),
        "http" if loopback => Ok(()),
        _ => Err(format!(
            "{url:?}: keys are fetched over https (plain http only from a loopback address)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_signature_keys_of_known_types_with_consistent_algorithms() {
        let doc = json!({"keys": [
            {"kty": "RSA", "kid": "r", "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw", "e": "AQAB"},
            {"kty": "RSA", "kid": "r-hs", "alg": "HS256", "n": "sXchDaQebHnPiGvyDOAT4saGEUetSyo9MKLOoWFsueri23bOdgWp4Dy1WlUzewbgBHod5pcM9H95GQRV3JDXboIRROSBigeC5yjU1hGzHHyXss8UDprecbAYxknTcQkhslANGRUZmdTOQ5qTRsLAt6BTYuyvVRdhS8exSZEy_c4gs_7svlJJQ4H9_NxsiIoLwAEk7-Q3UXERGYw_75IDrGA84-lA_-Ct4eTlXHBIY2EaV7t7LjJaynVJCpkv4LKjTTAumiGUIuQhrNhZLuF_RJLqHpM2kgWFLU7-VTdL1VbC2tejvcI2BlMkEpk1BzBZI0KQB0GaDWFLN-aEAw3vRw", "e": "AQAB"},
            {"kty": "RSA", "kid": "r-enc", "use": "enc", "n": "AQAB", "e": "AQAB"},
            {"kty": "oct", "kid": "secret", "k": "c2VjcmV0"},
            {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"},
            {"kty": "EC", "kid": "ec", "crv": "P-256", "alg": "ES256",
             "x": "f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU", "y": "x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"},
            {"kty": "weird", "kid": "w"},
            "not an object"
        ]});
        let keys = parse_jwks(doc.to_string().as_bytes()).unwrap();
        let kids: Vec<_> = keys.iter().map(|k| k.kid.as_deref().unwrap()).collect();
        assert_eq!(kids, ["r", "ed", "ec"]);
        assert!(keys[0].algorithms.contains(&Algorithm::RS256));
        assert!(!keys[0].algorithms.contains(&Algorithm::HS256));
        assert_eq!(keys[1].algorithms, [Algorithm::EdDSA]);
        assert_eq!(keys[2].algorithms, [Algorithm::ES256]);
        assert!(parse_jwks(b"{}").is_err());
    }

    #[test]
    fn a_kidless_token_needs_a_set_of_one() {
        let one = KeySet {
            keys: parse_jwks(json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}).to_string().as_bytes()).unwrap(),
            fetched_at: None,
        };
        assert!(one.find(None).is_some());
        assert!(one.find(Some("x")).is_none());
        assert!(KeySet::default().find(None).is_none());
        assert!(one.is_stale(Duration::from_secs(3600)));
    }

    #[test]
    fn keys_come_over_tls_or_from_loopback() {
        for ok in [
            "https://idp.example.com/jwks",
            "http://127.0.0.1:8080/jwks",
            "http://localhost/jwks",
            "http://[::1]:9/jwks",
        ] {
            assert!(check_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://idp.example.com/jwks",
            "ftp://127.0.0.1/x",
            "not a url",
        ] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }
}
