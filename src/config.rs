//! Settings from flags and environment, turned into each component's own
//! settings type, one way: this module reads the argument groups the
//! subcommands share and builds [`AppConfig`], [`StoreSettings`],
//! [`RelaySettings`] and the rest. No component imports clap or this
//! module; a new setting is a field here and a field in its component's
//! settings type.
//!
//! Everything is checked before any port is bound: a [`ConfigError`] names
//! the setting, and the process exits with code 64.

pub mod deprecated;
pub mod reference;

use crate::app::{AppConfig, ProbeSettings, ServerLimits, TlsFiles};
use crate::audit::AuditSettings;
use crate::broker::{BrokerOptions, SinkSettings, SinkSpec};
use crate::cache::CacheSettings;
use crate::effects::EffectsSettings;
use crate::error::ConfigError;
use crate::group_commit::GroupCommitSettings;
use crate::reconcile::ReconcileSettings;
use crate::redis_tier::RedisSettings;
use crate::relay::RelaySettings;
use crate::seal::{SealSchedule, SealSettings};
use crate::secret::mask_url;
use crate::store::{Pooler, RetentionPolicy, StoreSettings, TimeRange};
use crate::submission::Limits;
use clap::{Args, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where the authoritative store is.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// Postgres URL (`postgres://…`) or `sqlite://path`. Unset: the embedded SQLite file.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// The embedded SQLite file, used when DATABASE_URL is unset.
    #[arg(long, env = "ONCEGATE_SQLITE_PATH", default_value = "oncegate.db")]
    pub sqlite_path: PathBuf,
    /// Database connections per instance, besides the identity probe's
    /// own (docs/DEPLOYMENT.md, "The connection budget").
    #[arg(long, env = "ONCEGATE_DB_POOL_SIZE", default_value_t = 6)]
    pub db_pool_size: u32,
    /// Postgres: longest wait for a row lock; past it the delivery gets
    /// UNAVAILABLE (retry) and only its award waits.
    #[arg(long, env = "ONCEGATE_DB_LOCK_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub db_lock_timeout: Duration,
    /// Postgres: longest a statement may run.
    #[arg(long, env = "ONCEGATE_DB_STATEMENT_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub db_statement_timeout: Duration,
    /// Postgres: a session of ours idle inside a transaction this long is ended by the server.
    #[arg(long, env = "ONCEGATE_DB_IDLE_IN_TRANSACTION_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub db_idle_in_transaction_timeout: Duration,
    /// Postgres: idle time before the server probes a silent connection (TCP keepalive).
    #[arg(long, env = "ONCEGATE_DB_TCP_KEEPALIVE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub db_tcp_keepalive: Duration,
}

impl StoreArgs {
    /// The store URL: DATABASE_URL, or the SQLite file.
    pub fn url(&self) -> String {
        match &self.database_url {
            Some(u) if !u.is_empty() => u.clone(),
            _ => format!("sqlite://{}", self.sqlite_path.display()),
        }
    }

    /// The store's settings, with at most `max_pool` connections (tools
    /// need few).
    pub fn settings(&self, max_pool: u32) -> Result<StoreSettings, ConfigError> {
        let url = self.url();
        if !(url.starts_with("postgres://")
            || url.starts_with("postgresql://")
            || url.starts_with("sqlite://"))
        {
            return Err(ConfigError(format!(
                "DATABASE_URL must start with postgres:// or sqlite://, got {:?}",
                mask_url(&url)
            )));
        }
        if self.db_pool_size == 0 {
            return Err(ConfigError::new("ONCEGATE_DB_POOL_SIZE must be at least 1"));
        }
        for (value, name) in [
            (self.db_lock_timeout, "ONCEGATE_DB_LOCK_TIMEOUT"),
            (self.db_statement_timeout, "ONCEGATE_DB_STATEMENT_TIMEOUT"),
            (
                self.db_idle_in_transaction_timeout,
                "ONCEGATE_DB_IDLE_IN_TRANSACTION_TIMEOUT",
            ),
            (self.db_tcp_keepalive, "ONCEGATE_DB_TCP_KEEPALIVE"),
        ] {
            if value < Duration::from_millis(1) {
                return Err(ConfigError(format!(
                    "{name} must be at least 1ms (0 would switch the guard off)"
                )));
            }
        }
        if self.db_lock_timeout > self.db_statement_timeout {
            return Err(ConfigError::new(
                "ONCEGATE_DB_LOCK_TIMEOUT must not exceed ONCEGATE_DB_STATEMENT_TIMEOUT",
            ));
        }
        Ok(StoreSettings {
            url,
            pool_size: self.db_pool_size.min(max_pool),
            lock_timeout: self.db_lock_timeout,
            statement_timeout: self.db_statement_timeout,
            idle_in_transaction_timeout: self.db_idle_in_transaction_timeout,
            tcp_keepalive: self.db_tcp_keepalive,
            require_sync_standby: false,
            pooler: Pooler::None,
        })
    }
}

/// The Prometheus listener (`/metrics`): where `serve` and `relay` serve
/// it, and where `outbox list` reads the sidecar's relay state.
#[derive(Debug, Clone, Args)]
pub struct MetricsArgs {
    /// Prometheus metrics listen address (`/metrics`). `outbox list` reads
    /// the running sidecar's relay state from it (run it in the pod).
    #[arg(
        long,
        visible_alias = "metrics",
        env = "ONCEGATE_METRICS_LISTEN",
        default_value = "127.0.0.1:9464"
    )]
    pub metrics_listen: SocketAddr,
}

/// This process's name among the instances.
#[derive(Debug, Clone, Args)]
pub struct InstanceArgs {
    /// This instance's name (default: the host name): written to audit rows
    /// and seals, shown with the relay slots it holds (every relay process
    /// adds a part of its own).
    #[arg(long, env = "ONCEGATE_INSTANCE_ID")]
    pub instance_id: Option<String>,
}

impl InstanceArgs {
    /// `ONCEGATE_INSTANCE_ID`, or the host name.
    pub fn id(&self) -> String {
        self.instance_id.clone().unwrap_or_else(hostname)
    }
}

