//! How a runtime tells the agent to build its sandbox before serving.
//!
//! The jail runtime passes this as JSON on a sealed memfd ([`CONFIG_FD`]); the agent is then
//! PID 1 of fresh namespaces and turns it into mounts, confinement and a listening socket.

use serde::{Deserialize, Serialize};

/// File descriptor on which the agent finds its already-bound listening socket.
pub const LISTEN_FD: i32 = 3;

/// File descriptor from which the agent reads its [`InitConfig`] (JSON) once at start: not in
/// argv, where the sandbox (`/proc/1/cmdline`) and every host `ps` could read it.
pub const CONFIG_FD: i32 = 4;

/// First of [`InitConfig::workload_cgroup_fds`] descriptors, each a file a process joins the
/// sandbox's workload cgroup through (`tasks`, one per cgroup-v1 hierarchy: a thread moving
/// itself there skips the kernel's global threadgroup lock; `cgroup.procs` on v2) opened for
/// writing by the runtime: every process the agent starts writes `0` into each before exec
/// (or, on v1, is cloned by the agent's one thread that joined them, see
/// [`InitConfig::workload_joins_per_thread`]), so sandbox code runs in the workload group
/// while the agent stays above it, outside its OOM domain.
pub const WORKLOAD_CGROUP_FD: i32 = 5;
/// At most one per v1 controller hierarchy the runtime uses (memory, cpu, cpuacct, pids,
/// freezer).
pub const MAX_WORKLOAD_CGROUP_FDS: u32 = 5;

/// `Default` is an empty configuration, for runtimes' tests that fill in what they need.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitConfig {
    pub hostname: String,
    /// Host directory where the sandbox root is assembled before `pivot_root`.
    pub root_target: String,
    /// Read-only lower layer(s) of the root overlay, top first.
    pub image_layers: Vec<String>,
    /// Per-session writable upper layer and overlay work dir (same filesystem).
    pub upper_dir: String,
    pub work_dir: String,
    /// Host paths bound read-only into the sandbox (e.g. the host's /usr for the `host` image).
    pub ro_binds: Vec<Bind>,
    pub tmp_size_mib: u64,
    /// Default working directory of execs and base of relative file paths.
    pub workdir: String,
    /// Base environment of every exec.
    pub env: Vec<(String, String)>,
    /// In-sandbox directories Landlock lets processes write below; everything else is read-only.
    pub writable_dirs: Vec<String>,
    pub rlimits: Rlimits,
    /// Outgoing connections are redirected to the agent and decided by the daemon; without it
    /// the sandbox has loopback only.
    #[serde(default)]
    pub egress: bool,
    /// The runtime cloned the agent into a network namespace it made itself, loopback up and,
    /// with `egress`, [`EGRESS_RULES`] and the default routes loaded: the agent leaves its
    /// network as it finds it (it holds no capability over that namespace).
    #[serde(default)]
    pub network_ready: bool,
    /// How many workload join-file descriptors sit from [`WORKLOAD_CGROUP_FD`] on; 0 when
    /// the runtime has no cgroups (rootless).
    #[serde(default)]
    pub workload_cgroup_fds: u32,
    /// The join files are cgroup-v1 `tasks` files, through which a thread moves alone: the
    /// agent may keep one thread in the workload and start every exec's process from it, so
    /// no process has to join. Never on v2, where `0` in `cgroup.procs` moves the whole agent.
    #[serde(default)]
    pub workload_joins_per_thread: bool,
    /// Volumes the agent mounts into the root, after every other mount.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<InitVolume>,
    /// Captured session layers between `upper_dir` and `image_layers`, top first: host paths of
    /// read-only mounts the runtime prepared (id-mapped onto the sandbox's ids, as volumes are),
    /// which the agent clones before its pivot and stacks as lower layers of the root overlay.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layer_mounts: Vec<String>,
}

/// One volume for the agent to mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitVolume {
    /// Host path of the volume's root, already id-mapped onto the sandbox's ids by the runtime;
    /// the agent clones it before the pivot, while host paths are still reachable.
    pub source: String,
    /// Path inside the sandbox; the agent checks it again ([`crate::check_mount_target`]).
    pub target: String,
    pub read_only: bool,
}

/// Where the agent listens for redirected TCP inside the sandbox.
pub const EGRESS_PORT: u16 = 15001;

