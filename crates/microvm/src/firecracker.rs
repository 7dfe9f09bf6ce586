//! Firecracker backend (KVM only): one `firecracker` process per VM, configured and booted
//! through its HTTP API on a unix socket in the VM's directory. Its virtio-vsock device is
//! served by Firecracker itself on `Launch::vsock_uds()`, in the `CONNECT <port>` convention.
//!
//! Two Firecracker rules shape the disks: API resource ids may only hold alphanumerics and
//! `_` (so the drive ids cannot be the guest-facing serials, which contain `-`), and the
//! virtio-blk serial a guest reads is not the drive id but derived from the backing file (see
//! [`guest_disk_serial`]).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{ACCEPT, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use koder_runtime::RuntimeError;
use serde_json::{json, Value};
use tokio::net::UnixStream;
use tokio::process::{Child, Command};

use crate::kvm;
use crate::qemu::find_program;
use crate::vmm::{Accel, AgentChannel, Launch, VmProcesses, Vmm};

/// The API socket's name inside the VM directory.
const API_SOCKET: &str = "firecracker.sock";
/// Every VM has its own vsock device and host socket, so CIDs never meet.
const GUEST_CID: u32 = 3;
pub const ROOT_DRIVE_ID: &str = "koder_root";
pub const SCRATCH_DRIVE_ID: &str = "koder_scratch";
pub const LAYERS_DRIVE_ID: &str = "koder_layers";
/// Firecracker opens its socket within milliseconds; seconds mean it is stuck or gone.
const SOCKET_WAIT: Duration = Duration::from_secs(5);
/// Configuration calls and InstanceStart only read files and set up KVM.
const API_TIMEOUT: Duration = Duration::from_secs(10);
/// Snapshots write or map the whole guest memory, gigabytes on a slow disk.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(300);
/// virtio-blk's `VIRTIO_BLK_ID_BYTES`: the longest serial a guest can read.
const VIRTIO_BLK_ID_BYTES: usize = 20;

pub struct Firecracker {
    binary: PathBuf,
}

impl Firecracker {
    /// Unavailable (with the reason) unless the binary exists and hardware KVM can boot a
    /// stock kernel here: Firecracker has no emulator to fall back on.
    pub fn new(binary: PathBuf) -> Result<Self, RuntimeError> {
        let binary = find_program(&binary)
            .ok_or_else(|| RuntimeError::Unavailable(format!("{} not found", binary.display())))?;
        kvm::kvm_usable().map_err(|reason| {
            RuntimeError::Unavailable(format!("firecracker needs hardware KVM: {reason}"))
        })?;
        Ok(Self { binary })
    }

    /// Starts a `firecracker` process for `launch` and returns once its API answers, with
    /// nothing configured: [`Vmm::start`] configures and boots it, a snapshot restore hands
    /// it to [`snapshot_load`] instead.
    pub async fn spawn(&self, launch: &Launch) -> Result<Child, RuntimeError> {
        if launch.accel != Accel::Kvm {
            return Err(RuntimeError::Unavailable(
                "firecracker runs guests only with KVM".into(),
            ));
        }
        let api_sock = api_socket(&launch.dir);
        // Firecracker refuses to bind over an existing socket; in the VM's private directory
        // one can only be a previous run's.
        for stale in std::iter::once(api_sock.as_path()).chain(launch.vsock_uds()) {
            remove_if_present(stale)?;
        }
        let mut child = self
            .command(launch, &api_sock)?
            .spawn()
            .map_err(|e| RuntimeError::Start(format!("start {}: {e}", self.binary.display())))?;
        let console = launch.console_log();
        wait_for_api(&api_sock, SOCKET_WAIT, || {
            let status = child.try_wait().ok().flatten()?;
            Some(format!("{status}; console: {}", log_tail(&console)))
        })
        .await?;
        Ok(child)
    }

