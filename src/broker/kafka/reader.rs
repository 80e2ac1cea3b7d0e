//! The relay's topic read back with `isolation.level=read_committed` (what
//! an exactly-once consumer sees), from every partition's first record to
//! where each partition ended when reading began, one page at a time: the
//! reader holds a page, never the topic.

use super::url::KafkaUrl;
use super::wire::header;
use crate::broker::seam::{BROKER_TIMEOUT, BrokerEntry, BrokerLog, Coverage, TRIM_MARGIN};
use async_trait::async_trait;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use time::OffsetDateTime;

pub struct KafkaLog {
    topic: String,
    consumer: Arc<BaseConsumer>,
    /// The partitions not read to their end yet, and where each ended.
    ends: HashMap<i32, i64>,
    /// Set when retention deleted a partition's oldest records: the time of
    /// the oldest record still there.
    trimmed_since: Option<OffsetDateTime>,
}

/// Where each non-empty partition ends, and its low watermark.
type Bounds = HashMap<i32, (i64, i64)>;

impl KafkaLog {
    pub async fn connect(url: &str, topic: &str) -> Result<Self, String> {
        let url = KafkaUrl::parse(url)?;
        let name = topic.to_string();
        let (consumer, ends, trimmed_since) = tokio::task::spawn_blocking(move || {
            let consumer = consumer(&url)?;
            let bounds = bounds(&consumer, &name)?;
            let trimmed_since = oldest_kept(&consumer, &name, &bounds)?;
            assign_from_start(&consumer, &name, &bounds)?;
            let ends = bounds.into_iter().map(|(p, (_, high))| (p, high)).collect();
            Ok::<_, String>((consumer, ends, trimmed_since))
        })
        .await
        .map_err(|e| e.to_string())??;
        Ok(Self {
            topic: topic.to_string(),
            consumer: Arc::new(consumer),
            ends,
            trimmed_since,
        })
    }
}

fn consumer(url: &KafkaUrl) -> Result<BaseConsumer, String> {
    url.client_config()
        .set("group.id", "oncegate-reconcile")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .map_err(|e| format!("creating the Kafka consumer: {e}"))
}

/// The low and high watermark of every non-empty partition of `topic`
/// (none when the topic does not exist: nothing was ever published).
fn bounds(consumer: &BaseConsumer, topic: &str) -> Result<Bounds, String> {
    let metadata = consumer
        .fetch_metadata(Some(topic), BROKER_TIMEOUT)
        .map_err(|e| format!("reading Kafka metadata: {e}"))?;
    let Some(found) = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
    else {
        return Ok(HashMap::new());
    };
    let mut bounds = HashMap::new();
    for p in found.partitions() {
        let (low, high) = consumer
            .fetch_watermarks(topic, p.id(), BROKER_TIMEOUT)
            .map_err(|e| format!("reading the watermarks of {topic}/{}: {e}", p.id()))?;
        if high > low {
            bounds.insert(p.id(), (low, high));
        }
    }
    Ok(bounds)
}

fn assign(consumer: &BaseConsumer, topic: &str, offsets: &[(i32, Offset)]) -> Result<(), String> {
    let mut assignment = TopicPartitionList::new();
    for (partition, offset) in offsets {
        assignment
            .add_partition_offset(topic, *partition, *offset)
            .map_err(|e| e.to_string())?;
    }
    consumer.assign(&assignment).map_err(|e| e.to_string())
}

fn assign_from_start(consumer: &BaseConsumer, topic: &str, bounds: &Bounds) -> Result<(), String> {
    let offsets: Vec<(i32, Offset)> = bounds.keys().map(|p| (*p, Offset::Beginning)).collect();
    assign(consumer, topic, &offsets)
}

/// The time of the oldest record left in the partitions retention has
/// trimmed (a low watermark above 0), plus the margin; `None` when nothing
/// was trimmed.
fn oldest_kept(
    consumer: &BaseConsumer,
    topic: &str,
    bounds: &Bounds,
) -> Result<Option<OffsetDateTime>, String> {
    let trimmed: Vec<(i32, Offset)> = bounds
        .iter()
        .filter(|(_, (low, _))| *low > 0)
        .map(|(p, _)| (*p, Offset::Beginning))
        .collect();
    if trimmed.is_empty() {
        return Ok(None);
    }
    assign(consumer, topic, &trimmed)?;
    let (mut left, mut oldest): (usize, Option<i64>) = (trimmed.len(), None);
    let deadline = Instant::now() + BROKER_TIMEOUT;
    while left > 0 && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                if let Some(ms) = m.timestamp().to_millis() {
                    oldest = Some(oldest.map_or(ms, |o| o.min(ms)));
                }
                left -= 1;
            }
            Some(Err(KafkaError::PartitionEOF(_))) => left -= 1,
            Some(Err(e)) => return Err(format!("reading {topic}: {e}")),
            None => {}
        }
    }
    Ok(oldest
        .and_then(|ms| OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000).ok())
        .map(|t| t + TRIM_MARGIN))
}

/// One record as the reconcile compares it.
fn entry_of(m: &BorrowedMessage<'_>) -> crate::broker::seam::BrokerEntry {
    let get = |name: &str| {
        m.headers().and_then(|h| {
            h.iter()
                .find(|h| h.key == name)
                .and_then(|h| h.value.map(|v| String::from_utf8_lossy(v).into_owned()))
        })
    };
    BrokerEntry {
        position: format!("partition {} offset {}", m.partition(), m.offset()),
        event_id: get(header::EVENT_ID),
        award_id: get(header::AWARD_ID),
        sequence: get(header::SEQUENCE),
        event_type: get(header::EVENT_TYPE),
        body: m.payload().map(|p| String::from_utf8_lossy(p).into_owned()),
    }
}

/// Up to `limit` records, until every partition reached its end.
fn page(
    consumer: &BaseConsumer,
    topic: &str,
    ends: &mut HashMap<i32, i64>,
    limit: usize,
) -> Result<Vec<BrokerEntry>, String> {
    let mut entries = Vec::new();
    let mut last_progress = Instant::now();
    while !ends.is_empty() && entries.len() < limit {
        if last_progress.elapsed() > BROKER_TIMEOUT {
            return Err(format!("reading {topic}: no progress within {BROKER_TIMEOUT:?}"));
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Ok(m)) => {
                last_progress = Instant::now();
                if ends.get(&m.partition()).is_some_and(|end| m.offset() + 1 >= *end) {
                    ends.remove(&m.partition());
                }
                entries.push(entry_of(&m));
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                last_progress = Instant::now();
                ends.remove(&p);
            }
            Some(Err(e)) => return Err(format!("reading {topic}: {e}")),
        }
    }
    Ok(entries)
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
        if self.ends.is_empty() {
            return Ok(Vec::new());
        }
        let (consumer, topic) = (self.consumer.clone(), self.topic.clone());
        let mut ends = std::mem::take(&mut self.ends);
        let (entries, ends) = tokio::task::spawn_blocking(move || {
            let entries = page(&consumer, &topic, &mut ends, limit);
            (entries, ends)
        })
        .await
        .map_err(|e| e.to_string())?;
        self.ends = ends;
        entries
    }

    async fn close(self: Box<Self>) {
        let consumer = self.consumer;
        let _ = tokio::task::spawn_blocking(move || drop(consumer)).await;
    }
}
