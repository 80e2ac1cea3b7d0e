//! Command line and environment: parsed once, before any port is bound.
//! Invalid configuration exits with code 64 and names the setting.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Exit code for invalid configuration (EX_USAGE).
pub const EXIT_CONFIG: i32 = 64;

#[derive(Debug, Parser)]
#[command(
    name = "oncegate",
    version,
    about = "Exactly-once effect for message consumers: a gRPC sidecar"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the sidecar: gRPC, metrics, outbox relay, retention purge.
    Serve(Box<ServeArgs>),
    /// Apply the database migrations and exit.
    Migrate(StoreArgs),
    /// Print the idempotency key of a submission (parity check with other languages).
    Key(KeyArgs),
    /// Send one submission to a running sidecar and print the decision.
    Submit(SubmitArgs),
    /// Look up the stored result of a key on a running sidecar.
    Lookup(LookupArgs),
    /// Load generator: drive a running sidecar, report throughput and latency, check the ledger.
    Bench(Box<crate::bench::BenchArgs>),
    /// Run the retention purge once and exit.
    Purge(PurgeArgs),
    /// Run the outbox relay alone (no gRPC).
    Relay(RelayArgs),
}

/// Where the authoritative store is.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// Postgres URL (`postgres://…`) or `sqlite://path`. Unset: the embedded SQLite file.
    #[arg(long, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// The embedded SQLite file, used when DATABASE_URL is unset.
    #[arg(long, env = "ONCEGATE_SQLITE_PATH", default_value = "oncegate.db")]
    pub sqlite_path: PathBuf,
    /// Database connections per instance.
    #[arg(long, env = "ONCEGATE_DB_POOL_SIZE", default_value_t = 16)]
    pub db_pool_size: u32,
}

impl StoreArgs {
    /// The store URL: DATABASE_URL, or the SQLite file.
    pub fn url(&self) -> String {
        match &self.database_url {
            Some(u) if !u.is_empty() => u.clone(),
            _ => format!("sqlite://{}", self.sqlite_path.display()),
        }
    }
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
    /// Prometheus metrics listen address (`/metrics`).
    #[arg(long, env = "ONCEGATE_METRICS_LISTEN", default_value = "127.0.0.1:9464")]
    pub metrics_listen: SocketAddr,
    /// Apply migrations at start (disable when a migration Job does it).
    #[arg(long, env = "ONCEGATE_MIGRATE_ON_START", default_value_t = true, action = clap::ArgAction::Set)]
    pub migrate_on_start: bool,
    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, env = "ONCEGATE_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Written to audit rows (default: the host name).
    #[arg(long, env = "ONCEGATE_INSTANCE_ID")]
    pub instance_id: Option<String>,
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
    /// How long a group-commit worker lingers for more deliveries.
    #[arg(long, env = "ONCEGATE_GROUP_COMMIT_MAX_WAIT", default_value = "0ms", value_parser = humantime::parse_duration)]
    pub group_commit_max_wait: Duration,
    /// Concurrent group-commit transactions. Two: concurrent batches lock
    /// overlapping award balances and queue behind each other's commit, so
    /// more workers only make smaller batches and more commits (measured in
    /// docs/BENCHMARKS.md).
    #[arg(long, env = "ONCEGATE_GROUP_COMMIT_WORKERS", default_value_t = 2)]
    pub group_commit_workers: usize,

    /// Audit queue bound (duplicates answered by caches, rejections).
    #[arg(long, env = "ONCEGATE_AUDIT_QUEUE", default_value_t = 65_536)]
    pub audit_queue: usize,
    /// Audit flush interval.
    #[arg(long, env = "ONCEGATE_AUDIT_FLUSH_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub audit_flush_interval: Duration,

