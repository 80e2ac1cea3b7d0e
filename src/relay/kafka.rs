//! Apache Kafka sink (librdkafka through `rdkafka`): exactly once into the
//! topic for `isolation.level=read_committed` consumers.
//!
//! Each relay batch is one Kafka transaction (`transactional.id` per
//! instance, idempotent producer, `acks=all`): the batch's events — key =
//! award id, so one award's events stay in one partition in sequence order;
//! value = the event JSON; headers `event_id`, `event_type`, `award_id`,
//! `sequence` and, when the event has one, `traceparent` — and, first, a *mark* record in the compacted one-partition
//! topic `<topic>.oncegate-relay-marks` (key = the transactional id, value =
//! the ids of every event a committed transaction carried that the relay may
//! not have marked published yet). Both commit, or neither does.
//!
//! On every (re)connect, after `init_transactions` has fenced any older
//! producer with the same transactional id (a zombie relay) and aborted its
//! open transaction, the sink reads the mark topic (read_committed) up to its
//! end and reports the ids in each transactional id's latest mark as
//! settled: the relay marks them published without publishing them again.
//! So a relay SIGKILLed between the commit and marking its rows publishes
//! nothing twice when it comes back.
//!
//! What a `read_uncommitted` consumer sees: every record of every
//! transaction, aborted ones included — an aborted batch is published again
//! in a later transaction, so such a consumer can read an event more than
//! once (always with the same `event_id` header, which it must dedupe on).
//! A replica taking over the expired lease of a relay that died after its
//! commit and did not come back within the lease publishes those events
//! again unless it has reconnected since (the same `event_id`, too).

use super::{PUBLISH_TIMEOUT, PublishError, Sink, TransactionFailure};
use crate::store::OutboxEvent;
use async_trait::async_trait;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use uuid::Uuid;

/// How long connecting (metadata, `init_transactions`, reading the marks)
/// may take before the broker counts as unavailable.
const CONNECT_TIMEOUT: Duration = PUBLISH_TIMEOUT;

/// Settings the sink sets itself; a URL may not override them.
const OWN_PROPERTIES: &[&str] = &[
    "bootstrap.servers",
    "transactional.id",
    "enable.idempotence",
    "acks",
    "transaction.timeout.ms",
    "isolation.level",
    "group.id",
    "enable.auto.commit",
];

/// A parsed `kafka://host:port[,host:port…][?property=value&…]` URL: the
/// bootstrap list, and librdkafka properties for the connection itself
/// (`security.protocol`, `sasl.mechanism`, `sasl.username`,
/// `sasl.password`, `ssl.ca.location`…), percent-decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaUrl {
    pub bootstrap: String,
    pub properties: Vec<(String, String)>,
}

impl KafkaUrl {
    pub fn parse(url: &str) -> Result<Self, String> {
        let masked = crate::secret::mask_url(url);
        let rest = url
            .strip_prefix("kafka://")
            .ok_or_else(|| format!("a Kafka sink URL starts with kafka://, got {masked:?}"))?;
        let (servers, query) = rest.split_once('?').unwrap_or((rest, ""));
        let servers = servers.strip_suffix('/').unwrap_or(servers);
        let mut bootstrap = Vec::new();
        for server in servers.split(',') {
            let bad = || format!("ONCEGATE_RELAY_SINK: {server:?} in {masked:?} is not host:port");
            let (host, port) = server.rsplit_once(':').ok_or_else(bad)?;
            if host.is_empty() || host.contains(['/', '@', ' ']) || port.parse::<u16>().is_err() {
                return Err(bad());
            }
            bootstrap.push(server);
        }
        let mut properties = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').ok_or_else(|| {
                format!(
                    "ONCEGATE_RELAY_SINK: {:?} in the query of {masked:?} is not property=value",
                    pair.split('=').next().unwrap_or("")
                )
            })?;
            let well_formed = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'_');
            if !well_formed {
                return Err(format!(
                    "ONCEGATE_RELAY_SINK: {name:?} in {masked:?} is not a librdkafka property name"
                ));
            }
            if OWN_PROPERTIES.contains(&name) {
                return Err(format!(
                    "ONCEGATE_RELAY_SINK: {name} is set by the relay and cannot be given in the URL"
                ));
            }
            let value = percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .map_err(|_| format!("ONCEGATE_RELAY_SINK: the value of {name} is not UTF-8"))?;
            properties.push((name.to_string(), value.into_owned()));
        }
        Ok(Self {
            bootstrap: bootstrap.join(","),
            properties,
        })
    }

    /// A client configuration reaching these brokers with these properties.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.bootstrap)
            .set("log_level", "3");
        for (name, value) in &self.properties {
            config.set(name, value);
        }
        config
    }
}

