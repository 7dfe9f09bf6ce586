//! admin tenant ls/get/set/key, admin nodes.

use koder_sdk::types;

use super::Ctx;
use crate::args::{AdminArgs, AdminCommand, GlobalOpts, LocalOpts, TenantCommand};
use crate::error::{CliError, Result};
use crate::output;

/// The admin key: explicit `--api-key`, else KSANDBOX_ADMIN_KEY, else KSANDBOX_API_KEY; none
/// at all is refused here, saying where admin keys come from.
pub(super) fn admin_ctx(g: &GlobalOpts, local: &LocalOpts) -> Result<Ctx> {
    let mut local = local.clone();
    if local.api_key.as_deref().is_none_or(str::is_empty) {
        local.api_key = std::env::var("KSANDBOX_ADMIN_KEY")
            .ok()
            .filter(|k| !k.is_empty());
    }
    if super::api_key(g, &local).is_empty() {
        return Err(CliError::AdminKey(None));
    }
    Ctx::new(g, &local)
}

fn print_tenant(ctx: &Ctx, t: &types::TenantInfo) -> Result<()> {
    ctx.out
        .print(t, |t| output::tenants_table(std::slice::from_ref(t)))
}

pub async fn run(g: &GlobalOpts, a: AdminArgs) -> Result<i32> {
    let done = match a.what {
        AdminCommand::Tenant(cmd) => tenant(g, cmd).await,
        AdminCommand::Nodes(o) => nodes(g, &o.c).await,
    };
    done.map_err(|e| match e {
        CliError::Sdk(e) => CliError::admin(e),
        other => other,
    })
}

async fn nodes(g: &GlobalOpts, local: &LocalOpts) -> Result<i32> {
    let ctx = admin_ctx(g, local)?;
    let nodes = ctx.client.admin_nodes().await?;
    ctx.out.print(&nodes, |n| output::nodes_table(n))?;
    Ok(0)
}

async fn tenant(g: &GlobalOpts, cmd: TenantCommand) -> Result<i32> {
    match cmd {
        TenantCommand::Ls(o) => {
            let ctx = admin_ctx(g, &o.c)?;
            let tenants = ctx.client.admin_tenants().await?;
            ctx.out.print(&tenants, |t| output::tenants_table(t))?;
        }
        TenantCommand::Get(t) => {
            let ctx = admin_ctx(g, &t.c)?;
            print_tenant(&ctx, &ctx.client.admin_tenant(&t.tenant).await?)?;
        }
        TenantCommand::Set(t) => {
            let ctx = admin_ctx(g, &t.c)?;
            let req = types::PutTenant {
                name: t.name,
                plan: t.plan,
                max_sessions: t.max_sessions,
                daily_session_minutes: t.daily_session_minutes,
            };
            print_tenant(&ctx, &ctx.client.admin_put_tenant(&t.tenant, &req).await?)?;
        }
        TenantCommand::Key(t) => {
            let ctx = admin_ctx(g, &t.c)?;
            let issued = ctx.client.admin_issue_key(&t.tenant).await?;
            ctx.out.print(&issued, |k| k.api_key.clone())?;
        }
    }
    Ok(0)
}
