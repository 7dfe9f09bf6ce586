//! `koder-agent init`: started by a runtime as PID 1 of a new sandbox, with its listening
//! socket on fd 3, its configuration (JSON) to read on fd 4 and the workload cgroup's join
//! files from fd 5 on. Builds and confines the sandbox, then serves the daemon forever.

use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::process::ExitCode;
use std::sync::Arc;

use koder_agent::boot::{confine, guest, setup};
use koder_agent::confinement::Confinement;
use koder_agent::serve::exec::{ExecDefaults, Reaper};
use koder_agent::serve::fs::Fs;
use koder_agent::serve::server::{serve_connection, serve_listener, Agent};
use koder_agent::serve::sudo;
use koder_agent::{child, serial};
use koder_agent_protocol::init::{
    self, InitConfig, CONFIG_FD, LISTEN_FD, MAX_WORKLOAD_CGROUP_FDS, WORKLOAD_CGROUP_FD,
};

fn main() -> ExitCode {
    if invoked_as_sudo() {
        let code = koder_agent::sudo::main(std::env::args_os().skip(1).collect());
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    if guest::is_guest_init() {
        // PID 1 of a VM has nobody to report to but the console; returning panics the kernel,
        // which ends the VM, which is what the runtime then sees.
        let Err(e) = guest_init();
        eprintln!("koder-agent: {e}");
        return ExitCode::from(1);
    }
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) != Some("init") || args.len() != 2 {
        eprintln!("usage: koder-agent init  (configuration on fd {CONFIG_FD})");
        return ExitCode::from(2);
    }
    match init() {
        Ok(never) => match never {},
        Err(e) => {
            // stderr is a pipe the runtime reads while the sandbox starts.
            eprintln!("koder-agent: {e}");
            ExitCode::from(1)
        }
    }
}

/// Sandboxes run this binary as their `sudo` (`init::link_sudo_layer`).
fn invoked_as_sudo() -> bool {
    let zeroth = std::env::args_os().next().unwrap_or_default();
    std::path::Path::new(&zeroth).file_name() == Some(std::ffi::OsStr::new("sudo"))
}

enum Never {}

fn init() -> Result<Never, Box<dyn std::error::Error>> {
    let cfg = read_config()?;
    let workload = take_workload_cgroup(cfg.workload_cgroup_fds)?;
    let spawner = cfg.workload_joins_per_thread && !workload.is_empty();
    // Whatever the runtime's process had open must not reach untrusted code: everything above
    // the hand-overs is closed, and the listener and cgroup files never survive an exec.
    let first_unused = WORKLOAD_CGROUP_FD + workload.len() as i32;
    // SAFETY: close_range on fds above the hand-overs; nothing in this process uses them.
    unsafe {
        libc::syscall(libc::SYS_close_range, first_unused as u32, u32::MAX, 0u32);
    }
    child::mark_cloexec_from(LISTEN_FD)?;
    child::set_workload_cgroup(workload)?;
    let upper = setup::build_root(&cfg)?;
    let (fs, confinement, defaults, runtime) = confined(
        &cfg.workdir,
        &cfg.env,
        &cfg.rlimits,
        &cfg.writable_dirs,
        &upper,
    )?;
    quiet_stdio()?;
    if spawner {
        // After `confined`: the thread and every child it clones carry the same walls.
        child::start_spawner()?;
    }
    let egress = cfg.egress;
    runtime.block_on(async move {
        let reaper = Reaper::start()?;
        sudo::start(reaper.clone())?;
        // SAFETY: the runtime placed a bound, listening unix socket on LISTEN_FD for us alone.
        let std_listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(LISTEN_FD) };
        std_listener.set_nonblocking(true)?;
        let listener = tokio::net::UnixListener::from_std(std_listener)?;
        let mut agent = Agent::new(reaper, fs, defaults, confinement);
        agent.upper = Some(Arc::new(upper));
        let agent = Arc::new(agent);
        if egress {
            agent.egress.start().await?;
        }
        serve_listener(agent, listener).await;
        Err::<Never, Box<dyn std::error::Error>>("listener stopped".into())
    })
}

/// The workload cgroup's join files the runtime handed over from [`WORKLOAD_CGROUP_FD`] on.
fn take_workload_cgroup(count: u32) -> Result<Vec<OwnedFd>, Box<dyn std::error::Error>> {
    if count > MAX_WORKLOAD_CGROUP_FDS {
        return Err(format!("{count} workload cgroup descriptors announced").into());
    }
    let fds = WORKLOAD_CGROUP_FD..WORKLOAD_CGROUP_FD + count as i32;
    fds.map(take_handed_fd).collect()
}

