//! Sandbox network namespaces made ahead by the runtime, so that a cold create clones its agent
//! into one instead of making it: setting a namespace up is loopback, and with egress the
//! default routes and the nftables ruleset, which `ip` and `nft` load in ~5 ms of process
//! starts (the netlink encodings are theirs to keep right), on top of the clone's own
//! `CLONE_NEWNET` (~0.4 ms). A create finding none ready clones a namespace of its own and the
//! agent sets it up as before.
//!
//! These namespaces belong to the host's user namespace, not the sandbox's: nothing in the
//! sandbox, the agent included, holds a capability over them, so none can change its routes
//! or rules. Ports below 1024 are opened to every user in them (as container runtimes do),
//! since the agent's resolver listens on 53 and a sandbox's root could bind those ports in a
//! namespace of its own.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use koder_agent_protocol::init::EGRESS_RULES;

use crate::stock::{Make, Stock};

const IP: &str = "/usr/sbin/ip";
const NFT: &str = "/usr/sbin/nft";

/// Namespaces without and with egress, each in a stock of its own.
pub(crate) struct ReadyNetns {
    plain: Arc<Stock<NetnsMaker>>,
    /// `None` on a host without nftables: sandboxes with egress load their rules themselves.
    egress: Option<Arc<Stock<NetnsMaker>>>,
}

struct NetnsMaker {
    egress: bool,
}

impl ReadyNetns {
    /// `None` on a host without iproute2.
    pub(crate) fn new() -> Option<Self> {
        if !Path::new(IP).exists() {
            return None;
        }
        Some(Self {
            plain: Stock::new(NetnsMaker { egress: false }),
            egress: Path::new(NFT)
                .exists()
                .then(|| Stock::new(NetnsMaker { egress: true })),
        })
    }

    fn stock(&self, egress: bool) -> Option<&Arc<Stock<NetnsMaker>>> {
        match egress {
            false => Some(&self.plain),
            true => self.egress.as_ref(),
        }
    }

    /// A namespace set up for a sandbox with or without `egress`, if one is ready.
    pub(crate) fn take(&self, egress: bool) -> Option<OwnedFd> {
        self.stock(egress)?.take()
    }

    pub(crate) fn refill(&self, egress: bool) {
        if let Some(stock) = self.stock(egress) {
            stock.refill();
        }
    }

    /// Drops every namespace held ready; none is made again until a create asks.
    pub(crate) fn clear(&self) {
        self.plain.clear();
        if let Some(egress) = &self.egress {
            egress.clear();
        }
    }
}

impl Make for NetnsMaker {
    type Item = OwnedFd;
    const WHAT: &'static str = "netns";

    fn make(&self) -> Result<OwnedFd, String> {
        make(self.egress)
    }

    fn discard(&self, netns: OwnedFd) {
        drop(netns);
    }
}

/// A new network namespace, set up, held by its descriptor alone. Made on a thread of its own:
/// `unshare` moves only the calling thread into it, and that thread ends with the work (the
/// tools it starts are in the namespace because they are its children).
pub(crate) fn make(egress: bool) -> Result<OwnedFd, String> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("netns".into())
            .spawn_scoped(scope, || set_up_here(egress))
            .map_err(|e| format!("start a thread: {e}"))?
            .join()
            .unwrap_or_else(|_| Err("the thread panicked".into()))
    })
}

fn set_up_here(egress: bool) -> Result<OwnedFd, String> {
    // Made in the pauses between creates, but a pause may be shorter than the ~5 ms of `ip`
    // and `nft` it takes: at the lowest priority (inherited by the tools) it yields the cores
    // to whatever comes next. Best effort: at the default priority it only competes more.
    let _ = rustix::process::setpriority_process(None, 19);
    // SAFETY: NEWNET changes only this thread's network namespace; no descriptor table is
    // unshared.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNET) }
        .map_err(|e| format!("unshare the network namespace: {e}"))?;
    let netns = std::fs::File::open("/proc/thread-self/ns/net")
        .map_err(|e| format!("open the network namespace: {e}"))?;
    // /proc/sys/net is the opening thread's namespace's.
    std::fs::write("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0")
        .map_err(|e| format!("open the low ports: {e}"))?;
    let mut ip = String::from("link set lo up\n");
    if egress {
        // Default routes whose source is loopback (so connects reach the redirect instead of
        // failing with ENETUNREACH, and replies are deliverable); v6 only where the kernel has it.
        ip.push_str("route add default dev lo src 127.0.0.1\n");
        if Path::new("/proc/sys/net/ipv6").exists() {
            ip.push_str("route add ::/0 dev lo src ::1\n");
        }
    }
    run(IP, &["-batch", "-"], &ip)?;
    if egress {
        run(NFT, &["-f", "-"], EGRESS_RULES)?;
    }
    Ok(netns.into())
}

fn run(program: &str, args: &[&str], input: &str) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("{program}: {e}");
    let mut child = Command::new(program)
        .args(args)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(fail)?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes()).map_err(fail)?;
    }
    let out = child.wait_with_output().map_err(fail)?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "{program} {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `program` in `netns` and returns what it printed.
    fn in_netns(netns: &OwnedFd, program: &str, args: &[&str]) -> String {
        use std::os::fd::AsFd;
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    rustix::thread::move_into_link_name_space(
                        netns.as_fd(),
                        Some(rustix::thread::LinkNameSpaceType::Network),
                    )
                    .expect("setns");
                    let out = Command::new(program).args(args).output().expect("run");
                    assert!(out.status.success(), "{program} {args:?}: {out:?}");
                    String::from_utf8_lossy(&out.stdout).into_owned()
                })
                .join()
                .expect("thread")
        })
    }

    fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    #[test]
    fn a_namespace_with_egress_has_its_routes_and_rules_and_the_host_keeps_its_own() {
        if !is_root() || !Path::new(NFT).exists() {
            eprintln!("skipped: needs root and nftables");
            return;
        }
        let host = || {
            [
                "/proc/net/route",
                "/proc/sys/net/ipv4/ip_unprivileged_port_start",
            ]
            .map(|f| std::fs::read_to_string(f).expect("host network"))
        };
        let before = host();
        let netns = make(true).expect("make");
        let links = in_netns(&netns, IP, &["-o", "link", "show", "up"]);
        assert!(links.contains("lo:"), "loopback up: {links}");
        let routes = in_netns(&netns, IP, &["route", "show", "default"]);
        assert!(
            routes.contains("dev lo") && routes.contains("src 127.0.0.1"),
            "{routes}"
        );
        let rules = in_netns(&netns, NFT, &["list", "ruleset"]);
        assert!(rules.contains("redirect to :15001"), "{rules}");
        let port = in_netns(
            &netns,
            "/bin/cat",
            &["/proc/sys/net/ipv4/ip_unprivileged_port_start"],
        );
        assert_eq!(port.trim(), "0");
        // The host's namespace is untouched: the work happened on a thread of its own.
        assert_eq!(host(), before);
    }

    #[test]
    fn a_namespace_without_egress_has_loopback_only() {
        if !is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let netns = make(false).expect("make");
        let routes = in_netns(&netns, IP, &["route", "show", "default"]);
        assert_eq!(routes.trim(), "", "no default route");
        let links = in_netns(&netns, IP, &["-o", "link", "show", "up"]);
        assert!(links.contains("lo:"), "{links}");
    }
}
