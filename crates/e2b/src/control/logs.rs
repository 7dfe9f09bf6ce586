//! E2B's sandbox logs: `GET /sandboxes/{id}/logs` (v1, what the E2B CLI's `sandbox logs`
//! reads) and `GET /v2/sandboxes/{id}/logs`, both made of the session's event log (created,
//! paused, resumed, stopped and why, execs killed and why), so they can be read after the
//! sandbox is gone. koder-sandbox keeps no log of each process a sandbox runs.

use std::collections::BTreeMap;

use axum::extract::{Path, Query, State};
use axum::routing::get;
use axum::Router;
use chrono::{DateTime, Utc};
use koder_api_types::SessionEvent;
use koder_auth::Identity;
use serde_json::{json, Value};

use super::keys::ApiCaller;
use super::{time, unsupported};
use crate::error::HttpError;
use crate::state::E2b;

pub fn routes() -> Router<E2b> {
    Router::new()
        .route("/sandboxes/{id}/logs", get(v1).fallback(unsupported))
        .route("/v2/sandboxes/{id}/logs", get(v2).fallback(unsupported))
}

/// E2B's `LogLevel`, in rising order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

impl Level {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "debug" => Self::Debug,
            "info" => Self::Info,
            "warn" => Self::Warn,
            "error" => Self::Error,
            _ => return None,
        })
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Error => "error",
        }
    }
}

/// One event as E2B's structured log entry.
struct Entry {
    at: DateTime<Utc>,
    level: Level,
    /// Which part of the sandbox's life it is about, as E2B's entries name their logger.
    logger: &'static str,
    message: String,
    /// The event's data, every value a string (as E2B's `fields`).
    fields: BTreeMap<String, String>,
}

impl Entry {
    fn of(e: &SessionEvent) -> Self {
        let text = |key: &str| e.data[key].as_str().unwrap_or_default().to_string();
        let (level, logger, message) = match e.kind.as_str() {
            "session.created" => (Level::Info, "lifecycle", "Sandbox created".to_string()),
            "session.paused" => (Level::Info, "lifecycle", "Sandbox paused".to_string()),
            "session.resumed" => (Level::Info, "lifecycle", "Sandbox resumed".to_string()),
            "session.stopped" => {
                let level = match text("cause").as_str() {
                    "deleted" | "expired" => Level::Info,
                    "quota" | "daemon_shutdown" | "daemon_restart" => Level::Warn,
                    _ => Level::Error,
                };
                let message = format!("Sandbox stopped: {}", text("reason"));
                (level, "lifecycle", message)
            }
            "exec.verdict" => (Level::Warn, "process", killed(&text("verdict"))),
            other => (Level::Info, "lifecycle", other.to_string()),
        };
        let fields = match &e.data {
            Value::Object(map) => map
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| {
                    let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                    (k.clone(), v)
                })
                .collect(),
            _ => BTreeMap::new(),
        };
        Self {
            at: e.created_at,
            level,
            logger,
            message,
            fields,
        }
    }

    /// `SandboxLogEntry`: `{timestamp, level, message, fields}`.
    fn structured(&self) -> Value {
        let mut fields = self.fields.clone();
        fields.insert("logger".into(), self.logger.into());
        json!({
            "timestamp": time(self.at),
            "level": self.level.as_str(),
            "message": self.message,
            "fields": fields,
        })
    }

    /// `SandboxLog`: `{timestamp, line}`, the line a JSON object (the CLI parses it and reads
    /// its `level` and `logger`).
    fn line(&self) -> Value {
        let mut line: serde_json::Map<String, Value> = self
            .fields
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        line.insert("level".into(), self.level.as_str().into());
        line.insert("logger".into(), self.logger.into());
        line.insert("message".into(), self.message.clone().into());
        json!({"timestamp": time(self.at), "line": Value::Object(line).to_string()})
    }
}

