//! Postgres failover (DESIGN §7.2). A primary that acknowledges commits
//! before a standby has them can lose answered claims in a failover:
//! start-up says so, and with ONCEGATE_REQUIRE_SYNC_REPLICA claims are
//! refused while no synchronous standby confirms commits (the guard's own
//! tests, against a real primary and standby, are in `sync_guard`).
//!
//! The failover harness: a primary and a streaming standby of its own on
//! loopback (`initdb`, `pg_basebackup -R`), the standby's replication link
//! and the "Service" both through the test's own forwarders, two sidecars
//! under load from many clients that redeliver. The primary is SIGKILLed,
//! the standby promoted (`pg_ctl promote`) and the Service repointed.
//! - synchronous standby: every decision a client received is on the new
//!   primary, identical; totals and sequences exact; the sidecars recover
//!   without a restart, answering only UNAVAILABLE in between;
//! - asynchronous standby whose link was cut before the kill: the claims
//!   committed after the cut are lost, and no cache answers for them — not
//!   on the two sidecars, not on a third started after the failover.
//!
//! Each prints its figures (`--nocapture`).

use crate::chaos::{pg_command, run as run_ok, running_as_root};
use crate::helpers::*;
use oncegate::pb::effects_client::EffectsClient;
use oncegate::pb::gate_client::GateClient;
use oncegate::pb::{self, Outcome, Tier};
use sqlx::{Connection, Row};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

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

