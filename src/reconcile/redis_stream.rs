//! The relay's Redis stream, read back with `XRANGE` in pages. The relay
//! caps the stream with `XADD MAXLEN ~ N`, which only ever trims the oldest
//! entries and never below `N`: a stream shorter than `N` has lost nothing.

use super::broker::{BROKER_TIMEOUT, BrokerEntry, BrokerLog, Coverage, TRIM_MARGIN};
use async_trait::async_trait;
use fred::prelude::*;
use std::collections::HashMap;
use time::OffsetDateTime;

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
                event_id: fields.remove("event_id"),
                award_id: fields.remove("award_id"),
                sequence: fields.remove("sequence"),
                event_type: fields.remove("type"),
                body: fields.remove("data"),
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
