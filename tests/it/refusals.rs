//! When the store answers but refuses (DESIGN §14): a grant revoked while
//! serving (SQLSTATE 42501) and the server turned read-only while serving
//! (25006) are outages of the store — `UNAVAILABLE` naming the cause, a
//! metric by cause, the Gate's health NOT_SERVING until a claim succeeds —
//! but not a lost connection: confirmed results go on answering from the
//! caches. Their warnings are folded (one line per cause and interval), the
//! change is undone while serving, and every delivery ends up claimed once,
//! nothing half-written. Also: the audit spool's disk full, then a SIGKILL
//! (every answered decision keeps its audit row), and twelve sidecars with
//! the chart's defaults on one Postgres with `max_connections = 100`.

use crate::chaos::{ThrowawayPg, running_as_root};
use crate::failover::health;
use crate::helpers::*;
use futures::StreamExt;
use oncegate::pb::gate_client::GateClient;
use oncegate::pb::{Outcome, Tier};
use sqlx::Connection;
use std::time::Duration;
use tonic::transport::Channel;

const TS: &str = "2026-11-29T10:00:00Z";
const GATE: &str = "oncegate.v1.Gate";

/// Runs `sql` on `url` as whoever it connects as.
async fn exec(url: &str, sql: &str) {
    let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
        .execute(&mut c)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn scalar(url: &str, sql: &str) -> i64 {
    let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_one(&mut c)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// One submission's answer: the outcome and tier, or the status.
async fn submit(client: &mut GateClient<Channel>, award: &str) -> Result<(Outcome, Tier), tonic::Status> {
    client
        .submit(submission(award, TS, award.as_bytes(), 100))
        .await
        .map(|r| {
            let d = r.into_inner();
            (outcome(&d), tier(&d))
        })
}

/// Submits every award `concurrency` at a time: the answers, in order.
async fn submit_all(
    client: &GateClient<Channel>,
    awards: &[String],
    concurrency: usize,
) -> Vec<Result<(Outcome, Tier), tonic::Status>> {
    futures::stream::iter(awards.iter().cloned())
        .map(|award| {
            let mut client = client.clone();
            async move { submit(&mut client, &award).await }
        })
        .buffered(concurrency)
        .collect()
        .await
}

/// Lines at WARN or above in a sidecar's text log.
fn warn_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect()
}

/// Claims, ledger rows, outbox events and processed audit rows: equal when
/// nothing is half-written.
async fn ledger(url: &str) -> [i64; 4] {
    [
        scalar(url, "SELECT count(*) FROM processed_messages").await,
        scalar(url, "SELECT count(*) FROM disbursements").await,
        scalar(url, "SELECT count(*) FROM outbox").await,
        scalar(url, "SELECT count(*) FROM audit_log WHERE decision = 'processed'").await,
    ]
}

/// Resubmits each award until it is claimed or a duplicate (the store
/// takes claims again); then each must be a duplicate.
async fn claimed_once_after(client: &GateClient<Channel>, awards: &[String]) {
    let answers = submit_all(client, awards, 16).await;
    for (award, answer) in awards.iter().zip(answers) {
        let (o, _) = answer.unwrap_or_else(|s| panic!("{award}: {s:?}"));
        assert_eq!(o, Outcome::Claimed, "{award}: refused before, so claimed now");
    }
    for (award, answer) in awards.iter().zip(submit_all(client, awards, 16).await) {
        assert_eq!(answer.expect("answered").0, Outcome::Duplicate, "{award}");
    }
}

/// A grant revoked while serving: 5,000 fresh claims answered UNAVAILABLE
/// naming the privilege and the table, a handful of WARN lines for all of
/// them, the confirmed result still answered from L1, health NOT_SERVING;
/// the grant back while serving and every claim is taken once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_grant_answers_unavailable_naming_it_and_logs_one_line() {
    let db = TestDb::new(Kind::Postgres).await;
    let role = unique("og_app_");
    db.exec(&format!("CREATE ROLE {role} LOGIN")).await;
    db.exec(&format!("SELECT oncegate_grant_app_role('{role}')"))
        .await;
    let role_url = db.url.replacen("root@", &format!("{role}@"), 1);
    // As the chart runs it: the application role, migrated by the owner.
    let app = Sidecar::start(&[
        ("DATABASE_URL", role_url),
        ("ONCEGATE_MIGRATE_ON_START", "false".into()),
    ])
    .await;
    let mut client = app.client().await;
    assert_eq!(submit(&mut client, "A-known").await.unwrap().0, Outcome::Claimed);
    assert_eq!(health(app.addr, GATE).await, "Serving");

    db.exec(&format!("REVOKE INSERT ON disbursements FROM {role}"))
        .await;
    let awards: Vec<String> = (0..5_000).map(|i| format!("A-{i:05}")).collect();
    let started = std::time::Instant::now();
    let answers = submit_all(&client, &awards, 32).await;
    let took = started.elapsed();
    // The log writer flushes every 10 ms: the last lines are in the file
    // once the gauge task has had its turn too.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = app.log_text();
    let warnings = warn_lines(&log);
    println!(
        "5000 refused claims in {took:?}: {} WARN+ lines, {} lines in all:\n{}",
        warnings.len(),
        log.lines().count(),
        warnings.join("\n")
    );
    for (award, answer) in awards.iter().zip(&answers) {
        let status = answer.as_ref().expect_err(award);
        assert_eq!(status.code(), tonic::Code::Unavailable, "{award}: {status:?}");
        assert!(
            status.message().contains("insufficient privilege")
                && status.message().contains("table disbursements"),
            "names the cause and the table: {}",
            status.message()
        );
    }
    let (o, t) = submit(&mut client, "A-known")
        .await
        .expect("the known result answers");
    assert_eq!(
        (o, t),
        (Outcome::Duplicate, Tier::LocalCache),
        "caches not suspended"
    );
    assert_eq!(health(app.addr, GATE).await, "NotServing");
    let m = app.metrics().await;
    assert!(
        metric(
            &m,
            "oncegate_store_refusals_total{cause=\"insufficient_privilege\"}"
        )
        .unwrap_or(0.0)
            >= 5_000.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "oncegate_store_refusing{cause=\"insufficient_privilege\"}"),
        Some(1.0)
    );
    assert_eq!(ledger(&db.url).await, [1, 1, 1, 1], "nothing half-written");
    let claim_failed = warnings.iter().filter(|l| l.contains("claim failed")).count();
    // The first at once, then one summary per 10 s interval (the run may
    // span a few on a loaded machine).
    let most = 2 + took.as_secs() as usize / 10;
    assert!(
        (1..=most).contains(&claim_failed),
        "{claim_failed} 'claim failed' lines for 5,000 refusals (at most {most}):\n{}",
        warnings.join("\n")
    );
    assert!(
        warnings.len() <= most + 4,
        "{} WARN lines:\n{}",
        warnings.len(),
        warnings.join("\n")
    );

    db.exec(&format!("GRANT INSERT ON disbursements TO {role}")).await;
    claimed_once_after(&client, &awards[..500]).await;
    let addr = app.addr;
    assert!(
        eventually(Duration::from_secs(10), || async move {
            health(addr, GATE).await == "Serving"
        })
        .await,
        "SERVING again once claims succeed"
    );
    assert_eq!(ledger(&db.url).await, [501, 501, 501, 501]);
    app.terminate().await;
    // Roles are cluster-wide: its grants go with DROP OWNED, then the role
    // (the test script drops og_ roles a panicking run left behind).
    db.exec(&format!("DROP OWNED BY {role}")).await;
    exec(&admin_url(), &format!("DROP DATABASE {} WITH (FORCE)", db.name)).await;
    exec(&admin_url(), &format!("DROP ROLE {role}")).await;
}

