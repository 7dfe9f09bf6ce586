//! The session's dev server: which port it listens on, and connections to it for the preview
//! proxy (made by the agent inside the sandbox's own network namespace).

use koder_agent_protocol::{FromAgent, ToAgent, CHUNK_BYTES};
use koder_auth::Identity;

use crate::{Error, Manager};

/// The bytes of one connection to a session's upstream, both ways; shutting down the write
/// half closes the connection's sending side, dropping it closes the connection.
pub type UpstreamConn = tokio::io::DuplexStream;

/// Where a session's preview goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upstream {
    pub port: u16,
    pub pinned: bool,
}

impl Manager {
    pub async fn listening_ports(&self, who: &Identity, id: &str) -> Result<Vec<u16>, Error> {
        let live = self.awake(who, id).await?;
        let mut s = match live.sandbox.agent().open(ToAgent::ListeningPorts).await {
            Ok(s) => s,
            Err(e) => return Err(self.agent_failed(id, e).await),
        };
        let answer = crate::manager::first_answer(&mut s).await;
        s.mark_finished();
        match answer {
            Ok(FromAgent::Ports(p)) => Ok(p),
            Ok(_) => Err(Error::Internal(
                "unexpected answer to a port listing".into(),
            )),
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }

    /// The pinned port if it listens, else the lowest listening port; 503 when none.
    pub async fn upstream(&self, who: &Identity, id: &str) -> Result<Upstream, Error> {
        let pinned = *self.live(who, id)?.preview_port.lock();
        let ports = self.listening_ports(who, id).await?;
        match pinned {
            Some(port) if ports.contains(&port) => Ok(Upstream { port, pinned: true }),
            Some(port) => Err(Error::PreviewNotListening(format!(
                "nothing listens on the pinned port {port} yet"
            ))),
            None => ports
                .first()
                .map(|&port| Upstream {
                    port,
                    pinned: false,
                })
                .ok_or_else(|| {
                    Error::PreviewNotListening(
                        "no process listens on a TCP port in this session".into(),
                    )
                }),
        }
    }

    /// Pins the preview to `port` (kept even while nothing listens there yet).
    pub async fn pin_preview(
        &self,
        who: &Identity,
        id: &str,
        port: u16,
    ) -> Result<Upstream, Error> {
        if port == 0 {
            return Err(Error::InvalidArgument("port must be 1..=65535".into()));
        }
        *self.live(who, id)?.preview_port.lock() = Some(port);
        self.upstream(who, id).await
    }

    /// A TCP connection to the session's upstream (made by the agent inside the sandbox).
    pub async fn connect_upstream(
        &self,
        who: &Identity,
        id: &str,
    ) -> Result<(Upstream, UpstreamConn), Error> {
        let upstream = self.upstream(who, id).await?;
        Ok((upstream, self.connect_port(who, id, upstream.port).await?))
    }

    /// A TCP connection to `port` inside the session (made by the agent in the sandbox's own
    /// network namespace); a paused session with auto-resume is resumed first. Nothing
    /// listening there is `PreviewNotListening`.
    pub async fn connect_port(
        &self,
        who: &Identity,
        id: &str,
        port: u16,
    ) -> Result<UpstreamConn, Error> {
        if port == 0 {
            return Err(Error::InvalidArgument("port must be 1..=65535".into()));
        }
        let live = self.awake(who, id).await?;
        let mut s = match live.sandbox.agent().open(ToAgent::Connect { port }).await {
            Ok(s) => s,
            Err(e) => return Err(self.agent_failed(id, e).await),
        };
        match crate::manager::first_answer(&mut s).await {
            Ok(FromAgent::Connected) => {
                let (ours, theirs) = tokio::io::duplex(CHUNK_BYTES * 4);
                tokio::spawn(koder_agent_protocol::relay(theirs, s));
                Ok(ours)
            }
            Ok(_) => Err(Error::Internal("unexpected answer to a connect".into())),
            Err(koder_agent_protocol::ClientError::Agent(e)) => {
                Err(Error::PreviewNotListening(e.message))
            }
            Err(e) => Err(self.agent_failed(id, e).await),
        }
    }
}
