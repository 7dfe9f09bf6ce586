//! E2B's request transforms (`network.rules` of its create and network update): per host
//! pattern, headers set on every HTTP request to a matching host (HTTPS through the session's
//! CA), whose values may name the tenant's E2B secrets as `${e2b.secrets.<name>}`, put in at
//! egress like a native secret's placeholder. The sandbox never holds a value. Rules are
//! stored with the session and resolved again whenever it runs on a new sandbox.

use std::sync::Arc;

use koder_netpolicy::{name_matches, Entry, NetConfig};

use crate::secrets::Binding;
use crate::Error;

/// Host pattern (a DNS name or `*.` and one) → the headers set on requests to it, as a
/// request gives them; checked by [`check`].
pub use koder_store::HeaderRules;

const MAX_HOSTS: usize = 64;
const MAX_HEADERS: usize = 32;
const MAX_HEADER_NAME: usize = 128;
const MAX_HEADER_VALUE: usize = 16 * 1024;
const SECRET_PREFIX: &str = "${e2b.secrets.";
/// Headers that frame or route the request (or the connection): setting one would let a
/// rule smuggle a second request or point this one elsewhere.
const FIXED: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
];

/// One host's rule of a session: its headers and the E2B secrets their values name.
#[derive(Debug)]
pub(crate) struct HeaderRule {
    pattern: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) secrets: Vec<Arc<Binding>>,
}

/// A checked rule: its host and headers, and the secret placeholders its values hold (as
/// written, with the name each stands for).
pub(crate) struct Checked {
    pub(crate) pattern: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) placeholders: Vec<(String, String)>,
}

impl HeaderRule {
    pub(crate) fn new(c: Checked, secrets: Vec<Arc<Binding>>) -> HeaderRule {
        HeaderRule {
            pattern: c.pattern,
            headers: c.headers,
            secrets,
        }
    }
}

/// Checks every rule; a 400 names what is wrong.
pub(crate) fn check(rules: &HeaderRules) -> Result<Vec<Checked>, Error> {
    let bad = |m: String| Err(Error::InvalidArgument(format!("network.rules: {m}")));
    if rules.len() > MAX_HOSTS {
        return bad(format!("at most {MAX_HOSTS} hosts"));
    }
    let mut checked = Vec::new();
    for (pattern, headers) in rules {
        let shown: String = pattern.chars().take(64).collect();
        match pattern.parse::<Entry>() {
            Ok(Entry::Domain { port: None, .. }) => {}
            _ => {
                return bad(format!(
                    "{shown:?} is not a DNS name or `*.` and one (no port, address or bare `*`)"
                ))
            }
        }
        if headers.len() > MAX_HEADERS {
            return bad(format!("at most {MAX_HEADERS} headers per host"));
        }
        let mut placeholders = Vec::new();
        for (name, value) in headers {
            let invalid =
                |m: String| Error::InvalidArgument(format!("network.rules: {shown}: {m}"));
            check_header(name, value).map_err(invalid)?;
            for p in secret_placeholders(value).map_err(invalid)? {
                if !placeholders.contains(&p) {
                    placeholders.push(p);
                }
            }
        }
        checked.push(Checked {
            pattern: pattern.to_ascii_lowercase(),
            headers: headers.clone(),
            placeholders,
        });
    }
    Ok(checked)
}

fn check_header(name: &str, value: &str) -> Result<(), String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    let shown: String = name.chars().take(64).collect();
    if name.is_empty() || name.len() > MAX_HEADER_NAME || !name.bytes().all(token) {
        return Err(format!(
            "header name {shown:?}: 1-{MAX_HEADER_NAME} token characters"
        ));
    }
    if FIXED.contains(&name.to_ascii_lowercase().as_str()) {
        return Err(format!(
            "header {shown:?} frames or routes the request: it cannot be set"
        ));
    }
    if value.len() > MAX_HEADER_VALUE || value.bytes().any(|b| b.is_ascii_control()) {
        return Err(format!(
            "header {shown:?}: a value of at most {MAX_HEADER_VALUE} bytes without control characters"
        ));
    }
    Ok(())
}

/// The `${e2b.secrets.<name>}` placeholders of `value`, each with the (lower-cased) name it
/// stands for; E2B's other placeholders (`${e2b.identity...}`: workload identity tokens) are
/// refused, any other `${` is plain text.
fn secret_placeholders(value: &str) -> Result<Vec<(String, String)>, String> {
    let mut found = Vec::new();
    let mut rest = value;
    while let Some(at) = rest.find("${e2b.") {
        let tail = &rest[at..];
        let Some(name) = tail.strip_prefix(SECRET_PREFIX) else {
            return Err(
                "only ${e2b.secrets.<name>} placeholders are served (no workload identity tokens)"
                    .into(),
            );
        };
        let end = name
            .find('}')
            .filter(|&e| e > 0)
            .ok_or("an unclosed or empty ${e2b.secrets.} placeholder")?;
        let whole = &tail[..SECRET_PREFIX.len() + end + 1];
        found.push((whole.to_string(), name[..end].to_lowercase()));
        rest = &tail[whole.len()..];
    }
    Ok(found)
}

