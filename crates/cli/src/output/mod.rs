//! Rendering: borderless tables for people by default, JSON with `--json`.

mod exec;
mod tables;

use std::io::Write as _;

use serde::Serialize;

#[cfg(test)]
pub use exec::exit_status;
pub use exec::{print_result, print_stream};
pub use tables::{
    audit_table, build_table, contexts_table, deliveries_table, errors_table, event_line,
    exec_status_table, execs_table, file_table, files_table, image_languages, images_table,
    metrics_table, network_line, nodes_table, secrets_table, session_table, sessions_table,
    snapshot_table, snapshots_table, tenants_table, volume_table, volumes_table, webhook_created,
    webhooks_table,
};

/// How a command prints what it got.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    pub json: bool,
}

impl Output {
    /// `value` as one JSON line with `--json`, else the human rendering `human` makes of it.
    pub fn print<T: Serialize + ?Sized>(
        &self,
        value: &T,
        human: impl FnOnce(&T) -> String,
    ) -> crate::error::Result<()> {
        let text = if self.json {
            serde_json::to_string(value)?
        } else {
            human(value)
        };
        print_line(&text);
        Ok(())
    }

    /// `value` with `--json`; nothing for people (a command whose effect is its output).
    pub fn print_json_only<T: Serialize + ?Sized>(&self, value: &T) -> crate::error::Result<()> {
        if self.json {
            print_line(&serde_json::to_string(value)?);
        }
        Ok(())
    }
}

/// Writes `text` and a newline; a closed stdout (`| head`) is not an error of the command.
pub fn print_line(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", text.trim_end_matches('\n'));
    let _ = out.flush();
}

pub fn format_time(t: &chrono::DateTime<chrono::Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// Bytes in binary units with one decimal (`512 B`, `4.0 KiB`, `1.5 GiB`).
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}
