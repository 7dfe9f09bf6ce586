//! Rows of the result table, their targets, and the markdown/JSON renderings.

use serde::Serialize;
use serde_json::Value;

use crate::host::Machine;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Pass,
    Fail,
    /// A measurement without a target (baselines, context figures).
    Info,
    /// The feature is not available on this daemon or host.
    NotAvailable,
    /// The measurement could not be taken.
    Error,
}

impl Status {
    fn cell(self) -> &'static str {
        match self {
            Status::Pass => "✅ pass",
            Status::Fail => "❌ fail",
            Status::Info => "—",
            Status::NotAvailable => "n/a",
            Status::Error => "⚠️ error",
        }
    }

    pub fn verdict(ok: bool) -> Status {
        if ok {
            Status::Pass
        } else {
            Status::Fail
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub id: &'static str,
    pub name: String,
    pub result: String,
    pub target: String,
    pub status: Status,
    #[serde(skip_serializing_if = "Value::is_null")]
    pub data: Value,
}

impl Row {
    pub fn info(id: &'static str, name: impl Into<String>, result: impl Into<String>) -> Row {
        Row {
            id,
            name: name.into(),
            result: result.into(),
            target: String::new(),
            status: Status::Info,
            data: Value::Null,
        }
    }

    pub fn target(mut self, target: impl Into<String>, status: Status) -> Row {
        self.target = target.into();
        self.status = status;
        self
    }

    pub fn data(mut self, data: Value) -> Row {
        self.data = data;
        self
    }

    pub fn error(id: &'static str, name: impl Into<String>, error: &anyhow::Error) -> Row {
        let text = format!("{error:#}");
        let text: String = text.chars().take(300).collect();
        Row {
            id,
            name: name.into(),
            result: format!("error: {}", text.replace('|', "/").replace('\n', " ")),
            target: String::new(),
            status: Status::Error,
            data: Value::Null,
        }
    }

    pub fn not_available(id: &'static str, name: impl Into<String>, why: &str) -> Row {
        Row {
            id,
            name: name.into(),
            result: format!("n/a ({why})"),
            target: String::new(),
            status: Status::NotAvailable,
            data: Value::Null,
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub tool: &'static str,
    pub started_at: String,
    pub duration_s: f64,
    pub mode: &'static str,
    pub build: &'static str,
    pub machine: Machine,
    pub load_avg_1m_at_start: f64,
    pub load_avg_1m_at_end: f64,
    pub settings: Value,
    pub rows: Vec<Row>,
}

impl Report {
    pub fn markdown(&self) -> String {
        let m = &self.machine;
        let mut out = String::new();
        out.push_str(&format!(
            "koder-bench ({} run, {} build) — {} — {:.0} s\n\n",
            self.mode, self.build, self.started_at, self.duration_s
        ));
        out.push_str(&format!(
            "Machine: {} ({} cores), {:.1} GiB RAM, {}, Linux {}, cgroups {}; 1-min load average {:.2} at start, {:.2} at end\n\n",
            m.cpu,
            m.cores,
            m.memory_gib,
            m.os,
            m.kernel,
            m.cgroups,
            self.load_avg_1m_at_start,
            self.load_avg_1m_at_end
        ));
        out.push_str("| measurement | result | target | status |\n|---|---|---|---|\n");
        for r in &self.rows {
            out.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                r.name,
                r.result,
                if r.target.is_empty() {
                    "—"
                } else {
                    &r.target
                },
                r.status.cell()
            ));
        }
        let count = |s: Status| self.rows.iter().filter(|r| r.status == s).count();
        out.push_str(&format!(
            "\n{} pass, {} fail, {} n/a, {} error\n",
            count(Status::Pass),
            count(Status::Fail),
            count(Status::NotAvailable),
            count(Status::Error)
        ));
        out
    }

    pub fn has_errors(&self) -> bool {
        self.rows.iter().any(|r| r.status == Status::Error)
    }
}
