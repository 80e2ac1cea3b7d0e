//! Chaos (DESIGN §7.1): three `oncegate serve` processes on one Postgres and one
//! Redis, consumers that redeliver until `CLAIMED` or `DUPLICATE`, while
//! instances are SIGKILLed and restarted, Redis is restarted and flushed and
//! Postgres is restarted. Afterwards the ledger must be exact.
//!
//! `chaos_short` runs in CI (about a minute); `chaos_long` is `--ignored` and
//! runs for `ONCEGATE_CHAOS_SECONDS` (default 360):
//! `ONCEGATE_CHAOS_SECONDS=600 cargo test --test it chaos_long -- --ignored --nocapture`.
//!
//! The consumer crash window of the seeds is here too: a consumer killed
//! after `Submit` returned but before it `XACK`ed its Redis stream.

use crate::helpers::*;
use fred::prelude::*;
use oncegate::pb::gate_client::GateClient;
use oncegate::pb::{self, Outcome};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::{Connection, Row};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

/// A Postgres cluster of its own (initdb + pg_ctl on a free port in a temp
/// dir), so a test may restart it without touching the shared server.
pub struct ThrowawayPg {
    pub port: u16,
    dir: tempfile::TempDir,
}

impl ThrowawayPg {
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        if running_as_root() {
            // Postgres refuses to run as root: the cluster belongs to `postgres`.
            run(std::process::Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path()));
        }
        let data = dir.path().join("data");
        run(pg_command("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "root", "--no-sync"]));
        let pg = Self {
            port: free_port(),
            dir,
        };
        pg.up().await;
        pg
    }

    pub fn url(&self) -> String {
        format!("postgres://root@127.0.0.1:{}/postgres", self.port)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The postmaster and every process it started (backends, WAL writer,
    /// checkpointer, …): what a frozen host stops.
    pub fn processes(&self) -> Vec<u32> {
        let pid = std::fs::read_to_string(self.data().join("postmaster.pid")).expect("postmaster.pid");
        let postmaster: u32 = pid
            .lines()
            .next()
            .expect("pid line")
            .trim()
            .parse()
            .expect("a pid");
        let mut pids = vec![postmaster];
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // pid (comm) state ppid …: comm may hold spaces, so split after ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1));
            if ppid.and_then(|p| p.parse::<u32>().ok()) == Some(postmaster)
                && let Ok(child) = entry.file_name().to_string_lossy().parse()
            {
                pids.push(child);
            }
        }
        pids
    }

    /// Starts the cluster and waits until it accepts connections.
    pub async fn up(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100",
            self.port,
            self.dir.path().display()
        );
        let mut cmd = pg_command("pg_ctl");
        cmd.arg("-D")
            .arg(self.data())
            .args(["-o", &options, "-l"])
            .arg(self.dir.path().join("postgres.log"))
            .args(["-w", "start"]);
        tokio::task::spawn_blocking(move || run(&mut cmd)).await.unwrap();
    }

    /// Stops the cluster like a crash (`-m immediate`: no checkpoint, crash
    /// recovery on the next start).
    pub async fn crash(&self) {
        let mut cmd = self.stop_command();
        tokio::task::spawn_blocking(move || run(&mut cmd)).await.unwrap();
    }

    fn stop_command(&self) -> std::process::Command {
        let mut cmd = pg_command("pg_ctl");
        cmd.arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"]);
        cmd
    }
}

impl Drop for ThrowawayPg {
    fn drop(&mut self) {
        let _ = self.stop_command().output();
    }
}

pub(crate) fn running_as_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0\n"))
        .unwrap_or(false)
}

/// `initdb` or `pg_ctl`: from `ONCEGATE_TEST_PG_BIN` (set by `scripts/test`)
/// or the `PATH`; as the `postgres` user when running as root.
pub(crate) fn pg_command(program: &str) -> std::process::Command {
    let program = match std::env::var("ONCEGATE_TEST_PG_BIN") {
        Ok(dir) if !dir.is_empty() => format!("{dir}/{program}"),
        _ => program.to_string(),
    };
    if running_as_root() {
        let mut c = std::process::Command::new("runuser");
        c.args(["-u", "postgres", "--", &program]);
        c
    } else {
        std::process::Command::new(program)
    }
}

