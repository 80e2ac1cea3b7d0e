//! Shared test harness: real Postgres (a fresh database per test), real
//! Redis (a key prefix per test), the real server over loopback on port 0,
//! the real binary as a subprocess, and a TCP proxy that cuts a connection
//! to inject a store outage without touching the shared server.
//!
//! Environment: `ONCEGATE_TEST_DATABASE_URL` (admin URL, default
//! `postgres://root@127.0.0.1:5432/test`), `ONCEGATE_TEST_REDIS_URL`
//! (default `redis://127.0.0.1:6379`), `ONCEGATE_TEST_NATS_URL` (default
//! `nats://127.0.0.1:4222`), `TEST_LOG=1` for tracing output.
#![allow(dead_code)]

use clap::Parser;
use oncegate::cli::{Cli, Command};
use oncegate::config::ServeArgs;
use oncegate::pb::gate_client::GateClient;
use oncegate::pb::{self, Outcome, Tier};
use oncegate::store::Store;
use sqlx::Connection;
use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Once};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

/// The `oncegate` binary the tests run: `ONCEGATE_TEST_BIN` when set (the
/// flake hunt runs a copy, so that a build meanwhile does not change the
/// binary under it), else the one cargo built with these tests.
pub fn oncegate_bin() -> std::path::PathBuf {
    match std::env::var_os("ONCEGATE_TEST_BIN") {
        Some(path) if !path.is_empty() => path.into(),
        _ => env!("CARGO_BIN_EXE_oncegate").into(),
    }
}

/// The seed of a random test: `ONCEGATE_TEST_SEED` when set (to replay a
/// failure), else a fresh one. Printed on the test's own output, which a
/// failure shows: `ONCEGATE_TEST_SEED=<it> scripts/test <test name>` draws the
/// same data again.
pub fn test_seed() -> u64 {
    let seed = match std::env::var("ONCEGATE_TEST_SEED") {
        Ok(s) if !s.trim().is_empty() => s
            .trim()
            .parse()
            .expect("ONCEGATE_TEST_SEED is a number (as a test printed it)"),
        _ => rand::random(),
    };
    println!("ONCEGATE_TEST_SEED={seed}");
    seed
}

/// Opens a store by URL, as the binary does.
pub async fn open_store(url: &str, pool_size: u32) -> Result<Arc<dyn Store>, oncegate::error::StoreError> {
    oncegate::store::open(&oncegate::store::StoreSettings::new(url, pool_size)).await
}

pub fn admin_url() -> String {
    std::env::var("ONCEGATE_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into())
}

pub fn redis_url() -> String {
    std::env::var("ONCEGATE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

pub fn nats_url() -> String {
    std::env::var("ONCEGATE_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

pub fn init_logging() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var("TEST_LOG").is_ok() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(
                    std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
                ))
                .with_test_writer()
                .try_init();
        }
    });
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}", uuid::Uuid::new_v4().simple())
}

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Postgres,
    Sqlite,
}

/// A fresh, empty, migrated database of one kind.
pub struct TestDb {
    pub kind: Kind,
    pub url: String,
    pub name: String,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub async fn new(kind: Kind) -> Self {
        let db = Self::unmigrated(kind).await;
        db.open().await.migrate().await.expect("migrate");
        db
    }

