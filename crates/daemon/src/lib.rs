//! The koder-sandbox daemon: configuration and start-up wiring of store, auth, runtime, session
//! manager and the REST transport.

pub mod config;
mod keyfile;
mod node;
mod retention;
mod tls;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use axum::serve::ListenerExt as _;
use chrono::Utc;
use koder_auth::jwt::JwtVerifier;
use koder_auth::limits::{Limiter, Policy};
use koder_auth::{Authenticator, KeyRing};
use koder_jail::{JailConfig, JailRuntime};
use koder_microvm::{Backend, MicroVmConfig, MicroVmRuntime};
use koder_runtime::Runtime;
use koder_store::{Store, Tenant};

use crate::config::{Config, Env, TenantConfig};

/// `koder-sandbox serve` / `ksandbox serve` flags (API.md "Running the daemon").
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Address to listen on (default 127.0.0.1:7070).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Directory for the state database, blobs and sandbox layers (default /var/lib/koder-sandbox).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Static API key bound to a tenant, as TENANT:KEY; repeatable.
    #[arg(long = "api-key", value_name = "TENANT:KEY")]
    pub api_keys: Vec<String>,
    /// Operator key for the admin endpoints (`/v1/sandbox/admin/...`); repeatable.
    #[arg(long = "admin-key", value_name = "KEY")]
    pub admin_keys: Vec<String>,
}

/// File in the data dir holding the dev tenant's key, so it survives restarts.
pub const DEV_KEY_FILE: &str = "dev-api-key";
/// File in the data dir holding the key of the tokens the daemon derives (E2B envd and volume
/// tokens), so tokens handed out before a restart still open what outlived it.
const SECRETS_KEY_FILE: &str = "secrets.key";
const TOKEN_KEY_FILE: &str = "token-key";
pub const DEV_TENANT: &str = "dev";
/// How often expired template uploads of every tenant are looked for (each tenant's own are
/// also when it uploads or builds).
const TEMPLATE_FILES_SWEEP: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// The `[store] url` database, else SQLite in the data dir. The URL is never logged: it may
/// hold a password.
async fn open_store(cfg: &Config, data_dir: &Path) -> anyhow::Result<Store> {
    Ok(match &cfg.store.url {
        Some(url) => Store::open_url(url)
            .await
            .context("opening the [store] url database")?,
        None => Store::open_sqlite(&data_dir.join("state.db")).await?,
    })
}

