//! Code-interpreter contexts: long-lived Python and Node interpreters inside the sandbox.
//!
//! A context is one interpreter process running a driver shipped with the agent (`drivers/`,
//! standard library only). It is started like an exec (the sandbox's default environment, its
//! own session and process group) with separate pipes for requests (its fd 3), events (its
//! fd 4) and user output (fds 1 and 2). Keeping user output off the control channel means
//! nothing printed, by user code or any process it starts, can forge or corrupt an event. The
//! driver writes a run's "done" only after flushing, so when the agent reads it the rest of the
//! run's output is already in the pipes and a non-blocking drain collects it.
//!
//! A run that times out, or whose interpreter dies, kills the interpreter's process group and
//! starts a fresh interpreter: the context survives, its state does not, and the outcome says so.
//!
//! Modules by job: [`contexts`] keeps the registry and a context's life (create, restart,
//! delete, run outcome); [`lang`] the languages and their drivers; [`spawn`] forks an
//! interpreter with its hand-overs; [`process`] owns a running interpreter until it is ready;
//! [`control`] is the line protocol on its control pipes; [`run`] drives one run and forwards
//! its output; [`results`] bounds the rich results; [`limits`] holds the bounds the daemon sees.

use koder_agent_protocol::{AgentError, ErrorCode, FromAgent, ToAgent};
use tokio::sync::mpsc;

use crate::outbox::Outbox;

mod contexts;
mod control;
mod lang;
mod limits;
mod process;
mod results;
mod run;
mod spawn;

pub use contexts::Contexts;
pub use limits::{DEFAULT_CONTEXT, MAX_CODE_BYTES, MAX_CONTEXTS, OUTPUT_LIMIT, RESULT_BUDGET};

pub async fn handle(
    contexts: &Contexts,
    msg: ToAgent,
    mut rx: mpsc::Receiver<ToAgent>,
    out: Outbox,
) {
    let answer = match msg {
        ToAgent::ContextCreate {
            language,
            cwd,
            env,
            context_id,
        } => contexts
            .create(&language, cwd, env, context_id)
            .await
            .map(FromAgent::Context),
        ToAgent::ContextList => Ok(FromAgent::Contexts(contexts.list())),
        ToAgent::ContextDelete { context_id } => {
            contexts.delete(&context_id).map(|()| FromAgent::Done)
        }
        ToAgent::ContextRestart { context_id } => {
            contexts.restart(&context_id).await.map(FromAgent::Context)
        }
        ToAgent::ContextRun {
            context_id,
            code,
            timeout_ms,
            env,
            trace,
            default_env,
        } => {
            let run = contexts::Run {
                code,
                timeout_ms,
                env,
                trace,
                default_env,
            };
            contexts
                .run(&context_id, run, &mut rx, &out)
                .await
                .map(FromAgent::RunDone)
        }
        other => Err(AgentError::new(
            ErrorCode::InvalidRequest,
            format!("{} is not a context operation", other.kind()),
        )),
    };
    let _ = out.send(answer.unwrap_or_else(FromAgent::Error)).await;
}