    #[command(flatten)]
    pub relay: RelaySettingsArgs,
    #[command(flatten)]
    pub retention: RetentionArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
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

#[derive(Debug, Clone, Args)]
pub struct RelaySettingsArgs {
    /// Where outbox events go: `none`, `log`, `redis://…` (Streams) or `nats://…` (JetStream).
    #[arg(long, env = "ONCEGATE_RELAY_SINK", default_value = "none")]
    pub relay_sink: String,
    /// Redis stream key, or JetStream stream name.
    #[arg(long, env = "ONCEGATE_RELAY_STREAM", default_value = "oncegate-events")]
    pub relay_stream: String,
    /// JetStream subject events are published on (and the stream captures).
    #[arg(long, env = "ONCEGATE_RELAY_SUBJECT", default_value = "oncegate.events")]
    pub relay_subject: String,
    /// Approximate maximum length of the Redis stream (XADD MAXLEN ~).
    #[arg(long, env = "ONCEGATE_RELAY_STREAM_MAXLEN", default_value_t = 1_000_000)]
    pub relay_stream_maxlen: u64,
    /// Events leased per relay step.
    #[arg(long, env = "ONCEGATE_RELAY_BATCH", default_value_t = 256)]
    pub relay_batch: i64,
    /// How long a leased event is reserved; a crashed relay's events are retried after it.
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
}

#[derive(Debug, Clone, Args)]
pub struct RetentionArgs {
    /// How long claims and audit rows are kept (2 CFR 200.334: three years).
    #[arg(long, env = "ONCEGATE_RETENTION", default_value = "3years", value_parser = humantime::parse_duration)]
    pub retention: Duration,
    /// How long published outbox rows are kept.
    #[arg(long, env = "ONCEGATE_OUTBOX_RETENTION", default_value = "7days", value_parser = humantime::parse_duration)]
    pub outbox_retention: Duration,
    /// Rows per purge transaction.
    #[arg(long, env = "ONCEGATE_PURGE_BATCH", default_value_t = 1000)]
    pub purge_batch: i64,
    /// How often `serve` runs the purge (0s disables it).
    #[arg(long, env = "ONCEGATE_PURGE_INTERVAL", default_value = "1h", value_parser = humantime::parse_duration)]
    pub purge_interval: Duration,
}

impl RetentionArgs {
    /// Checks the settings; the error names the one that is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.retention.is_zero() {
            return Err("ONCEGATE_RETENTION must be greater than 0".into());
        }
        if self.outbox_retention.is_zero() {
            return Err("ONCEGATE_OUTBOX_RETENTION must be greater than 0".into());
        }
        if self.purge_batch < 1 {
            return Err("ONCEGATE_PURGE_BATCH must be at least 1".into());
        }
        Ok(())
    }

    pub fn policy(&self) -> crate::store::RetentionPolicy {
        crate::store::RetentionPolicy {
            retention: self.retention,
            outbox_retention: self.outbox_retention,
            batch_size: self.purge_batch.max(1),
        }
    }
}

#[derive(Debug, Clone, Args)]
pub struct PurgeArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub retention: RetentionArgs,
}

#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub relay: RelaySettingsArgs,
    /// Prometheus metrics listen address.
    #[arg(long, env = "ONCEGATE_METRICS_LISTEN", default_value = "127.0.0.1:9465")]
    pub metrics_listen: SocketAddr,
}

#[derive(Debug, Clone, Args)]
pub struct KeyArgs {
    #[arg(long, required_unless_present = "jsonl")]
    pub award_id: Option<String>,
    /// RFC 3339, used verbatim.
    #[arg(long, required_unless_present = "jsonl")]
    pub timestamp: Option<String>,
    /// Payload file; standard input when absent.
    #[arg(long)]
    pub payload_file: Option<PathBuf>,
    /// Read JSON lines {"award_id", "submission_timestamp", "payload_b64"} from stdin; print one key per line.
    #[arg(long, conflicts_with_all = ["award_id", "timestamp", "payload_file"])]
    pub jsonl: bool,
}

