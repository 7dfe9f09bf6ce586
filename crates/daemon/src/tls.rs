//! HTTPS beside HTTP (`[server] tls_listen`): the same routes behind a certificate the
//! operator provides, for clients that only speak `https://` to a sandbox's host names (E2B's
//! `get_host(port)` URLs under `[e2b] domain`).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::config::TlsListen;

/// How long a client has to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the server to take them.
const BACKLOG: usize = 64;

/// The server's TLS configuration from the PEM files: HTTP/1.1 only (WebSocket upgrades).
pub fn server_config(tls: &TlsListen) -> anyhow::Result<rustls::ServerConfig> {
    let certs = CertificateDer::pem_file_iter(&tls.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("[server] tls_cert {}", tls.cert.display()))?;
    if certs.is_empty() {
        anyhow::bail!("[server] tls_cert {}: no certificate", tls.cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(&tls.key)
        .with_context(|| format!("[server] tls_key {}", tls.key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .context("[server] tls_cert and tls_key do not make a usable pair")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A listener whose connections come out handshaken. Handshakes run in tasks of their own,
/// so a client that stalls in one holds up nobody else.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl TlsListener {
    pub fn new(listener: TcpListener, config: rustls::ServerConfig) -> io::Result<Self> {
        let addr = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(BACKLOG);
        let acceptor = TlsAcceptor::from(Arc::new(config));
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = tokio::select! {
                    () = tx.closed() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            // Out of descriptors and the like: pass, as axum's own loop does.
                            tracing::warn!(error = %e, "HTTPS accept");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                };
                // Streamed answers are many small writes (see the HTTP listener).
                let _ = tcp.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self { ready, addr })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accepting task only ends once this receiver is gone.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &std::path::Path, cert: &str, key: &str) -> TlsListen {
        std::fs::write(dir.join("c.pem"), cert).unwrap();
        std::fs::write(dir.join("k.pem"), key).unwrap();
        TlsListen {
            addr: "127.0.0.1:0".parse().unwrap(),
            cert: dir.join("c.pem"),
            key: dir.join("k.pem"),
        }
    }

    #[test]
    fn pem_files_make_the_config_and_bad_ones_say_which() {
        let dir = tempfile::tempdir().unwrap();
        let made = rcgen::generate_simple_self_signed(vec!["*.sbx.test".into()]).unwrap();
        let (cert, key) = (made.cert.pem(), made.signing_key.serialize_pem());
        assert!(server_config(&files(dir.path(), &cert, &key)).is_ok());
        let other = rcgen::generate_simple_self_signed(vec!["x.test".into()]).unwrap();
        let other_key = other.signing_key.serialize_pem();
        for (c, k, says) in [
            ("", key.as_str(), "no certificate"),
            (cert.as_str(), "", "tls_key"),
            (cert.as_str(), other_key.as_str(), "usable pair"),
        ] {
            let err = format!("{:#}", server_config(&files(dir.path(), c, k)).unwrap_err());
            assert!(err.contains(says), "{err}");
        }
    }
}