/// `ONCEGATE_DB_POOLER`: what DATABASE_URL reaches ([`crate::store::Pooler`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DbPooler {
    /// The server, or a pooler in session mode.
    None,
    /// A pooler in transaction mode (PgBouncer `pool_mode = transaction`).
    Transaction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Redis URL for the shared L2 tier (`redis://`, `rediss://`, `redis-cluster://`,
    /// `redis-sentinel://`). Unset: no L2.
    #[arg(long, env = "REDIS_URL")]
    pub redis_url: Option<String>,
    /// gRPC listen address. Loopback by default: a sidecar is reached from its own pod.
    #[arg(long, env = "ONCEGATE_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Extra plaintext listener serving only grpc.health.v1 (for kubelet probes).
    #[arg(long, env = "ONCEGATE_HEALTH_LISTEN")]
    pub health_listen: Option<SocketAddr>,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    /// Apply migrations at start (disable when a migration Job does it).
    #[arg(long, env = "ONCEGATE_MIGRATE_ON_START", default_value_t = true, action = clap::ArgAction::Set)]
    pub migrate_on_start: bool,
    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, env = "ONCEGATE_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Threads that run requests. One (the default) runs every task on
    /// one thread: at a sidecar's rates a second thread mostly wakes the
    /// first, for more CPU per decision (docs/BENCHMARKS.md). Raise it
    /// towards the pod's CPU limit when the sidecar's own CPU use nears one
    /// core.
    #[arg(long, env = "ONCEGATE_WORKER_THREADS", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub worker_threads: u16,
    /// Refuse to start (exit 64) when the database role is privileged: a
    /// superuser, the schema owner, or able to change ledger, audit trail or
    /// retention floor. The Helm chart sets it whenever Postgres is used.
    #[arg(long, env = "ONCEGATE_REQUIRE_LEAST_PRIVILEGE", default_value_t = false, action = clap::ArgAction::Set)]
    pub require_least_privilege: bool,
    /// Postgres: accept claims (and effect leases and completions) only
    /// while the primary acknowledges a commit once a synchronous standby
    /// has it — `synchronous_standby_names` names one, enough of them
    /// stream, and `synchronous_commit` is on, remote_write or remote_apply
    /// for this role's sessions. Checked at start, on every identity probe
    /// and in every claim transaction; short of it, claims answer
    /// UNAVAILABLE naming what is missing and the Gate's health says
    /// NOT_SERVING, until it is back. Otherwise a failover can lose claims
    /// whose consumers have already acked their broker.
    #[arg(long, env = "ONCEGATE_REQUIRE_SYNC_REPLICA", default_value_t = false, action = clap::ArgAction::Set)]
    pub require_sync_replica: bool,
    /// Postgres: how often a connection of its own re-reads the primary's
    /// identity (system identifier, timeline) and, with
    /// ONCEGATE_REQUIRE_SYNC_REPLICA, its synchronous standbys. A new
    /// identity (a failover) empties L1 and moves L2 to a new epoch first.
    #[arg(long, env = "ONCEGATE_PRIMARY_PROBE_INTERVAL", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub primary_probe_interval: Duration,
    /// Postgres: how long a probe may go unanswered before cache answers
    /// are suspended. L1/L2 answer only within interval + timeout of the
    /// last confirmation, so a primary that vanishes without a reset is
    /// answered for from caches at most that long.
    #[arg(long, env = "ONCEGATE_PRIMARY_PROBE_TIMEOUT", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub primary_probe_timeout: Duration,
    /// Postgres: what DATABASE_URL reaches. `none`: the server, or a
    /// pooler in session mode. `transaction`: a pooler in transaction mode
    /// (PgBouncer `pool_mode = transaction`), where nothing of a session
    /// survives a transaction: statements then run unnamed, each inside a
    /// transaction that sets the session's timeouts. The relay, the purge,
    /// reconciliation, sealing, verification and migrations need a session
    /// of their own: run them where DATABASE_URL reaches the server
    /// (`oncegate relay`, `oncegate purge`, …); serve refuses them here.
    #[arg(long, env = "ONCEGATE_DB_POOLER", value_enum, default_value = "none")]
    pub db_pooler: DbPooler,
    #[command(flatten)]
    pub instance: InstanceArgs,
    /// Bound on the SIGTERM drain.
    #[arg(long, env = "ONCEGATE_SHUTDOWN_GRACE", default_value = "20s", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Duration,
    /// How long start-up waits for the store to become reachable.
    #[arg(long, env = "ONCEGATE_STARTUP_TIMEOUT", default_value = "60s", value_parser = humantime::parse_duration)]
    pub startup_timeout: Duration,

    /// L1 byte budget.
    #[arg(long, env = "ONCEGATE_L1_CAPACITY_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub l1_capacity_bytes: u64,
    /// L1 time to live.
    #[arg(long, env = "ONCEGATE_L1_TTL", default_value = "10m", value_parser = humantime::parse_duration)]
    pub l1_ttl: Duration,
    /// Prefix of every Redis key.
    #[arg(long, env = "ONCEGATE_REDIS_KEY_PREFIX", default_value = "oncegate:")]
    pub redis_key_prefix: String,
    /// Timeout of each Redis call; past it the call counts as a failure.
    #[arg(long, env = "ONCEGATE_REDIS_TIMEOUT", default_value = "50ms", value_parser = humantime::parse_duration)]
    pub redis_timeout: Duration,
    /// TTL of an in-flight lease token.
    #[arg(long, env = "ONCEGATE_REDIS_LEASE_TTL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub redis_lease_ttl: Duration,
    /// How long a committed result stays in Redis.
    #[arg(long, env = "ONCEGATE_REDIS_DEDUP_TTL", default_value = "7days", value_parser = humantime::parse_duration)]
    pub redis_dedup_ttl: Duration,
    /// Consecutive Redis failures that open the circuit breaker.
    #[arg(long, env = "ONCEGATE_REDIS_BREAKER_THRESHOLD", default_value_t = 5)]
    pub redis_breaker_threshold: u32,
    /// How long the breaker stays open before a probe.
    #[arg(long, env = "ONCEGATE_REDIS_BREAKER_COOLDOWN", default_value = "2s", value_parser = humantime::parse_duration)]
    pub redis_breaker_cooldown: Duration,

    /// Most concurrent requests (batch items count each); excess: RESOURCE_EXHAUSTED.
    #[arg(long, env = "ONCEGATE_MAX_IN_FLIGHT", default_value_t = 4096)]
    pub max_in_flight: usize,
    /// Largest payload accepted.
    #[arg(long, env = "ONCEGATE_MAX_PAYLOAD_BYTES", default_value_t = 1024 * 1024)]
    pub max_payload_bytes: usize,
    /// Largest gRPC message accepted (a SubmitBatch carries many payloads).
    #[arg(long, env = "ONCEGATE_MAX_MESSAGE_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_message_bytes: usize,
    /// Most items in one SubmitBatch.
    #[arg(long, env = "ONCEGATE_MAX_BATCH_ITEMS", default_value_t = 1000)]
    pub max_batch_items: usize,

    /// Most deliveries per group-commit transaction (1 disables group commit).
    #[arg(long, env = "ONCEGATE_GROUP_COMMIT_MAX_BATCH", default_value_t = 128)]
    pub group_commit_max_batch: usize,
    /// How long a small group-commit batch (under 8 deliveries) lingers for
    /// more: fewer, larger transactions for a little latency. A lane stops
    /// lingering while its lingers gather little (consumers that wait for
    /// each answer) and tries again every 32 batches. At a steady 1,000
    /// claims/s, 2ms took a fifth off a fresh claim's CPU for 3 ms more at
    /// the median; one to four consumers each waiting for its answer lost
    /// 10-31 % of their claims per second, 16 or 64 none (docs/BENCHMARKS.md).
    #[arg(long, env = "ONCEGATE_GROUP_COMMIT_MAX_WAIT", default_value = "0ms", value_parser = humantime::parse_duration)]
    pub group_commit_max_wait: Duration,
    /// Group-commit lanes: claims are routed by a hash of their award to a
    /// lane, and each lane has one batch transaction in flight (lanes never
    /// share an award, so their transactions commit side by side). In a
    /// lane, a second batch runs beside one stuck for 20 ms (a row lock), so
    /// a stuck award holds up only its lane. Each lane holds up to two pool
    /// connections: at most (ONCEGATE_DB_POOL_SIZE - 1) / 2 lanes run, and
    /// one on SQLite (one writer). More lanes make smaller batches: worth it
    /// only with cores to spare and a slow commit flush (docs/BENCHMARKS.md).
    #[arg(long, env = "ONCEGATE_GROUP_COMMIT_WORKERS", default_value_t = 1)]
    pub group_commit_workers: usize,

    /// Audit queue bound (duplicates answered by caches, rejections).
    #[arg(long, env = "ONCEGATE_AUDIT_QUEUE", default_value_t = 65_536)]
    pub audit_queue: usize,
    /// Audit flush interval.
    #[arg(long, env = "ONCEGATE_AUDIT_FLUSH_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub audit_flush_interval: Duration,
    /// Directory (the pod's emptyDir) where queued audit rows are appended
    /// before they are written, so a process kill loses none: the next
    /// start writes them. One process per directory. Unset: in memory only.
    #[arg(long, env = "ONCEGATE_AUDIT_SPOOL_DIR")]
    pub audit_spool_dir: Option<std::path::PathBuf>,

    #[command(flatten)]
    pub relay: RelaySettingsArgs,
    #[command(flatten)]
    pub retention: RetentionArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub effects: EffectsArgs,
    #[command(flatten)]
    pub reconcile: ReconcileBatchArgs,
    /// How often `serve` reconciles the ledger (and the relay's broker), one
    /// instance at a time; 0s disables it. Default: 1h on Postgres, off on
    /// the embedded SQLite store (run `oncegate reconcile` there).
    #[arg(long, env = "ONCEGATE_RECONCILE_INTERVAL", value_parser = humantime::parse_duration)]
    pub reconcile_interval: Option<Duration>,
    #[command(flatten)]
    pub audit_seal: SealServeArgs,
}

