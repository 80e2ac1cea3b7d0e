//! The relay on a real Apache Kafka (`ONCEGATE_TEST_KAFKA_BOOTSTRAP`), and
//! every sink's broker down when the sidecar starts.
//!
//! Kafka: each batch is one transaction with its high-water mark, so a
//! read_committed consumer sees every event once, in per-award order, even
//! when the relay dies after committing and before marking the rows; a
//! zombie relay with the same transactional id is fenced; reconcile reads
//! the topic back.
//!
//! Start-up outage (every sink): claims are served at once, the relay is
//! paused (breaker 1), the backlog gauge counts the waiting events and
//! their age grows; when the broker answers, every event is published once
//! in per-award order, breaker 0, backlog 0.

use crate::helpers::*;
use crate::relay::{amqp_url, outbox_of, relay_settings};
use oncegate::broker::kafka::KafkaSink;
use oncegate::broker::{BrokerEntry, Sink, SinkSettings, SinkSpec};
use oncegate::pb::Outcome;
use oncegate::pb::gate_client::GateClient;
use oncegate::relay::Relay;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::Channel;

on_both_stores!(
    kafka_relay_publishes_each_event_once_in_award_order,
    kafka_relay_killed_after_its_commit_settles_and_publishes_nothing_twice,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stream_sink_down_at_start_serves_claims_then_publishes() {
    sink_down_at_start(&redis_url(), "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_sink_down_at_start_serves_claims_then_publishes() {
    sink_down_at_start(&nats_url(), "nats").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_sink_down_at_start_serves_claims_then_publishes() {
    sink_down_at_start(&amqp_url(), "amqp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_sink_down_at_start_serves_claims_then_publishes() {
    sink_down_at_start(&format!("kafka://{}", bootstrap()), "kafka").await;
}

/// A sink URL that cannot be parsed is a configuration error, not an
/// outage: `serve` exits 64 at once naming the setting, before listening.
#[tokio::test]
async fn a_bad_sink_url_exits_64_naming_it() {
    let cases = [
        ("ftp://broker:21", "must be none, log"),
        ("redis://127.0.0.1:notaport", "not a valid Redis URL"),
        ("nats://", "not a valid NATS URL"),
        ("amqp://guest:guest@[::1", "not a valid AMQP URL"),
        ("kafka://broker", "not host:port"),
    ];
    for (url, says) in cases {
        let out = tokio::time::timeout(
            Duration::from_secs(20),
            tokio::process::Command::new(oncegate_bin())
                .arg("serve")
                .env_clear()
                .env("ONCEGATE_RELAY_SINK", url)
                .env("ONCEGATE_LISTEN", format!("127.0.0.1:{}", free_port()))
                .env("ONCEGATE_METRICS_LISTEN", format!("127.0.0.1:{}", free_port()))
                .env("ONCEGATE_HEALTH_LISTEN", format!("127.0.0.1:{}", free_port()))
                .kill_on_drop(true)
                .output(),
        )
        .await
        .expect("exits at once, not retrying a URL")
        .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{url}: {stderr}");
        assert!(
            stderr.contains("ONCEGATE_RELAY_SINK") && stderr.contains(says),
            "{url}: {stderr}"
        );
    }
}

const TS: &str = "2026-11-29T10:00:00Z";

pub fn bootstrap() -> String {
    std::env::var("ONCEGATE_TEST_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

pub fn kafka_url() -> String {
    format!("kafka://{}", bootstrap())
}

fn reader(url: &str, stream: &str) -> SinkSettings {
    SinkSettings::new(SinkSpec::parse(url).unwrap(), stream, "it-reader")
}

/// Everything a read_committed reader finds in `topic` (or stream).
pub async fn read_back(url: &str, stream: &str) -> Vec<BrokerEntry> {
    let mut log = reader(url, stream)
        .open_log()
        .await
        .expect("open the broker log")
        .expect("a readable sink");
    let mut all = Vec::new();
    loop {
        let batch = log.next_batch(1000).await.expect("read the broker");
        if batch.is_empty() {
            break;
        }
        all.extend(batch);
    }
    log.close().await;
    all
}

/// Each event id once, and each award's sequences 1..=per_award in order.
fn assert_once_in_award_order(entries: &[BrokerEntry], awards: &[&str], per_award: usize) {
    let ids: Vec<String> = entries.iter().filter_map(event_id_of).collect();
    let unique: HashSet<&String> = ids.iter().collect();
    assert_eq!(ids.len(), entries.len(), "every entry names its event");
    assert_eq!(unique.len(), ids.len(), "no event published twice: {ids:?}");
    let mut by_award: HashMap<String, Vec<i64>> = HashMap::new();
    for e in entries {
        let body: serde_json::Value = serde_json::from_str(e.body.as_deref().expect("body")).expect("JSON");
        let award = e
            .award_id
            .clone()
            .or_else(|| body["award_id"].as_str().map(String::from));
        let seq = e
            .sequence
            .as_ref()
            .and_then(|s| s.parse().ok())
            .or_else(|| body["sequence"].as_i64())
            .expect("sequence");
        by_award.entry(award.expect("award id")).or_default().push(seq);
    }
    for award in awards {
        assert_eq!(
            by_award.get(*award).cloned().unwrap_or_default(),
            (1..=per_award as i64).collect::<Vec<_>>(),
            "award {award}: broker order is sequence order"
        );
    }
    assert_eq!(entries.len(), awards.len() * per_award);
}

async fn kafka_sink(topic: &str, transactional_id: &str) -> Arc<KafkaSink> {
    Arc::new(
        KafkaSink::connected(&kafka_url(), topic, transactional_id, Duration::from_secs(10))
            .await
            .expect("Kafka sink (is Kafka running? ONCEGATE_TEST_KAFKA_BOOTSTRAP)"),
    )
}

async fn kafka_relay_publishes_each_event_once_in_award_order(kind: Kind) {
    let db = TestDb::new(kind).await;
    let awards = ["AWD-K1", "AWD-K2", "AWD-K3"];
    outbox_of(&db, &awards, 8).await;
    let topic = unique("og-it-kafka-");
    let relay = Relay::new(
        db.open().await,
        kafka_sink(&topic, &unique("og-it-txn-")).await,
        relay_settings("it-kafka", 5, Duration::from_secs(10), 3),
    );
    let mut published = 0;
    for _ in 0..100 {
        let r = relay.step().await.expect("step");
        if r.leased == 0 {
            break;
        }
        published += r.published;
    }
    assert_eq!(published, 24);
    let entries = read_back(&kafka_url(), &topic).await;
    assert_once_in_award_order(&entries, &awards, 8);
    for e in &entries {
        assert_eq!(e.event_type.as_deref(), Some("disbursement.recorded"));
        let body: serde_json::Value = serde_json::from_str(e.body.as_deref().unwrap()).expect("JSON body");
        assert_eq!(
            body["event_id"].as_str(),
            e.event_id.as_deref(),
            "body and header agree"
        );
    }
    assert_eq!(
        db.scalar("select count(*) from outbox where published_at is null")
            .await,
        0
    );
    // Reconcile reads the topic back: clean.
    let (code, out) = reconcile_topic(&db, &topic).await;
    assert_eq!(code, Some(0), "{out}");
    // A record the ledger does not know, committed into the topic by
    // someone else: reconcile fails and names it.
    let stray = uuid::Uuid::now_v7().to_string();
    plant_record(&topic, &stray).await;
    let (code, stdout) = reconcile_topic(&db, &topic).await;
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains(&stray), "the stray event is named:\n{stdout}");
}

async fn kafka_relay_killed_after_its_commit_settles_and_publishes_nothing_twice(kind: Kind) {
    let db = TestDb::new(kind).await;
    let awards = ["AWD-KK1", "AWD-KK2"];
    outbox_of(&db, &awards, 6).await;
    let topic = unique("og-it-kafka-kill-");
    let prefix = unique("og-it-txn-");
    let lease = Duration::from_secs(4);
    let settings = |owner: &str| oncegate::relay::RelaySettings {
        slots: 2,
        ..relay_settings(owner, 5, lease, 3)
    };
    // The first relay commits its batches and "dies" before marking them.
    let first_sink = kafka_sink(&topic, &prefix).await;
    let first = Relay::new(db.open().await, first_sink.clone(), settings("it-a"));
    let leased = first.lease().await.unwrap();
    assert!(!leased.is_empty());
    let crashed_at = tokio::time::Instant::now();
    let published = first.publish_unmarked(&leased).await;
    assert_eq!(published.len(), leased.len(), "committed in Kafka");
    assert_eq!(
        db.scalar("select count(*) from outbox where published_at is null")
            .await,
        12,
        "not marked"
    );
    drop(first);
    // Another relay takes its slots once their lease ran out (the same
    // transactional ids: the slots'): it settles before publishing.
    let second = Relay::new(
        db.open().await,
        kafka_sink(&topic, &prefix).await,
        settings("it-b"),
    );
    let mut settled = 0;
    while db
        .scalar("select count(*) from outbox where published_at is null")
        .await
        > 0
    {
        assert!(
            crashed_at.elapsed() < lease + Duration::from_secs(20),
            "never drained"
        );
        let r = second.step().await.unwrap();
        assert!(
            r.leased == 0 || crashed_at.elapsed() >= lease,
            "published before the lease ran out"
        );
        settled += r.settled;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        settled,
        leased.len(),
        "what the dead relay committed was settled, not published again"
    );
    // The zombie's producer was fenced by the second's init_transactions:
    // whatever it tries now is never visible to a read_committed reader.
    let slot = oncegate::broker::SlotId {
        index: oncegate::store::slots::slot_of(&leased[0].award_id, 2) as u32,
        count: 2,
    };
    let far = tokio::time::Instant::now() + Duration::from_secs(30);
    let zombie = first_sink.publish(slot, &[&leased[0]], far).await;
    assert!(
        zombie.published.is_empty(),
        "a fenced relay cannot commit: {zombie:?}"
    );
    let entries = read_back(&kafka_url(), &topic).await;
    assert_once_in_award_order(&entries, &awards, 6);
}

/// The broker reachable only through a proxy that is cut when the
/// sidecar starts.
async fn sink_down_at_start(url: &str, name: &str) {
    let upstream = host_port(url);
    let proxy = FaultProxy::start(upstream).await;
    proxy.cut();
    let proxied = url.replacen(&upstream.to_string(), &proxy.addr.to_string(), 1);
    let db = TestDb::new(Kind::Postgres).await;
    let stream = unique(&format!("og-it-down-{name}-"));
    // The real binary: its metrics are its own (in-process apps share one
    // registry with the other tests).
    let app = Sidecar::start(&[
        ("DATABASE_URL", db.url.clone()),
        ("ONCEGATE_RELAY_SINK", proxied.clone()),
        ("ONCEGATE_RELAY_STREAM", stream.clone()),
        ("ONCEGATE_RELAY_SUBJECT", format!("{stream}.events")),
        (
            "ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID_PREFIX",
            unique("og-it-txn-"),
        ),
        ("ONCEGATE_RELAY_RETRY_BACKOFF", "50ms".into()),
    ])
    .await;
    let awards = ["AWD-D1", "AWD-D2"];
    let mut c = app.client().await;
    for i in 0..3 {
        claim_each(&mut c, &awards, &format!("{name}-{i}")).await;
    }
    let breaker = format!("oncegate_relay_breaker_state{{sink=\"{name}\"}}");
    let paused = eventually(Duration::from_secs(20), || {
        let (app, breaker) = (&app, breaker.clone());
        async move {
            let m = app.metrics().await;
            metric(&m, &breaker) == Some(1.0) && metric(&m, "oncegate_outbox_backlog") == Some(6.0)
        }
    })
    .await;
    let m = app.metrics().await;
    assert!(paused, "paused with the backlog counted:\n{m}");
    assert_eq!(
        gate_health(&app).await,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
        "claims are the sidecar's job: Gate stays SERVING while the relay is paused"
    );
    let listed = outbox_list(&db, &app).await;
    assert!(
        listed.contains(&format!("relay: PAUSED: the {name} broker is unreachable"))
            && listed.contains("outbox: 6 waiting to be published"),
        "{listed}"
    );
    let age = metric(&m, "oncegate_outbox_oldest_age_seconds").unwrap_or(0.0);
    let older = eventually(Duration::from_secs(10), || async {
        metric(&app.metrics().await, "oncegate_outbox_oldest_age_seconds").unwrap_or(0.0) > age + 1.0
    })
    .await;
    assert!(older, "the oldest age grows while the broker is down");
    if name == "amqp" {
        bind_queue(&stream).await;
    }
    proxy.restore();
    let drained = eventually(Duration::from_secs(60), || {
        let (app, breaker) = (&app, breaker.clone());
        async move {
            let m = app.metrics().await;
            metric(&m, &breaker) == Some(0.0) && metric(&m, "oncegate_outbox_backlog") == Some(0.0)
        }
    })
    .await;
    assert!(
        drained,
        "published once the broker answered:\n{}\n{}",
        app.metrics().await,
        app.log_text()
    );
    let warnings = app.log_text().matches("broker unreachable; relay paused").count();
    assert_eq!(warnings, 1, "one WARN for the outage:\n{}", app.log_text());
    let listed = outbox_list(&db, &app).await;
    assert!(
        listed.contains(&format!("relay: publishing to {name}")),
        "{listed}"
    );
    // Then lost and back twice more while serving. (Kafka's clients reach
    // the broker at its advertised address, past the proxy: its outages
    // mid-stream stop the broker itself, in the test below.)
    let mut per_award = 3;
    if name != "kafka" {
        for round in 0..2 {
            per_award +=
                outage_mid_stream(&app, Broker::Proxy(&proxy), &awards, &format!("{name}-r{round}")).await;
        }
        let warnings = app.log_text().matches("broker unreachable; relay paused").count();
        assert_eq!(warnings, 3, "one WARN per outage:\n{}", app.log_text());
    }
    assert_eq!(
        db.scalar("select count(*) from outbox where published_at is null")
            .await,
        0
    );
    if name != "amqp" {
        let mut entries = read_back(url, &stream).await;
        if name == "redis" {
            // Redis Streams is at least once: an XADD whose reply was lost
            // with the cut connection is sent again (consumers dedupe on
            // the event id, docs/RELAY.md "Sinks"). JetStream dedupes on
            // Nats-Msg-Id; Kafka's transactions make it exactly once.
            let repeats = drop_repeats(&mut entries);
            eprintln!("redis: {repeats} event(s) repeated across the outages");
        }
        assert_once_in_award_order(&entries, &awards, per_award);
    }
    assert!(app.terminate().await.success());
}

/// Keeps the first entry of each event id; how many repeats were dropped.
fn drop_repeats(entries: &mut Vec<BrokerEntry>) -> usize {
    let before = entries.len();
    let mut seen = HashSet::new();
    entries.retain(|e| seen.insert(event_id_of(e)));
    before - entries.len()
}

pub fn event_id_of(e: &BrokerEntry) -> Option<String> {
    e.event_id.clone().or_else(|| {
        let body: serde_json::Value = serde_json::from_str(e.body.as_deref()?).ok()?;
        Some(body["event_id"].as_str()?.to_string())
    })
}

/// `oncegate outbox list` for `db`, reading the relay's state from `app`.
pub async fn outbox_list(db: &TestDb, app: &Sidecar) -> String {
    let out = tokio::process::Command::new(oncegate_bin())
        .args(["outbox", "list", "--metrics", &app.metrics_addr.to_string()])
        .env_clear()
        .env("DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The health status of `oncegate.v1.Gate` on the sidecar's listener.
async fn gate_health(app: &Sidecar) -> i32 {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", app.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: "oncegate.v1.Gate".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status
}

/// Claims one delivery per award.
async fn claim_each(c: &mut GateClient<Channel>, awards: &[&str], tag: &str) {
    for award in awards {
        let s = submission(award, TS, format!("{award}-{tag}").as_bytes(), 100);
        let d = tokio::time::timeout(Duration::from_secs(5), c.submit(s))
            .await
            .expect("a claim does not wait for the broker")
            .unwrap()
            .into_inner();
        assert_eq!(outcome(&d), Outcome::Claimed);
    }
}

/// One claim per award with the broker up, the broker lost, two more while
/// it is away (the relay pauses, the backlog counts them), the broker back:
/// every event published. Returns the claims made per award.
async fn outage_mid_stream(app: &Sidecar, broker: Broker<'_>, awards: &[&str], tag: &str) -> usize {
    let mut c = app.client().await;
    claim_each(&mut c, awards, &format!("{tag}-a")).await;
    broker.down().await;
    claim_each(&mut c, awards, &format!("{tag}-b")).await;
    claim_each(&mut c, awards, &format!("{tag}-c")).await;
    let waiting = (2 * awards.len()) as f64;
    let paused = eventually(Duration::from_secs(30), || async {
        let m = app.metrics().await;
        metric(&m, "oncegate_outbox_backlog").unwrap_or(0.0) >= waiting
            && m.lines()
                .any(|l| l.starts_with("oncegate_relay_breaker_state{") && l.ends_with(" 1"))
    })
    .await;
    assert!(
        paused,
        "{tag}: paused with the backlog counted:\n{}",
        app.metrics().await
    );
    broker.up().await;
    let drained = eventually(Duration::from_secs(60), || async {
        let m = app.metrics().await;
        metric(&m, "oncegate_outbox_backlog") == Some(0.0)
            && m.lines()
                .any(|l| l.starts_with("oncegate_relay_breaker_state{") && l.ends_with(" 0"))
    })
    .await;
    assert!(
        drained,
        "{tag}: published once the broker answered:\n{}",
        app.log_text()
    );
    3
}

/// Where a broker URL points.
fn host_port(url: &str) -> SocketAddr {
    let rest = url.split("://").nth(1).unwrap();
    let rest = rest.rsplit('@').next().unwrap();
    let hostport = rest.split(['/', ',']).next().unwrap();
    hostport
        .replace("localhost", "127.0.0.1")
        .parse()
        .expect("host:port")
}

/// A queue bound to the exchange, so RabbitMQ routes the events (the AMQP
/// sink treats an unroutable message as an outage).
pub async fn bind_queue(exchange: &str) {
    use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    let conn = lapin::Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.exchange_declare(
        exchange.into(),
        lapin::ExchangeKind::Topic,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    let q = format!("{exchange}.q");
    ch.queue_declare(
        q.as_str().into(),
        QueueDeclareOptions {
            auto_delete: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        q.as_str().into(),
        exchange.into(),
        "#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    std::mem::forget(conn);
}

/// How a test loses its broker: a proxy cut, or the broker stopped.
#[derive(Clone, Copy)]
enum Broker<'a> {
    Proxy(&'a FaultProxy),
    Kafka(&'a ThrowawayKafka),
}

impl Broker<'_> {
    async fn down(self) {
        match self {
            Self::Proxy(p) => p.cut(),
            Self::Kafka(k) => k.stop().await,
        }
    }

    async fn up(self) {
        match self {
            Self::Proxy(p) => p.restore(),
            Self::Kafka(k) => k.start().await,
        }
    }
}

/// A Kafka broker of the test's own (`scripts/kafka`, KRaft, one node), to
/// stop and start again on the same log directory: its data survives.
pub struct ThrowawayKafka {
    dir: std::path::PathBuf,
    pub port: u16,
    /// `scripts/kafka start` options after the port.
    options: Vec<String>,
}

impl ThrowawayKafka {
    pub async fn new() -> Self {
        Self::with_options(Vec::new()).await
    }

    /// A broker started with `scripts/kafka start` options
    /// (`--no-auto-create`, `--listener NAME,PORT,HOST:PORT`).
    pub async fn with_options(options: Vec<String>) -> Self {
        // The controller listens on port + 1.
        let port = loop {
            let p = free_port();
            if std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
                break p;
            }
        };
        let dir = std::env::temp_dir().join(unique("oncegate-kafka-"));
        let broker = Self { dir, port, options };
        broker.start().await;
        broker
    }

    pub fn url(&self) -> String {
        format!("kafka://127.0.0.1:{}", self.port)
    }

    async fn script(&self, verb: &str) {
        let dir = self.dir.to_string_lossy().into_owned();
        let port = self.port.to_string();
        let mut args = vec![verb, dir.as_str()];
        if verb == "start" {
            args.push(&port);
            args.extend(self.options.iter().map(String::as_str));
        }
        let status = tokio::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka"))
            .args(&args)
            .status()
            .await
            .expect("scripts/kafka runs");
        assert!(status.success(), "scripts/kafka {verb} failed");
    }

    pub async fn start(&self) {
        self.script("start").await;
    }

    pub async fn stop(&self) {
        self.script("stop").await;
    }
}

impl Drop for ThrowawayKafka {
    fn drop(&mut self) {
        let _ = std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka"))
            .arg("stop")
            .arg(&self.dir)
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The broker itself stopped and started twice while the sidecar serves:
/// the relay pauses, claims go on, and after each return every event is
/// in the topic once, in per-award order (Kafka's exactly-once path across
/// a broker restart: the open transaction is aborted, the batch published
/// again in a new one, settled against the marks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_broker_restarted_twice_mid_stream_loses_and_doubles_nothing() {
    let broker = ThrowawayKafka::new().await;
    let db = TestDb::new(Kind::Postgres).await;
    let topic = unique("og-it-kafka-restart-");
    let app = Sidecar::start(&[
        ("DATABASE_URL", db.url.clone()),
        ("ONCEGATE_RELAY_SINK", broker.url()),
        ("ONCEGATE_RELAY_STREAM", topic.clone()),
        (
            "ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID_PREFIX",
            unique("og-it-txn-"),
        ),
        ("ONCEGATE_RELAY_LEASE", "4s".into()),
        ("ONCEGATE_RELAY_RETRY_BACKOFF", "50ms".into()),
    ])
    .await;
    let awards = ["AWD-KR1", "AWD-KR2"];
    let mut c = app.client().await;
    for i in 0..3 {
        claim_each(&mut c, &awards, &format!("kr-{i}")).await;
    }
    let mut per_award = 3;
    for round in 0..2 {
        per_award +=
            outage_mid_stream(&app, Broker::Kafka(&broker), &awards, &format!("kafka-r{round}")).await;
    }
    assert_eq!(
        db.scalar("select count(*) from outbox where published_at is null")
            .await,
        0
    );
    let entries = read_back(&broker.url(), &topic).await;
    assert_once_in_award_order(&entries, &awards, per_award);
    assert!(app.terminate().await.success());
}

/// The relay (the whole sidecar) SIGKILLed six times while claims stream
/// in, each time restarted with the same transactional id: a read_committed
/// reader finds every event once, in per-award order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_relay_sigkilled_mid_stream_publishes_every_event_once() {
    let db = TestDb::new(Kind::Postgres).await;
    let topic = unique("og-it-kafka-sigkill-");
    let env = [
        ("DATABASE_URL", db.url.clone()),
        ("ONCEGATE_RELAY_SINK", kafka_url()),
        ("ONCEGATE_RELAY_STREAM", topic.clone()),
        ("ONCEGATE_INSTANCE_ID", unique("og-it-relay-")),
        ("ONCEGATE_RELAY_BATCH", "4".into()),
        ("ONCEGATE_RELAY_LEASE", "2s".into()),
        ("ONCEGATE_RELAY_POLL", "20ms".into()),
        ("ONCEGATE_RELAY_RETRY_BACKOFF", "50ms".into()),
    ];
    let awards = ["AWD-SK1", "AWD-SK2", "AWD-SK3"];
    let (kills, per_kill) = (6, 8);
    let mut logs = Vec::new();
    let mut app = Sidecar::start(&env).await;
    for kill in 0..kills {
        let mut c = app.client().await;
        for i in 0..per_kill {
            claim_each(&mut c, &awards, &format!("sk{kill}-{i}")).await;
        }
        // Somewhere in the relay's publishing of what just arrived.
        tokio::time::sleep(Duration::from_millis(40 + (kill as u64 * 61) % 250)).await;
        logs.push(app.log.clone());
        app.kill().await;
        app = Sidecar::start(&env).await;
    }
    let drained = eventually(Duration::from_secs(60), || async {
        metric(&app.metrics().await, "oncegate_outbox_backlog") == Some(0.0)
    })
    .await;
    assert!(drained, "published after the last restart:\n{}", app.log_text());
    assert_eq!(
        db.scalar("select count(*) from outbox where published_at is null")
            .await,
        0
    );
    logs.push(app.log.clone());
    let settled: usize = logs
        .iter()
        .map(|l| {
            std::fs::read_to_string(l)
                .unwrap_or_default()
                .matches("settled events an earlier transaction had published")
                .count()
        })
        .sum();
    let entries = read_back(&kafka_url(), &topic).await;
    eprintln!(
        "{kills} SIGKILLs: {} events read back once each; {settled} restarts settled a committed batch",
        entries.len()
    );
    assert_once_in_award_order(&entries, &awards, kills * per_kill);
    assert!(app.terminate().await.success());
}

/// `oncegate reconcile` of `db` against the Kafka `topic`: exit code, and
/// its output (stdout, then stderr).
async fn reconcile_topic(db: &TestDb, topic: &str) -> (Option<i32>, String) {
    let out = tokio::process::Command::new(oncegate_bin())
        .args(["reconcile", "--sink", &kafka_url(), "--stream", topic])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", &db.url)
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Produces one record with relay-style headers into `topic`, outside the
/// relay (an idempotent producer, no transaction).
async fn plant_record(topic: &str, event_id: &str) {
    use rdkafka::message::{Header, OwnedHeaders};
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    let body = serde_json::json!({"event_id": event_id, "type": "disbursement.recorded", "award_id": "AWD-STRAY", "sequence": 1});
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "event_id",
            value: Some(event_id),
        })
        .insert(Header {
            key: "event_type",
            value: Some("disbursement.recorded"),
        })
        .insert(Header {
            key: "award_id",
            value: Some("AWD-STRAY"),
        })
        .insert(Header {
            key: "sequence",
            value: Some("1"),
        });
    let payload = body.to_string();
    let record = FutureRecord::to(topic)
        .key("AWD-STRAY")
        .payload(&payload)
        .headers(headers);
    producer
        .send(record, Duration::from_secs(10))
        .await
        .expect("the stray record is written");
}
