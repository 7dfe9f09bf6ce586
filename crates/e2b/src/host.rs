//! Host-based routing: `<port>-<sandbox id>.<domain>`, the names E2B's SDK builds for a
//! sandbox's ports (`Sandbox.get_host(port)`, and envd's own address when `E2B_SANDBOX_URL`
//! is unset), served when the daemon has a sandbox domain (`[e2b] domain`).

use axum::http::{header, HeaderMap, Uri};

/// What a request's `Host` names: a port of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostRoute {
    pub sandbox: String,
    pub port: u16,
}

/// The route the request's host (HTTP/2's `:authority`, else `Host`) names under `domain`;
/// `None` for every other name (the daemon's own, `api.<domain>`, an address), which the
/// other surfaces serve as before.
pub(crate) fn route(uri: &Uri, headers: &HeaderMap, domain: &str) -> Option<HostRoute> {
    match uri.authority() {
        Some(authority) => parse(authority.as_str(), domain),
        None => parse(headers.get(header::HOST)?.to_str().ok()?, domain),
    }
}

fn parse(host: &str, domain: &str) -> Option<HostRoute> {
    // `name:port`; a bracketed IPv6 address is never a sandbox name.
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    // DNS names compare without case and may end in the root's dot.
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let domain = domain
        .strip_suffix('.')
        .unwrap_or(domain)
        .to_ascii_lowercase();
    let label = name.strip_suffix(&domain)?.strip_suffix('.')?;
    let (port, sandbox) = label.split_once('-')?;
    // One label: `<port>-<id>`, the port in decimal without a sign or leading zero.
    if sandbox.is_empty()
        || sandbox.len() > 63
        || !sandbox.bytes().all(|b| b.is_ascii_alphanumeric())
        || port.is_empty()
        || port.starts_with('0')
        || !port.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let port = port.parse::<u16>().ok()?;
    Some(HostRoute {
        sandbox: sandbox.to_string(),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "s0123456789abcdef0123456789abcdef";

    fn ok(port: u16) -> Option<HostRoute> {
        Some(HostRoute {
            sandbox: ID.into(),
            port,
        })
    }

    #[test]
    fn a_port_of_a_sandbox_under_the_domain() {
        let d = "sbx.example.com";
        assert_eq!(parse(&format!("8000-{ID}.sbx.example.com"), d), ok(8000));
        assert_eq!(
            parse(&format!("49983-{ID}.sbx.example.com:443"), d),
            ok(49983)
        );
        assert_eq!(parse(&format!("8000-{ID}.SBX.Example.COM."), d), ok(8000));
        assert_eq!(
            parse(&format!("8000-{ID}.sbx.example.com"), "sbx.example.com."),
            ok(8000)
        );
    }

    #[test]
    fn every_other_name_is_not_routed() {
        let d = "sbx.example.com";
        for host in [
            "sbx.example.com".to_string(),
            "api.sbx.example.com".to_string(),
            "127.0.0.1:7070".to_string(),
            "[::1]:7070".to_string(),
            format!("8000-{ID}.other.com"),
            format!("8000-{ID}.evilsbx.example.com"),
            format!("8000-{ID}sbx.example.com"),
            format!("a.8000-{ID}.sbx.example.com"),
            format!("-{ID}.sbx.example.com"),
            "8000-.sbx.example.com".to_string(),
            format!("08000-{ID}.sbx.example.com"),
            format!("+80-{ID}.sbx.example.com"),
            format!("65536-{ID}.sbx.example.com"),
            format!("99999999999999999999-{ID}.sbx.example.com"),
            format!("8000-{ID}-x.sbx.example.com"),
            format!("8000-{ID}_x.sbx.example.com"),
            format!("8000-{}.sbx.example.com", "a".repeat(64)),
            format!("8000-{ID}.sbx.example.com:x"),
            String::new(),
        ] {
            assert_eq!(parse(&host, d), None, "{host}");
        }
    }

    #[test]
    fn the_authority_else_the_host_header_decides() {
        let path: Uri = "/".parse().unwrap();
        let mut h = HeaderMap::new();
        assert_eq!(route(&path, &h, "sbx.test"), None);
        h.insert(header::HOST, format!("1-{ID}.sbx.test").parse().unwrap());
        assert_eq!(route(&path, &h, "sbx.test"), ok(1));
        let absolute: Uri = format!("https://2-{ID}.sbx.test/x").parse().unwrap();
        assert_eq!(route(&absolute, &h, "sbx.test"), ok(2));
        h.insert(
            header::HOST,
            axum::http::HeaderValue::from_bytes(b"\xff").unwrap(),
        );
        assert_eq!(route(&path, &h, "sbx.test"), None);
    }
}
