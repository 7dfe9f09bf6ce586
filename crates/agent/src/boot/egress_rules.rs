//! The egress ruleset of a sandbox with network access, loaded at boot while the agent still
//! holds its capabilities: every outgoing TCP connection is redirected to the agent's listener
//! (`serve::egress`, port [`EGRESS_PORT`](koder_agent_protocol::init::EGRESS_PORT)), DNS to its resolver, everything else leaving
//! loopback is dropped. IPv6 the same way: its connections reach the same listener (on `::1`)
//! and so the same policy as IPv4's.

use crate::setup_error::{SetupError, Step};

/// The nftables ruleset of the sandbox's namespace. Connections the redirect caught keep
/// their original (non-loopback) addresses in conntrack, so their packets are accepted by
/// connection state; anything else that would leave loopback is dropped.
const RULES: &str = "
table ip koder {
  chain egress_nat {
    type nat hook output priority -100; policy accept;
    ip daddr 127.0.0.0/8 return
    meta l4proto tcp redirect to :15001
    udp dport 53 redirect to :53
  }
  chain egress_filter {
    type filter hook output priority 0; policy drop;
    ip daddr 127.0.0.0/8 accept
    ct status dnat accept
    ct state established,related accept
  }
}
table ip6 koder6 {
  chain egress_nat {
    type nat hook output priority -100; policy accept;
    ip6 daddr ::1 return
    meta l4proto tcp redirect to :15001
    udp dport 53 redirect to :53
  }
  chain egress_filter {
    type filter hook output priority 0; policy drop;
    ip6 daddr ::1 accept
    ct status dnat accept
    ct state established,related accept
  }
}
";

/// Run during set-up, while the agent still holds its capabilities: default routes, v4 and
/// v6 (so connects reach the redirect instead of failing with ENETUNREACH) whose source is
/// loopback (a source of 0.0.0.0 or `::` would leave replies undeliverable), then the
/// ruleset. iproute2 and nftables from the image do it: the netlink encodings are theirs to
/// keep right.
pub(crate) fn prepare() -> Result<(), SetupError> {
    run_tool(
        "/usr/sbin/ip",
        &["route", "add", "default", "dev", "lo", "src", "127.0.0.1"],
        None,
    )
    .step("egress default route (package iproute2)")?;
    // Only a kernel without IPv6 refuses this route, and its sandboxes have no v6 to leak:
    // their v6 connects fail with ENETUNREACH, as they would anywhere.
    let _ = run_tool(
        "/usr/sbin/ip",
        &["-6", "route", "add", "default", "dev", "lo", "src", "::1"],
        None,
    );
    run_tool("/usr/sbin/nft", &["-f", "-"], Some(RULES))
        .step("load egress rules (package nftables)")
}

fn run_tool(program: &str, args: &[&str], input: Option<&str>) -> std::io::Result<()> {
    use std::io::Write;
    let mut child = std::process::Command::new(program)
        .args(args)
        .env_clear()
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.unwrap_or_default().as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}
