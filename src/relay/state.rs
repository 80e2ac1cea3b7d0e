//! The relay's state as the running sidecar reports it: `outbox list` and
//! the console's relay page read
//! `oncegate_relay_breaker_state{sink}` and, while paused, the cause in
//! `oncegate_relay_outage{sink,cause,resource}` from the sidecar's metrics
//! listener, since a paused relay leaves nothing in the store that tells it
//! from an idle one (an outage spends no attempts).

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What the sidecar at an address says of its relay.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RelayState {
    /// Publishing (breaker closed) to `sink`.
    Publishing { sink: String },
    /// Paused (breaker open): the broker of `sink` is unreachable
    /// (`cause` "unreachable") or answers that where events go cannot take
    /// them (`topic_missing`, `not_authorized`, `misconfigured`: `resource`
    /// names the topic).
    Paused {
        sink: String,
        cause: String,
        resource: String,
    },
    /// The sidecar answers but runs no relay (sink `none`).
    NoRelay,
    /// No sidecar metrics could be read there.
    Unknown { reason: String },
}

impl std::fmt::Display for RelayState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Publishing { sink } => write!(f, "publishing to {sink}"),
            Self::Paused {
                sink,
                cause,
                resource,
            } => match cause.as_str() {
                "topic_missing" => write!(
                    f,
                    "PAUSED: {sink} topic {resource:?} does not exist (events wait, no attempts spent)"
                ),
                "not_authorized" => write!(
                    f,
                    "PAUSED: the {sink} broker denies {resource:?} (events wait, no attempts spent)"
                ),
                "misconfigured" => write!(
                    f,
                    "PAUSED: {sink} topic {resource:?} is set up wrong, see the relay's log (events wait)"
                ),
                _ => write!(f, "PAUSED: the {sink} broker is unreachable (events wait)"),
            },
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

/// A metric line's labels (`name{a="x",b="y"} value` → pairs) and value.
fn labels_of<'a>(line: &'a str, name: &str) -> Option<(Vec<(&'a str, &'a str)>, &'a str)> {
    let rest = line.strip_prefix(name)?.strip_prefix('{')?;
    let (labels, value) = rest.split_once("} ")?;
    let pairs = labels
        .split(',')
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k, v.trim_matches('"')))
        .collect();
    Some((pairs, value.trim()))
}

fn label<'a>(pairs: &[(&'a str, &'a str)], key: &str) -> &'a str {
    pairs.iter().find(|(k, _)| *k == key).map_or("", |(_, v)| v)
}

/// The state in a Prometheus exposition: the breaker gauge of the sink,
/// and the outage's cause while open.
fn from_metrics(text: &str) -> RelayState {
    let cause = text
        .lines()
        .filter_map(|l| labels_of(l, "oncegate_relay_outage"))
        .find(|(_, value)| *value != "0")
        .map(|(pairs, _)| {
            (
                label(&pairs, "cause").to_string(),
                label(&pairs, "resource").to_string(),
            )
        });
    for line in text.lines() {
        let Some((pairs, value)) = labels_of(line, "oncegate_relay_breaker_state") else {
            continue;
        };
        let sink = label(&pairs, "sink").to_string();
        if value == "0" {
            return RelayState::Publishing { sink };
        }
        let (cause, resource) = cause.unwrap_or_else(|| ("unreachable".into(), String::new()));
        return RelayState::Paused {
            sink,
            cause,
            resource,
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
        let unreachable = RelayState::Paused {
            sink: sink(),
            cause: "unreachable".into(),
            resource: String::new(),
        };
        assert_eq!(from_metrics(text), unreachable);
        let text = "oncegate_relay_outage{sink=\"kafka\",cause=\"unreachable\",resource=\"\"} 0\n\
                    oncegate_relay_outage{sink=\"kafka\",cause=\"topic_missing\",resource=\"grants\"} 1\n\
                    oncegate_relay_breaker_state{sink=\"kafka\"} 1\n";
        let missing = from_metrics(text);
        assert_eq!(
            missing.to_string(),
            "PAUSED: kafka topic \"grants\" does not exist (events wait, no attempts spent)"
        );
        let text = "oncegate_outbox_backlog 0\noncegate_relay_breaker_state{sink=\"kafka\"} 0\n";
        assert_eq!(from_metrics(text), RelayState::Publishing { sink: sink() });
        assert_eq!(from_metrics("oncegate_outbox_backlog 3\n"), RelayState::NoRelay);
    }
}
