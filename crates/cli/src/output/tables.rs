//! The human tables, one function per kind of answer.

use comfy_table::{presets, CellAlignment, Table};
use koder_sdk::types;

use super::{format_size, format_time};

/// A borderless table (columns two spaces apart), like `ps` or `docker ps`: easy to read and
/// to cut with `awk`.
fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING);
    t.set_header(header.iter().copied());
    for row in rows {
        t.add_row(row);
    }
    for column in t.column_iter_mut() {
        column.set_padding((0, 2));
    }
    t.trim_fmt()
}

/// Two columns: field, value.
fn fields(rows: Vec<(&str, String)>) -> String {
    let mut t = Table::new();
    t.load_preset(presets::NOTHING);
    for (k, v) in rows {
        t.add_row(vec![k.to_string(), v]);
    }
    for column in t.column_iter_mut() {
        column.set_padding((0, 2));
    }
    if let Some(c) = t.column_mut(0) {
        c.set_cell_alignment(CellAlignment::Left);
    }
    t.trim_fmt()
}

fn or_dash<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

pub fn sessions_table(sessions: &[types::Session]) -> String {
    table(
        &["ID", "LANGUAGE", "STATE", "CREATED", "EXPIRES"],
        sessions.iter().map(|s| {
            vec![
                s.id.clone(),
                s.language.clone(),
                s.state.as_str().to_string(),
                format_time(&s.created_at),
                format_time(&s.expires_at),
            ]
        }),
    )
}

pub fn session_table(s: &types::Session) -> String {
    let limits = &s.limits;
    let meta: Vec<String> = s.metadata.iter().map(|(k, v)| format!("{k}={v}")).collect();
    fields(vec![
        ("id", s.id.clone()),
        ("tenant", s.tenant_id.clone()),
        ("language", s.language.clone()),
        ("image", s.image.clone()),
        ("runtime", s.runtime.clone()),
        ("state", s.state.as_str().to_string()),
        (
            "end_reason",
            s.end_reason.clone().unwrap_or_else(|| "-".into()),
        ),
        ("created", format_time(&s.created_at)),
        ("expires", format_time(&s.expires_at)),
        ("cpu_millis", or_dash(limits.cpu_millis)),
        ("memory_mib", or_dash(limits.memory_mib)),
        ("disk_mib", or_dash(limits.disk_mib)),
        ("pids", or_dash(limits.pids)),
        ("network", network_line(&s.network)),
        ("metadata", meta.join(" ")),
    ])
}

/// `mode allow... deny ...` on one line (the policy as `info` and `network` show it).
pub fn network_line(n: &types::Network) -> String {
    let mode = match n.mode {
        types::NetworkMode::None => "none",
        types::NetworkMode::Open => "open",
        types::NetworkMode::Allowlist => "allowlist",
    };
    let mut line = mode.to_string();
    if !n.allow.is_empty() {
        line.push_str(&format!(" allow {}", n.allow.join(" ")));
    }
    if !n.deny.is_empty() {
        line.push_str(&format!(" deny {}", n.deny.join(" ")));
    }
    line
}

pub fn snapshots_table(snapshots: &[types::Snapshot]) -> String {
    table(
        &["ID", "NAME", "SIZE", "IMAGE", "CREATED", "EXPIRES"],
        snapshots.iter().map(|s| {
            vec![
                s.snapshot_id.clone(),
                or_dash(s.name.as_ref()),
                format_size(s.size_bytes),
                s.image.clone(),
                format_time(&s.created_at),
                format_time(&s.expires_at),
            ]
        }),
    )
}

pub fn snapshot_table(s: &types::Snapshot) -> String {
    fields(vec![
        ("id", s.snapshot_id.clone()),
        ("name", or_dash(s.name.as_ref())),
        ("size", format_size(s.size_bytes)),
        ("size_bytes", s.size_bytes.to_string()),
        ("image", s.image.clone()),
        ("language", s.language.clone()),
        ("runtime", s.runtime.clone()),
        ("session", or_dash(s.session_id.as_ref())),
        ("created", format_time(&s.created_at)),
        ("expires", format_time(&s.expires_at)),
    ])
}