pub(crate) fn run(cmd: &mut std::process::Command) {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fred client for test-side Redis work.
pub async fn redis_client(url: &str) -> Client {
    let client = Builder::from_config(Config::from_url(url).unwrap())
        .build()
        .unwrap();
    client.init().await.expect("redis connects");
    client
}

const INSTANCES: usize = 3;
const AWARDS: u64 = 17;
const WORKERS: usize = 8;
const STREAM: &str = "chaos-events";

/// What every consumer saw, shared.
#[derive(Default)]
struct Ledger {
    /// key → (award, amount, CLAIMED answers, disbursement id answered).
    keys: HashMap<String, KeyRecord>,
    /// Completed submissions, for redeliveries.
    done: Vec<pb::Submission>,
    /// Broken promises seen by a client (reported and asserted empty).
    violations: Vec<String>,
}

struct KeyRecord {
    award: String,
    amount: i64,
    claimed: u32,
    disbursement: Option<String>,
}

#[derive(Default)]
struct Stats {
    deliveries: AtomicU64,
    redeliveries: AtomicU64,
    concurrent: AtomicU64,
    attempts: AtomicU64,
    retries: AtomicU64,
    claimed: AtomicU64,
    duplicate: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
}

/// The instance table consumers pick from: a lazily connecting channel per
/// live address (a killed instance stays listed until its replacement is up,
/// so consumers see the failures a real pod's clients see).
type Instances = Arc<Mutex<Vec<Channel>>>;

struct Shared {
    instances: Instances,
    ledger: Mutex<Ledger>,
    stats: Stats,
    next: AtomicU64,
    run: String,
}

fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(1))
        .connect_lazy()
}

impl Shared {
    fn pick(&self, rng: &mut StdRng) -> Channel {
        let instances = self.instances.lock().unwrap();
        instances[rng.random_range(0..instances.len())].clone()
    }

    fn error(&self, what: String) {
        *self.stats.errors.lock().unwrap().entry(what).or_default() += 1;
    }

    fn fresh(&self, rng: &mut StdRng) -> pb::Submission {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let award = format!("AWD-CHAOS-{}", n % AWARDS);
        let payload = format!("{{\"run\":\"{}\",\"n\":{n}}}", self.run);
        let amount = rng.random_range(1..100_000);
        submission(&award, "2026-11-29T10:00:00Z", payload.as_bytes(), amount)
    }

    /// Delivers one submission the way a broker consumer does: again and
    /// again, on any instance, until `CLAIMED` or `DUPLICATE`.
    async fn deliver(&self, sub: pb::Submission, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let key = oncegate::key::derive_key(&sub.award_id, &sub.submission_timestamp, &sub.payload);
        let started = Instant::now();
        loop {
            self.stats.attempts.fetch_add(1, Ordering::Relaxed);
            let mut req = tonic::Request::new(sub.clone());
            req.set_timeout(Duration::from_secs(5));
            let mut client = GateClient::new(self.pick(&mut rng));
            match tokio::time::timeout(Duration::from_secs(7), client.submit(req)).await {
                Ok(Ok(d)) => return self.answered(&key, &sub, d.into_inner()),
                Ok(Err(status)) => self.error(format!("{:?}", status.code())),
                Err(_) => self.error("client timeout".into()),
            }
            self.stats.retries.fetch_add(1, Ordering::Relaxed);
            if started.elapsed() > Duration::from_secs(120) {
                let msg = format!("delivery of {} never resolved", &key[..12]);
                self.ledger.lock().unwrap().violations.push(msg);
                return;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(20..150))).await;
        }
    }

    fn answered(&self, key: &str, sub: &pb::Submission, d: pb::Decision) {
        let claimed = outcome(&d) == Outcome::Claimed;
        let counter = if claimed {
            &self.stats.claimed
        } else {
            &self.stats.duplicate
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let id = d.disbursement.map(|d| d.id).unwrap_or_default();
        let mut ledger = self.ledger.lock().unwrap();
        let record = ledger.keys.entry(key.to_string()).or_insert_with(|| KeyRecord {
            award: sub.award_id.clone(),
            amount: sub.amount_cents,
            claimed: 0,
            disbursement: None,
        });
        record.claimed += u32::from(claimed);
        let mut problems = Vec::new();
        if record.claimed > 1 {
            problems.push(format!(
                "{} answered CLAIMED {} times",
                &key[..12],
                record.claimed
            ));
        }
        match &record.disbursement {
            Some(first) if *first != id => {
                problems.push(format!("{} answered disbursements {first} and {id}", &key[..12]))
            }
            Some(_) => {}
            None => record.disbursement = Some(id),
        }
        if d.idempotency_key != key {
            problems.push(format!("{} answered with key {}", &key[..12], d.idempotency_key));
        }
        ledger.violations.extend(problems);
        ledger.done.push(sub.clone());
    }

    fn redelivery(&self, rng: &mut StdRng) -> Option<pb::Submission> {
        let ledger = self.ledger.lock().unwrap();
        (!ledger.done.is_empty()).then(|| ledger.done[rng.random_range(0..ledger.done.len())].clone())
    }
}

