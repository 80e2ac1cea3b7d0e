//! The events topic: there, and writable by the relay, or named as what is
//! wrong with it — never a generic "unreachable".

use super::url::KafkaUrl;
use crate::broker::seam::{BlockCause, Blocked, PublishError};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::producer::{BaseProducer, Producer};
use std::time::{Duration, Instant};

/// The topic does not exist, and the broker does not create it.
pub fn missing(topic: &str) -> PublishError {
    PublishError::Blocked(Blocked {
        cause: BlockCause::TopicMissing,
        resource: topic.to_string(),
        detail: format!(
            "the broker does not create topics on first use (auto.create.topics.enable=false): create it \
             (kafka-topics --create --topic {topic} --partitions N --replication-factor R); events wait, \
             no attempts are spent"
        ),
    })
}

/// The broker denies the relay the topic.
pub fn denied(topic: &str) -> PublishError {
    PublishError::Blocked(Blocked {
        cause: BlockCause::NotAuthorized,
        resource: topic.to_string(),
        detail:
            "the broker denies the relay this topic: grant its principal DESCRIBE and WRITE on it; events \
                 wait, no attempts are spent"
                .into(),
    })
}

/// Whether `topic` can be written. The metadata request comes from a
/// producer, so a broker that creates topics on first use creates it here
/// (its leader may take a moment: asked again for up to `timeout`).
pub async fn check(url: &KafkaUrl, topic: &str, timeout: Duration) -> Result<(), PublishError> {
    let (url, topic) = (url.clone(), topic.to_string());
    tokio::task::spawn_blocking(move || check_blocking(&url, &topic, timeout))
        .await
        .map_err(|e| PublishError::Unavailable(e.to_string()))?
}

fn check_blocking(url: &KafkaUrl, topic: &str, timeout: Duration) -> Result<(), PublishError> {
    let client: BaseProducer = url
        .client_config()
        .set("allow.auto.create.topics", "true")
        .create()
        .map_err(|e| PublishError::Unavailable(format!("creating the Kafka client: {e}")))?;
    let deadline = Instant::now() + timeout;
    let mut unknown = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let metadata = client
            .client()
            .fetch_metadata(Some(topic), left.max(Duration::from_millis(100)))
            .map_err(|e| {
                PublishError::Unavailable(format!("reading the metadata of topic {topic:?}: {e}"))
            })?;
        let found = metadata.topics().iter().find(|t| t.name() == topic);
        let error = found.and_then(|t| t.error()).map(RDKafkaErrorCode::from);
        let settled = match error {
            None if found.is_some_and(|t| !t.partitions().is_empty()) => return Ok(()),
            Some(RDKafkaErrorCode::TopicAuthorizationFailed) => return Err(denied(topic)),
            // Asked twice more: a topic just created may not be known to every broker yet.
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) if unknown >= 2 => return Err(missing(topic)),
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => {
                unknown += 1;
                Err(missing(topic))
            }
            Some(code) => Err(PublishError::Unavailable(format!("topic {topic:?}: {code}"))),
            None => Err(PublishError::Unavailable(format!(
                "topic {topic:?} has no partitions yet"
            ))),
        };
        if Instant::now() >= deadline {
            return settled;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
