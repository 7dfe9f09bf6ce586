//! Server-side policy for sessions: defaults, maxima and the warm pool.

use std::collections::BTreeMap;
use std::time::Duration;

use koder_api_types::Limits;
use serde::de::{self, MapAccess, Unexpected, Visitor};
use serde::{Deserialize, Deserializer};

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionConfig {
    pub default_timeout_s: u64,
    pub max_timeout_s: u64,
    /// Limits of a session that asks for none.
    pub default_limits: Limits,
    /// Requests above these are refused with 400.
    pub max_limits: Limits,
    /// Output kept per stream of an exec.
    pub output_limit_bytes: u64,
    pub default_exec_timeout_ms: u64,
    pub max_exec_timeout_ms: u64,
    /// Largest file accepted by an upload.
    pub max_file_bytes: u64,
    /// Per plan tier: maxima tighter than `max_limits` for that plan's tenants.
    pub plans: BTreeMap<String, PlanConfig>,
    /// Ready sandboxes kept per language: `python = 2` keeps exactly two, `python = { min = 1,
    /// max = 16 }` keeps at least one and grows towards 16 with the recent create rate (see
    /// [`PoolSize`]).
    pub pool: BTreeMap<String, PoolSize>,
    /// Ready microVMs kept per language, in the same forms as `pool` (each holds guest memory:
    /// keep `max` small).
    pub microvm_pool: BTreeMap<String, PoolSize>,
    /// Egress policy settings (`[network]` of the daemon config).
    #[serde(skip)]
    pub network: koder_netpolicy::NetConfig,
    /// The key secrets are sealed with and how their upstreams are verified (`[secrets]` of
    /// the daemon config); without it secrets are not offered.
    #[serde(skip)]
    pub secrets: Option<crate::secrets::SecretsConfig>,
    /// How often expired sessions are looked for.
    #[serde(with = "secs")]
    pub reap_interval: Duration,
    /// Where captured layers are cached and the local blob store lives (the daemon's data
    /// dir); without it snapshots, durable pauses and forks are not offered.
    #[serde(skip)]
    pub state_dir: Option<std::path::PathBuf>,
    /// The blob store (`[blobs]` of the daemon config).
    #[serde(skip)]
    pub blobs: koder_blobs::BlobConfig,
    /// How long a snapshot (and a durably paused session) is kept.
    pub snapshot_retention_s: u64,
    /// Snapshot storage per tenant, MiB, unless the tenant has its own
    /// (`[tenants.X] snapshot_storage_mib`, filled into `tenant_snapshot_storage_mib`).
    pub snapshot_storage_mib: u64,
    #[serde(skip)]
    pub tenant_snapshot_storage_mib: BTreeMap<String, u64>,
    /// Size quota of a volume created without one, MiB.
    pub volume_default_size_mib: u64,
    /// Largest volume, MiB.
    pub volume_max_size_mib: u64,
    /// Sum of a tenant's volume sizes, MiB, unless the tenant has its own
    /// (`[tenants.X] volume_storage_mib`, filled into `tenant_volume_storage_mib`).
    pub volume_storage_mib: u64,
    #[serde(skip)]
    pub tenant_volume_storage_mib: BTreeMap<String, u64>,
    /// How long a deleted volume's data stays on disk before it is purged.
    pub volume_delete_grace_s: u64,
    /// Image settings (`[images]` of the daemon config).
    #[serde(skip)]
    pub images: ImagesConfig,
    /// The image store (`<data_dir>/images/store`); without it only `host` exists.
    #[serde(skip)]
    pub image_store: Option<koder_image::ImageStore>,
    /// The node this manager's sandboxes run on (the daemon's `[node]` id), recorded with
    /// every session: start-up reconciliation and the reaper touch only this node's sessions,
    /// so daemons can share one store. `None` (a manager that is no node) owns them all.
    #[serde(skip)]
    pub node_id: Option<String>,
    /// Whether this node shares its named images with the others of its cluster (the daemon
    /// sets it with `[cluster] secret_file`): through the blob store and the database.
    #[serde(skip)]
    pub share_images: bool,
}

