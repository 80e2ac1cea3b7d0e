//! `oncegate effect begin|complete|release` (calls to a running sidecar's
//! `oncegate.v1.Effects`) and `oncegate effect get` (the record as stored,
//! read from the database: state, attempt, lease, response; never the
//! request, which is not stored).

use crate::cli::remote::{Target, TargetArgs, print_status};
use crate::config::StoreArgs;
use crate::error::ConfigError;
use crate::pb;
use crate::pb::effects_client::EffectsClient;
use crate::store::StoreSettings;
use anyhow::Context;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Clone, Args)]
pub struct EffectArgs {
    #[command(subcommand)]
    pub command: EffectCommand,
}

#[derive(Debug, Clone, Subcommand)]
pub enum EffectCommand {
    /// Take the record's lease, or print its stored response (waits for a live lease held elsewhere).
    Begin(BeginArgs),
    /// Commit the response under the lease.
    Complete(CompleteArgs),
    /// Give the lease back: the effect certainly did not happen.
    Release(ReleaseArgs),
    /// Print the record as stored (from the database).
    Get(GetArgs),
}

/// The record a call is about.
#[derive(Debug, Clone, Args)]
pub struct RecordArgs {
    /// 1-64 characters of [a-z0-9._-].
    #[arg(long)]
    pub namespace: String,
    #[arg(long)]
    pub key: String,
}

#[derive(Debug, Clone, Args)]
pub struct BeginArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub record: RecordArgs,
    /// The request text (hashed into the fingerprint, never stored).
    #[arg(long, conflicts_with = "request_file")]
    pub request: Option<String>,
    #[arg(long)]
    pub request_file: Option<PathBuf>,
    /// Lease length (default 30s, at most 15m).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub lease_ttl: Option<Duration>,
    /// How long to wait for a lease held elsewhere.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

#[derive(Debug, Clone, Args)]
pub struct CompleteArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub record: RecordArgs,
    #[arg(long)]
    pub lease_token: String,
    /// The response text to store.
    #[arg(long, conflicts_with = "response_file")]
    pub response: Option<String>,
    #[arg(long)]
    pub response_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub record: RecordArgs,
    #[arg(long)]
    pub lease_token: String,
    /// Why the effect did not happen (audited).
    #[arg(long, default_value = "")]
    pub reason: String,
}

#[derive(Debug, Clone, Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub record: RecordArgs,
}

/// A resolved `effect` subcommand.
#[derive(Debug, Clone)]
pub enum EffectJob {
    Begin(BeginArgs),
    Complete(CompleteArgs),
    Release(ReleaseArgs),
    Get(StoreSettings, RecordArgs),
}

impl EffectArgs {
    pub fn resolve(self, max_pool: u32) -> Result<EffectJob, ConfigError> {
        Ok(match self.command {
            EffectCommand::Begin(a) => EffectJob::Begin(a),
            EffectCommand::Complete(a) => EffectJob::Complete(a),
            EffectCommand::Release(a) => EffectJob::Release(a),
            EffectCommand::Get(a) => EffectJob::Get(a.store.settings(max_pool)?, a.record),
        })
    }
}

pub async fn run(job: EffectJob) -> anyhow::Result<ExitCode> {
    match job {
        EffectJob::Begin(a) => begin(a).await,
        EffectJob::Complete(a) => complete(a).await,
        EffectJob::Release(a) => release(a).await,
        EffectJob::Get(store, record) => get(store, record).await,
    }
}

async fn connect(target: &Target) -> anyhow::Result<EffectsClient<tonic::transport::Channel>> {
    Ok(EffectsClient::new(target.connect().await?))
}

fn bytes_of(text: &Option<String>, file: &Option<PathBuf>) -> anyhow::Result<Vec<u8>> {
    Ok(match (text, file) {
        (Some(t), _) => t.clone().into_bytes(),
        (None, Some(f)) => std::fs::read(f).with_context(|| format!("reading {}", f.display()))?,
        (None, None) => Vec::new(),
    })
}

async fn begin(a: BeginArgs) -> anyhow::Result<ExitCode> {
    let mut client = connect(&a.target).await?;
    let mut request = tonic::Request::new(pb::BeginRequest {
        namespace: a.record.namespace,
        idempotency_key: a.record.key,
        request: bytes_of(&a.request, &a.request_file)?,
        lease_ttl: a.lease_ttl.map(|d| prost_types::Duration {
            seconds: d.as_secs() as i64,
            nanos: d.subsec_nanos() as i32,
        }),
    });
    request.set_timeout(a.timeout);
    let outcome = match client.begin(request).await {
        Ok(r) => r.into_inner().outcome,
        Err(s) => return Ok(print_status(&s)),
    };
    match outcome {
        Some(pb::begin_response::Outcome::Acquired(l)) => {
            out!("ACQUIRED attempt={} lease_token={}", l.attempt, l.lease_token)?;
        }
        Some(pb::begin_response::Outcome::Completed(c)) => {
            let tier = pb::Tier::try_from(c.decided_by).map_or("?", |t| t.as_str_name());
            out!(
                "COMPLETED attempt={} completed_at={} by {tier}",
                c.attempt,
                c.completed_at
            )?;
            out!("{}", String::from_utf8_lossy(&c.response))?;
        }
        None => anyhow::bail!("the sidecar answered Begin without an outcome"),
    }
    Ok(ExitCode::SUCCESS)
}

async fn complete(a: CompleteArgs) -> anyhow::Result<ExitCode> {
    let mut client = connect(&a.target).await?;
    let request = pb::CompleteRequest {
        namespace: a.record.namespace,
        idempotency_key: a.record.key,
        lease_token: a.lease_token,
        response: bytes_of(&a.response, &a.response_file)?,
    };
    match client.complete(request).await {
        Ok(r) => {
            out!("COMPLETED completed_at={}", r.into_inner().completed_at)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(s) => Ok(print_status(&s)),
    }
}

async fn release(a: ReleaseArgs) -> anyhow::Result<ExitCode> {
    let mut client = connect(&a.target).await?;
    let request = pb::ReleaseRequest {
        namespace: a.record.namespace,
        idempotency_key: a.record.key,
        lease_token: a.lease_token,
        reason: a.reason,
    };
    match client.release(request).await {
        Ok(_) => {
            out!("RELEASED")?;
            Ok(ExitCode::SUCCESS)
        }
        Err(s) => Ok(print_status(&s)),
    }
}

async fn get(settings: StoreSettings, record: RecordArgs) -> anyhow::Result<ExitCode> {
    crate::effects::validate_namespace(&record.namespace)?;
    let store = crate::store::open(&settings).await.context("opening the store")?;
    let Some(r) = store
        .effect_get(&record.namespace, &record.key)
        .await
        .context("reading the record")?
    else {
        out!("not found")?;
        return Ok(ExitCode::from(1));
    };
    let when = |t: Option<time::OffsetDateTime>| t.map_or("-".to_string(), crate::time_fmt::rfc3339);
    out!(
        "{} attempt={} lease_expires_at={} updated_at={}",
        r.state.to_uppercase(),
        r.attempt,
        when(r.lease_expires_at),
        crate::time_fmt::rfc3339(r.updated_at)
    )?;
    if let Some(c) = r.completed {
        out!(
            "  completed_at={} response_bytes={} response_sha256={}",
            crate::time_fmt::rfc3339(c.completed_at),
            c.response.len(),
            crate::key::payload_digest(&c.response)
        )?;
        out!("{}", String::from_utf8_lossy(&c.response))?;
    }
    Ok(ExitCode::SUCCESS)
}
