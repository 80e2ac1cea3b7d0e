//! One slot's transactional producer (`transactional.id` = prefix + slot)
//! and its transactions: each batch is one transaction holding, first, the
//! slot's mark (every event a committed transaction of the slot carried that
//! may not be marked published yet, this batch's included) and then the
//! events. Both commit, or neither does.

use super::topics;
use super::url::KafkaUrl;
use super::wire::{self, Mark, PARTITIONER};
use crate::broker::seam::{Batch, BlockCause, Blocked, PUBLISH_TIMEOUT, PublishError};
use crate::store::OutboxEvent;
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use std::collections::HashSet;
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

/// Below this much lease left, a transaction is aborted rather than
/// committed: the commit must be decided while the slot is still this
/// process's.
pub const COMMIT_MARGIN: Duration = Duration::from_millis(500);

/// The producer configuration of a slot: idempotent, `acks=all`,
/// transactional with the slot's id, the Java client's partitioner. A
/// transaction is given `transaction_timeout` before the broker aborts it.
pub fn producer_config(
    url: &KafkaUrl,
    transactional_id: &str,
    transaction_timeout: Duration,
) -> ClientConfig {
    let mut config = url.client_config();
    let ms = |d: Duration| d.as_millis().to_string();
    config
        .set("client.id", format!("oncegate-relay {transactional_id}"))
        .set("transactional.id", transactional_id)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", PARTITIONER)
        .set("transaction.timeout.ms", ms(transaction_timeout))
        .set("message.timeout.ms", ms(transaction_timeout))
        // librdkafka refuses a socket timeout above the transaction's
        // (+100 ms): a short relay lease shortens both.
        .set("socket.timeout.ms", ms(PUBLISH_TIMEOUT.min(transaction_timeout)))
        .set("linger.ms", "1");
    config
}

/// A slot's producer, initialised: whoever held the slot's id before is fenced.
pub struct SlotProducer {
    producer: FutureProducer,
    transactional_id: String,
    mark_partition: i32,
    transaction_timeout: Duration,
    /// Events a committed transaction of the slot carried that are not
    /// marked published yet (carried in every mark until they are).
    unmarked: std::sync::Mutex<HashSet<Uuid>>,
}

/// Runs a blocking librdkafka call off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("a librdkafka call panicked")
}

fn unavailable(what: &str, e: &KafkaError) -> PublishError {
    PublishError::Unavailable(format!("{what}: {e}"))
}

impl SlotProducer {
    /// Creates the slot's producer and runs `init_transactions`: the broker
    /// fences any older producer with the id and aborts its open transaction.
    pub async fn start(
        url: &KafkaUrl,
        transactional_id: &str,
        mark_partition: i32,
        transaction_timeout: Duration,
        timeout: Duration,
    ) -> Result<Self, PublishError> {
        let producer: FutureProducer = producer_config(url, transactional_id, transaction_timeout)
            .create()
            .map_err(|e| unavailable("creating the Kafka producer", &e))?;
        let init = producer.clone();
        if let Err(e) = blocking(move || init.init_transactions(timeout)).await {
            // Destroying a librdkafka handle waits for its threads: not on
            // an async thread, where it would stall every other task.
            blocking(move || drop(producer)).await;
            return Err(match e.rdkafka_error_code() {
                Some(RDKafkaErrorCode::TransactionalIdAuthorizationFailed) => PublishError::Blocked(Blocked {
                    cause: BlockCause::NotAuthorized,
                    resource: transactional_id.to_string(),
                    detail: "the broker denies the relay this transactional id: grant its principal WRITE and \
                             DESCRIBE on transactional ids with the relay's prefix"
                        .into(),
                }),
                _ => unavailable("initialising Kafka transactions", &e),
            });
        }
        Ok(Self {
            producer,
            transactional_id: transactional_id.to_string(),
            mark_partition,
            transaction_timeout,
            unmarked: Default::default(),
        })
    }

    fn lock_unmarked(&self) -> std::sync::MutexGuard<'_, HashSet<Uuid>> {
        self.unmarked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Events known committed (settled) and not marked published yet.
    pub fn carry(&self, ids: &[Uuid]) {
        self.lock_unmarked().extend(ids.iter().copied());
    }

    /// The relay marked these published.
    pub fn marked(&self, ids: &[Uuid]) {
        let mut unmarked = self.lock_unmarked();
        for id in ids {
            unmarked.remove(id);
        }
    }