    fn command(&self, launch: &Launch, api_sock: &Path) -> Result<Command, RuntimeError> {
        // The serial console is Firecracker's stdout; its own log lines go there too.
        let console = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(launch.console_log())
            .map_err(RuntimeError::io("open the console log"))?;
        let console_err = console
            .try_clone()
            .map_err(RuntimeError::io("duplicate the console log"))?;
        let mut cmd = Command::new(&self.binary);
        cmd.arg("--api-sock")
            .arg(api_sock)
            .arg("--id")
            .arg(&launch.id)
            .current_dir(&launch.dir)
            .stdin(Stdio::null())
            .stdout(console)
            .stderr(console_err)
            // With a uid set, std calls setgroups(0) after setgid and before setuid, so no
            // supplementary group survives. A pre_exec setgroups would run after setuid and
            // fail with EPERM.
            .gid(launch.gid)
            .uid(launch.uid)
            .kill_on_drop(true)
            // Keeps a ^C aimed at the daemon's process group from reaching the VM behind the
            // daemon's back.
            .process_group(0);
        crate::vmm::stdio_only(&mut cmd);
        Ok(cmd)
    }
}

#[async_trait]
impl Vmm for Firecracker {
    fn name(&self) -> &'static str {
        "firecracker"
    }

    fn agent_channel(&self, dir: &Path, vsock_port: u32) -> AgentChannel {
        AgentChannel::Vsock {
            uds: dir.join("vsock.sock"),
            port: vsock_port,
        }
    }

    fn disk_serial(&self, path: &Path, _label: &str) -> Result<String, RuntimeError> {
        guest_disk_serial(path).map_err(RuntimeError::io(format!("stat {}", path.display())))
    }

    async fn start(&self, launch: &Launch) -> Result<VmProcesses, RuntimeError> {
        // On error the child is dropped, which kills it.
        let child = self.spawn(launch).await?;
        configure(&api_socket(&launch.dir), launch).await?;
        Ok(VmProcesses {
            children: vec![child],
        })
    }
}

/// Where a VM's Firecracker API socket lives.
pub fn api_socket(vm_dir: &Path) -> PathBuf {
    vm_dir.join(API_SOCKET)
}

/// Configures a freshly spawned Firecracker for `launch` and boots the guest (InstanceStart).
pub async fn configure(api_sock: &Path, launch: &Launch) -> Result<(), RuntimeError> {
    for request in boot_requests(launch)? {
        api_call(api_sock, &request, API_TIMEOUT).await?;
    }
    Ok(())
}

/// Pauses the VM and writes a full snapshot: device and vCPU state to `snapshot_path`, guest
/// memory to `mem_path`. The VM stays paused; [`resume`] continues it.
pub async fn snapshot_create(
    api_sock: &Path,
    snapshot_path: &Path,
    mem_path: &Path,
) -> Result<(), RuntimeError> {
    for request in snapshot_create_requests(snapshot_path, mem_path)? {
        api_call(api_sock, &request, SNAPSHOT_TIMEOUT).await?;
    }
    Ok(())
}

/// Restores a snapshot into a Firecracker that has nothing configured (see
/// [`Firecracker::spawn`]). The snapshot names the disk and vsock socket paths of the VM it
/// was taken from: the disks must be there again and the vsock path free.
pub async fn snapshot_load(
    api_sock: &Path,
    snapshot_path: &Path,
    mem_path: &Path,
    resume: bool,
) -> Result<(), RuntimeError> {
    let request = snapshot_load_request(snapshot_path, mem_path, resume)?;
    api_call(api_sock, &request, SNAPSHOT_TIMEOUT).await
}

/// Resumes a paused VM.
pub async fn resume(api_sock: &Path) -> Result<(), RuntimeError> {
    api_call(api_sock, &vm_state("Resumed"), API_TIMEOUT).await
}

/// The serial a guest reads for a disk Firecracker backs with `path` (its
/// `/sys/block/vdX/serial`): Firecracker ignores the drive id here and, like kvmtool, uses the
/// file's device, raw device and inode numbers. A runtime that wants its guest to find disks
/// by serial has to compute them on the host and tell the guest.
pub fn guest_disk_serial(path: &Path) -> std::io::Result<String> {
    let meta = std::fs::metadata(path)?;
    Ok(disk_serial(meta.dev(), meta.rdev(), meta.ino()))
}

fn disk_serial(dev: u64, rdev: u64, ino: u64) -> String {
    let mut serial = format!("{dev}{rdev}{ino}");
    serial.truncate(VIRTIO_BLK_ID_BYTES);
    serial
}

