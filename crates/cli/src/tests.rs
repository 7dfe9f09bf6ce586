//! Command-line parsing and the pure helpers behind the commands.

use std::path::{Path, PathBuf};

use clap::{CommandFactory as _, Parser as _};
use koder_sdk::ExecResult;

use crate::args::{parse_mode, Cli, ClientCommand, Command, SnapshotCommand, VolumeCommand};
use crate::commands::{
    create_args_request, create_request, infer_language, network_request, parse_loc,
    remote_basename, with_lifecycle, Ctx, Loc,
};
use crate::output::exit_status;

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("ksandbox").chain(args.iter().copied()))
}

#[test]
fn clap_definition_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn exec_forms() {
    let cli = parse(&["exec", "s1", "--cwd", "/tmp", "--", "sh", "-c", "exit 3"]).unwrap();
    let Command::Client(ClientCommand::Exec(a)) = cli.command else {
        panic!("not exec")
    };
    assert_eq!(a.cmd, ["sh", "-c", "exit 3"]);
    assert_eq!(a.exec.cwd.as_deref(), Some("/tmp"));

    let cli = parse(&["exec", "s1", "ls", "-la", "--json"]).unwrap();
    let Command::Client(ClientCommand::Exec(a)) = cli.command else {
        panic!("not exec")
    };
    assert_eq!(a.cmd, ["ls", "-la", "--json"]);
    assert!(!a.c.json);

    let cli = parse(&["--json", "exec", "s1", "--shell", "echo hi", "-e", "A=b=c"]).unwrap();
    assert!(cli.global.json);
    let Command::Client(ClientCommand::Exec(a)) = cli.command else {
        panic!("not exec")
    };
    assert_eq!(a.shell.as_deref(), Some("echo hi"));
    assert_eq!(a.exec.env, [("A".to_string(), "b=c".to_string())]);

    assert!(parse(&["exec", "s1"]).is_err());
    assert!(parse(&["exec", "s1", "--shell", "x", "--", "ls"]).is_err());
    assert!(parse(&["exec", "s1", "--env", "novalue", "--", "ls"]).is_err());
}

#[test]
fn local_options_override_global_ones() {
    let cli = parse(&[
        "--url",
        "http://a:1",
        "ls",
        "--url",
        "http://b:2",
        "--api-key",
        "k",
    ])
    .unwrap();
    let Command::Client(ClientCommand::Ls(a)) = &cli.command else {
        panic!("not ls")
    };
    let ctx = Ctx::new(&cli.global, &a.c).unwrap();
    assert_eq!(ctx.client.base_url().as_str(), "http://b:2/");
    assert!(!ctx.out.json);
    let cli = parse(&["ls", "--json"]).unwrap();
    let Command::Client(ClientCommand::Ls(a)) = &cli.command else {
        panic!("not ls")
    };
    assert!(Ctx::new(&cli.global, &a.c).unwrap().out.json);
}

#[test]
fn serve_takes_the_daemon_flags() {
    let cli = parse(&[
        "serve",
        "--listen",
        "127.0.0.1:9999",
        "--api-key",
        "t1:k1",
        "--api-key",
        "t2:k2",
    ])
    .unwrap();
    let Command::Serve(args) = cli.command else {
        panic!("not serve")
    };
    assert_eq!(args.api_keys, ["t1:k1", "t2:k2"]);
}

