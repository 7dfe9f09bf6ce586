//! Starts the real `koder-sandbox` binary on a free loopback port with its own data dir and
//! cgroup parent, and talks to it over HTTP.

#![allow(dead_code)] // each test binary uses a different subset

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

pub const KEY1: &str = "key-one-1234";
pub const KEY2: &str = "key-two-5678";

static N: AtomicU32 = AtomicU32::new(0);

pub fn root_or_skip() -> Option<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        Some(())
    } else {
        eprintln!("skipped: daemon integration tests need root (real sandboxes)");
        None
    }
}

pub struct Daemon {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub base: String,
    pub http: reqwest::Client,
    pub cgroup_parent: String,
    config: String,
    keys: bool,
    /// `--listen`: a free loopback port unless started in a namespace.
    listen: String,
    /// The network namespace the daemon runs in (multi-node tests).
    netns: Option<std::path::PathBuf>,
    /// A filesystem mounted for the data dir ([`Daemon::start_on_btrfs`]).
    data_fs: Option<std::path::PathBuf>,
    /// Where stderr goes instead of the test's own ([`Daemon::start_logging`]), with the
    /// environment that start adds.
    log_file: Option<(std::path::PathBuf, Vec<(String, String)>)>,
    /// The lines the daemon printed after its first (its other listeners' addresses).
    printed: Printed,
}

/// Lines of a daemon's stdout after the first, as they come.
type Printed = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// The `[microvm]` table pointing at the image `ksandbox image build` made
/// (`KODER_MICROVM_IMAGES`, default the test cache's `microvm-images`; scripts/test.sh builds
/// it), with
/// the backend `KODER_MICROVM_BACKEND` names (default qemu; firecracker on a KVM host).
pub fn microvm_section() -> String {
    let images = std::env::var_os("KODER_MICROVM_IMAGES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/var/cache/koder-sandbox-test/microvm-images".into());
    assert!(
        images.join("microvm/manifest.json").is_file(),
        "no microvm image in {} (scripts/test.sh builds it: ksandbox image build --images-dir ...)",
        images.display()
    );
    let backend = std::env::var("KODER_MICROVM_BACKEND").unwrap_or_else(|_| "qemu".into());
    format!(
        "[microvm]\nimages_dir = \"{}\"\nbackend = \"{backend}\"\nvm_memory_mib = 256\nboot_timeout_s = 120\n",
        images.display()
    )
}

/// Test defaults: no warm pool (unless asked), fast reaper.
pub const BASE_CONFIG: &str = "[sessions]\nreap_interval = 0.2\npool = {}\n";

impl Daemon {
    /// Starts a daemon with tenants t1/t2 (KEY1/KEY2) and `config` (TOML, replacing BASE_CONFIG).
    pub async fn start(config: &str) -> Daemon {
        Self::start_with(config, true).await
    }

    pub async fn start_with(config: &str, keys: bool) -> Daemon {
        Self::start_at(config, keys, "127.0.0.1:0", None).await
    }

    /// Starts a daemon inside the network namespace `netns` (a file under /run/netns),
    /// listening on a free port of `ip` there.
    pub async fn start_in(config: &str, netns: std::path::PathBuf, ip: &str) -> Daemon {
        Self::start_at(config, true, &format!("{ip}:0"), Some(netns)).await
    }

    async fn start_at(
        config: &str,
        keys: bool,
        listen: &str,
        netns: Option<std::path::PathBuf>,
    ) -> Daemon {
        let mut d = Self::unstarted(config, keys, listen, netns);
        d.launch().await;
        d
    }

    /// As [`Daemon::start`], with stderr written to a file ([`Daemon::log`]) as a service
    /// manager would, and `env` added to the daemon's environment.
    pub async fn start_logging(config: &str, env: &[(&str, &str)]) -> Daemon {
        let mut d = Self::unstarted(config, true, "127.0.0.1:0", None);
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        d.log_file = Some((d.dir.path().join("daemon.log"), env.collect()));
        d.launch().await;
        d
    }