/// Runs the daemon until SIGINT/SIGTERM.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let cfg = Config::load(&args)?;
    let telemetry = init_tracing(&cfg)?;
    let data_dir = &cfg.server.data_dir;
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    // Sandbox uids traverse the data dir to reach their own layers (nothing else is readable).
    std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o711))?;

    let store = open_store(&cfg, data_dir).await?;
    let auth = Arc::new(authenticator(&cfg, &store, data_dir).await?);
    let agent = agent_bin(&cfg)?;
    let images = image_store(&cfg, &store).await?;
    let runtimes = koder_sessions::Runtimes {
        jail: {
            check_id_ranges(&cfg)?;
            jail_runtime(&cfg, &agent, &images)?
        },
        microvm: microvm_runtime(&cfg, &agent, &images),
    };
    let mut sessions = cfg.sessions.clone();
    sessions.network = cfg.network.clone();
    sessions.secrets = Some(secrets_config(&cfg, data_dir)?);
    sessions.state_dir = Some(data_dir.clone());
    sessions.blobs = cfg.blobs.clone();
    sessions.images = cfg.images.clone();
    sessions.image_store = Some(images);
    let node_id = node::id(&cfg, data_dir)?;
    sessions.node_id = Some(node_id.clone());
    // A cluster's nodes share the images they make: a session may land on any of them.
    sessions.share_images = cfg.cluster.secret_file.is_some();
    sessions.tenant_snapshot_storage_mib = cfg
        .tenants
        .iter()
        .filter_map(|(id, t)| Some((id.clone(), t.snapshot_storage_mib?)))
        .collect();
    sessions.tenant_volume_storage_mib = cfg
        .tenants
        .iter()
        .filter_map(|(id, t)| Some((id.clone(), t.volume_storage_mib?)))
        .collect();
    let webhooks =
        koder_webhooks::Webhooks::start(store.clone(), cfg.webhooks.clone(), cfg.network.clone());
    let offers_microvm = runtimes.microvm.is_ok();
    let manager = koder_sessions::Manager::start_with_runtimes(
        store.clone(),
        runtimes,
        sessions,
        koder_sessions::quota::system_clock(),
    )
    .await?;
    manager.set_event_sink(webhooks.clone());
    // After the manager's start-up pass, which ends what the last run left running.
    let pruned = manager.metrics().retention_pruned.clone();
    retention::spawn(store.clone(), cfg.retention.clone(), pruned);
    let state = koder_http::AppState {
        manager: manager.clone(),
        auth: auth.clone(),
        admin_keys: Arc::new(admin_keys(&cfg)?),
        limits: Arc::new(limiter(&cfg)),
        webhooks: webhooks.clone(),
        builds: koder_build::Builds::start(manager.clone(), store.clone()).await,
    };
    // gRPC shares the HTTP face's domain, credentials and rates.
    let grpc = koder_grpc::GrpcState {
        manager: state.manager.clone(),
        auth: state.auth.clone(),
        limits: state.limits.clone(),
        admin_keys: state.admin_keys.clone(),
    };
    let cluster_key = cluster_key(&cfg)?;
    // In a cluster every node verifies the envd tokens any node gave out.
    let e2b_token_key = match &cluster_key {
        Some(key) => key.derive(E2B_TOKEN_PURPOSE),
        None => token_key(data_dir)?,
    };
    let e2b = koder_e2b::E2b::new(
        state.clone(),
        cfg.sessions.clone(),
        e2b_token_key,
        cfg.e2b.domain.clone(),
        cfg.e2b.templates(),
    );
    e2b.sweep_template_files_every(TEMPLATE_FILES_SWEEP);
    let native = koder_http::router(state).merge(koder_console::router());
    let app = koder_http::drain_unread_bodies(koder_e2b::mount(native, e2b));
    let grpc = koder_grpc::router(grpc)?;
    let (app, grpc) = match cluster(&cfg, cluster_key, &manager, &auth)? {
        Some(cluster) => (
            koder_cluster::mount(app, cluster.clone()),
            koder_cluster::mount_grpc(grpc, cluster),
        ),
        None => (app, grpc),
    };
    let listener = tokio::net::TcpListener::bind(cfg.server.listen)
        .await
        .with_context(|| format!("listening on {}", cfg.server.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "koder-sandbox serving");
    let grpc_listener = bind_grpc(&cfg).await?;
    let grpc_addr = grpc_listener
        .as_ref()
        .map(tokio::net::TcpListener::local_addr)
        .transpose()?;
    let node = node::Node::start(
        &cfg,
        store,
        node::info(&cfg, node_id, addr, grpc_addr, offers_microvm)?,
        manager.clone(),
    )
    .await?;
    // On stdout for whoever started us (with `--listen 127.0.0.1:0` the port is only known now).
    println!("koder-sandbox listening on http://{addr}");
    // Streamed answers (SSE, E2B Connect streams, WebSocket frames) are many small writes: with
    // Nagle's algorithm each one after the first waits for the client's delayed ACK (~40 ms).
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!(error = %e, "TCP_NODELAY on an accepted connection");
        }
    });
    // One signal stops both servers.
    let (stop, stopping) = tokio::sync::watch::channel(false);
    if let Some(listener) = grpc_listener {
        spawn_grpc(listener, grpc, stopping.clone())?;
    }
    spawn_https(&cfg, app.clone(), stopping).await?;
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown_signal().await;
            let _ = stop.send(true);
        })
        .await;
    manager.shutdown().await;
    node.leave().await;
    // After the manager: the sessions it ended at shutdown are events too.
    webhooks.shutdown().await;
    // The exporter's flush blocks on its own thread's HTTP client.
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    served.context("HTTP server")
}

