//! Domain types ⇄ protobuf messages. Field for field: what a message leaves empty is what a
//! REST body leaves out, so both faces hand the manager the same request.

use chrono::{DateTime, Utc};
use koder_api_types as api;
use koder_sessions::{ContextInfo, ContextRun, FsEvent, FsEventKind};
use tonic::Status;

use crate::proto as pb;
use crate::status::status;

pub(crate) fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        // Below 10⁹, so it fits.
        nanos: i32::try_from(t.timestamp_subsec_nanos()).unwrap_or(0),
    }
}

pub(crate) fn invalid(message: &str) -> Status {
    status(api::ErrorCode::InvalidArgument, message, None)
}

fn some_if_set<T: Default + PartialEq>(v: T) -> Option<T> {
    (v != T::default()).then_some(v)
}

impl From<pb::Limits> for api::Limits {
    fn from(l: pb::Limits) -> Self {
        Self {
            cpu_millis: l.cpu_millis,
            memory_mib: l.memory_mib,
            disk_mib: l.disk_mib,
            pids: l.pids,
        }
    }
}

impl From<api::Limits> for pb::Limits {
    fn from(l: api::Limits) -> Self {
        Self {
            cpu_millis: l.cpu_millis,
            memory_mib: l.memory_mib,
            disk_mib: l.disk_mib,
            pids: l.pids,
        }
    }
}

fn network_mode(mode: &str) -> Result<api::NetworkMode, Status> {
    Ok(match mode {
        "" | "none" => api::NetworkMode::None,
        "open" => api::NetworkMode::Open,
        "allowlist" => api::NetworkMode::Allowlist,
        other => {
            return Err(invalid(&format!(
                "network mode {other:?}: expected none, open or allowlist"
            )))
        }
    })
}

fn network_mode_name(mode: api::NetworkMode) -> &'static str {
    match mode {
        api::NetworkMode::None => "none",
        api::NetworkMode::Open => "open",
        api::NetworkMode::Allowlist => "allowlist",
    }
}

impl TryFrom<pb::Network> for api::Network {
    type Error = Status;

    fn try_from(n: pb::Network) -> Result<Self, Status> {
        Ok(Self {
            mode: network_mode(&n.mode)?,
            allow: n.allow,
            deny: n.deny,
        })
    }
}

impl From<api::Network> for pb::Network {
    fn from(n: api::Network) -> Self {
        Self {
            mode: network_mode_name(n.mode).into(),
            allow: n.allow,
            deny: n.deny,
        }
    }
}

impl TryFrom<pb::CreateSessionRequest> for api::CreateSession {
    type Error = Status;

    fn try_from(r: pb::CreateSessionRequest) -> Result<Self, Status> {
        Ok(Self {
            language: r.language,
            image: r.image,
            runtime: r.runtime,
            limits: r.limits.map(Into::into),
            network: r.network.map(TryInto::try_into).transpose()?,
            env: r.env,
            timeout_s: r.timeout_s,
            metadata: r.metadata,
            from_snapshot: r.from_snapshot,
            lifecycle: r.lifecycle.map(TryInto::try_into).transpose()?,
            volumes: r.volumes.into_iter().map(Into::into).collect(),
            secrets: r.secrets,
        })
    }
}

impl TryFrom<pb::Lifecycle> for api::Lifecycle {
    type Error = Status;

    fn try_from(l: pb::Lifecycle) -> Result<Self, Status> {
        let on_timeout = match l.on_timeout.as_str() {
            "" | "kill" => api::OnTimeout::Kill,
            "pause" => api::OnTimeout::Pause,
            other => {
                return Err(invalid(&format!(
                    "on_timeout {other:?}: expected kill or pause"
                )))
            }
        };
        Ok(Self {
            on_timeout,
            auto_resume: l.auto_resume,
            keep_memory: l.keep_memory,
        })
    }
}

impl From<pb::VolumeMount> for api::VolumeMountRequest {
    fn from(m: pb::VolumeMount) -> Self {
        Self {
            name: m.name,
            path: m.path,
            read_only: m.read_only,
        }
    }
}

impl From<api::SessionVolume> for pb::SessionVolume {
    fn from(v: api::SessionVolume) -> Self {
        Self {
            volume_id: v.volume_id,
            name: v.name,
            path: v.path,
            read_only: v.read_only,
        }
    }
}

impl From<pb::CreateVolumeRequest> for api::CreateVolume {
    fn from(r: pb::CreateVolumeRequest) -> Self {
        Self {
            name: r.name,
            size_mib: r.size_mib,
            from_volume: r.from_volume,
        }
    }
}