    /// Sends stderr to the log file of [`Daemon::start_logging`], if any, with its environment;
    /// a relaunch appends, so the log holds every run on this data dir.
    fn log_to_file(&self, cmd: &mut Command) {
        let Some((path, env)) = &self.log_file else {
            return;
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("open the daemon's log");
        cmd.stderr(file).envs(env.iter().map(|(k, v)| (k, v)));
    }

    /// What the daemon wrote on stderr so far ([`Daemon::start_logging`] only).
    pub fn log(&self) -> String {
        let (path, _) = self.log_file.as_ref().expect("started with start_logging");
        std::fs::read_to_string(path).expect("read the daemon's log")
    }

    /// As [`Daemon::start`], on a data dir that is a btrfs filesystem made for it on a sparse
    /// file (files there can share blocks); `None` where mkfs.btrfs is missing.
    pub async fn start_on_btrfs(config: &str) -> Option<Daemon> {
        let mut d = Self::unstarted(config, true, "127.0.0.1:0", None);
        let image = d.dir.path().join("btrfs.img");
        let file = std::fs::File::create(&image).expect("create the btrfs image");
        file.set_len(8 << 30).expect("size the btrfs image");
        let made = Command::new("mkfs.btrfs")
            .arg("-q")
            .arg(&image)
            .stdout(Stdio::null())
            .status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("skipped: no mkfs.btrfs (btrfs-progs)");
            return None;
        }
        let data = d.data_dir();
        std::fs::create_dir(&data).expect("create the data dir");
        let mounted = Command::new("mount")
            .args(["-t", "btrfs", "-o", "loop"])
            .arg(&image)
            .arg(&data)
            .status()
            .expect("run mount");
        assert!(mounted.success(), "mount the btrfs data dir: {mounted}");
        d.data_fs = Some(data);
        d.launch().await;
        Some(d)
    }

    fn unstarted(
        config: &str,
        keys: bool,
        listen: &str,
        netns: Option<std::path::PathBuf>,
    ) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("kd-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let n = N.fetch_add(1, Ordering::Relaxed);
        let cgroup_parent = format!("koder-test-api-{}-{n}", std::process::id());
        Daemon {
            child: None,
            dir,
            base: String::new(),
            http: reqwest::Client::new(),
            cgroup_parent,
            config: config.to_string(),
            keys,
            listen: listen.to_string(),
            netns,
            data_fs: None,
            log_file: None,
            printed: Printed::default(),
        }
    }

