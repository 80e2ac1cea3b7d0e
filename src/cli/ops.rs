//! The operator's commands (DESIGN §10), straight against the store:
//!
//! - `reconcile`: does the ledger agree with itself and with the broker?
//!   Exit 0 clean, 1 on any mismatch, 2 when it could not finish;
//! - `inspect KEY | --award ID`: what happened to this submission?
//! - `outbox list`, `outbox retry ID…|--all-quarantined`: what is stuck,
//!   and putting quarantined events back (audited with who and why);
//! - `outbox slots [--set N]`: the relay's slots (who holds which, what
//!   waits in each), and changing their count (`relay::resize`).
//!
//! They need only the application role's grants (migrations/GRANTS.md).

use super::relay_state::RelayState;
use crate::config::{BrokerArgs, MetricsArgs, ReconcileBatchArgs, RetentionWindowArgs, StoreArgs, hostname};
use crate::error::ConfigError;
use crate::reconcile::{ReconcileSettings, Reconciler};
use crate::store::ops::{
    EventRecord, EventState, KeyInspection, OutboxFilter, RedriveBy, RedriveOutcome, RedriveTarget,
};
use crate::store::{OpsStore, RelayStore, Store, StoreSettings};
use crate::time_fmt::rfc3339;
use anyhow::Context;
use clap::{Args, Subcommand};
use std::process::ExitCode;
use std::sync::Arc;
use time::OffsetDateTime;
use uuid::Uuid;

/// Connections a one-shot operator command opens at most.
const OPS_POOL: u32 = 2;

/// Quarantined events redriven per transaction by `--all-quarantined`.
const REDRIVE_BATCH: i64 = 500;

#[derive(Debug, Clone, Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub broker: BrokerArgs,
    #[command(flatten)]
    pub windows: RetentionWindowArgs,
    #[command(flatten)]
    pub batch: ReconcileBatchArgs,
    /// Mismatches shown per check (all are counted).
    #[arg(long, default_value_t = 10)]
    pub examples: usize,
    /// The report as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The idempotency key (the full key, as `submit` and `lookup` print it).
    #[arg(required_unless_present = "award", conflicts_with = "award")]
    pub key: Option<String>,
    /// An award instead: its running total and its most recent keys.
    #[arg(long)]
    pub award: Option<String>,
    /// With --award: how many of its most recent keys.
    #[arg(long, default_value_t = 20, requires = "award")]
    pub limit: i64,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct OutboxArgs {
    #[command(subcommand)]
    pub command: OutboxCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum OutboxCommand {
    /// Unpublished events (pending, leased, quarantined), oldest first.
    List(OutboxListArgs),
    /// Put quarantined events back to pending; the relay publishes them in
    /// per-award order. Audited with --actor and --reason.
    Retry(OutboxRetryArgs),
    /// The relay's slots: which relay holds each, its generation and lease, the events
    /// waiting in it, and the live relays. `--set N` changes the slot count online
    /// (every slot settled first; claims go on, events wait a few seconds).
    Slots(OutboxSlotsArgs),
}

#[derive(Debug, Clone, Args)]
pub struct OutboxSlotsArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Change the slot count to N (1 to 1024). With Kafka, run it with the relays'
    /// ONCEGATE_RELAY_SINK, ONCEGATE_RELAY_STREAM and transactional id prefix: every
    /// slot is settled under the old count first.
    #[arg(long)]
    pub set: Option<i32>,
    #[command(flatten)]
    pub relay: crate::config::RelaySettingsArgs,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct OutboxListArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Only quarantined events.
    #[arg(long)]
    pub quarantined: bool,
    /// Only this award's events.
    #[arg(long)]
    pub award: Option<String>,
    /// At most this many events.
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
    // The sidecar's metrics listener, read for the relay's state
    // (publishing, or paused while its broker is unreachable).
    #[command(flatten)]
    pub metrics: MetricsArgs,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Args)]
