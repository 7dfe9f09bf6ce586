//! The agent once confined: [`server`] answers the daemon's protocol and dispatches each
//! operation to its module.

mod egress;
pub mod exec;
pub mod fs;
mod groups;
pub mod interp;
mod killall;
mod layer;
mod net;
mod pty;
pub mod server;
pub mod sudo;
mod watch;