/// The one rule for a connection to `ip` naming `name`, as E2B picks it: the exact name's,
/// else the longest wildcard's (rules are never merged); none when the name does not resolve
/// (by the server's resolver) to the connection's address, so a sandbox naming a ruled host
/// while dialling another gets nothing.
pub(crate) async fn select<'a>(
    rules: &'a [Arc<HeaderRule>],
    ip: std::net::IpAddr,
    name: &str,
    cfg: &NetConfig,
) -> Option<&'a Arc<HeaderRule>> {
    let rule = rules
        .iter()
        .filter(|r| name_matches(&r.pattern, name))
        .max_by_key(|r| (!r.pattern.starts_with("*."), r.pattern.len()))?;
    koder_netpolicy::resolve(cfg, name)
        .await
        .contains(&ip)
        .then_some(rule)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(pairs: &[(&str, &[(&str, &str)])]) -> HeaderRules {
        pairs
            .iter()
            .map(|(h, hs)| {
                let hs = hs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                (h.to_string(), hs)
            })
            .collect()
    }

    #[test]
    fn rules_are_checked() {
        let ok = rules(&[
            (
                "api.example.com",
                &[("Authorization", "Bearer ${e2b.secrets.OpenAI}")],
            ),
            (
                "*.example.org",
                &[
                    ("X-Team", "a ${not-ours} b"),
                    ("X-Two", "${e2b.secrets.a}${e2b.secrets.b}"),
                ],
            ),
        ]);
        let checked = check(&ok).unwrap();
        let of = |p: &str| {
            &checked
                .iter()
                .find(|c| c.pattern == p)
                .unwrap()
                .placeholders
        };
        assert_eq!(
            of("api.example.com"),
            &[("${e2b.secrets.OpenAI}".to_string(), "openai".to_string())]
        );
        assert_eq!(of("*.example.org").len(), 2);
        let long = "v".repeat(MAX_HEADER_VALUE + 1);
        for bad in [
            rules(&[("*", &[("X", "v")])]),
            rules(&[("10.0.0.1", &[("X", "v")])]),
            rules(&[("api.example.com:443", &[("X", "v")])]),
            rules(&[("not a host", &[("X", "v")])]),
            rules(&[("a.example.com", &[("Bad Name", "v")])]),
            rules(&[("a.example.com", &[("", "v")])]),
            rules(&[("a.example.com", &[("Host", "evil.test")])]),
            rules(&[("a.example.com", &[("Content-Length", "0")])]),
            rules(&[("a.example.com", &[("Transfer-Encoding", "chunked")])]),
            rules(&[("a.example.com", &[("X", "v\r\nInjected: 1")])]),
            rules(&[("a.example.com", &[("X", long.as_str())])]),
            rules(&[("a.example.com", &[("X", "${e2b.identity.tokens.aws}")])]),
            rules(&[("a.example.com", &[("X", "${e2b.secrets.open")])]),
            rules(&[("a.example.com", &[("X", "${e2b.secrets.}")])]),
        ] {
            assert!(check(&bad).is_err(), "{bad:?}");
        }
        let many: HeaderRules = (0..=MAX_HOSTS)
            .map(|i| (format!("h{i}.example.com"), Vec::new()))
            .collect();
        assert!(check(&many).is_err());
    }

    #[tokio::test]
    async fn the_exact_rule_then_the_longest_wildcard_for_a_name_that_resolves_there() {
        let cfg = NetConfig {
            hosts: [
                (
                    "api.example.com".to_string(),
                    vec!["10.1.0.1".parse().unwrap()],
                ),
                (
                    "deep.api.example.com".to_string(),
                    vec!["10.1.0.2".parse().unwrap()],
                ),
                ("example.com".to_string(), vec!["10.1.0.3".parse().unwrap()]),
            ]
            .into(),
            system_resolver: false,
            ..NetConfig::default()
        };
        let made: Vec<Arc<HeaderRule>> = check(&rules(&[
            ("api.example.com", &[("X", "exact")]),
            ("*.example.com", &[("X", "short")]),
            ("*.api.example.com", &[("X", "long")]),
        ]))
        .unwrap()
        .into_iter()
        .map(|c| Arc::new(HeaderRule::new(c, Vec::new())))
        .collect();
        let ip = |s: &str| s.parse().unwrap();
        let picked = |r: Option<&Arc<HeaderRule>>| r.map(|r| r.headers[0].1.clone());
        assert_eq!(
            picked(select(&made, ip("10.1.0.1"), "api.example.com", &cfg).await),
            Some("exact".into())
        );
        assert_eq!(
            picked(select(&made, ip("10.1.0.2"), "deep.api.example.com", &cfg).await),
            Some("long".into())
        );
        // A wildcard is no rule for its apex.
        assert_eq!(
            picked(select(&made, ip("10.1.0.3"), "example.com", &cfg).await),
            None
        );
        // The name of a ruled host while dialling another address.
        assert_eq!(
            picked(select(&made, ip("10.9.9.9"), "api.example.com", &cfg).await),
            None
        );
    }
}