/// The topic holding each relay's high-water mark.
pub fn marks_topic(topic: &str) -> String {
    format!("{topic}.oncegate-relay-marks")
}

pub struct KafkaSink {
    url: KafkaUrl,
    topic: String,
    marks_topic: String,
    transactional_id: String,
    transaction_timeout: Duration,
    /// The initialised transactional producer; `None` until connected, and
    /// again after a failure whose outcome is unknown (the next connect
    /// fences it and settles).
    producer: tokio::sync::Mutex<Option<FutureProducer>>,
    /// Events a committed transaction carried, not yet marked published.
    unmarked: std::sync::Mutex<HashSet<Uuid>>,
}

impl KafkaSink {
    /// The sink for `url` (`kafka://host:port[,…]`), publishing to `topic`.
    /// A transaction is given half the relay's lease (at least 1 s) before the
    /// broker aborts it, so no transaction outlives the lease of its events.
    pub fn new(url: &str, topic: &str, transactional_id: &str, lease: Duration) -> anyhow::Result<Self> {
        let url = KafkaUrl::parse(url).map_err(|e| anyhow::anyhow!(e))?;
        if transactional_id.is_empty() {
            anyhow::bail!("ONCEGATE_RELAY_KAFKA_TRANSACTIONAL_ID must not be empty");
        }
        Ok(Self {
            url,
            topic: topic.to_string(),
            marks_topic: marks_topic(topic),
            transactional_id: transactional_id.to_string(),
            transaction_timeout: (lease / 2).max(Duration::from_secs(1)),
            producer: tokio::sync::Mutex::new(None),
            unmarked: Default::default(),
        })
    }

    /// The sink, connected now.
    pub async fn connected(
        url: &str,
        topic: &str,
        transactional_id: &str,
        lease: Duration,
    ) -> anyhow::Result<Self> {
        let sink = Self::new(url, topic, transactional_id, lease)?;
        Sink::connect(&sink).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(sink)
    }

    fn lock_unmarked(&self) -> std::sync::MutexGuard<'_, HashSet<Uuid>> {
        self.unmarked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The mark record's value: every event a committed transaction carried
    /// that is not marked published yet, and this batch's.
    fn mark(&self, events: &[&OutboxEvent]) -> Vec<u8> {
        let mut ids: Vec<Uuid> = self.lock_unmarked().iter().copied().collect();
        ids.extend(events.iter().map(|e| e.event_id));
        serde_json::to_vec(&Mark {
            transactional_id: self.transactional_id.clone(),
            events: ids,
        })
        .expect("a mark serialises")
    }

    fn producer_config(&self) -> ClientConfig {
        let mut config = self.url.client_config();
        config
            .set("client.id", format!("oncegate-relay {}", self.transactional_id))
            .set("transactional.id", &self.transactional_id)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set(
                "transaction.timeout.ms",
                self.transaction_timeout.as_millis().to_string(),
            )
            .set(
                "message.timeout.ms",
                self.transaction_timeout.as_millis().to_string(),
            )
            // librdkafka refuses a socket timeout above the transaction's
            // (+100 ms): a short relay lease shortens both.
            .set(
                "socket.timeout.ms",
                PUBLISH_TIMEOUT
                    .min(self.transaction_timeout)
                    .as_millis()
                    .to_string(),
            )
            .set("linger.ms", "1");
        config
    }

