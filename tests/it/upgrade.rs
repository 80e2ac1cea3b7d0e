//! The upgrade and the rollback under load (docs/UPGRADING.md), every
//! release: the previous release (the commit `PREVIOUS_RELEASE` names,
//! built by `scripts/previous-release`) installs the schema and runs two
//! pods as the least-privileged application role with the Kafka relay on,
//! claims streaming in; this tree's `migrate --app-role` runs while they
//! serve (the chart's pre-upgrade Job, with every migration this tree
//! holds); then each pod is replaced by this tree's under a new name, one at
//! a time (a surge pod first, then SIGTERM to the oldest, as a Deployment
//! rolls), claims still streaming. Then the rollback: this tree's pods
//! replaced by the previous release's on the migrated schema.
//!
//! After each roll: every delivery is in the ledger once, the balances are
//! exact, a `read_committed` reader finds every event in the topic once and
//! each award's in sequence order, and no client ever got an answer other
//! than CLAIMED, DUPLICATE (a new delivery only after an attempt that went
//! unanswered) or a retryable UNAVAILABLE.

use crate::helpers::*;
use crate::kafka::kafka_url;
use crate::pods::{Pods, Sink};
use oncegate::pb::Outcome;
use oncegate::pb::gate_client::GateClient;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::Channel;

const TS: &str = "2026-12-07T10:00:00Z";

/// The commit `PREVIOUS_RELEASE` names: its first line that is not a
/// comment.
fn previous_commit() -> String {
    let text = include_str!("../../PREVIOUS_RELEASE");
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .and_then(|l| l.split_whitespace().next())
        .expect("PREVIOUS_RELEASE names a commit")
        .to_string()
}

/// The previous release's binary: `ONCEGATE_TEST_PREVIOUS_BIN`, else the one
/// `scripts/previous-release` cached under `.testenv/previous/<commit>/`.
fn previous_release() -> PathBuf {
    let commit = previous_commit();
    let how = format!(
        "build it with `scripts/previous-release` (scripts/test does, and passes its path as \
         ONCEGATE_TEST_PREVIOUS_BIN), or set ONCEGATE_TEST_PREVIOUS_BIN to an `oncegate` built \
         from {commit}"
    );
    if let Some(bin) = std::env::var_os("ONCEGATE_TEST_PREVIOUS_BIN").filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        assert!(
            bin.is_file(),
            "ONCEGATE_TEST_PREVIOUS_BIN={} is not a file: {how}",
            bin.display()
        );
        return bin;
    }
    let cached = Path::new(env!("CARGO_MANIFEST_DIR")).join(".testenv/previous");
    let found = std::fs::read_dir(&cached).ok().and_then(|dirs| {
        dirs.filter_map(Result::ok)
            .filter(|d| d.file_name().to_string_lossy().starts_with(&commit))
            .map(|d| d.path().join("oncegate"))
            .find(|bin| bin.is_file())
    });
    found.unwrap_or_else(|| panic!("the previous release ({commit}, PREVIOUS_RELEASE) is not built: {how}"))
}

/// `oncegate migrate --app-role` by `bin` as the schema's owner: the
/// chart's migration Job.
async fn migrate(bin: &Path, owner_url: &str, role: &str) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new(bin)
            .args(["migrate", "--database-url", owner_url, "--app-role", role])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("migrate ends")
    .expect("migrate runs");
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{} migrate failed: {text}", bin.display());
    text
}

/// What the clients were answered: each kind counted; anything the
/// guarantee does not allow, described.
#[derive(Default)]
struct Tally {
    answered: AtomicU64,
    claimed: AtomicU64,
    duplicate: AtomicU64,
    unavailable: AtomicU64,
    /// The connection reset or closed under a call: no answer at all
    /// (tonic says UNKNOWN or CANCELLED; gRPC's other clients, UNAVAILABLE).
    connection_lost: AtomicU64,
    wrong: Mutex<Vec<String>>,
}

impl Tally {
    fn wrong(&self, what: String) {
        self.wrong.lock().unwrap().push(what);
    }
}

/// One delivery as a consumer hands it to the sidecar.
#[derive(Clone)]
struct Delivery {
    award: String,
    amount: i64,
    payload: String,
}

