//! The subcommands other than `bench`: `serve`, `migrate`, `key`, `submit`,
//! `lookup`, `purge`, `relay`.

use crate::config::{Command, KeyArgs, LookupArgs, PurgeArgs, RelayArgs, ServeArgs, StoreArgs, SubmitArgs};
use crate::pb;
use crate::pb::gate_client::GateClient;
use crate::relay::Relay;
use anyhow::{Context, bail};
use std::io::{BufRead, Read, Write};
use std::process::ExitCode;

/// Runs one subcommand.
pub async fn dispatch(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve(args) => serve(*args).await,
        Command::Migrate(args) => migrate(args).await,
        Command::Key(args) => key(args),
        Command::Submit(args) => submit(args).await,
        Command::Lookup(args) => lookup(args).await,
        Command::Bench(args) => crate::bench::run(*args).await,
        Command::Purge(args) => purge(args).await,
        Command::Relay(args) => relay(args).await,
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!(signal = "SIGTERM", "signal received"),
        _ = tokio::signal::ctrl_c() => tracing::info!(signal = "SIGINT", "signal received"),
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    tracing::info!(config = %args.describe(), "starting");
    let app = crate::App::build(args).await?;
    let banner = app.banner();
    tracing::info!("{banner}");
    eprintln!("{banner}");
    app.run_until_shutdown(shutdown_signal()).await?;
    Ok(ExitCode::SUCCESS)
}

async fn open_store(args: &StoreArgs) -> anyhow::Result<std::sync::Arc<dyn crate::store::Store>> {
    crate::store::open(&args.url(), args.db_pool_size.min(4))
        .await
        .context("opening the store")
}

async fn migrate(args: StoreArgs) -> anyhow::Result<ExitCode> {
    let store = open_store(&args).await?;
    store.migrate().await.context("migrating")?;
    eprintln!("migrations applied ({})", crate::config::mask_url(&args.url()));
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
    use base64::Engine;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.jsonl {
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
            )?;
        }
        return Ok(ExitCode::SUCCESS);
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
    writeln!(out, "{}", crate::key::derive_key(&award_id, &timestamp, &payload))?;
    Ok(ExitCode::SUCCESS)
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

async fn submit(args: SubmitArgs) -> anyhow::Result<ExitCode> {
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

async fn lookup(args: LookupArgs) -> anyhow::Result<ExitCode> {
    let mut client = connect(&args.target).await?;
    match client
        .lookup(pb::LookupRequest {
            idempotency_key: args.idempotency_key,
        })
        .await
    {
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

async fn purge(args: PurgeArgs) -> anyhow::Result<ExitCode> {
    let store = open_store(&args.store).await?;
    let report = crate::retention::Retention::new(store, args.retention.policy())
        .step()
        .await
        .context("purging")?;
    if report.ran {
        println!(
            "purged claims={} audit={} outbox={}",
            report.claims_deleted, report.audit_deleted, report.outbox_deleted
        );
    } else {
        println!("skipped: another instance is purging");
    }
    Ok(ExitCode::SUCCESS)
}

async fn relay(args: RelayArgs) -> anyhow::Result<ExitCode> {
    let store = open_store(&args.store).await?;
    let Some(relay) = Relay::from_config(&args.relay, store, crate::config::hostname()).await? else {
        bail!("ONCEGATE_RELAY_SINK is none: nothing to relay to");
    };
    let listener = tokio::net::TcpListener::bind(args.metrics_listen)
        .await
        .with_context(|| format!("binding ONCEGATE_METRICS_LISTEN on {}", args.metrics_listen))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut metrics_rx = stop_rx.clone();
    let metrics = tokio::spawn(crate::metrics::serve(listener, async move {
        let _ = metrics_rx.wait_for(|v| *v).await;
    }));
    let running = tokio::spawn(relay.run(stop_rx));
    shutdown_signal().await;
    let _ = stop_tx.send(true);
    let _ = running.await;
    let _ = metrics.await;
    Ok(ExitCode::SUCCESS)
}
