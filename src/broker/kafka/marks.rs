//! The marks topic: `<topic>.oncegate-relay-marks`, compacted, one partition
//! per slot. Each relay transaction writes the slot's mark into the slot's
//! partition; taking a slot reads the slot's latest committed mark back
//! (the settle).
//!
//! The settle reads to the true end. A read_committed reader stops at the
//! partition's last stable offset, below any transaction still open, and a
//! committed mark written after an open transaction began would be hidden
//! behind it. So the settle first reads the high watermark (read
//! uncommitted: every record written, decided or not), then waits until the
//! last stable offset has reached it — every transaction that had written
//! there is decided (taking the slot's id has just aborted its former
//! holder's; another writer's ends within its transaction timeout) — and
//! only then reads, committed records only, up to that offset.

use super::url::KafkaUrl;
use super::wire::Mark;
use crate::broker::seam::{BlockCause, Blocked, PublishError};
use rdkafka::admin::{
    AdminClient, AdminOptions, NewPartitions, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// Partitions the marks topic is created with at least: room for slot
/// counts up to it without adding partitions later.
const MIN_PARTITIONS: u32 = 16;

/// Records read back from the end of a slot's partition first: a slot's
/// partition holds its transactions' marks and their commit or abort
/// markers, so the latest committed mark is a few offsets back. A window
/// without one (many aborted transactions in a row) is widened.
const FIRST_WINDOW: i64 = 64;

/// Makes sure the marks topic exists, compacted, with a partition for each
/// of `slots` slots. A topic with a deleting retention is refused: a mark
/// deleted by retention would let a slot's next holder publish again what a
/// committed transaction already carried.
pub async fn declare(url: &KafkaUrl, topic: &str, slots: u32, timeout: Duration) -> Result<(), PublishError> {
    let admin: AdminClient<DefaultClientContext> = url
        .client_config()
        .create()
        .map_err(|e| unavailable("creating the Kafka admin client", &e))?;
    let options = AdminOptions::new()
        .operation_timeout(Some(timeout))
        .request_timeout(Some(timeout));
    let declared = async {
        let partitions = match partitions_of(url, topic, timeout).await? {
            Some(n) => n,
            None => create(&admin, topic, slots, &options, timeout).await?,
        };
        check_compacted(&admin, topic, &options, timeout).await?;
        if partitions < slots {
            grow(&admin, topic, slots, &options, timeout).await?;
        }
        Ok(())
    }
    .await;
    // Destroying a librdkafka handle waits for its threads: not on an async
    // thread, where it would stall every other task.
    let _ = tokio::task::spawn_blocking(move || drop(admin)).await;
    declared
}

fn unavailable(what: &str, e: &KafkaError) -> PublishError {
    PublishError::Unavailable(format!("{what}: {e}"))
}

/// The topic's partition count, `None` when it does not exist. (A
/// consumer's metadata request never creates the topic.)
async fn partitions_of(url: &KafkaUrl, topic: &str, timeout: Duration) -> Result<Option<u32>, PublishError> {
    let (url, name) = (url.clone(), topic.to_string());
    let found = tokio::task::spawn_blocking(move || {
        let client = reader(&url, "read_committed").map_err(PublishError::Unavailable)?;
        let metadata = client
            .fetch_metadata(Some(&name), timeout)
            .map_err(|e| unavailable(&format!("reading the metadata of {name:?}"), &e))?;
        Ok::<_, PublishError>(
            metadata
                .topics()
                .iter()
                .find(|t| t.name() == name)
                .map(|t| (t.error().map(RDKafkaErrorCode::from), t.partitions().len() as u32)),
        )
    })
    .await
    .map_err(|e| PublishError::Unavailable(e.to_string()))??;
    match found {
        None | Some((Some(RDKafkaErrorCode::UnknownTopicOrPartition), _)) => Ok(None),
        Some((None, partitions)) => Ok(Some(partitions)),
        Some((Some(RDKafkaErrorCode::TopicAuthorizationFailed), _)) => Err(denied(topic)),
        Some((Some(code), _)) => Err(PublishError::Unavailable(format!(
            "reading the metadata of {topic:?}: {code}"
        ))),
    }
}

fn denied(topic: &str) -> PublishError {
    PublishError::Blocked(Blocked {
        cause: BlockCause::NotAuthorized,
        resource: topic.to_string(),
        detail: "the broker denies the relay this topic: grant its principal DESCRIBE, READ and WRITE on it \
                 (and CREATE on the cluster or the topic, for the relay to create it)"
            .into(),
    })
}

async fn create(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    slots: u32,
    options: &AdminOptions,
    timeout: Duration,
) -> Result<u32, PublishError> {
    let partitions = slots.max(MIN_PARTITIONS);
    let marks = NewTopic::new(topic, partitions as i32, TopicReplication::Fixed(-1))
        .set("cleanup.policy", "compact")
        .set("segment.ms", "600000")
        .set("min.cleanable.dirty.ratio", "0.1");
    // Bounded here as the other admin calls are: a request the broker
    // never answers (lost while it was in flight) otherwise waits for
    // librdkafka's socket timeout, a minute, with the slot neither taken
    // nor counted as an outage.
    let created = tokio::time::timeout(timeout, admin.create_topics([&marks], options))
        .await
        .map_err(|_| PublishError::Unavailable(format!("creating Kafka topic {topic:?}: timed out")))?
        .map_err(|e| unavailable(&format!("creating Kafka topic {topic:?}"), &e))?;
    for result in created {
        match result {
            Ok(_) => {}
            // Another relay created it meanwhile: its partitions are checked next time.
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, RDKafkaErrorCode::TopicAuthorizationFailed))
            | Err((_, RDKafkaErrorCode::ClusterAuthorizationFailed)) => return Err(denied(topic)),
            Err((t, code)) => {
                return Err(PublishError::Unavailable(format!(
                    "creating Kafka topic {t:?}: {code}"
                )));
            }
        }
    }
    Ok(partitions)
}

