//! `oncegate submit` and `oncegate lookup`: one call to a running sidecar,
//! its answer printed.

use crate::pb;
use crate::pb::gate_client::GateClient;
use anyhow::Context;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

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

async fn connect(target: &str) -> anyhow::Result<GateClient<tonic::transport::Channel>> {
    GateClient::connect(target.to_string())
        .await
        .with_context(|| format!("connecting to {target}"))
}

fn print_decision(d: &pb::Decision) {
    let outcome = pb::Outcome::try_from(d.outcome)
        .map(|o| o.as_str_name())
        .unwrap_or("?");
    let tier = pb::Tier::try_from(d.decided_by)
        .map(|t| t.as_str_name())
        .unwrap_or("?");
    println!("{outcome} by {tier}");
    println!("  idempotency_key {}", d.idempotency_key);
    if let Some(b) = &d.disbursement {
        println!(
            "  disbursement    {} award={} amount_cents={} sequence={} recorded_at={}",
            b.id, b.award_id, b.amount_cents, b.sequence, b.recorded_at
        );
    }
}

fn print_status(s: &tonic::Status) -> ExitCode {
    eprintln!("{:?}: {}", s.code(), s.message());
    ExitCode::from(1)
}

pub async fn submit(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let payload = match (&args.payload, &args.payload_file) {
        (Some(p), _) => p.clone().into_bytes(),
        (None, Some(f)) => std::fs::read(f).with_context(|| format!("reading {}", f.display()))?,
        (None, None) => Vec::new(),
    };
    let timestamp = args
        .timestamp
        .unwrap_or_else(|| crate::time_fmt::rfc3339(time::OffsetDateTime::now_utc()));
    let mut client = connect(&args.target).await?;
    let request = pb::Submission {
        award_id: args.award_id,
        submission_timestamp: timestamp,
        payload,
        amount_cents: args.amount_cents,
        idempotency_key: args.idempotency_key,
    };
    match client.submit(request).await {
        Ok(d) => {
            print_decision(d.get_ref());
            Ok(ExitCode::SUCCESS)
        }
        Err(s) => Ok(print_status(&s)),
    }
}

pub async fn lookup(args: LookupArgs) -> anyhow::Result<ExitCode> {
    let mut client = connect(&args.target).await?;
    let request = pb::LookupRequest {
        idempotency_key: args.idempotency_key,
    };
    match client.lookup(request).await {
        Ok(r) => match &r.get_ref().decision {
            Some(d) if r.get_ref().found => {
                print_decision(d);
                Ok(ExitCode::SUCCESS)
            }
            _ => {
                println!("not found");
                Ok(ExitCode::from(1))
            }
        },
        Err(s) => Ok(print_status(&s)),
    }
}