/// Claims streaming into whichever pods are live, each client sending a
/// delivery again (to another pod) until it is answered, as consumers
/// redeliver, and every third delivery once more after its answer.
struct Stream {
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
    clients: Vec<tokio::task::JoinHandle<Vec<Delivery>>>,
}

impl Stream {
    fn start(targets: Arc<Mutex<Vec<SocketAddr>>>, tally: Arc<Tally>, awards: usize, clients: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let tag = unique("");
        let clients = (0..clients)
            .map(|c| {
                let (targets, stop, tally) = (targets.clone(), stop.clone(), tally.clone());
                let tag = format!("{tag}-{c}");
                tokio::spawn(async move {
                    let mut client = Client {
                        targets,
                        tally,
                        gates: HashMap::new(),
                        turn: c,
                    };
                    let mut sent = Vec::new();
                    while !stop.load(Ordering::SeqCst) {
                        let i = sent.len();
                        let delivery = Delivery {
                            award: format!("AWD-U{}", (c + i * 7) % awards),
                            amount: 100 + (i as i64 % 9) * 25,
                            payload: format!("{tag}-{i}"),
                        };
                        client.deliver(&delivery, i % 3 == 0).await;
                        sent.push(delivery);
                    }
                    sent
                })
            })
            .collect();
        Self { stop, tally, clients }
    }

    fn answered(&self) -> u64 {
        self.tally.answered.load(Ordering::SeqCst)
    }

    /// Waits until `n` more answers came.
    async fn more(&self, n: u64) {
        let from = self.answered();
        let ok = eventually(Duration::from_secs(60), || async { self.answered() >= from + n }).await;
        assert!(ok, "claims stopped flowing at {}", self.answered());
    }

    /// Stops sending new deliveries; every delivery sent is answered.
    async fn stop(self) -> Vec<Delivery> {
        self.stop.store(true, Ordering::SeqCst);
        let mut all = Vec::new();
        for c in self.clients {
            all.extend(c.await.unwrap());
        }
        all
    }
}

struct Client {
    targets: Arc<Mutex<Vec<SocketAddr>>>,
    tally: Arc<Tally>,
    gates: HashMap<SocketAddr, GateClient<Channel>>,
    turn: usize,
}

impl Client {
    /// Sends `d` until it is answered (CLAIMED, or DUPLICATE after an
    /// attempt that went unanswered); with `again`, once more after that,
    /// wanting DUPLICATE.
    async fn deliver(&mut self, d: &Delivery, again: bool) {
        let mut unanswered_before = false;
        match self.answer(d, &mut unanswered_before).await {
            Outcome::Claimed => {}
            Outcome::Duplicate if unanswered_before => {}
            other => self.tally.wrong(format!(
                "new delivery {} answered {other:?} with no attempt unanswered before",
                d.payload
            )),
        }
        if again {
            let mut ignored = true;
            let second = self.answer(d, &mut ignored).await;
            if second != Outcome::Duplicate {
                self.tally
                    .wrong(format!("delivery {} sent again answered {second:?}", d.payload));
            }
        }
    }