async fn check_compacted(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    options: &AdminOptions,
    timeout: Duration,
) -> Result<(), PublishError> {
    let described = tokio::time::timeout(
        timeout,
        admin.describe_configs([&ResourceSpecifier::Topic(topic)], options),
    )
    .await
    .map_err(|_| PublishError::Unavailable(format!("describing Kafka topic {topic:?}: timed out")))?
    .map_err(|e| unavailable(&format!("describing Kafka topic {topic:?}"), &e))?;
    let policy = match described.into_iter().next() {
        Some(Ok(resource)) => resource
            .get("cleanup.policy")
            .and_then(|e| e.value.clone())
            .unwrap_or_default(),
        Some(Err(RDKafkaErrorCode::TopicAuthorizationFailed)) => return Err(denied(topic)),
        Some(Err(code)) => {
            return Err(PublishError::Unavailable(format!(
                "describing Kafka topic {topic:?}: {code}"
            )));
        }
        None => String::new(),
    };
    if policy.trim() == "compact" {
        return Ok(());
    }
    Err(PublishError::Blocked(Blocked {
        cause: BlockCause::Misconfigured,
        resource: topic.to_string(),
        detail: format!(
            "the relay's marks topic has cleanup.policy={policy}: retention would delete a slot's mark, and \
             the slot's next holder would publish again what a committed transaction carried; set \
             cleanup.policy=compact (kafka-configs --alter --entity-type topics --entity-name {topic} \
             --add-config cleanup.policy=compact)"
        ),
    }))
}

async fn grow(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    slots: u32,
    options: &AdminOptions,
    timeout: Duration,
) -> Result<(), PublishError> {
    let wanted = NewPartitions::new(topic, slots as usize);
    let grown = tokio::time::timeout(timeout, admin.create_partitions([&wanted], options))
        .await
        .map_err(|_| PublishError::Unavailable(format!("adding partitions to {topic:?}: timed out")))?
        .map_err(|e| unavailable(&format!("adding partitions to {topic:?}"), &e))?;
    for result in grown {
        match result {
            // Another relay added them meanwhile.
            Ok(_) | Err((_, RDKafkaErrorCode::InvalidPartitions)) => {}
            Err((t, code)) => {
                return Err(PublishError::Unavailable(format!(
                    "adding partitions to Kafka topic {t:?}: {code}"
                )));
            }
        }
    }
    Ok(())
}