/// The server turned read-only while serving (a server-wide setting and a
/// reload: on a Postgres of the test's own): fresh claims UNAVAILABLE
/// saying read-only, never "lost its connection", cache answers not
/// suspended; undone while serving, every refused claim is taken once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_answers_unavailable_and_keeps_the_caches() {
    let pg = ThrowawayPg::start().await;
    let url = pg.url();
    open_store(&url, 1)
        .await
        .unwrap()
        .migrate()
        .await
        .expect("migrate");
    let app = Sidecar::start(&[("DATABASE_URL", url.clone())]).await;
    let mut client = app.client().await;
    assert_eq!(submit(&mut client, "R-known").await.unwrap().0, Outcome::Claimed);

    exec(&url, "ALTER SYSTEM SET default_transaction_read_only = on").await;
    exec(&url, "SELECT pg_reload_conf()").await;
    // The reload reaches each session before its next statement: claims
    // sent meanwhile may still be taken. Wait for the first refusal.
    let mut claimed_before = 0;
    let mut refused = Vec::new();
    for i in 0..200 {
        let award = format!("R-{i:03}");
        match submit(&mut client, &award).await {
            Ok((Outcome::Claimed, _)) => claimed_before += 1,
            Ok(other) => panic!("{award}: {other:?}"),
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
                assert!(
                    s.message().contains("read-only"),
                    "says read-only: {}",
                    s.message()
                );
                refused.push(award);
            }
        }
        if refused.len() >= 20 {
            break;
        }
    }
    assert_eq!(refused.len(), 20, "the read-only server refused claims");
    let (o, t) = submit(&mut client, "R-known")
        .await
        .expect("the known result answers");
    assert_eq!(
        (o, t),
        (Outcome::Duplicate, Tier::LocalCache),
        "caches not suspended"
    );
    assert_eq!(health(app.addr, GATE).await, "NotServing");
    let m = app.metrics().await;
    assert_eq!(metric(&m, "oncegate_store_identity_confirmed"), Some(1.0), "{m}");
    assert_eq!(
        metric(&m, "oncegate_store_refusing{cause=\"read_only\"}"),
        Some(1.0)
    );
    let log = app.log_text();
    assert!(
        !log.contains("lost its connection"),
        "not a lost connection:\n{log}"
    );
    let n = 1 + claimed_before;
    assert_eq!(ledger(&url).await, [n, n, n, n], "nothing half-written");

    exec(&url, "ALTER SYSTEM RESET default_transaction_read_only").await;
    exec(&url, "SELECT pg_reload_conf()").await;
    let probe = app.client().await;
    let writable = eventually(Duration::from_secs(10), || {
        let mut c = probe.clone();
        async move { submit(&mut c, "R-after").await.is_ok() }
    })
    .await;
    assert!(writable, "claims resume once the server takes writes");
    claimed_once_after(&client, &refused).await;
    let n = n + 1 + refused.len() as i64;
    assert_eq!(ledger(&url).await, [n, n, n, n]);
    assert_eq!(health(app.addr, GATE).await, "Serving");
    app.terminate().await;
}

