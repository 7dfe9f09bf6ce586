//! Code-interpreter contexts driven in-process over an in-memory pipe. The interpreters run on
//! the host (/usr/bin/python3, /usr/bin/node); matplotlib and pandas come from
//! scripts/setup.sh, and the tests that use them fail, not skip, without them.

mod common;

use std::time::{Duration, Instant};

use common::{agent, connect, rt};
use koder_agent::serve::interp::{MAX_CODE_BYTES, MAX_CONTEXTS};
use koder_agent_protocol::*;

struct Harness {
    _root: tempfile::TempDir,
    client: AgentClient,
}

fn harness() -> Harness {
    let root = tempfile::tempdir().unwrap();
    let home = root.path().to_string_lossy().into_owned();
    // The interpreters run on the host: their temporary files (R's session directory, which a
    // killed R leaves behind) go with the test's directory, not into the host's /tmp.
    let env = [("HOME", &*home), ("LANG", "C.UTF-8"), ("TMPDIR", &*home)];
    let client = connect(agent(root.path(), &env));
    Harness {
        _root: root,
        client,
    }
}

async fn one(client: &AgentClient, msg: ToAgent) -> Result<FromAgent, ClientError> {
    let mut s = client.open(msg).await?;
    let m = s.recv().await;
    s.mark_finished();
    m
}

fn create_msg(language: &str) -> ToAgent {
    ToAgent::ContextCreate {
        language: language.into(),
        cwd: None,
        env: Vec::new(),
        context_id: None,
    }
}

async fn create(client: &AgentClient, language: &str) -> ContextInfo {
    match one(client, create_msg(language)).await {
        Ok(FromAgent::Context(info)) => info,
        other => panic!("create {language}: {other:?}"),
    }
}

/// A new context of `language` working in `cwd`, by its id.
async fn context_in(client: &AgentClient, language: &str, cwd: &str) -> String {
    let msg = ToAgent::ContextCreate {
        language: language.into(),
        cwd: Some(cwd.into()),
        env: Vec::new(),
        context_id: None,
    };
    match one(client, msg).await {
        Ok(FromAgent::Context(info)) => info.context_id,
        other => panic!("create {language} in {cwd}: {other:?}"),
    }
}

/// A new context of `language` (named as the agent names it), by its id.
async fn context_of(client: &AgentClient, language: &str) -> String {
    let c = create(client, language).await;
    assert_eq!(c.language, language);
    c.context_id
}

async fn list(client: &AgentClient) -> Vec<ContextInfo> {
    match one(client, ToAgent::ContextList).await {
        Ok(FromAgent::Contexts(all)) => all,
        other => panic!("list: {other:?}"),
    }
}

#[derive(Debug, Default)]
struct Ran {
    stdout: String,
    stderr: String,
    outcome: RunOutcome,
    /// When the first stdout chunk arrived, from the start of the run.
    first_stdout: Option<Duration>,
}

impl Ran {
    fn main(&self) -> Option<&RichResult> {
        self.outcome.results.iter().find(|r| r.is_main_result)
    }

    fn text(&self) -> Option<&str> {
        self.main().and_then(|r| r.text.as_deref())
    }

    fn ok(self) -> Self {
        assert!(self.outcome.error.is_none(), "{self:?}");
        self
    }

    fn error_name(&self) -> Option<&str> {
        self.outcome.error.as_ref().map(|e| e.name.as_str())
    }
}

async fn try_run(
    client: &AgentClient,
    cid: &str,
    code: &str,
    timeout_ms: Option<u64>,
) -> Result<Ran, ClientError> {
    try_run_with_env(client, cid, code, timeout_ms, &[], None).await
}

async fn try_run_with_env(
    client: &AgentClient,
    cid: &str,
    code: &str,
    timeout_ms: Option<u64>,
    env: &[(&str, &str)],
    trace: Option<TraceContext>,
) -> Result<Ran, ClientError> {
    let began = Instant::now();
    let mut s = client
        .open(ToAgent::ContextRun {
            context_id: cid.into(),
            code: code.into(),
            timeout_ms,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            trace,
            default_env: Vec::new(),
        })
        .await?;
    let mut ran = Ran::default();
    loop {
        match s.recv().await? {
            FromAgent::Stdout(d) => {
                ran.first_stdout.get_or_insert(began.elapsed());
                ran.stdout.push_str(&String::from_utf8_lossy(&d));
            }
            FromAgent::Stderr(d) => ran.stderr.push_str(&String::from_utf8_lossy(&d)),
            FromAgent::RunDone(outcome) => {
                s.mark_finished();
                ran.outcome = outcome;
                return Ok(ran);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

async fn run(client: &AgentClient, cid: &str, code: &str) -> Ran {
    run_with_env(client, cid, code, &[]).await
}

/// A run with variables of its own.
async fn run_with_env(client: &AgentClient, cid: &str, code: &str, env: &[(&str, &str)]) -> Ran {
    try_run_with_env(client, cid, code, Some(30_000), env, None)
        .await
        .unwrap_or_else(|e| panic!("run {code:?}: {e}"))
}

/// Abandons `looping` in context `cid` once it printed "ready", then runs `check` there: the
/// interpreter must have been interrupted, not restarted, so `check` sees the state.
async fn abandon_then_run(client: &AgentClient, cid: &str, looping: &str, check: &str) -> Ran {
    abandon_once_ready(client, cid, looping).await;
    let r = run(client, cid, check).await.ok();
    assert!(!r.outcome.restarted, "{looping}: {r:?}");
    r
}

/// Starts `code` in context `cid` and goes away once its output ends with "ready\n": the run
/// is abandoned mid-way, as by a client that disconnects.
async fn abandon_once_ready(client: &AgentClient, cid: &str, code: &str) {
    let mut s = client
        .open(ToAgent::ContextRun {
            context_id: cid.into(),
            code: code.into(),
            timeout_ms: Some(120_000),
            env: Vec::new(),
            trace: None,
            default_env: Vec::new(),
        })
        .await
        .unwrap();
    let mut out = Vec::new();
    while !out.ends_with(b"ready\n") {
        let Ok(FromAgent::Stdout(d)) = s.recv().await else {
            panic!("no output")
        };
        out.extend_from_slice(&d);
    }
}

fn agent_code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> ErrorCode {
    match r {
        Err(ClientError::Agent(e)) => e.code,
        other => panic!("expected an agent error, got {other:?}"),
    }
}

#[test]
fn python_state_persists_and_last_value_is_the_result() {
    let h = harness();
    rt().block_on(async {
        let c = create(&h.client, "python").await;
        assert_eq!((c.language.as_str(), c.execution_count), ("python", 0));
        let id = c.context_id.as_str();
        let r = run(&h.client, id, "x = 41\nimport math").await.ok();
        assert!(r.outcome.results.is_empty(), "{r:?}");
        let r = run(&h.client, id, "x + 1").await.ok();
        assert_eq!(r.text(), Some("42"));
        assert_eq!(r.main().and_then(|m| m.json.as_deref()), Some("42"));
        assert_eq!(r.outcome.execution_count, 2);
        assert!(!r.outcome.restarted && !r.outcome.timed_out);
        let r = run(&h.client, id, "1+1").await.ok();
        assert_eq!(
            (r.text(), r.main().and_then(|m| m.json.as_deref())),
            (Some("2"), Some("2"))
        );
        let r = run(
            &h.client,
            id,
            "def f(n):\n    return {'n': n, 'sq': math.sqrt(n)}\nf(16)",
        )
        .await
        .ok();
        assert_eq!(r.text(), Some("{'n': 16, 'sq': 4.0}"));
        assert_eq!(
            r.main().and_then(|m| m.json.as_deref()),
            Some(r#"{"n": 16, "sq": 4.0}"#)
        );
        let r = run(&h.client, id, "print(f(4)['sq']);").await.ok();
        assert_eq!(r.stdout, "2.0\n");
        assert!(r.outcome.results.is_empty(), "a statement has no value");
        let info = list(&h.client).await;
        assert_eq!(info.len(), 1);
        assert_eq!(info[0].execution_count, 5);
    });
}

#[test]
fn output_arrives_in_order_and_while_the_run_goes_on() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        let r = run(
            &h.client,
            &id,
            "import sys\nfor i in range(3):\n    print(i)\nprint('err', file=sys.stderr)\nprint('end')",
        )
        .await
        .ok();
        assert_eq!(r.stdout, "0\n1\n2\nend\n");
        assert_eq!(r.stderr, "err\n");

        let r = run(
            &h.client,
            &id,
            "import time\nprint('first')\ntime.sleep(1.5)\nprint('second')",
        )
        .await
        .ok();
        assert_eq!(r.stdout, "first\nsecond\n");
        let first = r.first_stdout.unwrap();
        assert!(
            first < Duration::from_millis(1000),
            "first line after {first:?}: output must stream, not wait for the run's end"
        );
        assert!(r.outcome.duration_ms >= 1500, "{:?}", r.outcome);
    });
}

#[test]
fn an_exception_reports_name_value_traceback_and_the_context_lives_on() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        run(&h.client, &id, "kept = 'yes'").await.ok();
        let r = run(
            &h.client,
            &id,
            "print('before')\ndef f():\n    raise ValueError('boom')\nf()",
        )
        .await;
        assert_eq!(r.stdout, "before\n");
        let e = r.outcome.error.as_ref().expect("an error");
        assert_eq!((e.name.as_str(), e.value.as_str()), ("ValueError", "boom"));
        assert!(e.traceback.contains("raise ValueError('boom')"), "{e:?}");
        assert!(e.traceback.contains("Traceback"), "{e:?}");
        assert!(!e.traceback.contains("_koder"), "driver frames leak: {e:?}");
        assert!(!r.outcome.restarted);

        let r = run(&h.client, &id, "1 +").await;
        assert_eq!(r.error_name(), Some("SyntaxError"));
        let r = run(&h.client, &id, "exit(3)").await;
        assert_eq!(r.error_name(), Some("SystemExit"));
        let r = run(&h.client, &id, "kept").await.ok();
        assert_eq!(r.text(), Some("'yes'"));
        assert_eq!(r.outcome.execution_count, 5);
    });
}

