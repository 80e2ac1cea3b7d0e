//! The Kafka room against the real broker, beyond publishing: where records
//! land (the Java client's murmur2 partitioner), the marks topic (one with a
//! deleting retention is refused, an unreadable mark is skipped and
//! counted), and reconcile reading a topic where an award's events repeat
//! or run out of sequence.

use crate::helpers::*;
use crate::kafka::{bootstrap, kafka_url, read_back};
use crate::relay::{outbox_of, relay_settings};
use oncegate::broker::kafka::{KafkaSink, marks_topic};
use oncegate::relay::Relay;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::sync::Arc;
use std::time::Duration;

fn admin() -> AdminClient<DefaultClientContext> {
    rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap()
}

/// Kafka's `Utils.murmur2`, as the Java client's default partitioner uses it.
fn java_murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let chunks = data.chunks_exact(4);
    let tail = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    if !tail.is_empty() {
        for (i, b) in tail.iter().enumerate().rev() {
            h ^= u32::from(*b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition the Java client picks for a key among `n`.
fn java_partition(key: &str, n: i32) -> i32 {
    (java_murmur2(key.as_bytes()) & 0x7fff_ffff) % n
}

#[test]
fn the_murmur2_here_is_kafkas() {
    // Kafka's own test vectors (clients' UtilsTest.testMurmur2).
    for (data, expected) in [
        (&b"21"[..], -973_932_308),
        (b"foobar", -790_332_482),
        (b"a-little-bit-long-string", -985_981_536),
        (b"a-little-bit-longer-string", -1_486_304_829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58_897_971),
        (b"abc", 479_470_107),
    ] {
        assert_eq!(java_murmur2(data), expected, "{}", String::from_utf8_lossy(data));
    }
}

/// Every event lands in the partition a Java producer (or Kafka Streams)
/// computes for its award.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_land_in_the_partition_the_java_client_picks_for_their_award() {
    let db = TestDb::new(Kind::Postgres).await;
    let names: Vec<String> = (0..16).map(|i| format!("AWD-M{i}")).collect();
    let awards: Vec<&str> = names.iter().map(String::as_str).collect();
    outbox_of(&db, &awards, 2).await;
    let topic = unique("og-it-murmur-");
    create_topic(&bootstrap(), &topic, 6, &[]).await;
    let sink = KafkaSink::connected(
        &kafka_url(),
        &topic,
        &unique("og-it-txn-"),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let relay = Relay::new(
        db.open().await,
        Arc::new(sink),
        relay_settings("it-murmur", 50, Duration::from_secs(10), 3),
    );
    assert_eq!(crate::relay::drain(&relay).await, 32);
    let entries = read_back(&kafka_url(), &topic).await;
    assert_eq!(entries.len(), 32);
    let mut partitions = std::collections::BTreeSet::new();
    for e in &entries {
        let partition: i32 = e.position.split_whitespace().nth(1).unwrap().parse().unwrap();
        let award = e.award_id.as_deref().unwrap();
        assert_eq!(partition, java_partition(award, 6), "{award} at {}", e.position);
        partitions.insert(partition);
    }
    assert!(
        partitions.len() > 2,
        "the awards spread over partitions: {partitions:?}"
    );
}

/// A marks topic someone created with a deleting retention: the relay
/// refuses it, saying why and how to fix it, publishes nothing and spends
/// no attempts; once the topic is compacted, everything goes out once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marks_topic_that_deletes_is_refused_until_it_is_compacted() {
    let db = TestDb::new(Kind::Postgres).await;
    let topic = unique("og-it-marks-");
    let marks = marks_topic(&topic);
    create_topic(&bootstrap(), &marks, 4, &[("cleanup.policy", "delete")]).await;
    let app = Sidecar::start(&[
        ("DATABASE_URL", db.url.clone()),
        ("ONCEGATE_RELAY_SINK", kafka_url()),
        ("ONCEGATE_RELAY_STREAM", topic.clone()),
        (
            "ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID_PREFIX",
            unique("og-it-txn-"),
        ),
        ("ONCEGATE_RELAY_SLOTS", "2".into()),
        ("ONCEGATE_RELAY_LEASE", "4s".into()),
    ])
    .await;
    let mut c = app.client().await;
    for i in 0..4 {
        c.submit(submission(
            "AWD-MK",
            "2026-12-05T10:00:00Z",
            format!("mk-{i}").as_bytes(),
            10,
        ))
        .await
        .unwrap();
    }
    let label =
        format!("oncegate_relay_outage{{sink=\"kafka\",cause=\"misconfigured\",resource=\"{marks}\"}}");
    let refused = eventually(Duration::from_secs(30), || async {
        metric(&app.metrics().await, &label) == Some(1.0)
    })
    .await;
    assert!(refused, "{label}:\n{}", app.log_text());
    let log = app
        .log_containing("cleanup.policy=delete", Duration::from_secs(5))
        .await;
    assert!(
        log.contains("cleanup.policy=compact"),
        "the log says what to do:\n{log}"
    );
    let untouched = "SELECT count(*) FROM outbox WHERE published_at IS NULL AND attempts = 0";
    assert_eq!(
        db.scalar(untouched).await,
        4,
        "nothing published, no attempts spent"
    );
    let compact = AlterConfig::new(ResourceSpecifier::Topic(&marks)).set("cleanup.policy", "compact");
    let altered = admin()
        .alter_configs(&[compact], &AdminOptions::new())
        .await
        .unwrap();
    assert!(altered.iter().all(Result::is_ok), "{altered:?}");
    let drained = eventually(Duration::from_secs(60), || async {
        db.scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .await
            == 0
    })
    .await;
    assert!(
        drained,
        "published once the marks topic was compacted:\n{}",
        app.log_text()
    );
    assert_eq!(read_back(&kafka_url(), &topic).await.len(), 4);
    assert!(app.terminate().await.success());
}

/// A record in a slot's mark partition that is not a relay mark (written
/// by hand, a tool, a bug): skipped, counted and logged when the slot is
/// settled — never a relay that cannot take its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_mark_is_skipped_counted_and_logged() {
    let db = TestDb::new(Kind::Postgres).await;
    let topic = unique("og-it-garbled-");
    let prefix = unique("og-it-txn-");
    let marks = marks_topic(&topic);
    create_topic(&bootstrap(), &marks, 16, &[("cleanup.policy", "compact")]).await;
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .unwrap();
    let key = format!("{prefix}0");
    let record = FutureRecord::to(&marks)
        .partition(0)
        .key(&key)
        .payload("not json {");
    producer.send(record, Duration::from_secs(10)).await.unwrap();
    let app = Sidecar::start(&[
        ("DATABASE_URL", db.url.clone()),
        ("ONCEGATE_RELAY_SINK", kafka_url()),
        ("ONCEGATE_RELAY_STREAM", topic.clone()),
        ("ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID_PREFIX", prefix.clone()),
        ("ONCEGATE_RELAY_SLOTS", "1".into()),
    ])
    .await;
    let mut c = app.client().await;
    for i in 0..3 {
        c.submit(submission(
            "AWD-G",
            "2026-12-05T10:00:00Z",
            format!("g-{i}").as_bytes(),
            10,
        ))
        .await
        .unwrap();
    }
    let published = eventually(Duration::from_secs(60), || async {
        db.scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
            .await
            == 0
    })
    .await;
    assert!(published, "{}", app.log_text());
    let counted = metric(&app.metrics().await, "oncegate_relay_unreadable_marks_total");
    assert_eq!(counted, Some(1.0), "{}", app.metrics().await);
    let log = app
        .log_containing("not a relay mark", Duration::from_secs(5))
        .await;
    assert!(log.contains("skipped"), "{log}");
    assert_eq!(read_back(&kafka_url(), &topic).await.len(), 3);
    assert!(app.terminate().await.success());
}

/// reconcile against a Kafka topic where an event repeats, and where an
/// award's events are out of sequence: both mismatches, exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_counts_a_repeated_event_and_an_award_out_of_sequence_in_kafka() {
    let db = TestDb::new(Kind::Postgres).await;
    outbox_of(&db, &["AWD-Q1", "AWD-Q2"], 3).await;
    let events = outbox_rows(&db).await;
    // In order, once: clean.
    let topic = unique("og-it-rq-");
    plant(&topic, &events).await;
    mark_all_published(&db).await;
    let (code, out) = reconcile(&db, &topic).await;
    assert_eq!(code, Some(0), "{out}");
    // The same event again.
    plant(&topic, &events[..1]).await;
    let (code, out) = reconcile(&db, &topic).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("MISMATCH repeated_event"), "{out}");
    // An award's events out of sequence in another topic.
    let swapped = unique("og-it-rq-");
    let mut out_of_order = events.clone();
    let (i, j) = (
        events.iter().position(|e| e.2 == "AWD-Q1" && e.3 == 1).unwrap(),
        events.iter().position(|e| e.2 == "AWD-Q1" && e.3 == 2).unwrap(),
    );
    out_of_order.swap(i, j);
    plant(&swapped, &out_of_order).await;
    let (code, out) = reconcile(&db, &swapped).await;
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("MISMATCH award_out_of_sequence") && out.contains("AWD-Q1"),
        "{out}"
    );
}

