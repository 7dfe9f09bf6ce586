//! `ksandbox`: command-line client for koder-sandbox, and `ksandbox serve` to run the daemon.
//!
//! `args` is the command line (clap), `commands` what each subcommand does through the SDK,
//! `output` how results are shown (tables, or JSON with `--json`).

mod args;
mod commands;
mod error;
mod output;
#[cfg(test)]
mod tests;

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;

use args::{Cli, Command};
use error::CliError;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run(cli));
    // Don't wait for stray blocking reads (e.g. stdin) to finish.
    runtime.shutdown_background();
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// The exit status; errors are printed here, the one place that knows about both kinds.
async fn run(cli: Cli) -> i32 {
    match cli.command {
        Command::Serve(args) => match koder_daemon::serve(args).await {
            Ok(()) => 0,
            Err(err) => {
                let err: anyhow::Error = err;
                eprintln!("error: {err:#}");
                1
            }
        },
        Command::Client(command) => match commands::dispatch(&cli.global, command).await {
            Ok(code) => code,
            Err(err) => {
                print_error(&err);
                1
            }
        },
    }
}

fn print_error(err: &CliError) {
    if let Some(message) = err.unreachable_daemon() {
        eprintln!("error: {message}");
        return;
    }
    match err {
        CliError::Sdk(koder_sdk::Error::Api {
            code,
            message,
            details,
            ..
        }) => {
            eprintln!("error: {code}: {message}");
            if let Some(details) = details {
                eprintln!("  details: {details}");
            }
        }
        other => eprintln!("error: {other}"),
    }
}