    /// A fresh, empty database with no schema at all.
    pub async fn unmigrated(kind: Kind) -> Self {
        init_logging();
        match kind {
            Kind::Postgres => {
                let name = unique("og_");
                let mut admin = sqlx::PgConnection::connect(&admin_url())
                    .await
                    .expect("admin connection");
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&mut admin)
                    .await
                    .expect("create database");
                let url = db_url_for(&name);
                Self {
                    kind,
                    url,
                    name,
                    _dir: None,
                }
            }
            Kind::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let path = dir.path().join("oncegate.db");
                Self {
                    kind,
                    url: format!("sqlite://{}", path.display()),
                    name: "sqlite".into(),
                    _dir: Some(dir),
                }
            }
        }
    }

    pub async fn open(&self) -> Arc<dyn Store> {
        open_store(&self.url, 2).await.expect("open store")
    }

    /// Runs one statement directly (test setup: triggers, backdating).
    pub async fn exec(&self, sql: &str) {
        match self.kind {
            Kind::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.url).await.unwrap();
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
                    .execute(&mut c)
                    .await
                    .unwrap();
            }
            Kind::Sqlite => {
                let mut c = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
                    .execute(&mut c)
                    .await
                    .unwrap();
            }
        }
    }

    /// Runs one statement, returning its error message if it fails.
    pub async fn try_exec(&self, sql: &str) -> Result<(), String> {
        let r = match self.kind {
            Kind::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.url).await.unwrap();
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
                    .execute(&mut c)
                    .await
                    .map(|_| ())
            }
            Kind::Sqlite => {
                let mut c = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
                    .execute(&mut c)
                    .await
                    .map(|_| ())
            }
        };
        r.map_err(|e| e.to_string())
    }

    /// One integer from a query.
    pub async fn scalar(&self, sql: &str) -> i64 {
        match self.kind {
            Kind::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.url).await.unwrap();
                sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_string()))
                    .fetch_one(&mut c)
                    .await
                    .unwrap()
            }
            Kind::Sqlite => {
                let mut c = sqlx::SqliteConnection::connect(&self.url).await.unwrap();
                sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_string()))
                    .fetch_one(&mut c)
                    .await
                    .unwrap()
            }
        }
    }

    pub async fn counts(&self) -> Counts {
        Counts {
            claims: self.scalar("SELECT count(*) FROM processed_messages").await,
            disbursements: self.scalar("SELECT count(*) FROM disbursements").await,
            balance_cents: self
                .scalar("SELECT CAST(coalesce(sum(total_cents), 0) AS BIGINT) FROM award_balances")
                .await,
            outbox: self.scalar("SELECT count(*) FROM outbox").await,
            audit_processed: self
                .scalar("SELECT count(*) FROM audit_log WHERE decision = 'processed'")
                .await,
            audit_duplicate: self
                .scalar("SELECT count(*) FROM audit_log WHERE decision = 'duplicate'")
                .await,
            audit_rejected: self
                .scalar("SELECT count(*) FROM audit_log WHERE decision = 'rejected'")
                .await,
        }
    }
}

fn db_url_for(name: &str) -> String {
    let admin = admin_url();
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
    format!("{base}/{name}")
}

/// Row counts of every table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub claims: i64,
    pub disbursements: i64,
    pub balance_cents: i64,
    pub outbox: i64,
    pub audit_processed: i64,
    pub audit_duplicate: i64,
    pub audit_rejected: i64,
}

impl Counts {
    pub fn ledger(&self) -> (i64, i64, i64, i64) {
        (self.claims, self.disbursements, self.balance_cents, self.outbox)
    }
}

/// `serve` arguments as production parses them, on port 0, with everything
/// optional switched off unless a test turns it on.
pub fn serve_args(db: &TestDb) -> ServeArgs {
    serve_args_for_url(&db.url)
}

/// [`serve_args`] for a store URL of the test's own (another role, a proxy).
pub fn serve_args_for_url(url: &str) -> ServeArgs {
    let argv = [
        "oncegate",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--db-pool-size",
        "3",
        "--purge-interval",
        "0s",
        "--reconcile-interval",
        "0s",
        "--startup-timeout",
        "10s",
        "--shutdown-grace",
        "5s",
        "--audit-flush-interval",
        "100ms",
        // Beside CPU burners a timer fires hundreds of milliseconds late:
        // a probe answer that late must not suspend the caches of a test
        // about something else (cache_window measures the defaults).
        "--primary-probe-timeout",
        "3s",
    ];
    let Command::Serve(mut args) = Cli::try_parse_from(argv).expect("valid args").command else {
        unreachable!()
    };
    // The environment must not leak in (REDIS_URL, DATABASE_URL, …).
    args.store.database_url = Some(url.to_string());
    args.redis_url = None;
    args.relay.broker.relay_sink = oncegate::broker::SinkSpec::None;
    args.instance.instance_id = Some(unique("it-"));
    // Sealing off unless a test turns it on: every seal is also an
    // audit.sealed outbox event, which would change the events tests count.
    args.audit_seal.audit_seal_interval = Duration::ZERO;
    *args
}

/// Adds a Redis L2 with a prefix of its own. Its timeout is one a loaded
/// machine's Redis meets (these tests assert which tier answered, not how
/// fast: at the production default of 50 ms a CPU-starved test fell back to
/// the database); the timeout itself is tested in `tiers.rs`.
pub fn with_redis(mut args: ServeArgs, url: &str, prefix: &str) -> ServeArgs {
    args.redis_url = Some(url.to_string());
    args.redis_key_prefix = prefix.to_string();
    args.redis_breaker_cooldown = Duration::from_millis(300);
    args.redis_timeout = Duration::from_secs(1);
    args
}