/// Effects outside the ledger (DESIGN §9): the caches' dedup window.
#[derive(Debug, Clone, Args)]
pub struct EffectsArgs {
    /// How long a completed effect record stays in Redis (and, at most
    /// ONCEGATE_L1_TTL, in L1), unless its namespace has its own window.
    #[arg(long, env = "ONCEGATE_EFFECTS_CACHE_TTL", default_value = "1day", value_parser = humantime::parse_duration)]
    pub effects_cache_ttl: Duration,
    /// Per-namespace cache windows: `namespace=duration,…`, e.g. `payments=1h,notices=10m`.
    #[arg(long, env = "ONCEGATE_EFFECTS_NAMESPACE_TTL", default_value = "")]
    pub effects_namespace_ttl: String,
    /// How often a waiting Begin re-reads a record whose lease is held on
    /// another instance (this instance's own completions wake it at once).
    #[arg(long, env = "ONCEGATE_EFFECTS_POLL", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub effects_poll: Duration,
    /// The effects L1's byte budget.
    #[arg(long, env = "ONCEGATE_EFFECTS_L1_CAPACITY_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub effects_l1_capacity_bytes: u64,
}

impl EffectsArgs {
    /// The effects settings; `l1_ttl` caps a record's time in L1.
    pub fn settings(&self, l1_ttl: Duration) -> Result<EffectsSettings, ConfigError> {
        if self.effects_cache_ttl.is_zero() {
            return Err(ConfigError::new(
                "ONCEGATE_EFFECTS_CACHE_TTL must be greater than 0",
            ));
        }
        if self.effects_poll < Duration::from_millis(1) {
            return Err(ConfigError::new("ONCEGATE_EFFECTS_POLL must be at least 1ms"));
        }
        Ok(EffectsSettings {
            cache_ttl: self.effects_cache_ttl,
            namespace_ttl: parse_namespace_ttl(&self.effects_namespace_ttl)?,
            l1_ttl,
            poll: self.effects_poll,
            l1_capacity_bytes: self.effects_l1_capacity_bytes,
        })
    }
}