/// This node as a member of a cluster when `[cluster] secret_file` is set.
fn cluster(
    cfg: &Config,
    key: Option<koder_cluster::ClusterKey>,
    manager: &Arc<koder_sessions::Manager>,
    auth: &Arc<koder_auth::Authenticator>,
) -> anyhow::Result<Option<koder_cluster::Cluster>> {
    let Some(key) = key else {
        return Ok(None);
    };
    if cfg.node.advertise.is_none() && cfg.server.listen.ip().is_unspecified() {
        bail!(
            "[cluster]: listening on {} the other nodes cannot be told where to reach this \
             one: set [node] advertise",
            cfg.server.listen
        );
    }
    let grpc_unspecified = cfg
        .server
        .grpc_addr()?
        .is_some_and(|a| a.ip().is_unspecified());
    if grpc_unspecified && cfg.node.advertise.is_none() && cfg.node.advertise_grpc.is_none() {
        bail!(
            "[cluster]: gRPC listening on {} the other nodes cannot be told where to forward \
             gRPC calls: set [node] advertise or advertise_grpc",
            cfg.server.grpc_addr
        );
    }
    let cluster = koder_cluster::Cluster::new(manager.clone(), key, auth.clone())
        .context("[cluster] needs this daemon to be a node")?
        .with_e2b_domain(cfg.e2b.domain.clone());
    tracing::info!("forwarding to and from the other nodes of the cluster");
    Ok(Some(cluster))
}

/// The cluster's shared secret (`[cluster] secret_file`), when this daemon is in one.
fn cluster_key(cfg: &Config) -> anyhow::Result<Option<koder_cluster::ClusterKey>> {
    let Some(path) = &cfg.cluster.secret_file else {
        return Ok(None);
    };
    let secret = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let key = koder_cluster::ClusterKey::new(&secret)
        .with_context(|| format!("[cluster] secret_file {}", path.display()))?;
    Ok(Some(key))
}

/// Binds `[server] grpc_addr`, when set.
async fn bind_grpc(cfg: &Config) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    let Some(addr) = cfg.server.grpc_addr()? else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("gRPC: listening on {addr}"))?;
    Ok(Some(listener))
}

/// Serves gRPC on `listener` beside HTTP until `stopping` turns true.
fn spawn_grpc(
    listener: tokio::net::TcpListener,
    grpc: axum::Router,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "koder-sandbox serving gRPC");
    // After the HTTP line, which whoever started us reads first.
    println!("koder-sandbox gRPC listening on http://{addr}");
    tokio::spawn(async move {
        let stop = async move {
            let _ = stopping.wait_for(|stop| *stop).await;
        };
        if let Err(e) = koder_grpc::serve(listener, grpc, stop).await {
            tracing::error!(error = %e, "gRPC server failed");
        }
    });
    Ok(())
}

/// Binds `[server] tls_listen` (when set) and serves the same routes over HTTPS until
/// `stopping` turns true.
async fn spawn_https(
    cfg: &Config,
    app: axum::Router,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let Some(tls) = cfg.server.tls()? else {
        return Ok(());
    };
    let config = tls::server_config(&tls)?;
    let listener = tokio::net::TcpListener::bind(tls.addr)
        .await
        .with_context(|| format!("HTTPS: listening on {}", tls.addr))?;
    let listener = tls::TlsListener::new(listener, config)?;
    let app = app.layer(axum::Extension(koder_http::ArrivedOverTls));
    let addr = axum::serve::Listener::local_addr(&listener)?;
    tracing::info!(%addr, "koder-sandbox serving HTTPS");
    println!("koder-sandbox HTTPS listening on https://{addr}");
    tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = stopping.wait_for(|stop| *stop).await;
            })
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "HTTPS server failed");
        }
    });
    Ok(())
}

