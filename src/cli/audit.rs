//! `oncegate audit seal | verify | export | keygen`: the sealed audit trail from the
//! command line (`docs/AUDIT.md`).

use crate::broker::{SinkSettings, SinkSpec};
use crate::config::{InstanceArgs, SealArgs, StoreArgs, StreamArgs, TimeRangeArgs};
use crate::error::ConfigError;
use crate::seal::anchor::{ANCHOR_TYPE, Anchor, Anchors};
use crate::seal::export::{self, Target};
use crate::seal::signing::{self, Keyring};
use crate::seal::verify::{self, Checks, VerifyReport};
use crate::seal::{SealRun, SealSettings, Sealer};
use crate::store::shared::AUDIT_SEALED_EVENT;
use crate::store::{StoreSettings, TimeRange};
use anyhow::Context;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Exit code of `verify` when the trail does not match (EX_DATAERR).
pub const EXIT_MISMATCH: u8 = 65;
/// Exit code of `seal` when open transactions kept it from sealing (EX_TEMPFAIL).
pub const EXIT_DEFERRED: u8 = 75;

#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    #[command(subcommand)]
    pub command: AuditCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum AuditCommand {
    /// Seal the audit rows written since the last seal, once, and exit
    /// (for scripts, cron and tests; `serve` seals on its own interval).
    Seal(SealCommandArgs),
    /// Recompute the seal chain from the database (or an export) and name
    /// every row or seal that no longer matches; exit 65 if any does.
    Verify(VerifyArgs),
    /// Write sealed rows, their seals and purge records as JSON Lines.
    Export(ExportArgs),
    /// Write a new Ed25519 seal-signing key: FILE (private, mode 0600) and
    /// FILE.pub (public, for `verify --public-key`).
    Keygen(KeygenArgs),
}

#[derive(Debug, Clone, Args)]
pub struct KeygenArgs {
    /// The private key's path (never overwritten); the public key goes to
    /// the same path with `.pub` appended.
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct SealCommandArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub seal: SealArgs,
    #[command(flatten)]
    pub instance: InstanceArgs,
}

#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub range: TimeRangeArgs,
    /// Verify this export (a file, or a directory of monthly files) instead
    /// of the database.
    #[arg(long, conflicts_with_all = ["from", "to"])]
    pub export: Option<PathBuf>,
    /// Check every seal's signature against these Ed25519 public keys (PEM,
    /// from `audit keygen`; repeat for rotated keys): a seal with a bad
    /// signature, by an unknown key, or unsigned after the first signed seal
    /// is a mismatch.
    #[arg(long = "public-key", value_name = "FILE")]
    pub public_keys: Vec<PathBuf>,
    /// Compare every seal with the anchors kept outside the database: the
    /// file `ONCEGATE_AUDIT_ANCHOR_FILE` names, or the relay's broker
    /// (`redis://…`, `nats://…`, `kafka://…` with `--stream`), read back for
    /// its `audit.sealed` events. A seal that differs from its anchor, or an
    /// anchored seal the chain lacks, is a mismatch.
    #[arg(long, value_name = "FILE|URL")]
    pub anchors: Option<String>,
    // With `--anchors URL`: where the relay publishes.
    #[command(flatten)]
    pub stream: StreamArgs,
}

#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub range: TimeRangeArgs,
    /// A file, or a directory (one that exists, or a path ending in `/`)
    /// for one file per month, `audit-YYYY-MM.jsonl`. Never overwritten.
    #[arg(long)]
    pub out: PathBuf,
}

/// An `audit` subcommand with its settings resolved.
pub enum AuditJob {
    Seal(StoreSettings, SealSettings),
    Verify(Source, TimeRange, Checks, Option<Box<SinkSettings>>),
    Export(StoreSettings, TimeRange, PathBuf),
    Keygen(PathBuf),
}

/// What `verify` reads.
pub enum Source {
    Store(StoreSettings),
    Export(PathBuf),
}

