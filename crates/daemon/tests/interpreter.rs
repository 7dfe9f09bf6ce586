//! The code interpreter of the real daemon over HTTP: stateful contexts in real sandboxes,
//! rich results, verdicts, tenancy and typed errors. matplotlib and pandas come from
//! scripts/setup.sh (the host image's /usr is the host's); their tests fail without them.

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const S: &str = "/v1/sandbox/sessions";

async fn new_context(d: &Daemon, id: &str, language: &str) -> String {
    let c = create_context(d, id, json!({ "language": language })).await;
    c["context_id"].as_str().expect("context id").to_string()
}

/// A new context from the create request `body`, as the daemon answers it.
async fn create_context(d: &Daemon, id: &str, body: Value) -> Value {
    let (status, c) = d
        .json(Method::POST, &format!("{S}/{id}/contexts"), body)
        .await;
    assert_eq!(status, StatusCode::CREATED, "{c}");
    assert_eq!(c["execution_count"], 0);
    c
}

async fn run(d: &Daemon, id: &str, cid: &str, body: Value) -> Value {
    let (status, r) = d
        .json(Method::POST, &format!("{S}/{id}/contexts/{cid}/run"), body)
        .await;
    assert_eq!(status, StatusCode::OK, "{r}");
    r
}

/// The last expression's value.
fn main_result(r: &Value) -> &Value {
    r["results"]
        .as_array()
        .and_then(|all| all.iter().find(|x| x["is_main_result"] == true))
        .unwrap_or(&Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contexts_keep_state_and_return_rich_results() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"language": "python"})).await;
    let cid = new_context(&d, &id, "python").await;

    let r = run(&d, &id, &cid, json!({"code": "x = 41\nprint('set')"})).await;
    assert_eq!(r["stdout"], "set\n");
    assert_eq!(r["results"], json!([]));
    assert!(r["error"].is_null() && r["verdict"].is_null(), "{r}");
    assert_eq!(
        (r["execution_count"].as_u64(), r["restarted"].as_bool()),
        (Some(1), Some(false))
    );
    let r = run(&d, &id, &cid, json!({"code": "x + 1"})).await;
    assert_eq!(main_result(&r)["text"], "42");
    assert_eq!(
        main_result(&r)["json"],
        json!(42),
        "json is a value, not a string"
    );
    let r = run(&d, &id, &cid, json!({"code": "{'a': [1, 2], 'x': x}"})).await;
    assert_eq!(main_result(&r)["json"], json!({"a": [1, 2], "x": 41}));
    assert_eq!(r["execution_count"], 3);

    // Errors: a result with the exception, and the context lives on.
    let r = run(
        &d,
        &id,
        &cid,
        json!({"code": "def f():\n    return 1 / 0\nf()"}),
    )
    .await;
    assert_eq!(r["error"]["name"], "ZeroDivisionError", "{r}");
    assert_eq!(r["error"]["value"], "division by zero");
    let tb = r["error"]["traceback"].as_str().unwrap();
    assert!(
        tb.contains("return 1 / 0") && tb.contains("ZeroDivisionError"),
        "{tb}"
    );
    assert!(r["verdict"].is_null() && r["restarted"] == false);
    assert_eq!(
        main_result(&run(&d, &id, &cid, json!({"code": "x"})).await)["text"],
        "41"
    );

    // Rich outputs from the image's matplotlib and pandas.
    let r = run(
        &d,
        &id,
        &cid,
        json!({"code": "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.title('squares')\nplt.show()", "timeout_ms": 120000}),
    )
    .await;
    assert!(r["error"].is_null(), "{r}");
    let png = r["results"][0]["png"].as_str().expect("a PNG");
    assert_eq!(b64decode(png)[..8], PNG_SIGNATURE);
    let r = run(
        &d,
        &id,
        &cid,
        json!({"code": "import pandas as pd\npd.DataFrame({'n': [1, 2, 3]})"}),
    )
    .await;
    assert!(r["error"].is_null(), "{r}");
    assert!(
        main_result(&r)["html"].as_str().unwrap().contains("<table"),
        "{r}"
    );

    // The session's default Python context exists without being created.
    let r = run(
        &d,
        &id,
        "default",
        json!({"code": "import sys\nsys.version_info[0]"}),
    )
    .await;
    assert_eq!(main_result(&r)["text"], "3");
    let r = run(
        &d,
        &id,
        "default",
        json!({"code": "sys.version_info[0] + 1"}),
    )
    .await;
    assert_eq!(main_result(&r)["text"], "4");

    // JavaScript keeps its top-level bindings too.
    let js = new_context(&d, &id, "javascript").await;
    run(&d, &id, &js, json!({"code": "let a = 1"})).await;
    let r = run(&d, &id, &js, json!({"code": "console.log('js'); a + 1"})).await;
    assert_eq!(
        (r["stdout"].as_str(), &main_result(&r)["json"]),
        (Some("js\n"), &json!(2))
    );

    let (status, list) = d
        .json(Method::GET, &format!("{S}/{id}/contexts"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = list["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["context_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [cid.as_str(), "default", js.as_str()]);
    assert_eq!(list["contexts"][2]["language"], "node");
    assert_eq!(list["contexts"][2]["execution_count"], 2);

    let (status, _) = d
        .json(
            Method::DELETE,
            &format!("{S}/{id}/contexts/{js}"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, e) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/contexts/{js}/run"),
            json!({"code": "a"}),
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::NOT_FOUND, "SANDBOX-NOT-FOUND")
    );

    let (status, c) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/contexts/{cid}/restart"),
            Value::Null,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{c}");
    assert_eq!(
        (c["context_id"].as_str(), &c["execution_count"]),
        (Some(cid.as_str()), &json!(0))
    );
    let r = run(&d, &id, &cid, json!({"code": "'x' in globals()"})).await;
    assert_eq!(main_result(&r)["text"], "False");

    // Variables for one run only; bad names are typed errors.
    let read = "import os\nprint(os.environ.get('ONLY_RUN'))";
    let r = run(
        &d,
        &id,
        &cid,
        json!({"code": read, "env": {"ONLY_RUN": "yes"}}),
    )
    .await;
    assert_eq!(r["stdout"], "yes\n", "{r}");
    let r = run(&d, &id, &cid, json!({"code": read})).await;
    assert_eq!(r["stdout"], "None\n", "{r}");
    let (status, e) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/contexts/{cid}/run"),
            json!({"code": "1", "env": {"A=B": "x"}}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_runs_get_verdicts_and_a_fresh_interpreter() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d
        .create(json!({"language": "python", "limits": {"memory_mib": 128}}))
        .await;
    let cid = new_context(&d, &id, "python").await;
    run(&d, &id, &cid, json!({"code": "state = 1"})).await;

    let r = run(
        &d,
        &id,
        &cid,
        json!({"code": "print('spinning', flush=True)\nwhile True:\n    pass", "timeout_ms": 1000}),
    )
    .await;
    assert_eq!(r["verdict"], "SANDBOX-EXEC-TIMEOUT", "{r}");
    assert_eq!(
        (r["restarted"].as_bool(), r["error"]["name"].as_str()),
        (Some(true), Some("TimeoutError"))
    );
    assert_eq!(r["stdout"], "spinning\n", "output before the kill is kept");
    let r = run(&d, &id, &cid, json!({"code": "'state' in globals()"})).await;
    assert_eq!(main_result(&r)["text"], "False");
    assert_eq!(r["execution_count"], 1);

    let r = run(&d, &id, &cid, json!({"code": "import os\nos._exit(1)"})).await;
    assert_eq!(r["verdict"], "SANDBOX-EXEC-KILLED", "{r}");
    assert_eq!(r["restarted"], true);

    let r = run(
        &d,
        &id,
        &cid,
        json!({"code": "hog = []\nwhile True:\n    hog.append(bytearray(16 << 20))"}),
    )
    .await;
    assert_eq!(r["verdict"], "SANDBOX-EXEC-KILLED-OOM", "{r}");
    assert_eq!(r["restarted"], true);
    let r = run(&d, &id, &cid, json!({"code": "2 * 21"})).await;
    assert_eq!(
        main_result(&r)["text"],
        "42",
        "the context works after an OOM kill"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contexts_are_tenant_scoped_and_input_is_checked() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"language": "python"})).await;
    let cid = new_context(&d, &id, "py").await;
    let base = format!("{S}/{id}/contexts");

    // Another tenant sees nothing, exactly as for an unknown session.
    for (method, path, body) in [
        (Method::POST, base.clone(), json!({"language": "python"})),
        (Method::GET, base.clone(), Value::Null),
        (
            Method::POST,
            format!("{base}/{cid}/run"),
            json!({"code": "1"}),
        ),
        (
            Method::POST,
            format!("{base}/default/run"),
            json!({"code": "1"}),
        ),
        (Method::POST, format!("{base}/{cid}/restart"), Value::Null),
        (Method::DELETE, format!("{base}/{cid}"), Value::Null),
    ] {
        let (status, e) = d.json_as(KEY2, method.clone(), &path, body).await;
        assert_eq!(
            (status, error_code(&e)),
            (StatusCode::NOT_FOUND, "SANDBOX-NOT-FOUND"),
            "{method} {path}"
        );
    }
    let (status, e) = d
        .json(
            Method::GET,
            &format!("{S}/nosuchsession/contexts"),
            Value::Null,
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::NOT_FOUND, "SANDBOX-NOT-FOUND")
    );
    // The context is intact for its owner.
    assert_eq!(
        run(&d, &id, &cid, json!({"code": "1"})).await["execution_count"],
        1
    );

    let bad_request = [
        (base.clone(), json!({"language": "cobol"})),
        (base.clone(), json!({"language": "ruby"})),
        (base.clone(), json!({"language": "python", "extra": 1})),
        (format!("{base}/{cid}/run"), json!({})),
        (format!("{base}/{cid}/run"), json!({"code": 1})),
        (
            format!("{base}/{cid}/run"),
            json!({"code": "1", "timeout_ms": 0}),
        ),
        (
            format!("{base}/{cid}/run"),
            json!({"code": "1", "timeout_ms": 999_999_999_999u64}),
        ),
    ];
    for (path, body) in bad_request {
        let (status, e) = d.json(Method::POST, &path, body.clone()).await;
        assert_eq!(
            (status, error_code(&e)),
            (StatusCode::BAD_REQUEST, "SANDBOX-INVALID-ARGUMENT"),
            "{body}"
        );
    }
    for path in [format!("{base}/nope/run"), format!("{base}/..%2Fx/run")] {
        let (status, e) = d.json(Method::POST, &path, json!({"code": "1"})).await;
        assert_eq!(
            (status, error_code(&e)),
            (StatusCode::NOT_FOUND, "SANDBOX-NOT-FOUND"),
            "{path}"
        );
    }
    let (status, e) = d
        .json(Method::DELETE, &format!("{base}/nope"), Value::Null)
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::NOT_FOUND, "SANDBOX-NOT-FOUND")
    );

    // A cell just under the limit runs; one over it is refused. (Bodies over the JSON limit
    // are api.rs's business.)
    let r = run(&d, &id, &cid, json!({"code": "#".repeat(500 * 1024)})).await;
    assert!(r["error"].is_null(), "{}", r["error"]);
    let (status, e) = d
        .json(
            Method::POST,
            &format!("{base}/{cid}/run"),
            json!({"code": "#".repeat(600 * 1024)}),
        )
        .await;
    assert_eq!(
        (status, error_code(&e)),
        (StatusCode::PAYLOAD_TOO_LARGE, "SANDBOX-PAYLOAD-TOO-LARGE")
    );
    assert_eq!(
        run(&d, &id, &cid, json!({"code": "2"})).await["execution_count"],
        3
    );

    // A deleted session's contexts are gone with it.
    let (status, _) = d
        .json(Method::DELETE, &format!("{S}/{id}"), Value::Null)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = d
        .json(
            Method::POST,
            &format!("{base}/{cid}/run"),
            json!({"code": "1"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// `cargo test -p koder-sandbox --test interpreter -- --ignored --nocapture warm_run_latency`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark"]
async fn warm_run_latency() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"language": "python"})).await;
    run(&d, &id, "default", json!({"code": "1+1"})).await;
    let median = |mut v: Vec<std::time::Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let mut warm = Vec::new();
    for _ in 0..100 {
        let t = std::time::Instant::now();
        let r = run(&d, &id, "default", json!({"code": "1+1"})).await;
        warm.push(t.elapsed());
        assert_eq!(main_result(&r)["text"], "2");
    }
    let mut cold = Vec::new();
    for _ in 0..20 {
        let t = std::time::Instant::now();
        let r = d.exec(&id, json!({"cmd": ["python3", "-c", "1+1"]})).await;
        cold.push(t.elapsed());
        assert_eq!(r["exit_code"], 0);
    }
    println!(
        "over HTTP: warm context run of 1+1: median {:?}; exec python3 -c 1+1: median {:?}",
        median(warm),
        median(cold)
    );
}