/// (event id, type, award, sequence, body) of every outbox row, in award
/// and sequence order.
async fn outbox_rows(db: &TestDb) -> Vec<(String, String, String, i64, String)> {
    let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    sqlx::query_as(
        "SELECT event_id::text, event_type, award_id, sequence, payload::text FROM outbox ORDER BY award_id, sequence",
    )
    .fetch_all(&mut c)
    .await
    .unwrap()
}

async fn mark_all_published(db: &TestDb) {
    db.exec(
        "WITH q AS (DELETE FROM outbox_queue) \
         UPDATE outbox SET published_at = now() - interval '1 minute'",
    )
    .await;
}

/// Produces the events into `topic` as the relay would (key, headers,
/// body), in the order given.
async fn plant(topic: &str, events: &[(String, String, String, i64, String)]) {
    use rdkafka::message::{Header, OwnedHeaders};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    for (id, kind, award, sequence, body) in events {
        let sequence = sequence.to_string();
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "event_id",
                value: Some(id),
            })
            .insert(Header {
                key: "event_type",
                value: Some(kind),
            })
            .insert(Header {
                key: "award_id",
                value: Some(award),
            })
            .insert(Header {
                key: "sequence",
                value: Some(&sequence),
            });
        let record = FutureRecord::to(topic).key(award).payload(body).headers(headers);
        producer.send(record, Duration::from_secs(10)).await.unwrap();
    }
}

async fn reconcile(db: &TestDb, topic: &str) -> (Option<i32>, String) {
    let out = tokio::process::Command::new(crate::helpers::oncegate_bin())
        .args(["reconcile", "--sink", &kafka_url(), "--stream", topic])
        .env_clear()
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