/// `[images]`: which image a language's sessions run on when they name none.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImagesConfig {
    /// `python = "python"` runs `"language": "python"` sessions (and the python warm pool) on
    /// the `python` pack; a language not listed stays on `host`. Empty by default.
    pub language_packs: BTreeMap<String, String>,
    /// Ranges exempt from the SSRF guard for image builds only (a package mirror on a
    /// private or reserved address): sessions never get them.
    pub build_internal: Vec<ipnet::IpNet>,
    /// Days a build's cached step is kept unused (neither made nor found by a build), default
    /// 30; collected at the daemon's start (a step going costs a later build its cache only).
    pub step_cache_days: Option<u64>,
}

impl ImagesConfig {
    /// How long a cached build step is kept unused.
    pub fn steps_unused_for(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.step_cache_days.unwrap_or(30).saturating_mul(86_400))
    }
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            default_timeout_s: 300,
            max_timeout_s: 24 * 3600,
            default_limits: Limits {
                cpu_millis: Some(1000),
                memory_mib: Some(512),
                disk_mib: Some(1024),
                pids: Some(256),
            },
            max_limits: Limits {
                cpu_millis: Some(4000),
                memory_mib: Some(8192),
                disk_mib: Some(65536),
                pids: Some(4096),
            },
            output_limit_bytes: 1024 * 1024,
            default_exec_timeout_ms: 60_000,
            max_exec_timeout_ms: 3_600_000,
            max_file_bytes: 1024 * 1024 * 1024,
            plans: BTreeMap::new(),
            pool: ["bash", "python", "node"]
                .map(|lang| (lang.to_string(), PoolSize::fixed(1)))
                .into(),
            microvm_pool: BTreeMap::new(),
            reap_interval: Duration::from_secs(1),
            network: Default::default(),
            secrets: None,
            state_dir: None,
            blobs: Default::default(),
            snapshot_retention_s: 30 * 24 * 3600,
            snapshot_storage_mib: 10 * 1024,
            tenant_snapshot_storage_mib: BTreeMap::new(),
            volume_default_size_mib: 1024,
            volume_max_size_mib: 1 << 20,
            volume_storage_mib: 100 * 1024,
            tenant_volume_storage_mib: BTreeMap::new(),
            volume_delete_grace_s: 3600,
            images: ImagesConfig::default(),
            image_store: None,
            node_id: None,
            share_images: false,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlanConfig {
    pub max_limits: Limits,
}

/// How many warm sandboxes one language keeps. Between `min` and `max` the pool's target follows
/// demand: as many as creates asked for in the last minute, so a burst is met from the pool the
/// next time it comes; without demand it falls back to `min` (the pool's own docs say how).
///
/// In a config either a number, `python = 2`, which means `min = max = 2`: a fixed pool, exactly
/// what that line meant before the pool could grow, so no existing config starts holding more
/// sandboxes than it asked for; or a table, `python = { min = 1, max = 16 }` (`min` defaults to
/// 0, `max` to `min`; other keys and `max < min` are config errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSize {
    pub min: usize,
    pub max: usize,
}

impl PoolSize {
    /// Exactly `n`, never more, never fewer.
    pub const fn fixed(n: usize) -> Self {
        Self { min: n, max: n }
    }
}

/// The table form, checked before it becomes a [`PoolSize`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolRange {
    #[serde(default)]
    min: usize,
    max: Option<usize>,
}

impl<'de> Deserialize<'de> for PoolSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PoolSizeVisitor)
    }
}

/// A visitor rather than `#[serde(untagged)]`: an untagged enum reports every mistake as "did
/// not match any variant", hiding which key was unknown or that `max` is below `min`.
struct PoolSizeVisitor;

impl<'de> Visitor<'de> for PoolSizeVisitor {
    type Value = PoolSize;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a number of sandboxes or a table { min = N, max = M }")
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<PoolSize, E> {
        usize::try_from(n)
            .map(PoolSize::fixed)
            .map_err(|_| E::invalid_value(Unexpected::Unsigned(n), &self))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<PoolSize, E> {
        let n = u64::try_from(n).map_err(|_| E::invalid_value(Unexpected::Signed(n), &self))?;
        self.visit_u64(n)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<PoolSize, A::Error> {
        let range = PoolRange::deserialize(de::value::MapAccessDeserializer::new(map))?;
        let (min, max) = (range.min, range.max.unwrap_or(range.min));
        if max < min {
            return Err(de::Error::custom(format!(
                "pool max ({max}) is below its min ({min})"
            )));
        }
        Ok(PoolSize { min, max })
    }
}

mod secs {
    use serde::{Deserialize, Deserializer};
    use std::time::Duration;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_secs_f64(f64::deserialize(d)?.max(0.05)))
    }
}
