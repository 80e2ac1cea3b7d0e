//! Apache Kafka (librdkafka through `rdkafka`): exactly once into the topic
//! for `isolation.level=read_committed` consumers, across any number of pods.
//!
//! The unit of work owns the broker identity, never the process (as Kafka
//! Connect's exactly-once source tasks and Flink's sinks derive it): slot N
//! of the outbox publishes with `transactional.id` = prefix + N. Each batch
//! of a slot is one transaction (idempotent producer, `acks=all`, the Java
//! client's partitioner) holding the slot's *mark* — the ids of every event
//! a committed transaction of the slot carried that may not be marked
//! published yet — in the slot's partition of the compacted marks topic, and
//! the events: key = award id (an award's events stay in one partition, in
//! sequence order), value = the event JSON, headers `event_id`, `event_type`,
//! `award_id`, `sequence` and, when the event has one, `traceparent`.
//!
//! Taking a slot ([`Sink::take`]) runs `init_transactions` with the slot's
//! id, which fences the producer that held it (a pod replaced, lost, or
//! scaled away) and aborts its open transaction; then settles: reads the
//! slot's latest committed mark to the true end (`kafka/marks`) and reports
//! its events, which the relay marks published without publishing them
//! again. A commit whose outcome is unknown drops the producer; the relay
//! keeps the slot and takes it again (fence, settle) before sending more.
//!
//! A missing topic (a broker that does not create topics on first use), a
//! denied ACL and a marks topic with a deleting retention are reported as
//! what they are, naming the topic, without spending attempts.
//!
//! The room: `url` (the sink URL), `wire` (records, ids, marks), `topics`
//! (the events topic's state), `marks` (the marks topic and the settle),
//! `transaction` (a slot's producer), `reader` (reconcile's streaming read).

mod marks;
mod reader;
mod topics;
mod transaction;
mod url;
mod wire;

pub use reader::KafkaLog;
pub use transaction::COMMIT_MARGIN;
pub use url::KafkaUrl;
pub use wire::{PARTITIONER, marks_topic, transactional_id};

use super::seam::{Batch, Broker, BrokerLog, BrokerSetting, PUBLISH_TIMEOUT, PublishError, Sink, SlotId};
use crate::store::OutboxEvent;
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use transaction::SlotProducer;
use uuid::Uuid;

pub const BROKER: Broker = Broker {
    name: "kafka",
    schemes: &["kafka://"],
    check_url: |url| KafkaUrl::parse(url).map(|_| ()),
    sink: |url, s| {
        Ok(Arc::new(KafkaSink::new(
            url,
            &s.stream,
            s.options.get(&TRANSACTIONAL_ID_PREFIX),
            s.lease,
        )?))
    },
    reader: Some(|url, s| {
        Box::pin(async move {
            let log = KafkaLog::connect(url, &s.stream).await?;
            Ok(Box::new(log) as Box<dyn BrokerLog>)
        })
    }),
    exactly_once: true,
    about: "one Kafka transaction per batch; kafka://host:port[,host:port][?librdkafka properties]",
    stream_is: "the topic",
    settings: &[TRANSACTIONAL_ID_PREFIX],
};

/// `ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID_PREFIX`: whose transactional ids
/// the slots publish with.
pub const TRANSACTIONAL_ID_PREFIX: BrokerSetting = BrokerSetting {
    env: "ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID_PREFIX",
    flag: "relay-kafka-transactional-id-prefix",
    aliases: &[],
    default: "oncegate-relay-",
    help: "Kafka: slot N publishes with `transactional.id` = this prefix and N. The slot owns the \
           id, not the pod: whoever takes a slot fences whoever held it. Give each deployment \
           relaying to one cluster its own prefix.",
    check: BrokerSetting::not_empty,
};

/// How long connecting (metadata, `init_transactions`, declarations) may
/// take before the broker counts as unavailable.
const CONNECT_TIMEOUT: Duration = PUBLISH_TIMEOUT;

pub struct KafkaSink {
    url: KafkaUrl,
    topic: String,
    marks_topic: String,
    prefix: String,
    transaction_timeout: Duration,
    /// The events topic was found writable; cleared by any failure, so the
    /// next step checks it again and names what is wrong.
    ready: AtomicBool,
    /// The slot count the marks topic was last found ready for.
    marks_ready_for: AtomicU32,
    /// The producers of the slots this process holds.
    slots: std::sync::Mutex<HashMap<u32, Arc<SlotProducer>>>,
}

impl KafkaSink {
    /// The sink for `url`, publishing to `topic`, slot N with transactional
    /// id `prefix` + N. A transaction is given half the relay's lease (at
    /// least 1 s) before the broker aborts it.
    pub fn new(url: &str, topic: &str, prefix: &str, lease: Duration) -> anyhow::Result<Self> {
        let url = KafkaUrl::parse(url).map_err(|e| anyhow::anyhow!(e))?;
        if prefix.is_empty() {
            anyhow::bail!("ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID_PREFIX must not be empty");
        }
        Ok(Self {
            url,
            topic: topic.to_string(),
            marks_topic: marks_topic(topic),
            prefix: prefix.to_string(),
            transaction_timeout: (lease / 2).max(Duration::from_secs(1)),
            ready: AtomicBool::new(false),
            marks_ready_for: AtomicU32::new(0),
            slots: Default::default(),
        })
    }