/// One call to the Firecracker API.
#[derive(Debug, Clone, PartialEq)]
struct ApiRequest {
    method: Method,
    path: String,
    body: Value,
}

impl ApiRequest {
    fn put(path: impl Into<String>, body: Value) -> Self {
        Self {
            method: Method::PUT,
            path: path.into(),
            body,
        }
    }
}

/// The configuration calls for `launch`, in order, ending with InstanceStart.
fn boot_requests(launch: &Launch) -> Result<Vec<ApiRequest>, RuntimeError> {
    let mut requests = vec![
        ApiRequest::put(
            "/machine-config",
            json!({ "vcpu_count": launch.vcpus.max(1), "mem_size_mib": launch.memory_mib }),
        ),
        ApiRequest::put(
            "/boot-source",
            json!({
                "kernel_image_path": utf8("kernel", &launch.vmlinux)?,
                "initrd_path": utf8("initrd", &launch.initrd)?,
                "boot_args": launch.cmdline,
            }),
        ),
        drive(ROOT_DRIVE_ID, utf8("root disk", &launch.root_disk)?, true),
        drive(
            SCRATCH_DRIVE_ID,
            utf8("scratch disk", &launch.scratch_disk)?,
            false,
        ),
    ];
    if let Some(layers) = &launch.layers_disk {
        requests.push(drive(LAYERS_DRIVE_ID, utf8("layers disk", layers)?, true));
    }
    requests.extend([
        ApiRequest::put(
            "/vsock",
            json!({ "guest_cid": GUEST_CID, "uds_path": utf8("vsock socket", vsock_uds(launch)?)? }),
        ),
        ApiRequest::put("/actions", json!({ "action_type": "InstanceStart" })),
    ]);
    Ok(requests)
}

fn vsock_uds(launch: &Launch) -> Result<&Path, RuntimeError> {
    launch
        .vsock_uds()
        .ok_or_else(|| RuntimeError::Start("firecracker guests are reached over vsock".into()))
}

/// The init finds its root filesystem in the initrd, so no drive is Firecracker's root device.
fn drive(id: &str, path: &str, read_only: bool) -> ApiRequest {
    ApiRequest::put(
        format!("/drives/{id}"),
        json!({
            "drive_id": id,
            "path_on_host": path,
            "is_root_device": false,
            "is_read_only": read_only,
        }),
    )
}

fn vm_state(state: &str) -> ApiRequest {
    ApiRequest {
        method: Method::PATCH,
        path: "/vm".into(),
        body: json!({ "state": state }),
    }
}

/// Firecracker snapshots only a paused VM.
fn snapshot_create_requests(
    snapshot_path: &Path,
    mem_path: &Path,
) -> Result<[ApiRequest; 2], RuntimeError> {
    Ok([
        vm_state("Paused"),
        ApiRequest::put(
            "/snapshot/create",
            json!({
                "snapshot_type": "Full",
                "snapshot_path": utf8("snapshot", snapshot_path)?,
                "mem_file_path": utf8("snapshot memory", mem_path)?,
            }),
        ),
    ])
}

fn snapshot_load_request(
    snapshot_path: &Path,
    mem_path: &Path,
    resume: bool,
) -> Result<ApiRequest, RuntimeError> {
    Ok(ApiRequest::put(
        "/snapshot/load",
        json!({
            "snapshot_path": utf8("snapshot", snapshot_path)?,
            "mem_backend": {
                "backend_type": "File",
                "backend_path": utf8("snapshot memory", mem_path)?,
            },
            "resume_vm": resume,
        }),
    ))
}

/// JSON strings cannot carry arbitrary bytes, and a lossy path would name another file.
fn utf8<'a>(what: &str, path: &'a Path) -> Result<&'a str, RuntimeError> {
    path.to_str().ok_or_else(|| {
        RuntimeError::Start(format!(
            "{what} path {} is not UTF-8, which the firecracker API cannot carry",
            path.display()
        ))
    })
}

/// Sends one request and turns anything but a 2xx answer into an error.
async fn api_call(
    api_sock: &Path,
    request: &ApiRequest,
    limit: Duration,
) -> Result<(), RuntimeError> {
    let (status, body) = tokio::time::timeout(limit, exchange(api_sock, request))
        .await
        .map_err(|_| {
            RuntimeError::Start(format!(
                "firecracker did not answer {} {} within {limit:?}",
                request.method, request.path
            ))
        })??;
    check_response(request, status, &body)
}