#[test]
fn run_and_create_forms() {
    let cli = parse(&["run", "python", "-c", "print(1)"]).unwrap();
    let Command::Client(ClientCommand::Run(a)) = cli.command else {
        panic!("not run")
    };
    assert_eq!(a.language.as_deref(), Some("python"));
    assert_eq!(a.code.as_deref(), Some("print(1)"));

    let cli = parse(&["run", "--file", "x.py"]).unwrap();
    let Command::Client(ClientCommand::Run(a)) = cli.command else {
        panic!("not run")
    };
    assert_eq!(a.language, None);
    assert_eq!(a.file, Some(PathBuf::from("x.py")));

    let cli = parse(&["run", "bash", "--", "ls", "-la"]).unwrap();
    let Command::Client(ClientCommand::Run(a)) = cli.command else {
        panic!("not run")
    };
    assert_eq!(a.args, ["ls", "-la"]);
    assert!(parse(&["run", "python", "-c", "1", "--", "ls"]).is_err());

    let cli = parse(&[
        "create",
        "--language",
        "python",
        "--timeout",
        "60",
        "--memory-mib",
        "256",
        "--env",
        "A=1",
        "--meta",
        "owner=me",
    ])
    .unwrap();
    let Command::Client(ClientCommand::Create(a)) = cli.command else {
        panic!("not create")
    };
    let req = create_request(a.language, &a.env, &a.session);
    assert_eq!(
        serde_json::to_value(&req).unwrap(),
        serde_json::json!({"language": "python", "limits": {"memory_mib": 256},
            "env": {"A": "1"}, "timeout_s": 60, "metadata": {"owner": "me"}})
    );
    assert!(parse(&["kill", "a", "b"]).is_ok());
    assert!(parse(&["destroy", "a"]).is_ok());
    assert!(parse(&["rm", "s1", "-r", "/workspace/d"]).is_ok());
    assert!(parse(&["rm", "s1"]).is_err());
}

#[test]
fn cp_locations() {
    assert_eq!(
        parse_loc("s123:/workspace/a.py"),
        Loc::Remote {
            session: "s123".into(),
            path: "/workspace/a.py".into()
        }
    );
    assert_eq!(
        parse_loc("s1:out.txt"),
        Loc::Remote {
            session: "s1".into(),
            path: "/workspace/out.txt".into()
        }
    );
    assert_eq!(parse_loc("./a:b"), Loc::Local("./a:b".into()));
    assert_eq!(parse_loc("a.py"), Loc::Local("a.py".into()));
    assert_eq!(parse_loc(":x"), Loc::Local(":x".into()));
    assert_eq!(parse_loc("-"), Loc::Stdio);
    assert_eq!(remote_basename("/workspace/out.txt"), Some("out.txt"));
    assert_eq!(remote_basename("/"), None);
}

#[test]
fn languages_and_exit_statuses() {
    assert_eq!(infer_language(Path::new("a/b.py")), Some("python"));
    assert_eq!(infer_language(Path::new("b.js")), Some("node"));
    assert_eq!(infer_language(Path::new("b.sh")), Some("bash"));
    assert_eq!(infer_language(Path::new("b.rb")), None);
    assert_eq!(infer_language(Path::new("Makefile")), None);

    let mut r = ExecResult {
        exec_id: "e".into(),
        exit_code: Some(3),
        signal: None,
        stdout: String::new(),
        stderr: String::new(),
        stdout_truncated: false,
        stderr_truncated: false,
        duration_ms: 1,
        peak_memory_kib: None,
        verdict: None,
    };
    assert_eq!(exit_status(&r), 3);
    r.exit_code = None;
    r.signal = Some(9);
    r.verdict = Some("SANDBOX-EXEC-TIMEOUT".into());
    assert_eq!(exit_status(&r), 137);
    r.exit_code = Some(0);
    assert_eq!(exit_status(&r), 1);
    r.signal = None;
    r.exit_code = None;
    r.verdict = None;
    assert_eq!(exit_status(&r), 1);
}

#[test]
fn ca_cert_option_is_read() {
    let cli = parse(&["ls", "--ca-cert", "/nonexistent/ca.pem"]).unwrap();
    let Command::Client(ClientCommand::Ls(a)) = &cli.command else {
        panic!("not ls")
    };
    let err = Ctx::new(&cli.global, &a.c).err().expect("missing CA file");
    assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.pem");
    std::fs::write(&bad, "not a certificate").unwrap();
    let cli = parse(&["--ca-cert", bad.to_str().unwrap(), "ls"]).unwrap();
    let Command::Client(ClientCommand::Ls(a)) = &cli.command else {
        panic!("not ls")
    };
    assert!(matches!(
        Ctx::new(&cli.global, &a.c),
        Err(crate::error::CliError::Sdk(koder_sdk::Error::Tls(_)))
    ));
}