/// The real server, in-process, on loopback.
pub struct TestApp {
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub store: Arc<dyn Store>,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<anyhow::Result<()>>>,
}

impl TestApp {
    pub async fn spawn(args: ServeArgs) -> Self {
        init_logging();
        let app = oncegate::App::build(args.app_config().expect("valid config"))
            .await
            .expect("app builds");
        let (addr, metrics_addr, store) = (app.local_addr(), app.metrics_addr(), app.store());
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(app.run_until_shutdown(async move {
            let _ = stopped.await;
        }));
        Self {
            addr,
            metrics_addr,
            store,
            stop: Some(stop),
            handle: Some(handle),
        }
    }

    pub async fn client(&self) -> GateClient<Channel> {
        GateClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect")
    }

    pub async fn metrics(&self) -> String {
        scrape(self.metrics_addr).await
    }

    /// The shutdown signal, then the full drain.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(h) = self.handle.take() {
            h.await.expect("join").expect("clean shutdown");
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// GET /metrics.
pub async fn scrape(addr: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = TcpStream::connect(addr).await.expect("metrics port");
    s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    body
}

/// The value of one metric line (exact name with labels), if present.
pub fn metric(text: &str, name_with_labels: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name_with_labels) && l[name_with_labels.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A submission builder.
pub fn submission(award: &str, ts: &str, payload: &[u8], amount: i64) -> pb::Submission {
    pb::Submission {
        award_id: award.into(),
        submission_timestamp: ts.into(),
        payload: payload.to_vec(),
        amount_cents: amount,
        idempotency_key: None,
    }
}

pub fn outcome(d: &pb::Decision) -> Outcome {
    Outcome::try_from(d.outcome).expect("known outcome")
}

pub fn tier(d: &pb::Decision) -> Tier {
    Tier::try_from(d.decided_by).expect("known tier")
}

/// A free loopback port, drawn below the kernel's ephemeral range
/// (32768–60999 by default) and checked by binding it. A port the kernel
/// hands out for `bind(0)` or an outgoing connection can be taken again by
/// any socket in the suite between our release and the child's bind (a
/// throwaway Kafka broker once failed to start that way, and a server that
/// is stopped and started on the same port mid-test would be exposed for
/// the whole outage); one from below that range could only be taken by
/// another test drawing the same number, so no number is handed out twice
/// in this process (two tests once drew one: the second's sidecar could
/// not bind it, and its client talked to the first's).
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let port = rand::random_range(20_000..32_000);
        let mut handed_out = HANDED_OUT.lock().unwrap();
        if !handed_out.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.push(port);
            return port;
        }
    }
}

/// Sessions of `db` waiting on a lock (a row lock, an advisory lock): the
/// state a test waits for before it goes on, instead of sleeping.
pub async fn sessions_waiting_on_a_lock(db: &TestDb) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = '{}' AND wait_event_type = 'Lock'",
        db.name
    ))
    .await
}

/// Polls `f` until it returns true or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if f().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A TCP proxy in front of a real server. `cut()` drops every connection
/// and refuses new ones (the server "goes away"); `restore()` brings it back;
/// `repoint()` sends new connections to another server (a Service whose
/// endpoint moved to a promoted standby); `freeze()` stops forwarding
/// without closing anything (a host that vanished without a reset: packets
/// dropped), until `cut()`.
pub struct FaultProxy {
    pub addr: SocketAddr,
    up: watch::Sender<bool>,
    frozen: watch::Sender<bool>,
    upstream: Arc<std::sync::Mutex<SocketAddr>>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (up, up_rx) = watch::channel(true);
        let (frozen, frozen_rx) = watch::channel(false);
        let upstream = Arc::new(std::sync::Mutex::new(upstream));
        let target = upstream.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                if !*up_rx.borrow() {
                    drop(inbound);
                    continue;
                }
                let upstream = *target.lock().unwrap();
                tokio::spawn(forward(inbound, upstream, up_rx.clone(), frozen_rx.clone()));
            }
        });
        Self {
            addr,
            up,
            frozen,
            upstream,
            task,
        }
    }

    /// New connections go to `to` from now on.
    pub fn repoint(&self, to: SocketAddr) {
        *self.upstream.lock().unwrap() = to;
    }

    pub fn cut(&self) {
        let _ = self.up.send(false);
    }

    pub fn restore(&self) {
        let _ = self.frozen.send(false);
        let _ = self.up.send(true);
    }

    /// Nothing passes any more, in either direction, and nothing is
    /// closed: connections hang (until `cut()`), new ones are accepted and
    /// hang too.
    pub fn freeze(&self) {
        let _ = self.frozen.send(true);
    }

    /// A Postgres URL for `db` that goes through this proxy.
    pub fn pg_url(&self, db: &TestDb) -> String {
        format!("postgres://root@{}/{}", self.addr, db.name)
    }
}

