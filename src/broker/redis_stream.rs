//! Redis Streams: the sink (`XADD <stream> MAXLEN ~ N * event_id … sequence
//! … data …`, and `traceparent …` when the event has a trace context) and
//! its reader (`XRANGE` in pages). At least once: an `XADD` whose answer was
//! lost is sent again; consumers dedupe on the `event_id` field.

use super::seam::{
    BROKER_TIMEOUT, Broker, BrokerEntry, BrokerLog, BrokerSetting, Coverage, PUBLISH_TIMEOUT, PublishError,
    Sink, TRIM_MARGIN,
};
use crate::store::OutboxEvent;
use async_trait::async_trait;
use fred::prelude::*;
use fred::types::streams::{MultipleOrderedPairs, XCap, XCapKind, XCapTrim};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;

pub const BROKER: Broker = Broker {
    name: "redis",
    schemes: &["redis://", "rediss://"],
    check_url: |url| check_url(url).map(|_| ()),
    sink: |url, s| {
        let maxlen = s.options.parse(&STREAM_MAXLEN).map_err(anyhow::Error::msg)?;
        Ok(Arc::new(RedisStreamSink::new(url, &s.stream, maxlen)?))
    },
    reader: Some(|url, s| {
        Box::pin(async move {
            let maxlen = s.options.parse(&STREAM_MAXLEN)?;
            let log = RedisStreamLog::connect(url, &s.stream, maxlen).await?;
            Ok(Box::new(log) as Box<dyn BrokerLog>)
        })
    }),
    exactly_once: false,
    about: "Redis Streams",
    stream_is: "the stream key",
    settings: &[STREAM_MAXLEN],
};

/// `ONCEGATE_RELAY_STREAM_MAXLEN`: the stream's cap.
pub const STREAM_MAXLEN: BrokerSetting = BrokerSetting {
    env: "ONCEGATE_RELAY_STREAM_MAXLEN",
    flag: "relay-stream-maxlen",
    aliases: &["stream-maxlen"],
    default: "1000000",
    help: "Approximate maximum length of the Redis stream (XADD MAXLEN ~); reconcile: a stream \
           shorter than it has lost no entry to trimming.",
    check: BrokerSetting::number,
};

/// The stream entry's fields, as the relay writes them and reconcile reads them.
mod field {
    pub const EVENT_ID: &str = "event_id";
    pub const TYPE: &str = "type";
    pub const AWARD_ID: &str = "award_id";
    pub const SEQUENCE: &str = "sequence";
    pub const DATA: &str = "data";
    pub const TRACEPARENT: &str = "traceparent";
}

/// The client configuration of a `redis://` sink URL, or what is wrong with it.
pub fn check_url(url: &str) -> Result<Config, String> {
    Config::from_url(url).map_err(|e| {
        format!(
            "ONCEGATE_RELAY_SINK {:?} is not a valid Redis URL: {e}",
            crate::secret::mask_url(url)
        )
    })
}

pub struct RedisStreamSink {
    config: Config,
    stream: String,
    maxlen: i64,
    /// Set once a connection succeeded; fred reconnects it on its own from
    /// then on. A client whose first connection failed is discarded and
    /// built again by the next [`Sink::connect`].
    client: std::sync::Mutex<Option<Client>>,
}

impl RedisStreamSink {
    /// The sink, connected now: an error if the broker does not answer.
    pub async fn connected(url: &str, stream: &str, maxlen: u64) -> anyhow::Result<Self> {
        let sink = Self::new(url, stream, maxlen)?;
        Sink::connect(&sink).await.map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(sink)
    }

    pub fn new(url: &str, stream: &str, maxlen: u64) -> anyhow::Result<Self> {
        let config = check_url(url).map_err(|e| anyhow::anyhow!(e))?;
        Ok(Self {
            config,
            stream: stream.to_string(),
            maxlen: maxlen.min(i64::MAX as u64) as i64,
            client: std::sync::Mutex::new(None),
        })
    }