    /// Creates the marks topic (compacted, one partition, the broker's
    /// replication factor) if missing. The events topic is the operator's
    /// (partitions, retention), or the broker creates it with its defaults.
    async fn declare(&self) -> Result<(), PublishError> {
        let admin: AdminClient<DefaultClientContext> = self
            .url
            .client_config()
            .create()
            .map_err(|e| unavailable("creating the Kafka admin client", &e))?;
        let marks = NewTopic::new(&self.marks_topic, 1, TopicReplication::Fixed(-1))
            .set("cleanup.policy", "compact")
            .set("segment.ms", "600000")
            .set("min.cleanable.dirty.ratio", "0.1");
        let options = AdminOptions::new().operation_timeout(Some(CONNECT_TIMEOUT));
        let created = tokio::time::timeout(CONNECT_TIMEOUT, admin.create_topics([&marks], &options))
            .await
            .map_err(|_| PublishError::Unavailable("creating the Kafka topics: timed out".into()))?
            .map_err(|e| unavailable("creating the Kafka topics", &e))?;
        for result in created {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => {
                    return Err(PublishError::Unavailable(format!(
                        "creating Kafka topic {topic:?}: {code}"
                    )));
                }
            }
        }
        Ok(())
    }
}

fn unavailable(what: &str, e: &KafkaError) -> PublishError {
    PublishError::Unavailable(format!("{what}: {e}"))
}

/// Errors that are about the record itself (the broker would refuse it
/// however often it is sent), not about reaching the broker.
fn record_refused(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::MessageSizeTooLarge
                | C::InvalidMessageSize
                | C::InvalidMessage
                | C::InvalidRecord
                | C::InvalidTimestamp
        )
    )
}

/// The value of a mark record.
#[derive(serde::Serialize, serde::Deserialize)]
struct Mark {
    transactional_id: String,
    events: Vec<Uuid>,
}

/// Reads the marks topic to its end (read_committed); the ids in the latest
/// mark of every transactional id.
fn read_marks(url: &KafkaUrl, topic: &str) -> Result<HashSet<Uuid>, String> {
    let consumer: BaseConsumer = url
        .client_config()
        .set("group.id", "oncegate-relay-settle")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .map_err(|e| format!("creating the Kafka consumer: {e}"))?;
    let (low, high) = consumer
        .fetch_watermarks(topic, 0, CONNECT_TIMEOUT)
        .map_err(|e| format!("reading the watermarks of {topic:?}: {e}"))?;
    let mut latest: HashMap<Vec<u8>, Vec<Uuid>> = HashMap::new();
    if high > low {
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(topic, 0, Offset::Beginning)
            .map_err(|e| e.to_string())?;
        consumer.assign(&assignment).map_err(|e| e.to_string())?;
        let deadline = std::time::Instant::now() + CONNECT_TIMEOUT;
        loop {
            if std::time::Instant::now() > deadline {
                return Err(format!("reading {topic:?} to its end timed out"));
            }
            match consumer.poll(Duration::from_millis(200)) {
                None => {}
                Some(Ok(m)) => {
                    let mark: Mark = m
                        .payload()
                        .and_then(|p| serde_json::from_slice(p).ok())
                        .ok_or_else(|| format!("{topic:?} offset {} is not a relay mark", m.offset()))?;
                    latest.insert(m.key().unwrap_or_default().to_vec(), mark.events);
                    if m.offset() + 1 >= high {
                        break;
                    }
                }
                Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => return Err(format!("reading {topic:?}: {e}")),
            }
        }
    }
    Ok(latest.into_values().flatten().collect())
}

/// Runs a blocking librdkafka call off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("a librdkafka call panicked")
}

/// Aborts the open transaction; a producer that cannot abort is dropped, so
/// the next connect fences it and settles.
async fn abort_or_forget(slot: &mut Option<FutureProducer>, producer: FutureProducer) {
    if blocking(move || producer.abort_transaction(PUBLISH_TIMEOUT))
        .await
        .is_err()
    {
        *slot = None;
    }
}

