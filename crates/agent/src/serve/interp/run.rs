//! One run on a ready interpreter: send the request, collect events and output until "done",
//! a timeout, a death or an abandoned caller.

use std::os::fd::OwnedFd;
use std::time::Duration;

use koder_agent_protocol::{AgentError, FromAgent, RunError, ToAgent, CHUNK_BYTES};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use super::control::{Event, Line, Request, MAX_EVENT_LINE};
use super::lang::Lang;
use super::limits::OUTPUT_LIMIT;
use super::process::Interp;
use super::results::{rich, run_error, Results};
use crate::outbox::Outbox;
use crate::serve::exec::{kill_group, sleep_until};

/// A cancelled run is interrupted (SIGINT) and killed if it has not finished within this.
const CANCEL_GRACE: Duration = Duration::from_secs(1);
/// How often a shell's interrupt is sent again within the grace: a SIGINT that reaches a
/// command bash is just forking is taken by the child before it execs, and bash runs its trap
/// only once that command ends; the next SIGINT reaches the command itself.
const SHELL_INTERRUPT_AGAIN: Duration = Duration::from_millis(150);
/// Reads of one non-blocking drain of an output pipe: a writer that outlived its run must not
/// keep the agent draining forever.
const DRAIN_READS: usize = 64;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum How {
    Done,
    TimedOut,
    /// The interpreter exited or was killed.
    Died,
    /// The caller went away and the interpreter did not stop within the grace period.
    Abandoned,
}

pub(super) struct RunEnd {
    pub(super) how: How,
    pub(super) results: Results,
    pub(super) error: Option<RunError>,
}

impl Interp {
    pub(super) async fn run(
        &mut self,
        n: u64,
        code: &str,
        env: &[(String, String)],
        timeout: Option<Duration>,
        rx: &mut mpsc::Receiver<ToAgent>,
        out: &Outbox,
    ) -> Result<RunEnd, AgentError> {
        let env = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let request = self.lang.request(&Request { code, n, env })?;
        // Whatever background work printed since the last run is not this run's output.
        let mut obuf = vec![0u8; CHUNK_BYTES];
        discard_pending(&self.stdout, &mut obuf);
        discard_pending(&self.stderr, &mut obuf);
        let mut ebuf = vec![0u8; CHUNK_BYTES];

        let pid = self.pid;
        let mut results = Results::default();
        let mut error = None;
        let mut sinks = Sinks::new(out);
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut grace: Option<tokio::time::Instant> = None;
        // The next repeated interrupt of a cancelled shell run.
        let mut again: Option<tokio::time::Instant> = None;
        let mut control_open = true;
        let (mut out_open, mut err_open) = (true, true);
        let mut written = false;
        let write = self.requests.write_all(&request);
        tokio::pin!(write);
        let how = loop {
            if grace.is_some() && again.is_none() && self.lang == Lang::Bash {
                again = Some(tokio::time::Instant::now() + SHELL_INTERRUPT_AGAIN);
            }
            tokio::select! {
                biased;
                r = &mut write, if !written => match r {
                    Ok(()) => written = true,
                    Err(_) => break How::Died,
                },
                line = self.events.next_line() => match line {
                    Ok(Some(Line::Full(bytes))) => {
                        let Ok(ev) = serde_json::from_slice::<Event>(&bytes) else { continue };
                        if ev.n != n {
                            continue;
                        }
                        match ev.ev.as_str() {
                            "display" => {
                                if let Some(m) = ev.data {
                                    results.push(rich(m, ev.main));
                                }
                            }
                            "done" => {
                                error = ev.error.map(run_error);
                                break How::Done;
                            }
                            _ => {}
                        }
                    }
                    Ok(Some(Line::TooLong)) => results.note(
                        false,
                        format!("[an output larger than {MAX_EVENT_LINE} bytes was dropped]"),
                    ),
                    Ok(None) | Err(_) => break How::Died,
                },
                r = self.stdout.read(&mut obuf), if out_open => match r {
                    Ok(k) if k > 0 => {
                        if !sinks.stdout(&obuf[..k]).await {
                            abandon(pid, &mut grace, &mut control_open);
                        }
                    }
                    _ => out_open = false,
                },
                r = self.stderr.read(&mut ebuf), if err_open => match r {
                    Ok(k) if k > 0 => {
                        if !sinks.stderr(&ebuf[..k]).await {
                            abandon(pid, &mut grace, &mut control_open);
                        }
                    }
                    _ => err_open = false,
                },
                () = exited(self.exited.as_ref()) => break How::Died,
                () = sleep_until(deadline) => break How::TimedOut,
                () = sleep_until(grace) => break How::Abandoned,
                () = sleep_until(again), if again.is_some() => {
                    kill_group(pid, libc::SIGINT);
                    again = again.map(|at| at + SHELL_INTERRUPT_AGAIN);
                }
                msg = rx.recv(), if control_open => match msg {
                    Some(ToAgent::Signal(sig)) if (1..=64).contains(&sig) => kill_group(pid, sig),
                    Some(ToAgent::Cancel) | None => abandon(pid, &mut grace, &mut control_open),
                    Some(_) => {}
                },
            }
        };
        if how != How::Done {
            // Partial output stays in the pipes after a kill; collect it before answering.
            kill_group(pid, libc::SIGKILL);
        }
        sinks.drain(&self.stdout, &mut obuf, false).await;
        sinks.drain(&self.stderr, &mut ebuf, true).await;
        Ok(RunEnd {
            how,
            results,
            error,
        })
    }
}