impl From<api::Volume> for pb::Volume {
    fn from(v: api::Volume) -> Self {
        Self {
            volume_id: v.volume_id,
            name: v.name,
            size_mib: v.size_mib,
            used_bytes: v.used_bytes,
            backend: v.backend,
            created_at: Some(timestamp(v.created_at)),
            mounts: v
                .mounts
                .into_iter()
                .map(|m| pb::VolumeUse {
                    session_id: m.session_id,
                    path: m.path,
                    read_only: m.read_only,
                })
                .collect(),
        }
    }
}

impl From<api::ExecStatus> for pb::ExecStatus {
    fn from(e: api::ExecStatus) -> Self {
        Self {
            exec_id: e.exec_id,
            command: e.command,
            background: e.background,
            state: match e.state {
                api::ExecState::Running => "running",
                api::ExecState::Exited => "exited",
            }
            .into(),
            started_at: Some(timestamp(e.started_at)),
            pid: e.pid,
            result: e.result.map(Into::into),
        }
    }
}

impl From<api::TenantInfo> for pb::Tenant {
    fn from(t: api::TenantInfo) -> Self {
        Self {
            id: t.id,
            name: t.name,
            plan: t.plan,
            max_sessions: t.max_sessions,
            daily_session_minutes: t.daily_session_minutes,
            created_at: Some(timestamp(t.created_at)),
            live_sessions: t.live_sessions,
            session_minutes_today: t.session_minutes_today,
        }
    }
}

/// The tenant id and the domain request of a PutTenant.
pub(crate) fn put_tenant(r: pb::PutTenantRequest) -> (String, api::PutTenant) {
    let req = api::PutTenant {
        name: r.name,
        plan: r.plan,
        max_sessions: r.max_sessions,
        daily_session_minutes: r.daily_session_minutes,
    };
    (r.tenant_id, req)
}

/// The preview of a session: the port its REST proxy forwards to.
pub(crate) fn preview(session_id: &str, u: koder_sessions::Upstream) -> pb::Preview {
    pb::Preview {
        port: u.port.into(),
        pinned: u.pinned,
        preview_path: format!("/v1/sandbox/sessions/{session_id}/preview/"),
    }
}

impl From<api::Session> for pb::Session {
    fn from(s: api::Session) -> Self {
        Self {
            id: s.id,
            tenant_id: s.tenant_id,
            language: s.language,
            image: s.image,
            runtime: s.runtime,
            state: s.state.as_str().into(),
            created_at: Some(timestamp(s.created_at)),
            expires_at: Some(timestamp(s.expires_at)),
            limits: Some(s.limits.into()),
            network: Some(s.network.into()),
            metadata: s.metadata,
            end_reason: s.end_reason,
            volumes: s.volumes.into_iter().map(Into::into).collect(),
        }
    }
}

/// The session id and the domain request of an exec.
pub(crate) fn exec_request(r: pb::ExecRequest) -> (String, api::ExecRequest) {
    let req = api::ExecRequest {
        cmd: some_if_set(r.cmd),
        shell: r.shell,
        code: r.code,
        language: r.language,
        env: r.env,
        cwd: r.cwd,
        stdin: r.stdin,
        timeout_ms: r.timeout_ms,
        background: false,
        user: r.user,
    };
    (r.session_id, req)
}

impl From<api::ExecResult> for pb::ExecResult {
    fn from(r: api::ExecResult) -> Self {
        Self {
            exec_id: r.exec_id,
            exit_code: r.exit_code,
            signal: r.signal,
            stdout: r.stdout,
            stderr: r.stderr,
            stdout_truncated: r.stdout_truncated,
            stderr_truncated: r.stderr_truncated,
            duration_ms: r.duration_ms,
            peak_memory_kib: r.peak_memory_kib,
            verdict: r.verdict,
        }
    }
}

fn entry_type(t: api::EntryType) -> &'static str {
    match t {
        api::EntryType::File => "file",
        api::EntryType::Dir => "dir",
        api::EntryType::Symlink => "symlink",
        api::EntryType::Other => "other",
    }
}

impl From<api::FileEntry> for pb::FileEntry {
    fn from(e: api::FileEntry) -> Self {
        Self {
            name: e.name,
            path: e.path,
            r#type: entry_type(e.kind).into(),
            size: e.size,
            mode: e.mode,
            modified_at: Some(timestamp(e.modified_at)),
            symlink_target: e.symlink_target,
            uid: e.uid,
            gid: e.gid,
        }
    }
}

