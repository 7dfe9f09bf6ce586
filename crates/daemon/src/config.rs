//! The daemon's configuration: embedded defaults, an optional TOML file, then flags.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use koder_sessions::SessionConfig;
use serde::Deserialize;

use crate::ServeArgs;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Env {
    #[default]
    Dev,
    Prod,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub env: Env,
    pub server: ServerConfig,
    pub auth: AuthConfig,
    pub sessions: SessionConfig,
    pub jail: JailSection,
    pub microvm: MicroVmSection,
    /// Egress policy: internal (SSRF-exempt) ranges, static host names, resolver.
    pub network: koder_netpolicy::NetConfig,
    /// Tenants and their plans/quotas, by tenant id.
    pub tenants: BTreeMap<String, TenantConfig>,
    /// Per-tenant request rate, concurrent execs and open streams: the server's, and per plan
    /// (`[limits.plans.P]`); a tenant's own in `[tenants.X.limits]`.
    pub limits: koder_auth::limits::LimitsConfig,
    /// Where snapshots and durable pauses are kept: `<data_dir>/blobs` by default, or an
    /// S3-compatible bucket (`url = "s3://bucket/prefix"`, `endpoint`, keys).
    pub blobs: koder_blobs::BlobConfig,
    /// Images: `language_packs = { python = "python" }` runs a language's sessions on a pack.
    pub images: koder_sessions::config::ImagesConfig,
    /// Webhook deliveries: retries, backoff, and whether private targets are allowed.
    pub webhooks: koder_webhooks::WebhookConfig,
    /// OpenTelemetry: `otlp_endpoint` (OTLP/HTTP) exports spans; off by default.
    pub telemetry: koder_telemetry::TelemetryConfig,
    /// Secrets injected at egress: `key_file` holds the key they are sealed with.
    pub secrets: SecretsSection,
    /// Where the state lives: `<data_dir>/state.db` (SQLite) unless `url` names a database.
    pub store: StoreSection,
    /// This daemon as a node of the store: id, advertised address, heartbeat.
    pub node: NodeSection,
    /// E2B compatibility: the sandbox domain served by host name.
    pub e2b: E2bSection,
    /// Nodes serving each other's sessions: `secret_file` holds the secret they share.
    pub cluster: ClusterSection,
    /// Days stopped sessions' records, the network audit and the webhook delivery log are
    /// kept, 30 each by default.
    pub retention: crate::retention::RetentionSection,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct E2bSection {
    /// The sandbox domain: answered as `domain` on create and connect, so E2B's SDK names a
    /// sandbox's port `<port>-<id>.<domain>`; requests for such names (a wildcard DNS record
    /// of the domain pointing at the daemon, and for `https://` a wildcard certificate in
    /// `[server] tls_*`) reach that port of that sandbox. Unset: no host-based routing.
    pub domain: Option<String>,
    /// MiB a tenant's uploaded template files (the sources of E2B's `COPY` steps) may hold
    /// together, default 4096: the least recently used make room for a new upload.
    pub template_files_mib: Option<u64>,
    /// Days an upload nobody uploaded again, asked about or built from is kept, default 7.
    pub template_files_keep_days: Option<u64>,
    /// Images a tenant's templates may hold together (each build of a tag that is not moved
    /// to it makes one), default 100.
    pub max_template_images: Option<u64>,
    /// A tenant's template builds under way at once (queued or running), default 4.
    pub max_template_builds: Option<u64>,
}

impl E2bSection {
    /// Bounds within their ranges; the domain a DNS name of at least two labels, each 1-63 of
    /// `[a-z0-9-]` not starting or ending with `-`, kept lowercase.
    fn check(&mut self) -> anyhow::Result<()> {
        for (key, value, max) in [
            ("max_template_images", self.max_template_images, 100_000),
            ("max_template_builds", self.max_template_builds, 1_000),
            ("template_files_mib", self.template_files_mib, 1 << 30),
            (
                "template_files_keep_days",
                self.template_files_keep_days,
                36_500,
            ),
        ] {
            if value.is_some_and(|v| v == 0 || v > max) {
                anyhow::bail!("[e2b] {key}: 1..={max}");
            }
        }
        let Some(domain) = &mut self.domain else {
            return Ok(());
        };
        *domain = domain.trim_end_matches('.').to_ascii_lowercase();
        let label = |l: &str| {
            (1..=63).contains(&l.len())
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        if domain.len() > 200 || domain.split('.').count() < 2 || !domain.split('.').all(label) {
            anyhow::bail!("[e2b] domain {domain:?}: a DNS name such as \"sandbox.example.com\"");
        }
        Ok(())
    }

    /// The bounds of the tenants' templates and uploads (checked: no overflow).
    pub fn templates(&self) -> koder_e2b::TemplateLimits {
        let default = koder_e2b::TemplateLimits::default();
        koder_e2b::TemplateLimits {
            max_images: self
                .max_template_images
                .map_or(default.max_images, |n| n as usize),
            max_under_way: self
                .max_template_builds
                .map_or(default.max_under_way, |n| n as usize),
            files: koder_e2b::TemplateFiles {
                max_bytes: self
                    .template_files_mib
                    .map_or(default.files.max_bytes, |mib| mib << 20),
                keep_for: self
                    .template_files_keep_days
                    .map_or(default.files.keep_for, |d| Duration::from_secs(d * 86_400)),
            },
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSection {
    /// A file holding the cluster's shared secret (at least 32 bytes; e.g. 64 hex characters
    /// from `openssl rand -hex 32`), the same on every node. With it, a request for a session
    /// another node holds is forwarded there and creates go to the node with room; without it,
    /// each node serves only what it holds.
    pub secret_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeSection {
    /// Default: an id generated once into `<data_dir>/node-id`.
    pub id: Option<String>,
    /// Base URL the other nodes reach this one at; default `http://<listen address>`.
    pub advertise: Option<String>,
    /// `http://host:port` the other nodes forward gRPC calls to, when `[server] grpc_addr` is
    /// set; default `advertise`'s host with the gRPC port, else `http://<grpc_addr>`.
    pub advertise_grpc: Option<String>,
    /// Seconds between heartbeats.
    pub heartbeat_s: f64,
    /// Seconds without a heartbeat after which a node counts as lost.
    pub lost_after_s: f64,
}

impl Default for NodeSection {
    fn default() -> Self {
        NodeSection {
            id: None,
            advertise: None,
            advertise_grpc: None,
            heartbeat_s: 5.0,
            lost_after_s: 30.0,
        }
    }
}

impl NodeSection {
    /// Positive, finite, and a node is lost only after several missed heartbeats.
    fn check(&self) -> anyhow::Result<()> {
        let fine = |s: f64| s.is_finite() && s > 0.0 && s < 1e9;
        if !fine(self.heartbeat_s) || !fine(self.lost_after_s) {
            anyhow::bail!("[node] heartbeat_s and lost_after_s are positive seconds");
        }
        if self.lost_after_s < 2.0 * self.heartbeat_s {
            anyhow::bail!("[node] lost_after_s must be at least twice heartbeat_s");
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSection {
    /// `postgres://user:password@host:port/database` (a PostgreSQL database several daemons
    /// may share; it must exist) or `sqlite://<path>`; unset: SQLite in the data dir.
    pub url: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecretsSection {
    /// 32 bytes as hex; default `<data_dir>/secrets.key`, generated when absent.
    pub key_file: Option<PathBuf>,
    /// PEM certificates trusted for upstreams (besides the system roots) when a secret's
    /// TLS connection is re-encrypted: a private CA of the hosts secrets go to.
    pub upstream_ca_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Where the gRPC service listens (`host:port`); empty: no gRPC.
    pub grpc_addr: String,
    /// Where HTTPS is served (`host:port`), the same routes as `listen`; empty: no HTTPS.
    pub tls_listen: String,
    /// PEM certificate chain and private key of the HTTPS listener (for `[e2b] domain`, a
    /// certificate for `*.<domain>`).
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
}

/// The HTTPS listener's address and PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsListen {
    pub addr: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ServerConfig {
    /// The gRPC address, `None` when gRPC is off.
    pub fn grpc_addr(&self) -> anyhow::Result<Option<SocketAddr>> {
        if self.grpc_addr.is_empty() {
            return Ok(None);
        }
        let addr = self
            .grpc_addr
            .parse()
            .map_err(|e| anyhow::anyhow!("[server] grpc_addr {:?}: {e}", self.grpc_addr))?;
        Ok(Some(addr))
    }

    /// The HTTPS listener, `None` when HTTPS is off; an address without both files (or files
    /// without an address) is an error.
    pub fn tls(&self) -> anyhow::Result<Option<TlsListen>> {
        match (self.tls_listen.as_str(), &self.tls_cert, &self.tls_key) {
            ("", None, None) => Ok(None),
            ("", _, _) => anyhow::bail!("[server] tls_cert and tls_key need tls_listen"),
            (listen, Some(cert), Some(key)) => Ok(Some(TlsListen {
                addr: listen
                    .parse()
                    .map_err(|e| anyhow::anyhow!("[server] tls_listen {listen:?}: {e}"))?,
                cert: cert.clone(),
                key: key.clone(),
            })),
            _ => anyhow::bail!("[server] tls_listen needs tls_cert and tls_key (PEM files)"),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            data_dir: PathBuf::from("/var/lib/koder-sandbox"),
            grpc_addr: String::new(),
            tls_listen: String::new(),
            tls_cert: None,
            tls_key: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Static keys, `TENANT:KEY` (refused with `env = "prod"`).
    pub api_keys: Vec<String>,
    /// Operator keys for the admin endpoints.
    pub admin_keys: Vec<String>,
    /// The JWT issuer, exactly as tokens' `iss` carry it; empty: JWTs are not accepted.
    pub issuer_url: String,
    /// The issuer's JWKS; empty: the `jwks_uri` of `<issuer_url>/.well-known/openid-configuration`.
    pub jwks_url: String,
    /// An `aud` every token must include.
    pub audience: String,
    /// The claim naming the caller's tenant.
    pub tenant_claim: String,
    /// The claim listing the caller's scopes (`sandbox:read`, `sandbox:write`, `sandbox:exec`,
    /// `sandbox:admin`), space-separated or an array.
    pub scopes_claim: String,
    /// Clock skew tolerated on `exp` and `nbf`, seconds.
    pub leeway_s: u64,
    /// Least time between two fetches of the JWKS (a token with an unknown `kid` triggers one).
    pub jwks_min_refresh_s: u64,
    /// Keys older than this are refetched, seconds.
    pub jwks_max_age_s: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        let jwt = koder_auth::jwt::JwtConfig::new("");
        Self {
            api_keys: Vec::new(),
            admin_keys: Vec::new(),
            issuer_url: String::new(),
            jwks_url: String::new(),
            audience: jwt.audience,
            tenant_claim: jwt.tenant_claim,
            scopes_claim: jwt.scopes_claim,
            leeway_s: jwt.leeway.as_secs(),
            jwks_min_refresh_s: jwt.min_refresh.as_secs(),
            jwks_max_age_s: jwt.max_age.as_secs(),
        }
    }
}

impl AuthConfig {
    /// The JWT verifier's settings, when an issuer is configured.
    pub fn jwt(&self) -> Option<koder_auth::jwt::JwtConfig> {
        if self.issuer_url.is_empty() {
            return None;
        }
        let mut jwt = koder_auth::jwt::JwtConfig::new(&self.issuer_url);
        jwt.jwks_url = (!self.jwks_url.is_empty()).then(|| self.jwks_url.clone());
        jwt.audience = self.audience.clone();
        jwt.tenant_claim = self.tenant_claim.clone();
        jwt.scopes_claim = self.scopes_claim.clone();
        jwt.leeway = Duration::from_secs(self.leeway_s);
        jwt.min_refresh = Duration::from_secs(self.jwks_min_refresh_s);
        jwt.max_age = Duration::from_secs(self.jwks_max_age_s);
        Some(jwt)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JailSection {
    /// The agent binary; default: `koder-agent` next to the daemon's executable.
    pub agent_bin: Option<PathBuf>,
    pub uid_base: Option<u32>,
    pub max_sandboxes: Option<u32>,
    pub cgroup_parent: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MicroVmSection {
    /// Offer `runtime: "microvm"` when this host can run it (the reason is logged otherwise).
    pub enabled: bool,
    /// Where `ksandbox image build --microvm` put the guest kernel and root disk; default
    /// `<data_dir>/images`.
    pub images_dir: Option<PathBuf>,
    /// `auto` (Firecracker with hardware KVM, else QEMU), `qemu` or `firecracker`.
    pub backend: String,
    pub qemu_bin: Option<PathBuf>,
    /// Ignored: QEMU guests reach their agent over virtio-serial now. Accepted so that
    /// configurations written for vhost-device-vsock still load.
    pub vhost_vsock_bin: Option<PathBuf>,
    pub firecracker_bin: Option<PathBuf>,
    pub uid_base: Option<u32>,
    pub max_vms: Option<u32>,
    pub boot_timeout_s: Option<u64>,
    /// Guest memory of a VM beyond its own overhead (sessions asking more get a bigger VM).
    pub vm_memory_mib: Option<u64>,
}

impl Default for MicroVmSection {
    fn default() -> Self {
        Self {
            enabled: true,
            images_dir: None,
            backend: "auto".into(),
            qemu_bin: None,
            vhost_vsock_bin: None,
            firecracker_bin: None,
            uid_base: None,
            max_vms: None,
            boot_timeout_s: None,
            vm_memory_mib: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantConfig {
    pub name: Option<String>,
    pub plan: String,
    pub max_sessions: Option<u32>,
    pub daily_session_minutes: Option<u64>,
    /// Room for snapshots and durable pauses, MiB (default `[sessions] snapshot_storage_mib`).
    pub snapshot_storage_mib: Option<u64>,
    /// Sum of the tenant's volume sizes, MiB (default `[sessions] volume_storage_mib`).
    pub volume_storage_mib: Option<u64>,
    /// The tenant's own rates, over its plan's and the server's (`[limits]`).
    pub limits: koder_auth::limits::Rates,
}

impl Default for TenantConfig {
    fn default() -> Self {
        Self {
            name: None,
            plan: "standard".into(),
            max_sessions: None,
            daily_session_minutes: None,
            snapshot_storage_mib: None,
            volume_storage_mib: None,
            limits: Default::default(),
        }
    }
}

impl Config {
    /// Defaults, overlaid by the file named in `--config`, overlaid by flags.
    pub fn load(args: &ServeArgs) -> anyhow::Result<Self> {
        let mut cfg = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| anyhow::anyhow!("reading config {}: {e}", path.display()))?;
                toml::from_str(&text)
                    .map_err(|e| anyhow::anyhow!("config {}: {e}", path.display()))?
            }
            None => Config::default(),
        };
        if let Some(listen) = args.listen {
            cfg.server.listen = listen;
        }
        if let Some(dir) = &args.data_dir {
            cfg.server.data_dir = dir.clone();
        }
        cfg.auth.api_keys.extend(args.api_keys.iter().cloned());
        cfg.auth.admin_keys.extend(args.admin_keys.iter().cloned());
        cfg.node.check()?;
        cfg.e2b.check()?;
        cfg.retention.check()?;
        cfg.server.tls()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use koder_sessions::config::PoolSize;

    #[test]
    fn file_then_flags() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.toml");
        std::fs::write(
            &path,
            "env = \"dev\"\n[server]\nlisten = \"127.0.0.1:9000\"\n[sessions]\ndefault_timeout_s = 60\npool = { python = 3, bash = { min = 1, max = 16 } }\n[tenants.acme]\nplan = \"pro\"\nmax_sessions = 5\n[retention]\nnetwork_audit_days = 7\n",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(path),
            data_dir: Some("/tmp/x".into()),
            api_keys: vec!["acme:abcdefgh".into()],
            ..Default::default()
        };
        let cfg = Config::load(&args).unwrap();
        assert_eq!(cfg.server.listen.port(), 9000);
        assert_eq!(cfg.server.grpc_addr().unwrap(), None);
        assert_eq!(cfg.server.data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(cfg.sessions.default_timeout_s, 60);
        assert_eq!(cfg.sessions.pool["python"], PoolSize::fixed(3));
        assert_eq!(cfg.sessions.pool["bash"], PoolSize { min: 1, max: 16 });
        assert_eq!(cfg.tenants["acme"].max_sessions, Some(5));
        assert_eq!(cfg.auth.api_keys, ["acme:abcdefgh"]);
        let kept = &cfg.retention;
        assert_eq!(
            (
                kept.stopped_session_days,
                kept.network_audit_days,
                kept.webhook_delivery_days
            ),
            (30, 7, 30),
            "what the file leaves out keeps its default"
        );
    }

    #[test]
    fn e2b_domain_and_tls() {
        let load = |toml: &str| {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("k.toml");
            std::fs::write(&path, toml).unwrap();
            Config::load(&ServeArgs {
                config: Some(path),
                ..Default::default()
            })
        };
        let cfg = load("[e2b]\ndomain = \"Sbx.Example.COM.\"\n[server]\ntls_listen = \"127.0.0.2:443\"\ntls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"\n").unwrap();
        assert_eq!(cfg.e2b.domain.as_deref(), Some("sbx.example.com"));
        let tls = cfg.server.tls().unwrap().unwrap();
        assert_eq!(tls.addr, "127.0.0.2:443".parse().unwrap());
        assert_eq!(
            (tls.cert.to_str(), tls.key.to_str()),
            (Some("/c.pem"), Some("/k.pem"))
        );
        assert_eq!(load("").unwrap().server.tls().unwrap(), None);
        assert_eq!(
            load("").unwrap().e2b.templates(),
            koder_e2b::TemplateLimits::default()
        );
        let templates = load(
            "[e2b]\ntemplate_files_mib = 3\ntemplate_files_keep_days = 2\nmax_template_images = 5\n\
             max_template_builds = 7\n",
        )
        .unwrap()
        .e2b
        .templates();
        assert_eq!(
            (
                templates.max_images,
                templates.max_under_way,
                templates.files.max_bytes,
                templates.files.keep_for
            ),
            (5, 7, 3 << 20, Duration::from_secs(2 * 86_400))
        );
        for bad in [
            "[e2b]\ndomain = \"localhost\"\n",
            "[e2b]\ndomain = \"a..b\"\n",
            "[e2b]\ndomain = \"-a.b\"\n",
            "[e2b]\ndomain = \"a_b.c\"\n",
            "[e2b]\ndomain = \"\"\n",
            "[e2b]\ntemplate_files_mib = 0\n",
            "[e2b]\nmax_template_images = 0\n",
            "[e2b]\nmax_template_builds = 0\n",
            "[e2b]\nmax_template_images = 100001\n",
            "[e2b]\ntemplate_files_mib = 18446744073709551615\n",
            "[e2b]\ntemplate_files_keep_days = 0\n",
            "[e2b]\ntemplate_files_keep_days = 1000000\n",
            "[retention]\nstopped_session_days = 0\n",
            "[retention]\nnetwork_audit_days = 36501\n",
            "[retention]\nwebhook_delivery_days = -1\n",
            "[retention]\nsessions_days = 3\n",
            "[server]\ntls_listen = \"127.0.0.1:443\"\n",
            "[server]\ntls_listen = \"127.0.0.1:443\"\ntls_cert = \"/c.pem\"\n",
            "[server]\ntls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"\n",
            "[server]\ntls_listen = \"nowhere\"\ntls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"\n",
        ] {
            assert!(load(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn auth_and_limits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.toml");
        std::fs::write(
            &path,
            "[auth]\nissuer_url = \"https://idp.example.com/\"\ntenant_claim = \"org\"\n\
             [limits]\nrequests_per_second = 50\nstreams = 8\n[limits.plans.free]\nrequests_per_second = 2\n\
             [tenants.acme]\nplan = \"free\"\nlimits = { concurrent_execs = 1 }\n",
        )
        .unwrap();
        let cfg = Config::load(&ServeArgs {
            config: Some(path),
            ..Default::default()
        })
        .unwrap();
        let jwt = cfg.auth.jwt().unwrap();
        assert_eq!(
            (
                jwt.issuer.as_str(),
                jwt.audience.as_str(),
                jwt.tenant_claim.as_str()
            ),
            ("https://idp.example.com/", "sandbox", "org")
        );
        assert_eq!(jwt.jwks_url, None);
        assert!(Config::default().auth.jwt().is_none());
        assert_eq!(
            cfg.limits.plans["free"].requests_per_second.unwrap().get(),
            2
        );
        assert_eq!(cfg.tenants["acme"].limits.concurrent_execs, Some(1));
    }

    #[test]
    fn unknown_keys_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.toml");
        std::fs::write(&path, "[server]\nlisen = \"127.0.0.1:1\"\n").unwrap();
        let err = Config::load(&ServeArgs {
            config: Some(path),
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("lisen"), "{err}");
    }
}