pub fn files_table(list: &types::FileList) -> String {
    table(
        &["TYPE", "SIZE", "MODE", "MODIFIED", "PATH"],
        list.entries.iter().map(|e| {
            vec![
                entry_kind(e.kind).to_string(),
                e.size.to_string(),
                permission_bits(e.mode),
                format_time(&e.modified_at),
                entry_path(e),
            ]
        }),
    )
}

/// One file, as `volume stat` shows it.
pub fn file_table(e: &types::FileEntry) -> String {
    fields(vec![
        ("path", entry_path(e)),
        ("type", entry_kind(e.kind).to_string()),
        ("size", e.size.to_string()),
        ("mode", permission_bits(e.mode)),
        ("uid", e.uid.to_string()),
        ("gid", e.gid.to_string()),
        ("modified", format_time(&e.modified_at)),
    ])
}

fn entry_kind(kind: types::EntryType) -> &'static str {
    match kind {
        types::EntryType::File => "file",
        types::EntryType::Dir => "dir",
        types::EntryType::Symlink => "symlink",
        types::EntryType::Other => "other",
    }
}

fn entry_path(e: &types::FileEntry) -> String {
    match &e.symlink_target {
        Some(t) => format!("{} -> {t}", e.path),
        None => e.path.clone(),
    }
}

fn permission_bits(mode: u32) -> String {
    format!("{:04o}", mode & 0o7777)
}

/// A volume's quota, which the API gives in MiB.
fn quota(size_mib: u64) -> String {
    format_size(size_mib.saturating_mul(1024 * 1024))
}

/// `session:/path`, with `:ro` for a read-only mount.
fn volume_use(m: &types::VolumeUse) -> String {
    let ro = if m.read_only { ":ro" } else { "" };
    format!("{}:{}{ro}", m.session_id, m.path)
}

pub fn volumes_table(volumes: &[types::Volume]) -> String {
    table(
        &["NAME", "ID", "SIZE", "USED", "BACKEND", "MOUNTS"],
        volumes.iter().map(|v| {
            vec![
                v.name.clone(),
                v.volume_id.clone(),
                quota(v.size_mib),
                or_dash(v.used_bytes.map(format_size)),
                v.backend.clone(),
                v.mounts.len().to_string(),
            ]
        }),
    )
}

pub fn volume_table(v: &types::Volume) -> String {
    let mounts: Vec<String> = v.mounts.iter().map(volume_use).collect();
    fields(vec![
        ("id", v.volume_id.clone()),
        ("name", v.name.clone()),
        ("size", quota(v.size_mib)),
        ("size_mib", v.size_mib.to_string()),
        ("used", or_dash(v.used_bytes.map(format_size))),
        ("used_bytes", or_dash(v.used_bytes)),
        ("backend", v.backend.clone()),
        ("created", format_time(&v.created_at)),
        (
            "mounts",
            or_dash((!mounts.is_empty()).then(|| mounts.join(" "))),
        ),
    ])
}

pub fn metrics_table(m: &types::SessionMetrics) -> String {
    fields(vec![
        ("cpu_used_ms", m.cpu_used_ms.to_string()),
        ("memory_current_kib", m.memory_current_kib.to_string()),
        ("memory_peak_kib", m.memory_peak_kib.to_string()),
        ("memory_limit_kib", or_dash(m.memory_limit_kib)),
        ("oom_kills", m.oom_kills.to_string()),
        ("pids_current", m.pids_current.to_string()),
        ("pids_limit", or_dash(m.pids_limit)),
        ("disk_used_kib", m.disk_used_kib.to_string()),
        ("disk_total_kib", m.disk_total_kib.to_string()),
    ])
}