    /// Publishes `events` in one transaction with the slot's mark. The
    /// transaction is aborted instead of committed when less than
    /// [`COMMIT_MARGIN`] of the lease is left at `deadline`.
    pub async fn publish(
        &self,
        topic: &str,
        marks_topic: &str,
        events: &[&OutboxEvent],
        deadline: Instant,
    ) -> Batch {
        let producer = &self.producer;
        if let Err(e) = producer.begin_transaction() {
            return outage(unavailable("beginning a Kafka transaction", &e), true);
        }
        let mut deliveries = Vec::with_capacity(events.len() + 1);
        if let Err(failed) = self.send(topic, marks_topic, events, &mut deliveries) {
            let aborted = self.abort().await;
            return match failed {
                (Some(i), PublishError::Rejected(why)) if aborted => Batch {
                    rejected: vec![(i, why)],
                    ..Default::default()
                },
                (_, error) => outage(error, !aborted),
            };
        }
        // The transaction ends before the slot's lease can: checked before the commit.
        let left = deadline.saturating_duration_since(Instant::now());
        if left < COMMIT_MARGIN {
            let aborted = self.abort().await;
            return Batch {
                unknown: !aborted,
                ..Default::default()
            };
        }
        let committing = producer.clone();
        let timeout = left.min(self.transaction_timeout);
        match blocking(move || committing.commit_transaction(timeout)).await {
            Ok(()) => {
                let ids: Vec<Uuid> = events.iter().map(|e| e.event_id).collect();
                self.carry(&ids);
                Batch {
                    published: ids,
                    ..Default::default()
                }
            }
            Err(e) => self.commit_failed(&e, topic, deliveries).await,
        }
    }

    /// Produces the mark and the events into the open transaction; on a
    /// failure, the event it concerns (if one) and why.
    fn send(
        &self,
        topic: &str,
        marks_topic: &str,
        events: &[&OutboxEvent],
        deliveries: &mut Vec<(Option<usize>, DeliveryFuture)>,
    ) -> Result<(), (Option<usize>, PublishError)> {
        let mut ids: Vec<Uuid> = self.lock_unmarked().iter().copied().collect();
        ids.extend(events.iter().map(|e| e.event_id));
        let mark = Mark {
            transactional_id: self.transactional_id.clone(),
            events: ids,
        }
        .encode();
        let record = FutureRecord::to(marks_topic)
            .partition(self.mark_partition)
            .key(self.transactional_id.as_bytes())
            .payload(&mark);
        match self.producer.send_result(record) {
            Ok(d) => deliveries.push((None, d)),
            Err((e, _)) => return Err((None, classify(&e, marks_topic, "producing the slot's mark"))),
        }
        for (i, event) in events.iter().enumerate() {
            let record = FutureRecord::to(topic)
                .key(event.award_id.as_bytes())
                .payload(event.payload.as_bytes())
                .headers(wire::event_headers(event));
            match self.producer.send_result(record) {
                Ok(d) => deliveries.push((Some(i), d)),
                Err((e, _)) => return Err((Some(i), classify(&e, topic, "producing to Kafka"))),
            }
        }
        Ok(())
    }

    /// Aborts the open transaction; false when that failed too (the
    /// outcome is unknown, the slot is settled before anything is sent).
    async fn abort(&self) -> bool {
        let producer = self.producer.clone();
        blocking(move || producer.abort_transaction(PUBLISH_TIMEOUT))
            .await
            .is_ok()
    }

    /// After a failed commit: the record the broker refused (the
    /// transaction aborted, an attempt spent on it), a topic that is
    /// missing or denied, or an outage whose outcome may be unknown.
    async fn commit_failed(
        &self,
        e: &KafkaError,
        topic: &str,
        deliveries: Vec<(Option<usize>, DeliveryFuture)>,
    ) -> Batch {
        let refused = failed_delivery(deliveries).await;
        let aborted = matches!(e, KafkaError::Transaction(t) if t.txn_requires_abort()) && self.abort().await;
        match refused {
            Some((Some(i), err)) if aborted && record_refused(&err) => Batch {
                rejected: vec![(i, format!("Kafka refused the record: {err}"))],
                ..Default::default()
            },
            Some((_, err)) if topic_error(&err) => {
                outage(classify(&err, topic, "producing to Kafka"), !aborted)
            }
            _ => outage(unavailable("committing the Kafka transaction", e), !aborted),
        }
    }
}

fn outage(error: PublishError, unknown: bool) -> Batch {
    Batch {
        stopped: Some(error),
        unknown,
        ..Default::default()
    }
}

/// The first delivery that failed, with the event it carried (`None`: the mark).
async fn failed_delivery(
    deliveries: Vec<(Option<usize>, DeliveryFuture)>,
) -> Option<(Option<usize>, KafkaError)> {
    for (i, delivery) in deliveries {
        if let Ok(Ok(Err((err, _)))) = tokio::time::timeout(Duration::from_millis(100), delivery).await {
            return Some((i, err));
        }
    }
    None
}

/// Errors that are about the record itself (the broker would refuse it
/// however often it is sent), not about reaching the broker.
pub fn record_refused(e: &KafkaError) -> bool {
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

fn topic_error(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(C::UnknownTopicOrPartition | C::UnknownTopic | C::TopicAuthorizationFailed)
    )
}

/// What a produce error means for `topic`.
fn classify(e: &KafkaError, topic: &str, what: &str) -> PublishError {
    use RDKafkaErrorCode as C;
    match e.rdkafka_error_code() {
        _ if record_refused(e) => PublishError::Rejected(format!("Kafka refused the record: {e}")),
        Some(C::UnknownTopicOrPartition | C::UnknownTopic) => topics::missing(topic),
        Some(C::TopicAuthorizationFailed) => topics::denied(topic),
        _ => unavailable(what, e),
    }
}