#[test]
fn a_timeout_kills_and_restarts_the_interpreter() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        run(&h.client, &id, "state = 1").await.ok();
        let began = Instant::now();
        let r = try_run(
            &h.client,
            &id,
            "print('before', flush=True)\nwhile True:\n    pass",
            Some(500),
        )
        .await
        .unwrap();
        assert!(began.elapsed() < Duration::from_secs(10));
        assert!(r.outcome.timed_out && r.outcome.restarted, "{r:?}");
        assert!(r.outcome.duration_ms >= 500);
        assert_eq!(r.stdout, "before\n", "output before the kill is kept");
        assert_eq!(r.error_name(), Some("TimeoutError"));
        assert_eq!(list(&h.client).await[0].execution_count, 0);
        let r = run(&h.client, &id, "'state' in globals()").await.ok();
        assert_eq!(r.text(), Some("False"), "a fresh interpreter has no state");
        assert_eq!(r.outcome.execution_count, 1);
        assert!(!r.outcome.restarted);
    });
}

#[test]
fn an_interpreter_that_dies_mid_run_is_restarted() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        run(&h.client, &id, "state = 1").await.ok();
        let r = run(&h.client, &id, "import os\nprint('bye', flush=True)\nos._exit(3)").await;
        assert!(r.outcome.restarted && !r.outcome.timed_out, "{r:?}");
        assert_eq!(r.stdout, "bye\n");
        assert_eq!(
            r.error_name(),
            Some("InterpreterDied")
        );
        let r = run(&h.client, &id, "'state' in globals()").await.ok();
        assert_eq!(r.text(), Some("False"));

        // Killed while idle: the next run notices, starts afresh and says so.
        let r = run(&h.client, &id, "import os, signal, threading\nthreading.Timer(0.1, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()").await.ok();
        assert!(!r.outcome.restarted);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let r = run(&h.client, &id, "1").await.ok();
        assert!(r.outcome.restarted, "{r:?}");
        assert_eq!(r.text(), Some("1"));
    });
}

/// A context can start in another directory with more variables, for good (restarts too).
#[test]
fn contexts_take_a_cwd_and_an_environment() {
    let h = harness();
    rt().block_on(async {
        let msg = ToAgent::ContextCreate {
            language: "python".into(),
            cwd: Some("/tmp".into()),
            env: vec![("CTX_VAR".into(), "x".into())],
            context_id: None,
        };
        let Ok(FromAgent::Context(info)) = one(&h.client, msg).await else {
            panic!("create failed");
        };
        assert_eq!(info.cwd, "/tmp");
        let read = "import os; print(os.getcwd(), os.environ['CTX_VAR'])";
        assert_eq!(
            run(&h.client, &info.context_id, read).await.ok().stdout,
            "/tmp x\n"
        );
        one(
            &h.client,
            ToAgent::ContextRestart {
                context_id: info.context_id.clone(),
            },
        )
        .await
        .unwrap();
        assert_eq!(
            run(&h.client, &info.context_id, read).await.ok().stdout,
            "/tmp x\n"
        );
        for (cwd, env) in [
            (Some("relative"), vec![]),
            (Some("/nonexistent-dir"), vec![]),
            (None, vec![("A=B".to_string(), "x".to_string())]),
        ] {
            let msg = ToAgent::ContextCreate {
                language: "python".into(),
                cwd: cwd.map(String::from),
                env,
                context_id: None,
            };
            assert_eq!(
                agent_code(one(&h.client, msg).await),
                ErrorCode::InvalidRequest,
                "{cwd:?}"
            );
        }
    });
}

/// Python cells are taken as IPython (E2B's kernels) takes them: `!cmd` lines (indented too)
/// print into the cell's output in the interpreter's directory, and a cell indented as a whole
/// (a triple-quoted string in the caller's code) loses that indent; other cells are left be.
#[test]
fn python_cells_are_taken_as_ipython_takes_them() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        let r = run(
            &h.client,
            &id,
            "import os\n!echo one\nif True:\n    !echo two >&2\nprint(os.getcwd())\n!pwd",
        )
        .await;
        assert!(r.outcome.error.is_none(), "{r:?}");
        let here = format!("{}\n", h._root.path().display());
        assert_eq!(
            (r.stdout.as_str(), r.stderr.as_str()),
            (format!("one\n{here}{here}").as_str(), "two\n"),
        );
        let r = run(&h.client, &id, "!exit 3\n_exit_code").await.ok();
        assert_eq!(r.text(), Some("3"));
        let r = run(&h.client, &id, "s = '!echo no'\ns").await.ok();
        assert_eq!((r.stdout.as_str(), r.text()), ("", Some("'!echo no'")));
        let r = run(&h.client, &id, "!echo fine\nx = (").await;
        assert_eq!(
            r.error_name(),
            Some("SyntaxError")
        );
        assert_eq!(r.stdout, "", "nothing of a cell that does not parse runs");
        let indented = "\n    y = 1\n    if y:\n        print('in')\n    s = \"\"\"a\nb\"\"\"\n    y + len(s)\n    ";
        let r = run(&h.client, &id, indented).await.ok();
        assert_eq!((r.stdout.as_str(), r.text()), ("in\n", Some("4")));
        let r = run(&h.client, &id, "y = 1\n  y").await;
        assert_eq!(r.error_name(), Some("IndentationError"));
    });
}

/// Cells may use ES module imports and top-level await, as E2B's JavaScript kernel takes
/// them: imports bind for later runs, an awaited cell has its last expression as its value and
/// keeps its declarations.
#[test]
fn node_cells_take_imports_and_top_level_await() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "javascript").await.context_id;
        let cells = [
            ("\n    import { readFileSync } from 'fs'\n    console.log(typeof readFileSync)\n    ", "function\n", None),
            ("import path, { join as j, sep } from 'path';\nimport * as os from 'os'", "", None),
            ("import {\n  basename,\n  dirname as dn,\n} from \"path\"\nconsole.log(j('a', 'b'), sep, typeof os.cpus, path.sep, basename('/x/y'), dn('/x/y'))", "a/b / function / y /x\n", None),
            ("\n    await Promise.resolve('Hello World!')\n    ", "", Some("'Hello World!'")),
            ("await new Promise(r => setTimeout(r, 10)); 'later'", "", Some("'later'")),
            ("const v = await Promise.resolve(20)\nlet w = v + 1;\nv + w", "", Some("41")),
            ("v * 2 + w", "", Some("61")),
            ("for (const k of [1, 2]) {\n  await null\n}\nconsole.log('looped')", "looped\n", None),
        ];
        for (code, stdout, text) in cells {
            let r = run(&h.client, &id, code).await;
            assert!(r.outcome.error.is_none(), "{code}: {r:?}");
            assert_eq!((r.stdout.as_str(), r.text()), (stdout, text), "{code}");
        }
        // A cell that is wrong stays wrong, with its own error.
        let r = run(&h.client, &id, "import { x } from\nawait (").await;
        assert_eq!(r.error_name(), Some("SyntaxError"));
    });
}

/// Writes an npm package `name` into `dir/node_modules` from (file, text) pairs.
fn npm_package(dir: &std::path::Path, name: &str, files: &[(&str, &str)]) {
    let home = dir.join("node_modules").join(name);
    std::fs::create_dir_all(&home).unwrap();
    for (file, text) in files {
        std::fs::write(home.join(file), text).unwrap();
    }
}