/// The nftables ruleset of a sandbox with egress, loaded by whoever sets its network up (the
/// agent at boot, or the jail runtime ahead of it): every outgoing TCP connection is
/// redirected to the agent's listener ([`EGRESS_PORT`]), DNS to its resolver, everything else
/// leaving loopback is dropped. IPv6 the same way: its connections reach the same listener (on
/// `::1`) and so the same policy as IPv4's. Connections the redirect caught keep their
/// original (non-loopback) addresses in conntrack, so their packets are accepted by connection
/// state.
pub const EGRESS_RULES: &str = "
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    pub source: String,
    /// Path inside the sandbox.
    pub target: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rlimits {
    pub nofile: u64,
    pub nproc: u64,
    pub core: u64,
}

/// What a microVM's agent needs beyond the kernel: found at [`VM_CONFIG_PATH`] in the guest's
/// initramfs (the runtime appends it to the shared base archive per VM).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmConfig {
    pub hostname: String,
    pub workdir: String,
    pub env: Vec<(String, String)>,
    pub writable_dirs: Vec<String>,
    pub rlimits: Rlimits,
    pub tmp_size_mib: u64,
    /// The agent listens on this vsock port for the daemon's one connection (when
    /// `serial_port` is `None`).
    pub vsock_port: u32,
    /// The name of the virtio-serial port the agent serves the daemon on instead of vsock
    /// (QEMU: a migratable device, so the VM can be saved to a file). One byte stream across
    /// reconnections, so each connection starts with the [`sync`] handshake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial_port: Option<String>,
    pub limits: crate::messages::GuestLimits,
    /// Serial numbers (`/sys/block/vdX/serial`) of the read-only image disk and of the scratch
    /// disk holding the writable layer: QEMU sets them, Firecracker derives them from the
    /// backing files, so the runtime says which to look for.
    pub root_disk_serial: String,
    pub scratch_disk_serial: String,
    /// Network access mediated by the agent, as in a jail (the guest has no network device).
    #[serde(default)]
    pub egress: bool,
    /// Captured layers the writable layer starts from (a sandbox made from a snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<VmLayers>,
    /// Volumes shared from the host over virtio-fs, each mounted at its target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VmVolume>,
}

/// A volume of a microVM: a virtio-fs share the host serves (read-only on the host side too
/// when `read_only`), found by its tag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmVolume {
    pub tag: String,
    /// Absolute path inside the sandbox, under the same rules as [`InitVolume::target`].
    pub target: String,
    pub read_only: bool,
}

/// The layers of a microVM made from a snapshot: `koder-layer` tar streams laid end to end on
/// one read-only raw disk, applied in order onto the empty upper directory before the overlay
/// is mounted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmLayers {
    /// Serial the guest finds the disk by (see [`VmConfig::root_disk_serial`]).
    pub disk_serial: String,
    /// Byte length of each stream, bottom layer first; each starts where the one before ends.
    pub sizes: Vec<u64>,
    /// Most file content one layer may hold: the disk quota.
    pub max_bytes: u64,
}

/// Where a sandbox finds its `sudo` (the agent's binary, see `koder_agent::sudo`): in the
/// bottom layer of the root overlay ([`link_sudo_layer`]), so an image's own file of that name
/// wins. The first is early in Debian's PATH (its /etc/profile's too), the second in the
/// `host` image's, whose /usr (the host's) hides the first.
pub const SUDO_PATHS: [&str; 2] = ["/usr/local/bin/sudo", "/opt/koder-sandbox/bin/sudo"];

/// Fills `layer` (absent or empty) with hard links to `agent` at each of [`SUDO_PATHS`], in
/// directories any sandbox account may enter whatever the umask: the bottom layer of a root
/// overlay. A jail's runtime makes it beside the agent it installs, a microVM guest's agent in
/// its initramfs beside itself; a layer rather than a bind mount, so no mount of the sandbox
/// shows where the binary lives.
pub fn link_sudo_layer(agent: &std::path::Path, layer: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for path in SUDO_PATHS {
        let file = layer.join(path.trim_start_matches('/'));
        let Some(dir) = file.parent() else { continue };
        std::fs::create_dir_all(dir)?;
        for d in dir.ancestors().take_while(|d| d.starts_with(layer)) {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?;
        }
        std::fs::hard_link(agent, &file)?;
    }
    Ok(())
}

