//! The languages a context runs and the drivers shipped for them.

use std::os::fd::RawFd;

use koder_agent_protocol::{AgentError, ErrorCode};

use super::control::Request;

/// The chart reader's and the magics' functions come first, at the top level the driver's own
/// code sees.
const PYTHON_DRIVER: &str = concat!(
    include_str!("../../../drivers/python_charts.py"),
    include_str!("../../../drivers/python_magics.py"),
    include_str!("../../../drivers/python_driver.py")
);
const NODE_DRIVER: &str = include_str!("../../../drivers/node_driver.js");
const BASH_DRIVER: &str = include_str!("../../../drivers/bash_driver.sh");
const JAVA_DRIVER: &str = include_str!("../../../drivers/java_driver.java");
const R_DRIVER: &str = include_str!("../../../drivers/r_driver.R");

/// Where an interpreter finds its driver's source: a sealed memfd, read once (at offset 0) and
/// closed by a one-line bootstrap, so no source sits in any process's command line.
pub(super) const DRIVER_FD: RawFd = 5;
/// The bootstraps read at most this much (1 MiB, `1<<20` in them).
const MAX_DRIVER: usize = 1 << 20;
const _: () = assert!(
    PYTHON_DRIVER.len() < MAX_DRIVER
        && NODE_DRIVER.len() < MAX_DRIVER
        && BASH_DRIVER.len() < MAX_DRIVER
);
/// A fresh globals dict: the bootstrap's own names stay out of the driver's.
const PYTHON_BOOT: &str =
    "import os;d=os.pread(5,1<<20,0);os.close(5);exec(compile(d,'koder-driver','exec'),{})";
/// Indirect eval runs the driver in the global scope (with `require`), not the bootstrap's.
const NODE_BOOT: &str = "(0,eval)((f=>{const b=Buffer.alloc(1<<20),n=f.readSync(5,b,0,b.length,0);\
                         f.closeSync(5);return b.toString('utf8',0,n)})(require('fs')))";
/// Reopened through /proc: a fresh offset, whoever read the file before. The driver runs in the
/// shell itself, so its functions and variables are the context's.
const BASH_BOOT: &str =
    "IFS= read -r -d '' __koder_driver </proc/self/fd/5; exec 5<&-; eval \"$__koder_driver\"";
/// The JDK's source launcher compiles the driver in memory from the path (a fresh open of the
/// memfd). The serial collector: one GC thread and the smallest heap overhead, for sandboxes
/// of a few hundred MiB.
const JAVA_ARGS: &[&str] = &["-XX:+UseSerialGC", "--source", "11", "/proc/self/fd/5"];
/// Rscript reads the driver from the path (a fresh open of the memfd); no workspace is saved
/// or restored.
const R_ARGS: &[&str] = &["--no-save", "--no-restore", "/proc/self/fd/5"];
/// TypeScript runs in the JavaScript driver, which this argument tells to strip each cell's
/// types first (and which it takes out of `process.argv` before user code sees it).
const TYPESCRIPT_ARGS: &[&str] = &["-e", NODE_BOOT, "typescript"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lang {
    Python,
    Node,
    TypeScript,
    Bash,
    Java,
    R,
}

impl Lang {
    pub(super) fn parse(name: &str) -> Option<Self> {
        match name {
            "python" | "python3" | "py" => Some(Lang::Python),
            "node" | "nodejs" | "javascript" | "js" => Some(Lang::Node),
            "typescript" | "ts" => Some(Lang::TypeScript),
            "bash" | "sh" | "shell" => Some(Lang::Bash),
            "java" => Some(Lang::Java),
            "r" => Some(Lang::R),
            _ => None,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Lang::Python => "python",
            Lang::Node => "node",
            Lang::TypeScript => "typescript",
            Lang::Bash => "bash",
            Lang::Java => "java",
            Lang::R => "r",
        }
    }

    pub(super) fn program(self) -> &'static str {
        match self {
            Lang::Python => "python3",
            Lang::Node | Lang::TypeScript => "node",
            Lang::Bash => "bash",
            Lang::Java => "java",
            Lang::R => "Rscript",
        }
    }

    pub(super) fn args(self) -> &'static [&'static str] {
        match self {
            // -u: user output reaches the pipe as it is printed, not when a buffer fills.
            Lang::Python => &["-u", "-c", PYTHON_BOOT],
            Lang::Node => &["-e", NODE_BOOT],
            Lang::TypeScript => TYPESCRIPT_ARGS,
            Lang::Bash => &["-c", BASH_BOOT],
            Lang::Java => JAVA_ARGS,
            Lang::R => R_ARGS,
        }
    }

    pub(super) fn driver(self) -> &'static str {
        match self {
            Lang::Python => PYTHON_DRIVER,
            Lang::Node | Lang::TypeScript => NODE_DRIVER,
            Lang::Bash => BASH_DRIVER,
            Lang::Java => JAVA_DRIVER,
            Lang::R => R_DRIVER,
        }
    }

    /// One run's request as this language's driver reads it: a JSON line, or for bash, Java
    /// and R (which cannot parse JSON) NUL-separated fields, which its code then must not
    /// contain. R reads a byte at a time only what it must: its code comes after its size,
    /// in one read.
    pub(super) fn request(self, req: &Request) -> Result<Vec<u8>, AgentError> {
        let bad = |m: String| AgentError::new(ErrorCode::InvalidRequest, m);
        if matches!(self, Lang::Python | Lang::Node | Lang::TypeScript) {
            let mut line = serde_json::to_vec(req).map_err(|e| bad(format!("code: {e}")))?;
            line.push(b'\n');
            return Ok(line);
        }
        if req.code.contains('\0') {
            return Err(bad(format!("{} code cannot hold NUL bytes", self.name())));
        }
        let mut out = match self {
            Lang::R => format!("{}\0{}\0{}", req.n, req.code.len(), req.code),
            _ => format!("{}\0{}\0", req.n, req.code),
        }
        .into_bytes();
        for (k, v) in &req.env {
            out.extend_from_slice(format!("{k}={v}\0").as_bytes());
        }
        out.push(0);
        Ok(out)
    }
}
