//! What a sandbox may reach. Pure decisions, no I/O except name resolution through the
//! configured resolver:
//! - allowlist entries (`pypi.org`, `*.npmjs.org`, `10.1.0.0/16:443`, `1.2.3.4`, `[::1]:8080`)
//!   are parsed and domains resolved and pinned at create; a connection to a domain is allowed
//!   only to a pinned address and only if its TLS SNI / HTTP Host names that domain, so neither
//!   DNS rebinding nor a raw-IP connection with another name gets through;
//! - the SSRF guard refuses private, loopback, link-local (cloud metadata), multicast and other
//!   reserved destinations in every mode, unless they are in the configured internal set;
//! - deny entries (same syntax) beat every allow: an address or range by the connection's
//!   destination, a domain by the name the lookup, SNI or Host carries.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Loopback only; nothing is mediated.
    None,
    /// Any destination that passes the SSRF guard.
    Open,
    Allowlist,
}

/// Daemon-wide network settings (`[network]` in the config).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NetConfig {
    /// Destinations exempt from the SSRF guard (e.g. an internal package mirror).
    pub internal: Vec<IpNet>,
    /// Names answered from here before (or instead of) the system resolver.
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
    /// Resolve names not in `hosts` with the host's resolver.
    pub system_resolver: bool,
    /// Most allowlist entries per session.
    pub max_entries: usize,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            internal: Vec::new(),
            hosts: BTreeMap::new(),
            system_resolver: true,
            max_entries: 64,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("network entry {0:?}: {1}")]
    BadEntry(String, String),
    #[error("allow entry {entry:?} is {addr}, a private or reserved address: add its range to `internal` under `[network]` in the daemon config to let sandboxes reach it")]
    Guarded { entry: String, addr: IpAddr },
    /// A sandbox's loopback is its own (egress never sees it), so such an entry could only
    /// ever mislead.
    #[error("allow entry {entry:?} is the loopback address {addr}: inside a sandbox it reaches the sandbox's own loopback, never the host's, so it can never be allowed")]
    Loopback { entry: String, addr: IpAddr },
    #[error("allow entry {0:?} does not resolve")]
    Unresolvable(String),
    #[error("at most {0} network entries (allow and deny together)")]
    TooMany(usize),
}

/// One parsed allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// Lowercase; a leading `*.` matches any subdomain (not the bare domain).
    Domain {
        pattern: String,
        port: Option<u16>,
    },
    Net {
        net: IpNet,
        port: Option<u16>,
    },
}

impl FromStr for Entry {
    type Err = PolicyError;

    fn from_str(raw: &str) -> Result<Self, PolicyError> {
        let bad = |why: &str| PolicyError::BadEntry(raw.to_string(), why.to_string());
        let s = raw.trim();
        if s.is_empty() || s.len() > 253 + 6 {
            return Err(bad("empty or too long"));
        }
        // `[v6]:port`, `v6`, `v4/len:port`, `name:port`.
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (addr, after) = rest.split_once(']').ok_or_else(|| bad("unclosed ["))?;
            let port = match after.strip_prefix(':') {
                Some(p) => Some(p),
                None if after.is_empty() => None,
                None => return Err(bad("junk after ]")),
            };
            (addr, port)
        } else if s.matches(':').count() > 1 {
            (s, None) // bare IPv6 (with or without /len)
        } else {
            match s.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            }
        };
        let port = port
            .map(|p| {
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| bad("port must be 1-65535"))
            })
            .transpose()?;
        if let Ok(net) = host.parse::<IpNet>() {
            return Ok(Entry::Net {
                net: net.trunc(),
                port,
            });
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(Entry::Net {
                net: IpNet::from(ip),
                port,
            });
        }
        let pattern = host.to_ascii_lowercase();
        let name = pattern.strip_prefix("*.").unwrap_or(&pattern);
        let valid_label = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        if !name.contains('.') && name != "localhost"
            || !name.split('.').all(valid_label)
            || name.contains('*')
        {
            return Err(bad("not a domain name, IP address or CIDR"));
        }
        Ok(Entry::Domain { pattern, port })
    }
}