    /// (Re)starts the process on the same data dir.
    pub async fn launch(&mut self) {
        let config_path = self.dir.path().join("koder.toml");
        std::fs::write(
            &config_path,
            with_cgroup_parent(&self.config, &self.cgroup_parent),
        )
        .expect("write config");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_koder-sandbox"));
        cmd.arg("serve")
            .arg("--config")
            .arg(&config_path)
            // Port 0: the daemon picks a free port and prints it, so parallel tests never race
            // for one.
            .arg("--listen")
            .arg(&self.listen)
            .arg("--data-dir")
            .arg(self.dir.path().join("data"))
            .env("RUST_LOG", test_log_filter())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        self.log_to_file(&mut cmd);
        if self.keys {
            cmd.arg("--api-key")
                .arg(format!("t1:{KEY1}"))
                .arg("--api-key")
                .arg(format!("t2:{KEY2}"));
        }
        if let Some(netns) = &self.netns {
            enter_netns(&mut cmd, netns);
        }
        let mut child = cmd.spawn().expect("spawn daemon");
        let stdout = child.stdout.take().expect("daemon stdout");
        self.child = Some(child);
        self.printed = Printed::default();
        self.base = listening_address(stdout, self.printed.clone()).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = self.http.get(format!("{}/healthz", self.base)).send().await {
                if r.status() == StatusCode::OK {
                    return;
                }
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("daemon exited during start-up: {status}");
            }
            assert!(Instant::now() < deadline, "daemon not healthy within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn data_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    pub fn req(&self, method: Method, path: &str, key: &str) -> RequestBuilder {
        self.http
            .request(method, format!("{}{}", self.base, path))
            .bearer_auth(key)
    }

    /// Sends a JSON request as tenant t1 and returns status and body.
    pub async fn json(&self, method: Method, path: &str, body: Value) -> (StatusCode, Value) {
        self.json_as(KEY1, method, path, body).await
    }

    pub async fn json_as(
        &self,
        key: &str,
        method: Method,
        path: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        let mut rb = self.req(method, path, key);
        if !body.is_null() {
            rb = rb.json(&body);
        }
        let resp = rb.send().await.expect("request");
        let status = resp.status();
        let bytes = resp.bytes().await.expect("body");
        let v = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        (status, v)
    }

    pub async fn create(&self, body: Value) -> String {
        let (status, v) = self.json(Method::POST, "/v1/sandbox/sessions", body).await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        v["id"].as_str().expect("session id").to_string()
    }

    pub async fn exec(&self, id: &str, body: Value) -> Value {
        let (status, v) = self
            .json(
                Method::POST,
                &format!("/v1/sandbox/sessions/{id}/exec"),
                body,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v
    }

    /// Pauses session `id` to disk (its layers captured, its sandbox gone).
    pub async fn pause_to_disk(&self, id: &str) {
        let (status, v) = self
            .json(
                Method::POST,
                &format!("/v1/sandbox/sessions/{id}/pause"),
                json!({"memory": false}),
            )
            .await;
        assert_eq!(
            (status, &v["state"]),
            (StatusCode::OK, &json!("paused")),
            "{v}"
        );
    }

    pub async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }

    /// SIGKILL, as a crash would.
    pub fn crash(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait: the daemon destroys its sandboxes.
    /// The address the daemon printed for its `what` listener (`gRPC`, `HTTPS`): tests ask for
    /// port 0 and read the port the daemon got, so no other process can take it meanwhile.
    pub async fn printed_address(&self, what: &str) -> String {
        let prefix = format!("koder-sandbox {what} listening on ");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let found = self.printed.lock().ok().and_then(|lines| {
                lines
                    .iter()
                    .find_map(|l| l.strip_prefix(&prefix).map(String::from))
            });
            if let Some(address) = found {
                return address;
            }
            assert!(
                Instant::now() < deadline,
                "the daemon printed no {what} address"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: plain syscall on a pid this test started; no memory is shared.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
        remove_cgroup_parent(&self.cgroup_parent);
        // Lazily: the loop devices of sandbox disks on it let go once their sandboxes are gone.
        if let Some(fs) = self.data_fs.take() {
            let _ = Command::new("umount").arg("-l").arg(&fs).status();
        }
    }
}

/// Removes the test's cgroup parent on every path: a crashed daemon (a `crash()` test, or a
/// test that panicked mid-way) leaves sandbox groups under it, which keep the parent alive,
/// so those are destroyed (their processes killed) first.
fn remove_cgroup_parent(parent: &str) {
    use koder_cgroups::CgroupDriver as _;
    if let Ok(driver) = koder_cgroups::detect(parent) {
        for name in driver.list().unwrap_or_default() {
            if let Ok(group) = driver.open(&name) {
                let _ = group.destroy();
            }
        }
    }
    let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for c in controllers.flatten() {
        let _ = std::fs::remove_dir(c.path().join(parent));
    }
}

pub fn error_code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("<no error code>")
}

/// `config` with the test's cgroup parent in its `[jail]` table (added when it has none).
fn with_cgroup_parent(config: &str, parent: &str) -> String {
    let line = format!("cgroup_parent = \"{parent}\"\n");
    match config.find("[jail]\n") {
        Some(at) => {
            let (head, tail) = config.split_at(at + "[jail]\n".len());
            format!("{head}{line}{tail}")
        }
        None => format!("{config}\n[jail]\n{line}"),
    }
}

/// Makes `cmd` run in the network namespace `netns` (only that: `ip netns exec` would also
/// remount /sys, hiding the cgroup hierarchy from the daemon).
fn enter_netns(cmd: &mut Command, netns: &std::path::Path) {
    use std::os::fd::AsRawFd as _;
    use std::os::unix::process::CommandExt as _;
    let file = std::fs::File::open(netns).expect("open the network namespace");
    // SAFETY: between fork and exec the closure only calls setns(2), which is
    // async-signal-safe, on a descriptor the parent keeps open until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The base URL the daemon prints once it listens (`koder-sandbox listening on http://...`);
/// the lines after it go to `printed`.
async fn listening_address(stdout: std::process::ChildStdout, printed: Printed) -> String {
    let (tx, rx) = tokio::sync::oneshot::channel();
    // The reader keeps draining afterwards, so the daemon never writes into a closed pipe.
    std::thread::spawn(move || {
        let mut reader = std::io::BufReader::new(stdout);
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(&mut reader, &mut line);
        let _ = tx.send(line);
        for line in std::io::BufRead::lines(reader).map_while(Result::ok) {
            if let Ok(mut lines) = printed.lock() {
                lines.push(line);
            }
        }
    });
    let line = tokio::time::timeout(Duration::from_secs(30), rx)
        .await
        .expect("daemon did not report its address within 30 s")
        .expect("reading the daemon's stdout");
    line.trim()
        .strip_prefix("koder-sandbox listening on ")
        .unwrap_or_else(|| panic!("unexpected daemon output: {line:?}"))
        .to_string()
}

/// A WebSocket to one of a session's live endpoints.
pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens the session's terminal WebSocket (`query` starts with `?` or is empty).
pub async fn connect(d: &Daemon, id: &str, query: &str) -> Socket {
    let url = format!(
        "{}/v1/sandbox/sessions/{id}/terminal{query}",
        d.base.replace("http://", "ws://")
    );
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {KEY1}").parse().unwrap());
    tokio_tungstenite::connect_async(req)
        .await
        .expect("websocket")
        .0
}

/// Reads until the terminal output contains `needle`; returns everything read.
pub async fn read_until(ws: &mut Socket, needle: &str) -> String {
    let mut out = String::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !out.contains(needle) {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .unwrap_or_else(|_| panic!("no {needle:?} in {out:?}"));
        match msg {
            Some(Ok(Message::Binary(b))) => out.push_str(&String::from_utf8_lossy(&b)),
            Some(Ok(Message::Text(t))) => out.push_str(&t),
            Some(Ok(_)) => {}
            other => panic!("terminal ended early ({other:?}); output so far: {out:?}"),
        }
    }
    out
}

/// The JSON control message announcing the exit.
pub async fn exit_message(ws: &mut Socket) -> Value {
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(10), ws.next())
            .await
            .expect("exit message")
        {
            Some(Ok(Message::Text(t))) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v["type"] == "exit" {
                    return v;
                }
            }
            Some(Ok(_)) => {}
            other => panic!("closed without an exit message: {other:?}"),
        }
    }
}