/// What the settle found: the events of the slot's latest committed mark,
/// and how many records it skipped as unreadable.
#[derive(Debug, Default)]
pub struct Settled {
    pub events: Vec<Uuid>,
    pub unreadable: u64,
}

/// Reads the latest committed mark of `transactional_id` in `partition`
/// of `topic`, to the true end (see the module doc). Blocking: run it off
/// the async threads.
pub fn settle(
    url: &KafkaUrl,
    topic: &str,
    partition: i32,
    transactional_id: &str,
    timeout: Duration,
) -> Result<Settled, String> {
    let deadline = Instant::now() + timeout;
    let (low, end) = decided_end(url, topic, partition, deadline)?;
    let consumer = reader(url, "read_committed")?;
    let mut window = FIRST_WINDOW;
    loop {
        let from = (end - window).max(low);
        let (mark, unreadable) =
            latest_mark(&consumer, topic, partition, from, end, transactional_id, deadline)?;
        if mark.is_some() || from == low {
            return Ok(Settled {
                events: mark.map(|m| m.events).unwrap_or_default(),
                unreadable,
            });
        }
        window *= 8;
    }
}

fn reader(url: &KafkaUrl, isolation: &str) -> Result<BaseConsumer, String> {
    url.client_config()
        .set("group.id", "oncegate-relay-settle")
        .set("enable.auto.commit", "false")
        .set("isolation.level", isolation)
        .set("enable.partition.eof", "true")
        .create()
        .map_err(|e| format!("creating the Kafka consumer: {e}"))
}

/// The partition's low watermark and its high watermark once every
/// transaction that wrote below it is decided (the last stable offset has
/// reached it).
fn decided_end(url: &KafkaUrl, topic: &str, partition: i32, deadline: Instant) -> Result<(i64, i64), String> {
    let everything = reader(url, "read_uncommitted")?;
    let committed = reader(url, "read_committed")?;
    let (low, high) = watermarks(&everything, topic, partition, deadline)
        .map_err(|e| format!("reading the high watermark of {topic}/{partition}: {e}"))?;
    loop {
        let (_, stable) = watermarks(&committed, topic, partition, deadline)
            .map_err(|e| format!("reading the last stable offset of {topic}/{partition}: {e}"))?;
        if stable >= high {
            return Ok((low, high));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{topic}/{partition}: a transaction below offset {high} is still open (last stable offset {stable})"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The partition's watermarks, waiting out a partition that has no leader
/// yet (a marks topic just created, or a leader moving): that is the broker
/// settling, not an outage, until the deadline.
fn watermarks(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    deadline: Instant,
) -> Result<(i64, i64), KafkaError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match consumer.fetch_watermarks(topic, partition, left) {
            Err(e) if leaderless(&e) && Instant::now() + Duration::from_millis(100) < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            answer => return answer,
        }
    }
}

fn leaderless(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::NotLeaderForPartition | RDKafkaErrorCode::LeaderNotAvailable)
    )
}

/// The last readable mark of `key` in [`from`, `end`) (committed records
/// only), and how many records there were not marks.
fn latest_mark(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    from: i64,
    end: i64,
    key: &str,
    deadline: Instant,
) -> Result<(Option<Mark>, u64), String> {
    if from >= end {
        return Ok((None, 0));
    }
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Offset(from))
        .map_err(|e| e.to_string())?;
    consumer.assign(&assignment).map_err(|e| e.to_string())?;
    let (mut latest, mut unreadable) = (None, 0);
    loop {
        if Instant::now() > deadline {
            return Err(format!("reading {topic}/{partition} to offset {end} timed out"));
        }
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Ok(m)) => {
                if m.key() == Some(key.as_bytes()) {
                    match m.payload().and_then(Mark::decode) {
                        Some(mark) => latest = Some(mark),
                        None => {
                            unreadable += 1;
                            tracing::warn!(
                                topic,
                                partition,
                                offset = m.offset(),
                                "a record of the marks topic is not a relay mark; skipped"
                            );
                        }
                    }
                }
                if m.offset() + 1 >= end {
                    return Ok((latest, unreadable));
                }
            }
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok((latest, unreadable)),
            Some(Err(e)) => return Err(format!("reading {topic}/{partition}: {e}")),
        }
    }
}