/// A tmpfs of 256 KiB as the audit spool, filled after the first claim:
/// 200 redeliveries answered DUPLICATE (their rows written through to the
/// database, the spool cannot take them), then a SIGKILL and a restart on
/// the same spool: every answered decision has its audit row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_spool_loses_no_answered_decision_through_a_kill() {
    if !running_as_root() {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let db = TestDb::new(Kind::Postgres).await;
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    std::fs::create_dir(&spool).unwrap();
    let mount = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&spool)
        .status()
        .expect("mount");
    assert!(mount.success(), "mount a tmpfs");
    let _unmount = Unmount(spool.clone());
    let env = |flush: &str| {
        vec![
            ("DATABASE_URL", db.url.clone()),
            ("ONCEGATE_AUDIT_SPOOL_DIR", spool.display().to_string()),
            ("ONCEGATE_AUDIT_FLUSH_INTERVAL", flush.to_string()),
        ]
    };
    // Rows wait in the spool and in memory for an hour: only what is in
    // the database or on the spool's disk is there after the kill.
    let app = Sidecar::start(&env("1h")).await;
    let mut client = app.client().await;
    assert_eq!(submit(&mut client, "S-1").await.unwrap().0, Outcome::Claimed);
    fill(&spool.join("filler"));
    let mut answered = 0;
    for _ in 0..200 {
        match submit(&mut client, "S-1").await {
            Ok((Outcome::Duplicate, _)) => answered += 1,
            Ok(other) => panic!("{other:?}"),
            Err(s) => assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}"),
        }
    }
    app.kill().await;
    let app = Sidecar::start(&env("100ms")).await;
    let duplicates = "SELECT count(*) FROM audit_log WHERE decision = 'duplicate'";
    let url = db.url.clone();
    eventually(Duration::from_secs(10), || {
        let url = url.clone();
        async move { scalar(&url, duplicates).await >= answered }
    })
    .await;
    let kept = scalar(&db.url, duplicates).await;
    println!("spool full, SIGKILL: {answered} duplicates answered, {kept} audit rows kept");
    assert_eq!(
        answered, 200,
        "the database took the rows: every redelivery answered"
    );
    assert_eq!(kept, answered, "every answered decision has its audit row");
    assert_eq!(ledger(&db.url).await, [1, 1, 1, 1]);
    app.terminate().await;
}