impl From<api::FileList> for pb::ListFilesResponse {
    fn from(l: api::FileList) -> Self {
        Self {
            entries: l.entries.into_iter().map(Into::into).collect(),
            truncated: l.truncated,
        }
    }
}

impl From<FsEvent> for pb::FileEvent {
    fn from(e: FsEvent) -> Self {
        let kind = match e.kind {
            FsEventKind::Created => "created",
            FsEventKind::Modified => "modified",
            FsEventKind::Deleted => "deleted",
            FsEventKind::Renamed => "renamed",
        };
        Self {
            r#type: kind.into(),
            path: e.path,
            from: e.from,
        }
    }
}

impl From<ContextInfo> for pb::Context {
    fn from(c: ContextInfo) -> Self {
        Self {
            context_id: c.context_id,
            language: c.language,
            execution_count: c.execution_count,
            cwd: c.cwd,
        }
    }
}

impl From<ContextRun> for pb::ContextRunResult {
    fn from(run: ContextRun) -> Self {
        Self {
            stdout: run.stdout,
            stderr: run.stderr,
            stdout_truncated: run.stdout_truncated,
            stderr_truncated: run.stderr_truncated,
            results: run
                .results
                .into_iter()
                .map(|r| pb::RichResult {
                    is_main_result: r.is_main_result,
                    text: r.text,
                    html: r.html,
                    markdown: r.markdown,
                    json: r.json,
                    png: r.png,
                    svg: r.svg,
                    jpeg: r.jpeg,
                    latex: r.latex,
                    data: r.data,
                    chart: r.chart,
                    pdf: r.pdf,
                    javascript: r.javascript,
                    extra: r.extra,
                })
                .collect(),
            error: run.error.map(|e| pb::RunError {
                name: e.name,
                value: e.value,
                traceback: e.traceback,
            }),
            execution_count: run.execution_count,
            duration_ms: run.duration_ms,
            verdict: run.verdict.map(String::from),
            restarted: run.restarted,
        }
    }
}

impl From<api::Snapshot> for pb::Snapshot {
    fn from(s: api::Snapshot) -> Self {
        Self {
            snapshot_id: s.snapshot_id,
            name: s.name,
            size_bytes: s.size_bytes,
            image: s.image,
            language: s.language,
            runtime: s.runtime,
            session_id: s.session_id,
            created_at: Some(timestamp(s.created_at)),
            expires_at: Some(timestamp(s.expires_at)),
        }
    }
}

impl From<koder_sessions::VolumeEntry> for pb::FileEntry {
    fn from(e: koder_sessions::VolumeEntry) -> Self {
        e.entry.into()
    }
}

impl From<api::IssuedKey> for pb::IssuedKey {
    fn from(k: api::IssuedKey) -> Self {
        Self {
            tenant_id: k.tenant_id,
            api_key: k.api_key,
        }
    }
}

/// Owner and mode of a volume call; an absent message sets nothing.
pub(crate) fn volume_meta(m: Option<pb::VolumeFileMeta>) -> koder_sessions::VolumeMeta {
    let m = m.unwrap_or_default();
    koder_sessions::VolumeMeta {
        uid: m.uid,
        gid: m.gid,
        mode: m.mode,
    }
}

impl From<api::SessionEventList> for pb::ListSessionEventsResponse {
    fn from(page: api::SessionEventList) -> Self {
        Self {
            events: page
                .events
                .into_iter()
                .map(|e| pb::SessionEvent {
                    seq: e.seq,
                    id: e.id,
                    r#type: e.kind,
                    created_at: Some(timestamp(e.created_at)),
                    data_json: e.data.to_string(),
                })
                .collect(),
            more: page.more,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_fields_mean_absent() {
        let (id, req) = exec_request(pb::ExecRequest {
            session_id: "s".into(),
            shell: Some("echo".into()),
            ..Default::default()
        });
        assert_eq!(id, "s");
        assert_eq!(req.cmd, None);
        assert_eq!(req.shell.as_deref(), Some("echo"));
    }

    #[test]
    fn network_modes_round_trip_and_bad_ones_are_invalid() {
        for mode in ["none", "open", "allowlist"] {
            let n = api::Network::try_from(pb::Network {
                mode: mode.into(),
                allow: vec![],
                deny: vec!["*.blocked.test".into()],
            })
            .unwrap();
            let back = pb::Network::from(n);
            assert_eq!(back.mode, mode);
            assert_eq!(back.deny, ["*.blocked.test"]);
        }
        let bad = api::Network::try_from(pb::Network {
            mode: "wide".into(),
            allow: vec![],
            deny: vec![],
        })
        .unwrap_err();
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    }
}