/// What the guest agent prints on its console once it serves its channel (vsock or serial);
/// the runtime waits for it before the first connection.
pub const VM_READY_LINE: &str = "koder-agent: ready on";

/// Where the guest agent reads its [`VmConfig`].
pub const VM_CONFIG_PATH: &str = "/koder/config.json";
/// Kernel modules to load before anything else, in order, one file name per line; the files
/// sit next to it.
pub const VM_MODULES_LIST: &str = "/koder/modules/order";
/// Modules loaded after those of [`VM_MODULES_LIST`] when the guest has egress.
pub const VM_EGRESS_MODULES_LIST: &str = "/koder/modules/egress";
/// Modules loaded after those of [`VM_MODULES_LIST`] when the guest mounts volumes (virtio-fs).
pub const VM_VOLUME_MODULES_LIST: &str = "/koder/modules/volumes";
/// Serial numbers QEMU gives the guest's disks: the read-only image and the session's scratch
/// disk (the writable overlay layer).
pub const VM_ROOT_DISK_SERIAL: &str = "koder-root";
pub const VM_SCRATCH_DISK_SERIAL: &str = "koder-scratch";
/// Serial of the read-only disk holding [`VmLayers`].
pub const VM_LAYERS_DISK_SERIAL: &str = "koder-layers";

/// The resynchronisation of a byte stream that outlives its connections (a virtio-serial port:
/// the guest sees one device whether or not the host is connected, and bytes of a half-sent
/// frame of an earlier connection may still sit in either direction).
///
/// On every connection the host sends `\nKODER-SYNC <nonce>\n` with a fresh random nonce and
/// then nothing until it has read `KODER-READY <nonce>\n` back, discarding everything before
/// it; the guest discards input until a `KODER-SYNC` line, answers it, and both start fresh
/// codecs right after those lines. The marker starts with a byte no frame length can start
/// with (frames are at most [`crate::MAX_FRAME_BYTES`], so their 4-byte big-endian length
/// begins with 0): a guest still reading frames of an older connection recognises a marker at
/// a frame boundary and goes back to the handshake.
pub mod sync {
    /// What the host sends first on every connection, before the nonce.
    pub const SYNC: &str = "KODER-SYNC ";
    /// What the guest answers, before the same nonce.
    pub const READY: &str = "KODER-READY ";
    /// Hex digits of a nonce.
    pub const NONCE_LEN: usize = 32;
    /// Longest line the scanner keeps; longer ones are skipped as garbage.
    const MAX_LINE: usize = 64;

    /// The line the host sends for `nonce`.
    pub fn sync_line(nonce: &str) -> String {
        format!("\n{SYNC}{nonce}\n")
    }

    /// The line the guest answers `nonce` with.
    pub fn ready_line(nonce: &str) -> String {
        format!("\n{READY}{nonce}\n")
    }

    /// Whether `head` (the first bytes at a frame boundary) can only be a marker, never a frame
    /// length.
    pub fn is_marker_start(head: u8) -> bool {
        head != 0
    }

    /// Finds `<prefix><nonce>\n` lines in a byte stream fed in pieces, in bounded memory:
    /// lines longer than a marker are dropped as they come.
    #[derive(Debug)]
    pub struct LineScanner {
        prefix: &'static str,
        line: Vec<u8>,
        /// Inside a line already too long to be a marker: skip to its end.
        skipping: bool,
    }

    impl LineScanner {
        pub fn new(prefix: &'static str) -> Self {
            Self {
                prefix,
                line: Vec::with_capacity(MAX_LINE),
                skipping: false,
            }
        }

        /// Feeds `input`; at the first marker line returns its nonce and how many bytes of
        /// `input` it took (up to and including the line's `\n`): the rest is the new stream.
        pub fn feed(&mut self, input: &[u8]) -> Option<(String, usize)> {
            for (i, &b) in input.iter().enumerate() {
                if b == b'\n' {
                    let found = (!self.skipping).then(|| self.nonce()).flatten();
                    self.line.clear();
                    self.skipping = false;
                    if let Some(nonce) = found {
                        return Some((nonce, i + 1));
                    }
                } else if !self.skipping {
                    if self.line.len() >= MAX_LINE {
                        self.line.clear();
                        self.skipping = true;
                    } else {
                        self.line.push(b);
                    }
                }
            }
            None
        }