impl Entry {
    fn port(&self) -> Option<u16> {
        match self {
            Entry::Domain { port, .. } | Entry::Net { port, .. } => *port,
        }
    }

    fn port_ok(&self, port: u16) -> bool {
        self.port().is_none_or(|p| p == port)
    }

    /// Does this entry cover a connection to `ip:port` naming `name`?
    pub fn covers(&self, ip: IpAddr, port: u16, name: Option<&str>) -> bool {
        self.port_ok(port)
            && match self {
                Entry::Net { net, .. } => net.contains(&ip),
                Entry::Domain { pattern, .. } => name.is_some_and(|n| name_matches(pattern, n)),
            }
    }
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let base = match self {
            Entry::Domain { pattern, .. } => pattern.clone(),
            Entry::Net { net, .. } => net.to_string(),
        };
        match self.port() {
            Some(p) if base.contains(':') => write!(f, "[{base}]:{p}"),
            Some(p) => write!(f, "{base}:{p}"),
            None => f.write_str(&base),
        }
    }
}

/// An entry as a client sent it, without the `=addresses` a described entry carries (a
/// session's stored policy is its description; rebuilding it resolves the names again).
pub fn unpinned(described: &str) -> &str {
    described
        .split_once('=')
        .map_or(described, |(entry, _)| entry)
}

/// Loopback inside a sandbox is the sandbox's own: v4 `127/8`, v6 `::1` (also v4-mapped).
fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Does `name` match `pattern` (`*.example.com` matches subdomains only)?
pub fn name_matches(pattern: &str, name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    match pattern.strip_prefix("*.") {
        Some(base) => {
            name.len() > base.len() + 1
                && name.ends_with(base)
                && name.as_bytes()[name.len() - base.len() - 1] == b'.'
        }
        None => name == pattern,
    }
}

/// Addresses no sandbox should reach unless explicitly internal: the SSRF guard.
pub fn is_guarded(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local() // 169.254.0.0/16, cloud metadata
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_unspecified()
                || v4.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (64..128).contains(&o[1])) // carrier-grade NAT
                || (o[0] == 192 && o[1] == 0 && o[2] == 0) // IETF protocol assignments
                || (o[0] == 198 && (18..20).contains(&o[1])) // benchmarking
                || o[0] >= 240 // reserved
        }
        IpAddr::V6(v6) => {
            let seg = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (seg[0] & 0xfe00) == 0xfc00 // unique local
                || (seg[0] & 0xffc0) == 0xfe80 // link local
                || v6.to_ipv4_mapped().is_some_and(|v4| is_guarded(IpAddr::V4(v4)))
                || (seg[0] == 0x2001 && seg[1] == 0x0db8) // documentation
        }
    }
}

/// A resolved, pinned session policy.
#[derive(Debug, Clone)]
pub struct Policy {
    pub mode: Mode,
    rules: Vec<(Entry, Vec<IpAddr>)>,
    deny: Vec<Entry>,
    internal: Vec<IpNet>,
}

/// The verdict on one connection attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

fn allow(reason: impl Into<String>) -> Decision {
    Decision {
        allowed: true,
        reason: reason.into(),
    }
}

fn deny(reason: impl Into<String>) -> Decision {
    Decision {
        allowed: false,
        reason: reason.into(),
    }
}

/// Resolves names: configured `hosts` first, then (if enabled) the system resolver.
pub async fn resolve(cfg: &NetConfig, name: &str) -> Vec<IpAddr> {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if let Some(addrs) = cfg.hosts.get(&name) {
        return addrs.clone();
    }
    if !cfg.system_resolver {
        return Vec::new();
    }
    let found = tokio::net::lookup_host((name.as_str(), 0)).await;
    match found {
        Ok(addrs) => {
            let mut v: Vec<IpAddr> = addrs.map(|a| a.ip()).collect();
            v.sort();
            v.dedup();
            v
        }
        Err(_) => Vec::new(),
    }
}

impl Policy {
    pub fn none() -> Self {
        Policy {
            mode: Mode::None,
            rules: Vec::new(),
            deny: Vec::new(),
            internal: Vec::new(),
        }
    }

