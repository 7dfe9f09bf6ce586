//! Secrets at egress: sealed at rest (ChaCha20-Poly1305 under the server's key, bound to the
//! tenant and name), bound to a session as a random placeholder in its environment, and put in
//! place of that placeholder by the egress proxy (`inject`) in the request headers of
//! connections to the secret's hosts. A sandbox never holds a value. Each connection takes
//! the secret as it is stored then ([`Dest::current`]): a value replaced reaches running
//! sessions at their next connection, and a secret deleted is injected no more.

use std::net::IpAddr;
use std::sync::Arc;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};
use koder_api_types::CreateSecret;
use koder_netpolicy::{Entry, NetConfig};
use koder_store::Store;

use crate::header_rules::{self, HeaderRule};
use crate::tls::SessionCa;
pub use crate::tls::Upstreams;
use crate::Error;

const NONCE_BYTES: usize = 12;
const MAX_VALUE_BYTES: usize = 16 * 1024;
const MAX_HOSTS: usize = 16;

/// What a server needs to offer secrets (`[secrets]` of the daemon config).
#[derive(Debug, Clone)]
pub struct SecretsConfig {
    /// Seals values at rest.
    pub key: SealKey,
    /// Verifies the upstreams TLS connections are re-encrypted to.
    pub upstreams: Upstreams,
}

/// The server's sealing key (`[secrets] key_file`).
#[derive(Clone)]
pub struct SealKey(Arc<ChaCha20Poly1305>);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(..)")
    }
}

impl SealKey {
    pub fn new(key: [u8; 32]) -> Self {
        SealKey(Arc::new(ChaCha20Poly1305::new(&key.into())))
    }

    /// Nonce followed by ciphertext; `aad` ties it to its tenant and name.
    pub(crate) fn seal(&self, aad: &str, value: &[u8]) -> Result<Vec<u8>, Error> {
        let nonce: [u8; NONCE_BYTES] = rand::random();
        let sealed = self
            .0
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: value,
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| Error::Internal("sealing a secret failed".into()))?;
        Ok([nonce.as_slice(), &sealed].concat())
    }

    pub(crate) fn open(&self, aad: &str, sealed: &[u8]) -> Result<Vec<u8>, Error> {
        let (nonce, ct) = sealed
            .split_at_checked(NONCE_BYTES)
            .ok_or_else(|| Error::Internal("a stored secret is truncated".into()))?;
        self.0
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: ct,
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| {
                Error::Internal(
                    "a stored secret does not open with the server's key ([secrets] key_file changed?)"
                        .into(),
                )
            })
    }
}

/// What a secret's sealing is bound to.
pub(crate) fn aad(tenant_id: &str, name: &str) -> String {
    format!("koder-secret\0{tenant_id}\0{name}")
}

/// What an E2B secret's sealing is bound to (never a native secret's: another prefix).
pub(crate) fn e2b_aad(tenant_id: &str, secret_id: &str) -> String {
    format!("koder-e2b-secret\0{tenant_id}\0{secret_id}")
}

/// A secret's value, native or E2B's: it goes into HTTP headers, where a line break would
/// inject headers of its own.
pub(crate) fn check_value(value: &str) -> Result<(), Error> {
    if value.is_empty()
        || value.len() > MAX_VALUE_BYTES
        || value.bytes().any(|b| b.is_ascii_control())
    {
        return Err(Error::InvalidArgument(format!(
            "secret value: 1-{MAX_VALUE_BYTES} bytes without control characters (it is sent in HTTP headers)"
        )));
    }
    Ok(())
}

/// Checks a create request; the parsed hosts.
pub(crate) fn validate(req: &CreateSecret) -> Result<Vec<Entry>, Error> {
    let bad = |m: String| Err(Error::InvalidArgument(m));
    let name_ok = req.name.len() <= 64
        && req
            .name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && req
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !name_ok {
        return bad(format!(
            "secret name {:?}: 1-64 of [A-Za-z0-9_], not starting with a digit (it is the environment variable's name)",
            req.name
        ));
    }
    check_value(&req.value)?;
    if req.hosts.is_empty() || req.hosts.len() > MAX_HOSTS {
        return bad(format!("secret hosts: 1-{MAX_HOSTS} entries"));
    }
    req.hosts
        .iter()
        .map(|h| h.parse::<Entry>().map_err(Error::from))
        .collect()
}

