//! The egress ruleset of a sandbox with network access
//! ([`EGRESS_RULES`](koder_agent_protocol::init::EGRESS_RULES)), loaded at boot while the agent
//! still holds its capabilities, unless the runtime made the sandbox's network namespace with
//! it already (`InitConfig::network_ready`).

use crate::setup_error::{SetupError, Step};

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
    run_tool(
        "/usr/sbin/nft",
        &["-f", "-"],
        Some(koder_agent_protocol::init::EGRESS_RULES),
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    fn run(program: &str, args: &[&str]) -> String {
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .expect("run");
        assert!(out.status.success(), "{program} {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The agent's own set-up (a jail's first create of a kind, rootless jails, microVM guests):
    /// in a namespace of a thread of its own, as the agent's would be.
    #[test]
    fn loads_the_routes_and_the_redirect() {
        if !rustix::process::geteuid().is_root() || !std::path::Path::new("/usr/sbin/nft").exists()
        {
            eprintln!("skipped: needs root and nftables");
            return;
        }
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    // SAFETY: NEWNET changes only this thread's network namespace.
                    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }
                        .expect("unshare");
                    crate::boot::setup::loopback_up().expect("loopback");
                    prepare().expect("prepare");
                    let routes = run("/usr/sbin/ip", &["route", "show", "default"]);
                    assert!(
                        routes.contains("dev lo") && routes.contains("src 127.0.0.1"),
                        "{routes}"
                    );
                    let rules = run("/usr/sbin/nft", &["list", "ruleset"]);
                    assert_eq!(rules.matches("redirect to :15001").count(), 2, "{rules}");
                })
                .join()
                .expect("thread")
        });
    }
}
