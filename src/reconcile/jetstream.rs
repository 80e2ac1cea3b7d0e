//! The relay's JetStream stream, read back by an ordered consumer (an
//! ephemeral, unacknowledged consumer that the server removes after use),
//! from the first message to the last one there when reading began.

use super::broker::{BROKER_TIMEOUT, BrokerEntry, BrokerLog, Coverage, TRIM_MARGIN};
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::pull::{Ordered, OrderedConfig};
use async_nats::jetstream::stream::{RetentionPolicy, Stream};
use async_nats::jetstream::{self, ErrorCode, context::GetStreamErrorKind};
use async_trait::async_trait;
use futures::StreamExt;

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
    let header = |name: &str| {
        message
            .headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
    };
    BrokerEntry {
        position: format!("stream sequence {sequence}"),
        event_id: header("Nats-Msg-Id"),
        award_id: header("Oncegate-Award-Id"),
        sequence: header("Oncegate-Sequence"),
        event_type: None,
        body: String::from_utf8(message.payload.to_vec()).ok(),
    }
}
