//! A Postgres primary that acknowledges commits before a standby has them
//! can lose answered claims in a failover: start-up says so, and with
//! ONCEGATE_REQUIRE_SYNC_REPLICA refuses to serve (exit 64).

use crate::helpers::*;
use std::time::Duration;

/// The shared test server has no standby: the sidecar reports it
/// (`oncegate_db_sync_replica` 0) and serves when not required to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asynchronous_primary_is_reported() {
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let metrics = app.metrics().await;
    assert_eq!(
        metric(&metrics, "oncegate_db_sync_replica"),
        Some(0.0),
        "{metrics}"
    );
    app.shutdown().await;
}

/// With ONCEGATE_REQUIRE_SYNC_REPLICA=true and no synchronous standby the
/// real binary exits 64 naming the setting and the server's values; on
/// SQLite the setting is refused as a configuration error too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_sync_replica_refuses_an_asynchronous_primary() {
    let db = TestDb::new(Kind::Postgres).await;
    let (code, err) = run(
        &[
            "serve",
            "--database-url",
            &db.url,
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        &[("ONCEGATE_REQUIRE_SYNC_REPLICA", "true")],
    )
    .await;
    assert_eq!(code, 64, "refused: {err}");
    assert!(
        err.contains("ONCEGATE_REQUIRE_SYNC_REPLICA"),
        "names the setting: {err}"
    );
    assert!(
        err.contains("synchronous_standby_names = \"\""),
        "names the server's value: {err}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = format!("sqlite://{}", dir.path().join("og.db").display());
    let (code, err) = run(
        &[
            "serve",
            "--database-url",
            &sqlite,
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        &[("ONCEGATE_REQUIRE_SYNC_REPLICA", "true")],
    )
    .await;
    assert_eq!(code, 64, "refused: {err}");
    assert!(err.contains("needs Postgres"), "names why: {err}");
}

async fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncegate"));
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .env_remove("ONCEGATE_REQUIRE_SYNC_REPLICA")
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the binary exits by itself")
        .expect("the binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