/// The headers every event record carries.
fn event_headers(event: &OutboxEvent) -> OwnedHeaders {
    let (id, sequence) = (event.event_id.to_string(), event.sequence.to_string());
    let headers = OwnedHeaders::new()
        .insert(Header {
            key: "event_id",
            value: Some(&id),
        })
        .insert(Header {
            key: "event_type",
            value: Some(&event.event_type),
        })
        .insert(Header {
            key: "award_id",
            value: Some(&event.award_id),
        })
        .insert(Header {
            key: "sequence",
            value: Some(&sequence),
        });
    match &event.traceparent {
        Some(traceparent) => headers.insert(Header {
            key: "traceparent",
            value: Some(traceparent),
        }),
        None => headers,
    }
}

fn rejected(index: usize, e: &KafkaError) -> TransactionFailure {
    TransactionFailure {
        index: Some(index),
        error: PublishError::Rejected(format!("Kafka refused the record: {e}")),
    }
}

/// After a failed commit: which event record the broker refused, if one did.
async fn refused_record(deliveries: Vec<(Option<usize>, DeliveryFuture)>) -> Option<(usize, KafkaError)> {
    for (i, delivery) in deliveries {
        if let Ok(Ok(Err((err, _)))) = tokio::time::timeout(Duration::from_millis(100), delivery).await
            && let Some(i) = i
            && record_refused(&err)
        {
            return Some((i, err));
        }
    }
    None
}

/// After a failed commit: the record the broker refused, or the outage.
async fn commit_failed(
    slot: &mut Option<FutureProducer>,
    producer: FutureProducer,
    e: &KafkaError,
    deliveries: Vec<(Option<usize>, DeliveryFuture)>,
) -> TransactionFailure {
    let refused = refused_record(deliveries).await;
    // The outcome may be unknown (a timeout): start afresh, so the next
    // connect fences this producer and settles.
    if matches!(e, KafkaError::Transaction(t) if t.txn_requires_abort()) {
        abort_or_forget(slot, producer).await;
    } else {
        *slot = None;
    }
    match refused {
        Some((i, err)) => rejected(i, &err),
        None => TransactionFailure {
            index: None,
            error: unavailable("committing the Kafka transaction", e),
        },
    }
}