    /// The sink, connected now.
    pub async fn connected(url: &str, topic: &str, prefix: &str, lease: Duration) -> anyhow::Result<Self> {
        let sink = Self::new(url, topic, prefix, lease)?;
        Sink::connect(&sink).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(sink)
    }

    fn lock_slots(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<SlotProducer>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn producer(&self, slot: u32) -> Option<Arc<SlotProducer>> {
        self.lock_slots().get(&slot).cloned()
    }

    /// Makes sure the marks topic has a partition for each of `slots`.
    async fn marks_ready(&self, slots: u32) -> Result<(), PublishError> {
        if self.marks_ready_for.load(Ordering::Relaxed) >= slots {
            return Ok(());
        }
        marks::declare(&self.url, &self.marks_topic, slots, CONNECT_TIMEOUT).await?;
        self.marks_ready_for.fetch_max(slots, Ordering::Relaxed);
        Ok(())
    }

    /// Reads the slot's latest committed mark (see `kafka/marks`).
    async fn settle(&self, slot: u32, transactional_id: &str) -> Result<Vec<Uuid>, PublishError> {
        let (url, topic, id) = (
            self.url.clone(),
            self.marks_topic.clone(),
            transactional_id.to_string(),
        );
        let timeout = self.transaction_timeout + CONNECT_TIMEOUT;
        let partition = wire::mark_partition(slot);
        let settled =
            tokio::task::spawn_blocking(move || marks::settle(&url, &topic, partition, &id, timeout))
                .await
                .map_err(|e| PublishError::Unavailable(e.to_string()))?
                .map_err(|e| PublishError::Unavailable(format!("settling slot {slot}: {e}")))?;
        if settled.unreadable > 0 {
            metrics::counter!("oncegate_relay_unreadable_marks_total").increment(settled.unreadable);
        }
        Ok(settled.events)
    }
}

#[async_trait]
impl Sink for KafkaSink {
    fn name(&self) -> &'static str {
        "kafka"
    }

    async fn connect(&self) -> Result<bool, PublishError> {
        if self.ready.load(Ordering::Relaxed) {
            return Ok(false);
        }
        topics::check(&self.url, &self.topic, CONNECT_TIMEOUT).await?;
        self.ready.store(true, Ordering::Relaxed);
        Ok(true)
    }

    async fn take(&self, slot: SlotId) -> Result<Vec<Uuid>, PublishError> {
        self.release(slot).await;
        self.marks_ready(slot.count).await?;
        let id = transactional_id(&self.prefix, slot.index);
        let producer = SlotProducer::start(
            &self.url,
            &id,
            wire::mark_partition(slot.index),
            self.transaction_timeout,
            CONNECT_TIMEOUT,
        )
        .await?;
        let settled = match self.settle(slot.index, &id).await {
            Ok(settled) => settled,
            Err(e) => {
                // As in `release`: destroying the handle waits for its threads.
                let _ = tokio::task::spawn_blocking(move || drop(producer)).await;
                return Err(e);
            }
        };
        producer.carry(&settled);
        self.lock_slots().insert(slot.index, Arc::new(producer));
        Ok(settled)
    }

    async fn release(&self, slot: SlotId) {
        let dropped = self.lock_slots().remove(&slot.index);
        if let Some(producer) = dropped {
            // Destroying a librdkafka handle waits for its threads.
            let _ = tokio::task::spawn_blocking(move || drop(producer)).await;
        }
    }

    async fn publish(&self, slot: SlotId, events: &[&OutboxEvent], deadline: Instant) -> Batch {
        let Some(producer) = self.producer(slot.index) else {
            return Batch {
                stopped: Some(PublishError::Unavailable(format!(
                    "slot {} is not taken",
                    slot.index
                ))),
                unknown: true,
                ..Default::default()
            };
        };
        let batch = producer
            .publish(&self.topic, &self.marks_topic, events, deadline)
            .await;
        if batch.stopped.is_some() {
            self.ready.store(false, Ordering::Relaxed);
        }
        if batch.unknown {
            // Settled again (fence, read the mark) before anything is sent.
            self.release(slot).await;
        }
        batch
    }

    fn marked(&self, slot: SlotId, ids: &[Uuid]) {
        if let Some(producer) = self.producer(slot.index) {
            producer.marked(ids);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::transaction::producer_config;
    use super::url::KafkaUrl;
    use rdkafka::producer::FutureProducer;
    use std::time::Duration;

    /// librdkafka checks its settings when the producer is created (no
    /// broker needed): a short lease must still give a valid producer, and
    /// the partitioner is the Java client's.
    #[test]
    fn every_lease_gives_a_producer_librdkafka_accepts() {
        let url = KafkaUrl::parse("kafka://127.0.0.1:1").unwrap();
        for lease in [1, 2, 5, 30, 600] {
            let timeout = (Duration::from_secs(lease) / 2).max(Duration::from_secs(1));
            let config = producer_config(&url, "og-test-0", timeout);
            assert_eq!(config.get("partitioner"), Some("murmur2_random"));
            let created: Result<FutureProducer, _> = config.create();
            assert!(created.is_ok(), "lease {lease}s: {:?}", created.err());
        }
    }
}