    fn current(&self) -> Option<Client> {
        self.client.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[async_trait]
impl Sink for RedisStreamSink {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn connect(&self) -> Result<bool, PublishError> {
        if self.current().is_some() {
            return Ok(false);
        }
        let client = Builder::from_config(self.config.clone())
            .with_performance_config(|p| p.default_command_timeout = PUBLISH_TIMEOUT)
            .set_policy(ReconnectPolicy::new_exponential(0, 100, 5_000, 2))
            .build()
            .map_err(|e| PublishError::Unavailable(format!("building the Redis client: {e}")))?;
        let _connection = client.connect();
        match tokio::time::timeout(Duration::from_secs(2), client.wait_for_connect()).await {
            Ok(Ok(())) => {
                *self.client.lock().unwrap_or_else(|p| p.into_inner()) = Some(client);
                Ok(true)
            }
            failed => {
                let _ = client.quit().await;
                Err(PublishError::Unavailable(match failed {
                    Ok(Err(e)) => format!("connecting to Redis: {e}"),
                    _ => "connecting to Redis: no answer within 2s".into(),
                }))
            }
        }
    }

    async fn publish_one(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        let Some(client) = self.current() else {
            return Err(PublishError::Unavailable("not connected to Redis".into()));
        };
        let mut fields = vec![
            (field::EVENT_ID, event.event_id.to_string()),
            (field::TYPE, event.event_type.clone()),
            (field::AWARD_ID, event.award_id.clone()),
            (field::SEQUENCE, event.sequence.to_string()),
            (field::DATA, event.payload.clone()),
        ];
        if let Some(traceparent) = &event.traceparent {
            fields.push((field::TRACEPARENT, traceparent.clone()));
        }
        let fields: MultipleOrderedPairs = fields
            .try_into()
            .map_err(|e: fred::error::Error| PublishError::Rejected(e.to_string()))?;
        let cap: XCap = (XCapKind::MaxLen, XCapTrim::AlmostExact, self.maxlen, None)
            .try_into()
            .map_err(|e: fred::error::Error| PublishError::Rejected(e.to_string()))?;
        // Fail fast while disconnected: an outage is known at once instead of
        // after the command timeout, and the relay pauses.
        let options = Options {
            fail_fast: true,
            timeout: Some(PUBLISH_TIMEOUT),
            ..Default::default()
        };
        let client = client.with_options(&options);
        let added = client.xadd::<String, _, _, _, _>(&self.stream, false, cap, "*", fields);
        match tokio::time::timeout(PUBLISH_TIMEOUT, added).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(classify(&e)),
            Err(_) => Err(PublishError::Unavailable(format!(
                "no answer from Redis within {PUBLISH_TIMEOUT:?}"
            ))),
        }
    }
}

/// A reply from Redis refusing the command (WRONGTYPE, OOM, a script
/// error…) is a rejection; anything about reaching Redis is an outage.
fn classify(e: &fred::error::Error) -> PublishError {
    use fred::error::ErrorKind as K;
    match e.kind() {
        K::IO
        | K::Timeout
        | K::Canceled
        | K::Backpressure
        | K::Cluster
        | K::Routing
        | K::Sentinel
        | K::Auth
        | K::Tls => PublishError::Unavailable(e.to_string()),
        _ => PublishError::Rejected(e.to_string()),
    }
}

/// The relay's Redis stream, read back with `XRANGE` in pages. The relay
/// caps the stream with `XADD MAXLEN ~ N`, which only ever trims the oldest
/// entries and never below `N`: a stream shorter than `N` has lost nothing.
pub struct RedisStreamLog {
    client: Client,
    stream: String,
    maxlen: u64,
    /// The last entry id read.
    last: Option<String>,
    /// The newest entry when reading began: nothing after it is read.
    end: Option<String>,
}

type Entries = Vec<(String, HashMap<String, String>)>;

impl RedisStreamLog {
    pub async fn connect(url: &str, stream: &str, maxlen: u64) -> Result<Self, String> {
        let config = Config::from_url(url).map_err(|e| format!("not a valid Redis URL: {e}"))?;
        let client = Builder::from_config(config)
            .with_performance_config(|p| p.default_command_timeout = BROKER_TIMEOUT)
            .build()
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(BROKER_TIMEOUT, client.init()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(format!("connecting to Redis: {e}")),
            Err(_) => {
                return Err(format!(
                    "connecting to Redis: no answer within {BROKER_TIMEOUT:?}"
                ));
            }
        }
        let newest: Entries = client
            .xrevrange(stream, "+", "-", Some(1))
            .await
            .map_err(|e| format!("XREVRANGE {stream}: {e}"))?;
        Ok(Self {
            client,
            stream: stream.to_string(),
            maxlen,
            last: None,
            end: newest.into_iter().next().map(|(id, _)| id),
        })
    }
}

/// The time in a stream entry id (`<milliseconds>-<n>`).
fn entry_time(id: &str) -> Option<OffsetDateTime> {
    let ms: i128 = id.split('-').next()?.parse().ok()?;
    OffsetDateTime::from_unix_timestamp_nanos(ms * 1_000_000).ok()
}

#[async_trait]
impl BrokerLog for RedisStreamLog {
    fn describe(&self) -> String {
        format!("Redis stream {}", self.stream)
    }

    async fn coverage(&mut self) -> Result<Coverage, String> {
        let length: u64 = self
            .client
            .xlen(&self.stream)
            .await
            .map_err(|e| format!("XLEN {}: {e}", self.stream))?;
        if length < self.maxlen {
            return Ok(Coverage::Everything);
        }
        let oldest: Entries = self
            .client
            .xrange(&self.stream, "-", "+", Some(1))
            .await
            .map_err(|e| format!("XRANGE {}: {e}", self.stream))?;
        Ok(match oldest.first().and_then(|(id, _)| entry_time(id)) {
            Some(t) => Coverage::Since(t + TRIM_MARGIN),
            None => Coverage::Everything,
        })
    }

    async fn next_batch(&mut self, limit: usize) -> Result<Vec<BrokerEntry>, String> {
        let Some(end) = self.end.clone() else {
            return Ok(Vec::new());
        };
        if self.last.as_deref() == Some(end.as_str()) {
            return Ok(Vec::new());
        }
        let start = match &self.last {
            Some(id) => format!("({id}"),
            None => "-".to_string(),
        };
        let page: Entries = self
            .client
            .xrange(&self.stream, start, end.as_str(), Some(limit as u64))
            .await
            .map_err(|e| format!("XRANGE {}: {e}", self.stream))?;
        let Some((last, _)) = page.last() else {
            self.last = Some(end);
            return Ok(Vec::new());
        };
        self.last = Some(last.clone());
        Ok(page
            .into_iter()
            .map(|(id, mut fields)| BrokerEntry {
                position: format!("stream entry {id}"),
                event_id: fields.remove(field::EVENT_ID),
                award_id: fields.remove(field::AWARD_ID),
                sequence: fields.remove(field::SEQUENCE),
                event_type: fields.remove(field::TYPE),
                body: fields.remove(field::DATA),
            })
            .collect())
    }

    async fn close(self: Box<Self>) {
        let _ = self.client.quit().await;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_entry_id_carries_its_time_in_milliseconds() {
        let t = super::entry_time("1733140800123-7").unwrap();
        assert_eq!(crate::time_fmt::rfc3339(t), "2024-12-02T12:00:00.123000Z");
        assert_eq!(super::entry_time("not-an-id"), None);
    }
}
