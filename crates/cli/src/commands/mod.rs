//! What each subcommand does, one module per command group; `dispatch` picks it.

mod admin;
mod egress;
mod exec;
mod files;
mod image;
mod interp;
mod live;
mod mcp;
mod sessions;
mod state;
mod terminal;
mod volumes;

use koder_sdk::Client;

use crate::args::{ClientCommand as Command, GlobalOpts, LocalOpts};
use crate::error::Result;
use crate::output::Output;

/// A command's client and output settings, from the global and the local options.
pub struct Ctx {
    pub client: Client,
    pub out: Output,
}

impl Ctx {
    pub fn new(global: &GlobalOpts, local: &LocalOpts) -> Result<Ctx> {
        let url = [&local.url, &global.url]
            .into_iter()
            .flatten()
            .find(|u| !u.trim().is_empty())
            .map_or(koder_sdk::DEFAULT_URL, String::as_str);
        let key = api_key(global, local);
        let ca = [&local.ca_cert, &global.ca_cert]
            .into_iter()
            .flatten()
            .find(|c| !c.as_os_str().is_empty());
        let mut builder = Client::builder(url).api_key(key);
        if let Some(ca) = ca {
            builder = builder.add_ca_file(ca)?;
        }
        Ok(Ctx {
            client: builder.build()?,
            out: Output {
                json: global.json || local.json,
            },
        })
    }
}

/// The API key: the local option, else the global one (or its environment variable).
fn api_key<'a>(global: &'a GlobalOpts, local: &'a LocalOpts) -> &'a str {
    [&local.api_key, &global.api_key]
        .into_iter()
        .flatten()
        .find(|k| !k.is_empty())
        .map_or("", String::as_str)
}

/// Runs a client command; returns the exit status.
pub async fn dispatch(g: &GlobalOpts, command: Command) -> Result<i32> {
    match command {
        Command::Create(a) => sessions::create(Ctx::new(g, &a.c)?, a).await,
        Command::Ls(a) => sessions::ls(Ctx::new(g, &a.c)?).await,
        Command::Info(a) => sessions::info(Ctx::new(g, &a.c)?, &a.session).await,
        Command::Kill(a) => sessions::kill(Ctx::new(g, &a.c)?, &a.sessions).await,
        Command::KillProcesses(a) => sessions::kill_processes(Ctx::new(g, &a.c)?, &a.session).await,
        Command::Timeout(a) => sessions::timeout(Ctx::new(g, &a.c)?, &a.session, a.secs).await,
        Command::Snapshot(a) => state::snapshot(g, a).await,
        Command::Volume(a) => volumes::run(g, a).await,
        Command::Restore(a) => state::restore(Ctx::new(g, &a.c)?, a).await,
        Command::Fork(a) => state::fork(Ctx::new(g, &a.c)?, a).await,
        Command::Pause(a) => state::pause(Ctx::new(g, &a.c)?, a).await,
        Command::Resume(a) => state::resume(Ctx::new(g, &a.c)?, a).await,
        Command::Metrics(a) => sessions::metrics(Ctx::new(g, &a.c)?, &a.session).await,
        Command::Events(a) => sessions::events(Ctx::new(g, &a.c)?, a).await,
        Command::Health(a) => sessions::health(Ctx::new(g, &a.c)?).await,
        Command::Exec(a) => exec::exec(Ctx::new(g, &a.c)?, a).await,
        Command::Run(a) => exec::run(Ctx::new(g, &a.c)?, a).await,
        Command::Cp(a) => files::cp(Ctx::new(g, &a.c)?, a).await,
        Command::Rm(a) => files::rm(Ctx::new(g, &a.c)?, a).await,
        Command::Files(a) => files::list(Ctx::new(g, &a.c)?, a).await,
        Command::Mkdir(a) => files::mkdir(Ctx::new(g, &a.c)?, a).await,
        Command::Mv(a) => files::mv(Ctx::new(g, &a.c)?, a).await,
        Command::Stat(a) => files::stat(Ctx::new(g, &a.c)?, a).await,
        Command::Shell(a) => live::terminal(Ctx::new(g, &a.c)?, &a.session, &[]).await,
        Command::Attach(a) => live::terminal(Ctx::new(g, &a.c)?, &a.session, &a.cmd).await,
        Command::Logs(a) => live::logs(Ctx::new(g, &a.c)?, a).await,
        Command::Watch(a) => live::watch(Ctx::new(g, &a.c)?, a).await,
        Command::Audit(a) => live::audit(Ctx::new(g, &a.c)?, a).await,
        Command::Admin(a) => admin::run(g, a).await,
        Command::Mcp(a) => {
            let key = api_key(g, &a.c).to_string();
            mcp::run(Ctx::new(g, &a.c)?, key, a).await
        }
        Command::Image(a) => image::run(g, a).await,
        Command::Context(a) => interp::context(g, a).await,
        Command::RunCode(a) => interp::run_code(Ctx::new(g, &a.c)?, a).await,
        Command::Preview(a) => live::preview(Ctx::new(g, &a.c)?, a).await,
        Command::Errors(a) => live::errors(Ctx::new(g, &a.c)?, a).await,
        Command::Stdin(a) => live::stdin(Ctx::new(g, &a.c)?, a).await,
        Command::Network(a) => egress::network(Ctx::new(g, &a.c)?, a).await,
        Command::Secret(a) => egress::secret(g, a).await,
        Command::Webhook(a) => egress::webhook(g, a).await,
        Command::Signal(a) => live::signal(Ctx::new(g, &a.c)?, a).await,
        Command::Completions(a) => {
            completions(a.shell, &mut std::io::stdout());
            Ok(0)
        }
    }
}

/// The completion script of the whole command line for `shell`.
pub(crate) fn completions(shell: clap_complete::Shell, out: &mut dyn std::io::Write) {
    let mut cli = <crate::args::Cli as clap::CommandFactory>::command();
    clap_complete::generate(shell, &mut cli, "ksandbox", out);
}

#[cfg(test)]
pub(crate) use egress::network_request;
#[cfg(test)]
pub(crate) use exec::infer_language;
#[cfg(test)]
pub(crate) use files::{parse_loc, remote_basename, Loc};
#[cfg(test)]
pub(crate) use interp::{result_files, summary};
#[cfg(test)]
pub(crate) use sessions::{create_args_request, create_request};
#[cfg(test)]
pub(crate) use state::with_lifecycle;
