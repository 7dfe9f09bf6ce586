//! The line protocol on an interpreter's control pipes: requests in (fd 3), events out (fd 4).

use std::collections::VecDeque;

use koder_agent_protocol::CHUNK_BYTES;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;

/// Longest event line read from a driver; longer ones are skipped whole.
pub(super) const MAX_EVENT_LINE: usize = 2 << 20;

/// What a driver says, one JSON object per line.
#[derive(Deserialize)]
pub(super) struct Event {
    pub(super) ev: String,
    #[serde(default)]
    pub(super) n: u64,
    #[serde(default)]
    pub(super) main: bool,
    #[serde(default)]
    pub(super) data: Option<Mime>,
    #[serde(default)]
    pub(super) error: Option<DriverError>,
}

#[derive(Deserialize)]
pub(super) struct Mime {
    pub(super) text: Option<String>,
    pub(super) html: Option<String>,
    pub(super) markdown: Option<String>,
    pub(super) json: Option<String>,
    pub(super) png: Option<String>,
    pub(super) svg: Option<String>,
    pub(super) jpeg: Option<String>,
    pub(super) latex: Option<String>,
    pub(super) data: Option<String>,
    pub(super) chart: Option<String>,
    pub(super) pdf: Option<String>,
    pub(super) javascript: Option<String>,
    pub(super) extra: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct DriverError {
    #[serde(default)]
    pub(super) name: String,
    #[serde(default)]
    pub(super) value: String,
    #[serde(default)]
    pub(super) traceback: String,
}

#[derive(Serialize)]
pub(super) struct Request<'a> {
    pub(super) code: &'a str,
    pub(super) n: u64,
    pub(super) env: std::collections::BTreeMap<&'a str, &'a str>,
}

pub(super) enum Line {
    Full(Vec<u8>),
    TooLong,
}

/// Splits a driver's events into lines, never holding more than [`MAX_EVENT_LINE`] bytes.
/// Cancel-safe: a read interrupted by `select!` loses nothing.
pub(super) struct LineReader {
    r: pipe::Receiver,
    chunk: Vec<u8>,
    partial: Vec<u8>,
    skipping: bool,
    lines: VecDeque<Line>,
}

impl LineReader {
    pub(super) fn new(r: pipe::Receiver) -> Self {
        Self {
            r,
            chunk: vec![0u8; CHUNK_BYTES],
            partial: Vec::new(),
            skipping: false,
            lines: VecDeque::new(),
        }
    }

    pub(super) async fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            if let Some(line) = self.lines.pop_front() {
                return Ok(Some(line));
            }
            let n = self.r.read(&mut self.chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            self.absorb(n);
        }
    }

    fn absorb(&mut self, n: usize) {
        let mut data = &self.chunk[..n];
        while let Some(pos) = data.iter().position(|&b| b == b'\n') {
            let line = &data[..pos];
            if self.skipping || self.partial.len() + line.len() > MAX_EVENT_LINE {
                self.skipping = false;
                self.partial.clear();
                self.lines.push_back(Line::TooLong);
            } else {
                self.partial.extend_from_slice(line);
                self.lines
                    .push_back(Line::Full(std::mem::take(&mut self.partial)));
            }
            data = &data[pos + 1..];
        }
        if self.skipping {
            return;
        }
        if self.partial.len() + data.len() > MAX_EVENT_LINE {
            self.partial = Vec::new();
            self.skipping = true;
        } else {
            self.partial.extend_from_slice(data);
        }
    }
}
