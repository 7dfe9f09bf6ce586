//! Everything the agent does before it serves, single-threaded and before any untrusted code
//! exists: build the root (jail: [`setup`]; microVM guest: [`guest`]), load the egress ruleset,
//! then raise the walls around itself and all it will start ([`confine`]).

pub mod confine;
mod egress_rules;
pub mod guest;
mod seccomp_bpf;
pub mod setup;
pub mod volumes;