/// One parsed SSE event.
#[derive(Debug)]
pub struct Sse {
    pub name: String,
    pub data: Value,
    pub at: std::time::Instant,
}

/// Reads SSE events until a closing one (`exit` of an exec, `result` or `error` of a context
/// run) or the end of the stream.
pub async fn read_sse(resp: reqwest::Response) -> Vec<Sse> {
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let mut body = resp.bytes_stream();
    let mut buf = String::new();
    let mut events = Vec::new();
    while let Some(chunk) = body.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let mut name = String::from("message");
            let mut data = String::new();
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event:") {
                    name = n.trim().to_string();
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push_str(d.trim_start());
                }
            }
            if data.is_empty() {
                continue; // keep-alive comment
            }
            let done = matches!(name.as_str(), "exit" | "result" | "error");
            events.push(Sse {
                name,
                data: serde_json::from_str(&data).unwrap(),
                at: std::time::Instant::now(),
            });
            if done {
                return events;
            }
        }
    }
    events
}

pub fn stdout_of(events: &[Sse]) -> String {
    events
        .iter()
        .filter(|e| e.name == "stdout")
        .filter_map(|e| e.data["data"].as_str())
        .collect()
}

impl Daemon {
    /// Like [`Daemon::launch`], on a fixed `listen` address and with extra environment (test
    /// hooks such as `KODER_TEST_CRASH_AT`), for restart tests that need the same port back.
    pub async fn launch_at(&mut self, listen: &str, env: &[(&str, &str)]) {
        let config_path = self.dir.path().join("koder.toml");
        std::fs::write(
            &config_path,
            with_cgroup_parent(&self.config, &self.cgroup_parent),
        )
        .expect("write config");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_koder-sandbox"));
        cmd.arg("serve")
            .arg("--config")
            .arg(&config_path)
            .arg("--listen")
            .arg(listen)
            .arg("--data-dir")
            .arg(self.data_dir())
            .env("RUST_LOG", test_log_filter())
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        self.log_to_file(&mut cmd);
        if self.keys {
            cmd.arg("--api-key").arg(format!("t1:{KEY1}"));
        }
        let mut child = cmd.spawn().expect("spawn daemon");
        let stdout = child.stdout.take().expect("daemon stdout");
        self.child = Some(child);
        self.printed = Printed::default();
        self.base = listening_address(stdout, self.printed.clone()).await;
    }