/// What an exec's verdict says happened to it.
fn killed(verdict: &str) -> String {
    let why = match verdict {
        "SANDBOX-EXEC-TIMEOUT" => "it ran past its timeout",
        "SANDBOX-EXEC-KILLED-OOM" => "the sandbox ran out of memory",
        "SANDBOX-EXEC-KILLED-PIDS" => "the sandbox's process limit was reached",
        _ => "killed on request",
    };
    format!("Process killed: {why}")
}

/// The query of either version, checked: E2B's server refuses malformed values with 400.
#[derive(Debug, Default)]
struct LogQuery {
    /// Unix milliseconds: v1 `start`, v2 `cursor`.
    from_ms: Option<i64>,
    backward: bool,
    min_level: Option<Level>,
    limit: Option<usize>,
    search: Option<String>,
}

impl LogQuery {
    fn parse(params: &[(String, String)], v2: bool) -> Result<Self, HttpError> {
        let mut q = Self::default();
        for (k, v) in params {
            let bad = || HttpError::bad_request(format!("invalid {k}: {v:?}"));
            match (k.as_str(), v2) {
                ("start", false) | ("cursor", true) => {
                    q.from_ms = Some(v.parse().map_err(|_| bad())?);
                }
                ("limit", _) => q.limit = Some(v.parse().map_err(|_| bad())?),
                ("direction", true) => {
                    q.backward = match v.as_str() {
                        "forward" => false,
                        "backward" => true,
                        _ => return Err(bad()),
                    }
                }
                ("level", true) => q.min_level = Some(Level::parse(v).ok_or_else(bad)?),
                ("search", true) => q.search = Some(v.clone()),
                // As E2B's server, parameters it does not know are ignored.
                _ => {}
            }
        }
        Ok(q)
    }

    /// The entries this query selects from a log, in the order it asks for.
    fn select(&self, log: &[SessionEvent]) -> Vec<Entry> {
        let at_ms = |e: &SessionEvent| e.created_at.timestamp_millis();
        let mut entries: Vec<Entry> = log
            .iter()
            .filter(|e| match (self.from_ms, self.backward) {
                (None, _) => true,
                (Some(from), false) => at_ms(e) >= from,
                (Some(from), true) => at_ms(e) <= from,
            })
            .map(Entry::of)
            .filter(|e| self.min_level.is_none_or(|min| e.level >= min))
            .filter(|e| self.search.as_deref().is_none_or(|s| e.message.contains(s)))
            .collect();
        if self.backward {
            entries.reverse();
        }
        entries.truncate(self.limit.unwrap_or(usize::MAX));
        entries
    }
}

/// The entries of the session's log (the store keeps at most a page of it) that the query of
/// either version selects.
async fn selected(
    e2b: &E2b,
    who: &Identity,
    id: &str,
    params: &[(String, String)],
    v2: bool,
) -> Result<Vec<Entry>, HttpError> {
    let q = LogQuery::parse(params, v2)?;
    let page = koder_sessions::EVENTS_PAGE_MAX;
    match e2b.manager().session_events(who, id, 0, page).await {
        Ok(log) => Ok(q.select(&log.events)),
        Err(koder_sessions::Error::NotFound) => {
            Err(HttpError::not_found(format!("sandbox {id:?} not found")))
        }
        Err(e) => Err(e.into()),
    }
}

/// `{logs: [SandboxLog], logEntries: [SandboxLogEntry]}`, oldest first.
async fn v1(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
    Query(params): Query<Vec<(String, String)>>,
) -> Result<axum::Json<Value>, HttpError> {
    let entries = selected(&e2b, &who, &id, &params, false).await?;
    Ok(axum::Json(json!({
        "logs": entries.iter().map(Entry::line).collect::<Vec<_>>(),
        "logEntries": entries.iter().map(Entry::structured).collect::<Vec<_>>(),
    })))
}

