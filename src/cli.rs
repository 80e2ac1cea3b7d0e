//! The command tree: each subcommand's arguments, resolved into settings
//! once ([`Command::resolve`], exit 64 on a bad one), then run ([`run`]).
//!
//! - `serve`, `migrate`, `purge`, `relay`: here;
//! - `key`: here; `submit`, `lookup` (calls to a running sidecar): [`remote`];
//! - `effect begin|complete|release|get` (DESIGN §9 records): [`effect`];
//! - `bench` (the load generator and its echo yardstick): [`bench`];
//! - `reconcile`, `inspect`, `outbox list|retry` (the operator's): [`ops`].
//! - `audit seal`, `audit verify`, `audit export` (the sealed trail): [`audit`].
//! - `console` (the read-only web console): [`console`].

/// `println!` that hands the write's error back (as a [`StdoutError`])
/// instead of panicking: a closed stdout (`oncegate … | head -1`) ends the
/// command through `main`, quietly (see [`is_closed_pipe`]).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*).map_err($crate::cli::StdoutError)
    }};
}

/// `print!` as [`out!`] is `println!`.
macro_rules! out_text {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        write!(std::io::stdout().lock(), $($arg)*).map_err($crate::cli::StdoutError)
    }};
}

pub mod audit;
pub mod bench;
pub mod console;
pub mod effect;
pub mod ops;
pub mod remote;