/// ES modules load as in a file: packages that export only to `import` (which require()
/// refuses), `import()` in a cell (relative to the working directory, as it is now), CommonJS
/// with the defaults it had; a module that is missing is the cell's error; nothing in stderr.
#[test]
fn node_cells_import_es_modules() {
    let h = harness();
    let dir = tempfile::tempdir().unwrap();
    npm_package(
        dir.path(),
        "esm-only",
        &[
            (
                "package.json",
                r#"{"name":"esm-only","type":"module","exports":{"import":"./i.js"}}"#,
            ),
            (
                "i.js",
                "export default function hi() { return 'hi'; }\nexport const x = 42;\n",
            ),
        ],
    );
    npm_package(
        dir.path(),
        "cjs-babel",
        &[
            ("package.json", r#"{"name":"cjs-babel","main":"i.js"}"#),
            ("i.js", "Object.defineProperty(exports, '__esModule', { value: true });\nexports.default = 'dflt';\nexports.named = 'nm';\n"),
        ],
    );
    let later = dir.path().join("later");
    npm_package(
        &later,
        "esm-later",
        &[
            (
                "package.json",
                r#"{"name":"esm-later","type":"module","exports":{"import":"./i.js"}}"#,
            ),
            ("i.js", "export const where = 'later';\n"),
        ],
    );
    npm_package(
        dir.path(),
        "esm-waits",
        &[
            (
                "package.json",
                r#"{"name":"esm-waits","type":"module","exports":{"import":"./i.js"}}"#,
            ),
            (
                "i.js",
                "console.log('ready');\nawait new Promise(() => {});\n",
            ),
        ],
    );
    std::fs::write(dir.path().join("local.mjs"), "export default 'local';\n").unwrap();
    let cwd = dir.path().to_string_lossy().into_owned();
    rt().block_on(async {
        let id = context_in(&h.client, "javascript", &cwd).await;
        let cells = [
            ("(await import('esm-only')).x + 1", "", Some("43")),
            ("import hi, { x } from 'esm-only'\nimport * as only from 'esm-only'\nconsole.log(hi(), x, only.x)", "hi 42 42\n", None),
            ("import d, { named } from 'cjs-babel'\nimport fs from 'fs'\nconsole.log(d, named, typeof fs.readFileSync)", "dflt nm function\n", None),
            ("console.log('body')\nimport './local.mjs'\nhi() + x", "body\n", Some("'hi42'")),
            ("const m = await import('./local.mjs'); m.default", "", Some("'local'")),
            ("process.chdir('later')\nconst { where } = await import('esm-later'); where", "", Some("'later'")),
            ("import { where as w } from 'esm-later'\nw", "", Some("'later'")),
        ];
        for (code, stdout, text) in cells {
            let r = run(&h.client, &id, code).await;
            assert!(r.outcome.error.is_none(), "{code}: {r:?}");
            assert_eq!((r.stdout.as_str(), r.text(), r.stderr.as_str()), (stdout, text, ""), "{code}");
        }
        // A module that never finishes loading gives way to an interrupt, the state kept.
        let r = abandon_then_run(&h.client, &id, "import w from 'esm-waits'", "hi() + x").await;
        assert_eq!(r.text(), Some("'hi42'"), "{r:?}");
        // A module that is nowhere: the cell's error, and nothing of the cell has run.
        let r = run(&h.client, &id, "console.log('ran')\nimport nothing from 'no-such-package'").await;
        assert_eq!(r.error_name(), Some("Error"), "{r:?}");
        let e = r.outcome.error.as_ref().unwrap();
        assert!(e.value.contains("no-such-package"), "{e:?}");
        assert_eq!(r.stdout, "");
        let r = run(&h.client, &id, "await import('no-such-package')").await;
        assert!(r.outcome.error.as_ref().is_some_and(|e| e.value.contains("no-such-package")), "{r:?}");
    });
}

/// A TypeScript context is a JavaScript one whose cells lose their types first (no checking, as
/// E2B's kernel): imports a cell does not use stay for later cells, type-only ones go, errors
/// point at the cell's own lines, and the flag that makes the driver strip types is not in
/// user code's argv.
#[test]
fn typescript_cells_lose_their_types_and_keep_their_lines() {
    let h = harness();
    rt().block_on(async {
        let id = &context_of(&h.client, "typescript").await;
        let cells = [
            ("interface P { x: number }\nconst p: P = { x: 40 }\nimport { join } from 'path'\nimport type { Stats } from 'fs'\nenum Color { Red, Green }\nconst message: string = 'Hello, World!'; console.log(message)", "Hello, World!\n", None),
            ("p.x + Color.Green + (join('a', 'b') === 'a/b' ? 1 : 0)", "", Some("42")),
            ("const v: number = await Promise.resolve<number>(20)\nv + 1", "", Some("21")),
            ("function id<T>(x: T): T { return x }\nid<string>('unchecked') as unknown as number", "", Some("'unchecked'")),
            ("class A { constructor(private x: number) {} get(): number { return this.x } }\nnew A(7).get()", "", Some("7")),
            ("process.argv.includes('typescript')", "", Some("false")),
        ];
        for (code, stdout, text) in cells {
            let r = run(&h.client, id, code).await;
            assert!(r.outcome.error.is_none(), "{code}: {r:?}");
            assert_eq!((r.stdout.as_str(), r.text()), (stdout, text), "{code}");
        }
        let code = "interface Q {\n  y: string\n}\ntype R = number\nfunction boom(): R {\n  throw new Error('boom')\n}\nboom()";
        let r = run(&h.client, id, code).await;
        let e = r.outcome.error.as_ref().expect("an error");
        assert_eq!((e.name.as_str(), e.value.as_str()), ("Error", "boom"));
        assert!(e.traceback.contains(">:6:"), "the cell's line 6, not the JavaScript's 2: {e:?}");
        let r = run(&h.client, id, "let a: number = ;").await;
        let e = r.outcome.error.as_ref().expect("an error");
        assert_eq!(e.name, "SyntaxError", "{e:?}");
        assert!(e.traceback.contains(">:1\nlet a: number = ;\n"), "{e:?}");
        assert_eq!(run(&h.client, id, "p.x").await.ok().text(), Some("40"));
    });
}

/// A bash context is one long-lived shell: variables, functions and the directory persist; a
/// failing last command is the run's error; a run's own variables are put back; a cancelled
/// run ends without ending the shell; processes it leaves behind do not hold the shell's
/// control channel.
#[test]
fn bash_contexts_keep_their_shell() {
    let h = harness();
    rt().block_on(async {
        let id = &context_of(&h.client, "bash").await;
        let r = run(
            &h.client,
            id,
            "x=41; f() { echo \"f:$1\"; }; cd /; echo hi; echo err >&2",
        )
        .await
        .ok();
        assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("hi\n", "err\n"));
        assert!(r.outcome.results.is_empty(), "{r:?}");
        let r = run(&h.client, id, "f $((x + 1)); pwd").await.ok();
        assert_eq!(r.stdout, "f:42\n/\n");
        let r = run(&h.client, id, "ls /nonexistent-dir 2>/dev/null").await;
        let e = r
            .outcome
            .error
            .as_ref()
            .expect("a failed last command is an error");
        assert_eq!((e.name.as_str(), e.value.as_str()), ("ExitCode", "2"));
        let env = [("RUN_VAR", "for this run"), ("x", "shadowed")];
        let r = run_with_env(&h.client, id, "echo \"$RUN_VAR/$x\"", &env)
            .await
            .ok();
        assert_eq!(r.stdout, "for this run/shadowed\n");
        let r = run(&h.client, id, "echo \"${RUN_VAR:-unset}/$x\"")
            .await
            .ok();
        assert_eq!(r.stdout, "unset/41\n");
        // Quotes, newlines and non-ASCII reach the shell as they are.
        let r = run(&h.client, id, "printf '%s|' \"a 'b'\" \"é\\\"\"\necho")
            .await
            .ok();
        assert_eq!(r.stdout, "a 'b'|é\"|\n");
        assert_eq!(
            agent_code(try_run(&h.client, id, "echo a\0b", Some(30_000)).await),
            ErrorCode::InvalidRequest
        );
        // Left running in the background, a process does not keep the run from ending.
        run(&h.client, id, "sleep 60 &").await.ok();
        // A cancelled run ends by interrupt and the shell lives on, also when its command
        // misses the first SIGINT (as one does that bash is just forking when it arrives): here
        // a command that swallows the first.
        let swallows_one = "/usr/bin/python3 -c \"import signal, time\n\
            signal.signal(signal.SIGINT, lambda *a: signal.signal(signal.SIGINT, signal.SIG_DFL))\n\
            print('ready', flush=True); time.sleep(60)\"";
        for code in ["echo ready; sleep 60; echo never", swallows_one] {
            let r = abandon_then_run(&h.client, id, code, "echo $x").await;
            assert_eq!(r.stdout, "41\n", "{code}");
        }
        let r = run(&h.client, id, "exit 3").await;
        assert!(
            r.outcome.restarted,
            "exit ends the shell, which starts afresh: {r:?}"
        );
        let r = run(&h.client, id, "echo \"${x:-gone}\"").await.ok();
        assert_eq!(r.stdout, "gone\n");
    });
}

/// A Java context is one JShell: declarations persist; an expression's value is the run's
/// result (a string as it is, not as a literal); compile errors and exceptions are the run's
/// error; the environment is in the system properties, a run's own only for that run (as
/// E2B's Java kernel); a cancelled run stops without ending the JVM.
#[test]
fn java_contexts_keep_their_jshell() {
    let h = harness();
    rt().block_on(async {
        let id = &context_of(&h.client, "java").await;
        let code = "int x = 41;\n\
                    String greet(String who) { return \"hi \" + who; }\n\
                    System.out.println(\"out\"); System.err.println(\"err\");";
        let r = run(&h.client, id, code).await.ok();
        assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("out\n", "err\n"));
        assert!(
            r.outcome.results.is_empty(),
            "declarations and statements have no value: {r:?}"
        );
        let r = run(&h.client, id, "x + 1").await.ok();
        assert_eq!(r.text(), Some("42"));
        let r = run(&h.client, id, "greet(\"é\\\"\\n\") + x").await.ok();
        assert_eq!(r.text(), Some("hi é\"\n41"));
        let r = run(&h.client, id, "int[] a = new int[2];\na[5]").await;
        assert_eq!(
            r.error_name(),
            Some("java.lang.ArrayIndexOutOfBoundsException")
        );
        let e = r.outcome.error.as_ref().unwrap();
        assert_eq!(e.value, "Index 5 out of bounds for length 2");
        let r = run(&h.client, id, "x +\nnope").await;
        assert_eq!(r.error_name(), Some("CompilationException"));
        assert!(
            r.outcome
                .error
                .as_ref()
                .unwrap()
                .value
                .contains("cannot find symbol"),
            "{r:?}"
        );
        let env = [("RUN_PROP", "for this run")];
        let read = "System.getProperty(\"RUN_PROP\")";
        let r = run_with_env(&h.client, id, read, &env).await.ok();
        assert_eq!(r.text(), Some("for this run"));
        let read =
            "System.getProperty(\"RUN_PROP\", \"unset\") + System.getProperty(\"HOME\").isEmpty()";
        let r = run(&h.client, id, read).await.ok();
        assert_eq!(
            r.text(),
            Some("unsetfalse"),
            "the context's environment is there too"
        );
        assert_eq!(
            agent_code(try_run(&h.client, id, "1\0", Some(30_000)).await),
            ErrorCode::InvalidRequest
        );
        let code = "long n = 0;\nwhile (true) { if (++n == 1000) System.out.println(\"ready\"); }";
        let r = abandon_then_run(&h.client, id, code, "n >= 1000 && x == 41").await;
        assert_eq!(r.text(), Some("true"), "the loop stopped: {r:?}");
    });
}

/// An R context is one R session: objects and functions persist; each top-level value is
/// printed as at R's prompt, the last one's printed form being the run's result; an error is
/// the run's error as R says it; a run's own variables are put back; a cancelled run is
/// interrupted without ending R.
#[test]
fn r_contexts_keep_their_session() {
    let h = harness();
    rt().block_on(async {
        let id = &context_of(&h.client, "r").await;
        let r = run(
            &h.client,
            id,
            "x <- 1:3\nf <- function(v) v * 2\nf(x)\nprint(\"hi\")\nmessage(\"err\")",
        )
        .await
        .ok();
        assert_eq!(
            (r.stdout.as_str(), r.stderr.as_str()),
            ("[1] 2 4 6\n[1] \"hi\"\n", "err\n")
        );
        assert!(
            r.outcome.results.is_empty(),
            "print() returns invisibly: {r:?}"
        );
        let r = run(&h.client, id, "sum(f(x))").await.ok();
        assert_eq!(r.text(), Some("[1] 12"));
        let r = run(&h.client, id, "'é\"'").await.ok();
        assert_eq!(r.text(), Some("[1] \"é\\\"\""));
        let r = run(&h.client, id, "g <- function() stop('boom')\ng()").await;
        let e = r.outcome.error.as_ref().expect("an error");
        assert_eq!(
            (e.name.as_str(), e.value.as_str(), e.traceback.as_str()),
            ("Error", "boom", "Error in g() : boom")
        );
        let r = run(&h.client, id, "stop('top')").await;
        assert_eq!(r.outcome.error.as_ref().unwrap().traceback, "Error: top");
        assert_eq!(
            run(&h.client, id, "f(").await.error_name(),
            Some("SyntaxError")
        );
        // A large cell arrives whole and at once (its size first; byte by byte, appended,
        // it took minutes).
        let big = format!("big <- \"{}\"\nnchar(big)", "é".repeat(200_000));
        assert_eq!(
            run(&h.client, id, &big).await.ok().text(),
            Some("[1] 200000")
        );
        // A print method is user code: its error is the run's, and R lives on.
        let r = run(
            &h.client,
            id,
            "print.bad <- function(x, ...) stop('no print')\nstructure(1, class = 'bad')",
        )
        .await;
        assert_eq!(
            r.outcome.error.as_ref().map(|e| e.value.as_str()),
            Some("no print")
        );
        let env = [("RUN_VAR", "for this run"), ("HOME", "/elsewhere")];
        let r = run_with_env(
            &h.client,
            id,
            "paste(Sys.getenv('RUN_VAR'), Sys.getenv('HOME'))",
            &env,
        )
        .await
        .ok();
        assert_eq!(r.text(), Some("[1] \"for this run /elsewhere\""));
        let r = run(
            &h.client,
            id,
            "c(Sys.getenv('RUN_VAR', 'unset'), Sys.getenv('HOME') != '/elsewhere')",
        )
        .await
        .ok();
        assert_eq!(r.text(), Some("[1] \"unset\" \"TRUE\" "));
        let looping = "n <- 0\nrepeat { n <- n + 1; if (n == 1000) cat('ready\\n') }";
        let r = abandon_then_run(&h.client, id, looping, "n >= 1000 && sum(x) == 6").await;
        assert_eq!(r.text(), Some("[1] TRUE"), "the loop stopped: {r:?}");
    });
}