#[test]
fn tables_align_columns() {
    let list: koder_sdk::FileList = serde_json::from_value(serde_json::json!({"entries": [
        {"name": "a", "path": "/w/a", "type": "file", "size": 12345, "mode": 420,
         "modified_at": "2025-01-01T00:00:00Z"},
        {"name": "l", "path": "/w/l", "type": "symlink", "size": 1, "mode": 511,
         "modified_at": "2025-01-01T00:00:00Z", "symlink_target": "a"}]}))
    .unwrap();
    let table = crate::output::files_table(&list);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["TYPE", "SIZE", "MODE", "MODIFIED", "PATH"]
    );
    assert!(lines[2].starts_with("symlink  1 "), "{table}");
    assert!(lines[2].ends_with("/w/l -> a"), "{table}");
    let path_col = lines[0].find("PATH").unwrap();
    assert!(
        lines
            .iter()
            .skip(1)
            .all(|l| l[path_col..].starts_with("/w/")),
        "{table}"
    );
    assert!(lines.iter().all(|l| !l.ends_with(' ')), "{table}");
}

#[test]
fn state_commands_parse() {
    let cli = parse(&[
        "create",
        "--from-snapshot",
        "snap-1",
        "--on-timeout",
        "pause",
        "--auto-resume",
        "--timeout",
        "60",
    ])
    .unwrap();
    let Command::Client(ClientCommand::Create(a)) = cli.command else {
        panic!("not create")
    };
    let req = with_lifecycle(create_request(a.language, &a.env, &a.session), &a.lifecycle);
    assert_eq!(
        serde_json::to_value(&req).unwrap(),
        serde_json::json!({"timeout_s": 60, "from_snapshot": "snap-1",
            "lifecycle": {"on_timeout": "pause", "auto_resume": true}})
    );
    let cli = parse(&["create"]).unwrap();
    let Command::Client(ClientCommand::Create(a)) = cli.command else {
        panic!("not create")
    };
    let req = with_lifecycle(create_request(None, &[], &a.session), &a.lifecycle);
    assert_eq!(serde_json::to_value(&req).unwrap(), serde_json::json!({}));
    assert!(parse(&["create", "--on-timeout", "sleep"]).is_err());

    let cli = parse(&["pause", "s1", "--disk", "--json"]).unwrap();
    let Command::Client(ClientCommand::Pause(a)) = cli.command else {
        panic!("not pause")
    };
    assert!(a.disk && a.c.json);
    let cli = parse(&["fork", "s1"]).unwrap();
    let Command::Client(ClientCommand::Fork(a)) = cli.command else {
        panic!("not fork")
    };
    assert_eq!(a.count, 1);
    assert!(parse(&["fork", "s1", "--count", "0"]).is_err());
    assert!(parse(&["fork", "s1", "--count", "101"]).is_err());
    let cli = parse(&["snapshot", "create", "s1", "--name", "base"]).unwrap();
    let Command::Client(ClientCommand::Snapshot(SnapshotCommand::Create(a))) = cli.command else {
        panic!("not snapshot create")
    };
    assert_eq!(
        (a.session.as_str(), a.name.as_deref()),
        ("s1", Some("base"))
    );
    for args in [
        &["snapshot", "list", "--json"][..],
        &["snapshot", "get", "snap-1"],
        &["snapshot", "delete", "snap-1"],
        &["restore", "s1", "snap-1"],
        &["resume", "s1"],
    ] {
        assert!(parse(args).is_ok(), "{args:?}");
    }
    assert!(parse(&["restore", "s1"]).is_err());
}

#[test]
fn snapshot_tables_and_sizes() {
    use crate::output::format_size;
    assert_eq!(format_size(0), "0 B");
    assert_eq!(format_size(1023), "1023 B");
    assert_eq!(format_size(4096), "4.0 KiB");
    assert_eq!(format_size(3 * 1024 * 1024 / 2), "1.5 MiB");
    assert_eq!(format_size(u64::MAX), "16.0 EiB");
    let snaps: Vec<koder_sdk::Snapshot> = serde_json::from_value(serde_json::json!([
        {"snapshot_id": "snap-1", "name": "base", "size_bytes": 4096, "image": "host",
         "language": "python", "runtime": "jail", "created_at": "2025-01-01T00:00:00Z",
         "expires_at": "2025-01-08T00:00:00Z"},
        {"snapshot_id": "snap-2", "size_bytes": 10, "image": "host", "language": "bash",
         "runtime": "jail", "created_at": "2025-01-01T00:00:00Z",
         "expires_at": "2025-01-08T00:00:00Z"}]))
    .unwrap();
    let table = crate::output::snapshots_table(&snaps);
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [
            vec!["ID", "NAME", "SIZE", "IMAGE", "CREATED", "EXPIRES"],
            vec![
                "snap-1",
                "base",
                "4.0",
                "KiB",
                "host",
                "2025-01-01",
                "00:00:00",
                "2025-01-08",
                "00:00:00"
            ],
            vec![
                "snap-2",
                "-",
                "10",
                "B",
                "host",
                "2025-01-01",
                "00:00:00",
                "2025-01-08",
                "00:00:00"
            ],
        ]
    );
}