/// Writes zeros to `path` until the disk is full (a buffered write would
/// fail again on close; this stops at the first short write).
fn fill(path: &std::path::Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let block = [0u8; 4096];
    while f.write(&block).map(|n| n == block.len()).unwrap_or(false) {}
}

struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// Twelve sidecars with the chart's default pool on one Postgres with
/// `max_connections = 100`: every one serves claims at once, and the
/// connections each holds busy and idle are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_sidecars_with_the_charts_defaults_fit_max_connections_100() {
    let pool = chart_pool_size();
    let pg = ThrowawayPg::start().await;
    let url = pg.url();
    open_store(&url, 1)
        .await
        .unwrap()
        .migrate()
        .await
        .expect("migrate");
    let spools = tempfile::tempdir().unwrap();
    let mut pods = Vec::new();
    for _ in 0..12 {
        pods.push(
            Sidecar::start(&[
                ("DATABASE_URL", url.clone()),
                ("ONCEGATE_DB_POOL_SIZE", pool.to_string()),
                // The binary's defaults, which the chart keeps (the test
                // harness turns them off): each holds a connection a while.
                ("ONCEGATE_PURGE_INTERVAL", "1h".into()),
                ("ONCEGATE_AUDIT_SEAL_INTERVAL", "1m".into()),
                (
                    "ONCEGATE_AUDIT_SPOOL_DIR",
                    spools.path().join(pods.len().to_string()).display().to_string(),
                ),
            ])
            .await,
        );
    }
    let held = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'oncegate'";
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_before = scalar(&url, held).await;
    let mut busy = 0;
    let claimed = {
        let bursts = pods.iter().enumerate().map(|(p, pod)| async move {
            let client = pod.client().await;
            let awards: Vec<String> = (0..100).map(|i| format!("P{p}-{i}")).collect();
            let answers = submit_all(&client, &awards, 16).await;
            answers
                .into_iter()
                .filter(|a| matches!(a, Ok((Outcome::Claimed, _))))
                .count()
        });
        let all = futures::future::join_all(bursts);
        tokio::pin!(all);
        loop {
            tokio::select! {
                claimed = &mut all => break claimed,
                _ = tokio::time::sleep(Duration::from_millis(20)) => {
                    busy = busy.max(scalar(&url, held).await);
                }
            }
        }
    };
    assert_eq!(claimed, vec![100; 12], "every sidecar serves");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = scalar(&url, held).await;
    println!(
        "12 sidecars, pool {pool}: {idle_before} connections idle before load ({:.1} per pod), \
         {busy} at most under load ({:.1} per pod), {idle} idle after it ({:.1} per pod)",
        idle_before as f64 / 12.0,
        busy as f64 / 12.0,
        idle as f64 / 12.0
    );
    assert!(busy <= 97, "within max_connections less the reserved: {busy}");
    for pod in pods {
        pod.terminate().await;
    }
}

/// `database.poolSize` in the chart's values.yaml.
fn chart_pool_size() -> u32 {
    let values =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/helm/oncegate/values.yaml")).unwrap();
    let database = values.split("\ndatabase:").nth(1).expect("a database section");
    database
        .lines()
        .find_map(|l| l.trim().strip_prefix("poolSize:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("database.poolSize")
}
