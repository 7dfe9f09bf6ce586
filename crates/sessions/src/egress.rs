//! The daemon's half of sandbox egress: every outgoing connection and name lookup of a
//! session with network access arrives here from the agent, is decided by the session's
//! pinned policy, written to the audit log, and (if allowed) dialled from the host and spliced.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use koder_agent_protocol::{relay, AgentClient, AgentStream, FromAgent, StreamHandle, ToAgent};
use koder_api_types::{Network, NetworkMode};
use koder_netpolicy::{unpinned, Mode, NetConfig, Policy};
use koder_store::{AuditRecord, SessionRecord, Store};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use crate::inject;
use crate::metrics::Metrics;
use crate::secrets::{Dest, SharedBindings, Vault};
use crate::session::Live;
use crate::Error;

const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// A session's policy, read by its egress loop for every connection and lookup and replaced
/// by `PUT .../network`: a change applies to the next connection.
pub(crate) type SharedPolicy = Arc<Mutex<Policy>>;

/// The pinned policy of a request (create, update, or a stored session's own), or a 400
/// naming the bad entry.
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
        if !requested.deny.is_empty() {
            return Err(Error::InvalidArgument(
                "network.deny needs mode \"open\" or \"allowlist\"".into(),
            ));
        }
        return Ok(Policy::none());
    }
    // A stored policy is its description: entries carry what they were pinned to.
    let allow: Vec<String> = requested
        .allow
        .iter()
        .map(|e| unpinned(e).to_string())
        .collect();
    Ok(Policy::build(mode, &allow, &requested.deny, cfg).await?)
}

/// The policy as a session shows (and stores) it.
pub(crate) fn network_of(mode: NetworkMode, policy: &Policy) -> Network {
    Network {
        mode,
        allow: policy.describe(),
        deny: policy.describe_deny(),
    }
}

/// Records that the session's policy was replaced by `network`.
pub(crate) async fn audit_change(store: &Store, record: &SessionRecord) {
    let ctx = Ctx {
        store: store.clone(),
        cfg: NetConfig::default(),
        tenant_id: record.tenant_id.clone(),
        session_id: record.id.clone(),
        secrets: Arc::default(),
        vault: None,
    };
    let n = &record.network;
    let reason = format!(
        "network policy changed: mode {}, allow [{}], deny [{}]",
        match n.mode {
            NetworkMode::None => "none",
            NetworkMode::Open => "open",
            NetworkMode::Allowlist => "allowlist",
        },
        n.allow.join(", "),
        n.deny.join(", ")
    );
    ctx.audit("policy", "network".into(), 0, None, true, &reason)
        .await;
}

/// Subscribes to the new session's egress and serves it until the sandbox goes away.
pub(crate) async fn start(
    (store, metrics, vault): (&Store, &Arc<Metrics>, Option<Vault>),
    cfg: &NetConfig,
    live: &Live,
    record: &SessionRecord,
    policy: SharedPolicy,
) {
    let ctx = Ctx {
        store: store.clone(),
        cfg: cfg.clone(),
        tenant_id: record.tenant_id.clone(),
        session_id: record.id.clone(),
        secrets: live.secrets.clone(),
        vault,
    };
    subscribe(live.sandbox.agent(), policy, ctx, metrics.clone()).await;
}

/// Serves the egress of a sandbox that is no session (an image build's): decided by
/// `policy`, audited under `label` with no tenant, no secrets.
pub(crate) async fn start_unrecorded(
    (store, metrics): (&Store, &Arc<Metrics>),
    cfg: &NetConfig,
    agent: &AgentClient,
    label: &str,
    policy: Policy,
) {
    let ctx = Ctx {
        store: store.clone(),
        cfg: cfg.clone(),
        tenant_id: String::new(),
        session_id: label.into(),
        secrets: Arc::default(),
        vault: None,
    };
    subscribe(agent, Arc::new(Mutex::new(policy)), ctx, metrics.clone()).await;
}

async fn subscribe(agent: &AgentClient, policy: SharedPolicy, ctx: Ctx, metrics: Arc<Metrics>) {
    let stream = match agent.open(ToAgent::EgressSubscribe).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(session = %ctx.session_id, error = %e, "egress subscription failed; the sandbox has no network");
            return;
        }
    };
    tokio::spawn(serve(stream, agent.clone(), policy, (ctx, metrics)));
}