fn create_json(args: &[&str]) -> serde_json::Value {
    let cli = parse(&[&["create"], args].concat()).unwrap();
    let Command::Client(ClientCommand::Create(a)) = cli.command else {
        panic!("not create")
    };
    serde_json::to_value(create_args_request(a)).unwrap()
}

#[test]
fn create_mounts_volumes() {
    assert_eq!(
        create_json(&[
            "--volume",
            "data:/data",
            "-v",
            "models:/opt/models:ro",
            "--volume",
            "logs:/var/log/app:rw",
            "--timeout",
            "60",
        ]),
        serde_json::json!({"timeout_s": 60, "volumes": [
            {"name": "data", "path": "/data"},
            {"name": "models", "path": "/opt/models", "read_only": true},
            {"name": "logs", "path": "/var/log/app"}]})
    );
    assert_eq!(create_json(&[]), serde_json::json!({}));
    // The name goes in the JSON body, never in a URL: odd names reach the server unchanged.
    assert_eq!(
        create_json(&["--volume", "a/b%2F..:/d"])["volumes"][0]["name"],
        "a/b%2F.."
    );
    for (bad, why) in [
        ("data", "no mount path"),
        ("data:", "no mount path"),
        ("data::ro", "no mount path"),
        (":/data", "no volume name"),
        ("data:data", "must be absolute"),
        ("data:./data", "must be absolute"),
        ("data:/data:rx", "unknown suffix"),
        ("data:/data:RO", "unknown suffix"),
        ("data:/data:", "unknown suffix"),
        ("data:/a:b:ro", "cannot contain ':'"),
        ("data:/d:ro:ro", "cannot contain ':'"),
    ] {
        let err = parse(&["create", "--volume", bad]).expect_err(bad);
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
        assert!(err.to_string().contains(why), "{bad}: {err}");
    }
}

#[test]
fn volume_commands_parse() {
    let cli = parse(&["volume", "create", "data", "--size-mib", "512"]).unwrap();
    let Command::Client(ClientCommand::Volume(VolumeCommand::Create(a))) = cli.command else {
        panic!("not volume create")
    };
    assert_eq!((a.name.as_str(), a.size_mib), ("data", Some(512)));
    assert!(parse(&["volume", "create", "data", "--size-mib", "0"]).is_err());
    let cli = parse(&["volume", "create", "copy", "--from", "data"]).unwrap();
    let Command::Client(ClientCommand::Volume(VolumeCommand::Create(a))) = cli.command else {
        panic!("not volume create")
    };
    assert_eq!(a.from.as_deref(), Some("data"));
    // A copy has its source's size.
    assert!(parse(&["volume", "create", "c", "--from", "data", "--size-mib", "9"]).is_err());
    assert!(parse(&["volume", "create"]).is_err());

    let cli = parse(&["volume", "ls", "data"]).unwrap();
    let Command::Client(ClientCommand::Volume(VolumeCommand::Ls(a))) = cli.command else {
        panic!("not volume ls")
    };
    assert_eq!((a.path.as_str(), a.depth), ("/", None));

    let cli = parse(&["volume", "put", "data", "/in.csv"]).unwrap();
    let Command::Client(ClientCommand::Volume(VolumeCommand::Put(a))) = cli.command else {
        panic!("not volume put")
    };
    assert_eq!(a.file, "-");
    assert!(!a.overwrite && a.mode.is_none() && a.uid.is_none());
    let cli = parse(&[
        "volume",
        "put",
        "data",
        "/bin/run",
        "./run.sh",
        "--overwrite",
        "--uid",
        "0",
        "--gid",
        "0",
        "--mode",
        "755",
        "--json",
    ])
    .unwrap();
    let Command::Client(ClientCommand::Volume(VolumeCommand::Put(a))) = cli.command else {
        panic!("not volume put")
    };
    assert_eq!(
        (a.file.as_str(), a.overwrite, a.uid, a.gid, a.mode, a.c.json),
        ("./run.sh", true, Some(0), Some(0), Some(0o755), true)
    );
    assert!(parse(&["volume", "put", "data", "/f", "--mode", "rwx"]).is_err());

    let cli = parse(&["volume", "mkdir", "data", "/a/b", "-p"]).unwrap();
    let Command::Client(ClientCommand::Volume(VolumeCommand::Mkdir(a))) = cli.command else {
        panic!("not volume mkdir")
    };
    assert!(a.parents);
    for args in [
        &["volume", "list", "--json"][..],
        &["volume", "get", "vol-1"],
        &["volume", "delete", "data"],
        &["volume", "ls", "data", "/sub", "--depth", "3"],
        &["volume", "cat", "data", "/a"],
        &["volume", "rm", "data", "/a", "/b"],
        &["volume", "stat", "data", "/a"],
    ] {
        assert!(parse(args).is_ok(), "{args:?}");
    }
    for args in [
        &["volume", "rm", "data"][..],
        &["volume", "cat", "data"],
        &["volume", "stat", "data"],
        &["volume", "get"],
    ] {
        assert!(parse(args).is_err(), "{args:?}");
    }
}

