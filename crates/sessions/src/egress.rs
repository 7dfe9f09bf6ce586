//! The daemon's half of sandbox egress: every outgoing connection and name lookup of a
//! session with network access arrives here from the agent, is decided by the session's
//! pinned policy, written to the audit log, and (if allowed) dialled from the host and spliced.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use koder_agent_protocol::{relay, AgentClient, AgentStream, FromAgent, StreamHandle, ToAgent};
use koder_api_types::{Network, NetworkMode};
use koder_netpolicy::{Mode, NetConfig, Policy};
use koder_store::{AuditRecord, SessionRecord, Store};
use tokio::net::TcpStream;

use crate::session::Live;
use crate::Error;

const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// The pinned policy of a create request, or a 400 naming the bad entry.
pub(crate) async fn policy_for(requested: &Network, cfg: &NetConfig) -> Result<Policy, Error> {
    let mode = match requested.mode {
        NetworkMode::None => Mode::None,
        NetworkMode::Open => Mode::Open,
        NetworkMode::Allowlist => Mode::Allowlist,
    };
    if mode != Mode::Allowlist && !requested.allow.is_empty() {
        return Err(Error::InvalidArgument(
            "network.allow needs mode \"allowlist\"".into(),
        ));
    }
    if mode == Mode::None {
        return Ok(Policy::none());
    }
    Policy::build(mode, &requested.allow, cfg)
        .await
        .map_err(|e| Error::InvalidArgument(e.to_string()))
}

/// Subscribes to the new session's egress and serves it until the sandbox goes away.
pub(crate) async fn start(
    store: &Store,
    cfg: &NetConfig,
    live: &Live,
    record: &SessionRecord,
    policy: Policy,
) {
    let agent = live.sandbox.agent().clone();
    let stream = match agent.open(ToAgent::EgressSubscribe).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(session = %record.id, error = %e, "egress subscription failed; the session has no network");
            return;
        }
    };
    let ctx = Ctx {
        store: store.clone(),
        cfg: cfg.clone(),
        tenant_id: record.tenant_id.clone(),
        session_id: record.id.clone(),
    };
    tokio::spawn(serve(stream, agent, policy, ctx));
}

struct Ctx {
    store: Store,
    cfg: NetConfig,
    tenant_id: String,
    session_id: String,
}

impl Ctx {
    async fn audit(
        &self,
        proto: &str,
        dest: String,
        port: u16,
        name: Option<String>,
        allowed: bool,
        reason: &str,
    ) {
        let rec = AuditRecord {
            id: 0,
            at: Utc::now(),
            tenant_id: self.tenant_id.clone(),
            session_id: self.session_id.clone(),
            proto: proto.into(),
            dest,
            port,
            name,
            allowed,
            reason: reason.into(),
        };
        if let Err(e) = self.store.insert_audit(&rec).await {
            tracing::error!(error = %e, "writing the network audit log");
        }
    }
}

async fn serve(mut stream: AgentStream, agent: AgentClient, mut policy: Policy, ctx: Ctx) {
    let ctx = Arc::new(ctx);
    let answer = stream.handle();
    loop {
        match stream.recv().await {
            Ok(FromAgent::EgressConnect {
                conn,
                ip,
                port,
                sni,
                host,
            }) => {
                let name = sni.or(host);
                let d = policy.decide(ip, port, name.as_deref());
                ctx.audit("tcp", ip.to_string(), port, name, d.allowed, &d.reason)
                    .await;
                if d.allowed {
                    tokio::spawn(dial(
                        agent.clone(),
                        answer.clone(),
                        ctx.clone(),
                        conn,
                        SocketAddr::new(ip, port),
                    ));
                } else {
                    let _ = answer.send(ToAgent::EgressDeny { conn }).await;
                }
            }
            Ok(FromAgent::DnsQuery { id, name, qtype }) => {
                let found = policy.lookup(&name, &ctx.cfg).await;
                let (allowed, reason) = match &found {
                    Some(a) => (true, format!("answered {}", join(a))),
                    None => (false, "name not allowed or not found".to_string()),
                };
                ctx.audit(
                    "dns",
                    name.clone(),
                    53,
                    Some(format!("qtype {qtype}")),
                    allowed,
                    &reason,
                )
                .await;
                let _ = answer
                    .send(ToAgent::DnsAnswer {
                        id,
                        addrs: found.unwrap_or_default(),
                    })
                    .await;
            }
            Ok(_) => {}
            Err(_) => return, // the sandbox ended
        }
    }
}

async fn dial(agent: AgentClient, answer: StreamHandle, ctx: Arc<Ctx>, conn: u64, to: SocketAddr) {
    let tcp = match tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(to)).await {
        // The splice forwards the sandbox's writes as they come: no Nagle delay on top.
        Ok(Ok(tcp)) => {
            let _ = tcp.set_nodelay(true);
            tcp
        }
        failed => {
            let why = match failed {
                Ok(Err(e)) => format!("connect failed: {e}"),
                _ => "connect timed out".into(),
            };
            ctx.audit("tcp", to.ip().to_string(), to.port(), None, false, &why)
                .await;
            let _ = answer.send(ToAgent::EgressDeny { conn }).await;
            return;
        }
    };
    match agent.open(ToAgent::EgressAttach { conn }).await {
        Ok(stream) => relay(tcp, stream).await,
        Err(e) => tracing::debug!(error = %e, "attaching an egress connection"),
    }
}

fn join(addrs: &[IpAddr]) -> String {
    addrs
        .iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(",")
}
