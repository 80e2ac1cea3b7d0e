//! The relay's state as the running sidecar reports it: `outbox list` reads
//! `oncegate_relay_breaker_state{sink}` from the sidecar's metrics listener,
//! since a paused relay leaves nothing in the store that tells it from an
//! idle one (an outage spends no attempts).

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the sidecar at an address says of its relay.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RelayState {
    /// Publishing (breaker closed) to `sink`.
    Publishing { sink: String },
    /// Paused: the broker of `sink` is unreachable (breaker open).
    Paused { sink: String },
    /// The sidecar answers but runs no relay (sink `none`).
    NoRelay,
    /// No sidecar metrics could be read there.
    Unknown { reason: String },
}

impl std::fmt::Display for RelayState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Publishing { sink } => write!(f, "publishing to {sink}"),
            Self::Paused { sink } => write!(f, "PAUSED: the {sink} broker is unreachable (events wait)"),
            Self::NoRelay => f.write_str("no relay (sink none)"),
            Self::Unknown { reason } => write!(f, "unknown ({reason})"),
        }
    }
}

/// Reads the relay's state from the metrics listener at `addr`.
pub async fn relay_state(addr: SocketAddr) -> RelayState {
    match tokio::time::timeout(Duration::from_secs(2), scrape(addr)).await {
        Ok(Ok(text)) => from_metrics(&text),
        Ok(Err(e)) => RelayState::Unknown {
            reason: format!("no sidecar metrics at {addr}: {e}"),
        },
        Err(_) => RelayState::Unknown {
            reason: format!("no answer from {addr} within 2s"),
        },
    }
}

async fn scrape(addr: SocketAddr) -> std::io::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut body = Vec::new();
    stream.read_to_end(&mut body).await?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The state in a Prometheus exposition: the breaker gauge of the sink.
fn from_metrics(text: &str) -> RelayState {
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("oncegate_relay_breaker_state{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let sink = labels
            .split(',')
            .find_map(|l| l.strip_prefix("sink=\""))
            .map(|s| s.trim_end_matches('"').to_string())
            .unwrap_or_default();
        return match value.trim() {
            "0" => RelayState::Publishing { sink },
            _ => RelayState::Paused { sink },
        };
    }
    RelayState::NoRelay
}

#[cfg(test)]
mod tests {
    use super::{RelayState, from_metrics};

    #[test]
    fn the_breaker_gauge_tells_the_state() {
        let sink = || "kafka".to_string();
        let text =
            "# TYPE oncegate_relay_breaker_state gauge\noncegate_relay_breaker_state{sink=\"kafka\"} 1\n";
        assert_eq!(from_metrics(text), RelayState::Paused { sink: sink() });
        let text = "oncegate_outbox_backlog 0\noncegate_relay_breaker_state{sink=\"kafka\"} 0\n";
        assert_eq!(from_metrics(text), RelayState::Publishing { sink: sink() });
        assert_eq!(from_metrics("oncegate_outbox_backlog 3\n"), RelayState::NoRelay);
    }
}
