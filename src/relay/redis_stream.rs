//! Redis Streams sink: `XADD <stream> MAXLEN ~ N * event_id … sequence … data …`.

use super::Sink;
use crate::store::OutboxEvent;
use async_trait::async_trait;
use fred::prelude::*;
use fred::types::streams::{MultipleOrderedPairs, XCap, XCapKind, XCapTrim};
use std::time::Duration;

pub struct RedisStreamSink {
    client: Client,
    stream: String,
    maxlen: i64,
}

impl RedisStreamSink {
    pub async fn connect(url: &str, stream: &str, maxlen: u64) -> anyhow::Result<Self> {
        use anyhow::Context;
        let config = Config::from_url(url).context("ONCEGATE_RELAY_SINK is not a valid Redis URL")?;
        let client = Builder::from_config(config)
            .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(5))
            .set_policy(ReconnectPolicy::new_exponential(0, 100, 5_000, 2))
            .build()?;
        let _connection = client.connect();
        let _ = tokio::time::timeout(Duration::from_secs(2), client.wait_for_connect()).await;
        Ok(Self {
            client,
            stream: stream.to_string(),
            maxlen: maxlen.min(i64::MAX as u64) as i64,
        })
    }
}

#[async_trait]
impl Sink for RedisStreamSink {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn publish(&self, event: &OutboxEvent) -> Result<(), String> {
        let fields: MultipleOrderedPairs = vec![
            ("event_id", event.event_id.to_string()),
            ("type", event.event_type.clone()),
            ("award_id", event.award_id.clone()),
            ("sequence", event.sequence.to_string()),
            ("data", event.payload.clone()),
        ]
        .try_into()
        .map_err(|e: fred::error::Error| e.to_string())?;
        let cap: XCap = (XCapKind::MaxLen, XCapTrim::AlmostExact, self.maxlen, None)
            .try_into()
            .map_err(|e: fred::error::Error| e.to_string())?;
        self.client
            .xadd::<String, _, _, _, _>(&self.stream, false, cap, "*", fields)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}