#[async_trait]
impl Sink for KafkaSink {
    fn name(&self) -> &'static str {
        "kafka"
    }

    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        self.publish_transaction(&[event]).await.map_err(|f| f.error)
    }

    fn transactional(&self) -> bool {
        true
    }

    async fn connect(&self) -> Result<bool, PublishError> {
        let mut producer = self.producer.lock().await;
        if producer.is_some() {
            return Ok(false);
        }
        self.declare().await?;
        let created: FutureProducer = self
            .producer_config()
            .create()
            .map_err(|e| unavailable("creating the Kafka producer", &e))?;
        let init = created.clone();
        blocking(move || init.init_transactions(CONNECT_TIMEOUT))
            .await
            .map_err(|e| unavailable("initialising Kafka transactions", &e))?;
        let (url, topic) = (self.url.clone(), self.marks_topic.clone());
        let settled = blocking(move || read_marks(&url, &topic))
            .await
            .map_err(|e| PublishError::Unavailable(format!("settling: {e}")))?;
        self.lock_unmarked().extend(settled);
        *producer = Some(created);
        Ok(true)
    }

    async fn publish_transaction(&self, events: &[&OutboxEvent]) -> Result<(), TransactionFailure> {
        let outage = |error: PublishError| TransactionFailure { index: None, error };
        let mut slot = self.producer.lock().await;
        let Some(producer) = slot.clone() else {
            return Err(outage(PublishError::Unavailable("not connected to Kafka".into())));
        };
        if let Err(e) = producer.begin_transaction() {
            *slot = None;
            return Err(outage(unavailable("beginning a Kafka transaction", &e)));
        }
        let mark = self.mark(events);
        let mut deliveries = Vec::with_capacity(events.len() + 1);
        let record = FutureRecord::to(&self.marks_topic)
            .key(self.transactional_id.as_bytes())
            .payload(&mark);
        match producer.send_result(record) {
            Ok(d) => deliveries.push((None, d)),
            Err((e, _)) => {
                abort_or_forget(&mut slot, producer).await;
                return Err(outage(unavailable("producing the relay mark", &e)));
            }
        }
        for (i, event) in events.iter().enumerate() {
            let record = FutureRecord::to(&self.topic)
                .key(event.award_id.as_bytes())
                .payload(event.payload.as_bytes())
                .headers(event_headers(event));
            match producer.send_result(record) {
                Ok(d) => deliveries.push((Some(i), d)),
                Err((e, _)) => {
                    abort_or_forget(&mut slot, producer).await;
                    if record_refused(&e) {
                        return Err(rejected(i, &e));
                    }
                    return Err(outage(unavailable("producing to Kafka", &e)));
                }
            }
        }
        let committing = producer.clone();
        let timeout = self.transaction_timeout;
        match blocking(move || committing.commit_transaction(timeout)).await {
            Ok(()) => {
                self.lock_unmarked().extend(events.iter().map(|e| e.event_id));
                Ok(())
            }
            Err(e) => Err(commit_failed(&mut slot, producer, &e, deliveries).await),
        }
    }

    fn settled(&self) -> Vec<Uuid> {
        self.lock_unmarked().iter().copied().collect()
    }

    fn marked(&self, ids: &[Uuid]) {
        let mut unmarked = self.lock_unmarked();
        for id in ids {
            unmarked.remove(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{KafkaSink, KafkaUrl};
    use rdkafka::producer::FutureProducer;
    use std::time::Duration;

    /// librdkafka checks its settings when the producer is created (no
    /// broker needed): a short lease must still give a valid producer.
    #[test]
    fn every_lease_gives_a_producer_librdkafka_accepts() {
        for lease in [1, 2, 5, 30, 600] {
            let sink =
                KafkaSink::new("kafka://127.0.0.1:1", "t", "og-test", Duration::from_secs(lease)).unwrap();
            let created: Result<FutureProducer, _> = sink.producer_config().create();
            assert!(created.is_ok(), "lease {lease}s: {:?}", created.err());
        }
    }

    #[test]
    fn kafka_urls_name_host_port_lists() {
        let bootstrap = |url: &str| KafkaUrl::parse(url).map(|u| u.bootstrap);
        assert_eq!(bootstrap("kafka://127.0.0.1:9092").unwrap(), "127.0.0.1:9092");
        assert_eq!(bootstrap("kafka://a:1,b:2/").unwrap(), "a:1,b:2");
        for bad in [
            "kafka://",
            "kafka://broker",
            "kafka://a:1,b",
            "kafka://a:x",
            "kafka://a:1/topic",
            "kafka://:9092",
        ] {
            let err = bootstrap(bad).unwrap_err();
            assert!(err.contains("host:port"), "{bad}: {err}");
        }
    }

    #[test]
    fn kafka_url_queries_are_librdkafka_properties() {
        let url = KafkaUrl::parse(
            "kafka://b1:9093,b2:9093?security.protocol=SASL_SSL&sasl.mechanism=SCRAM-SHA-512\
             &sasl.username=relay&sasl.password=p%40ss%26word",
        )
        .unwrap();
        assert_eq!(url.bootstrap, "b1:9093,b2:9093");
        assert_eq!(
            url.properties,
            [
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("sasl.username", "relay"),
                ("sasl.password", "p@ss&word"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        for (bad, says) in [
            ("kafka://b:1?acks=1", "set by the relay"),
            ("kafka://b:1?transactional.id=x", "set by the relay"),
            ("kafka://b:1?Sasl.Mechanism=PLAIN", "not a librdkafka property"),
            ("kafka://b:1?sasl.password", "not property=value"),
        ] {
            let err = KafkaUrl::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
        let err = KafkaUrl::parse("kafka://b?sasl.password=hunter2").unwrap_err();
        assert!(!err.contains("hunter2"), "the password is masked: {err}");
    }
}
