//! TLS interception for secret injection. A session with secrets gets a CA of its own
//! (generated at create, its key only in the daemon's memory), which the session trusts
//! (`ca_files`); a TLS connection to a secret's host is terminated with a certificate for the
//! name it asked for, signed by that CA, and re-encrypted to the upstream, verified against
//! the system roots plus the server's configured extra CA. Connections to other hosts are
//! never touched: they stay end-to-end TLS.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::Error;

/// Where a session's trust for its CA is written (inside the sandbox: its /etc is read-only).
pub(crate) const CA_FILE: &str = "/tmp/.koder-egress/ca.pem";
/// The system bundle plus the session's CA, for tools that take one file.
pub(crate) const BUNDLE_FILE: &str = "/tmp/.koder-egress/bundle.pem";
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Internal(format!("{what}: {e}"))
}

/// The server's side of re-encryption: how upstreams are verified.
#[derive(Clone)]
pub struct Upstreams(Arc<rustls::ClientConfig>);

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Upstreams(..)")
    }
}

impl Upstreams {
    /// The system roots plus `extra_ca_pem` (`[secrets] upstream_ca_file`).
    pub fn new(extra_ca_pem: Option<&[u8]>) -> Result<Upstreams, Error> {
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        let _ = roots.add_parsable_certificates(native.certs);
        if let Some(pem) = extra_ca_pem {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| tls_err("the upstream CA file", e))?;
                roots
                    .add(cert)
                    .map_err(|e| tls_err("the upstream CA file", e))?;
            }
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("TLS client", e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Upstreams(Arc::new(config)))
    }
}

/// A session's CA and the leaf configurations made with it, by name.
pub(crate) struct SessionCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
    upstreams: Upstreams,
}

impl SessionCa {
    pub(crate) fn new(upstreams: Upstreams) -> Result<SessionCa, Error> {
        let key = rcgen::KeyPair::generate().map_err(|e| tls_err("session CA key", e))?;
        let mut params =
            rcgen::CertificateParams::new(Vec::new()).map_err(|e| tls_err("session CA", e))?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "koder-sandbox session egress CA");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = rcgen::CertifiedIssuer::self_signed(params, key)
            .map_err(|e| tls_err("session CA", e))?;
        Ok(SessionCa {
            issuer,
            leaves: Mutex::default(),
            upstreams,
        })
    }

    pub(crate) fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The files that make a session trust its CA: the CA alone and a bundle with the
    /// system roots (what `SSL_CERT_FILE` and friends point at).
    pub(crate) fn trust_files(&self) -> [(&'static str, Vec<u8>); 2] {
        let ca = self.pem();
        let mut bundle = std::fs::read(SYSTEM_BUNDLE).unwrap_or_default();
        if !bundle.is_empty() && !bundle.ends_with(b"\n") {
            bundle.push(b'\n');
        }
        bundle.extend_from_slice(ca.as_bytes());
        [(CA_FILE, ca.into_bytes()), (BUNDLE_FILE, bundle)]
    }

    /// The environment that points common TLS stacks at those files.
    pub(crate) fn trust_env() -> [(&'static str, &'static str); 4] {
        [
            ("SSL_CERT_FILE", BUNDLE_FILE),
            ("REQUESTS_CA_BUNDLE", BUNDLE_FILE),
            ("CURL_CA_BUNDLE", BUNDLE_FILE),
            ("NODE_EXTRA_CA_CERTS", CA_FILE),
        ]
    }

    fn server_config(&self, name: &str) -> Result<Arc<rustls::ServerConfig>, Error> {
        if let Some(c) = self.leaves.lock().get(name) {
            return Ok(c.clone());
        }
        let key = rcgen::KeyPair::generate().map_err(|e| tls_err("leaf key", e))?;
        let params = rcgen::CertificateParams::new(vec![name.to_string()])
            .map_err(|e| tls_err("leaf certificate", e))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| tls_err("leaf certificate", e))?;
        let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes())
            .map_err(|e| tls_err("leaf key", e))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_err("TLS server", e))?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], key)
            .map_err(|e| tls_err("TLS server", e))?;
        // Requests are rewritten as HTTP/1 heads.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        self.leaves.lock().insert(name.to_string(), config.clone());
        Ok(config)
    }

    /// Terminates the sandbox's TLS as `name` and opens verified TLS to the upstream.
    pub(crate) async fn intercept<S, U>(
        &self,
        sandbox: S,
        upstream: U,
        name: &str,
    ) -> Result<
        (
            tokio_rustls::server::TlsStream<S>,
            tokio_rustls::client::TlsStream<U>,
        ),
        Error,
    >
    where
        S: AsyncRead + AsyncWrite + Unpin,
        U: AsyncRead + AsyncWrite + Unpin,
    {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.server_config(name)?);
        let sandbox = acceptor
            .accept(sandbox)
            .await
            .map_err(|e| tls_err("TLS from the sandbox", e))?;
        let server_name =
            ServerName::try_from(name.to_string()).map_err(|e| tls_err("server name", e))?;
        let mut client = (*self.upstreams.0).clone();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        let upstream = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(server_name, upstream)
            .await
            .map_err(|e| tls_err("TLS to the upstream", e))?;
        Ok((sandbox, upstream))
    }
}
