//! The outbox relay against real brokers: every processed submission's event
//! reaches Redis Streams once and in per-award order, replicas share the
//! outbox's slots (an award with one of them at a time) without publishing
//! a row twice, a relay that dies between publish and mark has its slots
//! taken and its events republished after its lease (and JetStream drops
//! the repeat by `Nats-Msg-Id`), and a poison event is quarantined while
//! others flow.
//!
//! Each test has its own database, its own Redis stream key and its own
//! JetStream stream name and subject.

use crate::helpers::*;
use async_nats::jetstream;
use fred::prelude::*;
use oncegate::broker::Sink;
use oncegate::broker::nats::JetStreamSink;
use oncegate::broker::redis_stream::RedisStreamSink;
use oncegate::pb::{self, Outcome};
use oncegate::relay::{Relay, RelaySettings};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

on_both_stores!(
    every_processed_event_reaches_the_redis_stream_once_in_award_order,
    relay_killed_before_marking_republishes_after_the_lease,
    jetstream_drops_the_republished_event_by_msg_id,
    poison_event_is_quarantined_while_other_awards_flow,
    failed_publishes_are_retried_in_award_order,
    a_broker_outage_pauses_the_relay_without_spending_attempts,
);

const TS: &str = "2026-11-29T10:00:00Z";

pub fn relay_settings(owner: &str, batch: i64, lease: Duration, max_attempts: i32) -> RelaySettings {
    RelaySettings {
        batch,
        lease,
        poll: Duration::from_millis(100),
        max_attempts,
        owner: owner.into(),
        retry_backoff: Duration::from_millis(100),
        slots: 8,
        linger: Duration::ZERO,
    }
}

pub async fn redis_sink(stream: &str) -> Arc<dyn Sink> {
    Arc::new(
        RedisStreamSink::connected(&redis_url(), stream, 1_000_000)
            .await
            .expect("redis sink"),
    )
}

/// A stream entry's fields.
pub type Entry = HashMap<String, String>;

pub async fn redis_client() -> Client {
    let client = Builder::from_config(Config::from_url(&redis_url()).unwrap())
        .build()
        .unwrap();
    client.init().await.expect("redis");
    client
}

/// The whole stream, oldest first.
pub async fn xrange(stream: &str) -> Vec<Entry> {
    let client = redis_client().await;
    let entries: Vec<(String, Entry)> = client.xrange(stream, "-", "+", None).await.expect("XRANGE");
    let _ = client.quit().await;
    entries.into_iter().map(|(_, fields)| fields).collect()
}

pub async fn delete_key(key: &str) {
    let client = redis_client().await;
    let _: i64 = client.del(key).await.unwrap();
    let _ = client.quit().await;
}

/// Steps until a step leases nothing; returns the events published.
pub async fn drain(relay: &Relay) -> usize {
    let mut published = 0;
    for _ in 0..1000 {
        let r = relay.step().await.expect("relay step");
        if r.leased == 0 {
            return published;
        }
        published += r.published;
    }
    panic!("relay never drained the outbox");
}