/// Logs, and spans to the configured OTLP collector.
fn init_tracing(cfg: &Config) -> anyhow::Result<koder_telemetry::Telemetry> {
    // Structured logs for machines when asked.
    let json = std::env::var("KODER_LOG_FORMAT").as_deref() == Ok("json");
    let filter = "info,tower_http=off,sqlx=warn";
    Ok(koder_telemetry::init(&cfg.telemetry, filter, json)?)
}

/// Registers configured tenants and sets up who may call: in prod mode JWTs only, otherwise
/// static keys (see [`load_keys`]) and, with `[auth] issuer_url`, JWTs beside them.
async fn authenticator(
    cfg: &Config,
    store: &Store,
    data_dir: &Path,
) -> anyhow::Result<Authenticator> {
    for (id, t) in &cfg.tenants {
        if !koder_auth::valid_tenant(id) {
            bail!("tenant id {id:?}: 1-64 characters of [A-Za-z0-9_-]");
        }
        upsert_tenant(store, id, t).await?;
    }
    let jwt = jwt_verifier(cfg).await?;
    if cfg.env == Env::Prod {
        if !cfg.auth.api_keys.is_empty() {
            bail!(
                "env = \"prod\" refuses static API keys ([auth] api_keys, --api-key): tenants \
                 authenticate with JWTs from [auth] issuer_url"
            );
        }
        let Some(jwt) = jwt else {
            bail!(
                "env = \"prod\" needs JWT auth: set [auth] issuer_url (static API keys and the \
                 dev tenant are refused in prod)"
            );
        };
        return Ok(Authenticator::jwt_only(jwt));
    }
    Ok(
        Authenticator::new(load_keys(cfg, store, data_dir).await?, jwt)
            .with_key_source(Arc::new(StoredKeys(store.clone()))),
    )
}

/// The store's keys, for those another daemon sharing it issued after this one loaded its
/// ring (a key issued at run time works on every node at once).
struct StoredKeys(Store);

impl koder_auth::KeySource for StoredKeys {
    fn tenant_of(
        &self,
        hash: [u8; 32],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Option<String>> + Send + '_>> {
        Box::pin(async move {
            match self.0.get_api_key(&hash).await {
                Ok(key) => key.map(|k| k.tenant_id),
                Err(e) => {
                    tracing::warn!(error = %e, "looking up an API key in the store");
                    None
                }
            }
        })
    }
}

/// The configured issuer's verifier, its keys fetched once now so a wrong URL shows at start
/// (an issuer that is down only delays that: keys are fetched again on demand).
async fn jwt_verifier(cfg: &Config) -> anyhow::Result<Option<JwtVerifier>> {
    let Some(jwt_cfg) = cfg.auth.jwt() else {
        return Ok(None);
    };
    let verifier = JwtVerifier::new(jwt_cfg)?;
    match verifier.prefetch().await {
        Ok(n) => tracing::info!(issuer = cfg.auth.issuer_url, keys = n, "JWT auth enabled"),
        Err(e) => eprintln!(
            "koder-sandbox: JWT issuer {}: keys not fetched yet ({e}); tokens are refused until they are",
            cfg.auth.issuer_url
        ),
    }
    Ok(Some(verifier))
}

/// The configured tenants' rates over their plans' and the server's.
fn limiter(cfg: &Config) -> Limiter {
    let policy = cfg
        .tenants
        .iter()
        .fold(Policy::new(&cfg.limits), |policy, (id, t)| {
            policy.with_tenant(id, &t.plan, t.limits)
        });
    Limiter::new(policy)
}