/// `ns=1h,ns2=10m` → each namespace's window; the error names the setting
/// and the entry.
fn parse_namespace_ttl(spec: &str) -> Result<std::collections::HashMap<String, Duration>, ConfigError> {
    let bad = |entry: &str, why: String| {
        ConfigError(format!(
            "ONCEGATE_EFFECTS_NAMESPACE_TTL entry {entry:?}: {why} (expected namespace=duration,…)"
        ))
    };
    let mut out = std::collections::HashMap::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (ns, ttl) = entry.split_once('=').ok_or_else(|| bad(entry, "no '='".into()))?;
        let ns = ns.trim();
        crate::effects::validate_namespace(ns).map_err(|e| bad(entry, e.to_string()))?;
        let ttl = humantime::parse_duration(ttl.trim()).map_err(|e| bad(entry, e.to_string()))?;
        if ttl.is_zero() {
            return Err(bad(entry, "the window must be greater than 0".into()));
        }
        if out.insert(ns.to_string(), ttl).is_some() {
            return Err(bad(entry, "namespace given twice".into()));
        }
    }
    Ok(out)
}

#[derive(Debug, Clone, Args)]
pub struct TlsArgs {
    /// PEM certificate chain; with --tls-key enables TLS on --listen.
    #[arg(long, env = "ONCEGATE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key.
    #[arg(long, env = "ONCEGATE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle; when set, clients must present a certificate it signed (mTLS).
    #[arg(long, env = "ONCEGATE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
}

impl TlsArgs {
    fn files(&self) -> Option<TlsFiles> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return None;
        };
        Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: self.tls_client_ca.clone(),
        })
    }
}

#[derive(Debug, Clone, Args)]
pub struct RelaySettingsArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// Events published per slot and step (one batch; one Kafka transaction).
    #[arg(long, env = "ONCEGATE_RELAY_BATCH", default_value_t = 256)]
    pub relay_batch: i64,
    /// How long a relay's hold on a slot lasts unrenewed (renewed every third of it): a pod
    /// killed or cut off from the database loses its slots to the others after it.
    #[arg(long, env = "ONCEGATE_RELAY_LEASE", default_value = "30s", value_parser = humantime::parse_duration)]
    pub relay_lease: Duration,
    /// Fallback polling interval (Postgres also wakes the relay by LISTEN/NOTIFY).
    #[arg(long, env = "ONCEGATE_RELAY_POLL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub relay_poll: Duration,
    /// Delay before retrying a failed publish (doubles per attempt, at most the lease).
    #[arg(long, env = "ONCEGATE_RELAY_RETRY_BACKOFF", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub relay_retry_backoff: Duration,
    /// Failed publishes before an event is quarantined.
    #[arg(long, env = "ONCEGATE_RELAY_MAX_ATTEMPTS", default_value_t = 10)]
    pub relay_max_attempts: i32,
    /// Slots the outbox is divided into when it has none yet (the first relay creates
    /// them). Each slot is published by one pod at a time, so this bounds how many pods
    /// publish at once; with Kafka each slot a pod holds is a producer (threads of its
    /// own), so keep it modest. Changed later with `oncegate outbox slots --set N`.
    #[arg(long, env = "ONCEGATE_RELAY_SLOTS", default_value_t = 8)]
    pub relay_slots: i32,
    /// How long a slot waits for more events after a batch that was not full (larger
    /// batches, fewer Kafka transactions; events wait at most this much longer).
    #[arg(long, env = "ONCEGATE_RELAY_LINGER", default_value = "20ms", value_parser = humantime::parse_duration)]
    pub relay_linger: Duration,
}

fn parse_sink(s: &str) -> Result<SinkSpec, String> {
    SinkSpec::parse(s)
}

impl RelaySettingsArgs {
    /// The sink to connect; `owner` names the broker connection.
    pub fn sink(&self, owner: &str) -> SinkSettings {
        SinkSettings {
            lease: self.relay_lease,
            ..self.broker.settings(&format!("oncegate-relay {owner}"))
        }
    }

    /// The relay loop's settings; `owner` names the instance it runs in.
    pub fn relay(&self, owner: &str) -> Result<RelaySettings, ConfigError> {
        if self.relay_batch < 1 {
            return Err(ConfigError::new("ONCEGATE_RELAY_BATCH must be at least 1"));
        }
        if self.relay_max_attempts < 1 {
            return Err(ConfigError::new("ONCEGATE_RELAY_MAX_ATTEMPTS must be at least 1"));
        }
        let max = crate::relay::resize::MAX_SLOTS;
        if !(1..=max).contains(&self.relay_slots) {
            return Err(ConfigError(format!(
                "ONCEGATE_RELAY_SLOTS must be 1 to {max}, got {}",
                self.relay_slots
            )));
        }
        if self.relay_lease < Duration::from_secs(1) {
            return Err(ConfigError::new("ONCEGATE_RELAY_LEASE must be at least 1s"));
        }
        Ok(RelaySettings {
            batch: self.relay_batch,
            lease: self.relay_lease,
            poll: self.relay_poll,
            max_attempts: self.relay_max_attempts,
            owner: owner.to_string(),
            retry_backoff: self.relay_retry_backoff,
            slots: self.relay_slots,
            linger: self.relay_linger,
        })
    }
}

