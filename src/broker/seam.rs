//! What every broker room implements and what the relay and reconcile see
//! of it: the [`Sink`] (publishing a slot's batch), the [`BrokerLog`]
//! (reading back what was published), the errors that tell an outage from a
//! rejection, and the registry entry type [`Broker`]. A leaf: the rooms
//! import it, it imports no room.

use crate::store::OutboxEvent;
use async_trait::async_trait;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;
use tokio::time::Instant;
use uuid::Uuid;

/// How long a sink waits for its broker before calling it unavailable.
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a reader waits for its broker before giving up.
pub const BROKER_TIMEOUT: Duration = Duration::from_secs(10);

/// How far past the oldest entry a trimmed broker is checked from: relay
/// and broker clocks differ, and an event's `published_at` is taken a
/// little after the broker stored it.
pub const TRIM_MARGIN: Duration = Duration::from_secs(60);

/// What a broker can do: one line of the registry ([`crate::broker::BROKERS`]).
pub struct Broker {
    /// The sink's name: metric label, log field (`redis`, `kafka`, …).
    pub name: &'static str,
    /// What `ONCEGATE_RELAY_SINK` starts with (`redis://`), or is (`log`).
    pub schemes: &'static [&'static str],
    /// Whether a URL of this broker is well formed; the error names what is not.
    pub check_url: fn(&str) -> Result<(), String>,
    /// The sink, not connected yet (the relay connects it).
    pub sink: fn(&str, &SinkSettings) -> anyhow::Result<Arc<dyn Sink>>,
    /// A reader of what the relay published, for brokers that keep a log.
    pub reader: Option<ReaderFn>,
    /// Every event reaches a consumer once (Kafka's read_committed), rather
    /// than at least once: reconcile counts a repeated event as a mismatch.
    pub exactly_once: bool,
    /// What it is, for help and messages (`Redis Streams`).
    pub about: &'static str,
    /// What `ONCEGATE_RELAY_STREAM` names in it (`the stream key`); empty
    /// when it publishes nowhere named.
    pub stream_is: &'static str,
    /// Its own settings, beyond the URL and the stream: `config` offers
    /// each to every subcommand that takes broker settings, and the values
    /// reach the room in [`SinkSettings::options`].
    pub settings: &'static [BrokerSetting],
}

/// A setting of one broker's own, declared in its room. No clap here:
/// `config` turns each into a flag and an environment variable.
#[derive(Debug)]
pub struct BrokerSetting {
    /// The environment variable (`ONCEGATE_RELAY_SUBJECT`).
    pub env: &'static str,
    /// The flag without its dashes (`relay-subject`).
    pub flag: &'static str,
    /// Other names the flag answers to.
    pub aliases: &'static [&'static str],
    pub default: &'static str,
    /// The help line, as `--help` and the configuration reference show it.
    pub help: &'static str,
    /// Whether a value is well formed (run while parsing); the error says
    /// what is wrong.
    pub check: fn(&str) -> Result<(), String>,
}

impl BrokerSetting {
    /// Any value: a name.
    pub fn any(_: &str) -> Result<(), String> {
        Ok(())
    }

    /// A value that must not be empty.
    pub fn not_empty(value: &str) -> Result<(), String> {
        match value.is_empty() {
            true => Err("must not be empty".into()),
            false => Ok(()),
        }
    }

    /// A whole number.
    pub fn number(value: &str) -> Result<(), String> {
        value
            .parse::<u64>()
            .map(|_| ())
            .map_err(|_| format!("{value:?} is not a whole number"))
    }
}

/// The brokers' own settings as given, each read by its room through
/// [`BrokerOptions::get`]; one not given is its default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrokerOptions(std::collections::BTreeMap<&'static str, String>);

impl BrokerOptions {
    /// The value of `setting`, or its default.
    pub fn get(&self, setting: &BrokerSetting) -> &str {
        self.0.get(setting.env).map_or(setting.default, String::as_str)
    }

    /// Sets `setting` (checked by its room's `check` when it is read).
    pub fn set(&mut self, setting: &BrokerSetting, value: impl Into<String>) {
        self.0.insert(setting.env, value.into());
    }

    /// The value of `setting` parsed, the error naming it.
    pub fn parse<T: std::str::FromStr>(&self, setting: &BrokerSetting) -> Result<T, String> {
        let value = self.get(setting);
        (setting.check)(value)
            .and_then(|()| value.parse().map_err(|_| format!("{value:?} does not parse")))
            .map_err(|why| format!("{}: {why}", setting.env))
    }
}

/// Opens a broker's log of published events.
pub type ReaderFn = for<'a> fn(
    &'a str,
    &'a SinkSettings,
) -> futures::future::BoxFuture<'a, Result<Box<dyn BrokerLog>, String>>;

