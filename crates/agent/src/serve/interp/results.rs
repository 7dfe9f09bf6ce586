//! The rich results of a run, bounded in number and size, and the driver's error, clipped.

use koder_agent_protocol::{RichResult, RunError};

use super::control::{DriverError, Mime};
use super::limits::RESULT_BUDGET;

/// Room for the short notes that replace outputs over the budget.
const NOTE_SLACK: usize = 32 * 1024;
const MAX_RESULTS: usize = 256;
const MAX_ERROR_NAME: usize = 1024;
const MAX_ERROR_VALUE: usize = 16 * 1024;
const MAX_TRACEBACK: usize = 64 * 1024;

/// Rich outputs of a run, bounded in number and total size.
#[derive(Default)]
pub(super) struct Results {
    pub(super) list: Vec<RichResult>,
    pub(super) used: usize,
}

impl Results {
    pub(super) fn push(&mut self, r: RichResult) {
        if self.list.len() >= MAX_RESULTS {
            return;
        }
        let size = rich_size(&r);
        if self.used + size <= RESULT_BUDGET {
            self.used += size;
            self.list.push(r);
            return;
        }
        self.note(
            r.is_main_result,
            format!("[output of {size} bytes omitted: over this run's result budget]"),
        );
    }

    pub(super) fn note(&mut self, is_main_result: bool, text: String) {
        if self.list.len() >= MAX_RESULTS || self.used + text.len() > RESULT_BUDGET + NOTE_SLACK {
            return;
        }
        self.used += text.len();
        self.list.push(RichResult {
            is_main_result,
            text: Some(text),
            ..Default::default()
        });
    }
}

fn rich_size(r: &RichResult) -> usize {
    [
        &r.text,
        &r.html,
        &r.markdown,
        &r.json,
        &r.png,
        &r.svg,
        &r.jpeg,
        &r.latex,
        &r.data,
        &r.chart,
        &r.pdf,
        &r.javascript,
        &r.extra,
    ]
    .iter()
    .map(|f| f.as_ref().map_or(0, String::len))
    .sum()
}

pub(super) fn rich(m: Mime, main: bool) -> RichResult {
    RichResult {
        is_main_result: main,
        text: m.text,
        html: m.html,
        markdown: m.markdown,
        json: m.json,
        png: m.png,
        svg: m.svg,
        jpeg: m.jpeg,
        latex: m.latex,
        data: m.data,
        chart: m.chart,
        pdf: m.pdf,
        javascript: m.javascript,
        // E2B's `extra` maps MIME types to values: whatever else a driver sends is dropped
        // here, so no transport passes it on as something its schema does not say.
        extra: m.extra.filter(|text| is_json_object(text)),
    }
}

fn is_json_object(text: &str) -> bool {
    matches!(serde_json::from_str(text), Ok(serde_json::Value::Object(_)))
}

pub(super) fn run_error(e: DriverError) -> RunError {
    RunError {
        name: clip(e.name, MAX_ERROR_NAME),
        value: clip(e.value, MAX_ERROR_VALUE),
        traceback: clip(e.traceback, MAX_TRACEBACK),
    }
}

fn clip(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_is_kept_only_as_a_json_object() {
        for (text, kept) in [
            (r#"{"application/vnd.plotly.v1+json": {"data": []}}"#, true),
            ("[1]", false),
            ("\"s\"", false),
            ("{broken", false),
        ] {
            let m: Mime = serde_json::from_value(serde_json::json!({ "extra": text })).unwrap();
            assert_eq!(rich(m, false).extra.is_some(), kept, "{text}");
        }
    }
}