/// A create that names its context is idempotent: the context of that id is answered as it
/// is, state and all, and a different language for the id is refused.
#[test]
fn a_named_create_finds_the_context_it_made() {
    let h = harness();
    rt().block_on(async {
        let named = |language: &str, cwd: &str| ToAgent::ContextCreate {
            language: language.into(),
            cwd: Some(cwd.into()),
            env: Vec::new(),
            context_id: Some("default".into()),
        };
        let Ok(FromAgent::Context(first)) = one(&h.client, named("python", "/tmp")).await else {
            panic!("named create failed");
        };
        assert_eq!(
            (first.context_id.as_str(), first.cwd.as_str()),
            ("default", "/tmp")
        );
        run(&h.client, "default", "x = 41").await.ok();
        let Ok(FromAgent::Context(again)) = one(&h.client, named("python", "/")).await else {
            panic!("second named create failed");
        };
        assert_eq!((again.cwd.as_str(), again.execution_count), ("/tmp", 1));
        let read = "import os; print(os.getcwd(), x + 1)";
        assert_eq!(
            run(&h.client, "default", read).await.ok().stdout,
            "/tmp 42\n"
        );
        assert_eq!(
            agent_code(one(&h.client, named("node", "/tmp")).await),
            ErrorCode::InvalidRequest
        );
        assert_eq!(list(&h.client).await.len(), 1);
    });
}

/// Variables given with a run exist for that run only; what the context had before comes back.
#[test]
fn per_run_environment_is_set_and_restored() {
    let h = harness();
    rt().block_on(async {
        for (language, set_before, read) in [
            (
                "python",
                "import os; os.environ['KEPT'] = 'before'",
                "import os; print(os.environ.get('ONLY_RUN'), os.environ.get('KEPT'))",
            ),
            (
                "javascript",
                "process.env.KEPT = 'before'",
                "console.log(String(process.env.ONLY_RUN), String(process.env.KEPT))",
            ),
        ] {
            let id = create(&h.client, language).await.context_id;
            run(&h.client, &id, set_before).await.ok();
            let env = [("ONLY_RUN", "1"), ("KEPT", "during")];
            let r = run_with_env(&h.client, &id, read, &env).await.ok();
            let null = if language == "python" {
                "None"
            } else {
                "undefined"
            };
            assert_eq!(r.stdout, "1 during\n", "{language}");
            let r = run(&h.client, &id, read).await.ok();
            assert_eq!(r.stdout, format!("{null} before\n"), "{language}");
        }
    });
}

/// A traced run gets its context as `TRACEPARENT` for that run only (a value the run's own
/// environment names wins), and its timing covers the interpreter's work.
#[test]
fn a_traced_run_sees_its_context_and_is_timed() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        let trace = TraceContext {
            trace_id: [0xab; 16],
            span_id: [0x12; 8],
            sampled: true,
        };
        let read = "import os, time; time.sleep(0.2); print(os.environ.get('TRACEPARENT'))";
        let r = try_run_with_env(&h.client, &id, read, Some(30_000), &[], Some(trace))
            .await
            .unwrap()
            .ok();
        assert_eq!(r.stdout.trim(), trace.traceparent());
        let t = r.outcome.timing;
        assert!(t.run_us >= 200_000, "{t:?}");
        assert!(t.run_us < 30_000_000 && t.spawn_us < 30_000_000, "{t:?}");
        let own = [("TRACEPARENT", "mine")];
        let r = try_run_with_env(&h.client, &id, read, Some(30_000), &own, Some(trace))
            .await
            .unwrap()
            .ok();
        assert_eq!(r.stdout, "mine\n");
        let r = run(&h.client, &id, read).await.ok();
        assert_eq!(r.stdout, "None\n");
    });
}

#[test]
fn node_keeps_let_bindings_between_runs() {
    let h = harness();
    rt().block_on(async {
        let c = create(&h.client, "javascript").await;
        assert_eq!(c.language, "node");
        let id = c.context_id;
        let r = run(&h.client, &id, "let x = 1").await.ok();
        assert!(r.main().is_none(), "{r:?}");
        let r = run(&h.client, &id, "x + 1").await.ok();
        assert_eq!(
            (r.text(), r.main().and_then(|m| m.json.as_deref())),
            (Some("2"), Some("2"))
        );
        let r = run(
            &h.client,
            &id,
            "const o = {a: [1, 2]}; console.log('hi'); console.error('e'); o",
        )
        .await
        .ok();
        assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("hi\n", "e\n"));
        assert_eq!(
            r.main().and_then(|m| m.json.as_deref()),
            Some(r#"{"a":[1,2]}"#)
        );
        let r = run(
            &h.client,
            &id,
            "await new Promise(r => setTimeout(r, 10)); 'later'",
        )
        .await;
        assert!(r.outcome.error.is_none(), "top-level await: {r:?}");
        let r = run(&h.client, &id, "Promise.resolve(o.a.length)")
            .await
            .ok();
        assert_eq!(r.text(), Some("2"), "a promise value is awaited");
        let r = run(&h.client, &id, "function f() { null.foo }\nf()").await;
        let e = r.outcome.error.as_ref().expect("an error");
        assert_eq!(e.name, "TypeError");
        assert!(e.traceback.contains("<cell 6>"), "{e:?}");
        assert!(!e.traceback.contains("node:vm"), "{e:?}");
        let r = run(
            &h.client,
            &id,
            "require('child_process').execSync('echo sub', {stdio: 'inherit'}); x",
        )
        .await
        .ok();
        assert_eq!((r.stdout.as_str(), r.text()), ("sub\n", Some("1")));

        let r = try_run(&h.client, &id, "while (true) {}", Some(500))
            .await
            .unwrap();
        assert!(r.outcome.timed_out && r.outcome.restarted);
        let r = run(&h.client, &id, "typeof x").await.ok();
        assert_eq!(r.text(), Some("'undefined'"));
    });
}

#[test]
fn output_of_child_processes_is_captured() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        let r = run(
            &h.client,
            &id,
            "import os, subprocess\nos.system('echo hi')\nsubprocess.run(['sh', '-c', 'echo err >&2'])\nos.write(1, b'raw\\n');",
        )
        .await
        .ok();
        assert_eq!(r.stdout, "hi\nraw\n");
        assert_eq!(r.stderr, "err\n");
    });
}

#[test]
fn delete_kills_the_interpreter() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        let r = run(&h.client, &id, "import os\nos.getpid()").await.ok();
        let pid: i32 = r.text().unwrap().parse().unwrap();
        assert!(alive(pid));
        assert_eq!(
            one(
                &h.client,
                ToAgent::ContextDelete {
                    context_id: id.clone()
                }
            )
            .await
            .unwrap(),
            FromAgent::Done
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(pid) {
            assert!(
                Instant::now() < deadline,
                "interpreter {pid} survived delete"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(list(&h.client).await.is_empty());
        assert_eq!(
            agent_code(try_run(&h.client, &id, "1", None).await),
            ErrorCode::NotFound
        );
        assert_eq!(
            agent_code(one(&h.client, ToAgent::ContextDelete { context_id: id }).await),
            ErrorCode::NotFound
        );
    });
}

/// Running and not a zombie.
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|rest| rest.trim_start().chars().next())
        })
        .flatten()
        .is_some_and(|state| state != 'Z' && state != 'X')
}

#[test]
fn restart_starts_afresh() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        run(&h.client, &id, "z = 1").await.ok();
        let info = match one(
            &h.client,
            ToAgent::ContextRestart {
                context_id: id.clone(),
            },
        )
        .await
        {
            Ok(FromAgent::Context(info)) => info,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            (info.context_id.as_str(), info.execution_count),
            (id.as_str(), 0)
        );
        let r = run(&h.client, &id, "'z' in globals()").await.ok();
        assert_eq!(r.text(), Some("False"));
        assert!(!r.outcome.restarted, "an asked-for restart is not news");
    });
}

#[test]
fn a_cancelled_run_is_interrupted_and_the_state_kept() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        run(&h.client, &id, "kept = 7").await.ok();
        // The output says the sleep has begun.
        let code = "import time\nprint('ready', flush=True)\ntime.sleep(60)";
        let began = Instant::now();
        let r = abandon_then_run(&h.client, &id, code, "kept").await;
        // Not queued behind the sleep (60 s).
        assert!(began.elapsed() < Duration::from_secs(30));
        assert_eq!(r.text(), Some("7"));
    });
}

#[test]
fn the_default_context_is_python_and_made_on_first_use() {
    let h = harness();
    rt().block_on(async {
        assert!(list(&h.client).await.is_empty());
        let r = run(&h.client, "default", "import sys\nsys.version_info[0]")
            .await
            .ok();
        assert_eq!(r.text(), Some("3"));
        let r = run(&h.client, "default", "sys.version_info[0] * 2")
            .await
            .ok();
        assert_eq!(r.text(), Some("6"));
        let all = list(&h.client).await;
        assert_eq!(all.len(), 1);
        assert_eq!(
            (all[0].context_id.as_str(), all[0].language.as_str()),
            ("default", "python")
        );
    });
}