    /// Sends `d` until a pod answers it; every status but UNAVAILABLE is
    /// recorded as wrong (and sent again, as a consumer would).
    async fn answer(&mut self, d: &Delivery, unanswered_before: &mut bool) -> Outcome {
        loop {
            let Some(target) = self.next_target() else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let Some(gate) = self.gate(target).await else {
                continue;
            };
            let s = submission(&d.award, TS, d.payload.as_bytes(), d.amount);
            match tokio::time::timeout(Duration::from_secs(15), gate.submit(s)).await {
                Ok(Ok(decision)) => {
                    let outcome = outcome(&decision.into_inner());
                    match outcome {
                        Outcome::Claimed => self.tally.claimed.fetch_add(1, Ordering::SeqCst),
                        _ => self.tally.duplicate.fetch_add(1, Ordering::SeqCst),
                    };
                    self.tally.answered.fetch_add(1, Ordering::SeqCst);
                    return outcome;
                }
                Ok(Err(status)) if status.code() == tonic::Code::Unavailable => {
                    self.tally.unavailable.fetch_add(1, Ordering::SeqCst);
                }
                Ok(Err(status)) if connection_lost(&status) => {
                    self.tally.connection_lost.fetch_add(1, Ordering::SeqCst);
                }
                Ok(Err(status)) => self.tally.wrong(format!(
                    "delivery {} answered {:?}: {} ({})",
                    d.payload,
                    status.code(),
                    status.message(),
                    source_chain(&status)
                )),
                Err(_) => self
                    .tally
                    .wrong(format!("delivery {} not answered within 15 s", d.payload)),
            }
            *unanswered_before = true;
            self.gates.remove(&target);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn next_target(&mut self) -> Option<SocketAddr> {
        self.turn += 1;
        let t = self.targets.lock().unwrap();
        (!t.is_empty()).then(|| t[self.turn % t.len()])
    }

    async fn gate(&mut self, target: SocketAddr) -> Option<&mut GateClient<Channel>> {
        if let std::collections::hash_map::Entry::Vacant(slot) = self.gates.entry(target) {
            let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{target}"))
                .ok()?
                .connect_timeout(Duration::from_secs(1));
            match tokio::time::timeout(Duration::from_secs(2), endpoint.connect()).await {
                Ok(Ok(channel)) => {
                    slot.insert(GateClient::new(channel));
                }
                _ => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    return None;
                }
            }
        }
        self.gates.get_mut(&target)
    }
}

/// A call that failed in the client's own transport, not a status the
/// sidecar sent: the connection reset or closed under it by a pod that
/// stopped while the call was on its way. gRPC's status-code mapping makes
/// it UNAVAILABLE, as grpc-go and grpc-java report it; tonic reports it as
/// UNKNOWN "transport error" (reset) or CANCELLED "operation was canceled"
/// (closed before it was sent), with its transport error as the source — a
/// status a server sent has none.
fn connection_lost(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some())
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut chain = Vec::new();
    let mut source = e.source();
    while let Some(s) = source {
        chain.push(format!("{s} [{s:?}]"));
        source = s.source();
    }
    chain.join(" <- ")
}

/// Each pod replaced by one running `bin` under a new name, one at a time:
/// the new pod first (the Deployment's surge), then SIGTERM to the oldest.
async fn roll(pods: &mut Pods, stream: &Stream, bin: &Path, app_url: &str) {
    for _ in 0..pods.pods.len() {
        let new = pods.start_release(bin, app_url, least_privilege()).await;
        pods.balanced().await;
        let since = pods.published(new).await;
        pods.publishing(new, since).await;
        stream.more(20).await;
        terminate_oldest(pods).await;
        pods.balanced().await;
        stream.more(40).await;
    }
}

/// SIGTERM to the oldest pod while clients still send to it: its endpoint
/// goes a moment after the signal, as a Service's endpoints catch up with a
/// terminating pod, so some claims reach it while it drains or after it
/// stopped listening.
async fn terminate_oldest(pods: &mut Pods) {
    let pod = pods.pods.remove(0);
    let (addr, targets) = (pod.addr, pods.targets.clone());
    let endpoint_removed = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        targets.lock().unwrap().retain(|a| *a != addr);
    });
    let status = pod.terminate().await;
    endpoint_removed.await.unwrap();
    assert!(status.success(), "a terminated pod exits 0: {status:?}");
}

/// The pods' settings beside the sink's: the chart's (migrations by the
/// Job only, serving as the application role and refusing to run as more).
fn least_privilege() -> Vec<(&'static str, String)> {
    vec![
        ("ONCEGATE_MIGRATE_ON_START", "false".into()),
        ("ONCEGATE_REQUIRE_LEAST_PRIVILEGE", "true".into()),
    ]
}

/// The guarantee after a roll, over every delivery streamed so far: the
/// answers allowed, each delivery in the ledger once, the balances exact,
/// every event once in the topic in award order. The events read.
async fn check(pods: &Pods, tally: &Tally, deliveries: &[Delivery], when: &str) -> usize {
    pods.drained().await;
    let n = deliveries.len() as i64;
    let db = &pods.db;
    let counts = db.counts().await;
    assert_eq!(
        (counts.claims, counts.disbursements, counts.outbox),
        (n, n, n),
        "{when}: each of the {n} deliveries claimed once (claims, disbursements, events)"
    );
    let mut expected: HashMap<String, (i64, i64)> = HashMap::new();
    for d in deliveries {
        let e = expected.entry(d.award.clone()).or_default();
        e.0 += d.amount;
        e.1 += 1;
    }
    let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    let balances: HashMap<String, (i64, i64)> = sqlx::query_as::<_, (String, i64, i64, i64)>(
        "SELECT award_id, total_cents, disbursement_count, last_sequence FROM award_balances",
    )
    .fetch_all(&mut c)
    .await
    .unwrap()
    .into_iter()
    .map(|(award, total, count, last)| {
        assert_eq!(
            count, last,
            "{when}: award {award}: one sequence per disbursement"
        );
        (award, (total, count))
    })
    .collect();
    assert_eq!(balances, expected, "{when}: each award's total and count");
    let events = pods.verify().await;
    assert_eq!(events as i64, n, "{when}: one event per delivery in the topic");
    let wrong = tally.wrong.lock().unwrap().clone();
    assert!(
        wrong.is_empty(),
        "{when}: {} answers the guarantee does not allow: {:#?}",
        wrong.len(),
        &wrong[..wrong.len().min(20)]
    );
    events
}