/// One HTTP/1.1 exchange on a fresh connection: the socket is local, so a connection per call
/// costs nothing and no connection state outlives a call.
async fn exchange(
    api_sock: &Path,
    request: &ApiRequest,
) -> Result<(StatusCode, Bytes), RuntimeError> {
    let failed = |e: &dyn std::fmt::Display| {
        RuntimeError::Start(format!(
            "firecracker API {} {}: {e}",
            request.method, request.path
        ))
    };
    let stream = UnixStream::connect(api_sock)
        .await
        .map_err(RuntimeError::io(format!(
            "connect to the firecracker API at {}",
            api_sock.display()
        )))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(|e| failed(&e))?;
    let body = serde_json::to_vec(&request.body).map_err(|e| failed(&e))?;
    // Full has an exact length, so hyper sends Content-Length, which Firecracker requires.
    let http_request = Request::builder()
        .method(request.method.clone())
        .uri(request.path.as_str())
        .header(HOST, "localhost")
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| failed(&e))?;
    let exchange = async move {
        let response = sender.send_request(http_request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        // Dropping the sender here lets the connection future below finish.
        drop(sender);
        Ok::<_, hyper::Error>((status, body))
    };
    // The connection is driven in this task rather than a spawned one, so a timeout above
    // drops it together with the request.
    let (result, _closed) = tokio::join!(exchange, conn);
    result.map_err(|e| failed(&e))
}

fn check_response(
    request: &ApiRequest,
    status: StatusCode,
    body: &[u8],
) -> Result<(), RuntimeError> {
    if status.is_success() {
        return Ok(());
    }
    Err(RuntimeError::Start(format!(
        "firecracker refused {} {} ({status}): {}",
        request.method,
        request.path,
        fault_message(body)
    )))
}

/// Firecracker explains refusals as `{"fault_message": "..."}`; anything else is shown as is.
fn fault_message(body: &[u8]) -> String {
    let parsed = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
        v.get("fault_message")
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    match parsed {
        Some(message) => message,
        None if body.is_empty() => "no fault message".into(),
        None => String::from_utf8_lossy(body).trim().to_string(),
    }
}

