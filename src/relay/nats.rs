//! NATS JetStream sink: publishes to `oncegate.events` (configurable) with `Nats-Msg-Id` set
//! to the event id and waits for the stream's ack, so JetStream's duplicate
//! window drops a relay's retries.

use super::{PUBLISH_TIMEOUT, PublishError, Sink};
use crate::store::OutboxEvent;
use async_nats::jetstream::{self, stream};
use async_trait::async_trait;
use std::time::Duration;

pub struct JetStreamSink {
    context: jetstream::Context,
    subject: String,
}

impl JetStreamSink {
    /// Connects and makes sure the stream exists, capturing `subject`
    /// (`oncegate.events` by default).
    pub async fn connect(url: &str, stream_name: &str, subject: &str) -> anyhow::Result<Self> {
        use anyhow::Context;
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(Duration::from_secs(5))
            .retry_on_initial_connect()
            .connect(url)
            .await
            .context("connecting to NATS")?;
        let context = jetstream::new(client);
        context
            .get_or_create_stream(stream::Config {
                name: stream_name.to_string(),
                subjects: vec![subject.to_string()],
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            })
            .await
            .context("creating the JetStream stream")?;
        Ok(Self {
            context,
            subject: subject.to_string(),
        })
    }
}

#[async_trait]
impl Sink for JetStreamSink {
    fn name(&self) -> &'static str {
        "nats"
    }

    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", event.event_id.to_string().as_str());
        headers.insert("Oncegate-Award-Id", event.award_id.as_str());
        headers.insert("Oncegate-Sequence", event.sequence.to_string().as_str());
        let ack = self
            .context
            .publish_with_headers(self.subject.clone(), headers, event.payload.clone().into())
            .await
            .map_err(|e| classify(&e))?;
        tokio::time::timeout(PUBLISH_TIMEOUT, ack)
            .await
            .map_err(|_| PublishError::Unavailable("timed out waiting for the JetStream ack".into()))?
            .map(|_| ())
            .map_err(|e| classify(&e))
    }
}

/// JetStream refusing the message (its API error: too large, wrong last
/// id…) is a rejection; a timeout, a broken connection, a missing stream or
/// a full ack window is an outage (not the event's fault).
fn classify(e: &async_nats::jetstream::context::PublishError) -> PublishError {
    use async_nats::jetstream::context::PublishErrorKind as K;
    match e.kind() {
        K::TimedOut | K::BrokenPipe | K::StreamNotFound | K::MaxAckPending => {
            PublishError::Unavailable(e.to_string())
        }
        _ => PublishError::Rejected(e.to_string()),
    }
}
