//! Redis Streams sink: `XADD <stream> MAXLEN ~ N * event_id … sequence … data …`,
//! and `traceparent …` when the event has a trace context.

use super::{PUBLISH_TIMEOUT, PublishError, Sink};
use crate::store::OutboxEvent;
use async_trait::async_trait;
use fred::prelude::*;
use fred::types::streams::{MultipleOrderedPairs, XCap, XCapKind, XCapTrim};
use std::time::Duration;

pub struct RedisStreamSink {
    config: Config,
    stream: String,
    maxlen: i64,
    /// Set once a connection succeeded; fred reconnects it on its own from
    /// then on. A client whose first connection failed is discarded and
    /// built again by the next [`Sink::connect`].
    client: std::sync::Mutex<Option<Client>>,
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

    async fn publish(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        let Some(client) = self.current() else {
            return Err(PublishError::Unavailable("not connected to Redis".into()));
        };
        let mut fields = vec![
            ("event_id", event.event_id.to_string()),
            ("type", event.event_type.clone()),
            ("award_id", event.award_id.clone()),
            ("sequence", event.sequence.to_string()),
            ("data", event.payload.clone()),
        ];
        if let Some(traceparent) = &event.traceparent {
            fields.push(("traceparent", traceparent.clone()));
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
