//! The one protocol every koder-sandbox runtime uses to drive its in-sandbox agent.
//!
//! Transport-agnostic: frames travel over any ordered byte stream (a unix socket for the jail
//! runtime, virtio-vsock for microVMs).

pub mod client;
pub mod codec;
pub mod flow;
pub mod init;
pub mod messages;
pub mod metadata;
pub mod mount_target;
mod socket;

pub use client::{
    relay, AgentClient, AgentStream, ClientError, ExecOutput, FileReader, FileWriter, StreamHandle,
};
pub use codec::{CodecError, FrameCodec};
pub use messages::*;
pub use mount_target::{
    check_mount_target, check_mount_targets, MountTargetError, MAX_MOUNT_TARGET_LEN,
};