#[test]
fn modes_are_octal() {
    for (text, mode) in [
        ("644", 0o644),
        ("0644", 0o644),
        ("0o600", 0o600),
        ("1777", 0o1777),
        ("7", 0o7),
    ] {
        assert_eq!(parse_mode(text), Ok(mode), "{text}");
    }
    for bad in [
        "", "8", "0o", "12345", "-644", "+644", "0x1a4", "64 4", "٦٤٤",
    ] {
        assert!(parse_mode(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn volume_tables() {
    let volumes: Vec<koder_sdk::Volume> = serde_json::from_value(serde_json::json!([
        {"volume_id": "vol-1", "name": "data", "size_mib": 1024, "used_bytes": 1536,
         "backend": "btrfs", "created_at": "2025-01-01T00:00:00Z",
         "mounts": [{"session_id": "s-1", "path": "/data", "read_only": false},
                    {"session_id": "s-2", "path": "/in", "read_only": true}]},
        {"volume_id": "vol-2", "name": "scratch", "size_mib": u64::MAX, "backend": "ext4",
         "created_at": "2025-01-01T00:00:00Z"}]))
    .unwrap();
    let table = crate::output::volumes_table(&volumes);
    let rows: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [
            vec!["NAME", "ID", "SIZE", "USED", "BACKEND", "MOUNTS"],
            vec!["data", "vol-1", "1.0", "GiB", "1.5", "KiB", "btrfs", "2"],
            vec!["scratch", "vol-2", "16.0", "EiB", "-", "ext4", "0"],
        ]
    );
    let one = crate::output::volume_table(&volumes[0]);
    assert!(one.contains("mounts      s-1:/data s-2:/in:ro"), "{one}");
    assert!(one.contains("used_bytes  1536"), "{one}");
    let none = crate::output::volume_table(&volumes[1]);
    assert!(none.lines().any(|l| l == "mounts      -"), "{none}");
    assert!(none.lines().any(|l| l == "used        -"), "{none}");

    let entry: koder_sdk::FileEntry = serde_json::from_value(serde_json::json!(
        {"name": "run", "path": "/bin/run", "type": "file", "size": 10, "mode": 33261,
         "modified_at": "2025-01-01T00:00:00Z", "uid": 0, "gid": 1000}))
    .unwrap();
    let stat = crate::output::file_table(&entry);
    let rows: Vec<Vec<&str>> = stat
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [
            vec!["path", "/bin/run"],
            vec!["type", "file"],
            vec!["size", "10"],
            vec!["mode", "0755"],
            vec!["uid", "0"],
            vec!["gid", "1000"],
            vec!["modified", "2025-01-01", "00:00:00"],
        ]
    );
}

/// Every argument of every subcommand, with the path of subcommands leading to it.
fn all_args(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Arg)>) {
    for arg in cmd.get_arguments() {
        out.push((path.to_string(), arg.clone()));
    }
    for sub in cmd.get_subcommands() {
        all_args(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

#[test]
fn every_argument_has_help() {
    let mut cli = Cli::command();
    cli.build();
    let mut args = Vec::new();
    all_args(&cli, "ksandbox", &mut args);
    assert!(
        args.len() > 200,
        "the walk found only {} arguments",
        args.len()
    );
    let missing: Vec<String> = args
        .iter()
        .filter(|(_, a)| a.get_help().is_none() && a.get_long_help().is_none())
        .map(|(path, a)| format!("{path} {}", a.get_id()))
        .collect();
    assert!(missing.is_empty(), "arguments without help: {missing:#?}");
}

#[test]
fn fixed_choices_are_shown() {
    let mut cli = Cli::command();
    cli.build();
    let values = |sub: &[&str], arg: &str| -> Vec<String> {
        let mut cmd = &cli;
        for s in sub {
            cmd = cmd.find_subcommand(s).unwrap_or_else(|| panic!("{s}"));
        }
        let a = cmd
            .get_arguments()
            .find(|a| a.get_id() == arg)
            .unwrap_or_else(|| panic!("{sub:?} {arg}"));
        a.get_possible_values()
            .iter()
            .map(|v| v.get_name().to_string())
            .collect()
    };
    assert_eq!(values(&["create"], "runtime"), ["jail", "microvm"]);
    assert_eq!(
        values(&["create"], "network"),
        ["none", "open", "allowlist"]
    );
    assert_eq!(values(&["create"], "language"), ["python", "node", "bash"]);
    assert_eq!(values(&["run"], "language"), ["python", "node", "bash"]);
    assert_eq!(
        values(&["run-code"], "language"),
        ["python", "node", "typescript", "bash", "java", "r"]
    );
    assert_eq!(
        values(&["context", "create"], "language"),
        ["python", "node", "typescript", "bash", "java", "r"]
    );
    assert!(values(&["signal"], "signal").contains(&"TERM".to_string()));
    assert_eq!(
        values(&["completions"], "shell"),
        ["bash", "elvish", "fish", "powershell", "zsh"]
    );
    let help = cli
        .find_subcommand_mut("create")
        .unwrap()
        .render_long_help()
        .to_string();
    assert!(help.contains("jail") && help.contains("microvm"), "{help}");
    // The daemon's aliases still parse.
    assert!(parse(&["create", "--language", "js"]).is_ok());
    assert!(parse(&["create", "--language", "ruby"]).is_err());
    assert!(parse(&["create", "--runtime", "vm"]).is_err());
}

/// `ksandbox context create ARGS...` as parsed.
fn context_create(args: &[&str]) -> crate::args::ContextCreateArgs {
    let all: Vec<&str> = ["context", "create"].iter().chain(args).copied().collect();
    let cli = parse(&all).unwrap();
    let Command::Client(ClientCommand::Context(crate::args::ContextCommand::Create(a))) =
        cli.command
    else {
        panic!("not context create")
    };
    a
}

#[test]
fn context_and_run_code_forms() {
    use crate::args::ContextLanguage;
    let a = context_create(&["s1", "-l", "node", "-e", "A=1"]);
    assert_eq!(
        (a.session.as_str(), a.language),
        ("s1", ContextLanguage::Node)
    );
    assert_eq!(a.env, [("A".to_string(), "1".to_string())]);
    assert_eq!(context_create(&["s1"]).language, ContextLanguage::Python);
    for (alias, language) in [("sh", "bash"), ("ts", "typescript"), ("r", "r")] {
        let a = context_create(&["s1", "-l", alias]);
        assert_eq!(a.language.as_str(), language);
    }
    assert!(parse(&["context", "create", "s1", "-l", "cobol"]).is_err());
    assert!(parse(&["context", "rm", "s1"]).is_err(), "rm needs an id");
    assert!(parse(&["context", "restart", "s1", "c1"]).is_ok());
    assert!(parse(&["context", "ls", "s1", "--json"]).is_ok());

    let cli = parse(&[
        "run-code",
        "s1",
        "x = 1",
        "--context",
        "c1",
        "--timeout-ms",
        "900",
    ])
    .unwrap();
    let Command::Client(ClientCommand::RunCode(a)) = cli.command else {
        panic!("not run-code")
    };
    assert_eq!(
        (a.code.as_str(), a.context.as_deref()),
        ("x = 1", Some("c1"))
    );
    assert_eq!(a.timeout_ms, Some(900));
    assert!(parse(&["run-code", "s1", "-", "--language", "js"]).is_ok());
    assert!(
        parse(&[
            "run-code",
            "s1",
            "1",
            "--context",
            "c",
            "--language",
            "node"
        ])
        .is_err(),
        "a context has its own language"
    );
    assert!(parse(&["run-code", "s1"]).is_err(), "no code");
}

#[test]
fn preview_signal_errors_forms() {
    let cli = parse(&["preview", "s1", "--port", "8000"]).unwrap();
    let Command::Client(ClientCommand::Preview(a)) = cli.command else {
        panic!("not preview")
    };
    assert_eq!(a.port, Some(8000));
    assert!(parse(&["preview", "s1", "--port", "0"]).is_err());
    assert!(parse(&["preview", "s1", "--port", "70000"]).is_err());
    for (given, wire) in [
        ("sigkill", "SIGKILL"),
        ("INT", "SIGINT"),
        ("term", "SIGTERM"),
    ] {
        let cli = parse(&["signal", "s1", "e1", given]).unwrap();
        let Command::Client(ClientCommand::Signal(a)) = cli.command else {
            panic!("not signal")
        };
        assert_eq!(a.signal.wire_name(), wire);
    }
    let cli = parse(&["signal", "s1", "e1"]).unwrap();
    let Command::Client(ClientCommand::Signal(a)) = cli.command else {
        panic!("not signal")
    };
    assert_eq!(a.signal.wire_name(), "SIGTERM");
    assert!(parse(&["signal", "s1", "e1", "SIGFOO"]).is_err());
    assert!(parse(&["errors", "s1", "--json"]).is_ok());
}

#[test]
fn completion_scripts_name_the_subcommands() {
    use clap_complete::Shell;
    for shell in [
        Shell::Bash,
        Shell::Zsh,
        Shell::Fish,
        Shell::PowerShell,
        Shell::Elvish,
    ] {
        let mut out = Vec::new();
        crate::commands::completions(shell, &mut out);
        let script = String::from_utf8(out).unwrap();
        for word in ["ksandbox", "run-code", "preview", "snapshot"] {
            assert!(script.contains(word), "{shell}: no {word}");
        }
    }
}

#[test]
fn the_daemon_down_message_says_where_and_how() {
    let m = crate::error::daemon_down_message("http://127.0.0.1:9/v1/x", "Connection refused");
    for part in [
        "http://127.0.0.1:9/v1/x",
        "Connection refused",
        "scripts/serve.sh",
        "koder-sandbox serve",
        "--url",
        "KSANDBOX_URL",
    ] {
        assert!(m.contains(part), "{part}: {m}");
    }
}

#[tokio::test]
async fn a_refused_connection_is_reported_as_the_daemon_being_down() {
    // Port 9 (discard) on loopback: nothing listens.
    let client = koder_sdk::Client::new("http://127.0.0.1:9", "k").unwrap();
    let err = crate::error::CliError::from(client.list_sessions().await.unwrap_err());
    let m = err.unreachable_daemon().expect("a connect error");
    assert!(
        m.starts_with("cannot reach the daemon at http://127.0.0.1:9/"),
        "{m}"
    );
    assert!(m.contains("scripts/serve.sh"), "{m}");
    let api = crate::error::CliError::from(koder_sdk::Error::from_response_parts(404, b""));
    assert!(api.unreachable_daemon().is_none());
}

#[test]
fn admin_key_errors_say_where_keys_come_from() {
    use crate::error::CliError;
    let denied = koder_sdk::Error::from_response_parts(
        403,
        br#"{"error":{"code":"SANDBOX-PERMISSION-DENIED","message":"admin key required"}}"#,
    );
    let text = CliError::admin(denied).to_string();
    for part in [
        "SANDBOX-PERMISSION-DENIED",
        "[auth]",
        "admin_keys",
        "--admin-key",
        "--api-key",
        "KSANDBOX_ADMIN_KEY",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
    assert!(CliError::AdminKey(None)
        .to_string()
        .starts_with("no admin key given"));
    let other = CliError::admin(koder_sdk::Error::from_response_parts(409, b"in use"));
    assert!(matches!(other, CliError::Sdk(_)), "{other}");
}

#[test]
fn rich_results_become_files() {
    use crate::commands::{result_files, summary};
    let rich = koder_sdk::interp::RichOutput {
        text: Some("<Figure>".into()),
        png: Some("iVBORw0KGgo=".into()),
        html: Some("<b>x</b>".into()),
        json: Some(serde_json::json!({"a": 1})),
        chart: Some(serde_json::json!({"type": "pie"})),
        pdf: Some("JVBERi0xLjQ=".into()),
        javascript: Some("alert(1)".into()),
        extra: Some(serde_json::json!({"application/x-t": 1})),
        ..Default::default()
    };
    let files = result_files(&rich, 2).unwrap();
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "result-2.png",
            "result-2.pdf",
            "result-2.html",
            "result-2.js",
            "result-2.json",
            "result-2-chart.json",
            "result-2-extra.json"
        ]
    );
    assert_eq!(files[0].1, b"\x89PNG\r\n\x1a\n");
    assert_eq!(files[1].1, b"%PDF-1.4");
    assert_eq!(
        summary(2, &files),
        "result 2: png (8 B), pdf (8 B), html (8 B), js (8 B), json (12 B), chart.json (19 B), extra.json (26 B)"
    );
    let broken = koder_sdk::interp::RichOutput {
        png: Some("not base64!".into()),
        ..Default::default()
    };
    assert!(result_files(&broken, 1).is_err());
    assert!(result_files(&Default::default(), 1).unwrap().is_empty());
}

#[test]
fn stdin_network_secret_webhook_forms() {
    let cli = parse(&["stdin", "s1", "e1", "--data", "hi", "--eof"]).unwrap();
    let Command::Client(ClientCommand::Stdin(a)) = cli.command else {
        panic!("not stdin")
    };
    assert_eq!((a.data.as_deref(), a.eof), (Some("hi"), true));
    assert!(parse(&["stdin", "s1"]).is_err(), "an exec id is needed");
    assert!(parse(&["logs", "s1", "e1", "--status"]).is_ok());
    assert!(parse(&["logs", "s1", "--list", "--status"]).is_err());
    assert!(parse(&["errors", "s1", "--report", "m", "--stack", "s"]).is_ok());
    assert!(parse(&["errors", "s1", "--stack", "s"]).is_err());

    let cli = parse(&[
        "network",
        "s1",
        "--mode",
        "allowlist",
        "--allow",
        "a.example",
        "--deny",
        "b.example",
    ])
    .unwrap();
    let Command::Client(ClientCommand::Network(a)) = cli.command else {
        panic!("not network")
    };
    let policy = network_request(&a).unwrap();
    assert_eq!(policy.mode, koder_sdk::types::NetworkMode::Allowlist);
    assert_eq!(
        (policy.allow, policy.deny),
        (vec!["a.example".to_string()], vec!["b.example".to_string()])
    );
    let cli = parse(&["network", "s1", "--mode", "open", "--allow", "a.example"]).unwrap();
    let Command::Client(ClientCommand::Network(a)) = cli.command else {
        panic!("not network")
    };
    assert!(network_request(&a).is_err(), "--allow needs allowlist");
    assert!(parse(&["network", "s1", "--mode", "wide"]).is_err());
    assert!(parse(&["network", "s1"]).is_err(), "a mode is needed");

    assert!(parse(&["secret", "set", "T"]).is_err(), "at least one host");
    assert!(parse(&["secret", "set", "T", "--host", "a", "--host", "b"]).is_ok());
    assert!(parse(&["secret", "ls", "--json"]).is_ok());
    assert!(parse(&["webhook", "add", "http://x", "--event", "exec.verdict"]).is_ok());
    assert!(parse(&["webhook", "add", "http://x", "--event", "exec.nope"]).is_err());
    assert!(parse(&["webhook", "deliveries", "w1"]).is_ok());

    let req = create_json(&["--network", "open", "--deny", "10.0.0.0/8", "--secret", "T"]);
    assert_eq!(req["network"]["deny"], serde_json::json!(["10.0.0.0/8"]));
    assert_eq!(req["secrets"], serde_json::json!(["T"]));
}
