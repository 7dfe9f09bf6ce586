//! The JWT verifier against an issuer on loopback, with keys made here.

use std::time::Duration;

use koder_auth::jwt::{JwtConfig, JwtVerifier, TokenError};
use koder_auth::testing::{hs256, now, tampered, unsigned, Issuer, SigningKey};
use koder_auth::{AuthError, Authenticator, Credential, KeyRing, Scope};
use serde_json::json;

fn verifier(issuer: &Issuer, min_refresh: Duration) -> JwtVerifier {
    let mut cfg = JwtConfig::new(&issuer.url);
    cfg.min_refresh = min_refresh;
    JwtVerifier::new(cfg).unwrap()
}

#[tokio::test]
async fn every_algorithm_verifies_and_claims_become_the_principal() {
    let keys = [
        SigningKey::rsa("rsa-1"),
        SigningKey::ec("ec-1"),
        SigningKey::ed25519("ed-1"),
    ];
    let issuer = Issuer::start(&keys.iter().collect::<Vec<_>>()).await;
    let v = verifier(&issuer, Duration::from_secs(30));
    assert_eq!(v.prefetch().await.unwrap(), 3);
    for key in &keys {
        let token = key.sign(&issuer.claims("acme", "sandbox:read sandbox:exec"));
        let p = v
            .verify(&token)
            .await
            .unwrap_or_else(|e| panic!("{:?}: {e}", key.alg));
        assert_eq!(p.identity.tenant_id, "acme");
        assert_eq!(p.subject.as_deref(), Some("user-of-acme"));
        assert_eq!(p.credential, Credential::Jwt);
        assert!(p.require(Scope::Exec).is_ok() && p.require(Scope::Write).is_err());
    }
    // Discovery once, then the cache: three tokens cost one JWKS fetch.
    assert_eq!(issuer.jwks_fetches(), 1);
    // Scopes as an array work as well as OAuth's space-separated string.
    let mut claims = issuer.claims("acme", "");
    claims["scope"] = json!(["sandbox:write"]);
    let p = v.verify(&keys[2].sign(&claims)).await.unwrap();
    assert!(p.require(Scope::Write).is_ok() && p.require(Scope::Exec).is_err());
}

#[tokio::test]
async fn refused_tokens() {
    let rsa = SigningKey::rsa("rsa-1");
    let issuer = Issuer::start(&[&rsa]).await;
    let v = verifier(&issuer, Duration::from_secs(30));
    let good = issuer.claims("acme", "sandbox:read");
    let with = |field: &str, value: serde_json::Value| {
        let mut c = good.clone();
        c[field] = value;
        c
    };
    let mut no_tenant = good.clone();
    no_tenant.as_object_mut().unwrap().remove("tenant");
    let mut no_exp = good.clone();
    no_exp.as_object_mut().unwrap().remove("exp");
    let stranger = SigningKey::ed25519("rsa-1");
    let cases = [
        (
            "other audience",
            rsa.sign(&with("aud", json!("other"))),
            "wrong audience",
        ),
        (
            "expired",
            rsa.sign(&with("exp", json!(now() - 120))),
            "expired",
        ),
        (
            "not yet valid",
            rsa.sign(&with("nbf", json!(now() + 300))),
            "nbf",
        ),
        (
            "wrong issuer",
            rsa.sign(&with("iss", json!("https://evil.example"))),
            "wrong issuer",
        ),
        (
            "alg none",
            unsigned("rsa-1", &good),
            "unknown variant `none`",
        ),
        (
            "HS256 under the public key",
            hs256("rsa-1", rsa.public_pem.as_ref().unwrap().as_bytes(), &good),
            "HS256",
        ),
        (
            "tampered payload",
            tampered(&rsa.sign(&good), &with("tenant", json!("victim"))),
            "bad signature",
        ),
        ("missing tenant", rsa.sign(&no_tenant), "tenant"),
        (
            "bad tenant",
            rsa.sign(&with("tenant", json!("../etc"))),
            "tenant",
        ),
        ("no exp", rsa.sign(&no_exp), "missing exp"),
        (
            "someone else's key, our kid",
            stranger.sign(&good),
            "not an algorithm of key",
        ),
    ];
    for (what, token, why) in cases {
        let err = v.verify(&token).await.err();
        let err = err
            .unwrap_or_else(|| panic!("{what}: accepted"))
            .to_string();
        assert!(err.contains(why), "{what}: {err}");
    }
    assert!(v.verify(&rsa.sign(&good)).await.is_ok());
}

#[tokio::test]
async fn rotation_refetches_but_a_kid_flood_does_not() {
    let old = SigningKey::ec("old");
    let issuer = Issuer::start(&[&old]).await;
    let v = verifier(&issuer, Duration::from_millis(500));
    v.prefetch().await.unwrap();
    assert_eq!(issuer.jwks_fetches(), 1);

    // 200 tokens naming made-up kids, all at once: at most one fetch in the interval.
    let forger = SigningKey::ec("x");
    let claims = issuer.claims("acme", "sandbox:read");
    let tokens: Vec<String> = (0..200)
        .map(|i| forger.sign_as(&format!("random-{i}"), &claims))
        .collect();
    let results = futures::future::join_all(tokens.iter().map(|t| v.verify(t))).await;
    assert!(results
        .iter()
        .all(|r| matches!(r, Err(TokenError::UnknownKey(_)))));
    assert!(
        issuer.jwks_fetches() <= 2,
        "{} fetches",
        issuer.jwks_fetches()
    );

    // The issuer rotates: a token with the new kid fetches the new set, once the interval
    // has passed.
    let new = SigningKey::rsa("new");
    issuer.publish(&[&old, &new]);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let before = issuer.jwks_fetches();
    let p = v.verify(&new.sign(&claims)).await.unwrap();
    assert_eq!(p.identity.tenant_id, "acme");
    assert_eq!(issuer.jwks_fetches(), before + 1);
    assert!(v.verify(&old.sign(&claims)).await.is_ok());
}

#[tokio::test]
async fn keys_and_tokens_coexist_and_never_fall_back() {
    let ed = SigningKey::ed25519("ed");
    let issuer = Issuer::start(&[&ed]).await;
    let mut ring = KeyRing::default();
    ring.insert_hash(koder_auth::hash_key("static-key-1"), "t1");
    let auth = Authenticator::new(ring, Some(verifier(&issuer, Duration::from_secs(30))));
    let key = auth.authenticate("static-key-1").await.unwrap();
    assert_eq!(key.identity.tenant_id, "t1");
    let jwt = auth
        .authenticate(&ed.sign(&issuer.claims("acme", "sandbox:read")))
        .await
        .unwrap();
    assert_eq!(jwt.identity.tenant_id, "acme");
    let mut expired = issuer.claims("acme", "sandbox:read");
    expired["exp"] = json!(now() - 3600);
    assert!(matches!(
        auth.authenticate(&ed.sign(&expired)).await,
        Err(AuthError::Token(TokenError::Rejected("expired")))
    ));
}

#[tokio::test]
async fn an_unreachable_issuer_is_a_401_not_a_hang() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let mut cfg = JwtConfig::new(&url);
    cfg.fetch_timeout = Duration::from_secs(2);
    let v = JwtVerifier::new(cfg).unwrap();
    assert!(v.prefetch().await.is_err());
    let key = SigningKey::ed25519("k");
    let claims = json!({"iss": url, "aud": "sandbox", "tenant": "a", "exp": now() + 60});
    assert!(matches!(
        v.verify(&key.sign(&claims)).await,
        Err(TokenError::Keys(_))
    ));
}
