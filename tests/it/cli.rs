//! The command line as a new user meets it, through the real binary:
//! `--target` as `serve` prints the address (`host:port`), bracketed IPv6
//! or a URL, on every command that calls a sidecar (and in
//! `ONCEGATE_TARGET`); a bad one refused with exit 64 naming the flag and
//! what is wrong; an error printed once and never with a backtrace, whether
//! `RUST_BACKTRACE` is set or not; a stdout closed by its reader (`| head
//! -1`) ends the command quietly with 141, the status a shell gives a
//! program a closed pipe ended.

use crate::helpers::*;
use std::process::Stdio;
use std::time::Duration;

const TS: &str = "2026-12-04T10:00:00Z";

/// A line of `stdout` starting with `prefix`, the rest of it.
fn field<'a>(stdout: &'a str, prefix: &str) -> &'a str {
    stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in:\n{stdout}"))
}

/// `command` with `--target target` (none when empty) and `rest`; it must
/// succeed.
async fn call(command: &[&str], target: &str, rest: &[&str], env: &[(&str, &str)]) -> Run {
    let mut argv: Vec<&str> = command.to_vec();
    if !target.is_empty() {
        argv.extend(["--target", target]);
    }
    argv.extend_from_slice(rest);
    let run = run_oncegate(&argv, env).await;
    assert_eq!(run.code, Some(0), "{argv:?}: {run:?}");
    run
}

