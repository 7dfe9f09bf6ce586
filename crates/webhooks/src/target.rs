//! Where a webhook may point: `http(s)` URLs whose every address passes the egress policy's
//! SSRF guard (unless the operator allows private targets), resolved once per attempt and
//! pinned, so a name cannot be re-pointed at a private address between check and connect.

use std::net::{IpAddr, SocketAddr};

use koder_netpolicy::NetConfig;
use reqwest::Url;

use crate::WebhookError;

/// A checked target: the URL and the addresses it may be reached at.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub url: Url,
    /// The host name to pin the addresses to (`None` for an IP literal).
    pub name: Option<String>,
    pub addrs: Vec<SocketAddr>,
}

/// Parses `url` and only its syntax (no lookup).
pub(crate) fn parse(url: &str) -> Result<Url, WebhookError> {
    let parsed =
        Url::parse(url).map_err(|e| WebhookError::Invalid(format!("webhook url {url:?}: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(WebhookError::Invalid(
            "webhook urls are http or https".into(),
        ));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(WebhookError::Invalid(
            "webhook urls carry no credentials (deliveries are signed)".into(),
        ));
    }
    if parsed.host().is_none() {
        return Err(WebhookError::Invalid("webhook url has no host".into()));
    }
    Ok(parsed)
}

/// Resolves `url` and checks every address it names.
pub(crate) async fn check(
    url: &str,
    net: &NetConfig,
    allow_private: bool,
) -> Result<Target, WebhookError> {
    let url = parse(url)?;
    let port = url
        .port_or_known_default()
        .ok_or_else(|| WebhookError::Invalid("webhook url has no port".into()))?;
    let (name, ips) = match url.host() {
        Some(url::Host::Ipv4(ip)) => (None, vec![IpAddr::V4(ip)]),
        Some(url::Host::Ipv6(ip)) => (None, vec![IpAddr::V6(ip)]),
        Some(url::Host::Domain(name)) => (
            Some(name.to_string()),
            koder_netpolicy::resolve(net, name).await,
        ),
        None => return Err(WebhookError::Invalid("webhook url has no host".into())),
    };
    if ips.is_empty() {
        return Err(WebhookError::Invalid(format!(
            "webhook host {:?} does not resolve",
            url.host_str().unwrap_or_default()
        )));
    }
    if let Some(ip) = ips.iter().find(|ip| !allowed(**ip, net, allow_private)) {
        return Err(WebhookError::UrlRefused(format!(
            "webhook url {url} reaches {ip}, a loopback, private or reserved address (refused \
             unless [webhooks] allow_private = true or the range is in [network] internal)"
        )));
    }
    let addrs = ips
        .into_iter()
        .map(|ip| SocketAddr::new(ip, port))
        .collect();
    Ok(Target { url, name, addrs })
}

fn allowed(ip: IpAddr, net: &NetConfig, allow_private: bool) -> bool {
    allow_private
        || !koder_netpolicy::is_guarded(ip)
        || net.internal.iter().any(|n| n.contains(&ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn private_targets_are_refused_unless_allowed() {
        let net = NetConfig {
            system_resolver: false,
            hosts: [(
                "hooks.example".to_string(),
                vec!["10.1.2.3".parse().unwrap()],
            )]
            .into(),
            ..Default::default()
        };
        for url in [
            "http://127.0.0.1:8080/h",
            "http://[::1]/h",
            "http://169.254.169.254/latest",
            "https://hooks.example/h",
        ] {
            let e = check(url, &net, false).await.unwrap_err();
            assert!(matches!(e, WebhookError::UrlRefused(_)), "{url}: {e}");
        }
        let t = check("https://hooks.example/h", &net, true).await.unwrap();
        assert_eq!(t.name.as_deref(), Some("hooks.example"));
        assert_eq!(t.addrs, ["10.1.2.3:443".parse().unwrap()]);
        assert!(check("http://8.8.8.8/h", &net, false).await.is_ok());
    }

    #[tokio::test]
    async fn malformed_urls_are_invalid() {
        let net = NetConfig::default();
        for url in ["ftp://8.8.8.8/", "not a url", "http://u:p@8.8.8.8/"] {
            let e = check(url, &net, false).await.unwrap_err();
            assert!(matches!(e, WebhookError::Invalid(_)), "{url}: {e}");
        }
    }
}