/// Registers keys (revoking flag keys no longer given) and returns the key ring. Without any
/// key, a dev tenant with a persistent key is made.
async fn load_keys(cfg: &Config, store: &Store, data_dir: &Path) -> anyhow::Result<KeyRing> {
    let mut keep = Vec::new();
    for spec in &cfg.auth.api_keys {
        let (tenant, key) =
            koder_auth::parse_key_spec(spec).map_err(|e| anyhow::anyhow!("--api-key: {e}"))?;
        if store.get_tenant(&tenant).await?.is_none() {
            upsert_tenant(
                store,
                &tenant,
                cfg.tenants.get(&tenant).unwrap_or(&TenantConfig::default()),
            )
            .await?;
        }
        let hash = koder_auth::hash_key(&key);
        store.put_api_key(&hash, &tenant, "static").await?;
        keep.push(hash);
    }
    store.delete_api_keys_not_in("static", &keep).await?;
    if cfg.auth.api_keys.is_empty() {
        let key = dev_key(data_dir)?;
        upsert_tenant(
            store,
            DEV_TENANT,
            &TenantConfig {
                plan: "dev".into(),
                ..Default::default()
            },
        )
        .await?;
        let hash = koder_auth::hash_key(&key);
        store.put_api_key(&hash, DEV_TENANT, "dev").await?;
        store.delete_api_keys_not_in("dev", &[hash]).await?;
        eprintln!(
            "koder-sandbox: dev tenant API key: {key} (also in {})",
            data_dir.join(DEV_KEY_FILE).display()
        );
    } else {
        store.delete_api_keys_not_in("dev", &[]).await?;
    }
    let mut ring = KeyRing::default();
    for k in store.api_keys().await? {
        ring.insert_hash(k.key_hash, k.tenant_id);
    }
    Ok(ring)
}

/// Operator keys live only in configuration (never in the store).
fn admin_keys(cfg: &Config) -> anyhow::Result<KeyRing> {
    let mut ring = KeyRing::default();
    for key in &cfg.auth.admin_keys {
        if key.len() < 16 {
            bail!("admin keys must be at least 16 characters");
        }
        ring.insert_hash(koder_auth::hash_key(key), "admin");
    }
    Ok(ring)
}

async fn upsert_tenant(store: &Store, id: &str, t: &TenantConfig) -> anyhow::Result<()> {
    let created_at = store
        .get_tenant(id)
        .await?
        .map_or_else(Utc::now, |t| t.created_at);
    store
        .upsert_tenant(&Tenant {
            id: id.into(),
            name: t.name.clone().unwrap_or_else(|| id.into()),
            plan: t.plan.clone(),
            max_sessions: t.max_sessions,
            daily_session_minutes: t.daily_session_minutes,
            created_at,
        })
        .await?;
    Ok(())
}

fn dev_key(data_dir: &Path) -> anyhow::Result<String> {
    keyfile::read_or_create(
        &data_dir.join(DEV_KEY_FILE),
        |k| k.len() >= koder_auth::MIN_KEY_LEN,
        koder_auth::generate_key,
    )
}

/// What the E2B envd token key is derived for from a cluster's secret.
const E2B_TOKEN_PURPOSE: &str = "e2b-envd-token";

fn token_key(data_dir: &Path) -> anyhow::Result<[u8; 32]> {
    hex_key(&data_dir.join(TOKEN_KEY_FILE))
}

/// The secrets key (`[secrets] key_file`, generated into the data dir by default) and the
/// upstream verification (system roots plus `[secrets] upstream_ca_file`).
fn secrets_config(
    cfg: &Config,
    data_dir: &Path,
) -> anyhow::Result<koder_sessions::secrets::SecretsConfig> {
    let key_file = cfg
        .secrets
        .key_file
        .clone()
        .unwrap_or_else(|| data_dir.join(SECRETS_KEY_FILE));
    let extra_ca = match &cfg.secrets.upstream_ca_file {
        Some(path) => {
            Some(std::fs::read(path).with_context(|| format!("reading {}", path.display()))?)
        }
        None => None,
    };
    Ok(koder_sessions::secrets::SecretsConfig {
        key: koder_sessions::secrets::SealKey::new(hex_key(&key_file)?),
        upstreams: koder_sessions::secrets::Upstreams::new(extra_ca.as_deref())?,
    })
}