pub struct OutboxRetryArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Event ids (as `outbox list` prints them).
    #[arg(
        required_unless_present = "all_quarantined",
        conflicts_with = "all_quarantined"
    )]
    pub event_ids: Vec<Uuid>,
    /// Every quarantined event (of --award, if given).
    #[arg(long)]
    pub all_quarantined: bool,
    /// With --all-quarantined: only this award's events.
    #[arg(long, requires = "all_quarantined")]
    pub award: Option<String>,
    /// Why: written to each event's audit row.
    #[arg(long)]
    pub reason: String,
    /// Who: written to each event's audit row (default: $USER@host).
    #[arg(long, env = "ONCEGATE_ACTOR")]
    pub actor: Option<String>,
    #[arg(long)]
    pub json: bool,
}

/// An operator command with its settings resolved and checked.
pub enum OpsJob {
    Reconcile {
        store: StoreSettings,
        settings: ReconcileSettings,
        json: bool,
    },
    Inspect {
        store: StoreSettings,
        target: Inspect,
        json: bool,
    },
    OutboxList {
        store: StoreSettings,
        filter: OutboxFilter,
        metrics: std::net::SocketAddr,
        json: bool,
    },
    OutboxRetry {
        store: StoreSettings,
        target: RedriveTarget,
        by: RedriveBy,
        json: bool,
    },
    OutboxSlots {
        store: StoreSettings,
        set: Option<(i32, crate::broker::SinkSettings)>,
        json: bool,
    },
}

/// What `inspect` shows.
pub enum Inspect {
    Key(String),
    Award { award_id: String, limit: i64 },
}

/// The store's settings, refusing a SQLite file that is not there (opening
/// it would create an empty one).
fn existing_store(args: &StoreArgs) -> Result<StoreSettings, ConfigError> {
    let store = args.settings(OPS_POOL)?;
    if let Some(path) = store.url.strip_prefix("sqlite://")
        && !std::path::Path::new(path).exists()
    {
        return Err(ConfigError(format!(
            "no database at {path}: set DATABASE_URL, or ONCEGATE_SQLITE_PATH to the sidecar's file"
        )));
    }
    Ok(store)
}

impl ReconcileArgs {
    pub fn resolve(self) -> Result<OpsJob, ConfigError> {
        let (retention, outbox_retention) = self.windows.check()?;
        Ok(OpsJob::Reconcile {
            store: existing_store(&self.store)?,
            settings: self
                .batch
                .settings(retention, outbox_retention, self.broker.sink(), self.examples)?,
            json: self.json,
        })
    }
}

impl InspectArgs {
    pub fn resolve(self) -> Result<OpsJob, ConfigError> {
        let target = match (self.key, self.award) {
            (Some(key), _) => Inspect::Key(key),
            (None, Some(award_id)) if self.limit >= 1 => Inspect::Award {
                award_id,
                limit: self.limit,
            },
            (None, Some(_)) => return Err(ConfigError::new("--limit must be at least 1")),
            (None, None) => return Err(ConfigError::new("give a KEY or --award")),
        };
        Ok(OpsJob::Inspect {
            store: existing_store(&self.store)?,
            target,
            json: self.json,
        })
    }
}

impl OutboxArgs {
    pub fn resolve(self) -> Result<OpsJob, ConfigError> {
        match self.command {
            OutboxCommand::List(a) => {
                if a.limit < 1 {
                    return Err(ConfigError::new("--limit must be at least 1"));
                }
                Ok(OpsJob::OutboxList {
                    store: existing_store(&a.store)?,
                    filter: OutboxFilter {
                        quarantined_only: a.quarantined,
                        award_id: a.award,
                        limit: a.limit,
                    },
                    metrics: a.metrics.metrics_listen,
                    json: a.json,
                })
            }
            OutboxCommand::Retry(a) => a.resolve(),
            OutboxCommand::Slots(a) => Ok(OpsJob::OutboxSlots {
                store: existing_store(&a.store)?,
                set: a.set.map(|n| (n, a.relay.sink(&default_actor()))),
                json: a.json,
            }),
        }
    }
}

impl OutboxRetryArgs {
    fn resolve(self) -> Result<OpsJob, ConfigError> {
        let reason = self.reason.trim().to_string();
        if reason.is_empty() {
            return Err(ConfigError::new(
                "--reason must say why (it goes into the audit trail)",
            ));
        }
        let actor = match self.actor.as_deref().map(str::trim) {
            Some("") => return Err(ConfigError::new("ONCEGATE_ACTOR must not be empty")),
            Some(actor) => actor.to_string(),
            None => default_actor(),
        };
        let target = if self.all_quarantined {
            RedriveTarget::AllQuarantined { award_id: self.award }
        } else {
            RedriveTarget::Events(self.event_ids)
        };
        Ok(OpsJob::OutboxRetry {
            store: existing_store(&self.store)?,
            target,
            by: RedriveBy {
                actor: actor.into(),
                reason,
            },
            json: self.json,
        })
    }
}

