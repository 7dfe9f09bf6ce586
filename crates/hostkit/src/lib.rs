//! What the jail and the microVM runtime both do on the host, done once: ext4 scratch-disk
//! templates and their sparse copies ([`ext4`]), loop devices and private mounts on them
//! ([`loopdev`]), a crash hook for tests ([`crash`]), killing processes a crashed daemon recorded
//! ([`reap`]), installing binaries sandbox uids can execute ([`install`]) and directory modes
//! ([`mode`]).
//!
//! A crate of its own rather than a module of `koder-runtime`: that crate stays the pure
//! trait-and-types contract the session manager and test doubles build on, free of the
//! syscalls, child processes and filesystem side effects this one is made of. Errors are
//! `koder_runtime::RuntimeError`, so the runtimes pass them on unchanged and every failure keeps
//! the stable code it had.

pub mod crash;
pub mod ext4;
pub mod install;
pub mod loopdev;
pub mod mode;
pub mod reap;