/// Connections an audit tool opens at most.
const AUDIT_POOL: u32 = 2;

impl AuditArgs {
    pub fn resolve(self) -> Result<AuditJob, ConfigError> {
        Ok(match self.command {
            AuditCommand::Seal(a) => {
                let instance = a.instance.id();
                AuditJob::Seal(a.store.settings(AUDIT_POOL)?, a.seal.settings(instance.into())?)
            }
            AuditCommand::Verify(a) => {
                let source = match a.export {
                    Some(path) => Source::Export(path),
                    None => Source::Store(a.store.settings(AUDIT_POOL)?),
                };
                let keys = match a.public_keys.is_empty() {
                    true => None,
                    false => Some(
                        Keyring::load(&a.public_keys)
                            .map_err(|e| ConfigError::new(format!("--public-key: {e}")))?,
                    ),
                };
                let (anchors, broker) = anchor_source(a.anchors.as_deref(), &a.stream.relay_stream)?;
                AuditJob::Verify(source, a.range.range()?, Checks { keys, anchors }, broker)
            }
            AuditCommand::Export(a) => {
                AuditJob::Export(a.store.settings(AUDIT_POOL)?, a.range.range()?, a.out)
            }
            AuditCommand::Keygen(a) => AuditJob::Keygen(a.out),
        })
    }
}