/// `SEQ  TIME  TYPE  key=value...`: an event with its data, the session id left out.
pub fn event_line(e: &types::SessionEvent) -> String {
    let mut line = format!("{}\t{}\t{}", e.seq, format_time(&e.created_at), e.kind);
    if let serde_json::Value::Object(data) = &e.data {
        for (k, v) in data
            .iter()
            .filter(|(k, v)| *k != "session_id" && !v.is_null())
        {
            match v.as_str() {
                Some(s) => line.push_str(&format!("\t{k}={s:?}")),
                None => line.push_str(&format!("\t{k}={v}")),
            }
        }
    }
    line
}

pub fn tenants_table(tenants: &[types::TenantInfo]) -> String {
    table(
        &["ID", "PLAN", "SESSIONS", "MINUTES TODAY", "NAME"],
        tenants.iter().map(|t| {
            vec![
                t.id.clone(),
                t.plan.clone(),
                format!("{}/{}", t.live_sessions, or_dash(t.max_sessions)),
                format!(
                    "{}/{}",
                    t.session_minutes_today,
                    or_dash(t.daily_session_minutes)
                ),
                t.name.clone(),
            ]
        }),
    )
}

pub fn nodes_table(nodes: &[types::NodeInfo]) -> String {
    table(
        &[
            "NODE",
            "STATE",
            "ADDRESS",
            "RUNTIMES",
            "SANDBOXES",
            "HEARTBEAT",
        ],
        nodes.iter().map(|n| {
            vec![
                n.id.clone(),
                n.state.clone(),
                n.address.clone(),
                n.runtimes.join(","),
                format!("{}/{}", n.load_sandboxes, n.capacity_sandboxes),
                format_time(&n.heartbeat_at),
            ]
        }),
    )
}

pub fn images_table(images: &[types::Image]) -> String {
    table(
        &["NAME", "KIND", "LANGUAGES", "SIZE", "DIGEST"],
        images.iter().map(|i| {
            vec![
                i.names.join(", "),
                i.kind.clone(),
                image_languages(i),
                i.size_bytes.map_or("-".into(), format_size),
                i.digest
                    .as_deref()
                    .map_or("-".into(), |d| d.get(..12).unwrap_or(d).to_string()),
            ]
        }),
    )
}

