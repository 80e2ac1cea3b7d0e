//! NATS JetStream sink: publishes to `oncegate.events` (configurable) with `Nats-Msg-Id` set
//! to the event id and waits for the stream's ack, so JetStream's duplicate
//! window drops a relay's retries. A `traceparent` header carries the
//! event's trace context when it has one.

use super::{PUBLISH_TIMEOUT, PublishError, Sink};
use crate::store::OutboxEvent;
use async_nats::jetstream::{self, stream};
use async_trait::async_trait;
use std::time::Duration;

pub struct JetStreamSink {
    url: String,
    stream_name: String,
    subject: String,
    /// The JetStream context once connected (async-nats reconnects it on
    /// its own from then on), and whether the stream has been declared on
    /// it since the last failure.
    link: tokio::sync::Mutex<Option<(jetstream::Context, bool)>>,
}

/// Whether `url` is a NATS server URL naming a host.
pub fn check_url(url: &str) -> Result<(), String> {
    let bad = |why: String| {
        format!(
            "ONCEGATE_RELAY_SINK {:?} is not a valid NATS URL: {why}",
            crate::secret::mask_url(url)
        )
    };
    let addr = url
        .parse::<async_nats::ServerAddr>()
        .map_err(|e| bad(e.to_string()))?;
    if addr.host().is_empty() {
        return Err(bad("no host".into()));
    }
    Ok(())
}

impl JetStreamSink {
    /// The sink, connected now: an error if the broker does not answer.
    pub async fn connected(url: &str, stream_name: &str, subject: &str) -> anyhow::Result<Self> {
        let sink = Self::new(url, stream_name, subject)?;
        Sink::connect(&sink).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(sink)
    }

    /// Publishes to `subject` (`oncegate.events` by default), captured by
    /// `stream_name`, which is created on connect if missing.
    pub fn new(url: &str, stream_name: &str, subject: &str) -> anyhow::Result<Self> {
        check_url(url).map_err(|e| anyhow::anyhow!(e))?;
        Ok(Self {
            url: url.to_string(),
            stream_name: stream_name.to_string(),
            subject: subject.to_string(),
            link: tokio::sync::Mutex::new(None),
        })
    }

    async fn declare(&self, context: &jetstream::Context) -> Result<(), PublishError> {
        let declared = context.get_or_create_stream(stream::Config {
            name: self.stream_name.clone(),
            subjects: vec![self.subject.clone()],
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        });
        match tokio::time::timeout(PUBLISH_TIMEOUT, declared).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(PublishError::Unavailable(format!(
                "creating the JetStream stream: {e}"
            ))),
            Err(_) => Err(PublishError::Unavailable(
                "creating the JetStream stream: timed out".into(),
            )),
        }
    }
}
#[async_trait]
impl Sink for JetStreamSink {
    fn name(&self) -> &'static str {
        "nats"
    }

    async fn connect(&self) -> Result<bool, PublishError> {
        let mut link = self.link.lock().await;
        let fresh = link.is_none();
        if fresh {
            let client = async_nats::ConnectOptions::new()
                .connection_timeout(Duration::from_secs(5))
                .connect(&self.url)
                .await
                .map_err(|e| PublishError::Unavailable(format!("connecting to NATS: {e}")))?;
            *link = Some((jetstream::new(client), false));
        }
        let (context, declared) = link.as_mut().expect("set above");
        if !*declared {
            self.declare(context).await?;
            *declared = true;
        }
        Ok(fresh)
    }

    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        let context = match self.link.lock().await.as_ref() {
            Some((context, true)) => context.clone(),
            _ => return Err(PublishError::Unavailable("not connected to NATS".into())),
        };
        let result = self.publish_on(&context, event).await;
        if matches!(result, Err(PublishError::Unavailable(_))) {
            // Declare the stream again once NATS answers: a restarted
            // server may have lost it.
            if let Some((_, declared)) = self.link.lock().await.as_mut() {
                *declared = false;
            }
        }
        result
    }
}

impl JetStreamSink {
    async fn publish_on(
        &self,
        context: &jetstream::Context,
        event: &OutboxEvent,
    ) -> Result<(), PublishError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", event.event_id.to_string().as_str());
        headers.insert("Oncegate-Award-Id", event.award_id.as_str());
        headers.insert("Oncegate-Sequence", event.sequence.to_string().as_str());
        if let Some(traceparent) = &event.traceparent {
            headers.insert("traceparent", traceparent.as_str());
        }
        let ack = context
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