/// The tenant's stored secrets, opened: a binding's value when its session is bound, and
/// again for every connection it is injected into.
#[derive(Debug, Clone)]
pub(crate) struct Vault {
    store: Store,
    key: SealKey,
}

impl Vault {
    pub(crate) fn new(store: Store, key: SealKey) -> Self {
        Vault { store, key }
    }

    /// The native secret's value and hosts; `None` when it is gone.
    pub(crate) async fn native(
        &self,
        tenant_id: &str,
        name: &str,
    ) -> Result<Option<(String, Vec<Entry>)>, Error> {
        let Some(record) = self.store.get_secret(tenant_id, name).await? else {
            return Ok(None);
        };
        let value = utf8(self.key.open(&aad(tenant_id, name), &record.sealed)?)?;
        let hosts = record
            .hosts
            .iter()
            .map(|h| h.parse().map_err(Error::from))
            .collect::<Result<_, _>>()?;
        Ok(Some((value, hosts)))
    }

    /// The value of the tenant's E2B secret named `name` (an id is no name here: a
    /// placeholder names its secret); `None` when there is none.
    pub(crate) async fn e2b(&self, tenant_id: &str, name: &str) -> Result<Option<String>, Error> {
        match self.store.e2b_secret(tenant_id, name).await? {
            Some(record) if record.name == name => {
                let sealed = self
                    .key
                    .open(&e2b_aad(tenant_id, &record.secret_id), &record.sealed)?;
                utf8(sealed).map(Some)
            }
            _ => Ok(None),
        }
    }
}

fn utf8(value: Vec<u8>) -> Result<String, Error> {
    String::from_utf8(value).map_err(|_| Error::Internal("a stored secret is not UTF-8".into()))
}

/// Which stored secret a binding is, to be looked up again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// The tenant's secret of the binding's name.
    Native,
    /// The tenant's E2B secret of this name.
    E2b(String),
}

/// One secret bound to one session.
#[derive(Clone)]
pub(crate) struct Binding {
    pub(crate) name: String,
    /// What the session's environment holds instead of the value.
    pub(crate) placeholder: String,
    pub(crate) value: String,
    hosts: Vec<Entry>,
    /// `None`: a fixed value (tests).
    source: Option<Source>,
}

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Binding {
    /// A binding with a fresh placeholder, or the one the session's environment already holds.
    pub(crate) fn new(
        name: String,
        value: String,
        hosts: Vec<Entry>,
        placeholder: Option<String>,
    ) -> Binding {
        // Random per session: nothing about the value can be learned from it.
        let placeholder =
            placeholder.unwrap_or_else(|| format!("KSECRET_{}", uuid::Uuid::new_v4().simple()));
        Binding {
            name,
            placeholder,
            value,
            hosts,
            source: None,
        }
    }

    /// The binding looked up again at every connection as `source`.
    pub(crate) fn stored_as(mut self, source: Source) -> Binding {
        self.source = Some(source);
        self
    }

    /// This binding as its secret is stored now, for a connection to `ip:port` named `name`;
    /// `None` when the secret was deleted, or (native) its hosts no longer cover the
    /// connection: a connection gets a secret only where both the hosts it was bound with
    /// and the current ones send it.
    async fn current(
        &self,
        vault: &Vault,
        tenant_id: &str,
        (ip, port, name): (IpAddr, u16, &str),
        cfg: &NetConfig,
    ) -> Result<Option<Binding>, Error> {
        let with = |value: String, hosts: Vec<Entry>| Binding {
            value,
            hosts,
            ..self.clone()
        };
        match &self.source {
            None => Ok(Some(self.clone())),
            Some(Source::E2b(secret)) => Ok(vault
                .e2b(tenant_id, secret)
                .await?
                .map(|value| with(value, Vec::new()))),
            Some(Source::Native) => {
                let Some((value, hosts)) = vault.native(tenant_id, &self.name).await? else {
                    return Ok(None);
                };
                let now = with(value, hosts);
                Ok(now.bound_to(ip, port, Some(name), cfg).await.then_some(now))
            }
        }
    }

    /// Is a connection to `ip:port` naming `name` one to this secret's hosts? A domain counts
    /// only when the name is one of its patterns and resolves (by the server's resolver) to
    /// the connection's address: a sandbox naming a bound host while dialling another
    /// address gets nothing.
    async fn bound_to(&self, ip: IpAddr, port: u16, name: Option<&str>, cfg: &NetConfig) -> bool {
        for host in &self.hosts {
            if !host.covers(ip, port, name) {
                continue;
            }
            match (host, name) {
                (Entry::Net { .. }, _) => return true,
                (Entry::Domain { .. }, Some(n)) => {
                    if koder_netpolicy::resolve(cfg, n).await.contains(&ip) {
                        return true;
                    }
                }
                (Entry::Domain { .. }, None) => {}
            }
        }
        false
    }
}