/// One consumer: new deliveries, redeliveries of acked ones, and now and
/// then the same new delivery to two instances at once.
async fn consumer(shared: Arc<Shared>, seed: u64, until: Instant) {
    let mut rng = StdRng::seed_from_u64(seed);
    while Instant::now() < until {
        shared.stats.deliveries.fetch_add(1, Ordering::Relaxed);
        let roll: f64 = rng.random();
        if roll < 0.25
            && let Some(sub) = shared.redelivery(&mut rng)
        {
            shared.stats.redeliveries.fetch_add(1, Ordering::Relaxed);
            shared.deliver(sub, rng.random()).await;
        } else if roll < 0.35 {
            shared.stats.concurrent.fetch_add(1, Ordering::Relaxed);
            let sub = shared.fresh(&mut rng);
            tokio::join!(
                shared.deliver(sub.clone(), rng.random()),
                shared.deliver(sub, rng.random())
            );
        } else {
            let sub = shared.fresh(&mut rng);
            shared.deliver(sub, rng.random()).await;
        }
    }
}

/// The processes under test and the faults done to them.
struct Cluster {
    pg: ThrowawayPg,
    redis: ThrowawayRedis,
    /// The relay's broker: a Redis of its own, never flushed (a broker that
    /// loses acknowledged messages is outside oncegate's promise).
    broker: ThrowawayRedis,
    prefix: String,
    sidecars: Vec<Option<Sidecar>>,
    instances: Instances,
    faults: BTreeMap<&'static str, u64>,
}

impl Cluster {
    async fn start() -> Self {
        let pg = ThrowawayPg::start().await;
        let redis = ThrowawayRedis::start().await;
        let broker = ThrowawayRedis::start().await;
        let mut cluster = Self {
            pg,
            redis,
            broker,
            prefix: unique("chaos:"),
            sidecars: (0..INSTANCES).map(|_| None).collect(),
            instances: Arc::new(Mutex::new(Vec::new())),
            faults: BTreeMap::new(),
        };
        for i in 0..INSTANCES {
            // One at a time: the first one migrates the empty cluster.
            let s = cluster.sidecar(i).await;
            cluster.instances.lock().unwrap().push(channel(s.addr));
            cluster.sidecars[i] = Some(s);
        }
        cluster
    }

    async fn sidecar(&self, i: usize) -> Sidecar {
        Sidecar::start(&[
            ("DATABASE_URL", self.pg.url()),
            ("REDIS_URL", self.redis.url()),
            ("ONCEGATE_REDIS_KEY_PREFIX", self.prefix.clone()),
            ("ONCEGATE_REDIS_BREAKER_COOLDOWN", "300ms".into()),
            ("ONCEGATE_RELAY_SINK", self.broker.url()),
            ("ONCEGATE_RELAY_STREAM", STREAM.into()),
            ("ONCEGATE_RELAY_POLL", "200ms".into()),
            ("ONCEGATE_RELAY_LEASE", "3s".into()),
            ("ONCEGATE_INSTANCE_ID", format!("chaos-{i}")),
            ("ONCEGATE_DB_POOL_SIZE", "4".into()),
            ("ONCEGATE_AUDIT_FLUSH_INTERVAL", "100ms".into()),
            ("ONCEGATE_STARTUP_TIMEOUT", "60s".into()),
            ("RUST_LOG", "warn".into()),
        ])
        .await
    }

    /// SIGKILL instance `i`, then start its replacement (new ports).
    async fn kill_and_restart(&mut self, i: usize) {
        let old = self.sidecars[i].take().expect("instance running");
        let old_addr = old.addr;
        old.kill().await;
        *self.faults.entry("sigkill").or_default() += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let new = self.sidecar(i).await;
        self.instances.lock().unwrap()[i] = channel(new.addr);
        tracing::info!(%old_addr, new_addr = %new.addr, "instance restarted");
        self.sidecars[i] = Some(new);
    }