pub async fn run(job: AuditJob) -> anyhow::Result<ExitCode> {
    match job {
        AuditJob::Seal(store, settings) => seal(store, settings).await,
        AuditJob::Verify(source, range, mut checks, broker) => {
            if let Some(sink) = broker {
                checks.anchors = Some(anchors_from_broker(&sink).await.map_err(anyhow::Error::msg)?);
            }
            verify(source, range, checks).await
        }
        AuditJob::Export(store, range, out) => export(store, range, out).await,
        AuditJob::Keygen(out) => {
            let id = signing::keygen(&out).map_err(anyhow::Error::msg)?;
            out!(
                "wrote {} (private, mode 0600) and {} (public); key id {id}",
                out.display(),
                signing::public_path(&out).display()
            )?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `--anchors`: a file, read now, or a broker to read back before verifying.
fn anchor_source(
    anchors: Option<&str>,
    stream: &str,
) -> Result<(Option<Anchors>, Option<Box<SinkSettings>>), ConfigError> {
    let Some(given) = anchors else {
        return Ok((None, None));
    };
    if !given.contains("://") {
        let read = Anchors::read(std::path::Path::new(given))
            .map_err(|e| ConfigError::new(format!("--anchors: {e}")))?;
        return Ok((Some(read), None));
    }
    let spec = SinkSpec::parse(given).map_err(|e| ConfigError::new(format!("--anchors: {e}")))?;
    if spec.broker().is_none_or(|b| b.reader.is_none()) {
        return Err(ConfigError(format!(
            "--anchors: only a {} broker keeps a log to read back",
            crate::broker::readable_schemes()
        )));
    }
    let mut sink = SinkSettings::new(spec, stream, "oncegate-audit-verify");
    // Every anchor counts, however long the stream: none is taken for trimmed.
    let uncapped = u64::MAX.to_string();
    sink.options
        .set(&crate::broker::redis_stream::STREAM_MAXLEN, uncapped);
    Ok((None, Some(Box::new(sink))))
}

/// The `audit.sealed` events the broker holds, as anchors.
async fn anchors_from_broker(sink: &SinkSettings) -> Result<Anchors, String> {
    let mut log = sink
        .open_log()
        .await?
        .ok_or("--anchors: this broker keeps no log to read back")?;
    let mut anchors = Anchors {
        source: format!("the broker ({})", log.describe()),
        ..Anchors::default()
    };
    loop {
        let batch = log.next_batch(1_000).await?;
        if batch.is_empty() {
            break;
        }
        for body in batch.iter().filter_map(|e| e.body.as_deref()) {
            let Ok(mut value) = serde_json::from_str::<serde_json::Value>(body) else {
                continue;
            };
            if value.get("type").and_then(|t| t.as_str()) != Some(AUDIT_SEALED_EVENT) {
                continue;
            }
            value["type"] = ANCHOR_TYPE.into();
            let anchor = serde_json::from_value::<Anchor>(value)
                .map_err(|e| format!("an audit.sealed event in the broker is not an anchor: {e}"))?;
            anchors.push(anchor);
        }
    }
    log.close().await;
    Ok(anchors)
}

async fn seal(store: StoreSettings, settings: SealSettings) -> anyhow::Result<ExitCode> {
    let store = super::open_store(&store).await?;
    let run = Sealer::new(store, settings).step().await.context("sealing")?;
    let latest = |head: &Option<(i64, String)>| match head {
        Some((seq, digest)) => format!("latest digest: seal {seq} {digest}"),
        None => "no seals yet".to_string(),
    };
    match run {
        SealRun::Sealed {
            seals: Some((first, last)),
            rows,
            head,
        } => out!(
            "sealed {} into {}; {}",
            verify::count(rows, "audit row"),
            verify::seal_range(first, last),
            latest(&head)
        )?,
        SealRun::Sealed {
            seals: None, head, ..
        } => out!("nothing new to seal; {}", latest(&head))?,
        SealRun::Busy => out!("skipped: another instance is sealing")?,
        SealRun::Raced => out!("skipped: another sealer sealed these rows first")?,
        SealRun::Deferred { writers } => {
            out!(
                "deferred: {writers} open transactions may still add audit rows below the boundary; \
                 nothing sealed (raise ONCEGATE_AUDIT_SEAL_WAIT or run again)"
            )?;
            return Ok(ExitCode::from(EXIT_DEFERRED));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Progress on stderr, every two seconds.
fn progress(what: &'static str) -> impl FnMut(u64, u64) + Send {
    let mut last = Instant::now();
    move |done, total| {
        if last.elapsed() >= Duration::from_secs(2) {
            last = Instant::now();
            match total {
                0 => eprintln!("{what}: {done} rows"),
                _ => eprintln!("{what}: {done} of {total} rows ({}%)", done * 100 / total.max(1)),
            }
        }
    }
}

async fn verify(source: Source, range: TimeRange, checks: Checks) -> anyhow::Result<ExitCode> {
    let mut progress = progress("verify");
    if let Some(torn) = checks.anchors.as_ref().map(|a| a.torn).filter(|n| *n > 0) {
        eprintln!("anchors: skipped {torn} line(s) cut short by a crash in the middle of a write");
    }
    let report: VerifyReport = match source {
        Source::Store(settings) => {
            let store = super::open_store(&settings).await?;
            verify::verify_store(&*store, &range, checks, &mut progress)
                .await
                .context("verifying the audit trail")?
        }
        Source::Export(path) => export::verify_export(&path, checks, &mut progress)
            .await
            .with_context(|| format!("verifying the export {}", path.display()))?,
    };
    out!("{report}")?;
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_MISMATCH)
    })
}

async fn export(settings: StoreSettings, range: TimeRange, out: PathBuf) -> anyhow::Result<ExitCode> {
    let store = super::open_store(&settings).await?;
    let summary = export::export(&*store, &range, &Target::for_path(&out), &mut progress("export"))
        .await
        .context("exporting the audit trail")?;
    match summary.latest {
        Some((seq, digest)) => {
            out!(
                "exported {}, {}; latest digest: seal {seq} {digest}",
                verify::count(summary.seals, "seal"),
                verify::count(summary.rows, "row")
            )?;
            for file in &summary.files {
                out!("  {}", file.display())?;
            }
        }
        None => out!("nothing to export: no seals in the range")?,
    }
    Ok(ExitCode::SUCCESS)
}