#[derive(Debug, Clone, Args)]
pub struct RetentionArgs {
    #[command(flatten)]
    pub windows: RetentionWindowArgs,
    /// Rows per purge transaction.
    #[arg(long, env = "ONCEGATE_PURGE_BATCH", default_value_t = 1000)]
    pub purge_batch: i64,
    /// How often `serve` runs the purge (0s disables it).
    #[arg(long, env = "ONCEGATE_PURGE_INTERVAL", default_value = "1h", value_parser = humantime::parse_duration)]
    pub purge_interval: Duration,
    /// The shortest ONCEGATE_RETENTION allowed on the embedded SQLite store
    /// (default 3 years, 2 CFR 200.334). On Postgres the floor is the
    /// owner's, in the database (`oncegate_retention_floor`).
    #[arg(long, env = "ONCEGATE_RETENTION_FLOOR", value_parser = humantime::parse_duration)]
    pub retention_floor: Option<Duration>,
}

/// The floor when none is configured: three years (2 CFR §200.334).
pub const DEFAULT_RETENTION_FLOOR: Duration = Duration::from_secs(3 * 31_557_600);

impl RetentionArgs {
    /// The policy for a store at `url`, with the floor checked: below it is
    /// a configuration error naming both values (SQLite; Postgres checks its
    /// own floor when the store is reachable).
    pub fn policy_for(&self, url: &str) -> Result<RetentionPolicy, ConfigError> {
        let policy = self.policy()?;
        let sqlite = url.starts_with("sqlite://");
        match self.retention_floor {
            Some(_) if !sqlite => Err(ConfigError::new(
                "ONCEGATE_RETENTION_FLOOR applies to the embedded SQLite store; on Postgres the floor \
                 is the database owner's (UPDATE oncegate_retention_floor)",
            )),
            floor if sqlite => {
                let floor = floor.unwrap_or(DEFAULT_RETENTION_FLOOR);
                if policy.retention < floor {
                    return Err(ConfigError(format!(
                        "ONCEGATE_RETENTION is {}, below the retention floor of {} (2 CFR 200.334); \
                         lower ONCEGATE_RETENTION_FLOOR explicitly if that is intended",
                        humantime::format_duration(policy.retention),
                        humantime::format_duration(floor)
                    )));
                }
                Ok(policy)
            }
            _ => Ok(policy),
        }
    }

    /// The purge's policy, without the floor; the error names the setting
    /// that is wrong.
    pub fn policy(&self) -> Result<RetentionPolicy, ConfigError> {
        let (retention, outbox_retention) = self.windows.check()?;
        if self.purge_batch < 1 {
            return Err(ConfigError::new("ONCEGATE_PURGE_BATCH must be at least 1"));
        }
        Ok(RetentionPolicy {
            retention,
            outbox_retention,
            batch_size: self.purge_batch,
        })
    }
}

/// How reconcile reads the store.
#[derive(Debug, Clone, Args)]
pub struct ReconcileBatchArgs {
    /// Ledger rows per reconcile statement: each batch is one short read,
    /// nothing is locked and no snapshot outlives it.
    #[arg(long, env = "ONCEGATE_RECONCILE_BATCH", default_value_t = 5000)]
    pub reconcile_batch: i64,
}

/// The scheduled reconcile's default: on for Postgres, where a sidecar is
/// one of several writers; off for SQLite.
pub const DEFAULT_RECONCILE_INTERVAL: Duration = Duration::from_secs(3600);

impl ReconcileBatchArgs {
    /// The reconcile settings, with the windows retention may have emptied.
    pub fn settings(
        &self,
        retention: Duration,
        outbox_retention: Duration,
        broker: Option<SinkSettings>,
        examples: usize,
    ) -> Result<ReconcileSettings, ConfigError> {
        if self.reconcile_batch < 1 {
            return Err(ConfigError::new("ONCEGATE_RECONCILE_BATCH must be at least 1"));
        }
        Ok(ReconcileSettings {
            batch: self.reconcile_batch,
            retention,
            outbox_retention,
            examples,
            broker,
        })
    }
}

/// The broker: where the relay publishes, and what `reconcile` reads back.
/// Its own settings come from its room in the registry ([`BrokerOptionArgs`]).
#[derive(Debug, Clone, Args)]
pub struct BrokerArgs {
    #[arg(
        long,
        visible_alias = "sink",
        env = "ONCEGATE_RELAY_SINK",
        default_value = "none",
        value_parser = parse_sink,
        help = "Where outbox events go: `none`, `log` or a broker URL.",
        long_help = crate::broker::sink_help()
    )]
    pub relay_sink: SinkSpec,
    #[command(flatten)]
    pub stream: StreamArgs,
    #[command(flatten)]
    pub options: BrokerOptionArgs,
}

/// Where in the broker events go (also what `audit verify --anchors` reads).
#[derive(Debug, Clone, Args)]
pub struct StreamArgs {
    #[arg(
        long,
        visible_alias = "stream",
        env = "ONCEGATE_RELAY_STREAM",
        default_value = "oncegate-events",
        help = "Where in the broker events go.",
        long_help = crate::broker::stream_help()
    )]
    pub relay_stream: String,
}

impl BrokerArgs {
    /// The broker's settings; `connection_name` names this process's connection.
    pub fn settings(&self, connection_name: &str) -> SinkSettings {
        SinkSettings {
            options: self.options.0.clone(),
            ..SinkSettings::new(
                self.relay_sink.clone(),
                &self.stream.relay_stream,
                connection_name,
            )
        }
    }

    /// The broker to read back; `None` for a sink that keeps no log (`none`,
    /// `log`, AMQP).
    pub fn sink(&self) -> Option<SinkSettings> {
        self.relay_sink
            .broker()
            .is_some_and(|b| b.reader.is_some())
            .then(|| self.settings("oncegate-reconcile"))
    }
}

/// Each broker's own settings ([`crate::broker::Broker::settings`]), declared
/// in its room: a flag and an environment variable each, for every
/// subcommand that takes the broker.
#[derive(Debug, Clone, Default)]
pub struct BrokerOptionArgs(pub BrokerOptions);