/// A descriptor the runtime handed over at `fd`, now ours alone.
fn take_handed_fd(fd: i32) -> Result<OwnedFd, Box<dyn std::error::Error>> {
    // SAFETY: F_GETFD only reads the descriptor's flags.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(format!("handed-over descriptor {fd} is not open").into());
    }
    // SAFETY: the runtime placed this open file here for us alone; we take sole ownership.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads the configuration the runtime handed over on [`CONFIG_FD`], and closes it.
fn read_config() -> Result<InitConfig, Box<dyn std::error::Error>> {
    use std::io::Read;
    // SAFETY: the runtime placed the configuration file on CONFIG_FD for us alone; taking
    // ownership closes it once read.
    let mut file = unsafe { std::fs::File::from_raw_fd(CONFIG_FD) };
    let mut raw = String::new();
    file.read_to_string(&mut raw)?;
    Ok(serde_json::from_str(&raw)?)
}

/// What every agent does once its root is built: raise the walls around itself (and so around
/// everything it will start), then make the single-threaded runtime it serves from.
fn confined(
    workdir: &str,
    env: &[(String, String)],
    rlimits: &init::Rlimits,
    writable_dirs: &[String],
    upper: &OwnedFd,
) -> Result<(Fs, Confinement, ExecDefaults, tokio::runtime::Runtime), Box<dyn std::error::Error>> {
    let fs = Fs::new(std::path::Path::new("/"), workdir)?;
    let confinement = confine::confine(rlimits, writable_dirs, Some(upper.as_fd()))?;
    // Sandbox processes share our uid; only a non-dumpable agent keeps them out of /proc/1/mem
    // and friends even where ptrace rules would allow it.
    // SAFETY: prctl with integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    let defaults = ExecDefaults {
        env: env.to_vec(),
        workdir: workdir.to_string(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(4)
        .build()?;
    Ok((fs, confinement, defaults, runtime))
}

/// How a guest agent is reached.
enum Channel {
    Serial(OwnedFd),
    Vsock(vsock::VsockListener),
}

/// The agent as the kernel's init in a microVM: boots the guest, then serves the daemon on its
/// virtio-serial port (QEMU) or on vsock (Firecracker).
fn guest_init() -> Result<Never, Box<dyn std::error::Error>> {
    let guest::Booted {
        cfg,
        cgroup,
        upper,
        serial,
    } = guest::boot()?;
    // Bound before the walls go up: the seccomp filter refuses AF_VSOCK sockets to everyone in
    // the guest, the agent included, so sandbox processes can never reach the host's vsock.
    let channel = match serial {
        Some(fd) => Channel::Serial(fd),
        None => Channel::Vsock(vsock::VsockListener::bind_with_cid_port(
            vsock::VMADDR_CID_ANY,
            cfg.vsock_port,
        )?),
    };
    let (fs, confinement, defaults, runtime) = confined(
        &cfg.workdir,
        &cfg.env,
        &cfg.rlimits,
        &cfg.writable_dirs,
        &upper,
    )?;
    runtime.block_on(async move {
        let reaper = Reaper::start()?;
        sudo::start(reaper.clone())?;
        let mut agent = Agent::new(reaper, fs, defaults, confinement);
        agent.guest = Some(Arc::new(cgroup));
        agent.upper = Some(Arc::new(upper));
        let agent = Arc::new(agent);
        if cfg.egress {
            agent.egress.start().await?;
        }
        match channel {
            Channel::Serial(fd) => {
                let port = serial::Port::new(fd)?;
                eprintln!("{} serial port", init::VM_READY_LINE);
                let e =
                    serial::serve_forever(port, |conn| serve_connection(agent.clone(), conn)).await;
                Err(format!("serial port: {e}").into())
            }
            Channel::Vsock(vsock) => {
                let listener = tokio_vsock::VsockListener::from(OwnedFd::from(vsock));
                eprintln!("{} vsock port {}", init::VM_READY_LINE, cfg.vsock_port);
                loop {
                    match listener.accept().await {
                        Ok((conn, _)) => {
                            tokio::spawn(serve_connection(agent.clone(), conn));
                        }
                        Err(e) => {
                            eprintln!("koder-agent: vsock accept: {e}");
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        }
                    }
                }
            }
        }
    })
}

/// From here on nothing reads the agent's stdio; it must not block on a full pipe.
fn quiet_stdio() -> std::io::Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    for fd in 0..=2 {
        // SAFETY: dup2 onto the standard descriptors, which this process owns.
        if unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), fd) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