        fn nonce(&self) -> Option<String> {
            let nonce = self.line.strip_prefix(self.prefix.as_bytes())?;
            let ok = nonce.len() == NONCE_LEN
                && nonce
                    .iter()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
            ok.then(|| String::from_utf8_lossy(nonce).into_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONCE: &str = "0123456789abcdef0123456789abcdef";

    /// Both families' TCP goes to the agent's egress listener, so the port has one source.
    #[test]
    fn the_egress_rules_redirect_to_the_egress_port() {
        let redirect = format!("meta l4proto tcp redirect to :{EGRESS_PORT}");
        assert_eq!(EGRESS_RULES.matches(&redirect).count(), 2);
    }

    #[test]
    fn sync_lines_are_found_in_garbage_fed_in_pieces() {
        let mut input = vec![0u8, 0, 0, 9, 1, 2, 3];
        input.extend(std::iter::repeat_n(b'x', 10_000));
        input.extend(b"\nKODER-SYNC 0123\n");
        input.extend(b"KODER-SYNC 0123456789ABCDEF0123456789abcdef\n");
        input.extend(sync::ready_line(NONCE).as_bytes());
        input.extend(sync::sync_line(NONCE).as_bytes());
        input.extend(b"after");
        let mut scanner = sync::LineScanner::new(sync::SYNC);
        let mut taken = 0;
        let mut found = None;
        for chunk in input.chunks(7) {
            if let Some((nonce, n)) = scanner.feed(chunk) {
                found = Some(nonce);
                taken += n;
                break;
            }
            taken += chunk.len();
        }
        assert_eq!(found.as_deref(), Some(NONCE));
        assert_eq!(&input[taken..taken + 1], b"a");
    }

    #[test]
    fn a_marker_inside_a_long_line_is_no_marker() {
        let mut scanner = sync::LineScanner::new(sync::READY);
        let mut input = vec![b'y'; 100];
        input.extend(sync::ready_line(NONCE).trim_start().as_bytes());
        assert_eq!(scanner.feed(&input), None);
        let (nonce, n) = scanner.feed(sync::ready_line(NONCE).as_bytes()).unwrap();
        assert_eq!((nonce.as_str(), n), (NONCE, sync::ready_line(NONCE).len()));
    }

    #[test]
    fn markers_never_look_like_frames() {
        for line in [sync::sync_line(NONCE), sync::ready_line(NONCE)] {
            let head = line.as_bytes();
            assert!(sync::is_marker_start(head[0]));
            let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
            assert!(len > crate::MAX_FRAME_BYTES);
        }
        let frame_len = (crate::MAX_FRAME_BYTES as u32).to_be_bytes();
        assert!(!sync::is_marker_start(frame_len[0]));
    }

    /// A runtime that knows nothing of volumes still configures an agent that does.
    #[test]
    fn volume_mounts_default_to_none() {
        let cfg = InitConfig {
            hostname: "h".into(),
            root_target: "/r".into(),
            image_layers: vec!["/l".into()],
            upper_dir: "/u".into(),
            work_dir: "/w".into(),
            ro_binds: Vec::new(),
            tmp_size_mib: 1,
            workdir: "/workspace".into(),
            env: Vec::new(),
            writable_dirs: Vec::new(),
            rlimits: Rlimits {
                nofile: 1,
                nproc: 1,
                core: 0,
            },
            egress: false,
            network_ready: false,
            workload_cgroup_fds: 0,
            workload_joins_per_thread: false,
            volume_mounts: Vec::new(),
            layer_mounts: Vec::new(),
        };
        let json = serde_json::to_string(&cfg).expect("encode");
        assert!(!json.contains("volume_mounts") && !json.contains("layer_mounts"));
        assert_eq!(
            serde_json::from_str::<InitConfig>(&json).expect("decode"),
            cfg
        );
        let with = InitConfig {
            volume_mounts: vec![InitVolume {
                source: "/s/volumes/0".into(),
                target: "/data".into(),
                read_only: true,
            }],
            layer_mounts: vec!["/s/layers/0".into()],
            ..cfg
        };
        let json = serde_json::to_string(&with).expect("encode");
        assert_eq!(
            serde_json::from_str::<InitConfig>(&json).expect("decode"),
            with
        );
    }
}