#[test]
fn bad_requests_get_typed_errors() {
    let h = harness();
    rt().block_on(async {
        let r = one(&h.client, create_msg("cobol")).await;
        assert_eq!(agent_code(r), ErrorCode::InvalidRequest);
        assert_eq!(
            agent_code(try_run(&h.client, "nope", "1", None).await),
            ErrorCode::NotFound
        );
        let r = one(
            &h.client,
            ToAgent::ContextRestart {
                context_id: "nope".into(),
            },
        )
        .await;
        assert_eq!(agent_code(r), ErrorCode::NotFound);
        let id = create(&h.client, "python").await.context_id;
        for bad in [("", "x"), ("A=B", "x"), ("A", "nul\0")] {
            assert_eq!(
                agent_code(try_run_with_env(&h.client, &id, "1", None, &[bad], None).await),
                ErrorCode::InvalidRequest,
                "{bad:?}"
            );
        }
        let big = "#".repeat(MAX_CODE_BYTES + 1);
        assert_eq!(
            agent_code(try_run(&h.client, &id, &big, None).await),
            ErrorCode::TooLarge
        );
        for _ in 1..MAX_CONTEXTS {
            create(&h.client, "python").await;
        }
        let r = one(&h.client, create_msg("python")).await;
        assert_eq!(agent_code(r), ErrorCode::InvalidRequest);
        assert_eq!(list(&h.client).await.len(), MAX_CONTEXTS);
    });
}

#[test]
fn rich_outputs_stay_within_one_frame() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        let r = run(
            &h.client,
            &id,
            "class H:\n    def __init__(self, n): self.n = n\n    def _repr_html_(self): return '<p>' + 'y' * self.n + '</p>'\n\
             display(H(3))\nfor _ in range(6):\n    display(H(300_000))\nH(2_000_000)",
        )
        .await
        .ok();
        let results = &r.outcome.results;
        assert_eq!(results.len(), 8, "{:?}", results.iter().map(|r| r.text.clone()).collect::<Vec<_>>());
        assert_eq!(results[0].html.as_deref(), Some("<p>yyy</p>"));
        assert!(results[1].html.is_some() && results[2].html.is_some());
        let omitted = results.iter().filter(|r| r.text.as_deref().is_some_and(|t| t.contains("omitted"))).count();
        assert!(omitted >= 4, "over-budget outputs become notes");
        assert!(results[7].is_main_result);
        let total: usize = results.iter().map(|r| r.html.as_ref().map_or(0, String::len)).sum();
        assert!(total < 1 << 20);
        // The connection survived the big run.
        assert_eq!(run(&h.client, &id, "2").await.text(), Some("2"));
    });
}

fn b64decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=' && c != b'\n').collect();
    let mut out = Vec::new();
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= u32::from(val(c)) << (18 - 6 * i);
        }
        let n = chunk.len() * 6 / 8;
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + n]);
    }
    out
}

const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];

#[test]
fn matplotlib_figures_come_back_as_png() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        let r = run(
            &h.client,
            &id,
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()\nplt.figure()\nplt.bar([1, 2], [3, 4]);",
        )
        .await
        .ok();
        let pngs: Vec<&str> = r
            .outcome
            .results
            .iter()
            .filter_map(|r| r.png.as_deref())
            .collect();
        assert_eq!(pngs.len(), 2, "one shown, one left open: {r:?}");
        for png in pngs {
            assert_eq!(b64decode(png)[..8], PNG_SIGNATURE);
        }
        assert!(r.main().is_none(), "a trailing ';' hides the value");
        assert!(r.stderr.is_empty(), "{}", r.stderr);
        let r = run(&h.client, &id, "len(plt.get_fignums())").await.ok();
        assert_eq!(r.text(), Some("0"), "figures are closed once shown");
    });
}

/// The chart of the result a figure is shown as, parsed.
fn chart_of(r: &Ran, i: usize) -> serde_json::Value {
    let chart = r.outcome.results[i].chart.as_deref();
    serde_json::from_str(chart.unwrap_or_else(|| panic!("result {i} has no chart: {r:?}"))).unwrap()
}

/// A shown figure carries, beside its PNG, the chart it draws in E2B's `chart` format: the
/// kind (from the artists on its axes), title, labels with their units, scales (dates and
/// categories included), ticks, and each kind's data; a figure of several axes is a
/// superchart; a box plot's statistics are the ones it was drawn from.
#[test]
fn matplotlib_figures_carry_the_chart_they_draw() {
    let h = harness();
    rt().block_on(async {
        let id = context_of(&h.client, "python").await;
        let code = "import matplotlib.pyplot as plt, datetime\n\
                    days = [datetime.date(2024, 1, d) for d in (1, 2, 3)]\n\
                    plt.plot(days, [1, 2, float('nan')], label='temp')\n\
                    plt.xlabel('Day'); plt.ylabel('Heat (°C)'); plt.title('Week')\n\
                    plt.show()\n\
                    plt.bar(['a', 'b'], [3, 4], label='sold'); plt.show()\n\
                    plt.pie([90, 10], labels=['no', 'yes']); plt.show()\n\
                    plt.boxplot([[85, 90, 78, 92, 88], [95, 89, 76, 91, 84, 87]]); plt.show()\n\
                    fig, (l, r) = plt.subplots(1, 2); fig.suptitle('Both')\n\
                    l.plot([0, 1], [1, 0]); r.scatter([1, 2], [3, 4], label='dots'); r.set_yscale('log')\n\
                    plt.show()";
        let r = run(&h.client, &id, code).await.ok();
        assert_eq!(r.outcome.results.len(), 5, "{r:?}");
        let line = chart_of(&r, 0);
        let want = serde_json::json!({"type": "line", "title": "Week", "x_label": "Day",
            "y_label": "Heat (°C)", "x_unit": null, "y_unit": "°C", "x_scale": "datetime",
            "y_scale": "linear"});
        for (k, v) in want.as_object().unwrap() {
            assert_eq!(&line[k], v, "{k}: {line}");
        }
        assert_eq!(line["elements"][0]["label"], "temp");
        assert_eq!(
            line["elements"][0]["points"],
            serde_json::json!([["2024-01-01T00:00:00+00:00", 1.0],
                ["2024-01-02T00:00:00+00:00", 2.0], ["2024-01-03T00:00:00+00:00", null]])
        );
        let ticks = line["x_ticks"].as_array().unwrap();
        assert!(ticks.iter().all(|t| t.as_str().is_some_and(|t| t.starts_with("2024-01-"))), "{line}");
        assert_eq!(line["x_tick_labels"].as_array().unwrap().len(), ticks.len());
        assert!(line["x_tick_labels"].as_array().unwrap().iter().any(|t| t != ""), "drawn labels");
        assert_eq!(
            chart_of(&r, 1)["elements"],
            serde_json::json!([{"label": "a", "group": "sold", "value": 3.0},
                {"label": "b", "group": "sold", "value": 4.0}])
        );
        let pie = chart_of(&r, 2);
        assert_eq!(pie["type"], "pie");
        assert_eq!(
            pie["elements"],
            serde_json::json!([{"label": "no", "angle": 324.0, "radius": 1.0},
                {"label": "yes", "angle": 36.0, "radius": 1.0}])
        );
        let boxes = chart_of(&r, 3);
        assert_eq!(boxes["type"], "box_and_whisker");
        assert_eq!(
            boxes["elements"][1],
            serde_json::json!({"label": "2", "min": 84.0, "first_quartile": 84.75,
                "median": 88.0, "third_quartile": 90.5, "max": 95.0, "outliers": [76.0]})
        );
        let both = chart_of(&r, 4);
        assert_eq!((&both["type"], &both["title"]), (&"superchart".into(), &"Both".into()));
        let kinds: Vec<_> = both["elements"].as_array().unwrap().iter().map(|c| (c["type"].clone(), c["y_scale"].clone())).collect();
        assert_eq!(kinds, [("line".into(), "linear".into()), ("scatter".into(), "log".into())]);
        assert_eq!(both["elements"][1]["elements"][0]["points"], serde_json::json!([[1.0, 3.0], [2.0, 4.0]]));
        // A plot cleared of its boxes is a chart of what is left; a figure too large to be
        // worth its room keeps its PNG alone.
        let code = "ax = plt.gca(); ax.boxplot([[1, 2, 3]]); ax.clear(); ax.plot([1, 2]); plt.show()\n\
                    plt.plot(range(200_000)); plt.show()";
        let r = run(&h.client, &id, code).await.ok();
        assert_eq!(chart_of(&r, 0)["type"], "line");
        assert!(r.outcome.results[1].png.is_some() && r.outcome.results[1].chart.is_none());
    });
}

#[test]
fn pandas_dataframes_come_back_as_html_text_and_columns() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        let code = "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', None], \
                    'c': [float('nan'), 0.5], 't': pd.to_datetime(['2026-01-02', None])})";
        let r = run(&h.client, &id, code).await.ok();
        let m = r.main().expect("a value");
        assert!(m.html.as_deref().unwrap().contains("<table"), "{m:?}");
        let text = m.text.as_deref().unwrap();
        assert!(text.contains('a') && text.contains('x'), "{text}");
        let data: serde_json::Value = serde_json::from_str(m.data.as_deref().unwrap()).unwrap();
        assert_eq!(
            data,
            serde_json::json!({"a": [1, 2], "b": ["x", null], "c": [null, 0.5],
                               "t": ["2026-01-02T00:00:00", null]})
        );
        let r = run(&h.client, &id, "[1, 2]").await.ok();
        assert_eq!(
            r.main().and_then(|m| m.data.as_deref()),
            None,
            "only tables"
        );
        // A large table keeps its html and text; only the columns are left out.
        let r = run(&h.client, &id, "pd.DataFrame({'a': range(200_000)})")
            .await
            .ok();
        let m = r.main().expect("a value");
        assert!(
            m.html.as_deref().is_some_and(|h| h.contains("<table")),
            "{m:?}"
        );
        assert!(m.text.is_some() && m.data.is_none(), "{m:?}");
    });
}

/// IPython's display API works without IPython in the image: its display objects and raw MIME
/// bundles come back as the representations they stand for.
#[test]
fn ipython_display_objects_come_back_without_ipython() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        let code = r#"import IPython
from IPython.display import display, HTML, Markdown, Image, Latex, JSON, clear_output
display(HTML('<b>x</b>'), Markdown('**m**'))
display({'text/latex': r'\text{A}'}, raw=True)
display(JSON({'k': [1]}), Latex('$y$'))
clear_output()
assert IPython.get_ipython().user_ns is globals()
Image(data=b'\x89PNG-bytes')"#;
        let r = run(&h.client, &id, code).await.ok();
        let got: Vec<_> = r
            .outcome
            .results
            .iter()
            .map(|m| {
                let formats = [
                    ("html", &m.html),
                    ("markdown", &m.markdown),
                    ("latex", &m.latex),
                    ("json", &m.json),
                    ("png", &m.png),
                ];
                formats
                    .into_iter()
                    .filter_map(|(k, v)| v.as_deref().map(|v| format!("{k}={v}")))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        assert_eq!(
            got,
            [
                "html=<b>x</b>",
                "markdown=**m**",
                "latex=\\text{A}",
                r#"json={"k": [1]}"#,
                "latex=$y$",
                "png=iVBORy1ieXRlcw==",
            ],
            "{r:?}"
        );
        assert!(r.outcome.results[5].is_main_result);
    });
}