    /// Parses and pins `allow` (allowlist mode) against the guard, and parses `deny` (any
    /// mode with network). Wildcard domains cannot be resolved ahead: their names are pinned
    /// when the sandbox looks them up (`lookup`).
    pub async fn build(
        mode: Mode,
        allow: &[String],
        deny: &[String],
        cfg: &NetConfig,
    ) -> Result<Policy, PolicyError> {
        if allow.len() + deny.len() > cfg.max_entries {
            return Err(PolicyError::TooMany(cfg.max_entries));
        }
        let mut policy = Policy {
            mode,
            rules: Vec::new(),
            deny: deny
                .iter()
                .map(|raw| raw.parse())
                .collect::<Result<_, _>>()?,
            internal: cfg.internal.clone(),
        };
        for raw in allow {
            let entry: Entry = raw.parse()?;
            let pinned = policy.pin(raw, &entry, cfg).await?;
            policy.rules.push((entry, pinned));
        }
        Ok(policy)
    }

    /// The addresses an allow entry is pinned to (none for ranges and wildcards), refusing
    /// what a sandbox can never or must never reach.
    async fn pin(
        &self,
        raw: &str,
        entry: &Entry,
        cfg: &NetConfig,
    ) -> Result<Vec<IpAddr>, PolicyError> {
        let refuse = |addr: IpAddr| -> Result<(), PolicyError> {
            let entry = raw.to_string();
            if is_loopback(addr) {
                Err(PolicyError::Loopback { entry, addr })
            } else {
                Err(PolicyError::Guarded { entry, addr })
            }
        };
        match entry {
            Entry::Domain { pattern, .. } if !pattern.starts_with("*.") => {
                let addrs = resolve(cfg, pattern).await;
                if addrs.is_empty() {
                    return Err(PolicyError::Unresolvable(raw.to_string()));
                }
                if let Some(&addr) = addrs.iter().find(|a| is_loopback(**a)) {
                    refuse(addr)?;
                }
                if let Some(&addr) = addrs.iter().find(|a| self.guarded(**a)) {
                    refuse(addr)?;
                }
                Ok(addrs)
            }
            Entry::Domain { .. } => Ok(Vec::new()),
            Entry::Net { net, .. } => {
                if is_loopback(net.network()) && is_loopback(net.broadcast()) {
                    refuse(net.network())?;
                }
                if self.guarded(net.network()) && !self.internal.iter().any(|i| i.contains(net)) {
                    refuse(net.network())?;
                }
                Ok(Vec::new())
            }
        }
    }

    fn guarded(&self, ip: IpAddr) -> bool {
        is_guarded(ip) && !self.internal.iter().any(|n| n.contains(&ip))
    }

    /// Allow entries as shown back to the client, with what they were pinned to.
    pub fn describe(&self) -> Vec<String> {
        self.rules
            .iter()
            .map(|(entry, pinned)| {
                if pinned.is_empty() {
                    entry.to_string()
                } else {
                    let addrs: Vec<String> = pinned.iter().map(IpAddr::to_string).collect();
                    format!("{entry}={}", addrs.join(","))
                }
            })
            .collect()
    }

    /// Deny entries as shown back to the client.
    pub fn describe_deny(&self) -> Vec<String> {
        self.deny.iter().map(Entry::to_string).collect()
    }

    /// The deny entry covering this connection, if any.
    fn denied(&self, ip: IpAddr, port: u16, name: Option<&str>) -> Option<&Entry> {
        self.deny.iter().find(|d| d.covers(ip, port, name))
    }