#[derive(Debug, Clone, Args)]
pub struct SubmitArgs {
    /// The sidecar's address.
    #[arg(long, env = "ONCEGATE_TARGET", default_value = "http://127.0.0.1:50051")]
    pub target: String,
    #[arg(long)]
    pub award_id: String,
    /// RFC 3339 (default: now).
    #[arg(long)]
    pub timestamp: Option<String>,
    #[arg(long)]
    pub amount_cents: i64,
    /// Payload text.
    #[arg(long, conflicts_with = "payload_file")]
    pub payload: Option<String>,
    #[arg(long)]
    pub payload_file: Option<PathBuf>,
    /// Producer-supplied key (instead of the derived one).
    #[arg(long)]
    pub idempotency_key: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct LookupArgs {
    #[arg(long, env = "ONCEGATE_TARGET", default_value = "http://127.0.0.1:50051")]
    pub target: String,
    pub idempotency_key: String,
}

/// A URL with its password replaced by `***`, for logs and errors.
pub fn mask_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
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

impl ServeArgs {
    /// Checks what clap cannot; the error names the setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.group_commit_max_batch == 0 {
            return Err("ONCEGATE_GROUP_COMMIT_MAX_BATCH must be at least 1".into());
        }
        if self.max_in_flight == 0 {
            return Err("ONCEGATE_MAX_IN_FLIGHT must be at least 1".into());
        }
        if self.store.db_pool_size == 0 {
            return Err("ONCEGATE_DB_POOL_SIZE must be at least 1".into());
        }
        if self.max_payload_bytes > self.max_message_bytes {
            return Err("ONCEGATE_MAX_PAYLOAD_BYTES must not exceed ONCEGATE_MAX_MESSAGE_BYTES".into());
        }
        if self.redis_timeout.is_zero() {
            return Err("ONCEGATE_REDIS_TIMEOUT must be greater than 0".into());
        }
        self.retention.validate()?;
        crate::relay::SinkSpec::parse(&self.relay.relay_sink).map(|_| ())?;
        if let Some(url) = &self.store.database_url
            && !url.is_empty()
            && !(url.starts_with("postgres://")
                || url.starts_with("postgresql://")
                || url.starts_with("sqlite://"))
        {
            return Err(format!(
                "DATABASE_URL must start with postgres:// or sqlite://, got {:?}",
                mask_url(url)
            ));
        }
        Ok(())
    }

    /// The effective configuration, secrets masked, for the start-up log.
    pub fn describe(&self) -> String {
        format!(
            "store={} redis={} listen={} health_listen={} metrics_listen={} tls={} mtls={} \
             l1_bytes={} l1_ttl={:?} group_commit_max_batch={} group_commit_workers={} \
             max_in_flight={} relay_sink={} retention={} pool={}",
            mask_url(&self.store.url()),
            self.redis_url
                .as_deref()
                .map(mask_url)
                .unwrap_or_else(|| "off".into()),
            self.listen,
            self.health_listen
                .map(|a| a.to_string())
                .unwrap_or_else(|| "off".into()),
            self.metrics_listen,
            self.tls.tls_cert.is_some(),
            self.tls.tls_client_ca.is_some(),
            self.l1_capacity_bytes,
            self.l1_ttl,
            self.group_commit_max_batch,
            self.group_commit_workers,
            self.max_in_flight,
            mask_url(&self.relay.relay_sink),
            humantime::format_duration(self.retention.retention),
            self.store.db_pool_size,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked() {
        assert_eq!(
            mask_url("postgres://app:s3cret@db:5432/x"),
            "postgres://app:***@db:5432/x"
        );
        assert_eq!(mask_url("redis://cache:6379"), "redis://cache:6379");
        assert_eq!(mask_url("redis://:pw@cache:6379"), "redis://:***@cache:6379");
    }

    #[test]
    fn defaults_bind_loopback() {
        let cli = Cli::try_parse_from(["oncegate", "serve"]).unwrap();
        let Command::Serve(args) = cli.command else {
            panic!()
        };
        assert!(args.listen.ip().is_loopback());
        assert!(args.metrics_listen.ip().is_loopback());
        assert_eq!(
            args.retention.retention,
            humantime::parse_duration("3years").unwrap()
        );
    }
}