/// The 32-byte key in `path` (hex), generated there when absent.
fn hex_key(path: &Path) -> anyhow::Result<[u8; 32]> {
    let hex_key = keyfile::read_or_create(
        path,
        |k| hex::decode(k).is_ok_and(|b| b.len() == 32),
        || hex::encode(rand::random::<[u8; 32]>()),
    )?;
    let mut key = [0u8; 32];
    hex::decode_to_slice(hex_key, &mut key)
        .with_context(|| format!("{} is not 32 hex bytes", path.display()))?;
    Ok(key)
}

fn agent_bin(cfg: &Config) -> anyhow::Result<PathBuf> {
    Ok(match &cfg.jail.agent_bin {
        Some(p) => p.clone(),
        None => match std::env::var_os("KODER_AGENT_BIN") {
            Some(p) => PathBuf::from(p),
            None => std::env::current_exe()?
                .parent()
                .context("daemon executable has no directory")?
                .join("koder-agent"),
        },
    })
}

/// The microVM runtime, or why this server does not offer it (logged; `runtime: "microvm"`
/// then answers 503 with the reason).
fn microvm_runtime(
    cfg: &Config,
    agent: &Path,
    images: &koder_image::ImageStore,
) -> Result<Arc<dyn Runtime>, String> {
    let section = &cfg.microvm;
    if !section.enabled {
        return Err("disabled in the server configuration".into());
    }
    let images_dir = section
        .images_dir
        .clone()
        .unwrap_or_else(|| cfg.server.data_dir.join("images"));
    let mut mc = MicroVmConfig::new(cfg.server.data_dir.join("microvm"), images_dir, agent);
    // Store images boot from root disks built in the store, beside their trees.
    mc.images = Some(images.clone());
    mc.backend = match section.backend.as_str() {
        "auto" => Backend::Auto,
        "qemu" => Backend::Qemu,
        "firecracker" => Backend::Firecracker,
        other => {
            return Err(format!(
                "unknown microvm backend {other:?}; one of auto, qemu, firecracker"
            ))
        }
    };
    if let Some(v) = &cfg.jail.cgroup_parent {
        mc.cgroup_parent = Some(v.clone());
    }
    if let Some(v) = section.vm_memory_mib {
        mc.vm_memory_mib = v;
    }
    for (slot, value) in [
        (&mut mc.qemu_bin, &section.qemu_bin),
        (&mut mc.firecracker_bin, &section.firecracker_bin),
    ] {
        if let Some(v) = value {
            *slot = v.clone();
        }
    }
    if let Some(v) = section.uid_base {
        mc.uid_base = v;
    }
    if let Some(v) = section.max_vms {
        mc.max_vms = v;
    }
    if let Some(v) = section.boot_timeout_s {
        mc.boot_timeout = std::time::Duration::from_secs(v);
    }
    match MicroVmRuntime::new(mc) {
        Ok(rt) => {
            for gap in &rt.enforcement().not_enforced {
                eprintln!(
                    "koder-sandbox: microvm: NOT ENFORCED: {} ({})",
                    gap.what, gap.why
                );
            }
            Ok(Arc::new(rt))
        }
        Err(e) => {
            let why = match e {
                koder_runtime::RuntimeError::Unavailable(why) => why,
                other => other.to_string(),
            };
            eprintln!("koder-sandbox: microvm runtime unavailable: {why}");
            Err(why)
        }
    }
}

