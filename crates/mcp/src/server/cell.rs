//! A notebook cell's answer: its outcome as the model reads it, and its figures as images the
//! model sees.

use koder_sdk::types::contexts::{RichOutput, RunError, RunResult};
use rmcp::model::ContentBlock;
use serde::Serialize;
use serde_json::Value;

use crate::reply::tail;
use crate::server::MAX_STREAM_BYTES;

/// Largest text representation (html, markdown, svg, latex) kept of one result: a model reads
/// the plain text; the others are for clients that render them.
const MAX_REPRESENTATION_BYTES: usize = 16 * 1024;

#[derive(Debug, Serialize)]
pub struct CellView {
    /// Where the cell ran: pass it as `context_id` to run the next cell there.
    context_id: String,
    language: String,
    execution_count: u64,
    stdout: String,
    stderr: String,
    stdout_truncated: bool,
    stderr_truncated: bool,
    /// The last expression's value (`is_main_result`), displayed objects, figures.
    results: Vec<ResultView>,
    /// The exception the code raised.
    error: Option<RunError>,
    /// Why the sandbox stopped the cell (SANDBOX-EXEC-TIMEOUT, ...), if it did.
    verdict: Option<String>,
    /// The interpreter was killed and started afresh: earlier variables are gone.
    restarted: bool,
}

/// One result without its images, which follow the answer as image content.
#[derive(Debug, Serialize)]
struct ResultView {
    is_main_result: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    markdown: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    html: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    svg: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    latex: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    json: Option<Value>,
    /// A DataFrame's columns.
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Value>,
    /// A figure's chart data (its kind, title, axes, the values it plots).
    #[serde(skip_serializing_if = "Option::is_none")]
    chart: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    javascript: Option<String>,
    /// Other MIME types a displayed bundle offered (type → value).
    #[serde(skip_serializing_if = "Option::is_none")]
    extra: Option<Value>,
    /// `image/png` or `image/jpeg` when the result is also an image of this answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<&'static str>,
}

impl CellView {
    /// The view of `run` in `context_id`, and the images of its results in order.
    pub fn new(context_id: String, language: String, run: RunResult) -> (Self, Vec<ContentBlock>) {
        let (stdout, stdout_cut) = tail(run.stdout, MAX_STREAM_BYTES);
        let (stderr, stderr_cut) = tail(run.stderr, MAX_STREAM_BYTES);
        let mut images = Vec::new();
        let results = run
            .results
            .into_iter()
            .map(|r| ResultView::new(r, &mut images))
            .collect();
        let view = CellView {
            context_id,
            language,
            execution_count: run.execution_count,
            stdout,
            stderr,
            stdout_truncated: run.stdout_truncated || stdout_cut,
            stderr_truncated: run.stderr_truncated || stderr_cut,
            results,
            error: run.error,
            verdict: run.verdict,
            restarted: run.restarted,
        };
        (view, images)
    }
}

impl ResultView {
    fn new(r: RichOutput, images: &mut Vec<ContentBlock>) -> Self {
        let image = match (r.png, r.jpeg) {
            (Some(png), _) => Some((png, "image/png")),
            (None, Some(jpeg)) => Some((jpeg, "image/jpeg")),
            (None, None) => None,
        };
        let mime = image.map(|(data, mime)| {
            images.push(ContentBlock::image(data, mime));
            mime
        });
        let short = |s: Option<String>| s.map(|s| head(s, MAX_REPRESENTATION_BYTES));
        ResultView {
            is_main_result: r.is_main_result,
            text: r.text.map(|t| head(t, MAX_STREAM_BYTES)),
            markdown: short(r.markdown),
            html: short(r.html),
            svg: short(r.svg),
            latex: short(r.latex),
            json: r.json,
            data: r.data,
            chart: r.chart,
            javascript: short(r.javascript),
            extra: r.extra,
            image: mime,
        }
    }
}

/// The first `max` bytes of `text` (at a character boundary), marked when cut.
fn head(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(" [... cut]");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_become_images_and_long_representations_are_cut() {
        let figure = RichOutput {
            text: Some("<Figure>".into()),
            png: Some("iVBORw0KGgo=".into()),
            chart: Some(serde_json::json!({"type": "line"})),
            ..Default::default()
        };
        let value = RichOutput {
            is_main_result: true,
            text: Some("42".into()),
            html: Some("é".repeat(MAX_REPRESENTATION_BYTES)),
            jpeg: Some("/9g=".into()),
            ..Default::default()
        };
        let run = RunResult {
            stdout: "x".repeat(MAX_STREAM_BYTES + 10),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            results: vec![figure, value],
            error: None,
            execution_count: 3,
            duration_ms: 1,
            verdict: None,
            restarted: false,
        };
        let (view, images) = CellView::new("c1".into(), "python".into(), run);
        assert_eq!(images.len(), 2);
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["results"][0]["image"], "image/png");
        assert_eq!(json["results"][0]["chart"]["type"], "line");
        assert!(
            json["results"][0].get("png").is_none(),
            "images are not in the JSON"
        );
        assert_eq!(json["results"][1]["image"], "image/jpeg");
        let html = json["results"][1]["html"].as_str().unwrap();
        assert!(html.len() <= MAX_REPRESENTATION_BYTES + 10 && html.ends_with("[... cut]"));
        assert_eq!(json["stdout_truncated"], true);
        assert_eq!(json["stdout"].as_str().unwrap().len(), MAX_STREAM_BYTES);
    }
}
