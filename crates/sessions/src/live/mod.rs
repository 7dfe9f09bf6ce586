//! Live, interactive surfaces of a session: terminals, file watches, the preview upstream and
//! code-interpreter contexts. Each hands transports a domain handle (a [`Terminal`], a
//! [`Watch`], a byte stream), never an agent stream.

pub mod contexts;
pub mod preview;
mod terminal;
mod watch;

pub use terminal::{Terminal, TerminalEnded, TerminalEvent, TerminalInput, TerminalSpec};
pub use watch::{FsEvent, FsEventKind, Watch, WatchFlush};