impl clap::FromArgMatches for BrokerOptionArgs {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut options = BrokerOptions::default();
        for setting in crate::broker::own_settings() {
            if let Some(value) = matches.get_one::<String>(setting.env) {
                options.set(setting, value.clone());
            }
        }
        Ok(Self(options))
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl clap::Args for BrokerOptionArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        crate::broker::own_settings().fold(cmd, |cmd, setting| {
            let check = setting.check;
            cmd.arg(
                clap::Arg::new(setting.env)
                    .long(setting.flag)
                    .visible_aliases(setting.aliases)
                    .env(setting.env)
                    .default_value(setting.default)
                    .help(setting.help)
                    .value_parser(move |value: &str| check(value).map(|()| value.to_string())),
            )
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// How long claims, audit rows and published events are kept: what the
/// purge removes, and what `reconcile` allows for.
#[derive(Debug, Clone, Args)]
pub struct RetentionWindowArgs {
    /// How long claims and audit rows are kept (2 CFR 200.334: three years).
    /// `reconcile`: a ledger row older than this may have lost its claim to
    /// the purge.
    #[arg(long, env = "ONCEGATE_RETENTION", default_value = "3years", value_parser = humantime::parse_duration)]
    pub retention: Duration,
    /// How long published outbox rows are kept. `reconcile`: a ledger row
    /// older than this may have lost its published event to the cleanup.
    #[arg(long, env = "ONCEGATE_OUTBOX_RETENTION", default_value = "7days", value_parser = humantime::parse_duration)]
    pub outbox_retention: Duration,
}

impl RetentionWindowArgs {
    pub fn check(&self) -> Result<(Duration, Duration), ConfigError> {
        if self.retention.is_zero() {
            return Err(ConfigError::new("ONCEGATE_RETENTION must be greater than 0"));
        }
        if self.outbox_retention.is_zero() {
            return Err(ConfigError::new(
                "ONCEGATE_OUTBOX_RETENTION must be greater than 0",
            ));
        }
        Ok((self.retention, self.outbox_retention))
    }
}

/// How a sealing run behaves (`serve` and `oncegate audit seal`).
#[derive(Debug, Clone, Args)]
pub struct SealArgs {
    /// How long a seal waits for open transactions that may still add audit
    /// rows below its boundary (Postgres); past it that run seals nothing.
    #[arg(long, env = "ONCEGATE_AUDIT_SEAL_WAIT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub audit_seal_wait: Duration,
    /// Most audit rows one seal covers (a run makes as many seals as it needs).
    #[arg(long, env = "ONCEGATE_AUDIT_SEAL_MAX_ROWS", default_value_t = 50_000)]
    pub audit_seal_max_rows: i64,
    /// Ed25519 private key (PKCS#8 PEM, from `oncegate audit keygen`): every
    /// seal then carries a signature over its digest and the key's id.
    #[arg(long, env = "ONCEGATE_AUDIT_SIGNING_KEY_FILE")]
    pub audit_signing_key_file: Option<std::path::PathBuf>,
    /// Every seal is also appended to this file as one JSON line (number,
    /// ids, time, digest, signature, key id) and synced before the seal is
    /// reported: put it on a volume the database owner cannot rewrite, for
    /// `oncegate audit verify --anchors`.
    #[arg(long, env = "ONCEGATE_AUDIT_ANCHOR_FILE")]
    pub audit_anchor_file: Option<std::path::PathBuf>,
}

impl SealArgs {
    /// The sealing settings; `instance` is written into each seal.
    pub fn settings(&self, instance: Arc<str>) -> Result<SealSettings, ConfigError> {
        if !(1..=10_000_000).contains(&self.audit_seal_max_rows) {
            return Err(ConfigError::new(
                "ONCEGATE_AUDIT_SEAL_MAX_ROWS must be between 1 and 10000000",
            ));
        }
        let signer = match &self.audit_signing_key_file {
            Some(path) => Some(Arc::new(crate::seal::signing::SealSigner::load(path).map_err(
                |e| ConfigError::new(format!("ONCEGATE_AUDIT_SIGNING_KEY_FILE: {e}")),
            )?)),
            None => None,
        };
        let anchors = match &self.audit_anchor_file {
            Some(path) => Some(Arc::new(
                crate::seal::anchor::AnchorFile::open(path)
                    .map_err(|e| ConfigError::new(format!("ONCEGATE_AUDIT_ANCHOR_FILE: {e}")))?,
            )),
            None => None,
        };
        Ok(SealSettings {
            signer,
            anchors,
            wait: self.audit_seal_wait,
            max_rows: self.audit_seal_max_rows,
            instance,
        })
    }
}

/// When `serve` seals and verifies the audit trail.
#[derive(Debug, Clone, Args)]
pub struct SealServeArgs {
    /// How often `serve` seals the new audit rows into the hash chain, and
    /// once more on shutdown (0s disables sealing in `serve`).
    #[arg(long, env = "ONCEGATE_AUDIT_SEAL_INTERVAL", default_value = "1m", value_parser = humantime::parse_duration)]
    pub audit_seal_interval: Duration,
    /// How often `serve` verifies the whole chain and sets
    /// oncegate_audit_verify_mismatches (0s disables it).
    #[arg(long, env = "ONCEGATE_AUDIT_VERIFY_INTERVAL", default_value = "24h", value_parser = humantime::parse_duration)]
    pub audit_verify_interval: Duration,
    #[command(flatten)]
    pub seal: SealArgs,
}

impl SealServeArgs {
    pub fn schedule(&self, instance: Arc<str>) -> Result<SealSchedule, ConfigError> {
        Ok(SealSchedule {
            settings: self.seal.settings(instance)?,
            interval: self.audit_seal_interval,
            verify_interval: self.audit_verify_interval,
        })
    }
}

/// The time range of `oncegate audit verify` and `export`.
#[derive(Debug, Clone, Args)]
pub struct TimeRangeArgs {
    /// Only seals holding rows from this time on (RFC 3339, a date
    /// `2026-11-01` or a month `2026-11`, UTC).
    #[arg(long, value_parser = parse_instant)]
    pub from: Option<time::OffsetDateTime>,
    /// Only seals holding rows from before this time (same forms).
    #[arg(long, value_parser = parse_instant)]
    pub to: Option<time::OffsetDateTime>,
}

impl TimeRangeArgs {
    pub fn range(&self) -> Result<TimeRange, ConfigError> {
        if matches!((self.from, self.to), (Some(from), Some(to)) if from >= to) {
            return Err(ConfigError::new("--from must be before --to"));
        }
        Ok(TimeRange {
            from: self.from,
            to: self.to,
        })
    }
}

/// An RFC 3339 date-time, a date (its midnight, UTC) or a month (its first
/// day).
fn parse_instant(s: &str) -> Result<time::OffsetDateTime, String> {
    use time::format_description::well_known::Rfc3339;
    if let Ok(t) = time::OffsetDateTime::parse(s, &Rfc3339) {
        return Ok(t);
    }
    let day = if s.len() == 7 {
        format!("{s}-01")
    } else {
        s.to_string()
    };
    let format = time::macros::format_description!("[year]-[month]-[day]");
    time::Date::parse(&day, format)
        .map(|d| d.midnight().assume_utc())
        .map_err(|_| format!("{s:?} is not an RFC 3339 time, a date YYYY-MM-DD or a month YYYY-MM"))
}

/// The host name, for the default instance id.
pub fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("oncegate-{}", std::process::id()))
}

fn at_least_one(value: usize, name: &str) -> Result<(), ConfigError> {
    if value == 0 {
        return Err(ConfigError(format!("{name} must be at least 1")));
    }
    Ok(())
}

impl ServeArgs {
    /// Everything `serve` runs with, checked.
    pub fn app_config(&self) -> Result<AppConfig, ConfigError> {
        self.check_limits()?;
        let instance: Arc<str> = self.instance.id().into();
        let store = self.store_settings()?;
        let retention = self.retention.policy_for(&store.url)?;
        Ok(AppConfig {
            reconcile: self.reconcile_settings(&retention, &instance)?,
            reconcile_interval: self.reconcile_interval(&store.url),
            retention,
            require_least_privilege: self.require_least_privilege,
            require_sync_replica: self.require_sync_replica,
            store,
            migrate_on_start: self.migrate_on_start,
            startup_timeout: self.startup_timeout,
            primary_probe: self.probe_settings()?,
            listen: self.listen,
            health_listen: self.health_listen,
            metrics_listen: self.metrics.metrics_listen,
            tls: self.tls.files(),
            shutdown_grace: self.shutdown_grace,
            cache: CacheSettings {
                capacity_bytes: self.l1_capacity_bytes,
                ttl: self.l1_ttl,
            },
            redis: self.redis_settings()?,
            group_commit: GroupCommitSettings {
                max_batch: self.group_commit_max_batch,
                max_wait: self.group_commit_max_wait,
                workers: self.group_commit_workers,
            },
            audit: AuditSettings {
                queue: self.audit_queue.max(1),
                batch: 500,
                flush_interval: self.audit_flush_interval,
                spool_dir: self.audit_spool_dir.clone(),
            },
            sink: self.relay.sink(&instance),
            relay: self.relay.relay(&instance)?,
            purge_interval: self.retention.purge_interval,
            seal: self.audit_seal.schedule(instance.clone())?,
            limits: Limits {
                max_payload_bytes: self.max_payload_bytes,
            },
            server: ServerLimits {
                max_in_flight: self.max_in_flight,
                max_batch_items: self.max_batch_items,
                max_message_bytes: self.max_message_bytes,
            },
            effects: self.effects.settings(self.l1_ttl)?,
            instance,
        })
    }