pub fn image_languages(i: &types::Image) -> String {
    i.languages
        .iter()
        .map(|l| match &l.version {
            Some(v) => format!("{} {v}", l.name),
            None => l.name.clone(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A build's state, then one row per step; a failed build names its step and error.
pub fn build_table(b: &types::Build) -> String {
    let state = serde_json::to_value(b.state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let mut out = fields(vec![
        ("build:", b.build_id.clone()),
        ("image:", b.name.clone()),
        ("state:", state),
        ("digest:", or_dash(b.digest.as_deref())),
        ("created:", format_time(&b.created_at)),
        (
            "finished:",
            or_dash(b.finished_at.as_ref().map(format_time)),
        ),
    ]);
    out.push_str("\n\n");
    out.push_str(&table(
        &["#", "STATUS", "STEP"],
        b.steps.iter().enumerate().map(|(n, s)| {
            let marker = if b.failed_step == Some(n) {
                "  <- failed"
            } else {
                ""
            };
            vec![
                n.to_string(),
                s.status.clone(),
                format!("{}{marker}", s.step),
            ]
        }),
    ));
    if let Some(e) = &b.error {
        out.push_str(&format!("\n\nerror: {}: {}", e.code, e.message));
    }
    if !b.log_tail.is_empty() {
        out.push_str("\n\nlog (end):\n");
        out.push_str(b.log_tail.trim_end());
    }
    out
}

pub fn execs_table(execs: &[types::ExecStatus]) -> String {
    table(
        &["EXEC", "STATE", "EXIT", "STARTED", "COMMAND"],
        execs.iter().map(|e| {
            let (state, exit) = match e.state {
                types::ExecState::Running => ("running", "-".to_string()),
                types::ExecState::Exited => (
                    "exited",
                    or_dash(e.result.as_ref().and_then(|r| r.exit_code)),
                ),
            };
            vec![
                e.exec_id.clone(),
                state.to_string(),
                exit,
                format_time(&e.started_at),
                e.command.join(" "),
            ]
        }),
    )
}

pub fn audit_table(page: &types::AuditPage) -> String {
    table(
        &["AT", "VERDICT", "PROTO", "DESTINATION", "SESSION", "REASON"],
        page.entries.iter().map(|e| {
            let name = e
                .name
                .as_ref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default();
            vec![
                format_time(&e.at),
                if e.allowed { "allow" } else { "deny" }.to_string(),
                e.proto.clone(),
                format!("{}:{}{name}", e.dest, e.port),
                e.session_id.clone(),
                e.reason.clone(),
            ]
        }),
    )
}

pub fn contexts_table(contexts: &[koder_sdk::interp::Context]) -> String {
    table(
        &["CONTEXT", "LANGUAGE", "RUNS", "CWD"],
        contexts.iter().map(|c| {
            vec![
                c.context_id.clone(),
                c.language.clone(),
                c.execution_count.to_string(),
                c.cwd.clone(),
            ]
        }),
    )
}

pub fn errors_table(errors: &[types::ErrorEntry]) -> String {
    table(
        &["AT", "SOURCE", "MESSAGE"],
        errors.iter().map(|e| {
            vec![
                format_time(&e.at),
                e.source.clone(),
                e.message.lines().next().unwrap_or_default().to_string(),
            ]
        }),
    )
}

pub fn exec_status_table(e: &types::ExecStatus) -> String {
    let result = e.result.as_ref();
    fields(vec![
        ("exec", e.exec_id.clone()),
        (
            "state",
            match e.state {
                types::ExecState::Running => "running",
                types::ExecState::Exited => "exited",
            }
            .to_string(),
        ),
        ("verdict", or_dash(result.and_then(|r| r.verdict.clone()))),
        ("exit_code", or_dash(result.and_then(|r| r.exit_code))),
        ("duration_ms", or_dash(result.map(|r| r.duration_ms))),
        ("started", format_time(&e.started_at)),
        ("command", e.command.join(" ")),
    ])
}

pub fn secrets_table(secrets: &[types::Secret]) -> String {
    table(
        &["NAME", "HOSTS", "CREATED"],
        secrets.iter().map(|s| {
            vec![
                s.name.clone(),
                s.hosts.join(","),
                format_time(&s.created_at),
            ]
        }),
    )
}

pub fn webhooks_table(hooks: &[types::webhooks::Webhook]) -> String {
    table(
        &["ID", "URL", "EVENTS", "CREATED"],
        hooks.iter().map(|h| {
            let events = if h.events.is_empty() {
                "all".to_string()
            } else {
                h.events.join(",")
            };
            vec![
                h.id.clone(),
                h.url.clone(),
                events,
                format_time(&h.created_at),
            ]
        }),
    )
}

/// The id, and the signing secret this one time it is shown.
pub fn webhook_created(h: &types::webhooks::Webhook) -> String {
    fields(vec![
        ("id", h.id.clone()),
        ("secret", or_dash(h.secret.clone())),
    ])
}

pub fn deliveries_table(deliveries: &[types::webhooks::Delivery]) -> String {
    table(
        &["DELIVERY", "EVENT", "STATE", "ATTEMPTS", "LAST", "UPDATED"],
        deliveries.iter().map(|d| {
            let last = match (&d.last_status, &d.last_error) {
                (Some(status), _) => status.to_string(),
                (None, Some(err)) => err.lines().next().unwrap_or_default().to_string(),
                (None, None) => "-".into(),
            };
            vec![
                d.id.clone(),
                d.event_type.clone(),
                d.state.clone(),
                d.attempts.to_string(),
                last,
                format_time(&d.updated_at),
            ]
        }),
    )
}
