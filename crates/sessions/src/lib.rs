//! Sessions: create (from the warm pool), limits, timeouts, exec and files, tenancy, expiry and
//! reconciliation after a restart. Transports (REST, E2B, later gRPC/MCP) are thin adapters
//! over [`Manager`]: they see domain types and errors only, never the agent protocol.

pub mod config;
mod egress;
mod error;
pub mod events;
pub mod execs;
mod header_rules;
pub mod images;
mod inject;
pub mod languages;
mod layers;
mod limits;
mod live;
mod manager;
pub mod metrics;
mod pool;
pub mod quota;
pub mod secrets;
mod session;
mod shared_images;
mod startup;
mod tenants;
mod tls;
mod volumes;

pub use config::SessionConfig;
pub use error::Error;
pub use events::{Event, EventSink};
pub use header_rules::HeaderRules;
pub use live::contexts::{
    refusal_or_first, ContextInfo, ContextOptions, ContextRun, RichResult, RunError, RunEvent,
    RunOutput, RunRequest, DEFAULT_CONTEXT, FIRST_EVENT_GRACE,
};
pub use live::preview::{Upstream, UpstreamConn};
pub use live::{
    FsEvent, FsEventKind, Terminal, TerminalEnded, TerminalEvent, TerminalInput, TerminalSpec,
    Watch, WatchFlush,
};
pub use manager::{
    Account, BackgroundExec, BuildSandbox, E2bSecret, LaterStdin, Manager, Peer, Runtimes,
    StepCommand, StepExit, VolumeEntry, VolumeFile, VolumeMeta, EVENTS_PAGE_MAX,
};
pub use metrics::Metrics;
pub use quota::{Clock, NO_ACCESS_PLAN};