const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];

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
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + chunk.len() * 6 / 8]);
    }
    out
}

/// With `Accept: text/event-stream` a run's output arrives as printed, then its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_runs_stream_as_server_sent_events() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"language": "python"})).await;
    let sent = std::time::Instant::now();
    let resp = d
        .req(Method::POST, &format!("{S}/{id}/contexts/default/run"), KEY1)
        .header("accept", "text/event-stream")
        .json(&json!({"code": "import time\nprint('a', flush=True)\ntime.sleep(1.5)\nprint('b')\n6 * 7"}))
        .send()
        .await
        .unwrap();
    let events = read_sse(resp).await;
    let first = events.iter().find(|e| e.name == "stdout").unwrap();
    let result = events.last().unwrap();
    assert_eq!(result.name, "result", "{events:?}");
    assert!(first.at.duration_since(sent) < std::time::Duration::from_millis(1200));
    assert!(result.at.duration_since(sent) >= std::time::Duration::from_millis(1500));
    assert_eq!(stdout_of(&events), "a\nb\n");
    assert_eq!(result.data["results"][0]["text"], "42", "{}", result.data);
    assert!(
        result.data.get("stdout").is_none(),
        "output is not sent twice"
    );

    // Failing before the run starts is the HTTP answer itself.
    let resp = d
        .req(Method::POST, &format!("{S}/{id}/contexts/nope/run"), KEY1)
        .header("accept", "text/event-stream")
        .json(&json!({"code": "1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
}

/// A streamed run that prints nothing for a while still answers at once (after a short grace
/// for refusals): clients that time a run from its headers (E2B's JS SDK) must get them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_streamed_run_answers_before_it_prints() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"language": "python"})).await;
    let code =
        "import os, time\nwhile not os.path.exists('/tmp/go'):\n    time.sleep(0.05)\n'done'";
    let request = d
        .req(
            Method::POST,
            &format!("{S}/{id}/contexts/default/run"),
            KEY1,
        )
        .header("accept", "text/event-stream")
        .json(&json!({ "code": code }))
        .send();
    let resp = tokio::time::timeout(std::time::Duration::from_secs(20), request)
        .await
        .expect("headers while the run waits")
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let (status, out) = d
        .json(
            Method::POST,
            &format!("{S}/{id}/exec"),
            json!({"cmd": ["touch", "/tmp/go"]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let events = read_sse(resp).await;
    let result = events.last().unwrap();
    assert_eq!(result.name, "result", "{events:?}");
    assert_eq!(
        result.data["results"][0]["text"], "'done'",
        "{}",
        result.data
    );
}

/// A streamed run whose client goes away is cancelled, as a streamed exec is: the interpreter
/// is interrupted, not restarted, so the context keeps its variables and takes the next run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_run_whose_client_goes_away_is_interrupted() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"language": "python"})).await;
    run(&d, &id, "default", json!({"code": "x = 41"})).await;
    let mut resp = d
        .req(
            Method::POST,
            &format!("{S}/{id}/contexts/default/run"),
            KEY1,
        )
        .header("accept", "text/event-stream")
        .json(&json!({"code": "import time\nprint('started', flush=True)\ntime.sleep(120)"}))
        .send()
        .await
        .unwrap();
    let mut seen = String::new();
    while !seen.contains("started") {
        let chunk = resp.chunk().await.unwrap().expect("the run's output");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(resp);
    let after = std::time::Instant::now();
    let r = run(&d, &id, "default", json!({"code": "x + 1"})).await;
    assert_eq!(
        (r["results"][0]["text"].as_str(), &r["error"]),
        (Some("42"), &Value::Null),
        "{r}"
    );
    // Not queued behind the sleep (120 s) it would otherwise have waited for.
    assert!(
        after.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        after.elapsed()
    );
}

/// A table's columns, LaTeX, JPEG and a figure's chart reach REST as `data` (JSON), `latex`,
/// `jpeg` and `chart` (JSON).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_latex_jpeg_and_charts_reach_the_result() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"language": "python"})).await;
    let code = "import pandas as pd\nclass F:\n    def _repr_latex_(self): return '$x$'\n    \
                def _repr_jpeg_(self): return b'\\xff\\xd8'\ndisplay(F())\n\
                import matplotlib.pyplot as plt\nplt.pie([3, 1], labels=['x', 'y'])\nplt.show()\n\
                pd.DataFrame({'a': [1, 2]})";
    let r = run(&d, &id, "default", json!({ "code": code })).await;
    let shown = &r["results"];
    assert_eq!(
        (&shown[0]["latex"], &shown[0]["jpeg"]),
        (&json!("$x$"), &json!("/9g=")),
        "{r}"
    );
    let slices = json!([{"label": "x", "angle": 270.0, "radius": 1.0},
                        {"label": "y", "angle": 90.0, "radius": 1.0}]);
    assert_eq!(shown[1]["chart"]["elements"], slices, "{r}");
    assert_eq!(shown[2]["data"], json!({"a": [1, 2]}), "{r}");
}

/// A context can start in another directory with its own variables.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contexts_take_a_cwd_and_an_environment() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"language": "python"})).await;
    let body = json!({"language": "python", "cwd": "/tmp", "env": {"CTX_VAR": "x"}});
    let c = create_context(&d, &id, body).await;
    assert_eq!(c["cwd"], "/tmp", "{c}");
    let cid = c["context_id"].as_str().unwrap();
    let r = run(
        &d,
        &id,
        cid,
        json!({"code": "import os; print(os.getcwd(), os.environ['CTX_VAR'])"}),
    )
    .await;
    assert_eq!(r["stdout"], "/tmp x\n", "{r}");
    for body in [
        json!({"cwd": "relative"}),
        json!({"cwd": "/no/such/dir"}),
        json!({"env": {"": "x"}}),
    ] {
        let (status, e) = d
            .json(Method::POST, &format!("{S}/{id}/contexts"), body.clone())
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {e}");
    }
}

/// A Java context runs in the sandbox's own JVM (the host image has the host's JDK, which
/// scripts/setup.sh installs): JShell under the jail's seccomp filter, Landlock rules and
/// limits, in its cwd, with the environment as system properties.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_contexts_run_jshell_in_the_sandbox() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({})).await;
    let body = json!({"language": "java", "cwd": "/tmp", "env": {"CTX_VAR": "x"}});
    let c = create_context(&d, &id, body).await;
    assert_eq!(c["language"], "java");
    let cid = c["context_id"].as_str().unwrap();
    let code = "record Point(int x, int y) {}\nvar p = new Point(1, 2);\nSystem.out.println(p);";
    let r = run(&d, &id, cid, json!({ "code": code })).await;
    assert_eq!(r["stdout"], "Point[x=1, y=2]\n", "{r}");
    let code = "System.getProperty(\"user.dir\") + \":\" + System.getProperty(\"CTX_VAR\") + \":\" + p.x()";
    let r = run(&d, &id, cid, json!({ "code": code })).await;
    assert_eq!(main_result(&r)["text"], "/tmp:x:1", "{r}");
    let r = run(&d, &id, cid, json!({"code": "Integer.parseInt(\"nope\")"})).await;
    assert_eq!(r["error"]["name"], "java.lang.NumberFormatException", "{r}");
}

/// A TypeScript context strips types with the compiler the sandbox has (the host image: the
/// host's Debian node-typescript, which scripts/setup.sh installs), in the jail, in its cwd,
/// with the session's environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typescript_contexts_run_in_the_sandbox() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"env": {"SESSION_VAR": "s"}})).await;
    let body = json!({"language": "ts", "cwd": "/tmp"});
    let c = create_context(&d, &id, body).await;
    assert_eq!(c["language"], "typescript");
    let cid = c["context_id"].as_str().unwrap();
    let code =
        "const n: number = 2\ntype Pair = [string, number]\nconst p: Pair = [process.cwd(), n]";
    let r = run(&d, &id, cid, json!({ "code": code })).await;
    assert!(r["error"].is_null(), "{r}");
    let code = "`${p[0]} ${process.env.SESSION_VAR} ${p[1] as number}`";
    let r = run(&d, &id, cid, json!({ "code": code })).await;
    assert_eq!(main_result(&r)["text"], "'/tmp s 2'", "{r}");
    let r = run(&d, &id, cid, json!({"code": "let x: = 1"})).await;
    assert_eq!(r["error"]["name"], "SyntaxError", "{r}");
}

/// An R context runs in the sandbox's own R (the host image has the host's, which
/// scripts/setup.sh installs, with its /etc/R): in its cwd, with the session's environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r_contexts_run_in_the_sandbox() {
    let Some(()) = root_or_skip() else { return };
    let d = Daemon::start(BASE_CONFIG).await;
    let id = d.create(json!({"env": {"SESSION_VAR": "s"}})).await;
    let c = create_context(&d, &id, json!({"language": "r", "cwd": "/tmp"})).await;
    let cid = c["context_id"].as_str().unwrap();
    let r = run(
        &d,
        &id,
        cid,
        json!({"code": "x <- c(a = 1, b = 2)\nprint(x)"}),
    )
    .await;
    assert_eq!(r["stdout"], "a b \n1 2 \n", "{r}");
    let code = "paste(getwd(), Sys.getenv('SESSION_VAR'), sum(x), .libPaths()[1] != '')";
    let r = run(&d, &id, cid, json!({ "code": code })).await;
    assert_eq!(main_result(&r)["text"], "[1] \"/tmp s 3 TRUE\"", "{r}");
    let r = run(&d, &id, cid, json!({"code": "log(-1, base = 'x')"})).await;
    assert_eq!(r["error"]["name"], "Error", "{r}");
}