/// `$USER@host` (or `$LOGNAME@host`): who runs the command.
fn default_actor() -> String {
    let user = ["USER", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "unknown".into());
    format!("{user}@{}", hostname())
}

async fn open(settings: &StoreSettings) -> anyhow::Result<Arc<dyn Store>> {
    crate::store::open(settings).await.context("opening the store")
}

/// Runs one operator command.
pub async fn run(job: OpsJob) -> anyhow::Result<ExitCode> {
    match job {
        OpsJob::Reconcile {
            store,
            settings,
            json,
        } => reconcile(store, settings, json).await,
        OpsJob::Inspect { store, target, json } => inspect(&*open(&store).await?, target, json).await,
        OpsJob::OutboxList {
            store,
            filter,
            metrics,
            json,
        } => {
            let relay = super::relay_state::relay_state(metrics).await;
            list(&*open(&store).await?, &filter, &relay, json).await
        }
        OpsJob::OutboxRetry {
            store,
            target,
            by,
            json,
        } => retry(&*open(&store).await?, target, &by, json).await,
        OpsJob::OutboxSlots { store, set, json } => slots(&*open(&store).await?, set, json).await,
    }
}

/// `outbox slots`: the table, after changing the count when asked.
async fn slots(
    store: &dyn RelayStore,
    set: Option<(i32, crate::broker::SinkSettings)>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let resized = match &set {
        Some((count, sink)) => {
            let member = format!("resize:{}", default_actor());
            let sink = (sink.spec != crate::broker::SinkSpec::None).then_some(sink);
            match crate::relay::resize(store, sink, *count, &member).await {
                Ok(r) => Some(r),
                Err(e) => {
                    eprintln!("oncegate outbox slots --set {count}: {e}");
                    return Ok(ExitCode::from(1));
                }
            }
        }
        None => None,
    };
    let table = store
        .relay_slot_table()
        .await
        .context("reading the relay's slots")?;
    if json {
        let out = serde_json::json!({ "resized": resized, "slots": table.slots, "relays": table.members });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(r) = &resized {
        println!(
            "slots: {} -> {} ({} events settled from the old slots' marks)",
            r.from, r.to, r.settled
        );
    }
    print!("{}", render_slots(&table));
    Ok(ExitCode::SUCCESS)
}

fn render_slots(table: &crate::store::slots::SlotTable) -> String {
    use std::fmt::Write;
    let mut out = format!(
        "{} slots, {} live relays\n",
        table.slots.len(),
        table.members.len()
    );
    for m in &table.members {
        let _ = writeln!(
            out,
            "relay  {} (instance {}, sink {})",
            m.member, m.instance, m.sink
        );
    }
    for s in &table.slots {
        let holder = match (&s.owner, s.lease_left) {
            (Some(owner), Some(left)) => format!("held by {owner} ({:.1}s left)", left.as_secs_f64()),
            (Some(owner), None) => format!("free (the lease of {owner} ran out)"),
            (None, _) => "free".to_string(),
        };
        let _ = writeln!(
            out,
            "slot {:>4}  generation {:>6}  {:>8} waiting  {holder}",
            s.slot, s.generation, s.pending
        );
    }
    out
}

async fn reconcile(
    store: StoreSettings,
    settings: ReconcileSettings,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let report = match open(&store).await {
        Ok(store) => Reconciler::new(store, settings)
            .run()
            .await
            .map_err(anyhow::Error::from),
        Err(e) => Err(e),
    };
    match report {
        Ok(report) => {
            if json {
                out!("{}", serde_json::to_string_pretty(&report)?)?;
            } else {
                out_text!("{report}")?;
            }
            Ok(ExitCode::from(if report.clean { 0 } else { 1 }))
        }
        // Not "mismatch": the check could not be made.
        Err(e) => {
            eprintln!("error: reconcile could not finish: {e:#}");
            Ok(ExitCode::from(2))
        }
    }
}

/// An event with its state, for output.
#[derive(serde::Serialize)]
struct EventView<'a> {
    state: EventState,
    #[serde(flatten)]
    event: &'a EventRecord,
}