/// `submit`, `lookup`, `effect begin|complete|release` and `bench` through
/// one target written one way.
async fn every_remote_command(target: &str, tag: &str, env: &[(&str, &str)]) {
    let submit = call(
        &["submit"],
        target,
        &[
            "--award-id",
            "AWD-CLI",
            "--timestamp",
            TS,
            "--amount-cents",
            "5",
            "--payload",
            tag,
        ],
        env,
    )
    .await;
    assert!(
        submit.stdout.starts_with("CLAIMED by DATABASE"),
        "{target}: {submit:?}"
    );
    let key = field(&submit.stdout, "idempotency_key ").to_string();
    let lookup = call(&["lookup"], target, &[&key], env).await;
    assert!(lookup.stdout.starts_with("DUPLICATE by "), "{target}: {lookup:?}");

    let (done, released) = (format!("{tag}-done"), format!("{tag}-released"));
    let begin = call(
        &["effect", "begin"],
        target,
        &["--namespace", "cli", "--key", &done],
        env,
    )
    .await;
    let token = field(&begin.stdout, "ACQUIRED attempt=1 lease_token=").to_string();
    let complete = call(
        &["effect", "complete"],
        target,
        &[
            "--namespace",
            "cli",
            "--key",
            &done,
            "--lease-token",
            &token,
            "--response",
            "ok",
        ],
        env,
    )
    .await;
    assert!(
        complete.stdout.starts_with("COMPLETED completed_at="),
        "{target}: {complete:?}"
    );
    let begin = call(
        &["effect", "begin"],
        target,
        &["--namespace", "cli", "--key", &released],
        env,
    )
    .await;
    let token = field(&begin.stdout, "ACQUIRED attempt=1 lease_token=").to_string();
    let release = call(
        &["effect", "release"],
        target,
        &["--namespace", "cli", "--key", &released, "--lease-token", &token],
        env,
    )
    .await;
    assert_eq!(release.stdout.trim(), "RELEASED", "{target}: {release:?}");

    let bench = call(
        &["bench"],
        target,
        &[
            "--clients",
            "1",
            "--connections",
            "1",
            "--deliveries",
            "5",
            "--duration",
            "30s",
            "--quiet",
            "--label",
            tag,
        ],
        env,
    )
    .await;
    assert!(
        bench.stdout.contains(&format!("{tag}: 1 clients")),
        "{target}: {bench:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_that_calls_a_sidecar_takes_host_port_bracketed_ipv6_and_urls() {
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let addr = app.addr.to_string();
    for (i, target) in [addr.clone(), format!("http://{addr}"), format!("HTTP://{addr}/")]
        .iter()
        .enumerate()
    {
        every_remote_command(target, &format!("v4-{i}"), &[]).await;
    }
    every_remote_command("", "env", &[("ONCEGATE_TARGET", &addr)]).await;
    app.shutdown().await;

    let mut args = serve_args(&db);
    args.listen = "[::1]:0".parse().unwrap();
    let v6 = TestApp::spawn(args).await;
    let port = v6.addr.port();
    every_remote_command(&format!("[::1]:{port}"), "v6", &[]).await;
    every_remote_command(&format!("http://[::1]:{port}"), "v6-url", &[]).await;
    v6.shutdown().await;
}

/// A target that is not an address: exit 64 before anything is sent, the
/// flag and the fault named once, no secret echoed.
#[tokio::test]
async fn a_bad_target_is_refused_naming_the_flag_and_what_is_wrong() {
    let commands: [&[&str]; 4] = [
        &["submit", "--award-id", "A", "--amount-cents", "1"],
        &["lookup", "0123"],
        &["effect", "begin", "--namespace", "cli", "--key", "k"],
        &["bench", "--deliveries", "1"],
    ];
    for command in commands {
        for (target, says) in [
            ("localhost", "no port"),
            ("127.0.0.1:http", "not a port number"),
            ("::1:50051", "in brackets"),
            ("grpc://127.0.0.1:50051", "not a gRPC address"),
            ("http://127.0.0.1:50051/v1", "has a path"),
            ("http://operator:hunter2@127.0.0.1:50051", "user information"),
        ] {
            let run = run_oncegate(&[command, &["--target", target]].concat(), &[]).await;
            assert_eq!(run.code, Some(64), "{command:?} {target}: {run:?}");
            assert!(run.stdout.is_empty(), "{command:?} {target}: {run:?}");
            assert_eq!(
                run.stderr.matches(says).count(),
                1,
                "{command:?} {target}: {run:?}"
            );
            assert!(run.stderr.contains("--target"), "names the flag: {run:?}");
            assert!(!run.stderr.contains("hunter2"), "no secret echoed: {run:?}");
        }
        let run = run_oncegate(command, &[("ONCEGATE_TARGET", "localhost")]).await;
        assert_eq!(run.code, Some(64), "ONCEGATE_TARGET: {run:?}");
        assert!(run.stderr.contains("no port"), "{run:?}");
    }
}

/// Nothing listening at the target, and a call the sidecar refuses: one
/// line on stderr each, with or without RUST_BACKTRACE; never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_is_printed_once_and_without_a_backtrace() {
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let nobody = format!("127.0.0.1:{}", free_port());
    let addr = app.addr.to_string();
    for backtrace in [None, Some("1"), Some("full")] {
        let env: Vec<(&str, &str)> = backtrace.map(|b| ("RUST_BACKTRACE", b)).into_iter().collect();
        let unreachable = run_oncegate(
            &[
                "submit",
                "--target",
                &nobody,
                "--award-id",
                "A",
                "--amount-cents",
                "1",
            ],
            &env,
        )
        .await;
        assert_eq!(unreachable.code, Some(1), "{unreachable:?}");
        assert_eq!(unreachable.stderr.lines().count(), 1, "once: {unreachable:?}");
        assert!(
            unreachable.stderr.starts_with(&format!(
                "error: cannot connect to the sidecar at http://{nobody} (--target): "
            )) && unreachable.stderr.contains("onnection refused"),
            "names what is missing: {unreachable:?}"
        );
        assert!(
            unreachable
                .stderr
                .trim_end()
                .ends_with(&format!("is `oncegate serve` running on {nobody}?")),
            "says what to check: {unreachable:?}"
        );
        assert_eq!(
            unreachable.stderr.matches("connect error").count(),
            1,
            "each cause once: {unreachable:?}"
        );
        let refused = run_oncegate(
            &[
                "submit",
                "--target",
                &addr,
                "--award-id",
                "A",
                "--amount-cents",
                "0",
            ],
            &env,
        )
        .await;
        assert_eq!(refused.code, Some(1), "{refused:?}");
        assert_eq!(refused.stderr.lines().count(), 1, "once: {refused:?}");
        assert!(refused.stderr.starts_with("InvalidArgument: "), "{refused:?}");
        let not_effect = run_oncegate(
            &[
                "effect",
                "begin",
                "--target",
                &addr,
                "--namespace",
                "Not Valid",
                "--key",
                "k",
            ],
            &env,
        )
        .await;
        assert_eq!(not_effect.code, Some(1), "{not_effect:?}");
        assert_eq!(not_effect.stderr.lines().count(), 1, "once: {not_effect:?}");
        for run in [&unreachable, &refused, &not_effect] {
            assert!(
                !run.stderr.contains("backtrace") && !run.stderr.contains("panicked"),
                "RUST_BACKTRACE={backtrace:?}: {run:?}"
            );
        }
    }
    app.shutdown().await;
}