/// Submits `per_award` submissions for each award, all at once (so group
/// commit mixes awards in one transaction). Returns the decisions.
pub async fn submit_concurrently(
    app: &TestApp,
    awards: &[&str],
    per_award: usize,
) -> Vec<(pb::Submission, pb::Decision)> {
    let mut tasks = Vec::new();
    for i in 0..per_award {
        for award in awards {
            let s = submission(award, TS, format!("{award}-{i}").as_bytes(), 100 + i as i64);
            let mut c = app.client().await;
            tasks.push(tokio::spawn(async move {
                let d = c.submit(s.clone()).await.expect("submit").into_inner();
                (s, d)
            }));
        }
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Fills a fresh database's outbox through the real server (no relay).
pub async fn outbox_of(
    db: &TestDb,
    awards: &[&str],
    per_award: usize,
) -> Vec<(pb::Submission, pb::Decision)> {
    let app = TestApp::spawn(serve_args(db)).await;
    let decided = submit_concurrently(&app, awards, per_award).await;
    app.shutdown().await;
    assert!(decided.iter().all(|(_, d)| outcome(d) == Outcome::Claimed));
    decided
}

fn json(entry: &Entry) -> serde_json::Value {
    serde_json::from_str(&entry["data"]).expect("data is JSON")
}

/// Asserts each award's events appear in sequence order 1..=n.
fn assert_award_order(entries: &[Entry], awards: &[&str], per_award: usize) {
    for award in awards {
        let seqs: Vec<i64> = entries
            .iter()
            .filter(|e| e["award_id"] == *award)
            .map(|e| e["sequence"].parse().unwrap())
            .collect();
        assert_eq!(
            seqs,
            (1..=per_award as i64).collect::<Vec<_>>(),
            "award {award}: stream order is sequence order"
        );
    }
}

async fn every_processed_event_reaches_the_redis_stream_once_in_award_order(kind: Kind) {
    let db = TestDb::new(kind).await;
    let stream = unique("og-it-events-");
    let mut args = serve_args(&db);
    args.relay.broker.relay_sink = oncegate::broker::SinkSpec::parse(&redis_url()).unwrap();
    args.relay.broker.stream.relay_stream = stream.clone();
    args.relay.relay_batch = 5;
    // Far longer than the test: only the outbox notification (LISTEN/NOTIFY,
    // or the in-process wake on SQLite) can make the relay publish in time.
    args.relay.relay_poll = Duration::from_secs(60);
    let app = TestApp::spawn(args).await;
    let awards = ["AWD-R1", "AWD-R2", "AWD-R3"];
    let decided = submit_concurrently(&app, &awards, 8).await;
    assert!(decided.iter().all(|(_, d)| outcome(d) == Outcome::Claimed));
    // Duplicates write no event.
    let mut c = app.client().await;
    for (s, _) in decided.iter().take(5) {
        let d = c.submit(s.clone()).await.unwrap().into_inner();
        assert_eq!(outcome(&d), Outcome::Duplicate);
    }
    let s = stream.clone();
    let arrived = eventually(Duration::from_secs(15), || {
        let s = s.clone();
        async move { xrange(&s).await.len() >= 24 }
    })
    .await;
    assert!(
        arrived,
        "events reached the stream: {}",
        xrange(&stream).await.len()
    );
    app.shutdown().await;

    let entries = xrange(&stream).await;
    assert_eq!(entries.len(), 24, "each processed submission once, no more");
    let event_ids: HashSet<&str> = entries.iter().map(|e| e["event_id"].as_str()).collect();
    assert_eq!(event_ids.len(), 24, "no event twice");
    let by_key: HashMap<&str, (&pb::Submission, &pb::Decision)> = decided
        .iter()
        .map(|(s, d)| (d.idempotency_key.as_str(), (s, d)))
        .collect();
    let mut keys_seen = HashSet::new();
    for e in &entries {
        let data = json(e);
        assert_eq!(e["type"], "disbursement.recorded");
        assert_eq!(data["event_id"].as_str(), Some(e["event_id"].as_str()));
        assert_eq!(data["award_id"].as_str(), Some(e["award_id"].as_str()));
        assert_eq!(
            data["sequence"].as_i64().map(|s| s.to_string()),
            Some(e["sequence"].clone())
        );
        let key = data["idempotency_key"].as_str().unwrap();
        let (s, d) = by_key.get(key).expect("the event's key was processed");
        let disb = d.disbursement.as_ref().unwrap();
        assert_eq!(data["amount_cents"].as_i64(), Some(s.amount_cents));
        assert_eq!(data["sequence"].as_i64(), Some(disb.sequence));
        assert_eq!(data["disbursement_id"].as_str(), Some(disb.id.as_str()));
        assert!(data["recorded_at"].is_string());
        keys_seen.insert(key.to_string());
    }
    assert_eq!(keys_seen.len(), 24, "every processed key has its event");
    assert_award_order(&entries, &awards, 8);
    let summary = db.open().await.ledger_summary().await.unwrap();
    assert_eq!((summary.outbox_events, summary.outbox_unpublished), (24, 0));
    delete_key(&stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_share_the_slots_never_an_award_and_together_publish_all() {
    let db = TestDb::new(Kind::Postgres).await;
    let names: Vec<String> = (1..=20).map(|i| format!("AWD-T{i}")).collect();
    let awards: Vec<&str> = names.iter().map(String::as_str).collect();
    outbox_of(&db, &awards, 3).await;
    let stream = unique("og-it-two-");
    let lease = Duration::from_secs(60);
    let (store1, store2) = (db.open().await, db.open().await);
    let r1 = Relay::new(
        store1.clone(),
        redis_sink(&stream).await,
        relay_settings("relay-1", 7, lease, 5),
    );
    let r2 = Relay::new(
        store2.clone(),
        redis_sink(&stream).await,
        relay_settings("relay-2", 7, lease, 5),
    );

    // Alone, the first holds every slot; the second joins and finds none
    // free; the first then sees two relays and gives half back, which the
    // second takes.
    r1.rebalance().await.unwrap();
    assert_eq!(r1.held_slots().len(), 8);
    r2.rebalance().await.unwrap();
    assert!(
        r2.held_slots().is_empty(),
        "nothing free yet: {:?}",
        r2.held_slots()
    );
    r1.rebalance().await.unwrap();
    r2.rebalance().await.unwrap();
    let (s1, s2) = (r1.held_slots(), r2.held_slots());
    assert_eq!((s1.len(), s2.len()), (4, 4), "a fair share each: {s1:?} {s2:?}");
    assert!(
        s1.iter().all(|a| s2.iter().all(|b| a.slot != b.slot)),
        "one owner per slot"
    );

    // Both read at once: disjoint events, and disjoint awards.
    let (l1, l2) = (r1.lease().await.unwrap(), r2.lease().await.unwrap());
    assert!(!l1.is_empty() && !l2.is_empty());
    let ids1: HashSet<_> = l1.iter().map(|e| e.event_id).collect();
    assert!(l2.iter().all(|e| !ids1.contains(&e.event_id)), "reads overlap");
    let awards1: HashSet<&str> = l1.iter().map(|e| e.award_id.as_str()).collect();
    assert!(
        l2.iter().all(|e| !awards1.contains(e.award_id.as_str())),
        "an award's events stay with one relay at a time"
    );
    let (n1, n2) = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(drain(&r1), drain(&r2))
    })
    .await
    .expect("the relays drain the outbox");
    assert_eq!(n1 + n2, 60);
    assert!(n1 > 0 && n2 > 0, "both relays published: {n1} and {n2}");
    let entries = xrange(&stream).await;
    assert_eq!(entries.len(), 60, "all published, none twice");
    let ids: HashSet<&str> = entries.iter().map(|e| e["event_id"].as_str()).collect();
    assert_eq!(ids.len(), 60, "no event id twice");
    assert_award_order(&entries, &awards, 3);
    assert_eq!(
        db.scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .await,
        0
    );
    delete_key(&stream).await;
}

/// Reads and publishes with one relay, then drops it without marking (a
/// crash between publish and mark). Returns what it published.
async fn crash_after_publish(relay: Relay) -> Vec<uuid::Uuid> {
    let leased = relay.lease().await.unwrap();
    assert!(!leased.is_empty());
    let published = relay.publish_unmarked(&leased).await;
    assert_eq!(published.len(), leased.len());
    drop(relay);
    published
}

/// Steps `relay` until it has published `expected` events (the crashed
/// relay's slots were taken after its lease ran out), checking it
/// publishes nothing before `lease` has passed.
async fn step_after_lease_expiry(
    relay: &Relay,
    crashed_at: tokio::time::Instant,
    lease: Duration,
    expected: usize,
) -> usize {
    let deadline = crashed_at + lease + Duration::from_secs(10);
    let mut published = 0;
    while published < expected {
        let r = relay.step().await.unwrap();
        if r.leased > 0 {
            assert!(
                crashed_at.elapsed() >= lease,
                "published before the lease expired"
            );
            assert_eq!(r.published, r.leased);
            published += r.published;
        }
        assert!(tokio::time::Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    published
}

async fn relay_killed_before_marking_republishes_after_the_lease(kind: Kind) {
    let db = TestDb::new(kind).await;
    outbox_of(&db, &["AWD-K1", "AWD-K2"], 2).await;
    let stream = unique("og-it-kill-");
    let lease = Duration::from_millis(800);
    let first = Relay::new(
        db.open().await,
        redis_sink(&stream).await,
        relay_settings("doomed", 10, lease, 5),
    );
    let crashed_at = tokio::time::Instant::now();
    let published = crash_after_publish(first).await;
    assert_eq!(published.len(), 4);
    assert_eq!(
        db.scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .await,
        4
    );

    let restarted = Relay::new(
        db.open().await,
        redis_sink(&stream).await,
        relay_settings("restarted", 10, lease, 5),
    );
    let republished = step_after_lease_expiry(&restarted, crashed_at, lease, 4).await;
    assert_eq!(republished, 4, "every unmarked event again");
    assert_eq!(restarted.step().await.unwrap().leased, 0, "marked now");
    assert_eq!(
        db.scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .await,
        0
    );

    // At least once: Redis Streams has no dedup, so each event is there twice,
    // with the same event id for downstream dedup.
    let entries = xrange(&stream).await;
    assert_eq!(entries.len(), 8);
    let mut per_id: HashMap<&str, usize> = HashMap::new();
    for e in &entries {
        *per_id.entry(e["event_id"].as_str()).or_default() += 1;
    }
    assert_eq!(per_id.len(), 4);
    assert!(per_id.values().all(|n| *n == 2));
    let first_ids: HashSet<String> = published.iter().map(|u| u.to_string()).collect();
    assert!(per_id.keys().all(|id| first_ids.contains(*id)));
    delete_key(&stream).await;
}

/// A JetStream stream and subject of the test's own.
pub struct TestStream {
    pub name: String,
    pub subject: String,
    pub js: jetstream::Context,
}

impl TestStream {
    pub async fn new() -> Self {
        let client = async_nats::connect(nats_url()).await.expect("NATS");
        Self {
            name: unique("OG_IT_"),
            subject: format!("{}.events", unique("og.")),
            js: jetstream::new(client),
        }
    }

    pub async fn sink(&self) -> Arc<dyn Sink> {
        Arc::new(
            JetStreamSink::connected(&nats_url(), &self.name, &self.subject)
                .await
                .expect("JetStream sink"),
        )
    }

    /// Every message in the stream: (Nats-Msg-Id, payload).
    pub async fn messages(&self) -> Vec<(String, String)> {
        let mut stream = self.js.get_stream(&self.name).await.unwrap();
        let state = stream.info().await.unwrap().state.clone();
        let mut out = Vec::new();
        for seq in state.first_sequence..=state.last_sequence {
            if state.messages == 0 {
                break;
            }
            let m = stream.get_raw_message(seq).await.unwrap();
            let id = m
                .headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .map(|v| v.as_str().to_string())
                .unwrap_or_default();
            out.push((id, String::from_utf8(m.payload.to_vec()).unwrap()));
        }
        assert_eq!(out.len() as u64, state.messages);
        out
    }

    pub async fn delete(self) {
        let _ = self.js.delete_stream(&self.name).await;
    }
}

async fn jetstream_drops_the_republished_event_by_msg_id(kind: Kind) {
    let db = TestDb::new(kind).await;
    outbox_of(&db, &["AWD-J1", "AWD-J2"], 2).await;
    let js = TestStream::new().await;
    let lease = Duration::from_millis(800);
    let first = Relay::new(
        db.open().await,
        js.sink().await,
        relay_settings("doomed", 10, lease, 5),
    );
    let crashed_at = tokio::time::Instant::now();
    let published = crash_after_publish(first).await;
    assert_eq!(published.len(), 4);
    assert_eq!(js.messages().await.len(), 4);

    let restarted = Relay::new(
        db.open().await,
        js.sink().await,
        relay_settings("restarted", 10, lease, 5),
    );
    assert_eq!(
        step_after_lease_expiry(&restarted, crashed_at, lease, 4).await,
        4,
        "published again"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .await,
        0
    );

    let messages = js.messages().await;
    assert_eq!(messages.len(), 4, "the duplicate window dropped the repeats");
    let ids: HashSet<String> = messages.iter().map(|(id, _)| id.clone()).collect();
    let expected: HashSet<String> = published.iter().map(|u| u.to_string()).collect();
    assert_eq!(ids, expected, "Nats-Msg-Id is the event id");
    for (id, payload) in &messages {
        let data: serde_json::Value = serde_json::from_str(payload).unwrap();
        assert_eq!(data["event_id"].as_str(), Some(id.as_str()));
    }
    js.delete().await;
}

/// Payload length of the largest event of the awards other than `poison`.
async fn largest_payload_except(db: &TestDb, poison: &str) -> i64 {
    let len = match db.kind {
        Kind::Postgres => "CAST(max(length(payload::text)) AS BIGINT)",
        Kind::Sqlite => "max(length(payload))",
    };
    db.scalar(&format!("SELECT {len} FROM outbox WHERE award_id <> '{poison}'"))
        .await
}

async fn poison_event_is_quarantined_while_other_awards_flow(kind: Kind) {
    let db = TestDb::new(kind).await;
    // An award id at the length limit makes its events larger than the
    // stream accepts: JetStream refuses them, every time.
    let poison = "P".repeat(oncegate::submission::MAX_AWARD_ID_CHARS);
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    for (award, n) in [("AWD-A", 1), (poison.as_str(), 1), ("AWD-B", 1), ("AWD-A", 2)] {
        let d = c
            .submit(submission(award, TS, format!("{award}-{n}").as_bytes(), 500))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(outcome(&d), Outcome::Claimed);
    }
    let js = TestStream::new().await;
    let limit = largest_payload_except(&db, &poison).await + 160;
    js.js
        .create_stream(jetstream::stream::Config {
            name: js.name.clone(),
            subjects: vec![js.subject.clone()],
            max_message_size: limit as i32,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .unwrap();
    let store = db.open().await;
    let relay = Relay::new(
        store.clone(),
        js.sink().await,
        relay_settings("poison", 10, Duration::from_millis(300), 3),
    );
    let quarantined_before = quarantined_total();

    let r = relay.step().await.unwrap();
    assert_eq!((r.leased, r.published, r.failed, r.quarantined), (4, 3, 1, 0));
    assert_eq!(js.messages().await.len(), 3, "the other awards' events went out");

    // More events while the poison one keeps failing: they flow too.
    for (award, n) in [("AWD-B", 2), (poison.as_str(), 2), ("AWD-A", 3)] {
        c.submit(submission(award, TS, format!("{award}-{n}").as_bytes(), 500))
            .await
            .unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while store.outbox_stats().await.unwrap().quarantined < 2 {
        relay.step().await.unwrap();
        assert!(
            tokio::time::Instant::now() < deadline,
            "poison events never quarantined"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        relay.step().await.unwrap().leased,
        0,
        "quarantined events are left alone"
    );
    app.shutdown().await;

    let messages = js.messages().await;
    let entries: Vec<Entry> = messages
        .iter()
        .map(|(_, p)| {
            let v: serde_json::Value = serde_json::from_str(p).unwrap();
            Entry::from([
                ("award_id".into(), v["award_id"].as_str().unwrap().to_string()),
                ("sequence".into(), v["sequence"].to_string()),
            ])
        })
        .collect();
    assert_eq!(entries.len(), 5, "every event of the healthy awards");
    assert_award_order(&entries, &["AWD-A"], 3);
    assert_award_order(&entries, &["AWD-B"], 2);
    let stats = store.outbox_stats().await.unwrap();
    assert_eq!((stats.backlog, stats.quarantined), (0, 2));
    let q = format!(
        "SELECT count(*) FROM outbox WHERE award_id = '{poison}' AND quarantined_at IS NOT NULL \
         AND published_at IS NULL AND attempts = 3 AND last_error LIKE '%maximum%'"
    );
    assert_eq!(
        db.scalar(&q).await,
        2,
        "state, attempts and cause are kept on the row"
    );
    assert!(
        quarantined_total() >= quarantined_before + 2.0,
        "oncegate_outbox_quarantined_total counts them"
    );
    js.delete().await;
}

fn quarantined_total() -> f64 {
    metric(
        &oncegate::metrics::handle().render(),
        "oncegate_outbox_quarantined_total",
    )
    .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_subcommand_drains_the_outbox_and_stops_on_sigterm() {
    let db = TestDb::new(Kind::Postgres).await;
    outbox_of(&db, &["AWD-S1", "AWD-S2"], 3).await;
    let stream = unique("og-it-cmd-");
    let mport = free_port();
    let mut child = tokio::process::Command::new(oncegate_bin())
        .arg("relay")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", &db.url)
        .env("ONCEGATE_RELAY_SINK", redis_url())
        .env("ONCEGATE_RELAY_STREAM", &stream)
        .env("ONCEGATE_RELAY_POLL", "200ms")
        .env("ONCEGATE_METRICS_LISTEN", format!("127.0.0.1:{mport}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("oncegate relay");
    let s = stream.clone();
    let done = eventually(Duration::from_secs(20), || {
        let s = s.clone();
        async move { xrange(&s).await.len() >= 6 }
    })
    .await;
    assert!(done, "oncegate relay published the outbox");
    let addr = format!("127.0.0.1:{mport}").parse().unwrap();
    let published_total = async move || {
        metric(
            &scrape(addr).await,
            "oncegate_outbox_published_total{sink=\"redis\"}",
        )
    };
    let published = eventually(Duration::from_secs(15), || async move {
        published_total().await == Some(6.0)
    })
    .await;
    if !published {
        let seen = published_total().await;
        let in_stream = xrange(&stream).await.len();
        let _ = child.start_kill();
        let out = child.wait_with_output().await.expect("relay output");
        panic!(
            "its own metrics endpoint counts the published events: {seen:?}, {in_stream} in the stream; relay log:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().unwrap().to_string()])
        .status();
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("stops on SIGTERM")
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
    assert_eq!(xrange(&stream).await.len(), 6, "once each");
    assert_eq!(
        db.scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .await,
        0
    );
    delete_key(&stream).await;
}

async fn failed_publishes_are_retried_in_award_order(kind: Kind) {
    let db = TestDb::new(kind).await;
    let stream = unique("og-it-order-");
    let awards = ["AWD-O1", "AWD-O2"];
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    let mut submit = async |i: usize| {
        for award in awards {
            let s = submission(award, TS, format!("{award}-{i}").as_bytes(), 100);
            assert_eq!(
                outcome(&c.submit(s).await.unwrap().into_inner()),
                Outcome::Claimed
            );
        }
    };
    for i in 0..3 {
        submit(i).await;
    }
    // The broker refuses every write: the stream key holds a string (WRONGTYPE).
    let client = redis_client().await;
    let _: () = client
        .set(&stream, "not a stream", None, None, false)
        .await
        .unwrap();
    // A retry backoff far longer than the steps below take, so "meanwhile"
    // is really before the failed events' retry.
    let backoff = Duration::from_secs(5);
    let relay = Relay::new(
        db.open().await,
        redis_sink(&stream).await,
        RelaySettings {
            retry_backoff: backoff,
            ..relay_settings("it-order", 100, Duration::from_secs(30), 100)
        },
    );
    let failed_at = std::time::Instant::now();
    let first = relay.step().await.unwrap();
    assert_eq!(
        (first.leased, first.failed, first.published),
        (6, 2, 0),
        "each award's first event fails"
    );
    // New events arrive while the failed ones wait for their retry: none of
    // them may overtake the postponed earlier events of its award.
    for i in 3..5 {
        submit(i).await;
    }
    // Until the failed events' retry, nothing of these awards is handed out:
    // neither the postponed events nor the new ones behind them.
    let meanwhile = relay.lease().await.unwrap();
    assert!(
        failed_at.elapsed() < backoff,
        "the test outran its backoff; too slow a machine"
    );
    assert_eq!(
        meanwhile
            .iter()
            .map(|e| (&e.award_id, e.sequence))
            .collect::<Vec<_>>(),
        Vec::<(&String, i64)>::new(),
        "later events of the same award wait for the earlier ones"
    );
    // The broker recovers.
    let _: i64 = client.del(&stream).await.unwrap();
    let s = stream.clone();
    let drained = eventually(backoff + Duration::from_secs(10), || {
        let (relay, s) = (&relay, s.clone());
        async move {
            relay.step().await.unwrap();
            xrange(&s).await.len() >= 10
        }
    })
    .await;
    assert!(
        drained,
        "published after the backoff: {}",
        xrange(&stream).await.len()
    );
    let entries = xrange(&stream).await;
    assert_eq!(entries.len(), 10);
    assert_award_order(&entries, &awards, 5);
    app.shutdown().await;
    delete_key(&stream).await;
}

/// Redis (the sink) goes away for longer than `max_attempts` retries would
/// last: the relay pauses (breaker open, one log line), spends no attempts,
/// quarantines nothing, and when Redis is back publishes everything by
/// itself, in per-award order.
async fn a_broker_outage_pauses_the_relay_without_spending_attempts(kind: Kind) {
    let db = TestDb::new(kind).await;
    let stream = unique("og-it-outage-");
    let awards = ["AWD-U1", "AWD-U2"];
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    for i in 0..3 {
        for award in awards {
            let s = submission(award, TS, format!("{award}-{i}").as_bytes(), 100);
            c.submit(s).await.unwrap();
        }
    }
    let mut broker = ThrowawayRedis::start().await;
    let sink = Arc::new(
        RedisStreamSink::connected(&broker.url(), &stream, 1_000_000)
            .await
            .expect("redis sink"),
    );
    let relay = Relay::new(
        db.open().await,
        sink,
        RelaySettings {
            retry_backoff: Duration::from_millis(20),
            ..relay_settings("it-outage", 100, Duration::from_secs(5), 2)
        },
    );
    broker.stop().await;
    // Four times as many probes as max_attempts (2) would allow, each after
    // the previous postponement ran out.
    let mut probes = 0;
    let started = std::time::Instant::now();
    while probes < 8 {
        let r = relay.step().await.unwrap();
        assert_eq!(
            (r.failed, r.quarantined, r.published),
            (0, 0, 0),
            "an outage is not a rejection: {r:?}"
        );
        if r.deferred > 0 {
            assert_eq!(r.deferred, 6, "the whole batch waits");
            probes += 1;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the relay stopped probing"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(relay.is_paused(), "breaker open");
    let spent = db
        .scalar("SELECT count(*) FROM outbox WHERE attempts > 0 OR quarantined_at IS NOT NULL")
        .await;
    assert_eq!(spent, 0, "no attempts spent, nothing quarantined");
    broker.restart().await;
    let s = stream.clone();
    let url = broker.url();
    let drained = eventually(Duration::from_secs(40), || {
        let (relay, s, url) = (&relay, s.clone(), url.clone());
        async move {
            relay.step().await.unwrap();
            xrange_at(&url, &s).await.len() >= 6
        }
    })
    .await;
    assert!(
        drained,
        "published after the outage: {}",
        xrange_at(&broker.url(), &stream).await.len()
    );
    assert!(!relay.is_paused(), "breaker closed again");
    // At least once: a publish cut by the restart may have landed before
    // its answer was lost, and is published again.
    let mut seen = std::collections::HashSet::new();
    let entries: Vec<Entry> = xrange_at(&broker.url(), &stream)
        .await
        .into_iter()
        .filter(|e| seen.insert(e["event_id"].clone()))
        .collect();
    assert_eq!(entries.len(), 6, "every event");
    assert_award_order(&entries, &awards, 3);
    app.shutdown().await;
}

/// The whole stream on another Redis, oldest first.
pub async fn xrange_at(url: &str, stream: &str) -> Vec<Entry> {
    let client = Builder::from_config(Config::from_url(url).unwrap())
        .build()
        .unwrap();
    if client.init().await.is_err() {
        return Vec::new();
    }
    let entries: Vec<(String, Entry)> = client.xrange(stream, "-", "+", None).await.unwrap_or_default();
    let _ = client.quit().await;
    entries.into_iter().map(|(_, fields)| fields).collect()
}

pub fn amqp_url() -> String {
    let url = std::env::var("ONCEGATE_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/".into());
    oncegate::broker::amqp::default_vhost(&url)
}

/// Closes, from the broker's side, every AMQP connection whose client
/// named itself `name` (as an operator would with `rabbitmqctl`). Returns
/// how many it closed.
async fn close_amqp_connections(name: &str) -> usize {
    let out = tokio::process::Command::new("rabbitmqctl")
        .args(["-q", "list_connections", "pid", "client_properties"])
        .output()
        .await
        .expect("rabbitmqctl on PATH");
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut closed = 0;
    for line in listing.lines().filter(|l| l.contains(name)) {
        let pid = line.split_whitespace().next().unwrap();
        let status = tokio::process::Command::new("rabbitmqctl")
            .args(["-q", "close_connection", pid, "oncegate test: cut the relay"])
            .status()
            .await
            .unwrap();
        assert!(status.success());
        closed += 1;
    }
    closed
}

/// The AMQP sink against the real RabbitMQ: persistent messages with
/// `message_id` = event id, routed by event type, each confirmed before it
/// is marked published. The broker closes the relay's connection mid-stream
/// (once 8 of the 30 events are out): every event still arrives at least
/// once, in per-award order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_sink_survives_the_broker_closing_its_connection_mid_stream() {
    use lapin::options::*;
    use lapin::types::FieldTable;
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let awards = ["AWD-Q1", "AWD-Q2", "AWD-Q3"];
    let mut c = app.client().await;
    for i in 0..10 {
        for award in awards {
            c.submit(submission(award, TS, format!("{award}-{i}").as_bytes(), 7))
                .await
                .unwrap();
        }
    }
    let (exchange, queue, name) = (unique("og-it-x-"), unique("og-it-q-"), unique("og-it-relay-"));
    let conn = lapin::Connection::connect(&amqp_url(), lapin::ConnectionProperties::default())
        .await
        .expect("RabbitMQ at ONCEGATE_TEST_AMQP_URL");
    let ch = conn.create_channel().await.unwrap();
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.exchange_declare(
        exchange.as_str().into(),
        lapin::ExchangeKind::Topic,
        durable,
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        queue.as_str().into(),
        exchange.as_str().into(),
        "disbursement.*".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();

    let sink = Arc::new(
        oncegate::broker::amqp::AmqpSink::connected(&amqp_url(), &exchange, &name)
            .await
            .unwrap(),
    );
    let relay = Arc::new(Relay::new(
        db.open().await,
        sink,
        RelaySettings {
            retry_backoff: Duration::from_millis(20),
            ..relay_settings("it-amqp", 4, Duration::from_secs(2), 5)
        },
    ));
    // The state the cut needs: part of the stream out, the rest waiting.
    let mut published = 0;
    while published < 8 {
        published += relay.step().await.unwrap().published;
    }
    assert_eq!(
        close_amqp_connections(&name).await,
        1,
        "the relay's connection, found by its name"
    );
    let stepping = {
        let relay = relay.clone();
        tokio::spawn(async move {
            for _ in 0..2_000 {
                let r = relay.step().await.unwrap();
                assert_eq!(r.quarantined, 0, "a closed connection is not a rejection");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let all = eventually(Duration::from_secs(60), || async {
        db.scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .await
            == 0
    })
    .await;
    stepping.abort();
    assert!(all, "every event published after the cut");

    let mut first_seen: Vec<(String, i64)> = Vec::new();
    let mut ids = std::collections::HashSet::new();
    while let Some(m) = ch
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
    {
        let id = m
            .delivery
            .properties
            .message_id()
            .as_ref()
            .expect("message_id")
            .to_string();
        assert_eq!(m.delivery.properties.delivery_mode(), &Some(2), "persistent");
        let body: serde_json::Value = serde_json::from_slice(&m.delivery.data).unwrap();
        assert_eq!(
            body["event_id"].as_str(),
            Some(id.as_str()),
            "message_id is the event id"
        );
        if ids.insert(id) {
            first_seen.push((
                body["award_id"].as_str().unwrap().into(),
                body["sequence"].as_i64().unwrap(),
            ));
        }
    }
    assert_eq!(ids.len(), 30, "every event at least once");
    for award in awards {
        let seqs: Vec<i64> = first_seen
            .iter()
            .filter(|(a, _)| a == award)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(seqs, (1..=10).collect::<Vec<_>>(), "{award} in sequence order");
    }
    ch.queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    ch.exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await
        .unwrap();
    app.shutdown().await;
}
