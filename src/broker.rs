//! The brokers the outbox relay publishes to and `reconcile` reads back.
//!
//! One room per broker — its sink, its reader, its URL parsing and its wire
//! format together — and one registry table, [`BROKERS`], from URL scheme to
//! what the broker can do. The relay (`crate::relay`) and reconcile
//! (`crate::reconcile`) reach brokers only through this table and the seam
//! ([`Sink`], [`BrokerLog`]).
//!
//! **A new broker** is one room (a file, or a folder when it is large, here
//! in `broker/`) that implements [`Sink`] (and [`BrokerLog`] if its log can be
//! read back) and exposes a `BROKER` entry, plus one line in [`BROKERS`].
//!
//! Rooms: `log` (one INFO line per event), `redis_stream` (Redis Streams),
//! `nats` (JetStream), `amqp` (RabbitMQ), `kafka` (transactions per slot).
//! The seam itself is `broker/seam` (a leaf the rooms import).

pub mod amqp;
pub mod kafka;
pub mod log;
pub mod nats;
pub mod redis_stream;
mod seam;

pub use seam::{
    BROKER_TIMEOUT, Batch, BlockCause, Blocked, Broker, BrokerEntry, BrokerLog, BrokerOptions, BrokerSetting,
    Coverage, PUBLISH_TIMEOUT, PublishError, ReaderFn, Sink, SinkSettings, SinkSpec, SlotId, TRIM_MARGIN,
};

use std::sync::Arc;

/// Every broker, by what `ONCEGATE_RELAY_SINK` starts with.
pub const BROKERS: &[&Broker] = &[
    &log::BROKER,
    &redis_stream::BROKER,
    &nats::BROKER,
    &amqp::BROKER,
    &kafka::BROKER,
];

/// Every broker's own settings ([`Broker::settings`]), in registry order.
pub fn own_settings() -> impl Iterator<Item = &'static BrokerSetting> {
    BROKERS.iter().flat_map(|b| b.settings.iter())
}

/// A broker's schemes as a reader meets them: `redis://…`, `log`.
fn schemes_of(broker: &Broker) -> impl Iterator<Item = String> {
    broker.schemes.iter().map(|s| match s.ends_with("://") {
        true => format!("{s}…"),
        false => s.to_string(),
    })
}

/// `a, b or c`.
fn either(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} or {last}", init.join(", ")),
    }
}

/// The brokers whose log `reconcile` and `audit verify --anchors` read
/// back, for messages: `redis://…, nats://… or kafka://…`.
pub fn readable_schemes() -> String {
    let schemes: Vec<String> = BROKERS
        .iter()
        .filter(|b| b.reader.is_some())
        .flat_map(|b| schemes_of(b))
        .collect();
    either(&schemes)
}

/// `ONCEGATE_RELAY_SINK`'s help: `none` and each broker of the registry.
pub fn sink_help() -> String {
    let each: Vec<String> = BROKERS
        .iter()
        .map(|b| format!("{} ({})", schemes_of(b).collect::<Vec<_>>().join(", "), b.about))
        .collect();
    format!(
        "Where outbox events go: `none`, or {}. `reconcile` reads it back ({} keep a log to \
         read) and compares it with the ledger; `none`: the ledger only.",
        either(&each),
        readable_schemes()
    )
}

/// `ONCEGATE_RELAY_STREAM`'s help: what it names in each broker.
pub fn stream_help() -> String {
    let each: Vec<String> = BROKERS
        .iter()
        .filter(|b| !b.stream_is.is_empty())
        .map(|b| format!("{}: {}", b.name, b.stream_is))
        .collect();
    format!("Where in the broker events go ({}).", each.join("; "))
}

impl SinkSpec {
    /// `none`, `log` or a broker URL; a URL of a known scheme that does not
    /// parse is refused, naming the setting and what is wrong.
    pub fn parse(s: &str) -> Result<Self, String> {
        if matches!(s, "" | "none") {
            return Ok(Self::None);
        }
        let Some(broker) = BROKERS.iter().copied().find(|b| b.matches(s)) else {
            let schemes: Vec<String> = BROKERS.iter().flat_map(|b| schemes_of(b)).collect();
            return Err(format!(
                "ONCEGATE_RELAY_SINK must be none, {}, got {:?}",
                schemes.join(", "),
                crate::secret::mask_url(s)
            ));
        };
        (broker.check_url)(s)?;
        Ok(Self::Broker {
            broker,
            url: s.to_string(),
        })
    }
}

impl SinkSettings {
    /// Builds the sink (`None` for `none`) without reaching the broker: the
    /// relay connects it. Fails only on a setting no retry can fix.
    pub fn build(&self) -> anyhow::Result<Option<Arc<dyn Sink>>> {
        match &self.spec {
            SinkSpec::None => Ok(None),
            SinkSpec::Broker { broker, url } => (broker.sink)(url, self).map(Some),
        }
    }

    /// Builds the sink and connects it once, failing if the broker does
    /// not answer (for tools that need the broker now).
    pub async fn connect(&self) -> anyhow::Result<Option<Arc<dyn Sink>>> {
        let sink = self.build()?;
        if let Some(sink) = &sink {
            sink.connect().await.map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        Ok(sink)
    }

    /// A reader of what the relay published, or `None` when the sink keeps
    /// no log to read back (`none`, `log`, AMQP: an exchange routes each
    /// message to queues whose consumers take it away).
    pub async fn open_log(&self) -> Result<Option<Box<dyn BrokerLog>>, String> {
        match &self.spec {
            SinkSpec::Broker { broker, url } => match broker.reader {
                Some(open) => open(url, self).await.map(Some),
                None => Ok(None),
            },
            SinkSpec::None => Ok(None),
        }
    }
}