    /// The store's settings as `serve` uses them, checked: least privilege,
    /// the synchronous standby, the pooler.
    fn store_settings(&self) -> Result<StoreSettings, ConfigError> {
        let mut store = self.store.settings(u32::MAX)?;
        store.require_sync_standby = self.require_sync_replica;
        store.pooler = match self.db_pooler {
            DbPooler::None => Pooler::None,
            DbPooler::Transaction => Pooler::Transaction,
        };
        self.check_least_privilege(&store)?;
        self.check_sync_replica(&store)?;
        self.check_pooler(&store)?;
        Ok(store)
    }

    /// The identity probe's interval and timeout, each above zero.
    fn probe_settings(&self) -> Result<ProbeSettings, ConfigError> {
        Ok(ProbeSettings {
            interval: positive(self.primary_probe_interval, "ONCEGATE_PRIMARY_PROBE_INTERVAL")?,
            timeout: positive(self.primary_probe_timeout, "ONCEGATE_PRIMARY_PROBE_TIMEOUT")?,
        })
    }

    /// The numeric limits: each at least one, and a payload that fits a message.
    fn check_limits(&self) -> Result<(), ConfigError> {
        at_least_one(self.group_commit_max_batch, "ONCEGATE_GROUP_COMMIT_MAX_BATCH")?;
        at_least_one(self.group_commit_workers, "ONCEGATE_GROUP_COMMIT_WORKERS")?;
        at_least_one(self.max_in_flight, "ONCEGATE_MAX_IN_FLIGHT")?;
        at_least_one(self.max_batch_items, "ONCEGATE_MAX_BATCH_ITEMS")?;
        if self.max_payload_bytes > self.max_message_bytes {
            return Err(ConfigError::new(
                "ONCEGATE_MAX_PAYLOAD_BYTES must not exceed ONCEGATE_MAX_MESSAGE_BYTES",
            ));
        }
        Ok(())
    }

