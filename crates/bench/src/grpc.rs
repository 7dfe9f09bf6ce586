//! The gRPC face beside REST on one daemon: unary `Exec` of `/bin/true` and `POST .../exec`
//! in the same live session, samples interleaved (alternating which goes first), so both see
//! the same machine load.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use koder_grpc::proto as pb;
use serde_json::json;

use crate::daemon::Daemon;
use crate::phases::{self, Baselines, Ctx, RawExec};
use crate::report::Row;
use crate::Settings;

type Grpc = koder_grpc::SandboxClient<tonic::transport::Channel>;

pub async fn run(
    daemon_bin: &Path,
    work_root: &Path,
    s: &Settings,
    keep: bool,
    rows: &mut Vec<Row>,
) {
    let name = "exec `/bin/true` over gRPC (unary `Exec`, one HTTP/2 connection)";
    let port = match std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
        Ok(a) => a.port(),
        Err(e) => return rows.push(Row::error("grpc_exec", name, &e.into())),
    };
    let extra = format!("[server]\ngrpc_addr = \"127.0.0.1:{port}\"\n");
    let sessions = "pool = { bash = 1 }\nreap_interval = 1.0\n";
    let mut d =
        match Daemon::start_with(daemon_bin, work_root, "grpc", sessions, &extra, keep).await {
            Ok(d) => d,
            Err(e) => return rows.push(Row::error("grpc_exec", "daemon with gRPC", &e)),
        };
    let base = Baselines::default();
    let ctx = Ctx {
        d: &d,
        s,
        base: &base,
    };
    match measure(&ctx, port).await {
        Ok((grpc, rest)) => push_rows(&grpc, &rest, name, rows),
        Err(e) => rows.push(Row::error("grpc_exec", name, &e)),
    }
    d.stop(Duration::from_secs(60));
}

fn push_rows(grpc: &[Duration], rest: &[Duration], name: &str, rows: &mut Vec<Row>) {
    let (Ok(g), Ok(r)) = (phases::summary(grpc), phases::summary(rest)) else {
        return rows.push(Row::error(
            "grpc_exec",
            name,
            &anyhow::anyhow!("no samples"),
        ));
    };
    rows.push(
        Row::info(
            "grpc_rest_exec",
            "exec `/bin/true` over REST, interleaved with the gRPC execs",
            r.display(),
        )
        .data(json!(r)),
    );
    rows.push(
        Row::info(
            "grpc_exec",
            name,
            phases::with_ratios(&g, &[("REST exec", Some(r.p50_ms))]),
        )
        .data(json!({ "grpc": g, "rest": r })),
    );
}

async fn measure(ctx: &Ctx<'_>, port: u16) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let client = ctx.d.client()?;
    let session = client.create_session(&phases::create_req("bash")).await?;
    let raw = RawExec::new(ctx, &client, session.id(), &[phases::TRUE])?;
    let grpc = Grpc::connect(format!("http://127.0.0.1:{port}")).await?;
    let auth: tonic::metadata::MetadataValue<_> = format!("Bearer {}", ctx.d.key).parse()?;
    let unary = || {
        let mut req = tonic::Request::new(pb::ExecRequest {
            session_id: session.id().to_string(),
            cmd: vec![phases::TRUE.into()],
            ..Default::default()
        });
        req.metadata_mut().insert("authorization", auth.clone());
        let mut c = grpc.clone();
        async move {
            let r = c.exec(req).await?.into_inner();
            if r.exit_code != Some(0) {
                bail!("gRPC exec did not exit 0: {r:?}");
            }
            Ok(())
        }
    };
    for _ in 0..ctx.s.warmup {
        raw.json().await?;
        unary().await?;
    }
    let n = ctx.s.exec_samples;
    let (mut gs, mut rs) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        for grpc_first in [i % 2 == 0, i % 2 != 0] {
            let t = Instant::now();
            if grpc_first {
                unary().await?;
                gs.push(t.elapsed());
            } else {
                raw.json().await?;
                rs.push(t.elapsed());
            }
        }
    }
    Ok((gs, rs))
}