/// `serve` failing once its logs have begun (its listen address is taken):
/// the error said once, and last — an `error:` line after the text logs,
/// or one ERROR record after the other JSON records (every line a record,
/// no bare line for a collector to choke on).
#[tokio::test]
async fn a_failing_serve_says_so_once_and_last_in_either_log_format() {
    let db = TestDb::new(Kind::Sqlite).await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let says = format!("binding ONCEGATE_LISTEN on {listen}: ");
    for format in ["text", "json"] {
        let run = run_oncegate(
            &["serve", "--database-url", &db.url, "--listen", &listen],
            &[
                ("ONCEGATE_METRICS_LISTEN", "127.0.0.1:0"),
                ("ONCEGATE_LOG_FORMAT", format),
                ("RUST_BACKTRACE", "1"),
            ],
        )
        .await;
        assert_eq!(run.code, Some(1), "{format}: {run:?}");
        assert_eq!(run.stderr.matches(&says).count(), 1, "once: {run:?}");
        assert!(run.stderr.lines().count() > 1, "the logs had begun: {run:?}");
        assert!(!run.stderr.contains("panicked"), "{run:?}");
        let last = run.stderr.lines().last().unwrap_or_default();
        if format == "text" {
            assert!(last.starts_with(&format!("error: {says}")), "last: {run:?}");
            continue;
        }
        let records: Vec<serde_json::Value> = run
            .stderr
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
            .collect();
        let errors: Vec<_> = records.iter().filter(|r| r["level"] == "ERROR").collect();
        assert_eq!(errors.len(), 1, "{run:?}");
        assert!(
            errors[0]["error"].as_str().unwrap_or_default().starts_with(&says),
            "{run:?}"
        );
        assert_eq!(records.last(), Some(errors[0]), "last: {run:?}");
    }
}

/// `serve` says where it listens once, as a log record (not a log line and
/// a bare copy of it): in text, one line; in JSON, one record among records,
/// every line of stderr a record. Nothing on stdout. Counted over everything
/// it wrote, after it stopped on SIGTERM.
#[tokio::test]
async fn serve_says_where_it_listens_once_in_either_log_format() {
    let db = TestDb::new(Kind::Sqlite).await;
    for format in ["text", "json"] {
        let (listen, run) = serve_until_sigterm(&db.url, format).await;
        assert_eq!(run.code, Some(0), "{format}: {run:?}");
        assert_eq!(run.stdout, "", "{format}: nothing on stdout");
        let says = format!("listening on {listen}");
        let stderr = &run.stderr;
        assert_eq!(stderr.matches(&says).count(), 1, "{format}: once\n{stderr}");
        if format == "json" {
            let records: Vec<serde_json::Value> = stderr
                .lines()
                .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
                .collect();
            let banner: Vec<_> = records
                .iter()
                .filter(|r| r["message"].as_str().is_some_and(|m| m.contains(&says)))
                .collect();
            assert_eq!(banner.len(), 1, "{stderr}");
            assert_eq!(banner[0]["level"], "INFO", "{stderr}");
        }
    }
}