/// A session's secrets, E2B's header rules, and the CA its TLS to their hosts is terminated
/// with.
#[derive(Default)]
pub(crate) struct Bindings {
    /// Native secrets, each in the session's environment as its placeholder.
    pub(crate) bound: Vec<Arc<Binding>>,
    pub(crate) rules: Vec<Arc<HeaderRule>>,
    pub(crate) ca: Option<Arc<SessionCa>>,
}

/// A running session's bindings, read by its egress loop for every connection and replaced
/// when E2B's network update changes its header rules.
pub(crate) type SharedBindings = Arc<parking_lot::RwLock<Option<Arc<Bindings>>>>;

/// What the requests of one connection get: the secrets whose placeholders are put in, and
/// the headers set.
#[derive(Debug, Default)]
pub(crate) struct Dest {
    pub(crate) bound: Vec<Arc<Binding>>,
    pub(crate) headers: Vec<(String, String)>,
}

impl Dest {
    pub(crate) fn is_empty(&self) -> bool {
        self.bound.is_empty() && self.headers.is_empty()
    }

    /// The secrets of this connection as they are stored now (see [`Binding::current`]). A
    /// secret that cannot be read now is left out: nothing is injected rather than an old
    /// value, and its placeholder goes out as it is, which leaks nothing.
    pub(crate) async fn current(
        self,
        vault: &Vault,
        tenant_id: &str,
        to: (IpAddr, u16, &str),
        cfg: &NetConfig,
    ) -> Dest {
        let mut bound = Vec::with_capacity(self.bound.len());
        for b in self.bound {
            match b.current(vault, tenant_id, to, cfg).await {
                Ok(Some(now)) => bound.push(Arc::new(now)),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(secret = %b.name, error = %e, "reading a bound secret; not injected");
                }
            }
        }
        Dest {
            bound,
            headers: self.headers,
        }
    }
}

impl Bindings {
    pub(crate) fn is_empty(&self) -> bool {
        self.bound.is_empty() && self.rules.is_empty()
    }

