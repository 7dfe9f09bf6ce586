//! The "internet" of egress tests: a network namespace the test creates, joined to the host
//! by a veth pair (IPv4 and IPv6: a unique-local /64), running the Python servers the test
//! hands it. Nothing leaves loopback or that namespace.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct TestNet {
    ns: String,
    host_if: String,
    /// None until started: the guard exists from the namespace's creation on, so a failing
    /// `ip` step or server start still removes the namespace and the veth.
    server: Option<Child>,
    pub prefix: String,
    /// The IPv6 /64's first 64 bits (`fd19:<tag>:<n>:0`).
    prefix6: String,
}

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("ip");
    assert!(st.success(), "ip {args:?} failed");
}

impl TestNet {
    /// Starts `servers` (Python source) inside a new namespace; ready once `ready_port`
    /// answers from the host.
    pub fn up(tag: u32, servers: &str, ready_port: u16) -> TestNet {
        // The tests of a binary run concurrently: each network gets its own names (tag, pid,
        // counter) and, per tag, its own subnet (10.252/16 and up; test binaries run one after
        // the other, so they may share tags).
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = std::process::id() % 10_000 * 10 + k;
        let n = (std::process::id() + k * 97) % 250;
        let ns = format!("kr{tag}{id}");
        let host_if = format!("krv{tag}{id}");
        let peer = format!("krp{tag}{id}");
        let prefix = format!("10.{}.{n}", 252 + tag);
        let prefix6 = format!("fd19:{tag}:{n}:0");
        ip(&["netns", "add", &ns]);
        let mut net = TestNet {
            ns,
            host_if,
            server: None,
            prefix,
            prefix6,
        };
        let (ns, host_if, prefix) = (net.ns.clone(), net.host_if.clone(), net.prefix.clone());
        let prefix6 = net.prefix6.clone();
        ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &peer,
        ]);
        ip(&["link", "set", &peer, "netns", &ns]);
        ip(&["addr", "add", &format!("{prefix}.1/30"), "dev", &host_if]);
        // `nodad`: usable at once, not after duplicate address detection's second or two.
        let host6 = format!("{prefix6}::1/64");
        ip(&["addr", "add", &host6, "dev", &host_if, "nodad"]);
        ip(&["link", "set", &host_if, "up"]);
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{prefix}.2/30"),
            "dev",
            &peer,
        ]);
        let peer6 = format!("{prefix6}::2/64");
        ip(&["-n", &ns, "addr", "add", &peer6, "dev", &peer, "nodad"]);
        ip(&["-n", &ns, "link", "set", &peer, "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        net.server = Some(
            Command::new("ip")
                .args(["netns", "exec", &ns, "/usr/bin/python3", "-c", servers])
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("test servers"),
        );
        let at = format!("{}:{ready_port}", net.server_ip()).parse().unwrap();
        for _ in 0..200 {
            if std::net::TcpStream::connect_timeout(&at, Duration::from_millis(100)).is_ok() {
                return net;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("test servers did not come up");
    }

    pub fn server_ip(&self) -> String {
        format!("{}.2", self.prefix)
    }

    /// The namespace's IPv6 address (servers bound to `::` answer on it too).
    #[allow(dead_code)] // only the IPv6 tests use it
    pub fn server_ip6(&self) -> String {
        format!("{}::2", self.prefix6)
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        if let Some(server) = self.server.as_mut() {
            let _ = server.kill();
            let _ = server.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .stderr(Stdio::null())
            .status();
    }
}