impl Broker {
    /// Whether `url` names this broker.
    pub fn matches(&self, url: &str) -> bool {
        self.schemes.iter().any(|s| {
            if s.ends_with("://") {
                url.starts_with(s)
            } else {
                url == *s
            }
        })
    }
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

/// The configured sink: none, or a broker and its URL.
#[derive(Debug, Clone)]
pub enum SinkSpec {
    None,
    Broker { broker: &'static Broker, url: String },
}

impl PartialEq for SinkSpec {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::None, Self::None) => true,
            (Self::Broker { broker: a, url: u }, Self::Broker { broker: b, url: v }) => {
                a.name == b.name && u == v
            }
            _ => false,
        }
    }
}

impl Eq for SinkSpec {}

impl SinkSpec {
    /// The broker, unless the sink is `none`.
    pub fn broker(&self) -> Option<&'static Broker> {
        match self {
            Self::None => None,
            Self::Broker { broker, .. } => Some(broker),
        }
    }

    /// The sink's name (`none` for none).
    pub fn name(&self) -> &'static str {
        self.broker().map_or("none", |b| b.name)
    }
}

impl std::fmt::Display for SinkSpec {
    /// The sink as configured, password masked.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::Broker { url, .. } => f.write_str(&crate::secret::mask_url(url)),
        }
    }
}

/// Which sink, and where in it events go.
#[derive(Debug, Clone)]
pub struct SinkSettings {
    pub spec: SinkSpec,
    /// Redis stream key, JetStream stream name, AMQP exchange or Kafka topic.
    pub stream: String,
    /// Names this process's broker connection (AMQP `connection_name`).
    pub connection_name: String,
    /// Each broker's own settings ([`Broker::settings`]); its room reads them.
    pub options: BrokerOptions,
    /// The relay's slot lease: a Kafka transaction must end well within it.
    pub lease: Duration,
}

impl SinkSettings {
    /// `spec` publishing to (or read back from) `stream`, each broker's own
    /// settings at their defaults, for a 30 s lease.
    pub fn new(spec: SinkSpec, stream: &str, connection_name: &str) -> Self {
        Self {
            spec,
            stream: stream.to_string(),
            connection_name: connection_name.to_string(),
            options: BrokerOptions::default(),
            lease: Duration::from_secs(30),
        }
    }
}

/// A slot of the outbox as a sink sees it: its number and how many there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId {
    pub index: u32,
    pub count: u32,
}

/// Why a publish failed: the sink decides, because only it knows its
/// broker's errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// The broker answered and refused this event (counts toward quarantine).
    #[error("rejected by the broker: {0}")]
    Rejected(String),
    /// The broker could not be reached or did not answer in time: an
    /// outage, the event is not at fault.
    #[error("broker unavailable: {0}")]
    Unavailable(String),
    /// The broker answered, but where events go cannot take them (a topic
    /// missing, an authorization denied, a topic set up wrong): an outage
    /// too, named for what it is so an operator can fix it.
    #[error("{0}")]
    Blocked(Blocked),
}

impl PublishError {
    /// An outage (nothing spent, the relay pauses) rather than a rejection.
    pub fn is_outage(&self) -> bool {
        !matches!(self, Self::Rejected(_))
    }

    /// The outage's cause, a metric label.
    pub fn cause(&self) -> &'static str {
        match self {
            Self::Rejected(_) => "rejected",
            Self::Unavailable(_) => "unreachable",
            Self::Blocked(b) => b.cause.as_str(),
        }
    }

    /// What the outage is about (a topic, a transactional id), if anything.
    pub fn resource(&self) -> &str {
        match self {
            Self::Blocked(b) => &b.resource,
            _ => "",
        }
    }
}

/// Where events go, unusable for a reason an operator can fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocked {
    pub cause: BlockCause,
    /// The topic or identity concerned.
    pub resource: String,
    /// What the broker said, and what to do.
    pub detail: String,
}

impl std::fmt::Display for Blocked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.cause.describe(&self.resource), self.detail)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockCause {
    /// The topic (stream, exchange) does not exist and is not created on use.
    TopicMissing,
    /// The broker denies this client the topic or identity (an ACL).
    NotAuthorized,
    /// The topic exists with settings the relay cannot be correct with.
    Misconfigured,
}

impl BlockCause {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::TopicMissing => "topic_missing",
            Self::NotAuthorized => "not_authorized",
            Self::Misconfigured => "misconfigured",
        }
    }

    fn describe(self, resource: &str) -> String {
        match self {
            Self::TopicMissing => format!("topic {resource:?} does not exist"),
            Self::NotAuthorized => format!("not authorized for {resource:?}"),
            Self::Misconfigured => format!("{resource:?} is set up wrong"),
        }
    }
}

