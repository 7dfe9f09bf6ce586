//! The one protocol every koder-sandbox runtime uses to drive its in-sandbox agent.
//!
//! Transport-agnostic: frames travel over any ordered byte stream (a unix socket for the jail
//! runtime, virtio-vsock for microVMs).

pub mod client;
pub mod codec;
pub mod init;
pub mod messages;

pub use client::{
    relay, AgentClient, AgentStream, ClientError, ExecOutput, FileReader, FileWriter, StreamHandle,
};
pub use codec::{CodecError, FrameCodec};
pub use messages::*;