/// With ONCEGATE_REQUIRE_SYNC_REPLICA=true and no synchronous standby (the
/// shared test server names none) the real binary starts, but refuses
/// claims: UNAVAILABLE naming what is missing, the Gate's health
/// NOT_SERVING (the process's own stays SERVING: no restart), and the gauge
/// names the reason. On SQLite the setting is a configuration error (exit 64).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_sync_replica_without_a_standby_serves_no_claims() {
    let db = TestDb::new(Kind::Postgres).await;
    let sidecar = Sidecar::start(&[
        ("DATABASE_URL", db.url.clone()),
        ("ONCEGATE_REQUIRE_SYNC_REPLICA", "true".into()),
    ])
    .await;
    let mut client = sidecar.client().await;
    let refused = client
        .submit(submission("AWD-NOSYNC", "2026-12-04T10:00:00Z", b"p", 10))
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("ONCEGATE_REQUIRE_SYNC_REPLICA")
            && refused.message().contains("synchronous_standby_names is empty"),
        "names the setting and what is missing: {}",
        refused.message()
    );
    assert_eq!(health(sidecar.addr, "oncegate.v1.Gate").await, "NotServing");
    assert_eq!(health(sidecar.addr, "").await, "Serving");
    let metrics = sidecar.metrics().await;
    assert_eq!(
        metric(
            &metrics,
            "oncegate_sync_standby_shortfall{reason=\"no_standby_named\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(metric(&metrics, "oncegate_db_sync_replica"), Some(0.0));
    assert_eq!(
        db.scalar("SELECT count(*) FROM processed_messages").await,
        0,
        "nothing written"
    );
    sidecar.kill().await;

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

/// The gRPC health of `service` on a sidecar, as its status's name.
pub(crate) async fn health(addr: SocketAddr, service: &str) -> String {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect");
    let status = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("health answers")
        .into_inner()
        .status;
    format!(
        "{:?}",
        tonic_health::pb::health_check_response::ServingStatus::try_from(status).expect("a status")
    )
}

pub(crate) async fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = tokio::process::Command::new(oncegate_bin());
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

/// A primary and a streaming standby of their own, the standby's link and
/// the Service through forwarders of the test's own.
pub(crate) struct Pair {
    dir: tempfile::TempDir,
    pub(crate) primary_port: u16,
    pub(crate) standby_port: u16,
    /// The standby's replication connection: cut it and the standby falls behind.
    pub(crate) link: FaultProxy,
    /// What the sidecars connect to.
    pub(crate) service: FaultProxy,
}

pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

impl Pair {
    pub(crate) async fn start(synchronous: bool) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        if running_as_root() {
            // Postgres refuses to run as root: the clusters belong to `postgres`.
            run_ok(
                std::process::Command::new("chown")
                    .args(["-R", "postgres"])
                    .arg(dir.path()),
            );
        }
        let primary_port = free_port();
        let primary = dir.path().join("primary");
        blocking(pg_command("initdb").arg("-D").arg(&primary).args([
            "-A",
            "trust",
            "-U",
            "root",
            "--no-sync",
        ]))
        .await;
        let link = FaultProxy::start(loopback(primary_port)).await;
        let pair = Self {
            standby_port: free_port(),
            service: FaultProxy::start(loopback(primary_port)).await,
            link,
            primary_port,
            dir,
        };
        pair.pg_start(&primary, primary_port, "primary", "").await;
        blocking(
            pg_command("pg_basebackup")
                .arg("-D")
                .arg(pair.data("standby"))
                .args([
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "root",
                    "-R",
                    "-c",
                    "fast",
                    "-X",
                    "stream",
                ])
                .args(["-p", &primary_port.to_string()]),
        )
        .await;
        // A standby whose link comes back reconnects within 200 ms (the
        // default retry is 5 s).
        let conninfo = format!(
            "-c cluster_name=standby1 -c wal_retrieve_retry_interval=200ms \
             -c primary_conninfo='host=127.0.0.1 port={} user=root application_name=standby1'",
            pair.link.addr.port()
        );
        pair.pg_start(&pair.data("standby"), pair.standby_port, "standby", &conninfo)
            .await;
        if synchronous {
            pair.primary_sql("ALTER SYSTEM SET synchronous_standby_names = 'standby1'")
                .await;
            pair.primary_sql("SELECT pg_reload_conf()").await;
        }
        let want = if synchronous { "sync" } else { "async" };
        let port = pair.primary_port;
        let streaming = eventually(Duration::from_secs(20), || async move {
            replication_state(port).await.as_deref() == Some(want)
        })
        .await;
        assert!(streaming, "the standby streams ({want})");
        pair
    }

    pub(crate) fn data(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    async fn pg_start(&self, data: &std::path::Path, port: u16, name: &str, extra: &str) {
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=60 \
             -c wal_keep_size=256MB {extra}",
            self.dir.path().display()
        );
        blocking(
            pg_command("pg_ctl")
                .arg("-D")
                .arg(data)
                .args(["-o", &options, "-l"])
                .arg(self.dir.path().join(format!("{name}.log")))
                .args(["-w", "start"]),
        )
        .await;
    }

    pub(crate) async fn primary_sql(&self, sql: &str) {
        let mut c = sqlx::PgConnection::connect(&pg_url(self.primary_port))
            .await
            .expect("primary");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
            .execute(&mut c)
            .await
            .expect(sql);
    }

    /// The Service's URL (what the sidecars are given).
    pub(crate) fn url(&self) -> String {
        format!("postgres://root@{}/postgres", self.service.addr)
    }

    /// SIGKILL of the primary's postmaster (its backends die with it).
    pub(crate) fn kill_primary(&self) {
        let pid =
            std::fs::read_to_string(self.data("primary").join("postmaster.pid")).expect("postmaster.pid");
        let pid = pid.lines().next().expect("pid line").trim().to_string();
        run_ok(std::process::Command::new("kill").args(["-KILL", &pid]));
    }

    /// `pg_ctl promote` on the standby, then the Service points at it.
    pub(crate) async fn promote(&self) {
        blocking(
            pg_command("pg_ctl")
                .args(["-w", "promote", "-D"])
                .arg(self.data("standby")),
        )
        .await;
        self.service.repoint(loopback(self.standby_port));
        // What the two ways of reading the timeline say right after it.
        if let Ok(mut c) = sqlx::PgConnection::connect(&pg_url(self.standby_port)).await {
            let read: Result<(i32, i32), _> = sqlx::query_as(
                "SELECT (SELECT timeline_id FROM pg_control_checkpoint()), \
                 ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int4",
            )
            .fetch_one(&mut c)
            .await;
            println!(
                "right after the promotion: (pg_control_checkpoint timeline, WAL file timeline) = {read:?}"
            );
        }
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for name in ["primary", "standby"] {
            let _ = pg_command("pg_ctl")
                .arg("-D")
                .arg(self.data(name))
                .args(["-m", "immediate", "-w", "stop"])
                .output();
        }
    }
}

pub(crate) fn pg_url(port: u16) -> String {
    format!("postgres://root@127.0.0.1:{port}/postgres")
}

pub(crate) async fn blocking(cmd: &mut std::process::Command) {
    let mut cmd = std::mem::replace(cmd, std::process::Command::new("true"));
    tokio::task::spawn_blocking(move || run_ok(&mut cmd))
        .await
        .unwrap();
}

/// `sync_state` of the standby's streaming replication, as the primary sees it.
pub(crate) async fn replication_state(primary_port: u16) -> Option<String> {
    let mut c = sqlx::PgConnection::connect(&pg_url(primary_port)).await.ok()?;
    sqlx::query_scalar(
        "SELECT sync_state FROM pg_stat_replication WHERE application_name = 'standby1' AND state = 'streaming'",
    )
    .fetch_optional(&mut c)
    .await
    .ok()?
}

/// One answer a client received.
#[derive(Debug, Clone)]
struct Answer {
    /// When the call that got it was sent.
    sent: Instant,
    at: Instant,
    key: String,
    outcome: Outcome,
    tier: Tier,
    id: String,
    sequence: i64,
}

/// Consumers: fresh submissions and redeliveries of answered ones, each
/// delivered until it is answered (an error: redeliver after a pause).
struct Load {
    sidecars: Vec<GateClient<Channel>>,
    answered: Mutex<Vec<pb::Submission>>,
    answers: Mutex<Vec<Answer>>,
    errors: Mutex<BTreeMap<String, u64>>,
    next: AtomicU64,
    stop: AtomicBool,
}

const AWARDS: u64 = 4;

impl Load {
    fn new(addrs: &[SocketAddr]) -> Arc<Self> {
        let sidecars = addrs
            .iter()
            .map(|a| {
                GateClient::new(
                    Endpoint::from_shared(format!("http://{a}"))
                        .unwrap()
                        .connect_lazy(),
                )
            })
            .collect();
        Arc::new(Self {
            sidecars,
            answered: Mutex::default(),
            answers: Mutex::default(),
            errors: Mutex::default(),
            next: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        })
    }

    fn fresh(&self) -> pb::Submission {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let ts = format!("2026-12-03T10:{:02}:{:02}.{:06}Z", n / 60 % 60, n % 60, n);
        submission(
            &format!("AWD-FO-{}", n % AWARDS),
            &ts,
            &n.to_be_bytes(),
            1 + (n * 7919 % 1000) as i64,
        )
    }

    /// Delivers `s` until answered; gives up only at the hard deadline.
    async fn deliver(&self, s: pb::Submission, first: usize, deadline: Instant) -> Option<Answer> {
        let key = oncegate::key::derive_key(&s.award_id, &s.submission_timestamp, &s.payload);
        let mut attempt = first;
        while Instant::now() < deadline {
            let mut c = self.sidecars[attempt % self.sidecars.len()].clone();
            attempt += 1;
            let mut req = tonic::Request::new(s.clone());
            req.set_timeout(Duration::from_secs(5));
            let sent = Instant::now();
            match c.submit(req).await {
                Ok(d) => {
                    let d = d.into_inner();
                    let disb = d.disbursement.clone().expect("a disbursement");
                    let a = Answer {
                        sent,
                        at: Instant::now(),
                        key,
                        outcome: outcome(&d),
                        tier: tier(&d),
                        id: disb.id,
                        sequence: disb.sequence,
                    };
                    self.answers.lock().unwrap().push(a.clone());
                    return Some(a);
                }
                Err(e) => {
                    *self
                        .errors
                        .lock()
                        .unwrap()
                        .entry(format!("{:?}", e.code()))
                        .or_default() += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        None
    }

    /// One consumer until `stop`: 30 % redeliveries of answered submissions.
    async fn consumer(self: Arc<Self>, seed: usize, deadline: Instant) {
        let mut i = seed;
        while !self.stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            i += 1;
            let redelivery = {
                let answered = self.answered.lock().unwrap();
                (i % 10 < 3 && !answered.is_empty()).then(|| answered[(i * 31) % answered.len()].clone())
            };
            match redelivery {
                Some(s) => {
                    self.deliver(s, i, deadline).await;
                }
                None => {
                    let s = self.fresh();
                    if self.deliver(s.clone(), i, deadline).await.is_some() {
                        self.answered.lock().unwrap().push(s);
                    }
                }
            }
        }
    }

    fn answers(&self) -> Vec<Answer> {
        self.answers.lock().unwrap().clone()
    }

    /// Waits until `n` keys have been answered (fails the test after a minute).
    async fn answered_keys(&self, n: usize, what: &str) {
        let enough = eventually(Duration::from_secs(60), || async {
            self.answers()
                .iter()
                .map(|a| &a.key)
                .collect::<HashSet<_>>()
                .len()
                >= n
        })
        .await;
        assert!(
            enough,
            "{n} keys answered {what}; errors {:?}",
            self.errors.lock().unwrap()
        );
    }

    /// The state the asynchronous case needs before the kill: claims
    /// committed after the cut (which the standby will not have), and some of
    /// them answered again from a cache. Redelivers such claims to every
    /// sidecar until a cache answers one.
    async fn claims_after_the_cut_answered_from_a_cache(&self, cut: Instant) {
        let claimed_after_cut = || -> Vec<String> {
            let answers = self.answers();
            answers
                .iter()
                .filter(|a| a.sent > cut && a.outcome == Outcome::Claimed)
                .map(|a| a.key.clone())
                .collect()
        };
        let committed = eventually(Duration::from_secs(60), || async {
            claimed_after_cut().len() >= 20
        })
        .await;
        assert!(
            committed,
            "claims committed after the cut: {}",
            claimed_after_cut().len()
        );
        let keys: HashSet<String> = claimed_after_cut().into_iter().collect();
        let subs: Vec<pb::Submission> = self
            .answered
            .lock()
            .unwrap()
            .iter()
            .filter(|s| {
                keys.contains(&oncegate::key::derive_key(
                    &s.award_id,
                    &s.submission_timestamp,
                    &s.payload,
                ))
            })
            .cloned()
            .collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        for (i, s) in subs.iter().cycle().enumerate().take(subs.len() * 4) {
            let cached = self
                .deliver(s.clone(), i, deadline)
                .await
                .is_some_and(|a| matches!(a.tier, Tier::LocalCache | Tier::Redis));
            if cached {
                return;
            }
        }
        panic!("no cache answered a claim committed after the cut");
    }
}

/// What one failover run saw.
struct Run {
    /// First answer per key received before the kill.
    before_kill: HashMap<String, Answer>,
    answers: Vec<Answer>,
    errors: BTreeMap<String, u64>,
    killed: Instant,
    promoted: Instant,
    /// The new primary's ledger: key → (disbursement id, sequence).
    rows: HashMap<String, (String, i64)>,
    summary: oncegate::store::LedgerSummary,
    sweep: Vec<Answer>,
    failovers: Vec<f64>,
    probe_mean: Option<f64>,
}

const CLIENTS: usize = 12;

/// Sidecar `i` on the pair's primary, with Redis (L2 under `prefix`).
async fn sidecar_on(pair: &Pair, prefix: &str, i: usize) -> Sidecar {
    let extra = [
        ("REDIS_URL", redis_url()),
        ("ONCEGATE_REDIS_KEY_PREFIX", prefix.to_string()),
        ("ONCEGATE_DB_LOCK_TIMEOUT", "1s".into()),
        ("ONCEGATE_DB_STATEMENT_TIMEOUT", "2s".into()),
    ];
    start_sidecar(pair.url(), format!("fo-{i}"), &extra).await
}

/// The whole run: load, the cut (asynchronous only), the kill, the
/// promotion, recovery, the effects checks, a third sidecar and a sweep.
async fn failover_run(synchronous: bool) -> (Run, Effects) {
    let pair = Pair::start(synchronous).await;
    let prefix = unique("fo:");
    let a = sidecar_on(&pair, &prefix, 0).await;
    let b = sidecar_on(&pair, &prefix, 1).await;
    let load = Load::new(&[a.addr, b.addr]);
    // A bound for a failure only: the load runs until `stop`.
    let deadline = Instant::now() + Duration::from_secs(240);
    let consumers: Vec<_> = (0..CLIENTS)
        .map(|i| tokio::spawn(load.clone().consumer(i, deadline)))
        .collect();
    load.answered_keys(30, "before the cut").await;
    let cut = Instant::now();
    if !synchronous {
        // The standby stops receiving WAL: what commits from now on is
        // acknowledged by the primary alone.
        pair.link.cut();
    }
    let mut fx = Effects::before(&a, &b).await;
    load.answered_keys(60, "before the kill").await;
    if !synchronous {
        load.claims_after_the_cut_answered_from_a_cache(cut).await;
    }
    pair.kill_primary();
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    pair.promote().await;
    let promoted = Instant::now();
    let recovered = eventually(Duration::from_secs(30), || async {
        load.answers()
            .iter()
            .any(|x| x.at > promoted && x.outcome == Outcome::Claimed)
    })
    .await;
    assert!(
        recovered,
        "a claim succeeds after the promotion, without a restart"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    load.stop.store(true, Ordering::Relaxed);
    for c in consumers {
        c.await.unwrap();
    }
    fx.after(&a, &b).await;
    let c = sidecar_on(&pair, &prefix, 2).await;
    let sweep = sweep(&load, &[a.addr, b.addr, c.addr]).await;
    let answers = load.answers();
    let before_kill = first_answers(&answers, killed);
    let failovers = futures::future::join_all([&a, &b, &c].map(|s| s.metrics()))
        .await
        .iter()
        .map(|m| metric(m, "oncegate_store_failovers_total").unwrap_or(0.0))
        .collect();
    let probe_mean = probe_mean(&a.metrics().await);
    let (rows, summary) = new_primary_ledger(&pair).await;
    let errors = load.errors.lock().unwrap().clone();
    (
        Run {
            before_kill,
            answers,
            errors,
            killed,
            promoted,
            rows,
            summary,
            sweep,
            failovers,
            probe_mean,
        },
        fx,
    )
}

fn first_answers(answers: &[Answer], before: Instant) -> HashMap<String, Answer> {
    let mut first = HashMap::new();
    for x in answers.iter().filter(|x| x.at < before) {
        first.entry(x.key.clone()).or_insert_with(|| x.clone());
    }
    first
}

fn probe_mean(metrics: &str) -> Option<f64> {
    let sum = metric(metrics, "oncegate_store_identity_probe_seconds_sum")?;
    let count = metric(metrics, "oncegate_store_identity_probe_seconds_count")?;
    (count > 0.0).then(|| sum / count)
}

/// Every answered submission redelivered to every sidecar (the third one
/// started after the failover).
async fn sweep(load: &Load, addrs: &[SocketAddr]) -> Vec<Answer> {
    let subs = load.answered.lock().unwrap().clone();
    let sweeper = Load::new(addrs);
    // A bound for a failure only: a sweep takes a few seconds.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut out = Vec::new();
    for (i, s) in subs.iter().enumerate() {
        for k in 0..addrs.len() {
            let a = sweeper.deliver(s.clone(), i + k, deadline).await;
            out.push(a.expect("answered in the sweep"));
        }
    }
    out
}

async fn new_primary_ledger(pair: &Pair) -> (HashMap<String, (String, i64)>, oncegate::store::LedgerSummary) {
    let url = pg_url(pair.standby_port);
    let mut c = sqlx::PgConnection::connect(&url).await.expect("new primary");
    let rows = sqlx::query("SELECT idempotency_key, id::text AS id, sequence FROM disbursements")
        .fetch_all(&mut c)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get("idempotency_key"), (r.get("id"), r.get("sequence"))))
        .collect();
    let store = open_store(&url, 2).await.expect("store");
    (rows, store.ledger_summary().await.unwrap())
}

/// Effects across the failover (DESIGN §7.2, §9): a record completed and cached
/// before the kill, and a lease held across it.
struct Effects {
    done_key: String,
    held_key: String,
    held_token: String,
    /// After the promotion: how `Begin` answered for the completed record,
    /// and for the held lease; and what the old holder's `Complete` got.
    done_after: Vec<String>,
    held_after: String,
    old_holder_complete: String,
}

const NS: &str = "payments.fo";

fn begin_req(key: &str, ttl: Duration, timeout: Duration) -> tonic::Request<pb::BeginRequest> {
    let mut r = tonic::Request::new(pb::BeginRequest {
        namespace: NS.into(),
        idempotency_key: key.into(),
        request: b"pay 10".to_vec(),
        lease_ttl: Some(prost_types::Duration {
            seconds: ttl.as_secs() as i64,
            nanos: 0,
        }),
    });
    r.set_timeout(timeout);
    r
}

async fn fx(s: &Sidecar) -> EffectsClient<Channel> {
    EffectsClient::connect(format!("http://{}", s.addr))
        .await
        .expect("connect")
}

fn describe(r: Result<tonic::Response<pb::BeginResponse>, tonic::Status>) -> String {
    match r.map(|r| r.into_inner().outcome) {
        Ok(Some(pb::begin_response::Outcome::Acquired(a))) => format!("acquired attempt {}", a.attempt),
        Ok(Some(pb::begin_response::Outcome::Completed(c))) => format!(
            "completed by {:?} ({})",
            Tier::try_from(c.decided_by).unwrap_or(Tier::Unspecified),
            String::from_utf8_lossy(&c.response)
        ),
        Ok(None) => "no outcome".into(),
        Err(e) => format!("{:?}", e.code()),
    }
}

fn token_of(r: Result<tonic::Response<pb::BeginResponse>, tonic::Status>) -> String {
    match r.expect("begin").into_inner().outcome {
        Some(pb::begin_response::Outcome::Acquired(a)) => a.lease_token,
        other => panic!("expected a lease, got {other:?}"),
    }
}

impl Effects {
    /// A record completed (and read back through both sidecars' caches)
    /// and a lease taken, both after the cut when there is one.
    async fn before(a: &Sidecar, b: &Sidecar) -> Self {
        let (done_key, held_key) = (unique("fx-done-"), unique("fx-held-"));
        let (mut fa, mut fb) = (fx(a).await, fx(b).await);
        let long = Duration::from_secs(120);
        let token = token_of(fa.begin(begin_req(&done_key, long, long)).await);
        fa.complete(pb::CompleteRequest {
            namespace: NS.into(),
            idempotency_key: done_key.clone(),
            lease_token: token,
            response: b"paid".to_vec(),
        })
        .await
        .expect("complete");
        for c in [&mut fa, &mut fb] {
            let cached = describe(c.begin(begin_req(&done_key, long, long)).await);
            assert!(cached.starts_with("completed"), "{cached}");
        }
        let held_token = token_of(fb.begin(begin_req(&held_key, long, long)).await);
        Self {
            done_key,
            held_key,
            held_token,
            done_after: Vec::new(),
            held_after: String::new(),
            old_holder_complete: String::new(),
        }
    }

    async fn after(&mut self, a: &Sidecar, b: &Sidecar) {
        let (mut fa, mut fb) = (fx(a).await, fx(b).await);
        let (long, short) = (Duration::from_secs(120), Duration::from_millis(1500));
        // (Where the record was lost, the first Begin takes a new lease and
        // the second waits for it until its deadline.)
        for c in [&mut fa, &mut fb] {
            self.done_after
                .push(describe(c.begin(begin_req(&self.done_key, long, short)).await));
        }
        // A second holder asks for the lease taken before the kill.
        self.held_after = describe(fa.begin(begin_req(&self.held_key, long, short)).await);
        let complete = fb
            .complete(pb::CompleteRequest {
                namespace: NS.into(),
                idempotency_key: self.held_key.clone(),
                lease_token: self.held_token.clone(),
                response: b"held".to_vec(),
            })
            .await;
        self.old_holder_complete = match complete {
            Ok(_) => "completed".into(),
            Err(e) => format!("{:?}", e.code()),
        };
    }
}

/// Per-run figures, printed for the closing note.
fn report(name: &str, run: &Run, fx: &Effects, lost: &HashSet<String>, cache_lost: usize, window: usize) {
    let recovery = run
        .answers
        .iter()
        .filter(|x| x.at > run.promoted && x.outcome == Outcome::Claimed)
        .map(|x| x.at - run.promoted)
        .min();
    println!(
        "failover[{name}]: answered before the kill {} keys; rows on the new primary {}; lost {}; \
         cache answers for lost claims after the promotion {cache_lost} (in the {:?} between kill and promotion: {window}); \
         first claim {:?} after promotion (kill→promote {:?}); errors {:?}; failovers counted per sidecar {:?}; \
         identity probe mean {:?} s; ledger: mismatched awards {}, sequence gaps {}",
        run.before_kill.len(),
        run.rows.len(),
        lost.len(),
        run.promoted - run.killed,
        recovery,
        run.promoted - run.killed,
        run.errors,
        run.failovers,
        run.probe_mean,
        run.summary.mismatched_awards,
        run.summary.sequence_gaps,
    );
    println!(
        "failover[{name}] effects: completed record after → {:?}; held lease, second Begin → {}; old holder's Complete → {}",
        fx.done_after, fx.held_after, fx.old_holder_complete
    );
}

/// Keys answered before the kill whose disbursement the new primary does
/// not hold (missing, or claimed again with another id).
fn lost_keys(run: &Run) -> HashSet<String> {
    run.before_kill
        .values()
        .filter(|x| run.rows.get(&x.key).is_none_or(|(id, _)| *id != x.id))
        .map(|x| x.key.clone())
        .collect()
}

/// Cache answers (L1 or L2) carrying a lost disbursement, after `from`
/// (answers during the load and the sweep), and in the kill→promotion window.
fn cache_answers_for_lost(run: &Run, lost: &HashSet<String>) -> (usize, usize) {
    let stale = |x: &&Answer| {
        lost.contains(&x.key)
            && matches!(x.tier, Tier::LocalCache | Tier::Redis)
            && run.before_kill[&x.key].id == x.id
    };
    let after = run
        .answers
        .iter()
        .filter(|x| x.at > run.promoted)
        .filter(stale)
        .count()
        + run.sweep.iter().filter(stale).count();
    let window = run
        .answers
        .iter()
        .filter(|x| x.at > run.killed && x.at <= run.promoted)
        .filter(stale)
        .count();
    (after, window)
}

/// Cache answers (L1 or L2) before the kill for keys that were then lost:
/// the caches held what the new primary would not.
fn cached_before_kill(run: &Run, lost: &HashSet<String>) -> usize {
    run.answers
        .iter()
        .filter(|x| x.at < run.killed && lost.contains(&x.key))
        .filter(|x| matches!(x.tier, Tier::LocalCache | Tier::Redis))
        .count()
}

/// Synchronous standby: nothing answered is lost, nothing doubled, every
/// answer (before, during, after) is the new primary's row; the ledger is
/// exact; only UNAVAILABLE in between; no restart needed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_to_a_synchronous_standby_loses_nothing() {
    let (run, fx) = failover_run(true).await;
    let lost = lost_keys(&run);
    let (cache_lost, window) = cache_answers_for_lost(&run, &lost);
    report("synchronous", &run, &fx, &lost, cache_lost, window);
    assert!(
        run.before_kill.len() > 50,
        "load before the kill: {}",
        run.before_kill.len()
    );
    assert_eq!(lost.len(), 0, "lost: {lost:?}");
    let wrong: Vec<_> = run
        .answers
        .iter()
        .chain(&run.sweep)
        .filter(|x| {
            run.rows
                .get(&x.key)
                .is_none_or(|(id, seq)| (id, *seq) != (&x.id, x.sequence))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "answers that are not the new primary's rows: {wrong:?}"
    );
    let answered: HashSet<&String> = run.answers.iter().map(|x| &x.key).collect();
    assert_eq!(
        run.rows.len(),
        answered.len(),
        "one row per answered submission, no other"
    );
    assert_eq!((run.summary.mismatched_awards, run.summary.sequence_gaps), (0, 0));
    assert!(
        run.errors.keys().all(|c| c == "Unavailable"),
        "only UNAVAILABLE in between: {:?}",
        run.errors
    );
    assert!(
        run.failovers[..2].iter().all(|n| *n >= 1.0),
        "{:?}",
        run.failovers
    );
    assert!(
        fx.done_after
            .iter()
            .all(|d| d == "completed by Database (paid)" || d == "completed by Redis (paid)"),
        "{:?}",
        fx.done_after
    );
    assert_eq!(
        fx.held_after, "DeadlineExceeded",
        "the lease held before the kill still holds"
    );
    assert_eq!(fx.old_holder_complete, "completed", "and its holder completes it");
}

/// Asynchronous standby, link cut before the kill: the claims committed
/// after the cut are lost, and no cache answers for any of them after the
/// promotion — on the two sidecars or on a third started afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_to_an_asynchronous_standby_answers_nothing_lost_from_a_cache() {
    let (run, fx) = failover_run(false).await;
    let lost = lost_keys(&run);
    let (cache_lost, window) = cache_answers_for_lost(&run, &lost);
    report("asynchronous", &run, &fx, &lost, cache_lost, window);
    let held = cached_before_kill(&run, &lost);
    println!("failover[asynchronous]: cache answers before the kill for claims then lost: {held}");
    assert!(!lost.is_empty(), "the claims after the cut are lost");
    assert!(
        held > 0,
        "the caches held lost claims before the kill (the case under test)"
    );
    assert_eq!(
        cache_lost, 0,
        "no cache answers for a lost claim after the promotion"
    );
    // Every answer after the promotion is the new primary's row.
    let wrong: Vec<_> = run
        .answers
        .iter()
        .filter(|x| x.at > run.promoted)
        .chain(&run.sweep)
        .filter(|x| {
            run.rows
                .get(&x.key)
                .is_none_or(|(id, seq)| (id, *seq) != (&x.id, x.sequence))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "answers after the promotion that are not the new primary's rows: {wrong:?}"
    );
    assert_eq!((run.summary.mismatched_awards, run.summary.sequence_gaps), (0, 0));
    assert!(
        run.failovers[..2].iter().all(|n| *n >= 1.0),
        "{:?}",
        run.failovers
    );
    assert_eq!(
        run.failovers[2], 0.0,
        "the third sidecar only ever saw the new primary"
    );
    assert!(
        fx.done_after
            .iter()
            .all(|d| !d.contains("LocalCache") && !d.contains("Redis")),
        "a completed record lost with the old primary is not answered from a cache: {:?}",
        fx.done_after
    );
    assert_eq!(
        fx.old_holder_complete, "FailedPrecondition",
        "the old holder's lease is gone with the old primary: its Complete is fenced off"
    );
}