/// LaTeX and JPEG representations come back as such, from `_repr_*_` methods and from
/// displayed MIME bundles alike.
#[test]
fn latex_and_jpeg_representations_come_back() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        let code = "class Formula:\n    def _repr_latex_(self): return r'$x^2$'\n\
                    class Photo:\n    def _repr_mimebundle_(self, **kw): \
                    return {'image/jpeg': b'\\xff\\xd8', 'text/plain': 'photo'}\n\
                    display(Photo())\nFormula()";
        let r = run(&h.client, &id, code).await.ok();
        let shown = &r.outcome.results;
        assert_eq!(shown.len(), 2, "{r:?}");
        assert_eq!(
            (shown[0].jpeg.as_deref(), shown[0].text.as_deref()),
            (Some("/9g="), Some("photo"))
        );
        assert_eq!(shown[1].latex.as_deref(), Some("$x^2$"));
    });
}

/// PDF and JavaScript representations come back as their own fields, and the other MIME
/// types of a bundle (Plotly's) together as `extra`, in both Python and JavaScript contexts.
#[test]
fn pdf_javascript_and_other_mime_types_come_back() {
    let h = harness();
    rt().block_on(async {
        let py = create(&h.client, "python").await.context_id;
        let code = "from IPython.display import Javascript\n\
                    class Doc:\n    def _repr_pdf_(self): return b'%PDF-1.4'\n\
                    class Plot:\n    def _repr_mimebundle_(self, **kw): \
                    return {'application/vnd.plotly.v1+json': {'data': [{'y': [1, 2]}]}, 'text/html': '<div/>'}\n\
                    display(Doc(), Javascript('console.log(1)'))\nPlot()";
        let r = run(&h.client, &py, code).await.ok();
        let shown = &r.outcome.results;
        assert_eq!(shown.len(), 3, "{r:?}");
        assert_eq!(shown[0].pdf.as_deref(), Some("JVBERi0xLjQ="));
        assert_eq!(shown[1].javascript.as_deref(), Some("console.log(1)"));
        assert_eq!(shown[2].html.as_deref(), Some("<div/>"));
        let extra: serde_json::Value = serde_json::from_str(shown[2].extra.as_deref().unwrap()).unwrap();
        assert_eq!(extra, serde_json::json!({"application/vnd.plotly.v1+json": {"data": [{"y": [1, 2]}]}}));
        assert!(shown[..2].iter().all(|r| r.extra.is_none()), "{r:?}");

        let js = create(&h.client, "javascript").await.context_id;
        let code = "display({'application/javascript': 'alert(1)', 'application/x-custom': {a: 1}, 'text/plain': 'both'})\n\
                    display({ plain: 'object' })";
        let r = run(&h.client, &js, code).await.ok();
        let shown = &r.outcome.results;
        assert_eq!(shown.len(), 2, "{r:?}");
        assert_eq!((shown[0].javascript.as_deref(), shown[0].text.as_deref()), (Some("alert(1)"), Some("both")));
        assert_eq!(shown[0].extra.as_deref(), Some(r#"{"application/x-custom":{"a":1}}"#));
        assert_eq!((shown[1].extra.as_deref(), shown[1].text.as_deref()), (None, Some("{ plain: 'object' }")));
    });
}

/// Plotly figures shown or left as a cell's value are results (Plotly's JSON under `extra`,
/// HTML drawing it with plotly.js from the CDN), as in E2B's kernels; a renderer the code
/// names itself is still Plotly's.
#[test]
fn plotly_figures_are_results() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        let code = "import plotly.graph_objects as go\n\
                    fig = go.Figure(go.Bar(x=['a', 'b'], y=[1, 2]))\nfig.show()\nfig";
        let r = run(&h.client, &id, code).await.ok();
        let shown = &r.outcome.results;
        assert_eq!(shown.len(), 2, "{r:?}");
        for result in shown {
            let extra: serde_json::Value =
                serde_json::from_str(result.extra.as_deref().unwrap()).unwrap();
            let figure = &extra["application/vnd.plotly.v1+json"];
            assert_eq!(
                (&figure["data"][0]["type"], &figure["data"][0]["y"]),
                (&serde_json::json!("bar"), &serde_json::json!([1, 2])),
                "{extra}"
            );
            let html = result.html.as_deref().unwrap();
            assert!(
                html.contains("https://cdn.plot.ly/") && html.contains("Plotly.newPlot"),
                "{html}"
            );
        }
        assert!(!shown[0].is_main_result && shown[1].is_main_result);
        assert!(
            shown[1].text.as_deref().unwrap().starts_with("Figure("),
            "{r:?}"
        );
        assert_eq!(r.stdout, "");
        // Named by the code, Plotly's own renderer: its JSON MIME type alone.
        let r = run(&h.client, &id, "fig.show(renderer='plotly_mimetype')")
            .await
            .ok();
        let shown = &r.outcome.results;
        assert_eq!((shown.len(), shown[0].html.is_none()), (1, true), "{r:?}");
        assert!(
            shown[0].extra.as_deref().unwrap().contains("\"bar\""),
            "{r:?}"
        );
    });
}

/// R plots become PNG results of the run that drew them, one per page and before the run's
/// value, as in E2B's R kernel; a run that draws nothing has none, and a run that fails keeps
/// what it drew.
#[test]
fn r_plots_are_results() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "r").await.context_id;
        let r = run(&h.client, &id, "plot(1:10)\nhist(c(1, 2, 2, 3))\n1 + 1")
            .await
            .ok();
        let shown = &r.outcome.results;
        assert_eq!(shown.len(), 3, "{r:?}");
        for page in &shown[..2] {
            assert!(!page.is_main_result);
            let png = b64decode(page.png.as_deref().unwrap());
            assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
            // 7 inches square at 120 dpi: width and height in the IHDR chunk.
            assert_eq!(
                (&png[16..20], &png[20..24]),
                (&840u32.to_be_bytes()[..], &840u32.to_be_bytes()[..])
            );
        }
        assert_eq!(shown[2].text.as_deref(), Some("[1] 2"));
        let r = run(&h.client, &id, "x <- 3\nx").await.ok();
        assert_eq!(r.outcome.results.len(), 1, "{r:?}");
        let r = run(&h.client, &id, "barplot(c(a = 1, b = 2))\nstop('late')").await;
        assert_eq!(r.error_name(), Some("Error"));
        assert!(r.outcome.results[0].png.is_some(), "{r:?}");
        // A run drawing many pages gives the first 32 and says how many more there were.
        let r = run(&h.client, &id, "for (i in 1:40) plot(i)").await.ok();
        let shown = &r.outcome.results;
        assert_eq!(shown.len(), 33, "{r:?}");
        assert_eq!(shown[32].text.as_deref(), Some("[8 more plots not shown]"));
        // Nothing went to Rscript's own default device, a PDF file in the working directory.
        let r = run(&h.client, &id, "file.exists('Rplots.pdf')").await.ok();
        assert_eq!(r.text(), Some("[1] FALSE"));
    });
}

/// IPython's magics that notebook code uses work without IPython, as in E2B's kernels:
/// `%matplotlib inline`, `%%writefile` and `%run`, `%cd`/`%pwd`, `x = !cmd`, `%env`, `%time`,
/// `%%time`, `%timeit`, `%%bash`, `%%html`; an unknown one is IPython's `UsageError`.
#[test]
fn python_cells_take_ipython_magics() {
    let h = harness();
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().to_string_lossy().into_owned();
    rt().block_on(async {
        let id = context_in(&h.client, "python", &cwd).await;
        let r = run(&h.client, &id, "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()").await.ok();
        assert!(r.outcome.results[0].png.is_some(), "{r:?}");
        let write = "%%writefile script.py\nimport sys\nanswer = 40 + len(sys.argv)\nprint('ran', sys.argv[1:])\n";
        assert_eq!(run(&h.client, &id, write).await.ok().stdout, "Writing script.py\n");
        assert_eq!(run(&h.client, &id, write).await.ok().stdout, "Overwriting script.py\n");
        let cells = [
            ("%run script.py a\nanswer", "ran ['a']\n".to_string(), Some("42".to_string())),
            ("import os\nos.mkdir('sub')\n%cd sub\nfiles = !ls ..\nprint(files.n)\n%pwd", format!("{cwd}/sub\nscript.py\nsub\n"), Some(format!("'{cwd}/sub'"))),
            ("%env KODER_MAGIC=1\n%env KODER_MAGIC", "env: KODER_MAGIC=1\n".into(), Some("'1'".into())),
            ("%%bash\necho $((6 * 7))", "42\n".into(), None),
            ("(7\n%4)", String::new(), Some("3".into())),
        ];
        for (code, stdout, text) in cells {
            let r = run(&h.client, &id, code).await.ok();
            assert_eq!((r.stdout.as_str(), r.text()), (stdout.as_str(), text.as_deref()), "{code}");
        }
        let r = run(&h.client, &id, "%time x = sum(range(10))\nx").await.ok();
        assert!(r.stdout.starts_with("CPU times: user ") && r.stdout.contains("\nWall time: "), "{r:?}");
        assert_eq!(r.text(), Some("45"));
        let r = run(&h.client, &id, "%%time\ny = 2\ny * 21").await.ok();
        assert!(r.stdout.contains("Wall time: "), "{r:?}");
        assert_eq!(r.text(), Some("42"));
        let r = run(&h.client, &id, "%timeit -n 3 -r 2 sum(range(10))").await.ok();
        assert!(r.stdout.ends_with(" per loop (mean \u{b1} std. dev. of 2 runs, 3 loops each)\n"), "{r:?}");
        let r = run(&h.client, &id, "%pip --version").await.ok();
        assert!(r.stdout.starts_with("pip "), "{r:?}");
        let r = run(&h.client, &id, "%%html\n<b>x</b>").await.ok();
        assert_eq!(r.outcome.results[0].html.as_deref(), Some("<b>x</b>"));
        // The body of a cell magic keeps the cell's line numbers.
        let r = run(&h.client, &id, "%%time\n\n1 / 0").await;
        let e = r.outcome.error.as_ref().unwrap();
        assert_eq!(e.name, "ZeroDivisionError");
        assert!(e.traceback.contains(", line 3"), "{e:?}");
        for (code, value) in [
            ("%nosuch 1", "Line magic function `%nosuch` not found."),
            ("%%nosuch\nx", "Cell magic `%%nosuch` not found."),
        ] {
            let r = run(&h.client, &id, code).await;
            let e = r.outcome.error.as_ref().unwrap();
            assert_eq!((e.name.as_str(), e.value.as_str()), ("UsageError", value), "{code}");
            assert_eq!(e.traceback, format!("UsageError: {value}\n"), "as IPython shows it");
        }
    });
}

