//! The proof a node adds to every request it forwards: `X-Koder-Forwarded: v1 <node> <unix ms>
//! <hex HMAC-SHA256>`, the HMAC under the cluster's shared secret over the node, the time, the
//! method and the request target. It says only "a node of this cluster sent this request,
//! now" (so the receiver serves it itself instead of forwarding it again); it carries no
//! identity: the caller's own credentials travel with the request and the owner authenticates
//! them as if the caller had come directly. The secret itself never crosses the network.

use std::sync::Arc;

use axum::http::Method;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header a forwarded request carries (in the daemon's one list of credential headers, so
/// the preview proxy never hands it to a sandbox).
pub use koder_http::credentials::NODE_PROOF as HEADER;
const VERSION: &str = "v1";
/// How far a proof's time may be from the receiver's clock (nodes' clocks are NTP-close).
const MAX_SKEW_MS: i64 = 60_000;
/// The shortest secret accepted.
pub const MIN_SECRET_LEN: usize = 32;

/// The cluster's shared secret (`[cluster] secret_file`).
#[derive(Clone)]
pub struct ClusterKey(Arc<[u8]>);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProofError {
    #[error("the cluster secret must be at least {MIN_SECRET_LEN} bytes")]
    ShortSecret,
    #[error("malformed node proof")]
    Malformed,
    #[error("the node proof is stale (its time is more than 60 s from this node's)")]
    Stale,
    #[error("the node proof does not verify under this cluster's secret")]
    Wrong,
}

impl ClusterKey {
    /// The secret's bytes, surrounding whitespace (a file's final newline) ignored.
    pub fn new(secret: &[u8]) -> Result<ClusterKey, ProofError> {
        let secret = secret.trim_ascii();
        if secret.len() < MIN_SECRET_LEN {
            return Err(ProofError::ShortSecret);
        }
        Ok(ClusterKey(secret.into()))
    }

    fn mac(&self, node: &str, at_ms: i64, method: &Method, target: &str) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        // Fields are separated by a byte none of them can hold (ids, a number, a method and a
        // request target are all printable).
        for part in [
            VERSION.as_bytes(),
            node.as_bytes(),
            at_ms.to_string().as_bytes(),
            method.as_str().as_bytes(),
            target.as_bytes(),
        ] {
            mac.update(part);
            mac.update(b"\n");
        }
        mac
    }

    /// A key for `purpose` that every node derives alike from the cluster secret (HMAC-SHA256
    /// of the purpose, apart from the proofs' inputs by its prefix), for what one node issues
    /// and another must verify (E2B's envd tokens).
    pub fn derive(&self, purpose: &str) -> [u8; 32] {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(b"derive\0");
        mac.update(purpose.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// The header value for `node` forwarding `method target` at `at_ms`.
    pub fn sign(&self, node: &str, at_ms: i64, method: &Method, target: &str) -> String {
        let tag = self
            .mac(node, at_ms, method, target)
            .finalize()
            .into_bytes();
        format!("{VERSION} {node} {at_ms} {}", hex::encode(tag))
    }

    /// The forwarding node's id when `value` proves `method target` was forwarded by a node of
    /// this cluster within the allowed skew of `now_ms`. The tag is compared in constant time.
    pub fn verify(
        &self,
        value: &str,
        method: &Method,
        target: &str,
        now_ms: i64,
    ) -> Result<String, ProofError> {
        let mut parts = value.split(' ');
        let (Some(VERSION), Some(node), Some(at), Some(tag), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(ProofError::Malformed);
        };
        let at_ms: i64 = at.parse().map_err(|_| ProofError::Malformed)?;
        let tag = hex::decode(tag).map_err(|_| ProofError::Malformed)?;
        if node.is_empty() {
            return Err(ProofError::Malformed);
        }
        if now_ms.abs_diff(at_ms) > MAX_SKEW_MS.unsigned_abs() {
            return Err(ProofError::Stale);
        }
        self.mac(node, at_ms, method, target)
            .verify_slice(&tag)
            .map_err(|_| ProofError::Wrong)?;
        Ok(node.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> ClusterKey {
        ClusterKey::new(s.as_bytes()).unwrap()
    }

    #[test]
    fn a_proof_verifies_only_for_what_it_signed() {
        let k = key("0123456789abcdef0123456789abcdef\n");
        let target = "/v1/sandbox/sessions/abc/exec?x=1";
        let v = k.sign("node-a", 1_000_000, &Method::POST, target);
        assert_eq!(
            k.verify(&v, &Method::POST, target, 1_000_500),
            Ok("node-a".into())
        );
        // Another method, target, time, node name or secret: refused.
        assert_eq!(
            k.verify(&v, &Method::GET, target, 1_000_500),
            Err(ProofError::Wrong)
        );
        assert_eq!(
            k.verify(
                &v,
                &Method::POST,
                "/v1/sandbox/sessions/abd/exec?x=1",
                1_000_500
            ),
            Err(ProofError::Wrong)
        );
        let renamed = v.replace("node-a", "node-b");
        assert_eq!(
            k.verify(&renamed, &Method::POST, target, 1_000_500),
            Err(ProofError::Wrong)
        );
        let moved = v.replace("1000000", "1000001");
        assert_eq!(
            k.verify(&moved, &Method::POST, target, 1_000_500),
            Err(ProofError::Wrong)
        );
        let other = key("another secret of thirty-two bytes!!");
        assert_eq!(
            other.verify(&v, &Method::POST, target, 1_000_500),
            Err(ProofError::Wrong)
        );
        assert_eq!(
            k.verify(&v, &Method::POST, target, 1_000_000 + 61_000),
            Err(ProofError::Stale)
        );
    }

    #[test]
    fn derived_keys_are_per_purpose_and_per_secret() {
        let key = ClusterKey::new(&[7u8; 40]).unwrap();
        let same = ClusterKey::new(&[7u8; 40]).unwrap();
        let other = ClusterKey::new(&[8u8; 40]).unwrap();
        assert_eq!(key.derive("e2b"), same.derive("e2b"));
        assert_ne!(key.derive("e2b"), key.derive("e2b2"));
        assert_ne!(key.derive("e2b"), other.derive("e2b"));
    }

    #[test]
    fn hostile_values_are_malformed_not_panics() {
        let k = key("0123456789abcdef0123456789abcdef");
        for v in [
            "",
            "v1",
            "v2 a 1 00",
            "v1 a notanumber 00",
            "v1 a 1 zz",
            "v1  1 00",
            "v1 a 1 00 extra",
            "v1 a 99999999999999999999999 00",
        ] {
            assert_eq!(
                k.verify(v, &Method::GET, "/", 1),
                Err(ProofError::Malformed),
                "{v:?}"
            );
        }
        // A short tag is wrong, never an out-of-bounds compare.
        assert_eq!(
            k.verify("v1 a 1 00", &Method::GET, "/", 1),
            Err(ProofError::Wrong)
        );
        assert_eq!(
            ClusterKey::new(b"  short  ").unwrap_err(),
            ProofError::ShortSecret
        );
    }
}