struct Ctx {
    store: Store,
    cfg: NetConfig,
    tenant_id: String,
    session_id: String,
    /// Set once the session is recorded (before any of its code runs).
    secrets: SharedBindings,
    /// Where its bound secrets are read again for each connection (none: nothing bound).
    vault: Option<Vault>,
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

async fn serve(
    mut stream: AgentStream,
    agent: AgentClient,
    policy: SharedPolicy,
    (ctx, metrics): (Ctx, Arc<Metrics>),
) {
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
                let tls_hello = sni.is_some();
                let name = sni.or(host);
                let d = policy.lock().await.decide(ip, port, name.as_deref());
                metrics.count_egress("tcp", d.allowed);
                ctx.audit(
                    "tcp",
                    ip.to_string(),
                    port,
                    name.clone(),
                    d.allowed,
                    &d.reason,
                )
                .await;
                if d.allowed {
                    let bindings = ctx.secrets.read().clone();
                    let dest = match (bindings, &name) {
                        (Some(b), Some(n)) => b.for_dest(ip, port, Some(n), &ctx.cfg).await,
                        _ => Dest::default(),
                    };
                    let inject = name.filter(|_| !dest.is_empty()).map(|host| Inject {
                        host,
                        dest,
                        tls: tls_hello,
                    });
                    tokio::spawn(dial(
                        agent.clone(),
                        answer.clone(),
                        ctx.clone(),
                        conn,
                        SocketAddr::new(ip, port),
                        inject,
                    ));
                } else {
                    let _ = answer.send(ToAgent::EgressDeny { conn }).await;
                }
            }
            Ok(FromAgent::DnsQuery { id, name, qtype }) => {
                let found = policy.lock().await.lookup(&name, &ctx.cfg).await;
                let (allowed, reason) = match &found {
                    Some(a) => (true, format!("answered {}", join(a))),
                    None => (false, "name not allowed or not found".to_string()),
                };
                metrics.count_egress("dns", allowed);
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

/// A connection to a secret's host (or a host of a header rule): the name it named, what its
/// requests get, and whether it speaks TLS (it sent a ClientHello naming the host).
struct Inject {
    host: String,
    dest: Dest,
    tls: bool,
}

/// Dials an allowed connection and splices it; one to a secret's host goes through the
/// injecting pump (`inject`), behind TLS interception (`tls`) when it speaks TLS.
async fn dial(
    agent: AgentClient,
    answer: StreamHandle,
    ctx: Arc<Ctx>,
    conn: u64,
    to: SocketAddr,
    inject: Option<Inject>,
) {
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
    let stream = match agent.open(ToAgent::EgressAttach { conn }).await {
        Ok(stream) => stream,
        Err(e) => return tracing::debug!(error = %e, "attaching an egress connection"),
    };
    match inject {
        Some(inject) => {
            let (sandbox_side, proxy_side) = tokio::io::duplex(64 * 1024);
            tokio::spawn(inject_into(ctx, to, inject, proxy_side, tcp));
            relay(sandbox_side, stream).await;
        }
        None => relay(tcp, stream).await,
    }
}

/// Carries a connection to a secret's host through the injecting pump, its TLS (if any)
/// terminated with the session's CA and re-encrypted to the upstream.
async fn inject_into(
    ctx: Arc<Ctx>,
    to: SocketAddr,
    inject: Inject,
    sandbox: tokio::io::DuplexStream,
    tcp: TcpStream,
) {
    let Inject { host, dest, tls } = inject;
    let dest = match &ctx.vault {
        // Read here, on the connection's own task: the egress loop does not wait on the store.
        Some(vault) => {
            let to = (to.ip(), to.port(), host.as_str());
            dest.current(vault, &ctx.tenant_id, to, &ctx.cfg).await
        }
        None => dest,
    };
    let audit_ctx = ctx.clone();
    let audit_host = host.clone();
    let applied = move |names: Vec<String>| {
        let reason = format!("applied to the request headers: {}", names.join(", "));
        tokio::spawn(async move {
            audit_ctx
                .audit(
                    "secret",
                    to.ip().to_string(),
                    to.port(),
                    Some(audit_host),
                    true,
                    &reason,
                )
                .await;
        });
    };
    if !tls {
        return inject::pump(sandbox, tcp, host, dest, applied).await;
    }
    let ca = ctx.secrets.read().as_ref().and_then(|b| b.ca.clone());
    let Some(ca) = ca else {
        return;
    };
    match ca.intercept(sandbox, tcp, &host).await {
        Ok((sandbox, upstream)) => inject::pump(sandbox, upstream, host, dest, applied).await,
        Err(e) => {
            let why = e.to_string();
            ctx.audit(
                "tcp",
                to.ip().to_string(),
                to.port(),
                Some(host),
                false,
                &why,
            )
            .await;
        }
    }
}

fn join(addrs: &[IpAddr]) -> String {
    addrs
        .iter()
        .map(IpAddr::to_string)
        .collect::<Vec<_>>()
        .join(",")
}
