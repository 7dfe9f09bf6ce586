//! Secret injection on a plain-HTTP egress connection to a secret's hosts (or a host an E2B
//! header rule names): the first request head gets the rule's headers set (in place of the
//! request's own of those names) and each placeholder replaced by its value (headers only,
//! never the body) and `Connection: close` (so every request that needs a secret comes on a
//! connection of its own, decided and injected afresh); whatever the upstream sends back has
//! each value masked by its placeholder, cut or repeated to the value's length so lengths and
//! framing hold.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::secrets::{Binding, Dest};

/// Largest request head looked at; a longer one passes untouched.
const MAX_HEAD: usize = 64 * 1024;
const CHUNK: usize = 16 * 1024;

/// The request head with `headers` set and its placeholders replaced, and what was applied
/// (`secret <name>`, `header <name>`); `None` when `head` is not an HTTP/1 request head for
/// `host`.
pub(crate) fn rewrite_head(head: &[u8], host: &str, dest: &Dest) -> Option<(Vec<u8>, Vec<String>)> {
    let set: Vec<String> = dest
        .headers
        .iter()
        .map(|(k, _)| k.to_ascii_lowercase())
        .collect();
    let text = std::str::from_utf8(head).ok()?;
    let body = text.strip_suffix("\r\n\r\n")?;
    let mut lines = body.split("\r\n");
    let request_line = lines.next()?;
    if !request_line.ends_with("HTTP/1.1") && !request_line.ends_with("HTTP/1.0") {
        return None;
    }
    let mut out = String::with_capacity(head.len() + 64);
    out.push_str(request_line);
    out.push_str("\r\n");
    let mut applied = Vec::new();
    let mut named = false;
    for line in lines {
        let (key, value) = line.split_once(':')?;
        let key_l = key.trim().to_ascii_lowercase();
        if key_l == "connection" || set.contains(&key_l) {
            continue;
        }
        if key_l == "host" {
            let v = value.trim();
            let bare = v.strip_prefix('[').map_or_else(
                || v.split(':').next().unwrap_or(v),
                |v6| v6.split(']').next().unwrap_or(v6),
            );
            named = bare.eq_ignore_ascii_case(host);
        }
        out.push_str(key);
        out.push(':');
        out.push_str(&put_values(value, &dest.bound, &mut applied));
        out.push_str("\r\n");
    }
    if !named {
        return None;
    }
    for (key, value) in &dest.headers {
        applied.push(format!("header {key}"));
        out.push_str(key);
        out.push_str(": ");
        out.push_str(&put_values(value, &dest.bound, &mut applied));
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    Some((out.into_bytes(), applied))
}

/// `value` with each bound secret's placeholder replaced by its value, noting each applied.
fn put_values(value: &str, bound: &[Arc<Binding>], applied: &mut Vec<String>) -> String {
    let mut value = value.to_string();
    for b in bound {
        if value.contains(&b.placeholder) {
            value = value.replace(&b.placeholder, &b.value);
            let name = format!("secret {}", b.name);
            if !applied.contains(&name) {
                applied.push(name);
            }
        }
    }
    value
}

/// Masks every value in a byte stream, across chunk boundaries.
pub(crate) struct Scrubber {
    pairs: Vec<(Vec<u8>, Vec<u8>)>,
    held: Vec<u8>,
    keep: usize,
}

impl Scrubber {
    pub(crate) fn new(bound: &[Arc<Binding>]) -> Scrubber {
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = bound
            .iter()
            .map(|b| {
                let mask = b.placeholder.bytes().cycle().take(b.value.len()).collect();
                (b.value.as_bytes().to_vec(), mask)
            })
            .collect();
        let keep = pairs.iter().map(|(v, _)| v.len()).max().unwrap_or(1) - 1;
        Scrubber {
            pairs,
            held: Vec::new(),
            keep,
        }
    }

    /// What may be passed on of the stream so far (a possible start of a value is held back).
    pub(crate) fn push(&mut self, data: &[u8]) -> Vec<u8> {
        self.held.extend_from_slice(data);
        self.mask();
        let ready = self.held.len().saturating_sub(self.keep);
        self.held.drain(..ready).collect()
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.mask();
        self.held
    }

    fn mask(&mut self) {
        for (value, mask) in &self.pairs {
            let mut at = 0;
            while let Some(i) = find(&self.held[at..], value) {
                let start = at + i;
                self.held[start..start + value.len()].copy_from_slice(mask);
                at = start + value.len();
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Carries one connection between the sandbox's side (`sandbox`) and the upstream, injecting
/// into its first request head; `applied` hears which secrets went out.
pub(crate) async fn pump<S, U>(
    sandbox: S,
    upstream: U,
    host: String,
    dest: Dest,
    applied: impl FnOnce(Vec<String>) + Send,
) where
    S: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let (mut sr, mut sw) = tokio::io::split(sandbox);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let outbound = async {
        let mut head = Vec::new();
        let mut chunk = vec![0u8; CHUNK];
        let end = loop {
            if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                break Some(i + 4);
            }
            if head.len() > MAX_HEAD {
                break None;
            }
            match sr.read(&mut chunk).await {
                Ok(n) if n > 0 => head.extend_from_slice(&chunk[..n]),
                _ => break None,
            }
        };
        let first = end.and_then(|end| {
            let (rewritten, names) = rewrite_head(&head[..end], &host, &dest)?;
            Some(([rewritten.as_slice(), &head[end..]].concat(), names))
        });
        let first = match first {
            Some((bytes, names)) => {
                if !names.is_empty() {
                    applied(names);
                }
                bytes
            }
            None => head,
        };
        if uw.write_all(&first).await.is_ok() {
            let _ = tokio::io::copy(&mut sr, &mut uw).await;
        }
        let _ = uw.shutdown().await;
    };
    let inbound = async {
        let mut scrub = Scrubber::new(&dest.bound);
        let mut chunk = vec![0u8; CHUNK];
        loop {
            match ur.read(&mut chunk).await {
                Ok(n) if n > 0 => {
                    if sw.write_all(&scrub.push(&chunk[..n])).await.is_err() {
                        return;
                    }
                }
                _ => break,
            }
        }
        let _ = sw.write_all(&scrub.finish()).await;
        let _ = sw.shutdown().await;
    };
    tokio::join!(outbound, inbound);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(name: &str, value: &str) -> Arc<Binding> {
        Arc::new(Binding::new(name.into(), value.into(), Vec::new(), None))
    }

    fn to(bound: &[Arc<Binding>], headers: &[(&str, &str)]) -> Dest {
        Dest {
            bound: bound.to_vec(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn placeholders_are_replaced_in_headers_only() {
        let b = binding("T", "real-value");
        let p = b.placeholder.clone();
        let head = format!(
            "GET /{p} HTTP/1.1\r\nHost: api.test:8080\r\nAuthorization: Bearer {p}\r\nConnection: keep-alive\r\n\r\n"
        );
        let (out, applied) = rewrite_head(head.as_bytes(), "api.test", &to(&[b], &[])).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(applied, ["secret T"]);
        assert!(
            out.contains("Authorization: Bearer real-value\r\n"),
            "{out}"
        );
        assert!(
            out.starts_with(&format!("GET /{p} ")),
            "the request line is not a header: {out}"
        );
        assert!(out.ends_with("Connection: close\r\n\r\n") && !out.contains("keep-alive"));
        assert!(
            rewrite_head(
                head.as_bytes(),
                "other.test",
                &to(&[binding("T", "v")], &[])
            )
            .is_none(),
            "another Host"
        );
        assert!(rewrite_head(b"\x16\x03\x01junk\r\n\r\n", "api.test", &to(&[], &[])).is_none());
    }

    #[test]
    fn a_rule_s_headers_replace_the_request_s_own_and_take_secrets() {
        let b = Arc::new(Binding::new(
            "e2b.secrets.openai".into(),
            "sk-real".into(),
            Vec::new(),
            Some("${e2b.secrets.openai}".into()),
        ));
        let head = "POST /v1 HTTP/1.1\r\nHost: api.test\r\nauthorization: Bearer mine\r\nX-Other: ${e2b.secrets.openai}\r\nContent-Length: 2\r\n\r\n";
        let dest = to(
            &[b],
            &[
                ("Authorization", "Bearer ${e2b.secrets.openai}"),
                ("X-Team", "a"),
            ],
        );
        let (out, applied) = rewrite_head(head.as_bytes(), "api.test", &dest).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            !out.contains("Bearer mine"),
            "the request's own is replaced: {out}"
        );
        assert!(out.contains("Authorization: Bearer sk-real\r\n"), "{out}");
        assert!(
            out.contains("X-Team: a\r\n") && out.contains("Content-Length: 2\r\n"),
            "{out}"
        );
        assert_eq!(
            applied,
            [
                "secret e2b.secrets.openai",
                "header Authorization",
                "header X-Team"
            ]
        );
        assert!(out.ends_with("Connection: close\r\n\r\n"), "{out}");
    }

    #[test]
    fn echoed_values_are_masked_across_chunks() {
        let b = binding("T", "real-value");
        let mut s = Scrubber::new(std::slice::from_ref(&b));
        let text = b"xx real-value yy real-value";
        let mut out = Vec::new();
        for c in text.chunks(3) {
            out.extend(s.push(c));
        }
        out.extend(s.finish());
        assert_eq!(out.len(), text.len(), "lengths hold");
        let out = String::from_utf8(out).unwrap();
        assert!(!out.contains("real-value"), "{out}");
        assert!(out.contains(&b.placeholder[..10]), "{out}");
    }
}