use crate::app::{App, AppConfig};
use crate::broker::SinkSettings;
use crate::config::deprecated::{self, Deprecated};
use crate::config::reference;
use crate::config::{
    InstanceArgs, LogFormat, MetricsArgs, RelaySettingsArgs, RetentionArgs, ServeArgs, StoreArgs,
};
use crate::error::ConfigError;
use crate::relay::{Relay, RelaySettings};
use crate::retention::Retention;
use crate::secret::mask_url;
use crate::shutdown::{Phase, Shutdown, Tasks};
use crate::store::{RetentionPolicy, StoreSettings};
use anyhow::{Context, bail};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use std::io::{BufRead, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// Connections a one-shot tool opens at most.
const TOOL_POOL: u32 = 4;

/// Connections of `oncegate relay`: each held slot publishes on its own.
const RELAY_POOL: u32 = 10;

/// What `oncegate --version` prints after the name: the crate's version and the git commit
/// the binary was built from (build.rs: `ONCEGATE_BUILD_COMMIT` when set, "unknown" without
/// git), e.g. `1.0.0 (commit 24a3062f5b1c)`.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("ONCEGATE_BUILD_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "oncegate",
    version = VERSION,
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
    /// Apply the database migrations (as the schema owner) and exit.
    Migrate(MigrateArgs),
    /// Print the idempotency key of a submission (parity check with other languages).
    Key(KeyArgs),
    /// Send one submission to a running sidecar and print the decision.
    Submit(remote::SubmitArgs),
    /// Look up the stored result of a key on a running sidecar.
    Lookup(remote::LookupArgs),
    /// Effects outside the ledger: begin, complete or release a record on a running sidecar, or get it from the store.
    Effect(effect::EffectArgs),
    /// Load generator: drive a running sidecar, report throughput and latency, check the ledger.
    Bench(Box<bench::BenchArgs>),
    /// Run the retention purge once and exit.
    Purge(PurgeArgs),
    /// Run the outbox relay alone (no gRPC).
    Relay(RelayArgs),
    /// Check that claims, ledger, running totals, sequences, outbox events (and
    /// the broker, with --sink) agree; exit 1 on any mismatch.
    Reconcile(Box<ops::ReconcileArgs>),
    /// Show a key's claim, ledger row, outbox event and audit history (or an award's).
    Inspect(ops::InspectArgs),
    /// List the outbox events waiting or quarantined; put quarantined ones back.
    Outbox(ops::OutboxArgs),
    /// The sealed audit trail: seal, verify, export.
    Audit(audit::AuditArgs),
    /// The read-only web console: find, a delivery's history, an award, the relay, the trail.
    Console(Box<console::ConsoleArgs>),
    /// The configuration: `config reference` prints every setting (the
    /// generated docs/CONFIGURATION.md).
    Config(ConfigArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub command: ConfigCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum ConfigCommand {
    /// Print the configuration reference as Markdown: every environment
    /// variable, its flag, its default, the subcommands that take it, its
    /// help, and the deprecated settings still accepted.
    Reference,
}

impl Cli {
    /// Parses `args` and the environment (`lookup`), and names the
    /// deprecated settings set there that the chosen subcommand reads the
    /// successor of ([`crate::config::deprecated`]), for a WARN each.
    pub fn parse_from_env(
        args: impl IntoIterator<Item = std::ffi::OsString>,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<(Self, Vec<&'static Deprecated>), clap::Error> {
        let mut command = Self::command();
        let matches = command.try_get_matches_from_mut(args)?;
        let cli = Self::from_arg_matches(&matches).map_err(|e| e.format(&mut command))?;
        let (mut leaf, mut at) = (&command, &matches);
        while let Some((name, sub)) = at.subcommand() {
            let Some(found) = leaf.find_subcommand(name) else {
                break;
            };
            (leaf, at) = (found, sub);
        }
        let reads = |env: &str| {
            leaf.get_arguments()
                .any(|a| a.get_env().is_some_and(|e| e == env))
        };
        Ok((cli, deprecated::set_in(lookup, reads)))
    }
}

#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// After migrating, grant this existing Postgres role exactly the
    /// application role's privileges (migrations/GRANTS.md).
    #[arg(long, env = "ONCEGATE_APP_ROLE")]
    pub app_role: Option<String>,
    /// After migrating, grant this existing Postgres role exactly the
    /// console's privileges: reading, nothing else (migrations/GRANTS.md).
    #[arg(long, env = "ONCEGATE_CONSOLE_ROLE")]
    pub console_role: Option<String>,
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
    #[command(flatten)]
    pub metrics: MetricsArgs,
    #[command(flatten)]
    pub instance: InstanceArgs,
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

/// A subcommand with its settings resolved and checked.
pub enum Job {
    Serve {
        config: Box<AppConfig>,
        /// The effective configuration, secrets masked, for the start-up log.
        described: String,
    },
    Migrate {
        store: StoreSettings,
        app_role: Option<String>,
        console_role: Option<String>,
    },
    Key(KeyArgs),
    Submit(remote::SubmitArgs),
    Lookup(remote::LookupArgs),
    Effect(effect::EffectJob),
    Bench(Box<bench::BenchArgs>),
    Purge(StoreSettings, RetentionPolicy),
    Relay {
        store: StoreSettings,
        sink: SinkSettings,
        relay: RelaySettings,
        metrics_listen: SocketAddr,
    },
    Ops(ops::OpsJob),
    Audit(audit::AuditJob),
    /// The configuration reference, to print.
    Reference(String),
    Console(Box<console::ConsoleJob>),
}

impl Command {
    /// Log format for this subcommand.
    pub fn log_format(&self) -> LogFormat {
        match self {
            Self::Serve(a) => a.log_format,
            _ => LogFormat::Text,
        }
    }

    /// The runtime's worker threads: `ONCEGATE_WORKER_THREADS` for serve
    /// (one: the single-threaded runtime); `None`, one per CPU, otherwise.
    pub fn worker_threads(&self) -> Option<usize> {
        match self {
            Self::Serve(a) => Some(a.worker_threads.into()),
            _ => None,
        }
    }

    /// Default log level: long-running commands report what they do.
    pub fn default_log_level(&self) -> &'static str {
        match self {
            Self::Serve(_) | Self::Relay(_) | Self::Purge(_) | Self::Migrate(_) | Self::Console(_) => "info",
            _ => "warn",
        }
    }

    /// Checks every setting and builds the components' settings.
    pub fn resolve(self) -> Result<Job, ConfigError> {
        Ok(match self {
            Self::Serve(args) => Job::Serve {
                config: Box::new(args.app_config()?),
                described: args.describe(),
            },
            Self::Migrate(args) => {
                let store = args.store.settings(TOOL_POOL)?;
                let app_role = args.app_role.filter(|r| !r.is_empty());
                let console_role = args.console_role.filter(|r| !r.is_empty());
                if app_role.is_some() && store.url.starts_with("sqlite://") {
                    return Err(ConfigError::new(
                        "ONCEGATE_APP_ROLE needs Postgres (DATABASE_URL): the embedded SQLite file has no roles",
                    ));
                }
                if console_role.is_some() && store.url.starts_with("sqlite://") {
                    return Err(ConfigError::new(
                        "ONCEGATE_CONSOLE_ROLE needs Postgres (DATABASE_URL): the embedded SQLite file has no roles",
                    ));
                }
                Job::Migrate {
                    store,
                    app_role,
                    console_role,
                }
            }
            Self::Key(args) => Job::Key(args),
            Self::Submit(args) => Job::Submit(args),
            Self::Lookup(args) => Job::Lookup(args),
            Self::Effect(args) => Job::Effect(args.resolve(TOOL_POOL)?),
            Self::Bench(args) => {
                args.check()?;
                Job::Bench(args)
            }
            Self::Purge(args) => {
                let store = args.store.settings(TOOL_POOL)?;
                let policy = args.retention.policy_for(&store.url)?;
                Job::Purge(store, policy)
            }
            Self::Relay(args) => {
                let instance = args.instance.id();
                Job::Relay {
                    store: args.store.settings(RELAY_POOL)?,
                    sink: args.relay.sink(&instance),
                    relay: args.relay.relay(&instance)?,
                    metrics_listen: args.metrics.metrics_listen,
                }
            }
            Self::Reconcile(args) => Job::Ops(args.resolve()?),
            Self::Inspect(args) => Job::Ops(args.resolve()?),
            Self::Outbox(args) => Job::Ops(args.resolve()?),
            Self::Audit(args) => Job::Audit(args.resolve()?),
            Self::Config(ConfigArgs {
                command: ConfigCommand::Reference,
            }) => Job::Reference(reference::markdown(&Cli::command())),
            Self::Console(args) => Job::Console(Box::new(args.resolve()?)),
        })
    }
}

/// A write to stdout failed. Its own type, so that a broken pipe on stdout
/// is told from one on a connection (a broker, the database), which is a
/// failure to report.
#[derive(Debug, thiserror::Error)]
#[error("writing to stdout: {0}")]
pub struct StdoutError(#[source] pub std::io::Error);

/// Whether `e` is a write to a stdout its reader closed (`oncegate … | head
/// -1`): not a failure to report, the end of the command.
pub fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<StdoutError>()
            .is_some_and(|out| out.0.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// An error and its causes on one line, as `{:#}` writes them but with each
/// message said once: a cause whose text the line already ends with (the
/// same words one layer down, as hyper's `tcp connect error: tcp connect
/// error`, or a message that already quotes its source) is left out.
pub fn error_text(e: &anyhow::Error) -> String {
    chain_text(e.chain())
}

/// [`error_text`] over any chain of causes, outermost first.
pub fn chain_text<'a>(chain: impl Iterator<Item = &'a (dyn std::error::Error + 'static)>) -> String {
    let mut text = String::new();
    for cause in chain {
        let message = cause.to_string();
        if message.is_empty() || text.ends_with(&message) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&message);
    }
    text
}

/// Runs one resolved subcommand.
pub async fn run(job: Job) -> anyhow::Result<ExitCode> {
    match job {
        Job::Serve { config, described } => serve(*config, described).await,
        Job::Migrate {
            store,
            app_role,
            console_role,
        } => migrate(store, app_role, console_role).await,
        Job::Key(args) => key(args),
        Job::Submit(args) => remote::submit(args).await,
        Job::Lookup(args) => remote::lookup(args).await,
        Job::Effect(job) => effect::run(job).await,
        Job::Bench(args) => bench::run(*args).await,
        Job::Purge(store, policy) => purge(store, policy).await,
        Job::Relay {
            store,
            sink,
            relay,
            metrics_listen,
        } => run_relay(store, sink, relay, metrics_listen).await,
        Job::Ops(job) => ops::run(job).await,
        Job::Audit(job) => audit::run(job).await,
        Job::Reference(text) => {
            out_text!("{text}")?;
            Ok(ExitCode::SUCCESS)
        }
        Job::Console(job) => console::run(*job).await,
    }
}

async fn serve(config: AppConfig, described: String) -> anyhow::Result<ExitCode> {
    tracing::info!(config = %described, "starting");
    let app = App::build(config).await?;
    // Before the banner: once it says "listening", SIGTERM drains.
    let signal = crate::shutdown::signal();
    // Once, as a log record: with JSON logs every line stays a record.
    tracing::info!("{}", app.banner());
    app.run_until_shutdown(signal).await?;
    Ok(ExitCode::SUCCESS)
}

async fn open_store(settings: &StoreSettings) -> anyhow::Result<std::sync::Arc<dyn crate::store::Store>> {
    crate::store::open(settings).await.context("opening the store")
}

async fn migrate(
    settings: StoreSettings,
    app_role: Option<String>,
    console_role: Option<String>,
) -> anyhow::Result<ExitCode> {
    let store = open_store(&settings).await?;
    store.migrate().await.context("migrating")?;
    eprintln!("migrations applied ({})", mask_url(&settings.url));
    if let Some(role) = app_role {
        store
            .grant_app_role(&role)
            .await
            .with_context(|| format!("granting ONCEGATE_APP_ROLE {role:?} its privileges"))?;
        eprintln!("application role {role:?} granted exactly its privileges");
    }
    if let Some(role) = console_role {
        store
            .grant_console_role(&role)
            .await
            .with_context(|| format!("granting ONCEGATE_CONSOLE_ROLE {role:?} its privileges"))?;
        eprintln!("console role {role:?} granted exactly its privileges: reading");
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(serde::Deserialize)]
struct KeyLine {
    award_id: String,
    submission_timestamp: String,
    #[serde(default)]
    payload_b64: String,
}

fn key(args: KeyArgs) -> anyhow::Result<ExitCode> {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.jsonl {
        return keys_from_jsonl(&mut out);
    }
    let (Some(award_id), Some(timestamp)) = (args.award_id, args.timestamp) else {
        bail!("--award-id and --timestamp are required");
    };
    let payload = match args.payload_file {
        Some(p) => std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?,
        None => {
            let mut buf = Vec::new();
            std::io::stdin().read_to_end(&mut buf)?;
            buf
        }
    };
    writeln!(out, "{}", crate::key::derive_key(&award_id, &timestamp, &payload)).map_err(StdoutError)?;
    // (Dropping a BufWriter drops a write error with it.)
    out.flush().map_err(StdoutError)?;
    Ok(ExitCode::SUCCESS)
}

fn keys_from_jsonl(out: &mut impl Write) -> anyhow::Result<ExitCode> {
    use base64::Engine;
    for (n, line) in std::io::stdin().lock().lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let k: KeyLine =
            serde_json::from_str(&line).with_context(|| format!("line {}: not a key request", n + 1))?;
        let payload = base64::engine::general_purpose::STANDARD
            .decode(&k.payload_b64)
            .with_context(|| format!("line {}: payload_b64 is not base64", n + 1))?;
        writeln!(
            out,
            "{}",
            crate::key::derive_key(&k.award_id, &k.submission_timestamp, &payload)
        )
        .map_err(StdoutError)?;
    }
    out.flush().map_err(StdoutError)?;
    Ok(ExitCode::SUCCESS)
}

async fn purge(settings: StoreSettings, policy: RetentionPolicy) -> anyhow::Result<ExitCode> {
    let store = open_store(&settings).await?;
    crate::retention::check_floor(&*store, &policy).await?;
    let report = Retention::new(store, policy).step().await.context("purging")?;
    if report.ran {
        out!(
            "purged claims={} audit={} outbox={} effects={}",
            report.claims_deleted,
            report.audit_deleted,
            report.outbox_deleted,
            report.effects_deleted
        )?;
    } else {
        out!("skipped: another instance is purging")?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `oncegate relay`: the relay and its metrics, with the same shutdown
/// phases as `serve`.
async fn run_relay(
    store: StoreSettings,
    sink: SinkSettings,
    relay: RelaySettings,
    metrics_listen: SocketAddr,
) -> anyhow::Result<ExitCode> {
    // The recorder first: a count made before it is installed is lost (the
    // relay could publish before the metrics task first ran).
    crate::metrics::handle();
    let store = open_store(&store).await?;
    let gauge_store = store.clone();
    let Some(relay) = Relay::connect(&sink, relay, store).await? else {
        bail!("ONCEGATE_RELAY_SINK is none: nothing to relay to");
    };
    let listener = tokio::net::TcpListener::bind(metrics_listen)
        .await
        .with_context(|| {
            format!(
                "binding ONCEGATE_METRICS_LISTEN on {metrics_listen} (a `serve` on this host holds the \
                 default: give the relay a listener of its own)"
            )
        })?;
    let shutdown = Shutdown::new();
    let mut tasks = Tasks::new();
    let stop = shutdown.stop_at(Phase::Stopped).into_future();
    tasks.spawn("metrics endpoint", async move {
        crate::metrics::serve(listener, stop)
            .await
            .context("serving /metrics")
    });
    let stop = shutdown.stop_at(Phase::StopBackground);
    tasks.spawn("outbox relay", async move {
        relay.run(stop).await;
        Ok(())
    });
    let stop = shutdown.stop_at(Phase::StopBackground);
    tasks.spawn("outbox gauges", async move {
        crate::relay::report_outbox_gauges(&*gauge_store, std::time::Duration::from_secs(2), stop).await;
        Ok(())
    });
    let failure = tokio::select! {
        _ = crate::shutdown::signal() => None,
        exit = tasks.next_exit() => Some(crate::shutdown::unexpected_exit(exit)),
    };
    shutdown.advance(Phase::Stopped);
    tasks
        .join_all(tokio::time::Instant::now() + std::time::Duration::from_secs(10))
        .await;
    failure.map_or(Ok(ExitCode::SUCCESS), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(argv: &[&str]) -> Result<Job, ConfigError> {
        Cli::try_parse_from(argv).expect("parses").command.resolve()
    }

    #[test]
    fn each_cause_of_an_error_is_said_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("{0}")]
        struct Layer(&'static str, #[source] Option<Box<Layer>>);
        let layer = |m, inner: Option<Layer>| Layer(m, inner.map(Box::new));
        // hyper's connect error wraps its own kind: the same words twice.
        let root = layer("Connection refused (os error 111)", None);
        let twice = layer("tcp connect error", Some(layer("tcp connect error", Some(root))));
        let e = anyhow::Error::from(twice).context("connecting");
        assert_eq!(
            error_text(&e),
            "connecting: tcp connect error: Connection refused (os error 111)"
        );
        // A message that already quotes its source; an empty one.
        let quoted = layer("reading x: gone", Some(layer("gone", None)));
        assert_eq!(error_text(&anyhow::Error::from(quoted)), "reading x: gone");
        let empty = layer("outer", Some(layer("", Some(layer("inner", None)))));
        assert_eq!(error_text(&anyhow::Error::from(empty)), "outer: inner");
    }

    #[test]
    fn only_a_closed_stdout_is_a_quiet_end() {
        let pipe = || std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let stdout = anyhow::Error::from(StdoutError(pipe())).context("printing the report");
        assert!(is_closed_pipe(&stdout));
        let socket = anyhow::Error::from(pipe()).context("publishing to the broker");
        assert!(
            !is_closed_pipe(&socket),
            "a broken connection is a failure to report"
        );
        let full = anyhow::Error::from(StdoutError(std::io::Error::other("no space left")));
        assert!(!is_closed_pipe(&full));
    }

    #[test]
    fn defaults_bind_loopback() {
        let Ok(Job::Serve { config, .. }) = resolve(&["oncegate", "serve"]) else {
            panic!("serve resolves with defaults")
        };
        assert!(config.listen.ip().is_loopback());
        assert!(config.metrics_listen.ip().is_loopback());
        assert_eq!(
            config.retention.retention,
            humantime::parse_duration("3years").unwrap()
        );
    }

    #[test]
    fn every_subcommand_checks_its_store_url() {
        for sub in ["migrate", "purge", "relay"] {
            let err = resolve(
                &[
                    "oncegate",
                    sub,
                    "--database-url",
                    "mysql://u:pw@db/x",
                    "--relay-sink",
                    "log",
                ][..if sub == "relay" { 6 } else { 4 }],
            )
            .err()
            .unwrap_or_else(|| panic!("{sub} refuses mysql://"));
            assert!(err.0.contains("DATABASE_URL"), "{sub}: {err}");
            assert!(!err.0.contains("pw"), "{sub}: the password is masked: {err}");
        }
    }

    #[test]
    fn a_retention_below_the_floor_is_refused_on_sqlite_unless_the_floor_is_lowered() {
        let err = resolve(&["oncegate", "serve", "--retention", "3days"])
            .err()
            .expect("refused");
        assert!(
            err.0.contains("3days") && err.0.contains("3years"),
            "names both values: {err}"
        );
        let err = resolve(&["oncegate", "purge", "--retention", "2years"])
            .err()
            .expect("refused");
        assert!(err.0.contains("ONCEGATE_RETENTION_FLOOR"), "{err}");
        let lowered = [
            "oncegate",
            "serve",
            "--retention",
            "3days",
            "--retention-floor",
            "1day",
        ];
        assert!(resolve(&lowered).is_ok(), "an explicit, lower floor");
        let on_postgres = [
            "oncegate",
            "serve",
            "--database-url",
            "postgres://db/x",
            "--retention-floor",
            "1day",
        ];
        let err = resolve(&on_postgres)
            .err()
            .expect("the Postgres floor lives in the database");
        assert!(err.0.contains("oncegate_retention_floor"), "{err}");
    }

    #[test]
    fn least_privilege_needs_postgres_and_no_migrations_on_start() {
        let sqlite = ["oncegate", "serve", "--require-least-privilege", "true"];
        assert!(resolve(&sqlite).err().expect("refused").0.contains("SQLite"));
        let migrating = [
            "oncegate",
            "serve",
            "--database-url",
            "postgres://db/x",
            "--require-least-privilege",
            "true",
        ];
        assert!(
            resolve(&migrating)
                .err()
                .expect("refused")
                .0
                .contains("ONCEGATE_MIGRATE_ON_START")
        );
        let ok = [&migrating[..], &["--migrate-on-start", "false"]].concat();
        assert!(resolve(&ok).is_ok());
        let role_on_sqlite = ["oncegate", "migrate", "--app-role", "oncegate_app"];
        assert!(
            resolve(&role_on_sqlite)
                .err()
                .expect("refused")
                .0
                .contains("ONCEGATE_APP_ROLE")
        );
    }

    /// Behind a transaction pooler every part that needs a session of its
    /// own is named with the setting that turns it off; with all of them
    /// off it resolves, and the probe's timing is carried to the config.
    #[test]
    fn a_transaction_pooler_refuses_what_needs_a_session_and_names_each_setting() {
        let pooled = [
            "oncegate",
            "serve",
            "--database-url",
            "postgres://db/x",
            "--db-pooler",
            "transaction",
        ];
        let err = resolve(&pooled).err().expect("refused").0;
        for setting in [
            "ONCEGATE_MIGRATE_ON_START=false",
            "ONCEGATE_PURGE_INTERVAL=0s",
            "ONCEGATE_RECONCILE_INTERVAL=0s",
            "ONCEGATE_AUDIT_SEAL_INTERVAL=0s",
            "ONCEGATE_AUDIT_VERIFY_INTERVAL=0s",
        ] {
            assert!(err.contains(setting), "{setting} in {err}");
        }
        let off = [
            &pooled[..],
            &[
                "--migrate-on-start",
                "false",
                "--purge-interval",
                "0s",
                "--reconcile-interval",
                "0s",
                "--audit-seal-interval",
                "0s",
                "--audit-verify-interval",
                "0s",
                "--primary-probe-interval",
                "250ms",
                "--primary-probe-timeout",
                "750ms",
            ],
        ]
        .concat();
        let Ok(Job::Serve { config, .. }) = resolve(&off) else {
            panic!("resolves with everything that needs a session off")
        };
        assert_eq!(config.store.pooler, crate::store::Pooler::Transaction);
        assert_eq!(
            config.primary_probe.cache_window(),
            std::time::Duration::from_secs(1)
        );
    }

    #[test]
    fn a_pooler_needs_postgres_and_the_probe_a_timeout() {
        let sqlite = ["oncegate", "serve", "--db-pooler", "transaction"];
        assert!(
            resolve(&sqlite)
                .err()
                .expect("refused")
                .0
                .contains("needs Postgres")
        );
        let instant = ["oncegate", "serve", "--primary-probe-timeout", "0s"];
        assert!(
            resolve(&instant)
                .err()
                .expect("refused")
                .0
                .contains("ONCEGATE_PRIMARY_PROBE_TIMEOUT")
        );
    }

    #[test]
    fn effects_cache_windows_are_set_per_namespace() {
        let Ok(Job::Serve { config, .. }) = resolve(&[
            "oncegate",
            "serve",
            "--effects-namespace-ttl",
            "payments=1h, notices=10m",
            "--effects-cache-ttl",
            "2h",
        ]) else {
            panic!("resolves")
        };
        let hour = std::time::Duration::from_secs(3600);
        assert_eq!(config.effects.ttl_for("payments"), hour);
        assert_eq!(config.effects.ttl_for("notices"), hour / 6);
        assert_eq!(config.effects.ttl_for("other"), hour * 2);
        for bad in ["Pay=1h", "payments", "payments=soon", "a=1h,a=2h", "a=0s"] {
            let err = resolve(&["oncegate", "serve", "--effects-namespace-ttl", bad])
                .err()
                .unwrap_or_else(|| panic!("{bad} refused"));
            assert!(err.0.contains("ONCEGATE_EFFECTS_NAMESPACE_TTL"), "{bad}: {err}");
        }
    }

    #[test]
    fn audit_settings_are_checked_and_named() {
        let err = resolve(&["oncegate", "serve", "--audit-seal-max-rows", "0"])
            .err()
            .expect("refused");
        assert!(err.0.contains("ONCEGATE_AUDIT_SEAL_MAX_ROWS"), "{err}");
        let err = resolve(&["oncegate", "audit", "seal", "--audit-seal-max-rows", "0"])
            .err()
            .expect("refused");
        assert!(err.0.contains("ONCEGATE_AUDIT_SEAL_MAX_ROWS"), "{err}");
        let err = resolve(&[
            "oncegate",
            "audit",
            "export",
            "--out",
            "x",
            "--from",
            "2026-12",
            "--to",
            "2026-11-30",
        ])
        .err()
        .expect("refused");
        assert!(err.0.contains("--from"), "{err}");
        let parsed = Cli::try_parse_from(["oncegate", "audit", "verify", "--from", "2026-11-31"]);
        assert!(parsed.unwrap_err().to_string().contains("not an RFC 3339 time"));
        let Ok(Job::Serve { config, .. }) = resolve(&["oncegate", "serve", "--audit-seal-interval", "0s"])
        else {
            panic!("0s switches sealing off")
        };
        assert!(config.seal.interval.is_zero());
        assert_eq!(config.seal.settings.max_rows, 50_000, "the default");
    }

    /// Settings main read before they were declared once (1.0's surface,
    /// read from its `--help`), that read differently now, each with why.
    const CHANGED_SINCE_PINNED: &[(&str, &str)] = &[
        (
            "ONCEGATE_METRICS_LISTEN\trelay\t127.0.0.1:9465",
            "one default for the setting, 127.0.0.1:9464 as documented; the relay's bind error says to \
             give it its own when a serve on the host holds it",
        ),
        ("ONCEGATE_DB_POOL_SIZE\taudit export\t16", POOL_RESIZED),
        ("ONCEGATE_DB_POOL_SIZE\taudit seal\t16", POOL_RESIZED),
        ("ONCEGATE_DB_POOL_SIZE\taudit verify\t16", POOL_RESIZED),
        ("ONCEGATE_DB_POOL_SIZE\teffect get\t16", POOL_RESIZED),
        ("ONCEGATE_DB_POOL_SIZE\tinspect\t16", POOL_RESIZED),
        ("ONCEGATE_DB_POOL_SIZE\tmigrate\t16", POOL_RESIZED),
        ("ONCEGATE_DB_POOL_SIZE\toutbox list\t16", POOL_RESIZED),
        ("ONCEGATE_DB_POOL_SIZE\toutbox retry\t16", POOL_RESIZED),
        ("ONCEGATE_DB_POOL_SIZE\toutbox slots\t16", POOL_RESIZED),
        ("ONCEGATE_DB_POOL_SIZE\tpurge\t16", POOL_RESIZED),
        ("ONCEGATE_DB_POOL_SIZE\treconcile\t16", POOL_RESIZED),
        ("ONCEGATE_DB_POOL_SIZE\trelay\t16", POOL_RESIZED),
        ("ONCEGATE_DB_POOL_SIZE\tserve\t16", POOL_RESIZED),
    ];

    /// Why the pool's default is 6, not 16 (issue 49).
    const POOL_RESIZED: &str = "sized to what group commit, the relay and the probes use (docs/DEPLOYMENT.md, \
         the connection budget): 16 held 18 connections a pod busy, 6 holds 7 at the same throughput";

    /// Every setting the pinned surface read, in every subcommand that read
    /// it, is still read there with the same default (settings are only
    /// added; `config/surface.tsv` is main's before they were declared once).
    #[test]
    fn every_pinned_setting_is_still_read_where_it_was_with_its_default() {
        let now = reference::surface(&Cli::command());
        let now: std::collections::BTreeSet<&str> = now.lines().collect();
        let lost: Vec<&str> = include_str!("config/surface.tsv")
            .lines()
            .filter(|row| !now.contains(row))
            .filter(|row| !CHANGED_SINCE_PINNED.iter().any(|(changed, _)| changed == row))
            .collect();
        assert!(
            lost.is_empty(),
            "settings no longer read as they were:\n{}",
            lost.join("\n")
        );
    }

    /// One definition per environment variable: one default, one help, one
    /// flag (and its aliases) in every subcommand that takes it.
    #[test]
    fn each_setting_has_one_default_and_one_flag() {
        for (env, setting) in reference::settings(&Cli::command()) {
            assert_eq!(setting.defaults().len(), 1, "{env}: {:?}", setting.subcommands);
            assert_eq!(setting.flags.len(), 1, "{env}: {:?}", setting.flags);
        }
    }

    /// `docs/CONFIGURATION.md` is what `oncegate config reference` prints.
    #[test]
    fn the_configuration_reference_is_generated() {
        let generated = reference::markdown(&Cli::command());
        let committed = include_str!("../docs/CONFIGURATION.md");
        assert!(
            generated == committed,
            "docs/CONFIGURATION.md differs from `oncegate config reference`: run \
             `cargo run -q -- config reference > docs/CONFIGURATION.md`"
        );
    }

    /// Every environment variable the chart sets is one oncegate reads (or
    /// the log level, or one the chart's own templates use).
    #[test]
    fn every_setting_the_chart_sets_exists() {
        let known = reference::settings(&Cli::command());
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("helm/oncegate/templates");
        let mut unknown = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("the chart's templates") {
            let path = entry.expect("a template").path();
            let text = std::fs::read_to_string(&path).expect("a template's text");
            for line in text.lines() {
                let Some(name) = line.trim().strip_prefix("- name: ") else {
                    continue;
                };
                let looks_like_env = name.chars().all(|c| c.is_ascii_uppercase() || c == '_');
                if looks_like_env && name != "RUST_LOG" && !known.contains_key(name) {
                    unknown.push(format!("{}: {name}", path.display()));
                }
            }
        }
        assert!(
            unknown.is_empty(),
            "the chart sets settings oncegate does not read: {unknown:?}"
        );
    }

    #[test]
    fn a_bad_relay_sink_is_refused_while_parsing() {
        let err = Cli::try_parse_from(["oncegate", "serve", "--relay-sink", "sqs://broker"]).unwrap_err();
        assert!(err.to_string().contains("ONCEGATE_RELAY_SINK"), "{err}");
    }
}
