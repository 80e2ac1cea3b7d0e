//! AMQP 0-9-1 sink (RabbitMQ): publishes each event to a durable topic
//! exchange (`ONCEGATE_RELAY_STREAM` names it), routing key = the event type
//! (`disbursement.recorded`), persistent, `message_id` = the event id,
//! headers `award_id`, `sequence` and (when it has one) `traceparent`, with
//! publisher confirms: `Ok` only once the broker confirmed the message, so an
//! event is never marked published without a confirm. A closed channel or
//! connection, or a broker restart, is an outage (the event stays
//! unpublished, the relay pauses and retries); a negative confirm is a
//! rejection. Messages are `mandatory`: one that no queue would receive is
//! returned by the broker and treated as an outage too (an unbound exchange
//! is a configuration gap, not a reason to lose or quarantine events).

use super::seam::{Broker, PUBLISH_TIMEOUT, PublishError, Sink};
use crate::store::OutboxEvent;
use async_trait::async_trait;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use std::sync::Arc;
use tokio::sync::Mutex;

pub const BROKER: Broker = Broker {
    name: "amqp",
    schemes: &["amqp://", "amqps://"],
    check_url,
    sink: |url, s| Ok(Arc::new(AmqpSink::new(url, &s.stream, &s.connection_name)?)),
    // An exchange routes each message to queues whose consumers take it
    // away: nothing to read back.
    reader: None,
    exactly_once: false,
    about: "RabbitMQ, publisher confirms",
    stream_is: "the exchange (durable, topic; routing key = the event type)",
    settings: &[],
};

/// AMQP delivery mode of a message the broker writes to disk.
const PERSISTENT: u8 = 2;

pub struct AmqpSink {
    url: String,
    exchange: String,
    connection_name: String,
    /// The open connection and its confirm-mode channel; `None` after a
    /// failure, reopened by the next publish.
    link: Mutex<Option<(Connection, Channel)>>,
}

impl AmqpSink {
    /// The sink, connected now: an error if the broker does not answer.
    pub async fn connected(url: &str, exchange: &str, connection_name: &str) -> anyhow::Result<Self> {
        let sink = Self::new(url, exchange, connection_name)?;
        Sink::connect(&sink).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(sink)
    }

    /// The sink; [`Sink::connect`] connects and declares the exchange.
    pub fn new(url: &str, exchange: &str, connection_name: &str) -> anyhow::Result<Self> {
        check_url(url).map_err(|e| anyhow::anyhow!(e))?;
        let url = default_vhost(url);
        Ok(Self {
            url,
            exchange: exchange.to_string(),
            connection_name: connection_name.to_string(),
            link: Mutex::new(None),
        })
    }