fn event_views(events: &[EventRecord], now: OffsetDateTime) -> Vec<EventView<'_>> {
    events
        .iter()
        .map(|event| EventView {
            state: event.state(now),
            event,
        })
        .collect()
}

fn key_json(k: &KeyInspection, now: OffsetDateTime) -> serde_json::Value {
    serde_json::json!({
        "idempotency_key": k.idempotency_key,
        "claim": k.claim,
        "ledger": k.ledger,
        "events": event_views(&k.events, now),
        "audit": k.audit,
    })
}

async fn inspect(store: &dyn OpsStore, target: Inspect, json: bool) -> anyhow::Result<ExitCode> {
    let now = OffsetDateTime::now_utc();
    match target {
        Inspect::Key(key) => {
            let k = store.inspect_key(&key).await.context("reading the key")?;
            if json {
                out!("{}", serde_json::to_string_pretty(&key_json(&k, now))?)?;
            } else {
                out_text!("{}", render_key(&k, now))?;
            }
            Ok(ExitCode::from(if k.is_empty() { 1 } else { 0 }))
        }
        Inspect::Award { award_id, limit } => {
            let (balance, keys) = store
                .award_keys(&award_id, limit)
                .await
                .context("reading the award")?;
            let mut inspected = Vec::with_capacity(keys.len());
            for key in &keys {
                inspected.push(store.inspect_key(key).await.context("reading a key")?);
            }
            if json {
                let keys: Vec<_> = inspected.iter().map(|k| key_json(k, now)).collect();
                let out = serde_json::json!({"award_id": award_id, "balance": balance, "keys": keys});
                out!("{}", serde_json::to_string_pretty(&out)?)?;
            } else {
                match &balance {
                    Some(b) => out!(
                        "award {award_id}: running total {} cents over {} disbursements, last sequence {}, updated {}",
                        b.total_cents,
                        b.disbursement_count,
                        b.last_sequence,
                        rfc3339(b.updated_at)
                    )?,
                    None => out!("award {award_id}: no running total")?,
                }
                out!("its {} most recent keys, newest first:", inspected.len())?;
                for k in &inspected {
                    out_text!("\n{}", render_key(k, now))?;
                }
            }
            Ok(ExitCode::from(if balance.is_none() && keys.is_empty() {
                1
            } else {
                0
            }))
        }
    }
}

/// One event's state in words.
fn event_line(e: &EventRecord, now: OffsetDateTime) -> String {
    let head = format!("{} {} (sequence {})", e.event_id, e.event_type, e.sequence);
    let error = e
        .last_error
        .as_deref()
        .map(|err| format!("; last error: {err}"))
        .unwrap_or_default();
    match e.state(now) {
        EventState::Published => format!(
            "{head}: published {}",
            e.published_at.map(rfc3339).unwrap_or_default()
        ),
        EventState::Quarantined => format!(
            "{head}: QUARANTINED {} after {} failed attempts{error}",
            e.quarantined_at.map(rfc3339).unwrap_or_default(),
            e.attempts
        ),
        EventState::Retrying => format!(
            "{head}: retried after {} ({} failed attempts{error})",
            e.leased_until.map(rfc3339).unwrap_or_default(),
            e.attempts
        ),
        EventState::Pending => format!(
            "{head}: pending since {} ({} failed attempts{error})",
            rfc3339(e.created_at),
            e.attempts
        ),
    }
}