/// `serve` on `db_url` with `ONCEGATE_LOG_FORMAT=format` on a free port,
/// stopped with SIGTERM once it said where it listens (that line is logged
/// once its SIGTERM handler is in place; the listener is bound before that):
/// the address and everything it wrote.
async fn serve_until_sigterm(db_url: &str, format: &str) -> (String, Run) {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = tokio::process::Command::new(oncegate_bin())
        .args(["serve", "--database-url", db_url, "--listen", &listen])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("ONCEGATE_METRICS_LISTEN", "127.0.0.1:0")
        .env("ONCEGATE_PURGE_INTERVAL", "0s")
        .env("ONCEGATE_LOG_FORMAT", format)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let says = format!("listening on {listen}");
    let up = eventually(Duration::from_secs(20), || {
        let (err, says) = (err.clone(), says.clone());
        async move { std::fs::read_to_string(&err).is_ok_and(|t| t.contains(&says)) }
    })
    .await;
    let read = |path: &std::path::Path| std::fs::read_to_string(path).unwrap_or_default();
    assert!(up, "{format}: {}", read(&err));
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("stops on SIGTERM")
        .unwrap();
    let run = Run {
        code: status.code(),
        stdout: read(&out),
        stderr: read(&err),
    };
    (listen, run)
}

/// `submit` whose reader closed the pipe before the answer came, and `key
/// --jsonl` under `| head -1` in a shell with pipefail (far more output than
/// a pipe holds, so it is still writing when head exits): no message, no
/// backtrace, exit 141.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_the_command_quietly_with_141() {
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut child = tokio::process::Command::new(oncegate_bin())
        .args([
            "submit",
            "--target",
            &app.addr.to_string(),
            "--award-id",
            "AWD-PIPE",
        ])
        .args(["--amount-cents", "7", "--timestamp", TS])
        .env_clear()
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The reader goes away before anything was written.
    drop(child.stdout.take());
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("ends")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!((out.status.code(), stderr.as_ref()), (Some(141), ""));
    assert_eq!(
        db.counts().await.ledger().0,
        1,
        "the submission itself was decided (its answer had nowhere to go)"
    );
    app.shutdown().await;

    let dir = tempfile::tempdir().unwrap();
    let lines = dir.path().join("keys.jsonl");
    let one = r#"{"award_id":"AWD-PIPE","submission_timestamp":"2026-12-04T10:00:00Z","payload_b64":""}"#;
    std::fs::write(&lines, format!("{one}\n").repeat(20_000)).unwrap();
    let out = tokio::process::Command::new("bash")
        .args(["-o", "pipefail", "-c", r#""$0" key --jsonl < "$1" | head -1"#])
        .arg(oncegate_bin())
        .arg(&lines)
        .env("RUST_BACKTRACE", "1")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!((out.status.code(), stderr.as_ref()), (Some(141), ""));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
}

/// A retired setting still set by a deployment (DESIGN §12: settings keep
/// working for the major version) is accepted with a WARN naming its
/// successor, where the subcommand reads the successor; nowhere else, and
/// not when it is unset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_setting_is_accepted_with_a_warning_naming_its_successor() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("oncegate.db");
    let sqlite = file.to_str().unwrap();
    let retired = ("ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID", "grants-relay-pod-0");
    let migrate = run_oncegate(&["migrate"], &[("ONCEGATE_SQLITE_PATH", sqlite), retired]).await;
    assert_eq!(migrate.code, Some(0), "{}", migrate.stderr);
    assert!(
        !migrate.stderr.contains("deprecated"),
        "migrate reads no relay setting: {}",
        migrate.stderr
    );
    let warned = run_oncegate(&["reconcile"], &[("ONCEGATE_SQLITE_PATH", sqlite), retired]).await;
    assert_eq!(warned.code, Some(0), "accepted, not exit 64: {}", warned.stderr);
    let warning = warned
        .stderr
        .lines()
        .find(|l| l.contains("deprecated setting"))
        .unwrap_or_else(|| panic!("a WARN: {}", warned.stderr));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        warning.contains("ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID")
            && warning.contains("successor=\"ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID_PREFIX\""),
        "names the setting and its successor: {warning}"
    );
    assert!(
        !warning.contains("grants-relay-pod-0"),
        "its value is not echoed: {warning}"
    );
    let plain = run_oncegate(&["reconcile"], &[("ONCEGATE_SQLITE_PATH", sqlite)]).await;
    assert_eq!(plain.code, Some(0), "{}", plain.stderr);
    assert!(!plain.stderr.contains("deprecated"), "{}", plain.stderr);
}