    /// The secrets bound to this destination, and the headers of the rule for it.
    pub(crate) async fn for_dest(
        &self,
        ip: IpAddr,
        port: u16,
        name: Option<&str>,
        cfg: &NetConfig,
    ) -> Dest {
        let mut dest = Dest::default();
        for b in &self.bound {
            if b.bound_to(ip, port, name, cfg).await {
                dest.bound.push(b.clone());
            }
        }
        if let Some(name) = name {
            if let Some(rule) = header_rules::select(&self.rules, ip, name, cfg).await {
                dest.bound.extend(rule.secrets.iter().cloned());
                dest.headers = rule.headers.clone();
            }
        }
        dest
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use koder_store::{E2bSecretRecord, SecretRecord, Tenant};

    /// A vault over a fresh store holding tenant `t1`'s native secret `TOKEN` for `api.test`
    /// and E2B secret `openai`, both with `value`.
    async fn vault_with(value: &str) -> (Vault, Store) {
        let store = Store::open_in_memory().await.unwrap();
        store
            .upsert_tenant(&Tenant {
                id: "t1".into(),
                name: "t1".into(),
                plan: "dev".into(),
                max_sessions: None,
                daily_session_minutes: None,
                created_at: Utc::now(),
            })
            .await
            .unwrap();
        let vault = Vault::new(store.clone(), SealKey::new([3; 32]));
        put_native(&vault, value, "api.test").await;
        let sealed = vault
            .key
            .seal(&e2b_aad("t1", "sec_1"), value.as_bytes())
            .unwrap();
        store
            .insert_e2b_secret(&E2bSecretRecord {
                tenant_id: "t1".into(),
                secret_id: "sec_1".into(),
                name: "openai".into(),
                sealed,
                version: 1,
                metadata: Default::default(),
                created_at: Utc::now(),
                updated_at: Utc::now(),
            })
            .await
            .unwrap();
        (vault, store)
    }

    async fn put_native(vault: &Vault, value: &str, host: &str) {
        let sealed = vault
            .key
            .seal(&aad("t1", "TOKEN"), value.as_bytes())
            .unwrap();
        vault
            .store
            .put_secret(&SecretRecord {
                tenant_id: "t1".into(),
                name: "TOKEN".into(),
                sealed,
                hosts: vec![host.into()],
                created_at: Utc::now(),
            })
            .await
            .unwrap();
    }

    /// What a connection to api.test (10.1.0.1:80) would inject: (name, value) pairs.
    async fn injected(vault: &Vault, bound: &[Arc<Binding>]) -> Vec<(String, String)> {
        let cfg = NetConfig {
            hosts: [("api.test".to_string(), vec!["10.1.0.1".parse().unwrap()])].into(),
            system_resolver: false,
            ..NetConfig::default()
        };
        let dest = Dest {
            bound: bound.to_vec(),
            headers: Vec::new(),
        };
        let to = ("10.1.0.1".parse().unwrap(), 80, "api.test");
        let now = dest.current(vault, "t1", to, &cfg).await;
        now.bound
            .iter()
            .map(|b| (b.name.clone(), b.value.clone()))
            .collect()
    }

    #[tokio::test]
    async fn each_connection_takes_the_secret_as_stored_now() {
        let (vault, store) = vault_with("v1").await;
        let (value, hosts) = vault.native("t1", "TOKEN").await.unwrap().unwrap();
        let native =
            Arc::new(Binding::new("TOKEN".into(), value, hosts, None).stored_as(Source::Native));
        let e2b_value = vault.e2b("t1", "openai").await.unwrap().unwrap();
        let e2b = Arc::new(
            Binding::new("e2b.secrets.openai".into(), e2b_value, Vec::new(), None)
                .stored_as(Source::E2b("openai".into())),
        );
        let bound = [native.clone(), e2b.clone()];
        let pairs = |a: &str, b: &str| {
            vec![
                ("TOKEN".into(), a.into()),
                ("e2b.secrets.openai".into(), b.into()),
            ]
        };
        assert_eq!(injected(&vault, &bound).await, pairs("v1", "v1"));

        // Replaced: the next connection takes the new values, under the same placeholders.
        put_native(&vault, "v2", "api.test").await;
        let sealed = vault.key.seal(&e2b_aad("t1", "sec_1"), b"w2").unwrap();
        store
            .update_e2b_secret("t1", "sec_1", &sealed, None, Utc::now())
            .await
            .unwrap();
        assert_eq!(injected(&vault, &bound).await, pairs("v2", "w2"));
        assert_eq!(
            native.value, "v1",
            "what the session was bound with is untouched"
        );

        // Its hosts moved elsewhere: not for this connection any more.
        put_native(&vault, "v3", "elsewhere.test").await;
        assert_eq!(
            injected(&vault, &bound).await,
            vec![("e2b.secrets.openai".into(), "w2".into())]
        );

        // Deleted: injected no more.
        store.delete_secret("t1", "TOKEN").await.unwrap();
        store.delete_e2b_secret("t1", "sec_1").await.unwrap();
        assert!(injected(&vault, &bound).await.is_empty());

        // Unreadable (another server key): nothing rather than an old value.
        let (vault, _store) = vault_with("v1").await;
        let other = Vault::new(vault.store.clone(), SealKey::new([4; 32]));
        assert!(injected(&other, &bound).await.is_empty());
        // A binding of no stored secret keeps its value.
        let fixed = Arc::new(Binding::new("T".into(), "x".into(), Vec::new(), None));
        assert_eq!(
            injected(&other, &[fixed]).await,
            vec![("T".into(), "x".into())]
        );
    }

    fn req(name: &str, value: &str, hosts: &[&str]) -> CreateSecret {
        CreateSecret {
            name: name.into(),
            value: value.into(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
        }
    }

    #[test]
    fn sealing_is_bound_to_key_and_name() {
        let key = SealKey::new([7; 32]);
        let sealed = key.seal(&aad("t1", "GH"), b"s3cret").unwrap();
        assert!(!sealed.windows(6).any(|w| w == b"s3cret"));
        assert_eq!(key.open(&aad("t1", "GH"), &sealed).unwrap(), b"s3cret");
        assert!(
            key.open(&aad("t2", "GH"), &sealed).is_err(),
            "another tenant"
        );
        assert!(SealKey::new([8; 32])
            .open(&aad("t1", "GH"), &sealed)
            .is_err());
        assert!(key.open(&aad("t1", "GH"), &sealed[..5]).is_err());
    }

    #[test]
    fn requests_are_checked() {
        assert!(validate(&req("GH_TOKEN", "abc", &["api.github.com", "*.x.test:443"])).is_ok());
        for bad in [
            req("1X", "v", &["a.test"]),
            req("A-B", "v", &["a.test"]),
            req("", "v", &["a.test"]),
            req("A", "", &["a.test"]),
            req("A", "v\r\nX-Evil: 1", &["a.test"]),
            req("A", "v", &[]),
            req("A", "v", &["not a host"]),
        ] {
            assert!(validate(&bad).is_err(), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_binding_needs_the_name_and_its_address() {
        let cfg = NetConfig {
            hosts: [("api.test".to_string(), vec!["10.1.0.1".parse().unwrap()])].into(),
            system_resolver: false,
            ..NetConfig::default()
        };
        let b = Bindings {
            bound: vec![Arc::new(Binding::new(
                "T".into(),
                "v".into(),
                vec![
                    "api.test".parse().unwrap(),
                    "10.2.0.0/16:80".parse().unwrap(),
                ],
                None,
            ))],
            ..Bindings::default()
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            b.for_dest(ip("10.1.0.1"), 80, Some("api.test"), &cfg)
                .await
                .bound
                .len(),
            1
        );
        assert!(
            b.for_dest(ip("10.9.0.9"), 80, Some("api.test"), &cfg)
                .await
                .is_empty(),
            "name of a bound host, another address"
        );
        assert!(b
            .for_dest(ip("10.1.0.1"), 80, Some("other.test"), &cfg)
            .await
            .is_empty());
        assert!(b.for_dest(ip("10.1.0.1"), 80, None, &cfg).await.is_empty());
        assert_eq!(
            b.for_dest(ip("10.2.3.4"), 80, None, &cfg).await.bound.len(),
            1
        );
        assert!(b.for_dest(ip("10.2.3.4"), 81, None, &cfg).await.is_empty());
        assert!(
            b.bound[0].placeholder.starts_with("KSECRET_") && !b.bound[0].placeholder.contains('v')
        );
    }
}