fn render_key(k: &KeyInspection, now: OffsetDateTime) -> String {
    use std::fmt::Write;
    let mut out = format!("key    {}\n", k.idempotency_key);
    let _ = match &k.claim {
        Some(c) => writeln!(
            out,
            "claim  claimed {}, award {}, disbursement {}",
            rfc3339(c.claimed_at),
            c.award_id,
            c.disbursement_id
        ),
        None => writeln!(out, "claim  none (purged by retention, or never claimed)"),
    };
    let _ = match &k.ledger {
        Some(d) => writeln!(
            out,
            "ledger {} award {}, {} cents, sequence {}, recorded {}, submission_timestamp {}",
            d.id,
            d.award_id,
            d.amount_cents,
            d.sequence,
            rfc3339(d.recorded_at),
            d.submission_timestamp
        ),
        None => writeln!(out, "ledger none"),
    };
    if k.events.is_empty() {
        let why = if k.ledger.is_some() {
            " (published and cleaned up, or missing)"
        } else {
            ""
        };
        let _ = writeln!(out, "event  none{why}");
    }
    for e in &k.events {
        let _ = writeln!(out, "event  {}", event_line(e, now));
    }
    let _ = writeln!(
        out,
        "audit  {} rows (by the key's first 12 characters), oldest first:",
        k.audit.len()
    );
    for a in &k.audit {
        let other = match &k.ledger {
            Some(d) if d.award_id != a.award_id => format!(" [award {}]", a.award_id),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "  {}  {:<9} {:<11} {}{}{}",
            rfc3339(a.at),
            a.decision,
            a.tier.as_deref().unwrap_or("-"),
            a.instance,
            other,
            a.detail.as_deref().map(|d| format!("  {d}")).unwrap_or_default()
        );
    }
    out
}