/// One proxied connection: copies both ways until cut; once frozen, holds
/// both sockets open without copying (until cut).
async fn forward(
    mut inbound: TcpStream,
    upstream: SocketAddr,
    mut up: watch::Receiver<bool>,
    mut frozen: watch::Receiver<bool>,
) {
    if !*frozen.borrow() {
        let Ok(mut outbound) = TcpStream::connect(upstream).await else {
            return;
        };
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => return,
            _ = up.wait_for(|up| !*up) => return,
            _ = frozen.wait_for(|f| *f) => {}
        }
        let _held = outbound;
        let _ = up.wait_for(|up| !*up).await;
    } else {
        let _ = up.wait_for(|up| !*up).await;
    }
    drop(inbound);
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn pg_addr() -> SocketAddr {
    let url = admin_url();
    let hostport = url
        .split('@')
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or("127.0.0.1:5432");
    let hostport = hostport.replace("localhost", "127.0.0.1");
    let hostport = if hostport.contains(':') {
        hostport
    } else {
        format!("{hostport}:5432")
    };
    hostport.parse().expect("admin URL host:port")
}

/// A throwaway redis-server on a free port (it may be killed, flushed or
/// restarted by the test without touching the shared one).
pub struct ThrowawayRedis {
    pub port: u16,
    child: Option<tokio::process::Child>,
}

impl ThrowawayRedis {
    pub async fn start() -> Self {
        let mut r = Self {
            port: free_port(),
            child: None,
        };
        r.restart().await;
        r
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub async fn restart(&mut self) {
        self.stop().await;
        let child = tokio::process::Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server on PATH");
        self.child = Some(child);
        let port = self.port;
        assert!(
            eventually(Duration::from_secs(5), || async move {
                TcpStream::connect(("127.0.0.1", port)).await.is_ok()
            })
            .await,
            "throwaway redis did not start"
        );
    }

    pub async fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
            let _ = c.wait().await;
        }
    }
}

/// The real binary as a subprocess (`oncegate serve`), on free ports.
pub struct Sidecar {
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    child: tokio::process::Child,
    pub log: std::path::PathBuf,
}

impl Sidecar {
    /// Starts `oncegate serve` with `env` (on top of a clean environment
    /// with test ports) and waits until it answers health checks.
    pub async fn start(env: &[(&str, String)]) -> Self {
        Self::start_bin(&oncegate_bin(), env).await
    }

    /// [`Sidecar::start`] of another build of `oncegate` (the previous
    /// release, in the upgrade test).
    pub async fn start_bin(bin: &std::path::Path, env: &[(&str, String)]) -> Self {
        let (port, mport) = (free_port(), free_port());
        let log = std::env::temp_dir()
            .join(unique("oncegate-sidecar-"))
            .with_extension("log");
        let file = std::fs::File::create(&log).unwrap();
        let mut cmd = tokio::process::Command::new(bin);
        cmd.arg("serve")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("ONCEGATE_LISTEN", format!("127.0.0.1:{port}"))
            .env("ONCEGATE_METRICS_LISTEN", format!("127.0.0.1:{mport}"))
            .env("ONCEGATE_DB_POOL_SIZE", "3")
            .env("ONCEGATE_PURGE_INTERVAL", "0s")
            // As serve_args: sealing off unless the test sets an interval.
            .env("ONCEGATE_AUDIT_SEAL_INTERVAL", "0s")
            // As serve_args: a late timer does not suspend the caches.
            .env("ONCEGATE_PRIMARY_PROBE_TIMEOUT", "3s")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn oncegate");
        let s = Self {
            addr: format!("127.0.0.1:{port}").parse().unwrap(),
            metrics_addr: format!("127.0.0.1:{mport}").parse().unwrap(),
            child,
            log,
        };
        let addr = s.addr;
        assert!(
            eventually(Duration::from_secs(20), || async move {
                GateClient::connect(format!("http://{addr}")).await.is_ok()
            })
            .await,
            "sidecar did not start; log: {}",
            std::fs::read_to_string(&s.log).unwrap_or_default()
        );
        s
    }