    /// Waits (bounded) for the daemon process to end on its own, e.g. at a crash point.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

/// Host processes running `exe` whose command line mentions `needle`.
pub fn processes_of(exe: &std::path::Path, needle: &str) -> Vec<i32> {
    let exe = std::fs::canonicalize(exe).unwrap_or_else(|_| exe.to_path_buf());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let runs = std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p == exe);
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            runs && String::from_utf8_lossy(&cmdline).contains(needle)
        })
        .collect()
}

/// The daemon's log filter: `warn`, or KODER_TEST_LOG (a RUST_LOG filter) to watch a hanging
/// test's daemon at work.
fn test_log_filter() -> String {
    std::env::var("KODER_TEST_LOG").unwrap_or_else(|_| "warn".into())
}

/// Links the language pack `pack` from the test cache (`KODER_PACK_CACHE`, default the test
/// cache's `packs`; built there the first time) into the stopped daemon `d`'s image store.
pub fn link_pack(d: &Daemon, pack: koder_image::packs::Pack) -> koder_image::StoredImage {
    use koder_image::{packs, ImageStore};
    let dir = std::env::var_os("KODER_PACK_CACHE")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/var/cache/koder-sandbox-test/packs".into());
    let cache = ImageStore::open(&dir).expect("pack cache");
    packs::build(&cache, pack, &packs::BuildOptions::default())
        .unwrap_or_else(|e| panic!("building the {} pack: {e}", pack.name()));
    ImageStore::open(&d.data_dir().join("images"))
        .expect("the daemon's image store")
        .link_from(&cache, pack.name())
        .unwrap_or_else(|e| panic!("linking the {} pack: {e}", pack.name()))
}

/// Sandbox cgroups under the daemon's parent, in every controller hierarchy.
pub fn sandbox_cgroups(d: &Daemon) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut roots = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    if let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") {
        roots.extend(controllers.flatten().map(|c| c.path()));
    }
    for root in roots {
        if let Ok(children) = std::fs::read_dir(root.join(&d.cgroup_parent)) {
            found.extend(
                children
                    .flatten()
                    .filter(|c| c.file_type().is_ok_and(|t| t.is_dir()))
                    // Groups the jail made ahead for the next creates (cgroup v1) are no
                    // sandbox's: named `<prefix>ready.<n>`, which no sandbox id can be.
                    .filter(|c| !c.file_name().to_string_lossy().contains("ready."))
                    .map(|c| c.path()),
            );
        }
    }
    found
}

/// Polls `done` for up to 5 s: for what finishes after an answer (a DELETE's teardown).
pub async fn comes_true(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// A process that has not exited (a zombie has).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}