async fn list(
    store: &dyn Store,
    filter: &OutboxFilter,
    relay: &RelayState,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let now = OffsetDateTime::now_utc();
    let stats = store.outbox_stats().await.context("reading the outbox")?;
    let events = store.list_outbox(filter).await.context("reading the outbox")?;
    if json {
        let out = serde_json::json!({
            "relay": relay,
            "backlog": stats.backlog,
            "oldest_age_seconds": stats.oldest_age.as_secs_f64(),
            "quarantined": stats.quarantined,
            "events": event_views(&events, now),
        });
        out!("{}", serde_json::to_string_pretty(&out)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    out!("relay: {relay}")?;
    out!(
        "outbox: {} waiting to be published (oldest {}), {} quarantined",
        stats.backlog,
        humantime::format_duration(std::time::Duration::from_secs(stats.oldest_age.as_secs())),
        stats.quarantined
    )?;
    for e in &events {
        out!("{}  award {}", event_line(e, now), e.award_id)?;
    }
    if events.len() as i64 == filter.limit {
        out!("(first {}; --limit shows more)", filter.limit)?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn retry(
    store: &dyn OpsStore,
    target: RedriveTarget,
    by: &RedriveBy,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let mut outcomes = Vec::new();
    match &target {
        RedriveTarget::Events(ids) => {
            for chunk in ids.chunks(REDRIVE_BATCH as usize) {
                let part = RedriveTarget::Events(chunk.to_vec());
                outcomes.extend(
                    store
                        .redrive_outbox(&part, REDRIVE_BATCH, by)
                        .await
                        .context("redriving")?,
                );
            }
        }
        RedriveTarget::AllQuarantined { .. } => outcomes = redrive_all(store, &target, by).await?,
    }
    let all_redriven = outcomes.iter().all(|o| matches!(o, RedriveOutcome::Redriven(_)));
    if json {
        out!("{}", serde_json::to_string_pretty(&retry_json(&outcomes))?)?;
    } else {
        print_retry(&outcomes, by)?;
    }
    Ok(ExitCode::from(if all_redriven { 0 } else { 1 }))
}

/// Every quarantined event, a batch per transaction. An event the relay
/// quarantines again meanwhile (the broker still refuses it) is not
/// redriven twice by one command.
async fn redrive_all(
    store: &dyn OpsStore,
    target: &RedriveTarget,
    by: &RedriveBy,
) -> anyhow::Result<Vec<RedriveOutcome>> {
    let mut outcomes = Vec::new();
    let mut seen = std::collections::HashSet::new();
    loop {
        let batch = store
            .redrive_outbox(target, REDRIVE_BATCH, by)
            .await
            .context("redriving")?;
        let full = batch.len() as i64 == REDRIVE_BATCH;
        let mut again = false;
        for outcome in batch {
            if let RedriveOutcome::Redriven(e) = &outcome {
                again |= !seen.insert(e.event_id);
            }
            outcomes.push(outcome);
        }
        if !full || again {
            return Ok(outcomes);
        }
    }
}

fn retry_json(outcomes: &[RedriveOutcome]) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|o| match o {
            RedriveOutcome::Redriven(e) => serde_json::json!({"event_id": e.event_id, "result": "redriven",
                "award_id": e.award_id, "sequence": e.sequence, "attempts": e.attempts, "last_error": e.last_error}),
            RedriveOutcome::NotQuarantined(e) => serde_json::json!({"event_id": e.event_id,
                "result": "not_quarantined", "state": e.state(OffsetDateTime::now_utc())}),
            RedriveOutcome::NotFound(id) => serde_json::json!({"event_id": id, "result": "not_found"}),
        })
        .collect();
    serde_json::json!({ "events": rows })
}

fn print_retry(outcomes: &[RedriveOutcome], by: &RedriveBy) -> Result<(), crate::cli::StdoutError> {
    let mut redriven = 0;
    for o in outcomes {
        match o {
            RedriveOutcome::Redriven(e) => {
                redriven += 1;
                out!(
                    "redriven        {} award {} sequence {} (after {} failed attempts; last error: {})",
                    e.event_id,
                    e.award_id,
                    e.sequence,
                    e.attempts,
                    e.last_error.as_deref().unwrap_or("none")
                )?;
            }
            RedriveOutcome::NotQuarantined(e) => out!(
                "not quarantined {} ({}): left alone",
                e.event_id,
                e.state(OffsetDateTime::now_utc()).as_str()
            )?,
            RedriveOutcome::NotFound(id) => out!("not found       {id}")?,
        }
    }
    if redriven == 0 && outcomes.is_empty() {
        out!("no quarantined events")?;
    } else {
        out!(
            "{redriven} event(s) back to pending, audited as redriven by {} ({:?}); the relay publishes them in per-award order",
            by.actor,
            by.reason
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn parse(argv: &[&str]) -> Result<OpsJob, String> {
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        let job = match cli.command {
            Command::Reconcile(a) => a.resolve(),
            Command::Inspect(a) => a.resolve(),
            Command::Outbox(a) => a.resolve(),
            _ => unreachable!(),
        };
        job.map_err(|e| e.to_string())
    }

    #[test]
    fn bad_operator_settings_name_the_setting() {
        let db = tempfile::NamedTempFile::new().unwrap();
        let url = format!("sqlite://{}", db.path().display());
        let reconcile = parse(&[
            "oncegate",
            "reconcile",
            "--database-url",
            &url,
            "--reconcile-batch",
            "0",
        ]);
        assert!(reconcile.err().unwrap().contains("ONCEGATE_RECONCILE_BATCH"));
        let retry = parse(&[
            "oncegate",
            "outbox",
            "retry",
            "--database-url",
            &url,
            "--all-quarantined",
            "--reason",
            " ",
        ]);
        assert!(retry.err().unwrap().contains("--reason"));
        let missing = parse(&[
            "oncegate",
            "inspect",
            "--sqlite-path",
            "/nonexistent/og.db",
            "abc",
        ]);
        assert!(
            missing.err().unwrap().contains("ONCEGATE_SQLITE_PATH"),
            "an absent file is not created"
        );
        let both = parse(&[
            "oncegate",
            "outbox",
            "retry",
            "--database-url",
            &url,
            "--reason",
            "x",
            "--all-quarantined",
            "0190b6a0-0000-7000-8000-000000000000",
        ]);
        assert!(both.is_err(), "ids and --all-quarantined exclude each other");
    }

    #[test]
    fn a_redrive_names_who_and_why() {
        let db = tempfile::NamedTempFile::new().unwrap();
        let url = format!("sqlite://{}", db.path().display());
        let Ok(OpsJob::OutboxRetry { by, target, .. }) = parse(&[
            "oncegate",
            "outbox",
            "retry",
            "--database-url",
            &url,
            "--all-quarantined",
            "--award",
            "AWD-1",
            "--reason",
            " broker fixed ",
            "--actor",
            "alice",
        ]) else {
            panic!("resolves")
        };
        assert_eq!((&*by.actor, by.reason.as_str()), ("alice", "broker fixed"));
        assert_eq!(
            target,
            RedriveTarget::AllQuarantined {
                award_id: Some("AWD-1".into())
            }
        );
    }
}