    pub async fn client(&self) -> GateClient<Channel> {
        GateClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect")
    }

    pub async fn metrics(&self) -> String {
        scrape(self.metrics_addr).await
    }

    pub fn pid(&self) -> i32 {
        self.child.id().expect("running") as i32
    }

    /// SIGTERM, then wait for the exit status.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status();
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("exits within the grace")
            .unwrap()
    }

    /// SIGKILL.
    pub async fn kill(mut self) {
        let _ = self.child.kill().await;
        let _ = self.child.wait().await;
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log once it contains `needle`, or as it is after `within`: the
    /// sidecar's log writer flushes every few milliseconds, so a line can
    /// reach the file just after the event it reports is visible elsewhere.
    pub async fn log_containing(&self, needle: &str, within: Duration) -> String {
        let deadline = std::time::Instant::now() + within;
        loop {
            let text = self.log_text();
            if text.contains(needle) || std::time::Instant::now() >= deadline {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A plain Redis client for test setup and inspection.
pub async fn redis_client(url: &str) -> fred::clients::Client {
    use fred::prelude::*;
    let client = Builder::from_config(Config::from_url(url).unwrap())
        .build()
        .unwrap();
    client.init().await.expect("redis reachable");
    client
}

// ---- helpers several test files share (one definition each) ---------------

/// The statements of the ```sql block in `migrations/GRANTS.md` that grant
/// (every one but its `CREATE ROLE` lines), for `role` instead of
/// `oncegate_app`, each on one line.
pub fn documented_grants(role: &str) -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/GRANTS.md")).unwrap();
    let sql: String = doc
        .split("```sql")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("a ```sql block in GRANTS.md")
        .lines()
        .map(|l| l.split("--").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let grants: Vec<String> = sql
        .split(';')
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|s| !s.is_empty() && !s.starts_with("CREATE ROLE"))
        .map(|s| s.replace("oncegate_app", role))
        .collect();
    assert!(grants.len() >= 6, "{grants:?}");
    grants
}

/// `days` (fractions too) before now.
pub fn days_ago(days: f64) -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc() - Duration::from_secs_f64(days * 86_400.0)
}

/// Runs `sql` (one or more statements) as whoever `url` connects as; on
/// failure, the SQLSTATE (empty when there is none) and the message.
pub async fn run_as(url: &str, sql: &str) -> Result<(), (String, String)> {
    let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
        .execute(&mut c)
        .await
        .map(|_| ())
        .map_err(sqlstate_and_message)
}

/// A failed statement as its SQLSTATE (empty when there is none) and its
/// message, what [`run_as`] and the grant tests compare.
pub fn sqlstate_and_message(e: sqlx::Error) -> (String, String) {
    let code = e
        .as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
        .unwrap_or_default();
    (code, e.to_string())
}

/// Creates a Kafka topic of `partitions` on the broker at `bootstrap`
/// (`host:port`, or a `kafka://` URL), with `config` set.
pub async fn create_topic(bootstrap: &str, name: &str, partitions: i32, config: &[(&str, &str)]) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap.trim_start_matches("kafka://"))
        .create()
        .unwrap();
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in config {
        topic = topic.set(k, v);
    }
    let created = admin.create_topics(&[topic], &AdminOptions::new()).await.unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");
}

/// What one run of the binary did.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// (exited 0, stdout, stderr).
    pub fn into_parts(self) -> (bool, String, String) {
        (self.code == Some(0), self.stdout, self.stderr)
    }
}

/// Runs the real binary with only `PATH` and `env` in its environment (none
/// of the test's own: DATABASE_URL, REDIS_URL, … must not leak in), at
/// most a minute.
pub async fn run_oncegate(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = tokio::process::Command::new(oncegate_bin());
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the command ends by itself")
        .expect("the binary runs");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A sidecar process on the store at `url`, named `instance`, with what
/// every multi-sidecar test gives it (four connections, 30 s to start, the
/// primary's log at INFO) and `extra` (a later setting wins).
pub async fn start_sidecar(url: String, instance: String, extra: &[(&str, String)]) -> Sidecar {
    let mut env = vec![
        ("DATABASE_URL", url),
        ("ONCEGATE_INSTANCE_ID", instance),
        ("ONCEGATE_DB_POOL_SIZE", "4".to_string()),
        ("ONCEGATE_STARTUP_TIMEOUT", "30s".to_string()),
        ("RUST_LOG", "warn,oncegate::primary=info".to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, v.clone())));
    Sidecar::start(&env).await
}
