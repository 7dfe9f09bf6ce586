//! The languages a context runs and the drivers shipped for them.

use std::os::fd::RawFd;

const PYTHON_DRIVER: &str = include_str!("../../../drivers/python_driver.py");
const NODE_DRIVER: &str = include_str!("../../../drivers/node_driver.js");

/// Where an interpreter finds its driver's source: a sealed memfd, read once (at offset 0) and
/// closed by a one-line bootstrap, so no source sits in any process's command line.
pub(super) const DRIVER_FD: RawFd = 5;
/// The bootstraps read at most this much (1 MiB, `1<<20` in them).
const MAX_DRIVER: usize = 1 << 20;
const _: () = assert!(PYTHON_DRIVER.len() < MAX_DRIVER && NODE_DRIVER.len() < MAX_DRIVER);
/// A fresh globals dict: the bootstrap's own names stay out of the driver's.
const PYTHON_BOOT: &str =
    "import os;d=os.pread(5,1<<20,0);os.close(5);exec(compile(d,'koder-driver','exec'),{})";
/// Indirect eval runs the driver in the global scope (with `require`), not the bootstrap's.
const NODE_BOOT: &str = "(0,eval)((f=>{const b=Buffer.alloc(1<<20),n=f.readSync(5,b,0,b.length,0);\
                         f.closeSync(5);return b.toString('utf8',0,n)})(require('fs')))";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lang {
    Python,
    Node,
}

impl Lang {
    pub(super) fn parse(name: &str) -> Option<Self> {
        match name {
            "python" | "python3" | "py" => Some(Lang::Python),
            "node" | "nodejs" | "javascript" | "js" => Some(Lang::Node),
            _ => None,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Lang::Python => "python",
            Lang::Node => "node",
        }
    }

    pub(super) fn program(self) -> &'static str {
        match self {
            Lang::Python => "python3",
            Lang::Node => "node",
        }
    }

    pub(super) fn args(self) -> &'static [&'static str] {
        match self {
            // -u: user output reaches the pipe as it is printed, not when a buffer fills.
            Lang::Python => &["-u", "-c", PYTHON_BOOT],
            Lang::Node => &["-e", NODE_BOOT],
        }
    }

    pub(super) fn driver(self) -> &'static str {
        match self {
            Lang::Python => PYTHON_DRIVER,
            Lang::Node => NODE_DRIVER,
        }
    }
}
