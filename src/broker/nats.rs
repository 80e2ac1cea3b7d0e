//! NATS JetStream: the sink publishes to `oncegate.events` (configurable)
//! with `Nats-Msg-Id` set to the event id and waits for the stream's ack, so
//! JetStream's duplicate window drops a relay's retries (a `traceparent`
//! header carries the event's trace context when it has one); the reader is
//! an ordered consumer (ephemeral, unacknowledged, removed by the server
//! after use) from the first message to the last one there when reading began.

use super::seam::{
    BROKER_TIMEOUT, Broker, BrokerEntry, BrokerLog, BrokerSetting, Coverage, PUBLISH_TIMEOUT, PublishError,
    Sink, TRIM_MARGIN,
};
use crate::store::OutboxEvent;
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::pull::{Ordered, OrderedConfig};
use async_nats::jetstream::stream::{RetentionPolicy, Stream};
use async_nats::jetstream::{self, ErrorCode, context::GetStreamErrorKind, stream};
use async_trait::async_trait;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;

pub const BROKER: Broker = Broker {
    name: "nats",
    schemes: &["nats://", "tls://"],
    check_url,
    sink: |url, s| {
        Ok(Arc::new(JetStreamSink::new(
            url,
            &s.stream,
            s.options.get(&SUBJECT),
        )?))
    },
    reader: Some(|url, s| {
        Box::pin(async move {
            let log = JetStreamLog::connect(url, &s.stream).await?;
            Ok(Box::new(log) as Box<dyn BrokerLog>)
        })
    }),
    exactly_once: false,
    about: "NATS JetStream",
    stream_is: "the stream name",
    settings: &[SUBJECT],
};

/// `ONCEGATE_RELAY_SUBJECT`: where the sink publishes.
pub const SUBJECT: BrokerSetting = BrokerSetting {
    env: "ONCEGATE_RELAY_SUBJECT",
    flag: "relay-subject",
    aliases: &[],
    default: "oncegate.events",
    help: "JetStream subject events are published on (and the stream captures).",
    check: BrokerSetting::not_empty,
};

/// The message headers the relay sets.
mod header {
    pub const MSG_ID: &str = "Nats-Msg-Id";
    pub const AWARD_ID: &str = "Oncegate-Award-Id";
    pub const SEQUENCE: &str = "Oncegate-Sequence";
    pub const TRACEPARENT: &str = "traceparent";
}

/// JetStream's duplicate window on the stream the sink declares.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
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
            duplicate_window: DUPLICATE_WINDOW,
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

    async fn publish_one(&self, event: &OutboxEvent) -> Result<(), PublishError> {
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
        headers.insert(header::MSG_ID, event.event_id.to_string().as_str());
        headers.insert(header::AWARD_ID, event.award_id.as_str());
        headers.insert(header::SEQUENCE, event.sequence.to_string().as_str());
        if let Some(traceparent) = &event.traceparent {
            headers.insert(header::TRACEPARENT, traceparent.as_str());
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

pub struct JetStreamLog {
    name: String,
    client: async_nats::Client,
    /// `None` when the stream does not exist (nothing was ever published).
    stream: Option<Stream>,
    messages: Option<Ordered>,
    /// The last sequence and the message count when reading began.
    last_sequence: u64,
    expected: u64,
    read: u64,
}

impl JetStreamLog {
    pub async fn connect(url: &str, stream_name: &str) -> Result<Self, String> {
        let client = async_nats::ConnectOptions::new()
            .connection_timeout(BROKER_TIMEOUT)
            .connect(url)
            .await
            .map_err(|e| format!("connecting to NATS: {e}"))?;
        let context = jetstream::new(client.clone());
        let mut stream = match context.get_stream(stream_name).await {
            Ok(s) => Some(s),
            Err(e) if stream_not_found(&e.kind()) => None,
            Err(e) => return Err(format!("reading JetStream stream {stream_name}: {e}")),
        };
        let (last_sequence, expected) = match stream.as_mut() {
            Some(s) => {
                let state = &s.info().await.map_err(|e| e.to_string())?.state;
                (state.last_sequence, state.messages)
            }
            None => (0, 0),
        };
        Ok(Self {
            name: stream_name.to_string(),
            client,
            stream,
            messages: None,
            last_sequence,
            expected,
            read: 0,
        })
    }

    async fn messages(&mut self) -> Result<Option<&mut Ordered>, String> {
        if self.messages.is_none() && self.read < self.expected {
            let Some(stream) = &self.stream else {
                return Ok(None);
            };
            let consumer = stream
                .create_consumer(OrderedConfig {
                    deliver_policy: DeliverPolicy::All,
                    ..Default::default()
                })
                .await
                .map_err(|e| format!("creating a reader of {}: {e}", self.name))?;
            self.messages = Some(consumer.messages().await.map_err(|e| e.to_string())?);
        }
        Ok(self.messages.as_mut())
    }
}

#[async_trait]
impl BrokerLog for JetStreamLog {
    fn describe(&self) -> String {
        format!("JetStream stream {}", self.name)
    }

    async fn coverage(&mut self) -> Result<Coverage, String> {
        let Some(stream) = self.stream.as_mut() else {
            return Ok(Coverage::Everything);
        };
        let info = stream.info().await.map_err(|e| e.to_string())?;
        let config = &info.config;
        if config.retention != RetentionPolicy::Limits {
            return Ok(Coverage::Unknowable(format!(
                "the stream's retention is {:?}: messages leave it when consumed",
                config.retention
            )));
        }
        let limited = config.max_messages > 0
            || config.max_bytes > 0
            || config.max_messages_per_subject > 0
            || !config.max_age.is_zero();
        Ok(if limited && info.state.first_sequence > 1 {
            Coverage::Since(info.state.first_timestamp + TRIM_MARGIN)
        } else {
            Coverage::Everything
        })
    }

    async fn next_batch(&mut self, limit: usize) -> Result<Vec<BrokerEntry>, String> {
        let mut batch = Vec::new();
        while batch.len() < limit && self.read < self.expected {
            let (last_sequence, name) = (self.last_sequence, self.name.clone());
            let Some(messages) = self.messages().await? else {
                break;
            };
            let message = match tokio::time::timeout(BROKER_TIMEOUT, messages.next()).await {
                Ok(Some(Ok(m))) => m,
                Ok(Some(Err(e))) => return Err(format!("reading {name}: {e}")),
                Ok(None) => break,
                Err(_) => return Err(format!("reading {name}: no message within {BROKER_TIMEOUT:?}")),
            };
            let sequence = message.info().map_err(|e| e.to_string())?.stream_sequence;
            self.read += 1;
            batch.push(entry(&message, sequence));
            if sequence >= last_sequence {
                self.read = self.expected;
            }
        }
        Ok(batch)
    }

    async fn close(self: Box<Self>) {
        drop(self.messages);
        let _ = self.client.drain().await;
    }
}

fn stream_not_found(kind: &GetStreamErrorKind) -> bool {
    matches!(kind, GetStreamErrorKind::JetStream(e) if e.error_code() == ErrorCode::STREAM_NOT_FOUND)
}

fn entry(message: &jetstream::Message, sequence: u64) -> BrokerEntry {
    let get = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
    };
    BrokerEntry {
        position: format!("stream sequence {sequence}"),
        event_id: get(header::MSG_ID),
        award_id: get(header::AWARD_ID),
        sequence: get(header::SEQUENCE),
        event_type: None,
        body: String::from_utf8(message.payload.to_vec()).ok(),
    }
}