    /// What a DNS lookup from the sandbox gets: in allowlist mode only allowed names, answered
    /// with the pinned addresses (a wildcard match is resolved now and pinned from then on).
    pub async fn lookup(&mut self, name: &str, cfg: &NetConfig) -> Option<Vec<IpAddr>> {
        let denied = |e: &Entry| matches!(e, Entry::Domain { pattern, port: None } if name_matches(pattern, name));
        if self.deny.iter().any(denied) {
            return None;
        }
        match self.mode {
            Mode::None => None,
            Mode::Open => {
                let addrs = resolve(cfg, name).await;
                (!addrs.is_empty()).then_some(addrs)
            }
            Mode::Allowlist => {
                let idx = self.rules.iter().position(|(e, _)| matches!(e, Entry::Domain { pattern, .. } if name_matches(pattern, name)))?;
                let (entry, pinned) = &self.rules[idx];
                if let Entry::Domain { pattern, .. } = entry {
                    if !pattern.starts_with("*.") {
                        return Some(pinned.clone());
                    }
                }
                let addrs: Vec<IpAddr> = resolve(cfg, name)
                    .await
                    .into_iter()
                    .filter(|a| !self.guarded(*a))
                    .collect();
                if addrs.is_empty() {
                    return None;
                }
                // Pin this concrete name so later connections are checked against this answer.
                let port = entry.port();
                self.rules.push((
                    Entry::Domain {
                        pattern: name.trim_end_matches('.').to_ascii_lowercase(),
                        port,
                    },
                    addrs.clone(),
                ));
                Some(addrs)
            }
        }
    }

