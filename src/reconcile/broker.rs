//! Reading back what the relay published: one small trait, one reader per
//! broker the relay publishes to (the relay's `Sink`s only write).

use crate::relay::{SinkSettings, SinkSpec};
use async_trait::async_trait;
use std::time::Duration;
use time::OffsetDateTime;

/// How far past the oldest entry a trimmed broker is checked from: relay
/// and broker clocks differ, and an event's `published_at` is taken a
/// little after the broker stored it.
pub const TRIM_MARGIN: Duration = Duration::from_secs(60);

/// How long a reader waits for its broker before giving up.
pub const BROKER_TIMEOUT: Duration = Duration::from_secs(10);

/// One entry as the broker holds it, normalised: the fields the relay set
/// beside the body (Redis stream fields, JetStream headers), and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerEntry {
    /// Where it is: a stream entry id, a JetStream stream sequence.
    pub position: String,
    /// Redis `event_id` field, JetStream `Nats-Msg-Id`.
    pub event_id: Option<String>,
    pub award_id: Option<String>,
    pub sequence: Option<String>,
    /// Redis only (`type` field).
    pub event_type: Option<String>,
    /// The event's JSON body.
    pub body: Option<String>,
}

/// Which published events the broker must still hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coverage {
    /// Nothing was ever trimmed: every published event.
    Everything,
    /// Older entries were trimmed by the broker's limits: events published
    /// from this time on.
    Since(OffsetDateTime),
    /// Entries leave the broker when consumed: presence cannot be checked.
    Unknowable(String),
}

/// A broker's log of published events, read oldest first.
#[async_trait]
pub trait BrokerLog: Send {
    /// The stream, for the report.
    fn describe(&self) -> String;
    async fn coverage(&mut self) -> Result<Coverage, String>;
    /// The next entries (at most `limit`); empty once everything that was
    /// there when reading began has been read.
    async fn next_batch(&mut self, limit: usize) -> Result<Vec<BrokerEntry>, String>;
    /// Closes the connection.
    async fn close(self: Box<Self>);
}

/// The reader for the relay's sink, or `None` when the sink keeps no log
/// to read back: `none`, `log`, and AMQP (an exchange routes each message
/// to queues whose consumers take it away).
pub async fn open(settings: &SinkSettings) -> Result<Option<Box<dyn BrokerLog>>, String> {
    Ok(match &settings.spec {
        SinkSpec::None | SinkSpec::Log | SinkSpec::Amqp(_) => None,
        SinkSpec::Redis(url) => Some(Box::new(
            super::redis_stream::RedisStreamLog::connect(url, &settings.stream, settings.stream_maxlen)
                .await?,
        )),
        SinkSpec::Nats(url) => Some(Box::new(
            super::jetstream::JetStreamLog::connect(url, &settings.stream).await?,
        )),
        SinkSpec::Kafka(url) => Some(Box::new(
            super::kafka::KafkaLog::connect(url, &settings.stream).await?,
        )),
    })
}
