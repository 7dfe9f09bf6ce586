//! Shapes of the code interpreter (API.md "Code interpreter"): stateful Python and Node
//! contexts and the rich results of their runs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// `POST /v1/sandbox/sessions/{id}/contexts`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateContext {
    /// "python" (default), "node" (aliases: "py", "javascript", "js"), "typescript" ("ts":
    /// Node with each cell's types stripped, not checked; the image needs the typescript
    /// package), "bash" (a long-lived
    /// shell: variables, functions and the directory persist; aliases "sh", "shell"), "java"
    /// (JShell: classes, methods and variables persist; the image needs a JDK) or "r" (one R
    /// session; the image needs R).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Working directory of the interpreter (an existing absolute path; default the session's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Environment variables of this context's interpreter, beyond the session's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// A code-interpreter context: one long-lived interpreter in the session's sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Context {
    pub context_id: String,
    pub language: String,
    /// Runs so far in this interpreter (0 after a restart).
    pub execution_count: u64,
    /// Working directory the interpreter started in.
    pub cwd: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ContextList {
    /// In creation order.
    pub contexts: Vec<Context>,
}

/// `POST /v1/sandbox/sessions/{id}/contexts/{cid}/run`
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RunCode {
    pub code: String,
    /// Default and maximum as for exec; on expiry the interpreter is killed and restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub timeout_ms: Option<u64>,
    /// Environment variables set for this run only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// One displayable value in every representation it offered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RichOutput {
    /// The value of the run's last expression (at most one per run).
    pub is_main_result: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub markdown: Option<String>,
    /// The value as JSON, where it has a JSON form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub json: Option<serde_json::Value>,
    /// Base64 PNG (matplotlib figures, `_repr_png_`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub png: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    /// Base64 JPEG (`_repr_jpeg_`: PIL images).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jpeg: Option<String>,
    /// LaTeX source (`_repr_latex_`: sympy expressions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latex: Option<String>,
    /// Tabular data (a pandas DataFrame): each column's name → its values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub data: Option<serde_json::Value>,
    /// The chart a matplotlib figure draws, for clients that redraw it (E2B's `chart`
    /// format): `type` (`line`, `scatter`, `bar`, `pie`, `box_and_whisker`, `superchart`,
    /// `unknown`), `title`, `elements`, and for the planar kinds axis labels, units, ticks and
    /// scales. docs/API.md has the fields of each kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub chart: Option<serde_json::Value>,
    /// Base64 PDF (`_repr_pdf_`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pdf: Option<String>,
    /// JavaScript source (`application/javascript`: `IPython.display.Javascript`, Bokeh).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub javascript: Option<String>,
    /// The other MIME types a displayed bundle offered, each type → its value
    /// (`{"application/vnd.plotly.v1+json": {...}}`; E2B's `extra`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub extra: Option<serde_json::Value>,
}

/// The exception a run raised.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RunError {
    /// Exception class ("ValueError", "TypeError"); "TimeoutError" or "InterpreterDied" when
    /// the interpreter was killed.
    pub name: String,
    pub value: String,
    pub traceback: String,
}

/// A run's outcome. A streamed run's last event carries it with empty `stdout`/`stderr`
/// (those came as events of their own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RunResult {
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    #[serde(default)]
    pub stdout_truncated: bool,
    #[serde(default)]
    pub stderr_truncated: bool,
    /// Rich outputs in display order (figures, displayed objects, the last value).
    #[serde(default)]
    pub results: Vec<RichOutput>,
    pub error: Option<RunError>,
    pub execution_count: u64,
    pub duration_ms: u64,
    /// One of the exec verdict codes, or null for a run that ended by itself.
    pub verdict: Option<String>,
    /// The interpreter was killed (timeout, crash, OOM) and started afresh: state is lost.
    pub restarted: bool,
}