/// Waits until something accepts connections on `api_sock`. `exited` reports the process's
/// end (status and why), so a Firecracker that died at start fails fast instead of at the
/// deadline.
async fn wait_for_api(
    api_sock: &Path,
    limit: Duration,
    mut exited: impl FnMut() -> Option<String>,
) -> Result<(), RuntimeError> {
    let deadline = Instant::now() + limit;
    loop {
        // Connecting, not just seeing the file: the socket exists from bind(), before listen().
        if UnixStream::connect(api_sock).await.is_ok() {
            return Ok(());
        }
        if let Some(why) = exited() {
            return Err(RuntimeError::Start(format!(
                "firecracker exited before serving its API ({why})"
            )));
        }
        if Instant::now() > deadline {
            return Err(RuntimeError::Start(format!(
                "firecracker did not open its API socket {} within {limit:?}",
                api_sock.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn remove_if_present(path: &Path) -> Result<(), RuntimeError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(RuntimeError::io(format!("remove {}", path.display()))(e)),
    }
}

/// The last lines of the console log: where Firecracker says why it could not start.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(4).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
}

#[cfg(test)]
mod tests {
    use std::os::unix::ffi::OsStrExt;
    use std::sync::{Arc, Mutex};

    use hyper::body::Incoming;
    use hyper::service::service_fn;
    use hyper::Response;
    use tokio::net::UnixListener;

    use super::*;

    /// What the fake API saw of one request.
    #[derive(Debug, Clone, PartialEq)]
    struct Seen {
        method: String,
        path: String,
        body: Value,
        content_length: Option<usize>,
    }

    /// A stand-in for Firecracker's API server: records every request and answers 204, or 400
    /// with a fault message for `fail_path`.
    struct FakeApi {
        _dir: tempfile::TempDir,
        sock: PathBuf,
        seen: Arc<Mutex<Vec<Seen>>>,
        server: tokio::task::JoinHandle<()>,
    }

    const FAULT: &str = "Invalid kernel path: No such file or directory (os error 2)";

    impl FakeApi {
        fn start(fail_path: Option<&'static str>) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let sock = dir.path().join(API_SOCKET);
            let listener = UnixListener::bind(&sock).unwrap();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let log = seen.clone();
            let server = tokio::spawn(async move {
                loop {
                    let (stream, _) = listener.accept().await.unwrap();
                    let log = log.clone();
                    tokio::spawn(async move {
                        let service = service_fn(move |req: Request<Incoming>| {
                            let log = log.clone();
                            async move { Ok::<_, hyper::Error>(answer(req, &log, fail_path).await) }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            });
            Self {
                _dir: dir,
                sock,
                seen,
                server,
            }
        }

        fn seen(&self) -> Vec<Seen> {
            self.seen.lock().unwrap().clone()
        }
    }

    impl Drop for FakeApi {
        fn drop(&mut self) {
            self.server.abort();
        }
    }

    async fn answer(
        req: Request<Incoming>,
        log: &Mutex<Vec<Seen>>,
        fail_path: Option<&str>,
    ) -> Response<Full<Bytes>> {
        let method = req.method().to_string();
        let path = req.uri().path().to_string();
        let content_length = req
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let fail = fail_path == Some(path.as_str());
        log.lock().unwrap().push(Seen {
            method,
            path,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            content_length: content_length.filter(|&n| n == body.len()),
        });
        if fail {
            Response::builder()
                .status(StatusCode::BAD_REQUEST)
                .header(CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(
                    json!({ "fault_message": FAULT }).to_string(),
                )))
                .unwrap()
        } else {
            Response::builder()
                .status(StatusCode::NO_CONTENT)
                .body(Full::new(Bytes::new()))
                .unwrap()
        }
    }

    fn launch(dir: &Path) -> Launch {
        Launch {
            dir: dir.to_path_buf(),
            id: "vm-1".into(),
            vmlinux: "/images/vmlinux".into(),
            initrd: dir.join("initrd.cpio"),
            cmdline: "console=ttyS0 quiet panic=-1".into(),
            root_disk: "/images/root.ext4".into(),
            scratch_disk: dir.join("scratch.ext4"),
            layers_disk: None,
            vcpus: 2,
            memory_mib: 672,
            channel: AgentChannel::Vsock {
                uds: dir.join("vsock.sock"),
                port: 1024,
            },
            uid: 150_000,
            gid: 150_000,
            accel: Accel::Kvm,
            shares: Vec::new(),
        }
    }

    fn seen(method: &str, path: &str, body: Value) -> Seen {
        let content_length = Some(body.to_string().len());
        Seen {
            method: method.into(),
            path: path.into(),
            body,
            content_length,
        }
    }

    #[tokio::test]
    async fn configure_sends_the_boot_sequence() {
        let api = FakeApi::start(None);
        let vm = Path::new("/state/vms/vm-1");
        configure(&api.sock, &launch(vm)).await.unwrap();
        let expected = vec![
            seen(
                "PUT",
                "/machine-config",
                json!({ "vcpu_count": 2, "mem_size_mib": 672 }),
            ),
            seen(
                "PUT",
                "/boot-source",
                json!({
                    "kernel_image_path": "/images/vmlinux",
                    "initrd_path": "/state/vms/vm-1/initrd.cpio",
                    "boot_args": "console=ttyS0 quiet panic=-1",
                }),
            ),
            seen(
                "PUT",
                "/drives/koder_root",
                json!({
                    "drive_id": "koder_root",
                    "path_on_host": "/images/root.ext4",
                    "is_root_device": false,
                    "is_read_only": true,
                }),
            ),
            seen(
                "PUT",
                "/drives/koder_scratch",
                json!({
                    "drive_id": "koder_scratch",
                    "path_on_host": "/state/vms/vm-1/scratch.ext4",
                    "is_root_device": false,
                    "is_read_only": false,
                }),
            ),
            seen(
                "PUT",
                "/vsock",
                json!({ "guest_cid": 3, "uds_path": "/state/vms/vm-1/vsock.sock" }),
            ),
            seen("PUT", "/actions", json!({ "action_type": "InstanceStart" })),
        ];
        assert_eq!(api.seen(), expected);
    }

    #[test]
    fn drive_ids_pass_firecrackers_id_check() {
        // Firecracker answers 400 for resource ids with anything but alphanumerics and '_'.
        for id in [ROOT_DRIVE_ID, SCRATCH_DRIVE_ID, LAYERS_DRIVE_ID] {
            assert!(id.chars().all(|c| c == '_' || c.is_alphanumeric()), "{id}");
        }
    }

    #[tokio::test]
    async fn a_refusal_is_a_start_error_with_the_fault_message() {
        let api = FakeApi::start(Some("/boot-source"));
        let err = configure(&api.sock, &launch(Path::new("/vm")))
            .await
            .unwrap_err();
        assert!(matches!(err, RuntimeError::Start(_)), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(FAULT), "{text}");
        assert!(
            text.contains("PUT /boot-source") && text.contains("400"),
            "{text}"
        );
        let paths: Vec<String> = api.seen().into_iter().map(|s| s.path).collect();
        assert_eq!(
            paths,
            ["/machine-config", "/boot-source"],
            "stops at the refusal"
        );
    }

    #[tokio::test]
    async fn snapshot_create_pauses_then_writes_a_full_snapshot() {
        let api = FakeApi::start(None);
        snapshot_create(&api.sock, Path::new("/s/vm.snap"), Path::new("/s/vm.mem"))
            .await
            .unwrap();
        assert_eq!(
            api.seen(),
            vec![
                seen("PATCH", "/vm", json!({ "state": "Paused" })),
                seen(
                    "PUT",
                    "/snapshot/create",
                    json!({
                        "snapshot_type": "Full",
                        "snapshot_path": "/s/vm.snap",
                        "mem_file_path": "/s/vm.mem",
                    }),
                ),
            ]
        );
    }

    #[tokio::test]
    async fn snapshot_create_stops_when_pausing_fails() {
        let api = FakeApi::start(Some("/vm"));
        let err = snapshot_create(&api.sock, Path::new("/s/a"), Path::new("/s/b"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains(FAULT), "{err}");
        assert_eq!(api.seen().len(), 1);
    }

    #[tokio::test]
    async fn snapshot_load_and_resume() {
        let api = FakeApi::start(None);
        for resume_vm in [true, false] {
            snapshot_load(
                &api.sock,
                Path::new("/s/vm.snap"),
                Path::new("/s/vm.mem"),
                resume_vm,
            )
            .await
            .unwrap();
        }
        resume(&api.sock).await.unwrap();
        let load = |resume_vm: bool| {
            seen(
                "PUT",
                "/snapshot/load",
                json!({
                    "snapshot_path": "/s/vm.snap",
                    "mem_backend": { "backend_type": "File", "backend_path": "/s/vm.mem" },
                    "resume_vm": resume_vm,
                }),
            )
        };
        assert_eq!(
            api.seen(),
            vec![
                load(true),
                load(false),
                seen("PATCH", "/vm", json!({ "state": "Resumed" })),
            ]
        );
    }

    #[tokio::test]
    async fn a_silent_api_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("silent.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let holder = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let err = api_call(&sock, &vm_state("Paused"), Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(matches!(err, RuntimeError::Start(_)), "{err:?}");
        assert!(err.to_string().contains("did not answer"), "{err}");
        holder.abort();
    }

    #[tokio::test]
    async fn no_api_socket_is_an_io_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = resume(&dir.path().join("none.sock")).await.unwrap_err();
        assert!(matches!(err, RuntimeError::Io { .. }), "{err:?}");
    }

    #[test]
    fn fault_messages() {
        assert_eq!(fault_message(br#"{"fault_message":"bad"}"#), "bad");
        assert_eq!(fault_message(b"plain text\n"), "plain text");
        assert_eq!(fault_message(b""), "no fault message");
        assert!(check_response(&vm_state("Paused"), StatusCode::NO_CONTENT, b"").is_ok());
        assert!(check_response(&vm_state("Paused"), StatusCode::OK, b"{}").is_ok());
        let err = check_response(&vm_state("Paused"), StatusCode::INTERNAL_SERVER_ERROR, b"")
            .unwrap_err();
        assert!(err.to_string().contains("500"), "{err}");
    }

    #[test]
    fn a_layers_disk_is_a_read_only_drive_before_the_start() {
        let mut l = launch(Path::new("/vm"));
        l.layers_disk = Some("/vm/layers.img".into());
        let requests = boot_requests(&l).unwrap();
        let at = requests
            .iter()
            .position(|r| r.path == "/drives/koder_layers")
            .unwrap();
        assert_eq!(requests[at].body["path_on_host"], "/vm/layers.img");
        assert_eq!(requests[at].body["is_read_only"], true);
        assert_eq!(requests.last().unwrap().path, "/actions");
    }

    #[test]
    fn non_utf8_paths_are_refused() {
        let mut l = launch(Path::new("/vm"));
        l.root_disk = PathBuf::from(std::ffi::OsStr::from_bytes(b"/images/\xff.ext4"));
        let err = boot_requests(&l).unwrap_err();
        assert!(err.to_string().contains("root disk path"), "{err}");
        let bad = Path::new(std::ffi::OsStr::from_bytes(b"/s/\xfe"));
        assert!(snapshot_load_request(bad, Path::new("/m"), true).is_err());
        assert!(snapshot_create_requests(Path::new("/s"), bad).is_err());
    }

    #[tokio::test]
    async fn waiting_for_the_api() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join(API_SOCKET);

        let err = wait_for_api(&sock, Duration::from_millis(50), || None)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("did not open"), "{err}");

        let err = wait_for_api(&sock, Duration::from_secs(5), || {
            Some("exit status: 1".into())
        })
        .await
        .unwrap_err();
        assert!(err.to_string().contains("exit status: 1"), "{err}");

        let late = sock.clone();
        let binder = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let listener = UnixListener::bind(&late).unwrap();
            // Keeps the socket listening until the test ends.
            let _ = listener.accept().await;
        });
        wait_for_api(&sock, Duration::from_secs(5), || None)
            .await
            .unwrap();
        binder.abort();
    }

    #[test]
    fn new_without_the_binary_is_unavailable() {
        let err = match Firecracker::new("/nonexistent/firecracker".into()) {
            Ok(_) => panic!("a missing binary was accepted"),
            Err(e) => e,
        };
        assert!(matches!(err, RuntimeError::Unavailable(_)), "{err:?}");
        assert!(
            err.to_string().contains("/nonexistent/firecracker"),
            "{err}"
        );
        assert!(Firecracker::new("koder-no-such-program".into()).is_err());
    }

    #[test]
    fn new_needs_hardware_kvm() {
        // Any existing file passes the binary check, isolating the KVM one.
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("firecracker");
        std::fs::write(&fake, "").unwrap();
        let result = Firecracker::new(fake);
        match kvm::kvm_usable() {
            Ok(()) => assert!(result.is_ok()),
            Err(reason) => match result {
                Err(RuntimeError::Unavailable(msg)) => assert!(msg.contains(&reason), "{msg}"),
                Err(e) => panic!("unexpected error {e:?}"),
                Ok(_) => panic!("accepted without hardware KVM"),
            },
        }
    }

    #[tokio::test]
    async fn start_refuses_tcg_before_spawning() {
        let dir = tempfile::tempdir().unwrap();
        let fc = Firecracker {
            binary: "/nonexistent/firecracker".into(),
        };
        let mut l = launch(dir.path());
        l.accel = Accel::Tcg;
        let err = match fc.start(&l).await {
            Ok(_) => panic!("started under TCG"),
            Err(e) => e,
        };
        assert!(matches!(err, RuntimeError::Unavailable(_)), "{err:?}");
        assert!(!l.console_log().exists());
    }

    #[test]
    fn disk_serials_follow_firecracker() {
        assert_eq!(disk_serial(2049, 0, 1_234_567), "204901234567");
        let long = disk_serial(u64::MAX, 0, u64::MAX);
        assert_eq!(long.len(), VIRTIO_BLK_ID_BYTES);
        assert!(long.starts_with("18446744073709551615"));

        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk.ext4");
        std::fs::write(&disk, [0u8; 512]).unwrap();
        let meta = std::fs::metadata(&disk).unwrap();
        let serial = guest_disk_serial(&disk).unwrap();
        assert_eq!(serial, disk_serial(meta.dev(), meta.rdev(), meta.ino()));
    }
}