    async fn fault(&mut self, step: u64) {
        match step % 4 {
            0 | 2 => self.kill_and_restart((step / 2) as usize % INSTANCES).await,
            1 => {
                self.redis.restart().await;
                *self.faults.entry("redis restart").or_default() += 1;
            }
            _ => {
                let c = redis_client(&self.redis.url()).await;
                let _: () = c.flushall(false).await.expect("FLUSHALL");
                let _ = c.quit().await;
                *self.faults.entry("redis flushall").or_default() += 1;
            }
        }
    }

    async fn restart_postgres(&mut self) {
        self.pg.crash().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.pg.up().await;
        *self.faults.entry("postgres restart").or_default() += 1;
    }

    /// Injects a fault every `every` until `until`; Postgres once, halfway.
    async fn inject(&mut self, every: Duration, until: Instant) {
        let halfway = Instant::now() + (until - Instant::now()) / 2;
        let mut postgres_done = false;
        let mut step = 0;
        while Instant::now() + every < until {
            tokio::time::sleep(every).await;
            if !postgres_done && Instant::now() >= halfway {
                self.restart_postgres().await;
                postgres_done = true;
            } else {
                self.fault(step).await;
                step += 1;
            }
        }
        if !postgres_done {
            self.restart_postgres().await;
        }
    }

    async fn db(&self) -> sqlx::PgConnection {
        sqlx::PgConnection::connect(&self.pg.url())
            .await
            .expect("throwaway postgres")
    }
}

async fn scalar(c: &mut sqlx::PgConnection, sql: &'static str) -> i64 {
    sqlx::query_scalar::<_, i64>(sql).fetch_one(c).await.unwrap()
}

/// Every event id the broker's stream holds, with how often it appears.
async fn stream_event_ids(url: &str) -> HashMap<String, u64> {
    let c = redis_client(url).await;
    let mut ids: HashMap<String, u64> = HashMap::new();
    let mut start = "-".to_string();
    loop {
        let page: Vec<StreamEntry> = c
            .xrange_values(STREAM, start.as_str(), "+", Some(5000))
            .await
            .unwrap();
        let Some(last) = page.last().map(|e| e.0.clone()) else {
            break;
        };
        for (_, fields) in &page {
            *ids.entry(fields["event_id"].clone()).or_default() += 1;
        }
        start = format!("({last}");
    }
    let _ = c.quit().await;
    ids
}

/// Runs the chaos for `seconds` and checks every promise of DESIGN §7.1.
async fn chaos(seconds: u64) {
    init_logging();
    let mut cluster = Cluster::start().await;
    let shared = Arc::new(Shared {
        instances: cluster.instances.clone(),
        ledger: Mutex::default(),
        stats: Stats::default(),
        next: AtomicU64::new(0),
        run: unique(""),
    });
    let seed = test_seed();
    let began = Instant::now();
    let until = began + Duration::from_secs(seconds);
    let consumers: Vec<_> = (0..WORKERS as u64)
        .map(|w| tokio::spawn(consumer(shared.clone(), seed.wrapping_add(w), until)))
        .collect();
    cluster.inject(Duration::from_secs(3), until).await;
    for c in consumers {
        c.await.expect("consumer task");
    }
    let elapsed = began.elapsed();

    let mut db = cluster.db().await;
    let drained = eventually(Duration::from_secs(90), || {
        let url = cluster.pg.url();
        async move {
            let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
            scalar(&mut c, "SELECT count(*) FROM outbox WHERE published_at IS NULL").await == 0
        }
    })
    .await;
    let summary = summarize(&shared, &cluster, elapsed);
    println!("{summary}");
    assert!(drained, "the relays did not drain the outbox\n{summary}");
    verify(&shared, &cluster, &mut db).await;
    println!("chaos: every check passed");
}

fn summarize(shared: &Shared, cluster: &Cluster, elapsed: Duration) -> String {
    let s = &shared.stats;
    let ledger = shared.ledger.lock().unwrap();
    let never_claimed = ledger.keys.values().filter(|r| r.claimed == 0).count();
    format!(
        "chaos summary ({:.0}s, {INSTANCES} instances, {WORKERS} consumers)\n  \
         deliveries: {} ({} redeliveries of acked submissions, {} delivered to two instances at once)\n  \
         unique submissions: {}\n  \
         Submit calls: {}, retries: {}\n  \
         answers: {} CLAIMED, {} DUPLICATE ({} submissions whose CLAIMED answer was lost to a fault)\n  \
         faults injected: {:?}\n  \
         errors seen by clients, by code: {:?}",
        elapsed.as_secs_f64(),
        s.deliveries.load(Ordering::Relaxed),
        s.redeliveries.load(Ordering::Relaxed),
        s.concurrent.load(Ordering::Relaxed),
        ledger.keys.len(),
        s.attempts.load(Ordering::Relaxed),
        s.retries.load(Ordering::Relaxed),
        s.claimed.load(Ordering::Relaxed),
        s.duplicate.load(Ordering::Relaxed),
        never_claimed,
        cluster.faults,
        s.errors.lock().unwrap(),
    )
}