    /// Decides one TCP connection to `ip:port` whose first bytes named `name` (SNI or Host).
    pub fn decide(&self, ip: IpAddr, port: u16, name: Option<&str>) -> Decision {
        if self.guarded(ip) {
            return deny("private or reserved destination (SSRF guard)");
        }
        if self.mode == Mode::None {
            return deny("network mode none");
        }
        if let Some(rule) = self.denied(ip, port, name) {
            return deny(format!("denied by {rule}"));
        }
        match self.mode {
            Mode::None => deny("network mode none"),
            Mode::Open => allow("open mode"),
            Mode::Allowlist => {
                // Names often share an address (CDNs, virtual hosts): a rule whose pinned
                // address matches but whose name does not only explains a refusal, any later
                // rule may still allow.
                let mut why = "not on the allowlist".to_string();
                for (entry, pinned) in &self.rules {
                    if !entry.port_ok(port) {
                        continue;
                    }
                    match entry {
                        Entry::Net { net, .. } if net.contains(&ip) => {
                            return allow(format!("allowlisted {net}"))
                        }
                        Entry::Domain { pattern, .. } if pinned.contains(&ip) => match name {
                            Some(n) if name_matches(pattern, n) => {
                                return allow(format!("allowlisted {pattern}"))
                            }
                            Some(n) => why = format!("{n} is not allowlisted for this address"),
                            None => {
                                why = format!(
                                "connection to {pattern}'s address without naming it (no SNI/Host)"
                            )
                            }
                        },
                        _ => {}
                    }
                }
                deny(why)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> NetConfig {
        NetConfig {
            internal: vec!["10.250.0.0/16".parse().unwrap()],
            hosts: BTreeMap::from([
                ("pkg.test".to_string(), vec!["10.250.0.5".parse().unwrap()]),
                (
                    "api.cdn.test".to_string(),
                    vec!["10.250.0.6".parse().unwrap()],
                ),
                ("evil.test".to_string(), vec!["10.0.0.1".parse().unwrap()]),
                ("loop.test".to_string(), vec!["127.0.0.1".parse().unwrap()]),
            ]),
            system_resolver: false,
            max_entries: 8,
        }
    }

    #[test]
    fn entries_parse() {
        assert_eq!(
            "PyPI.org".parse::<Entry>().unwrap(),
            Entry::Domain {
                pattern: "pypi.org".into(),
                port: None
            }
        );
        assert_eq!(
            "*.npmjs.org:443".parse::<Entry>().unwrap(),
            Entry::Domain {
                pattern: "*.npmjs.org".into(),
                port: Some(443)
            }
        );
        assert_eq!(
            "10.1.2.3/16:443".parse::<Entry>().unwrap(),
            Entry::Net {
                net: "10.1.0.0/16".parse().unwrap(),
                port: Some(443)
            }
        );
        assert_eq!(
            "[::1]:8080".parse::<Entry>().unwrap(),
            Entry::Net {
                net: "::1/128".parse().unwrap(),
                port: Some(8080)
            }
        );
        assert_eq!(
            "2001:db8::/32".parse::<Entry>().unwrap(),
            Entry::Net {
                net: "2001:db8::/32".parse().unwrap(),
                port: None
            }
        );
        for bad in [
            "",
            "*",
            "*.",
            "a..b",
            "-a.com",
            "x.com:0",
            "x.com:99999",
            "a*b.com",
            "[::1",
            "foo",
            "ex ample.com",
            "a.com:port",
        ] {
            assert!(bad.parse::<Entry>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn wildcards_match_subdomains_only() {
        assert!(name_matches("*.npmjs.org", "registry.npmjs.org"));
        assert!(name_matches("*.npmjs.org", "a.b.npmjs.org."));
        assert!(!name_matches("*.npmjs.org", "npmjs.org"));
        assert!(!name_matches("*.npmjs.org", "evilnpmjs.org"));
        assert!(name_matches("pypi.org", "PYPI.org"));
    }

    #[test]
    fn the_guard_covers_private_and_metadata_ranges() {
        for ip in [
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "127.0.0.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(is_guarded(ip.parse().unwrap()), "{ip} not guarded");
        }
        for ip in ["151.101.0.223", "8.8.8.8", "2a04:4e42::223"] {
            assert!(!is_guarded(ip.parse().unwrap()), "{ip} guarded");
        }
    }

    #[tokio::test]
    async fn allowlist_pins_and_checks_names() {
        let c = cfg();
        let mut p = Policy::build(
            Mode::Allowlist,
            &[
                "pkg.test:443".into(),
                "*.cdn.test".into(),
                "10.250.0.9".into(),
            ],
            &[],
            &c,
        )
        .await
        .unwrap();
        assert_eq!(
            p.describe(),
            ["pkg.test:443=10.250.0.5", "*.cdn.test", "10.250.0.9/32"]
        );
        let ip5: IpAddr = "10.250.0.5".parse().unwrap();
        assert!(p.decide(ip5, 443, Some("pkg.test")).allowed);
        assert!(!p.decide(ip5, 80, Some("pkg.test")).allowed, "port pinned");
        assert!(
            !p.decide(ip5, 443, Some("other.test")).allowed,
            "other SNI to a pinned address"
        );
        assert!(!p.decide(ip5, 443, None).allowed, "raw IP without a name");
        assert!(p.decide("10.250.0.9".parse().unwrap(), 1234, None).allowed);
        assert!(
            !p.decide("10.250.0.7".parse().unwrap(), 443, Some("pkg.test"))
                .allowed,
            "unpinned address"
        );

        assert_eq!(p.lookup("pkg.test", &c).await, Some(vec![ip5]));
        assert_eq!(p.lookup("unlisted.test", &c).await, None);
        let ip6: IpAddr = "10.250.0.6".parse().unwrap();
        assert!(
            !p.decide(ip6, 443, Some("api.cdn.test")).allowed,
            "wildcard name not yet looked up"
        );
        assert_eq!(p.lookup("api.cdn.test", &c).await, Some(vec![ip6]));
        assert!(p.decide(ip6, 443, Some("api.cdn.test")).allowed);

        // Two allowed names on one address: each passes by its own rule.
        let mut c2 = cfg();
        c2.hosts.insert("twin.test".into(), vec![ip5]);
        let twins = Policy::build(
            Mode::Allowlist,
            &["pkg.test".into(), "twin.test".into()],
            &[],
            &c2,
        )
        .await
        .unwrap();
        assert!(twins.decide(ip5, 80, Some("twin.test")).allowed);
        assert!(twins.decide(ip5, 80, Some("pkg.test")).allowed);
        assert!(!twins.decide(ip5, 80, Some("third.test")).allowed);
    }

    #[tokio::test]
    async fn guarded_entries_are_refused_unless_internal() {
        let c = cfg();
        let e = Policy::build(Mode::Allowlist, &["evil.test".into()], &[], &c)
            .await
            .unwrap_err();
        assert!(matches!(e, PolicyError::Guarded { .. }), "{e}");
        assert!(
            Policy::build(Mode::Allowlist, &["169.254.169.254".into()], &[], &c)
                .await
                .is_err()
        );
        assert!(
            Policy::build(Mode::Allowlist, &["nowhere.test".into()], &[], &c)
                .await
                .is_err()
        );
        let open = Policy::build(Mode::Open, &[], &[], &c).await.unwrap();
        assert!(
            !open
                .decide("169.254.169.254".parse().unwrap(), 80, None)
                .allowed
        );
        assert!(!open.decide("10.0.0.1".parse().unwrap(), 80, None).allowed);
        assert!(
            open.decide("10.250.0.5".parse().unwrap(), 80, None).allowed,
            "internal set"
        );
        assert!(open.decide("8.8.8.8".parse().unwrap(), 53, None).allowed);
    }

    #[tokio::test]
    async fn loopback_entries_are_refused_even_when_internal() {
        let mut c = cfg();
        c.internal.push("127.0.0.0/8".parse().unwrap());
        c.internal.push("::1/128".parse().unwrap());
        for entry in ["127.0.0.1", "127.0.0.0/8", "[::1]:80", "loop.test"] {
            let e = Policy::build(Mode::Allowlist, &[entry.into()], &[], &c)
                .await
                .unwrap_err();
            assert!(matches!(e, PolicyError::Loopback { .. }), "{entry}: {e}");
            assert!(e.to_string().contains("own loopback"), "{e}");
        }
        let e = Policy::build(Mode::Allowlist, &["10.9.0.0/16".into()], &[], &cfg())
            .await
            .unwrap_err();
        assert!(
            e.to_string().contains("`internal` under `[network]`"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn deny_beats_allow() {
        let c = cfg();
        let p = Policy::build(
            Mode::Allowlist,
            &["10.250.0.0/16".into(), "pkg.test".into()],
            &[
                "10.250.0.9".into(),
                "*.bad.test".into(),
                "10.250.0.5:22".into(),
            ],
            &c,
        )
        .await
        .unwrap();
        assert_eq!(
            p.describe_deny(),
            ["10.250.0.9/32", "*.bad.test", "10.250.0.5/32:22"]
        );
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(p.decide(ip("10.250.0.8"), 80, None).allowed);
        assert!(
            !p.decide(ip("10.250.0.9"), 80, None).allowed,
            "denied address"
        );
        let d = p.decide(ip("10.250.0.8"), 80, Some("x.bad.test"));
        assert!(!d.allowed && d.reason.contains("*.bad.test"), "{d:?}");
        assert!(p.decide(ip("10.250.0.5"), 443, Some("pkg.test")).allowed);
        assert!(
            !p.decide(ip("10.250.0.5"), 22, Some("pkg.test")).allowed,
            "denied port"
        );

        let mut open = Policy::build(
            Mode::Open,
            &[],
            &["*.bad.test".into(), "10.250.0.6".into()],
            &c,
        )
        .await
        .unwrap();
        assert!(open.decide(ip("10.250.0.5"), 80, Some("pkg.test")).allowed);
        assert!(!open.decide(ip("10.250.0.6"), 80, None).allowed);
        assert!(
            !open
                .decide(ip("10.250.0.5"), 80, Some("a.bad.test"))
                .allowed
        );
        assert_eq!(
            open.lookup("a.bad.test", &c).await,
            None,
            "denied names do not resolve"
        );
        assert_eq!(
            open.lookup("pkg.test", &c).await,
            Some(vec![ip("10.250.0.5")])
        );
    }

    #[test]
    fn described_entries_come_back_unpinned() {
        assert_eq!(unpinned("pkg.test:443=10.0.0.1,10.0.0.2"), "pkg.test:443");
        assert_eq!(unpinned("10.0.0.0/8"), "10.0.0.0/8");
        assert_eq!(
            "[2001:db8::1]:443".parse::<Entry>().unwrap().to_string(),
            "[2001:db8::1/128]:443"
        );
        let v6: Entry = "[2001:db8::1/128]:443".parse().unwrap();
        assert_eq!(v6.to_string().parse::<Entry>().unwrap(), v6);
    }
}
