use clap::Parser;

#[derive(Parser)]
#[command(
    name = "koder-sandbox",
    version,
    about = "Runs AI-generated code in isolated sandboxes"
)]
enum Cli {
    /// Start the daemon.
    Serve(koder_daemon::ServeArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse() {
        Cli::Serve(args) => koder_daemon::serve(args).await,
    }
}
