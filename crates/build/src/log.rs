//! One build's log: every line kept (bounded), followers get what was written so far and then
//! each new line as it comes, and the build's final status at the end.

use koder_api_types::Build;
use parking_lot::Mutex;
use tokio::sync::broadcast;

/// Lines kept per build (the oldest dropped beyond, as the log says).
const MAX_LINES: usize = 50_000;
/// Lines in a status's `log_tail`.
const TAIL_LINES: usize = 40;

#[derive(Debug, Clone)]
pub enum LogEvent {
    Line(String),
    /// The build ended: its final status.
    Done(Box<Build>),
}

/// What a follower gets: the lines so far, then `live` (none once the build ended, when
/// `done` is its final status).
pub struct Follow {
    pub replay: Vec<String>,
    pub live: Option<broadcast::Receiver<LogEvent>>,
    pub done: Option<Box<Build>>,
}

pub(crate) struct BuildLog {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<LogEvent>,
}

struct Inner {
    lines: Vec<String>,
    dropped: usize,
    /// Lines pushed so far, dropped ones included.
    written: u64,
    /// Output of the running step not yet ended by a newline.
    partial: String,
    done: Option<Box<Build>>,
}

impl BuildLog {
    pub(crate) fn new() -> Self {
        Self {
            inner: Mutex::new(Inner {
                lines: Vec::new(),
                dropped: 0,
                written: 0,
                partial: String::new(),
                done: None,
            }),
            tx: broadcast::channel(1024).0,
        }
    }

    pub(crate) fn line(&self, line: impl Into<String>) {
        let mut inner = self.inner.lock();
        let pending = std::mem::take(&mut inner.partial);
        if !pending.is_empty() {
            self.push(&mut inner, pending);
        }
        self.push(&mut inner, line.into());
    }

    /// Output bytes of a step, cut into lines.
    pub(crate) fn output(&self, bytes: &[u8]) {
        let mut inner = self.inner.lock();
        inner.partial.push_str(&String::from_utf8_lossy(bytes));
        while let Some(at) = inner.partial.find('\n') {
            let rest = inner.partial.split_off(at + 1);
            let mut line = std::mem::replace(&mut inner.partial, rest);
            line.pop();
            self.push(&mut inner, line);
        }
    }

    fn push(&self, inner: &mut Inner, line: String) {
        if inner.lines.len() == MAX_LINES {
            inner.lines.remove(0);
            inner.dropped += 1;
        }
        inner.lines.push(line.clone());
        inner.written += 1;
        // No follower is no error.
        let _ = self.tx.send(LogEvent::Line(line));
    }

    pub(crate) fn finish(&self, status: Build) {
        let mut inner = self.inner.lock();
        let pending = std::mem::take(&mut inner.partial);
        if !pending.is_empty() {
            self.push(&mut inner, pending);
        }
        inner.done = Some(Box::new(status.clone()));
        let _ = self.tx.send(LogEvent::Done(Box::new(status)));
    }

    /// Lines written so far: it changes whenever the log does.
    pub(crate) fn written(&self) -> u64 {
        self.inner.lock().written
    }

    pub(crate) fn tail(&self) -> String {
        let inner = self.inner.lock();
        let from = inner.lines.len().saturating_sub(TAIL_LINES);
        inner.lines[from..].join("\n")
    }

    /// The whole log, as kept with the image.
    pub(crate) fn text(&self) -> String {
        let inner = self.inner.lock();
        let mut text = String::new();
        if inner.dropped > 0 {
            text.push_str(&format!("[{} earlier lines dropped]\n", inner.dropped));
        }
        for line in &inner.lines {
            text.push_str(line);
            text.push('\n');
        }
        text
    }

    /// Subscribed under the same lock lines are written with, so none is lost or doubled.
    pub(crate) fn follow(&self) -> Follow {
        let inner = self.inner.lock();
        Follow {
            replay: inner.lines.clone(),
            live: inner.done.is_none().then(|| self.tx.subscribe()),
            done: inner.done.clone(),
        }
    }
}

/// A stored log ([`BuildLog::text`]) as its lines again.
pub(crate) fn lines(text: &str) -> Vec<String> {
    text.lines().map(str::to_owned).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_cut_into_lines_and_followers_miss_nothing() {
        let log = BuildLog::new();
        log.line("step 1/1");
        log.output(b"a\nb");
        let mut f = log.follow();
        assert_eq!(f.replay, ["step 1/1", "a"]);
        assert_eq!(log.written(), 2, "a partial line is not written yet");
        log.output(b"c\n");
        assert_eq!(log.written(), 3);
        let live = f.live.as_mut().unwrap();
        assert!(matches!(live.try_recv(), Ok(LogEvent::Line(l)) if l == "bc"));
        assert_eq!(log.tail(), "step 1/1\na\nbc");
        assert!(log.text().ends_with("bc\n"));
    }
}