async fn verify(shared: &Shared, cluster: &Cluster, db: &mut sqlx::PgConnection) {
    // A snapshot: no lock is held across the queries below.
    let (clients, violations): (HashMap<String, (String, i64)>, Vec<String>) = {
        let ledger = shared.ledger.lock().unwrap();
        let keys = ledger
            .keys
            .iter()
            .map(|(k, r)| (k.clone(), (r.award.clone(), r.amount)))
            .collect();
        (keys, ledger.violations.clone())
    };
    assert!(violations.is_empty(), "violations: {violations:#?}");
    let bad_codes: Vec<_> = shared
        .stats
        .errors
        .lock()
        .unwrap()
        .keys()
        .filter(|c| c.contains("InvalidArgument") || c.contains("FailedPrecondition"))
        .cloned()
        .collect();
    assert!(
        bad_codes.is_empty(),
        "a consumer would dead-letter: {bad_codes:?}"
    );

    // Exactly one disbursement per unique submission, with its amount.
    let rows = sqlx::query("SELECT idempotency_key, award_id, amount_cents FROM disbursements")
        .fetch_all(&mut *db)
        .await
        .unwrap();
    let mut in_ledger: HashMap<String, (String, i64)> = HashMap::new();
    for r in &rows {
        let key: String = r.get(0);
        assert!(in_ledger.insert(key, (r.get(1), r.get(2))).is_none());
    }
    assert_eq!(
        in_ledger.len(),
        clients.len(),
        "one disbursement per unique submission"
    );
    let mut expected: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for (key, (award, amount)) in &clients {
        assert_eq!(
            in_ledger.get(key),
            Some(&(award.clone(), *amount)),
            "ledger row of {key}"
        );
        let e = expected.entry(award.clone()).or_default();
        e.0 += amount;
        e.1 += 1;
    }

    // Running totals exact, sequences dense.
    let balances =
        sqlx::query("SELECT award_id, total_cents, disbursement_count, last_sequence FROM award_balances")
            .fetch_all(&mut *db)
            .await
            .unwrap();
    let actual: BTreeMap<String, (i64, i64)> = balances
        .iter()
        .map(|r| {
            assert_eq!(r.get::<i64, _>(2), r.get::<i64, _>(3), "last_sequence = count");
            (r.get(0), (r.get(1), r.get(2)))
        })
        .collect();
    assert_eq!(actual, expected, "running totals per award");
    let gaps = scalar(
        db,
        "SELECT count(*) FROM (SELECT award_id FROM disbursements GROUP BY award_id \
         HAVING count(*) <> max(sequence) OR count(*) <> count(DISTINCT sequence)) g",
    )
    .await;
    assert_eq!(gaps, 0, "per-award sequences are 1..n");
    assert_eq!(
        scalar(db, "SELECT count(*) FROM processed_messages").await,
        rows.len() as i64
    );

    // Every outbox event published, and the broker holds it.
    assert_eq!(scalar(db, "SELECT count(*) FROM outbox").await, rows.len() as i64);
    assert_eq!(
        scalar(db, "SELECT count(*) FROM outbox WHERE quarantined_at IS NOT NULL").await,
        0
    );
    let events: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT event_id FROM outbox")
        .fetch_all(&mut *db)
        .await
        .unwrap();
    let published = stream_event_ids(&cluster.broker.url()).await;
    let missing: Vec<_> = events
        .iter()
        .filter(|e| !published.contains_key(&e.to_string()))
        .collect();
    assert!(
        missing.is_empty(),
        "{} events never reached the stream",
        missing.len()
    );
    let repeats: u64 = published.values().map(|n| n - 1).sum();
    println!(
        "chaos: {} events in the stream ({repeats} published more than once)",
        events.len()
    );

    // One processed audit row per disbursement.
    let audited: Vec<(String, i64)> = sqlx::query_as(
        "SELECT key_prefix, count(*) FROM audit_log WHERE decision = 'processed' GROUP BY key_prefix",
    )
    .fetch_all(&mut *db)
    .await
    .unwrap();
    let audited: HashMap<String, i64> = audited.into_iter().collect();
    let prefixes: HashSet<String> = in_ledger.keys().map(|k| k[..12].to_string()).collect();
    assert_eq!(audited.len(), prefixes.len(), "processed audit rows");
    assert!(
        prefixes.iter().all(|p| audited.get(p) == Some(&1)),
        "one processed audit row per disbursement"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_short() {
    chaos(40).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: ONCEGATE_CHAOS_SECONDS (default 360)"]
async fn chaos_long() {
    let seconds = std::env::var("ONCEGATE_CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(360);
    chaos(seconds).await;
}

/// The consumer crash window: a consumer dies after `Submit` returned but
/// before it acked the broker (`XACK`); the broker redelivers to the
/// restarted consumer (its pending entries, read from id 0), which gets
/// `DUPLICATE` with the same disbursement from another instance, and acks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_killed_between_submit_and_xack_gets_duplicate_on_redelivery() {
    let db = TestDb::new(Kind::Postgres).await;
    let first_instance = TestApp::spawn(serve_args(&db)).await;
    let second_instance = TestApp::spawn(serve_args(&db)).await;
    let redis = redis_client(&redis_url()).await;
    let (stream, group) = (unique("it-deliveries-"), "payments");
    let _: () = redis.xgroup_create(&stream, group, "$", true).await.unwrap();
    let _: String = redis
        .xadd(
            &stream,
            false,
            None,
            "*",
            vec![
                ("award_id", "AWD-CRASH"),
                ("submission_timestamp", "2026-11-29T10:00:00Z"),
                ("amount_cents", "4200"),
                ("payload", "{\"invoice\":\"INV-77\"}"),
            ],
        )
        .await
        .unwrap();

    // The consumer: read, Submit, then (were it not killed) XACK.
    let (submitted_tx, submitted_rx) = tokio::sync::oneshot::channel();
    let consumer = {
        let (stream, url, addr) = (stream.clone(), redis_url(), first_instance.addr);
        tokio::spawn(async move {
            let r = redis_client(&url).await;
            let (id, sub) = read_one(&r, &stream, group, ">").await.expect("a delivery");
            let mut gate = GateClient::connect(format!("http://{addr}")).await.unwrap();
            let decision = gate.submit(sub).await.unwrap().into_inner();
            let _ = submitted_tx.send(decision);
            std::future::pending::<()>().await; // killed here, before XACK
            let _: i64 = r.xack(&stream, group, id).await.unwrap();
        })
    };
    let first = submitted_rx.await.expect("Submit returned");
    consumer.abort();
    assert!(consumer.await.unwrap_err().is_cancelled());
    assert_eq!(outcome(&first), Outcome::Claimed);

    // The restarted consumer: its pending entry comes back.
    let (id, sub) = read_one(&redis, &stream, group, "0")
        .await
        .expect("the unacked delivery is redelivered");
    let mut gate = second_instance.client().await;
    let again = gate.submit(sub).await.unwrap().into_inner();
    assert_eq!(outcome(&again), Outcome::Duplicate);
    assert_eq!(
        again.disbursement, first.disbursement,
        "the stored result, unchanged"
    );
    let acked: i64 = redis.xack(&stream, group, &id).await.unwrap();
    assert_eq!(acked, 1);
    assert!(
        read_one(&redis, &stream, group, "0").await.is_none(),
        "nothing pending"
    );

    let n = db.counts().await;
    assert_eq!(n.ledger(), (1, 1, 4200, 1), "one disbursement");
    let _: () = redis.del(&stream).await.unwrap();
}

type StreamEntry = (String, HashMap<String, String>);

/// XREADGROUP one entry as consumer `worker-1` (`>` new, `0` its pending).
async fn read_one(r: &Client, stream: &str, group: &str, from: &str) -> Option<(String, pb::Submission)> {
    let mut read: HashMap<String, Vec<StreamEntry>> = r
        .xreadgroup_map(group, "worker-1", Some(1), None, false, stream, from)
        .await
        .unwrap();
    let (id, f) = read.remove(stream)?.into_iter().next()?;
    let sub = submission(
        &f["award_id"],
        &f["submission_timestamp"],
        f["payload"].as_bytes(),
        f["amount_cents"].parse().unwrap(),
    );
    Some((id, sub))
}
