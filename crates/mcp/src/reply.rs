//! How a tool call is read and answered: the arguments extractor that turns every bad argument
//! into a tool error, the error with its `SANDBOX-...` code, and the results an agent reads.
//!
//! MCP distinguishes protocol errors (a JSON-RPC error: unknown tool, malformed request) from
//! tool errors (a result with `isError: true` the model sees and can act on). Everything a model
//! can get wrong or the daemon can refuse is a tool error here, carrying the daemon's code.

use std::sync::Arc;

use koder_sdk::codes;
use rmcp::handler::server::common::{schema_for_empty_input, schema_for_input, FromContextPart};
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{CallToolResult, ContentBlock, JsonObject};
use rmcp::schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

/// Code of a failure between this server and the daemon (unreachable, an answer it could not
/// read): the daemon never saw or never answered the request.
pub const TRANSPORT: &str = "SANDBOX-MCP-TRANSPORT";

/// Code of a call the client cancelled before it finished.
pub const CANCELLED: &str = "SANDBOX-MCP-CANCELLED";

/// A failed tool call, as the agent sees it: `CODE: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ToolError {
    pub code: String,
    pub message: String,
}

impl ToolError {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        ToolError {
            code: code.into(),
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        ToolError::new(codes::INVALID_ARGUMENT, message)
    }

    /// The tool result carrying this error: text for the model, the REST error envelope as
    /// structured content for programs.
    pub fn into_result(self) -> CallToolResult {
        let text = self.to_string();
        let mut result = CallToolResult::structured_error(json!({
            "error": {"code": self.code, "message": self.message}
        }));
        result.content = vec![ContentBlock::text(text)];
        result
    }
}

impl From<koder_sdk::Error> for ToolError {
    fn from(e: koder_sdk::Error) -> Self {
        match e {
            koder_sdk::Error::Api { code, message, .. } => ToolError::new(code, message),
            koder_sdk::Error::InvalidName(_) => ToolError::invalid(e.to_string()),
            other => ToolError::new(TRANSPORT, other.to_string()),
        }
    }
}

/// A tool's answer: `value` as structured content (and as its JSON text), or the error.
pub fn answer<T: Serialize>(outcome: Result<T, ToolError>) -> CallToolResult {
    let value = outcome.and_then(|v| {
        serde_json::to_value(v)
            .map_err(|e| ToolError::new(codes::INTERNAL, format!("encoding the answer: {e}")))
    });
    match value {
        Ok(v) => CallToolResult::structured(v),
        Err(e) => e.into_result(),
    }
}

/// A tool's arguments, parsed; a parse failure is kept for the tool to answer with, so that a
/// model's mistake comes back as a tool error it can read rather than a protocol error.
pub struct Args<T>(pub Result<T, ToolError>);

impl<S, T> FromContextPart<ToolCallContext<'_, S>> for Args<T>
where
    T: DeserializeOwned + JsonSchema + 'static,
{
    fn from_context_part(context: &mut ToolCallContext<S>) -> Result<Self, rmcp::ErrorData> {
        let arguments = context.arguments.take().unwrap_or_default();
        Ok(Args(parse::<T>(arguments)))
    }
}

/// `T`'s input schema, as `tools/list` announces it.
pub fn input_schema<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    // Every argument type is a struct, whose schema is an object: the fallback never shows, and
    // a test checks each tool's schema.
    schema_for_input::<T>().unwrap_or_else(|_| schema_for_empty_input())
}

/// Parses arguments, refusing names the schema does not declare (a misspelt option must not be
/// silently ignored).
pub fn parse<T: DeserializeOwned + JsonSchema + 'static>(args: JsonObject) -> Result<T, ToolError> {
    let schema = input_schema::<T>();
    let known = schema.get("properties").and_then(Value::as_object);
    if let Some(unknown) = args
        .keys()
        .find(|k| known.is_none_or(|p| !p.contains_key(*k)))
    {
        let expected: Vec<&str> = known
            .map(|p| p.keys().map(String::as_str).collect())
            .unwrap_or_default();
        return Err(ToolError::invalid(format!(
            "unknown argument {:?}; the arguments are: {}",
            clip(unknown, 64),
            expected.join(", ")
        )));
    }
    serde_json::from_value(Value::Object(args))
        .map_err(|e| ToolError::invalid(format!("invalid arguments: {e}")))
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn clip(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The last `max` bytes of `text` (cut at a character boundary) and whether anything was cut.
/// The end of a program's output is where its errors are.
pub fn tail(text: String, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    (text[start..].to_string(), true)
}