/// `{logs: [SandboxLogEntry]}`.
async fn v2(
    State(e2b): State<E2b>,
    ApiCaller(who): ApiCaller,
    Path(id): Path<String>,
    Query(params): Query<Vec<(String, String)>>,
) -> Result<axum::Json<Value>, HttpError> {
    let entries = selected(&e2b, &who, &id, &params, true).await?;
    Ok(axum::Json(json!({
        "logs": entries.iter().map(Entry::structured).collect::<Vec<_>>(),
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64, kind: &str, at_ms: i64, data: Value) -> SessionEvent {
        SessionEvent {
            seq,
            id: format!("evt_{seq}"),
            kind: kind.into(),
            created_at: DateTime::from_timestamp_millis(at_ms).unwrap(),
            data,
        }
    }

    fn log() -> Vec<SessionEvent> {
        vec![
            event(
                1,
                "session.created",
                1_000,
                json!({"session_id": "s", "language": "python"}),
            ),
            event(
                2,
                "exec.verdict",
                2_000,
                json!({"session_id": "s", "verdict": "SANDBOX-EXEC-KILLED-OOM", "exit_code": null, "signal": 9}),
            ),
            event(
                3,
                "session.stopped",
                3_000,
                json!({"session_id": "s", "reason": "agent exited", "cause": "agent_exited"}),
            ),
        ]
    }

    fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn messages(entries: &[Entry]) -> Vec<&str> {
        entries.iter().map(|e| e.message.as_str()).collect()
    }

    #[test]
    fn events_read_as_e2b_log_entries() {
        let all = LogQuery::default().select(&log());
        assert_eq!(
            messages(&all),
            [
                "Sandbox created",
                "Process killed: the sandbox ran out of memory",
                "Sandbox stopped: agent exited"
            ]
        );
        let killed = all[1].structured();
        assert_eq!(killed["level"], "warn");
        assert_eq!(killed["timestamp"], "1970-01-01T00:00:02.000Z");
        // Fields are strings, nulls left out, the logger among them.
        assert_eq!(
            killed["fields"],
            json!({"session_id": "s", "verdict": "SANDBOX-EXEC-KILLED-OOM", "signal": "9", "logger": "process"})
        );
        assert_eq!(all[2].level, Level::Error, "an agent that died is an error");
        // v1's line is a JSON object with the level and logger the CLI reads.
        let line: Value = serde_json::from_str(all[0].line()["line"].as_str().unwrap()).unwrap();
        assert_eq!(
            (&line["level"], &line["logger"], &line["language"]),
            (&json!("info"), &json!("lifecycle"), &json!("python"))
        );
    }

    #[test]
    fn queries_select_by_time_level_text_and_direction() {
        let q = |pairs: &[(&str, &str)], v2| LogQuery::parse(&params(pairs), v2).unwrap();
        let pick = |q: LogQuery| {
            q.select(&log())
                .iter()
                .map(|e| e.at.timestamp_millis())
                .collect::<Vec<_>>()
        };
        assert_eq!(pick(q(&[("start", "2000")], false)), [2_000, 3_000]);
        assert_eq!(pick(q(&[("limit", "1")], false)), [1_000]);
        assert_eq!(
            pick(q(&[("cursor", "2500"), ("direction", "backward")], true)),
            [2_000, 1_000]
        );
        assert_eq!(pick(q(&[("level", "warn")], true)), [2_000, 3_000]);
        assert_eq!(pick(q(&[("level", "error")], true)), [3_000]);
        assert_eq!(pick(q(&[("search", "Sandbox")], true)), [1_000, 3_000]);
        assert_eq!(
            pick(q(&[("search", "sandbox created")], true)),
            Vec::<i64>::new()
        );
        // Each version's own names only; unknown ones are ignored.
        assert_eq!(
            pick(q(&[("cursor", "2500"), ("whatever", "1")], false)),
            [1_000, 2_000, 3_000]
        );
    }

    #[test]
    fn malformed_queries_are_refused() {
        for (pairs, v2) in [
            (&[("start", "soon")][..], false),
            (&[("limit", "-1")][..], false),
            (&[("limit", "1e3")][..], true),
            (&[("direction", "sideways")][..], true),
            (&[("level", "INFO")][..], true),
            (&[("level", "trace")][..], true),
            (&[("cursor", "")][..], true),
        ] {
            let err = LogQuery::parse(&params(pairs), v2).err();
            assert_eq!(err.map(|e| e.status.as_u16()), Some(400), "{pairs:?}");
        }
    }
}
