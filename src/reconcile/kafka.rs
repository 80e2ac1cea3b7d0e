//! The relay's Kafka topic, read back with `isolation.level=read_committed`
//! (what an exactly-once consumer sees) from every partition's first record
//! to where each partition ended when reading began.

use super::broker::{BROKER_TIMEOUT, BrokerEntry, BrokerLog, Coverage, TRIM_MARGIN};
use crate::relay::kafka::KafkaUrl;
use async_trait::async_trait;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};
use time::OffsetDateTime;

pub struct KafkaLog {
    topic: String,
    entries: VecDeque<BrokerEntry>,
    /// Set when a partition's oldest records were deleted by retention:
    /// the time of the oldest record still there.
    trimmed_since: Option<OffsetDateTime>,
}

impl KafkaLog {
    pub async fn connect(url: &str, topic: &str) -> Result<Self, String> {
        let url = KafkaUrl::parse(url)?;
        let topic = topic.to_string();
        let t = topic.clone();
        tokio::task::spawn_blocking(move || read_all(&url, &t))
            .await
            .map_err(|e| e.to_string())?
            .map(|(entries, trimmed_since)| Self {
                topic,
                entries: entries.into(),
                trimmed_since,
            })
    }
}

type Read = (Vec<BrokerEntry>, Option<OffsetDateTime>);

/// Where each non-empty partition of `topic` ends, assigned to `consumer`
/// from its beginning; and whether retention has deleted any records.
type Ends = (HashMap<i32, i64>, bool);

fn assign_partitions(consumer: &BaseConsumer, topic: &str) -> Result<Ends, String> {
    let metadata = consumer
        .fetch_metadata(Some(topic), BROKER_TIMEOUT)
        .map_err(|e| format!("reading Kafka metadata: {e}"))?;
    let Some(found) = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
    else {
        return Ok((HashMap::new(), false));
    };
    let mut assignment = TopicPartitionList::new();
    let mut ends: HashMap<i32, i64> = HashMap::new();
    let mut trimmed = false;
    for p in found.partitions() {
        let (low, high) = consumer
            .fetch_watermarks(topic, p.id(), BROKER_TIMEOUT)
            .map_err(|e| format!("reading the watermarks of {topic}/{}: {e}", p.id()))?;
        trimmed |= low > 0;
        if high > low {
            ends.insert(p.id(), high);
            assignment
                .add_partition_offset(topic, p.id(), Offset::Beginning)
                .map_err(|e| e.to_string())?;
        }
    }
    if !ends.is_empty() {
        consumer.assign(&assignment).map_err(|e| e.to_string())?;
    }
    Ok((ends, trimmed))
}

/// One record as the reconcile compares it.
fn entry_of(m: &BorrowedMessage<'_>) -> BrokerEntry {
    let header = |name: &str| {
        m.headers().and_then(|h| {
            h.iter()
                .find(|h| h.key == name)
                .and_then(|h| h.value.map(|v| String::from_utf8_lossy(v).into_owned()))
        })
    };
    BrokerEntry {
        position: format!("partition {} offset {}", m.partition(), m.offset()),
        event_id: header("event_id"),
        award_id: header("award_id"),
        sequence: header("sequence"),
        event_type: header("event_type"),
        body: m.payload().map(|p| String::from_utf8_lossy(p).into_owned()),
    }
}

fn read_all(url: &KafkaUrl, topic: &str) -> Result<Read, String> {
    let consumer: BaseConsumer = url
        .client_config()
        .set("group.id", "oncegate-reconcile")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .map_err(|e| format!("creating the Kafka consumer: {e}"))?;
    let (mut ends, trimmed) = assign_partitions(&consumer, topic)?;
    let mut entries = Vec::new();
    let mut oldest: Option<i64> = None;
    let mut last_progress = Instant::now();
    while !ends.is_empty() {
        if last_progress.elapsed() > BROKER_TIMEOUT {
            return Err(format!("reading {topic}: no progress within {BROKER_TIMEOUT:?}"));
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(m)) => {
                last_progress = Instant::now();
                if let Some(ms) = m.timestamp().to_millis() {
                    oldest = Some(oldest.map_or(ms, |o| o.min(ms)));
                }
                entries.push(entry_of(&m));
                if ends.get(&m.partition()).is_some_and(|end| m.offset() + 1 >= *end) {
                    ends.remove(&m.partition());
                }
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                last_progress = Instant::now();
                ends.remove(&p);
            }
            Some(Err(e)) => return Err(format!("reading {topic}: {e}")),
        }
    }
    let since = trimmed
        .then(|| oldest.and_then(|ms| OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000).ok()))
        .flatten()
        .map(|t| t + TRIM_MARGIN);
    Ok((entries, since))
}

#[async_trait]
impl BrokerLog for KafkaLog {
    fn describe(&self) -> String {
        format!("Kafka topic {} (read_committed)", self.topic)
    }

    async fn coverage(&mut self) -> Result<Coverage, String> {
        Ok(match self.trimmed_since {
            Some(t) => Coverage::Since(t),
            None => Coverage::Everything,
        })
    }

    async fn next_batch(&mut self, limit: usize) -> Result<Vec<BrokerEntry>, String> {
        let n = limit.min(self.entries.len());
        Ok(self.entries.drain(..n).collect())
    }

    async fn close(self: Box<Self>) {}
}
