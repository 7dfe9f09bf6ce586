//! A daemon with its gRPC face on, and a client of it generated from the same `.proto`.

#![allow(dead_code)] // each test binary uses a different subset

use koder_grpc::proto as pb;
use koder_grpc::SandboxClient;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use crate::common::Daemon;

pub type Client = SandboxClient<Channel>;

/// Starts a daemon with `config` (TOML, as `Daemon::start`) and gRPC on a free loopback port
/// (the daemon's pick, read from what it prints).
pub async fn start(config: &str) -> (Daemon, Client, String) {
    let d = Daemon::start(&format!(
        "{config}\n[server]\ngrpc_addr = \"127.0.0.1:0\"\n"
    ))
    .await;
    let url = d.printed_address("gRPC").await;
    let client = SandboxClient::connect(url.clone())
        .await
        .expect("gRPC connect");
    (d, client, url)
}

/// `msg` with `key` as its bearer token.
pub fn authed<T>(key: &str, msg: T) -> Request<T> {
    let mut req = Request::new(msg);
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {key}").parse().expect("metadata value"),
    );
    req
}

/// The status code and the `SANDBOX-...` code of a failed call (checked to be in the message
/// too).
pub fn failure(s: &Status) -> (Code, String) {
    let code = koder_grpc::status::sandbox_code(s).expect("ErrorInfo in the status details");
    assert!(s.message().starts_with(&code), "{s:?}");
    (s.code(), code)
}

pub fn shell(session: &str, cmd: &str) -> pb::ExecRequest {
    pb::ExecRequest {
        session_id: session.into(),
        shell: Some(cmd.into()),
        ..Default::default()
    }
}

pub async fn create(c: &mut Client, key: &str, req: pb::CreateSessionRequest) -> pb::Session {
    c.create_session(authed(key, req))
        .await
        .expect("CreateSession")
        .into_inner()
}

pub async fn exec(c: &mut Client, key: &str, session: &str, cmd: &str) -> pb::ExecResult {
    c.exec(authed(key, shell(session, cmd)))
        .await
        .expect("Exec")
        .into_inner()
}

/// The answer of a call that must succeed.
pub fn ok<T>(answer: Result<tonic::Response<T>, Status>) -> T {
    answer.expect("the call failed").into_inner()
}

/// The status and `SANDBOX-...` code of a call that must fail.
pub fn refused<T: std::fmt::Debug>(answer: Result<tonic::Response<T>, Status>) -> (Code, String) {
    failure(&answer.expect_err("the call succeeded"))
}

pub async fn get_session(
    c: &mut Client,
    key: &str,
    session: &str,
) -> Result<tonic::Response<pb::Session>, Status> {
    let req = pb::GetSessionRequest {
        session_id: session.into(),
    };
    c.get_session(authed(key, req)).await
}

pub async fn delete_session(c: &mut Client, key: &str, session: &str) {
    let req = pb::DeleteSessionRequest {
        session_id: session.into(),
    };
    ok(c.delete_session(authed(key, req)).await);
}