/// The rest of what notebooks lean on: `%%capture` keeps a cell's output, its commands' and
/// its results (IPython's CapturedIO) instead of showing them; `%%script` and its kin feed the
/// cell to a program and fail with it; `%config` chooses the figure formats; `%who`,
/// `%reset -f`, shell aliases; and a line starting with a magic's name that is not Python is
/// that magic (`pip show pip`), unless the cell defined that name or the line is in a string.
#[test]
fn python_cells_capture_script_config_and_automagic() {
    let h = harness();
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let id = context_in(&h.client, "python", &dir.path().to_string_lossy()).await;
        let quiet = "%%capture out\nprint('hi')\n!echo from-shell\nimport sys\nprint('e', file=sys.stderr)\ndisplay('shown')\n6 * 7";
        let r = run(&h.client, &id, quiet).await.ok();
        assert_eq!((r.stdout.as_str(), r.stderr.as_str(), r.outcome.results.len()), ("", "", 0), "{r:?}");
        let r = run(&h.client, &id, "print(repr(out.stdout), repr(out.stderr), out.outputs[1].data)").await.ok();
        assert_eq!(r.stdout, "'hi\\nfrom-shell\\n' 'e\\n' {'text/plain': '42'}\n");
        let r = run(&h.client, &id, "out.show()").await.ok();
        assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("hi\nfrom-shell\n", "e\n"));
        let shown: Vec<_> = r.outcome.results.iter().map(|x| x.text.as_deref()).collect();
        assert_eq!(shown, [Some("'shown'"), Some("42")]);
        let r = run(&h.client, &id, "%%capture --no-stderr\nimport sys\nprint('e', file=sys.stderr)\nprint('o')").await.ok();
        assert_eq!((r.stdout.as_str(), r.stderr.as_str()), ("", "e\n"));
        // A failure inside still fails the cell, with the cell's line numbers.
        let r = run(&h.client, &id, "%%capture\nprint('x')\n1 / 0").await;
        let e = r.outcome.error.as_ref().unwrap();
        assert!(e.name == "ZeroDivisionError" && e.traceback.contains(", line 3"), "{e:?}");

        let cells = [
            ("%%script python3 -u\nprint(6 * 7)", "42\n", None),
            ("%%bash --out o --err e\necho hidden\necho oops >&2", "", None),
            ("o, e", "", Some("('hidden\\n', 'oops\\n')")),
            ("%%bash --no-raise-error\nexit 3", "", None),
            ("%reset -f\na = 1\nb = 'x'\n%who", "a\tb\n", None),
            ("%who str", "b\n", None),
            // A regular expression's braces are its own, not an expansion.
            ("yy = 1\n%reset_selective -f ^y{1,2}$\n'yy' in globals()", "", Some("False")),
            ("%mkdir -p d1/d2\n%ls d1", "d2/\n", None),
            ("pip show pip | head -1", "Name: pip\n", None),
            ("text = '''\n%s stays\ncd stays\n'''\n!echo ok\ntext", "ok\n", Some("'\\n%s stays\\ncd stays\\n'")),
        ];
        for (code, stdout, text) in cells {
            let r = run(&h.client, &id, code).await.ok();
            assert_eq!((r.stdout.as_str(), r.text()), (stdout, text), "{code}");
        }
        let r = run(&h.client, &id, "%whos").await.ok();
        assert!(r.stdout.starts_with("Variable   Type   Data/Info\n") && r.stdout.contains("\nb          str    x\n"), "{r:?}");
        run(&h.client, &id, "pip = 1").await.ok();
        for (code, name, value) in [
            ("%%bash\nexit 3", "CalledProcessError", "Command 'exit 3' returned non-zero exit status 3."),
            ("%%script no-such-program\nx", "UsageError", "Couldn't find program: 'no-such-program'"),
            ("%reset", "UsageError", "%reset: add -f (there is no one to confirm the deletion)"),
            ("%config InlineBackend.figure_format = 'gif'", "UsageError", "%config: figure formats are jpeg, jpg, pdf, png, png2x, retina, svg, not gif"),
            ("%config Other.x = 1", "UsageError", "%config: only InlineBackend.figure_format(s) can be set here"),
            // A variable of the magic's name makes the line Python again, as in IPython.
            ("pip show pip", "SyntaxError", "invalid syntax (<cell "),
        ] {
            let r = run(&h.client, &id, code).await;
            let e = r.outcome.error.as_ref().unwrap_or_else(|| panic!("{code}: {r:?}"));
            assert!(e.name == name && e.value.starts_with(value), "{code}: {e:?}");
        }

        let plot = "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()";
        let r = run(&h.client, &id, &format!("%config InlineBackend.figure_formats = {{'svg'}}\n{plot}")).await.ok();
        let fig = &r.outcome.results[0];
        assert!(fig.png.is_none() && fig.svg.as_deref().is_some_and(|s| s.contains("<svg")), "{r:?}");
        let mut widths = Vec::new();
        for format in ["png", "retina"] {
            let r = run(&h.client, &id, &format!("%config InlineBackend.figure_formats = ['{format}']\n{plot}")).await.ok();
            let png = b64decode(r.outcome.results[0].png.as_deref().unwrap());
            widths.push(u32::from_be_bytes(png[16..20].try_into().unwrap()));
        }
        assert!(widths[1] > widths[0] * 19 / 10, "retina is twice the resolution: {widths:?}");
    });
}

/// `%load_ext autoreload` and `%autoreload 2`, the header of many notebooks: a module edited
/// after its import is loaded again before the next cell, and what was imported from it (a
/// function, a class and its instances) runs the new code, even when the edit kept the file's
/// size within the second its bytecode was cached; a module that no longer loads is said on
/// stderr and its old code stays.
#[test]
fn python_autoreload_takes_edited_modules() {
    let h = harness();
    let dir = tempfile::tempdir().unwrap();
    let module = dir.path().join("mymod.py");
    let source = |n: u32, s: &str| {
        format!("def f():\n    return {n}\nclass C:\n    def m(self):\n        return '{s}'\n")
    };
    rt().block_on(async {
        let id = context_in(&h.client, "python", &dir.path().to_string_lossy()).await;
        run(&h.client, &id, "%load_ext autoreload\n%autoreload 2")
            .await
            .ok();
        std::fs::write(&module, source(1, "a")).unwrap();
        let r = run(
            &h.client,
            &id,
            "import mymod\nfrom mymod import f, C\nc = C()\nf(), c.m()",
        )
        .await
        .ok();
        assert_eq!(r.text(), Some("(1, 'a')"));
        std::fs::write(&module, source(2, "b")).unwrap();
        let r = run(&h.client, &id, "f(), c.m(), mymod.f()").await.ok();
        assert_eq!(r.text(), Some("(2, 'b', 2)"));
        std::fs::write(&module, "def f(:\n").unwrap();
        let r = run(&h.client, &id, "f()").await.ok();
        assert_eq!(r.text(), Some("2"));
        assert!(
            r.stderr.starts_with("[autoreload of mymod failed: ")
                && r.stderr.contains("SyntaxError"),
            "{r:?}"
        );
        run(&h.client, &id, "%autoreload 0").await.ok();
        std::fs::write(&module, source(3, "c")).unwrap();
        assert_eq!(run(&h.client, &id, "f()").await.ok().text(), Some("2"));
        let r = run(&h.client, &id, "%load_ext no_such_extension").await;
        assert_eq!(r.error_name(), Some("ModuleNotFoundError"));
    });
}

/// IPython expands a shell line's and a magic's `{expr}` and `$name` in the cell's namespace
/// (`!pip install {pkg}`); text that does not expand (awk's `{print $2}`, a name not defined)
/// is passed on as written; `!!cmd` is the output's lines as the cell's value.
#[test]
fn python_shell_lines_expand_python_values() {
    let h = harness();
    let dir = tempfile::tempdir().unwrap();
    rt().block_on(async {
        let id = context_in(&h.client, "python", &dir.path().to_string_lossy()).await;
        let cells = [
            (
                "pkg = 'pip'\nn = 3\n!echo {pkg} $pkg {n + 1} {{x}} '$pkg'",
                "pip pip 4 {x} $pkg\n",
                None,
            ),
            ("!echo a b | awk '{print $2}'", "b\n", None),
            ("!echo {no_such_name} {pkg}", "{no_such_name} {pkg}\n", None),
            ("x = !echo {n * 2}\nx", "", Some("['6']")),
            ("!!echo one; echo two", "", Some("['one', 'two']")),
            ("%%writefile {pkg}.txt\n{n}\n", "Writing pip.txt\n", None),
            ("open('pip.txt').read()", "", Some("'{n}\\n'")),
        ];
        for (code, stdout, text) in cells {
            let r = run(&h.client, &id, code).await.ok();
            assert_eq!((r.stdout.as_str(), r.text()), (stdout, text), "{code}");
        }
    });
}

/// Notebooks exported as scripts (nbconvert) call `get_ipython()` for their magics and shell
/// lines; cells get a shell that runs them, libraries still get None as outside IPython.
#[test]
fn python_exported_notebooks_call_get_ipython() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        let exported = "get_ipython().run_line_magic('matplotlib', 'inline')\nget_ipython().system('echo sys')\nx = get_ipython().getoutput('echo a; echo b')\nget_ipython().run_cell_magic('bash', '', 'echo cell\\n')\nx";
        let cells = [
            (exported, "sys\ncell\n", "['a', 'b']"),
            ("from IPython import get_ipython as g\ng().push({'pushed': 5})\npushed", "", "5"),
            ("exec(compile('def lib(): return get_ipython()', '/lib.py', 'exec'))\nlib() is None", "", "True"),
        ];
        for (code, stdout, text) in cells {
            let r = run(&h.client, &id, code).await.ok();
            assert_eq!((r.stdout.as_str(), r.text()), (stdout, Some(text)), "{code}");
        }
    });
}

