//! network (a running session's policy), secret set/ls/rm, webhook add/ls/rm/deliveries.

use tokio::io::AsyncReadExt as _;

use super::Ctx;
use crate::args::{GlobalOpts, NetworkArgs, SecretCommand, WebhookCommand};
use crate::error::{CliError, IoContext as _, Result};
use crate::output;
use koder_sdk::types::{self, webhooks::CreateWebhook};

/// The policy `network` sends: `--allow` only with `allowlist`, as on `create`.
pub(crate) fn network_request(a: &NetworkArgs) -> Result<types::Network> {
    let mode = match a.mode.as_str() {
        "open" => types::NetworkMode::Open,
        "allowlist" => types::NetworkMode::Allowlist,
        _ => types::NetworkMode::None,
    };
    if !a.allow.is_empty() && mode != types::NetworkMode::Allowlist {
        return Err(CliError::msg("--allow needs --mode allowlist"));
    }
    Ok(types::Network {
        mode,
        allow: a.allow.clone(),
        deny: a.deny.clone(),
    })
}

pub async fn network(ctx: Ctx, a: NetworkArgs) -> Result<i32> {
    let policy = network_request(&a)?;
    let session = ctx.client.set_network(&a.session, &policy).await?;
    ctx.out.print(&session.network, output::network_line)?;
    Ok(0)
}

/// A value given on stdin, without the newline `echo` or a here-string adds.
async fn read_value(what: &str) -> Result<String> {
    let mut buf = Vec::new();
    tokio::io::stdin()
        .read_to_end(&mut buf)
        .await
        .doing(|| format!("reading the {what} from standard input"))?;
    let text = String::from_utf8(buf)
        .map_err(|_| CliError::msg(format!("the {what} on standard input is not UTF-8 text")))?;
    let value = text
        .strip_suffix('\n')
        .map(|v| v.strip_suffix('\r').unwrap_or(v))
        .unwrap_or(&text);
    if value.is_empty() {
        return Err(CliError::msg(format!(
            "no {what} on standard input (pipe it in: `printf %s \"$VALUE\" | ksandbox ...`)"
        )));
    }
    Ok(value.to_string())
}

pub async fn secret(g: &GlobalOpts, command: SecretCommand) -> Result<i32> {
    match command {
        SecretCommand::Set(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let req = types::CreateSecret {
                value: read_value("secret value").await?,
                name: a.name,
                hosts: a.hosts,
            };
            let secret = ctx.client.put_secret(&req).await?;
            ctx.out.print(&secret, |s| s.name.clone())?;
        }
        SecretCommand::Ls(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let secrets = ctx.client.list_secrets().await?;
            ctx.out.print(&secrets, |s| output::secrets_table(s))?;
        }
        SecretCommand::Rm(a) => {
            Ctx::new(g, &a.c)?.client.delete_secret(&a.name).await?;
        }
    }
    Ok(0)
}

pub async fn webhook(g: &GlobalOpts, command: WebhookCommand) -> Result<i32> {
    match command {
        WebhookCommand::Add(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let secret = match a.secret_stdin {
                true => Some(read_value("signing secret").await?),
                false => None,
            };
            let req = CreateWebhook {
                url: a.target,
                events: (!a.events.is_empty()).then_some(a.events),
                secret,
            };
            let hook = ctx.client.create_webhook(&req).await?;
            ctx.out.print(&hook, output::webhook_created)?;
        }
        WebhookCommand::Ls(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let hooks = ctx.client.list_webhooks().await?;
            ctx.out.print(&hooks, |h| output::webhooks_table(h))?;
        }
        WebhookCommand::Rm(a) => {
            Ctx::new(g, &a.c)?.client.delete_webhook(&a.id).await?;
        }
        WebhookCommand::Deliveries(a) => {
            let ctx = Ctx::new(g, &a.c)?;
            let deliveries = ctx.client.webhook_deliveries(&a.id).await?;
            ctx.out
                .print(&deliveries, |d| output::deliveries_table(d))?;
        }
    }
    Ok(0)
}