struct Role {
    name: String,
}

impl Role {
    async fn create() -> Self {
        let name = unique("og_up_app_");
        exec_admin(&format!("CREATE ROLE {name} LOGIN")).await;
        Self { name }
    }

    fn url(&self, db: &TestDb) -> String {
        format!("postgres://{}@{}/{}", self.name, pg_addr(), db.name)
    }

    /// The database first (the role owns privileges in it), then the role.
    async fn drop_with(self, database: &str) {
        exec_admin(&format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)")).await;
        exec_admin(&format!("DROP ROLE IF EXISTS {}", self.name)).await;
    }
}

async fn exec_admin(sql: &str) {
    let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&admin_url())
        .await
        .unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
        .execute(&mut c)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_upgrade_from_the_previous_release_and_back_under_load_keeps_every_guarantee() {
    let (previous, current) = (previous_release(), oncegate_bin());
    let db = TestDb::unmigrated(Kind::Postgres).await;
    let role = Role::create().await;
    let (owner_url, app_url, database) = (db.url.clone(), role.url(&db), db.name.clone());
    migrate(&previous, &owner_url, &role.name).await;
    let mut pods = Pods::on(db, Sink::kafka(kafka_url()));
    for _ in 0..2 {
        pods.start_release(&previous, &app_url, least_privilege()).await;
    }
    let tally = Arc::new(Tally::default());
    let stream = Stream::start(pods.targets.clone(), tally.clone(), 24, 4);
    pods.balanced().await;
    for i in 0..2 {
        let since = pods.published(i).await;
        pods.publishing(i, since).await;
    }
    stream.more(40).await;

    // The pre-upgrade Job, while the previous release's pods serve.
    let upgrade_from = stream.answered();
    migrate(&current, &owner_url, &role.name).await;
    stream.more(40).await;
    roll(&mut pods, &stream, &current, &app_url).await;
    let during_upgrade = stream.answered() - upgrade_from;
    let mut deliveries = stream.stop().await;
    let upgraded = check(&pods, &tally, &deliveries, "after the upgrade").await;

    // The rollback: the previous release on the migrated schema.
    let stream = Stream::start(pods.targets.clone(), tally.clone(), 24, 4);
    stream.more(40).await;
    let rollback_from = stream.answered();
    roll(&mut pods, &stream, &previous, &app_url).await;
    let during_rollback = stream.answered() - rollback_from;
    deliveries.extend(stream.stop().await);
    let events = check(&pods, &tally, &deliveries, "after the rollback").await;

    eprintln!(
        "upgrade {} -> this tree and back under load: {} answers during the upgrade (migrate \
         and 2 pods replaced), {} during the rollback; {} deliveries, {} answers in all: {} \
         CLAIMED, {} DUPLICATE, {} retryable UNAVAILABLE, {} calls on a connection a \
         stopping pod reset or closed; {} events read once each after the \
         upgrade, {events} after the rollback; {} settles",
        previous_commit(),
        during_upgrade,
        during_rollback,
        deliveries.len(),
        tally.answered.load(Ordering::SeqCst),
        tally.claimed.load(Ordering::SeqCst),
        tally.duplicate.load(Ordering::SeqCst),
        tally.unavailable.load(Ordering::SeqCst),
        tally.connection_lost.load(Ordering::SeqCst),
        upgraded,
        pods.settled_in_logs(),
    );
    pods.shutdown().await;
    role.drop_with(&database).await;
}