/// Interrupts a run nobody waits for any more; it gets [`CANCEL_GRACE`] to finish, so an
/// interruptible run keeps its context's state.
fn abandon(pid: i32, grace: &mut Option<tokio::time::Instant>, control_open: &mut bool) {
    *control_open = false;
    if grace.is_none() {
        kill_group(pid, libc::SIGINT);
        *grace = Some(tokio::time::Instant::now() + CANCEL_GRACE);
    }
}

/// Forwards a run's stdout/stderr to the caller, each bounded by [`OUTPUT_LIMIT`].
struct Sinks<'a> {
    out: &'a Outbox,
    stdout_sent: usize,
    stderr_sent: usize,
    /// The caller is gone: output is read (so writers do not block) and dropped.
    gone: bool,
}

impl<'a> Sinks<'a> {
    pub(super) fn new(out: &'a Outbox) -> Self {
        Self {
            out,
            stdout_sent: 0,
            stderr_sent: 0,
            gone: false,
        }
    }

    pub(super) async fn stdout(&mut self, data: &[u8]) -> bool {
        let sent = &mut self.stdout_sent;
        Self::forward(self.out, &mut self.gone, sent, data, FromAgent::Stdout).await
    }

    pub(super) async fn stderr(&mut self, data: &[u8]) -> bool {
        let sent = &mut self.stderr_sent;
        Self::forward(self.out, &mut self.gone, sent, data, FromAgent::Stderr).await
    }

    async fn forward(
        out: &Outbox,
        gone: &mut bool,
        sent: &mut usize,
        data: &[u8],
        wrap: fn(Vec<u8>) -> FromAgent,
    ) -> bool {
        let take = data.len().min(OUTPUT_LIMIT.saturating_sub(*sent));
        if *gone || take == 0 {
            return !*gone;
        }
        *sent += take;
        // Awaiting is the back-pressure: a slow caller slows the interpreter's writes.
        if out.send(wrap(data[..take].to_vec())).await.is_err() {
            *gone = true;
        }
        !*gone
    }

    /// Forwards what is left in an output pipe once the run ended (bounded by [`DRAIN_READS`]).
    async fn drain(&mut self, r: &pipe::Receiver, buf: &mut [u8], is_stderr: bool) {
        for _ in 0..DRAIN_READS {
            let Some(k) = read_now(r, buf) else { return };
            let more = if is_stderr {
                self.stderr(&buf[..k]).await
            } else {
                self.stdout(&buf[..k]).await
            };
            if !more {
                return;
            }
        }
    }
}

fn discard_pending(r: &pipe::Receiver, buf: &mut [u8]) {
    for _ in 0..DRAIN_READS {
        if read_now(r, buf).is_none() {
            return;
        }
    }
}

/// One read of what the pipe holds now, asking the kernel. Not `try_read`: that answers
/// `WouldBlock` without reading while tokio's reactor has not yet seen the pipe become
/// readable, and it may not have: the run's "done" line can come out of the events reader's
/// buffer, read together with an earlier event, before the reactor's next turn. The output
/// flushed before "done" would then be missed here and thrown away as stale by the next run.
/// The pipe is non-blocking (tokio made it so), so this never waits. `None`: nothing there,
/// the writers are gone, or the read failed.
pub(super) fn read_now(r: &pipe::Receiver, buf: &mut [u8]) -> Option<usize> {
    loop {
        match rustix::io::read(r, &mut *buf) {
            Ok(k) if k > 0 => return Some(k),
            Err(rustix::io::Errno::INTR) => continue,
            _ => return None,
        }
    }
}

async fn exited(pidfd: Option<&AsyncFd<OwnedFd>>) {
    if let Some(fd) = pidfd {
        if fd.readable().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No await between the writes and the reads: the reactor never ran, as when a run's
    /// "done" came out of the events reader's buffer.
    #[tokio::test(flavor = "current_thread")]
    async fn what_the_kernel_holds_is_read_before_the_reactor_sees_it() {
        let (tx, rx) = pipe::pipe().unwrap();
        let mut buf = [0u8; 16];
        rustix::io::write(&tx, b"stale").unwrap();
        discard_pending(&rx, &mut buf);
        rustix::io::write(&tx, b"done\n").unwrap();
        assert_eq!(
            read_now(&rx, &mut buf),
            Some(5),
            "the stale bytes were discarded"
        );
        assert_eq!(&buf[..5], b"done\n");
        assert_eq!(read_now(&rx, &mut buf), None, "an empty pipe does not wait");
        drop(tx);
        assert_eq!(read_now(&rx, &mut buf), None, "nor does a closed one");
    }
}
