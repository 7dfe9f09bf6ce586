//! Sessions: create (from the warm pool), limits, timeouts, exec and files, tenancy, expiry and
//! reconciliation after a restart. Transports (REST now; gRPC and E2B later) are thin adapters
//! over [`Manager`].

pub mod config;
mod contexts;
pub use contexts::{ContextOptions, ContextRun, RunEvent, RunOutput, RunRequest};
mod egress;
mod error;
pub mod execs;
pub mod languages;
mod manager;
pub mod metrics;
mod pool;
pub mod preview;
pub mod quota;

pub use config::SessionConfig;
pub use error::Error;
pub use manager::{Manager, Runtimes};
pub use metrics::Metrics;
pub use quota::{Clock, NO_ACCESS_PLAN};