/// Sandboxes the jail runtime holds at most (`[jail] max_sandboxes` or its default).
fn jail_max_sandboxes(cfg: &Config) -> u32 {
    cfg.jail
        .max_sandboxes
        .unwrap_or_else(|| JailConfig::new("", "").max_sandboxes)
}

/// The jail's and the microVMs' host id ranges, which must not meet: a jail and a VMM with
/// the same host uid could signal and read each other.
fn check_id_ranges(cfg: &Config) -> anyhow::Result<()> {
    use koder_runtime::slots::host_ids;
    let jail_default = JailConfig::new("", "");
    let jail = host_ids(
        cfg.jail.uid_base.unwrap_or(jail_default.uid_base),
        jail_max_sandboxes(cfg),
        koder_jail::SANDBOX_IDS,
    )?;
    if !cfg.microvm.enabled {
        return Ok(());
    }
    let vm_default = MicroVmConfig::new("", "", "");
    let vms = host_ids(
        cfg.microvm.uid_base.unwrap_or(vm_default.uid_base),
        cfg.microvm.max_vms.unwrap_or(vm_default.max_vms),
        1,
    )?;
    if jail.start < vms.end && vms.start < jail.end {
        bail!(
            "the jail's host ids {jail:?} and the microVMs' {vms:?} overlap: set [jail] uid_base \
             or [microvm] uid_base apart"
        );
    }
    Ok(())
}

/// The image store under `<data_dir>/images`, rid of what builds killed mid-way left, of the
/// builds no name points at any more and no unstopped session or live snapshot was made on,
/// and of build steps no build used lately (no sandbox or build runs yet).
async fn image_store(cfg: &Config, state: &Store) -> anyhow::Result<koder_image::ImageStore> {
    let store = koder_image::ImageStore::open(&cfg.server.data_dir.join("images"))?;
    let keep = state.kept_image_digests(chrono::Utc::now()).await?;
    let removed = store.collect_garbage(&keep, cfg.images.steps_unused_for())?;
    if !removed.is_empty() {
        tracing::info!(?removed, "removed unnamed and unfinished images");
    }
    Ok(store)
}

fn jail_runtime(
    cfg: &Config,
    agent: &Path,
    images: &koder_image::ImageStore,
) -> anyhow::Result<Arc<dyn Runtime>> {
    let mut jc = JailConfig::new(cfg.server.data_dir.join("jail"), agent);
    jc.images = Some(images.clone());
    if let Some(v) = cfg.jail.uid_base {
        jc.uid_base = v;
    }
    if let Some(v) = cfg.jail.max_sandboxes {
        jc.max_sandboxes = v;
    }
    if let Some(v) = &cfg.jail.cgroup_parent {
        jc.cgroup_parent = v.clone();
    }
    let runtime = JailRuntime::new(jc)?;
    for gap in &runtime.enforcement().not_enforced {
        eprintln!("koder-sandbox: NOT ENFORCED: {} ({})", gap.what, gap.why);
    }
    Ok(Arc::new(runtime))
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
    tracing::info!("shutting down: destroying sandboxes");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(toml: &str) -> Config {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, toml).unwrap();
        Config::load(&ServeArgs {
            config: Some(path),
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn host_id_ranges_are_checked_at_start() {
        assert!(check_id_ranges(&config("")).is_ok());
        // The default microVM range sits below the jail's.
        assert!(check_id_ranges(&config("[microvm]\nenabled = true\n")).is_ok());
        let wraps = check_id_ranges(&config("[jail]\nmax_sandboxes = 70000\n")).unwrap_err();
        assert!(wraps.to_string().contains("do not fit"), "{wraps}");
        let low = check_id_ranges(&config("[jail]\nuid_base = 1000\n")).unwrap_err();
        assert!(low.to_string().contains("do not fit"), "{low}");
        let overlap =
            check_id_ranges(&config("[microvm]\nenabled = true\nuid_base = 200100\n")).unwrap_err();
        assert!(overlap.to_string().contains("overlap"), "{overlap}");
    }
}