    /// `ONCEGATE_DB_POOLER=transaction`: Postgres only, and nothing on that
    /// needs a session of its own (advisory locks held across statements,
    /// LISTEN, migrations), each named with the setting that turns it off.
    fn check_pooler(&self, store: &StoreSettings) -> Result<(), ConfigError> {
        if store.pooler != Pooler::Transaction {
            return Ok(());
        }
        if store.url.starts_with("sqlite://") {
            return Err(ConfigError::new(
                "ONCEGATE_DB_POOLER=transaction needs Postgres (DATABASE_URL): the embedded SQLite file has no pooler",
            ));
        }
        let mut on = Vec::new();
        if self.migrate_on_start {
            on.push("migrations at start (ONCEGATE_MIGRATE_ON_START=false; run oncegate migrate against the server)");
        }
        if self.relay.broker.relay_sink != SinkSpec::None {
            on.push("the outbox relay (ONCEGATE_RELAY_SINK=none; run oncegate relay)");
        }
        if !self.retention.purge_interval.is_zero() {
            on.push("the retention purge (ONCEGATE_PURGE_INTERVAL=0s; run oncegate purge)");
        }
        if !self.reconcile_interval(&store.url).is_zero() {
            on.push("reconciliation (ONCEGATE_RECONCILE_INTERVAL=0s; run oncegate reconcile)");
        }
        if !self.audit_seal.audit_seal_interval.is_zero() {
            on.push("audit sealing (ONCEGATE_AUDIT_SEAL_INTERVAL=0s; run oncegate audit seal)");
        }
        if !self.audit_seal.audit_verify_interval.is_zero() {
            on.push("audit verification (ONCEGATE_AUDIT_VERIFY_INTERVAL=0s; run oncegate audit verify)");
        }
        if on.is_empty() {
            return Ok(());
        }
        Err(ConfigError(format!(
            "ONCEGATE_DB_POOLER=transaction: these need a database session of their own, which a \
             transaction pooler does not keep; run them where DATABASE_URL reaches the server, and switch \
             them off here: {}",
            on.join("; ")
        )))
    }

    /// `ONCEGATE_REQUIRE_SYNC_REPLICA` asks for a standby only Postgres has.
    fn check_sync_replica(&self, store: &StoreSettings) -> Result<(), ConfigError> {
        if self.require_sync_replica && store.url.starts_with("sqlite://") {
            return Err(ConfigError::new(
                "ONCEGATE_REQUIRE_SYNC_REPLICA needs Postgres (DATABASE_URL): the embedded SQLite \
                 file has no standby",
            ));
        }
        Ok(())
    }

    /// The scheduled reconcile: this sidecar's retention windows and broker.
    fn reconcile_settings(
        &self,
        retention: &RetentionPolicy,
        instance: &str,
    ) -> Result<ReconcileSettings, ConfigError> {
        let broker = Some(self.relay.sink(instance));
        self.reconcile
            .settings(retention.retention, retention.outbox_retention, broker, 5)
    }

    /// `ONCEGATE_RECONCILE_INTERVAL`, or the store's default; zero: off.
    fn reconcile_interval(&self, store_url: &str) -> Duration {
        match self.reconcile_interval {
            Some(interval) => interval,
            None if store_url.starts_with("sqlite://") => Duration::ZERO,
            None => DEFAULT_RECONCILE_INTERVAL,
        }
    }

    /// Least privilege is a Postgres matter, and migrations need the owner.
    fn check_least_privilege(&self, store: &StoreSettings) -> Result<(), ConfigError> {
        if !self.require_least_privilege {
            return Ok(());
        }
        if store.url.starts_with("sqlite://") {
            return Err(ConfigError::new(
                "ONCEGATE_REQUIRE_LEAST_PRIVILEGE needs Postgres (DATABASE_URL): the embedded SQLite \
                 file has no roles",
            ));
        }
        if self.migrate_on_start {
            return Err(ConfigError::new(
                "ONCEGATE_REQUIRE_LEAST_PRIVILEGE with ONCEGATE_MIGRATE_ON_START=true: migrations need \
                 the schema owner; run `oncegate migrate` as the owner and set ONCEGATE_MIGRATE_ON_START=false",
            ));
        }
        Ok(())
    }

    fn redis_settings(&self) -> Result<Option<RedisSettings>, ConfigError> {
        let Some(url) = self.redis_url.as_deref().filter(|u| !u.is_empty()) else {
            return Ok(None);
        };
        if self.redis_timeout.is_zero() {
            return Err(ConfigError::new("ONCEGATE_REDIS_TIMEOUT must be greater than 0"));
        }
        Ok(Some(RedisSettings {
            url: url.to_string(),
            key_prefix: self.redis_key_prefix.clone(),
            timeout: self.redis_timeout,
            lease_ttl: self.redis_lease_ttl,
            dedup_ttl: self.redis_dedup_ttl,
            breaker_threshold: self.redis_breaker_threshold,
            breaker_cooldown: self.redis_breaker_cooldown,
        }))
    }

    /// The effective configuration, secrets masked, for the start-up log.
    pub fn describe(&self) -> String {
        let off = || "off".to_string();
        format!(
            "store={} redis={} listen={} health_listen={} metrics_listen={} tls={} mtls={} \
             l1_bytes={} l1_ttl={:?} group_commit_max_batch={} group_commit_workers={} \
             max_in_flight={} relay_sink={} retention={} pool={} effects_cache_ttl={} \
             effects_namespace_ttl={:?} reconcile_interval={} audit_seal_interval={}",
            mask_url(&self.store.url()),
            self.redis_url.as_deref().map(mask_url).unwrap_or_else(off),
            self.listen,
            self.health_listen.map(|a| a.to_string()).unwrap_or_else(off),
            self.metrics.metrics_listen,
            self.tls.tls_cert.is_some(),
            self.tls.tls_client_ca.is_some(),
            self.l1_capacity_bytes,
            self.l1_ttl,
            self.group_commit_max_batch,
            self.group_commit_workers,
            self.max_in_flight,
            self.relay.broker.relay_sink,
            humantime::format_duration(self.retention.windows.retention),
            self.store.db_pool_size,
            humantime::format_duration(self.effects.effects_cache_ttl),
            self.effects.effects_namespace_ttl,
            humantime::format_duration(self.reconcile_interval(&self.store.url())),
            humantime::format_duration(self.audit_seal.audit_seal_interval),
        )
    }
}

/// A period that must not be zero (it would spin, or switch a guard off).
fn positive(value: Duration, name: &str) -> Result<Duration, ConfigError> {
    if value < Duration::from_millis(10) {
        return Err(ConfigError(format!("{name} must be at least 10ms")));
    }
    Ok(value)
}