/// IJavascript's `$$`, for code written for E2B's JavaScript kernel: `$$.html()` and its kin
/// are the run's result and end it (its last value is not sent), `$$.async()` keeps the run
/// going until a result, `$$.done()` or `$$.sendError()`, promises are awaited,
/// `$$.display()` sends outputs that are not the result, objects render themselves with
/// `_toHtml()`/`_toMime()`; a run that never ends is ended by its timeout.
#[test]
fn node_cells_take_ijavascript_api() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "javascript").await.context_id;
        let r = run(&h.client, &id, "$$.html('<b>x</b>'); 42").await.ok();
        let shown = &r.outcome.results;
        assert_eq!(shown.len(), 1, "{r:?}");
        assert!(shown[0].is_main_result && shown[0].text.is_none());
        assert_eq!(shown[0].html.as_deref(), Some("<b>x</b>"));
        let r = run(&h.client, &id, "$$.async(); setTimeout(() => $$.sendResult({a: 1}), 50); 7").await.ok();
        assert_eq!((r.outcome.results.len(), r.main().and_then(|m| m.json.as_deref())), (1, Some("{\"a\":1}")), "{r:?}");
        let r = run(&h.client, &id, "$$.png(Promise.resolve('iVBORw0KGgo='))").await.ok();
        assert_eq!(r.main().and_then(|m| m.png.as_deref()), Some("iVBORw0KGgo="));
        let code = "const d = $$.display(); d.html('<i>1</i>'); $$.text('kept', true); $$.json({k: [1]}); 'dropped'";
        let r = run(&h.client, &id, code).await.ok();
        let got: Vec<_> = r
            .outcome
            .results
            .iter()
            .map(|x| (x.is_main_result, x.html.as_deref().or(x.text.as_deref()).or(x.json.as_deref())))
            .collect();
        assert_eq!(got, [(false, Some("<i>1</i>")), (true, Some("kept")), (true, Some("{\"k\":[1]}"))]);
        let code = "class P { _toHtml() { return '<p>P</p>'; } _toMime() { return {'text/markdown': '**P**'}; } }; new P()";
        let r = run(&h.client, &id, code).await.ok();
        let m = r.main().unwrap();
        assert_eq!((m.html.as_deref(), m.markdown.as_deref(), m.text.as_deref()), (Some("<p>P</p>"), Some("**P**"), Some("P {}")));
        for (code, name, value) in [
            ("$$.async(); setTimeout(() => $$.sendError(new TypeError('bad')), 30);", "TypeError", "bad"),
            ("$$.input()", "Error", "$$.input: a run has no one to answer input requests"),
        ] {
            let r = run(&h.client, &id, code).await;
            let e = r.outcome.error.as_ref().unwrap();
            assert_eq!((e.name.as_str(), e.value.as_str()), (name, value), "{code}");
        }
        let r = try_run(&h.client, &id, "$$.async()", Some(500)).await.unwrap();
        assert!(r.outcome.timed_out, "{r:?}");
        assert_eq!(run(&h.client, &id, "1 + 1").await.ok().text(), Some("2"));
    });
}

/// A data frame (or matrix) as an R cell's value is also an HTML and a Markdown table, as
/// IRkernel shows one: a caption, the column types, a long table elided in the middle.
#[test]
fn r_tables_are_html_and_markdown() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "r").await.context_id;
        let r = run(&h.client, &id, "data.frame(a = 1:2, b = c('p', '<q>'))").await.ok();
        let m = r.main().unwrap();
        let md = "A data.frame: 2 \u{d7} 2\n\n| <!--/--> | a &lt;int&gt; | b &lt;chr&gt; |\n|---|---|---|\n| 1 | 1 | p |\n| 2 | 2 | &lt;q&gt; |";
        assert_eq!(m.markdown.as_deref(), Some(md));
        let html = m.html.as_deref().unwrap();
        assert!(html.contains("<tr><th scope=row>2</th><td>2</td><td>&lt;q&gt;</td></tr>"), "{html}");
        let r = run(&h.client, &id, "as.data.frame(matrix(1:3000, 100))").await.ok();
        let md = r.main().unwrap().markdown.clone().unwrap();
        // Caption, blank, header, rule, the first 30 rows, the elision, the last 30.
        assert_eq!(md.lines().count(), 65, "{md}");
        assert!(md.contains("\n| \u{22ee} | \u{22ee} |") && md.contains("| V10 &lt;int&gt; | \u{22ef} | V21 &lt;int&gt; |"), "{md}");
        let r = run(&h.client, &id, "1:3").await.ok();
        assert!(r.main().unwrap().html.is_none());
    });
}

/// `%prun` and `%%prun` profile a statement or a cell with cProfile and print pstats' report,
/// as IPython's do (there in a pager, here on stdout); `-r` gives the stats as the value.
#[test]
fn python_prun_profiles_a_statement() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        run(
            &h.client,
            &id,
            "def fib(n): return n if n < 2 else fib(n - 1) + fib(n - 2)",
        )
        .await
        .ok();
        let r = run(&h.client, &id, "%prun -l 3 fib(15)").await.ok();
        assert!(
            r.stdout.contains(" function calls (")
                && r.stdout.contains("Ordered by: internal time")
                && r.stdout.contains("(fib)"),
            "{r:?}"
        );
        let r = run(&h.client, &id, "%%prun -s cumulative -q -r\nfib(10)")
            .await
            .ok();
        assert!(
            r.stdout.is_empty()
                && r.text()
                    .is_some_and(|t| t.starts_with("<pstats.Stats object")),
            "{r:?}"
        );
        let r = run(&h.client, &id, "%%prun\n\n1 / 0").await;
        let e = r.outcome.error.as_ref().unwrap();
        assert!(
            e.name == "ZeroDivisionError" && e.traceback.contains(", line 3"),
            "{e:?}"
        );
        assert!(
            r.stdout.contains("function calls in"),
            "the report comes even so: {r:?}"
        );
    });
}

/// The rest of `IPython.display` that notebook code reaches for, without IPython: IFrame,
/// FileLink, Code, Audio (samples made into an embedded WAV), Video, display handles (an
/// update is shown after what it updates: results are appended) and display_html() and kin.
#[test]
fn ipython_display_media_and_handles_without_ipython() {
    let h = harness();
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().to_string_lossy().into_owned();
    rt().block_on(async {
        let id = context_in(&h.client, "python", &cwd).await;
        run(&h.client, &id, "from IPython.display import *").await.ok();
        let html_of = |r: &Ran| r.main().and_then(|m| m.html.clone()).unwrap_or_default();
        let r = run(&h.client, &id, "IFrame('https://example.org/a?b=1', 400, 300)").await.ok();
        assert!(html_of(&r).starts_with(r#"<iframe width="400" height="300" src="https://example.org/a?b=1""#), "{r:?}");
        let r = run(&h.client, &id, "open('f.txt', 'w').write('x')\nFileLink('f.txt')").await.ok();
        assert_eq!(html_of(&r), "<a href='f.txt' target='_blank'>f.txt</a><br>");
        assert_eq!(r.text(), Some(format!("{cwd}/f.txt").as_str()));
        let r = run(&h.client, &id, "Audio([0.0, 0.5, -1.0], rate=8000)").await.ok();
        assert!(html_of(&r).contains(r#"<source src="data:audio/wav;base64,UklGR"#), "{r:?}");
        let r = run(&h.client, &id, "Code('print(1)', language='python')").await.ok();
        assert!(r.text() == Some("print(1)") && html_of(&r).contains("print"), "{r:?}");
        let r = run(&h.client, &id, "Video(b'abc')").await;
        assert_eq!(r.error_name(), Some("ValueError"));
        let r = run(&h.client, &id, "h = display('first', display_id=True)\nh.update('second')\nupdate_display('third', display_id=h.display_id)").await.ok();
        let texts: Vec<_> = r.outcome.results.iter().map(|x| x.text.as_deref()).collect();
        assert_eq!(texts, [Some("'first'"), Some("'second'"), Some("'third'")]);
        let code = "class H:\n    def _repr_html_(self): return '<i>h</i>'\n    def __repr__(self): return 'H()'\ndisplay_html(H())\ndisplay(H(), exclude=['text/html'])";
        let r = run(&h.client, &id, code).await.ok();
        let shown: Vec<_> = r.outcome.results.iter().map(|x| (x.html.as_deref(), x.text.as_deref())).collect();
        assert_eq!(shown, [(Some("<i>h</i>"), None), (None, Some("H()"))]);
    });
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// `cargo test -p koder-agent --test interp -- --ignored --nocapture warm_run_latency`
#[test]
#[ignore = "benchmark"]
fn warm_run_latency() {
    let h = harness();
    let warm = rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        run(&h.client, &id, "1+1").await.ok();
        let mut times = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            let r = run(&h.client, &id, "1+1").await;
            times.push(t.elapsed());
            assert_eq!(r.text(), Some("2"));
        }
        median(times)
    });
    let cold: Vec<Duration> = (0..20)
        .map(|_| {
            let t = Instant::now();
            let s = std::process::Command::new("/usr/bin/python3")
                .args(["-c", "1+1"])
                .status()
                .unwrap();
            assert!(s.success());
            t.elapsed()
        })
        .collect();
    println!(
        "warm context run of 1+1: median {:?}; python3 -c start-up: median {:?}",
        warm,
        median(cold)
    );
}

/// IPython's history in cells: `In`, `Out`, `_`/`__`, `_<n>`, `_i`/`_i<n>` by execution
/// count; `_` the user assigned stays theirs; `%history` lists inputs; `%who` hides In/Out;
/// `%reset -f` keeps the inputs and drops the outputs.
#[test]
fn python_cells_keep_ipythons_history() {
    let h = harness();
    rt().block_on(async {
        let id = create(&h.client, "python").await.context_id;
        let mut out = Vec::new();
        for cell in [
            "x = 5",
            "x * 2",
            "_ + 1",
            "print(_, __, _2, Out[2], In[1], _i, _i4, len(In))",
            "%who",
            "_ = 'mine'",
            "40 + 2;",
            "40 + 2",
            "print(_, Out.get(7), _8)",
            "%history -n 1-3",
            "%hist -o -p 2",
            "%reset -f",
            "print(len(In), Out, '_8' in globals())",
        ] {
            out.push(run(&h.client, &id, cell).await.ok().stdout);
        }
        assert_eq!(
            out[3],
            "11 10 10 10 x = 5 _ + 1 print(_, __, _2, Out[2], In[1], _i, _i4, len(In)) 5\n"
        );
        assert_eq!(out[4], "x\n", "In and Out are not the user's names");
        assert_eq!(out[8], "mine None 42\n", "a hidden value is not kept");
        assert_eq!(out[9], "   1: x = 5\n   2: x * 2\n   3: _ + 1\n");
        assert_eq!(out[10], ">>> x * 2\n10\n");
        assert_eq!(out[12], "14 {} False\n");
    });
}