    async fn open(&self) -> Result<(Connection, Channel), PublishError> {
        let unavailable = |what: &str, e: lapin::Error| PublishError::Unavailable(format!("{what}: {e}"));
        let properties = ConnectionProperties::default()
            .with_connection_name(LongString::from(self.connection_name.as_str()));
        let connection = Connection::connect(&self.url, properties)
            .await
            .map_err(|e| unavailable("connecting to the AMQP broker", e))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| unavailable("opening a channel", e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| unavailable("enabling publisher confirms", e))?;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .exchange_declare(
                ShortString::from(self.exchange.as_str()),
                ExchangeKind::Topic,
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(|e| unavailable("declaring the exchange", e))?;
        Ok((connection, channel))
    }

    async fn publish_on(&self, channel: &Channel, event: &OutboxEvent) -> Result<(), PublishError> {
        let mut headers = FieldTable::default();
        headers.insert(
            "award_id".into(),
            AMQPValue::LongString(event.award_id.as_str().into()),
        );
        headers.insert("sequence".into(), AMQPValue::LongLongInt(event.sequence));
        if let Some(traceparent) = &event.traceparent {
            headers.insert(
                "traceparent".into(),
                AMQPValue::LongString(traceparent.as_str().into()),
            );
        }
        let properties = BasicProperties::default()
            .with_message_id(ShortString::from(event.event_id.to_string()))
            .with_content_type("application/json".into())
            .with_delivery_mode(PERSISTENT)
            .with_headers(headers);
        let options = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        let confirm = channel
            .basic_publish(
                ShortString::from(self.exchange.as_str()),
                ShortString::from(event.event_type.as_str()),
                options,
                event.payload.as_bytes(),
                properties,
            )
            .await
            .map_err(|e| PublishError::Unavailable(format!("publishing: {e}")))?
            .await
            .map_err(|e| PublishError::Unavailable(format!("waiting for the confirm: {e}")))?;
        match confirm {
            lapin::Confirmation::Ack(None) => Ok(()),
            lapin::Confirmation::Ack(Some(_)) => Err(PublishError::Unavailable(format!(
                "no queue is bound to exchange {:?} for routing key {:?}; the message was returned",
                self.exchange, event.event_type
            ))),
            lapin::Confirmation::Nack(_) => Err(PublishError::Rejected(
                "the broker refused the message (basic.nack)".into(),
            )),
            lapin::Confirmation::NotRequested => Err(PublishError::Unavailable(
                "the channel is not in confirm mode".into(),
            )),
        }
    }
}

/// `amqp://host/` names the empty vhost in the AMQP URI spec, which no
/// broker has; people mean the default vhost `/` (as most clients read
/// it), so the empty path becomes `%2f`.
/// Whether `url` is an AMQP URI (`amqp://user:pass@host:port/vhost`).
pub fn check_url(url: &str) -> Result<(), String> {
    default_vhost(url)
        .parse::<lapin::uri::AMQPUri>()
        .map(|_| ())
        .map_err(|e| {
            format!(
                "ONCEGATE_RELAY_SINK {:?} is not a valid AMQP URL: {e}",
                crate::secret::mask_url(url)
            )
        })
}

pub fn default_vhost(url: &str) -> String {
    match url.strip_suffix('/') {
        Some(base) if base.matches('/').count() == 2 => format!("{base}/%2f"),
        _ => url.to_string(),
    }
}

#[async_trait]
impl Sink for AmqpSink {
    fn name(&self) -> &'static str {
        "amqp"
    }

    async fn connect(&self) -> Result<bool, PublishError> {
        let mut link = self.link.lock().await;
        if link
            .as_ref()
            .is_some_and(|(c, ch)| c.status().connected() && ch.status().connected())
        {
            return Ok(false);
        }
        let opened = tokio::time::timeout(PUBLISH_TIMEOUT, self.open())
            .await
            .map_err(|_| {
                PublishError::Unavailable(format!(
                    "no answer from the AMQP broker within {PUBLISH_TIMEOUT:?}"
                ))
            })??;
        *link = Some(opened);
        Ok(true)
    }

    async fn publish_one(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        let mut link = self.link.lock().await;
        let attempt = async {
            if link
                .as_ref()
                .is_none_or(|(c, ch)| !c.status().connected() || !ch.status().connected())
            {
                *link = Some(self.open().await?);
            }
            let (_, channel) = link.as_ref().expect("opened above");
            self.publish_on(channel, event).await
        };
        let result = match tokio::time::timeout(PUBLISH_TIMEOUT, attempt).await {
            Ok(result) => result,
            Err(_) => Err(PublishError::Unavailable(format!(
                "no confirm from the AMQP broker within {PUBLISH_TIMEOUT:?}"
            ))),
        };
        if matches!(result, Err(PublishError::Unavailable(_))) {
            // Start afresh next time: the channel's state is unknown.
            *link = None;
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::default_vhost;

    #[test]
    fn an_empty_vhost_means_the_default_one() {
        assert_eq!(default_vhost("amqp://u:p@h:5672/"), "amqp://u:p@h:5672/%2f");
        assert_eq!(default_vhost("amqp://h:5672"), "amqp://h:5672");
        assert_eq!(default_vhost("amqp://h/prod"), "amqp://h/prod");
        assert_eq!(default_vhost("amqp://h/%2f"), "amqp://h/%2f");
    }
}