/// What publishing one slot's batch did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// Events the broker has, in order: to be marked published.
    pub published: Vec<Uuid>,
    /// Events the broker refused (index into the batch, its reason): an
    /// attempt each; the rest of that award's events wait behind it.
    pub rejected: Vec<(usize, String)>,
    /// The broker failed (an outage): the events not published wait, no
    /// attempt spent.
    pub stopped: Option<PublishError>,
    /// Whether some of it may or may not have reached the broker (a commit
    /// whose outcome is unknown): the slot is settled before anything is
    /// sent again.
    pub unknown: bool,
}

/// Where events go. **A new broker** is one room implementing this (a
/// one-event sink implements [`Sink::publish_one`] and gets the batch loop)
/// plus one line in the registry.
#[async_trait]
pub trait Sink: Send + Sync {
    fn name(&self) -> &'static str;

    /// Makes sure the sink is connected and its declarations made; `Ok(true)`
    /// when this call (re)established the connection. Called before every
    /// step, so it must be cheap once connected.
    async fn connect(&self) -> Result<bool, PublishError> {
        Ok(false)
    }

    /// Takes `slot`'s identity at the broker before the first publish of a
    /// new holder (or after an unknown outcome): fences whoever held it and
    /// returns the events an earlier holder published that may not be
    /// marked yet, which the relay marks without publishing them again.
    async fn take(&self, slot: SlotId) -> Result<Vec<Uuid>, PublishError> {
        let _ = slot;
        Ok(Vec::new())
    }

    /// The slot is no longer this process's: let go of its identity.
    async fn release(&self, slot: SlotId) {
        let _ = slot;
    }

    /// Publishes one slot's events in order, each award's in sequence
    /// order, finishing before `deadline` (the slot's lease, as far as this
    /// process knows). The default sends them one by one with
    /// [`Sink::publish_one`]: a rejected event holds back the rest of its
    /// award, an outage stops the batch.
    async fn publish(&self, slot: SlotId, events: &[&OutboxEvent], deadline: Instant) -> Batch {
        let _ = slot;
        let mut batch = Batch::default();
        let mut held: HashSet<&str> = HashSet::new();
        for (i, event) in events.iter().enumerate() {
            if held.contains(event.award_id.as_str()) {
                continue;
            }
            match tokio::time::timeout_at(deadline, self.publish_one(event)).await {
                Ok(Ok(())) => batch.published.push(event.event_id),
                Ok(Err(PublishError::Rejected(why))) => {
                    held.insert(event.award_id.as_str());
                    batch.rejected.push((i, why));
                }
                Ok(Err(outage)) => {
                    batch.stopped = Some(outage);
                    break;
                }
                // The slot's lease is (nearly) up: what went out is kept,
                // the rest waits for whoever holds the slot next.
                Err(_) => break,
            }
        }
        batch
    }

    /// Publishes one event; `Ok` only once the broker has it.
    async fn publish_one(&self, event: &OutboxEvent) -> Result<(), PublishError> {
        let _ = event;
        Err(PublishError::Unavailable(format!(
            "the {} sink publishes batches only",
            self.name()
        )))
    }

    /// The relay marked these events of `slot` published.
    fn marked(&self, slot: SlotId, ids: &[Uuid]) {
        let _ = (slot, ids);
    }
}

/// One entry as the broker holds it, normalised: the fields the relay set
/// beside the body (Redis stream fields, message headers), and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerEntry {
    /// Where it is: a stream entry id, a JetStream stream sequence, a partition and offset.
    pub position: String,
    /// Redis `event_id` field, JetStream `Nats-Msg-Id`, Kafka `event_id` header.
    pub event_id: Option<String>,
    pub award_id: Option<String>,
    pub sequence: Option<String>,
    /// The event type, where the broker carries it beside the body.
    pub event_type: Option<String>,
    /// The event's JSON body.
    pub body: Option<String>,
}

/// Which published events the broker must still hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coverage {
    /// Nothing was ever trimmed: every published event.
    Everything,
    /// Older entries were trimmed by the broker's limits: events published
    /// from this time on.
    Since(OffsetDateTime),
    /// Entries leave the broker when consumed: presence cannot be checked.
    Unknowable(String),
}

/// A broker's log of published events, read oldest first, in pages: a
/// reader holds one page at a time, never the whole log.
#[async_trait]
pub trait BrokerLog: Send {
    /// The stream, for the report.
    fn describe(&self) -> String;
    async fn coverage(&mut self) -> Result<Coverage, String>;
    /// The next entries (at most `limit`); empty once everything that was
    /// there when reading began has been read.
    async fn next_batch(&mut self, limit: usize) -> Result<Vec<BrokerEntry>, String>;
    /// Closes the connection.
    async fn close(self: Box<Self>);
}
