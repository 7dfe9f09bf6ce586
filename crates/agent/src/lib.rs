//! The in-sandbox agent: PID 1 of every sandbox.
//!
//! Two phases, one folder each, which never import each other (only `main` wires them):
//! - [`boot`]: everything before serving — the jail's root inside fresh namespaces
//!   ([`boot::setup`]) or the microVM guest's init ([`boot::guest`]), the egress ruleset, then
//!   the walls ([`boot::confine`]).
//! - [`serve`]: the protocol server ([`serve::server`]) and its operations: `exec` runs
//!   processes, `fs` does file operations inside the root only, plus terminals, interpreters,
//!   file watches, port relays and the egress proxy.
//!
//! What both phases share lives in leaf modules that import neither: the pre-exec step and
//! workload cgroup ([`child`]), the sandbox's accounts ([`accounts`]), the boot error, what the walls put in force ([`confinement`]),
//! the guest cgroup, the per-stream outbox and a lock helper; [`serial`] is the microVM guest's
//! agent channel on a virtio-serial port.
//!
//! [`sudo`] is the binary's other use: the `sudo` command inside sandboxes, which asks the
//! agent's sudo service (`serve::sudo`) to run a command as another sandbox account; its
//! [`sudo::wire`] is all the service and the command share.

mod accounts;
pub mod boot;
pub mod child;
pub mod confinement;
mod guest_cgroup;
mod outbox;
pub mod serial;
pub mod serve;
mod setup_error;
pub mod sudo;
