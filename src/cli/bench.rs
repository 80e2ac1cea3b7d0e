//! `oncegate bench`: a load generator for a running sidecar (or for the bare
//! echo yardstick, `oncegate bench --serve-echo ADDR`). Clients behave like
//! broker consumers: each delivery is retried until it gets `CLAIMED` or
//! `DUPLICATE`. Reports throughput and HDR latency percentiles per outcome and
//! per deciding tier, and with `--database-url` checks the ledger afterwards
//! (disbursements = unique submissions, totals exact), exiting 2 on a mismatch.

use crate::cli::remote::{Target, TargetArgs};
use crate::error::ConfigError;
mod effects;
mod rate;

use crate::pb::gate_client::GateClient;
use crate::pb::{self, Outcome, Tier};
use crate::store::StoreSettings;
use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use tonic::transport::Channel;

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Concurrent clients (each one request at a time).
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// HTTP/2 connections shared by the clients.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// How long to measure.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Stop after this many measured deliveries instead (whichever comes first).
    #[arg(long)]
    pub deliveries: Option<u64>,
    /// Share of deliveries that are redeliveries of earlier answered submissions.
    #[arg(long, default_value_t = 0.0)]
    pub duplicate_ratio: f64,
    /// Fresh submissions sent before measuring (so redeliveries have targets).
    #[arg(long, default_value_t = 0)]
    pub prime: u64,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 256)]
    pub payload_bytes: usize,
    /// Distinct award ids.
    #[arg(long, default_value_t = 100)]
    pub awards: u64,
    /// Check the ledger through this store URL afterwards (nothing else may write meanwhile).
    #[arg(long, env = "ONCEGATE_BENCH_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Label for the report.
    #[arg(long, default_value = "bench")]
    pub label: String,
    /// Serve the bare tonic echo yardstick on this address instead of benchmarking.
    #[arg(long)]
    pub serve_echo: Option<SocketAddr>,
    /// Suppress the progress line.
    #[arg(long)]
    pub quiet: bool,
    /// Send this many deliveries per second on a fixed schedule, answered or not
    /// (an open loop; latency from each one's scheduled send time), instead of
    /// `--clients` each waiting for its answer. `--clients` then only primes.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Report this process's CPU (millicores, µs per delivery) over the
    /// measured window and its resident memory at the end, from /proc
    /// (the sidecar's or the echo's pid).
    #[arg(long)]
    pub cpu_of: Option<u32>,
    /// Drive the Effects API instead (Begin + Complete of fresh keys; Begins of
    /// completed ones with --duplicate-ratio).
    #[arg(long)]
    pub effects: bool,
    /// Each call's deadline, sent as `grpc-timeout` as the clients send
    /// theirs (each client's default is 10 s); `0s` sends none.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub deadline: Duration,
}

impl BenchArgs {
    /// Checks what clap cannot; the error names the flag.
    pub fn check(&self) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.duplicate_ratio) {
            return Err(ConfigError(format!(
                "--duplicate-ratio must be between 0 and 1, got {}",
                self.duplicate_ratio
            )));
        }
        if let Some(rate) = self.rate
            && !(rate.is_finite() && rate > 0.0 && rate <= 1_000_000.0)
        {
            return Err(ConfigError(format!(
                "--rate must be a number of deliveries per second above 0 and at most 1000000, got {rate}"
            )));
        }
        if self.rate.is_some() && self.effects {
            return Err(ConfigError(
                "--rate drives Submit only; it cannot be combined with --effects".into(),
            ));
        }
        if let Some(url) = &self.database_url
            && !(url.starts_with("postgres://")
                || url.starts_with("postgresql://")
                || url.starts_with("sqlite://"))
        {
            return Err(ConfigError(format!(
                "--database-url must start with postgres:// or sqlite://, got {:?}",
                crate::secret::mask_url(url)
            )));
        }
        Ok(())
    }
}

/// Everything one client measured.
struct ClientStats {
    by_class: BTreeMap<&'static str, Histogram<u64>>,
    errors: BTreeMap<String, u64>,
    retries: u64,
    fresh_answered: u64,
    fresh_cents: i128,
    claimed: u64,
    duplicates: u64,
}

impl ClientStats {
    fn new() -> Self {
        Self {
            by_class: BTreeMap::new(),
            errors: BTreeMap::new(),
            retries: 0,
            fresh_answered: 0,
            fresh_cents: 0,
            claimed: 0,
            duplicates: 0,
        }
    }

    fn record(&mut self, class: &'static str, micros: u64) {
        self.by_class
            .entry(class)
            .or_insert_with(|| Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"))
            .saturating_record(micros.max(1));
    }

    fn merge(&mut self, other: ClientStats) {
        for (k, h) in other.by_class {
            match self.by_class.get_mut(k) {
                Some(mine) => mine.add(&h).expect("same bounds"),
                None => {
                    self.by_class.insert(k, h);
                }
            }
        }
        for (k, n) in other.errors {
            *self.errors.entry(k).or_default() += n;
        }
        self.retries += other.retries;
        self.fresh_answered += other.fresh_answered;
        self.fresh_cents += other.fresh_cents;
        self.claimed += other.claimed;
        self.duplicates += other.duplicates;
    }
}

/// Deterministic submissions: delivery `n` of run `run` always has the same
/// award, timestamp, payload and amount, so a redelivery regenerates it.
struct Generator {
    run: String,
    timestamp: String,
    payload_bytes: usize,
    awards: u64,
}

impl Generator {
    fn submission(&self, n: u64) -> pb::Submission {
        let mut payload = vec![0u8; self.payload_bytes.max(8)];
        payload[..8].copy_from_slice(&n.to_le_bytes());
        rand::rngs::SmallRng::seed_from_u64(n).fill(&mut payload[8..]);
        pb::Submission {
            award_id: format!("{}-{}", self.run, n % self.awards.max(1)),
            submission_timestamp: self.timestamp.clone(),
            payload,
            amount_cents: self.amount(n),
            idempotency_key: None,
        }
    }

    fn amount(&self, n: u64) -> i64 {
        1 + (n % 9_973) as i64
    }
}

struct Shared {
    generator: Generator,
    next_fresh: AtomicU64,
    measured: AtomicU64,
    stop_at: Option<u64>,
    /// Each call's `grpc-timeout` (`--deadline`), none when zero.
    deadline: Option<Duration>,
}

/// Sends one delivery until it is answered; returns the decision.
async fn deliver(
    client: &mut GateClient<Channel>,
    s: &pb::Submission,
    deadline: Option<Duration>,
    stats: &mut ClientStats,
) -> Option<(pb::Decision, u64)> {
    let mut backoff = Duration::from_millis(5);
    let give_up = Instant::now() + Duration::from_secs(30);
    loop {
        let start = Instant::now();
        let mut request = tonic::Request::new(s.clone());
        if let Some(d) = deadline {
            request.set_timeout(d);
        }
        match client.submit(request).await {
            Ok(d) => return Some((d.into_inner(), start.elapsed().as_micros() as u64)),
            Err(status) => {
                *stats.errors.entry(format!("{:?}", status.code())).or_default() += 1;
                if Instant::now() > give_up {
                    return None;
                }
                stats.retries += 1;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
        }
    }
}

async fn client_loop(
    mut client: GateClient<Channel>,
    shared: Arc<Shared>,
    mut history: Vec<u64>,
    ratio: f64,
    until: Instant,
    seed: u64,
) -> ClientStats {
    let mut stats = ClientStats::new();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    while Instant::now() < until {
        if let Some(limit) = shared.stop_at
            && shared.measured.fetch_add(1, Ordering::Relaxed) >= limit
        {
            break;
        }
        let redeliver = !history.is_empty() && rng.random_bool(ratio.clamp(0.0, 1.0));
        let n = if redeliver {
            history[rng.random_range(0..history.len())]
        } else {
            shared.next_fresh.fetch_add(1, Ordering::Relaxed)
        };
        let s = shared.generator.submission(n);
        let Some((d, micros)) = deliver(&mut client, &s, shared.deadline, &mut stats).await else {
            continue;
        };
        if !redeliver {
            history.push(n);
            stats.fresh_answered += 1;
            stats.fresh_cents += s.amount_cents as i128;
        }
        let outcome = if d.outcome == Outcome::Claimed as i32 {
            stats.claimed += 1;
            "CLAIMED"
        } else {
            stats.duplicates += 1;
            "DUPLICATE"
        };
        stats.record(outcome, micros);
        let tier = match Tier::try_from(d.decided_by) {
            Ok(Tier::LocalCache) => "by LOCAL_CACHE",
            Ok(Tier::Redis) => "by REDIS",
            Ok(Tier::Database) => "by DATABASE",
            _ => "by UNKNOWN",
        };
        stats.record(tier, micros);
        stats.record("ALL", micros);
    }
    stats
}

async fn channels(target: &Target, n: usize) -> anyhow::Result<Vec<Channel>> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n.max(1) {
        out.push(target.connect_with(target.endpoint().tcp_nodelay(true)).await?);
    }
    Ok(out)
}

/// Runs the benchmark (or the echo server).
pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    if let Some(addr) = args.serve_echo {
        serve_echo(addr).await?;
        return Ok(ExitCode::SUCCESS);
    }
    if args.effects {
        return run_effects(args).await;
    }
    let store = match &args.database_url {
        Some(url) => {
            let settings = StoreSettings::new(url.clone(), 2);
            Some(
                crate::store::open(&settings)
                    .await
                    .context("opening --database-url")?,
            )
        }
        None => None,
    };
    let before = match &store {
        Some(s) => Some(s.ledger_summary().await.context("reading the ledger")?),
        None => None,
    };
    let shared = Arc::new(Shared {
        generator: Generator {
            run: format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]),
            timestamp: crate::time_fmt::rfc3339(time::OffsetDateTime::now_utc()),
            payload_bytes: args.payload_bytes,
            awards: args.awards,
        },
        next_fresh: AtomicU64::new(0),
        measured: AtomicU64::new(0),
        stop_at: args.deliveries,
        deadline: (!args.deadline.is_zero()).then_some(args.deadline),
    });
    let chans = channels(&args.target, args.connections).await?;
    let (histories, primed) = prime(&args, &shared, &chans).await?;
    let (elapsed, total, open, process) = measure_watched(&args, &shared, &chans, histories).await?;
    let ledger = match (&store, before) {
        (Some(s), Some(before)) => Some(check_ledger(&**s, &before, &primed, &total).await?),
        _ => None,
    };
    let mut report = Report::new(&args, elapsed, &total, ledger);
    report.open = open;
    report.process = process;
    if args.json {
        out!("{}", serde_json::to_string_pretty(&report.json())?)?;
    } else {
        report.print()?;
    }
    Ok(match report.ledger {
        Some(LedgerCheck { ok: false, .. }) => ExitCode::from(2),
        _ => ExitCode::SUCCESS,
    })
}

/// The measured run, closed or open loop (`--rate`), with the `--cpu-of`
/// process's usage over exactly that window.
async fn measure_watched(
    args: &BenchArgs,
    shared: &Arc<Shared>,
    chans: &[Channel],
    histories: Vec<Vec<u64>>,
) -> anyhow::Result<(
    Duration,
    ClientStats,
    Option<rate::RateRun>,
    Option<rate::ProcUsage>,
)> {
    let cpu_before = match args.cpu_of {
        Some(pid) => Some(rate::ProcSample::read(pid).context("--cpu-of")?),
        None => None,
    };
    let (elapsed, total, open) = match args.rate {
        Some(r) => {
            let (e, t, o) = rate::measure(args, r, shared, chans, histories).await?;
            (e, t, Some(o))
        }
        None => {
            let (e, t) = measure(args, shared, chans, histories).await?;
            (e, t, None)
        }
    };
    let process = match (args.cpu_of, cpu_before) {
        (Some(pid), Some(before)) => {
            let after = rate::ProcSample::read(pid).context("--cpu-of")?;
            Some(rate::ProcUsage::between(
                pid,
                before,
                after,
                total.claimed + total.duplicates,
            ))
        }
        _ => None,
    };
    Ok((elapsed, total, open, process))
}

/// `--effects`: every client through the Effects API for the duration.
async fn run_effects(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let chans = channels(&args.target, args.connections).await?;
    let run: Arc<str> = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]).into();
    let next = Arc::new(AtomicU64::new(0));
    let args = Arc::new(args);
    let started = Instant::now();
    let until = started + args.duration;
    let mut tasks = tokio::task::JoinSet::new();
    for (c, chan) in (0..args.clients.max(1)).zip(chans.iter().cycle()) {
        let client = crate::pb::effects_client::EffectsClient::new(chan.clone());
        tasks.spawn(effects::client_loop(
            client,
            run.clone(),
            next.clone(),
            args.clone(),
            until,
            c as u64 + 1,
        ));
    }
    let mut total = ClientStats::new();
    while let Some(done) = tasks.join_next().await {
        total.merge(done?);
    }
    let report = Report::new(&args, started.elapsed(), &total, None);
    if args.json {
        out!("{}", serde_json::to_string_pretty(&report.json())?)?;
    } else {
        report.print()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Fresh submissions before measuring, split over the clients' histories
/// (so redeliveries have targets).
async fn prime(
    args: &BenchArgs,
    shared: &Arc<Shared>,
    chans: &[Channel],
) -> anyhow::Result<(Vec<Vec<u64>>, ClientStats)> {
    let clients = args.clients.max(1);
    let mut histories: Vec<Vec<u64>> = vec![Vec::new(); clients];
    let mut primed = ClientStats::new();
    if args.prime == 0 {
        return Ok((histories, primed));
    }
    let per = args.prime.div_ceil(clients as u64);
    let mut tasks = tokio::task::JoinSet::new();
    for (c, chan) in (0..clients).zip(chans.iter().cycle()) {
        let mut client = GateClient::new(chan.clone());
        let shared = shared.clone();
        tasks.spawn(async move {
            let mut stats = ClientStats::new();
            let mut mine = Vec::new();
            for _ in 0..per {
                let n = shared.next_fresh.fetch_add(1, Ordering::Relaxed);
                let s = shared.generator.submission(n);
                if deliver(&mut client, &s, shared.deadline, &mut stats)
                    .await
                    .is_some()
                {
                    mine.push(n);
                    stats.fresh_answered += 1;
                    stats.fresh_cents += s.amount_cents as i128;
                }
            }
            (c, mine, stats)
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (c, mine, stats) = done?;
        histories[c] = mine;
        primed.merge(stats);
    }
    Ok((histories, primed))
}

/// The measured run: every client until the duration (or delivery count).
async fn measure(
    args: &BenchArgs,
    shared: &Arc<Shared>,
    chans: &[Channel],
    histories: Vec<Vec<u64>>,
) -> anyhow::Result<(Duration, ClientStats)> {
    let started = Instant::now();
    let until = started + args.duration;
    let mut tasks = tokio::task::JoinSet::new();
    for ((c, history), chan) in histories.into_iter().enumerate().zip(chans.iter().cycle()) {
        tasks.spawn(client_loop(
            GateClient::new(chan.clone()),
            shared.clone(),
            history,
            args.duplicate_ratio,
            until,
            c as u64 + 1,
        ));
    }
    let progress = (!args.quiet).then(|| tokio::spawn(show_progress(shared.clone(), started)));
    let mut total = ClientStats::new();
    while let Some(done) = tasks.join_next().await {
        total.merge(done?);
    }
    let elapsed = started.elapsed();
    if let Some(p) = progress {
        p.abort();
        eprintln!();
    }
    Ok((elapsed, total))
}

/// A progress line on stderr, once a second, until aborted.
async fn show_progress(shared: Arc<Shared>, started: Instant) {
    let mut last = 0;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let fresh = shared.next_fresh.load(Ordering::Relaxed);
        eprint!(
            "\r{:>5.1}s  fresh submissions so far: {fresh} (+{}/s)   ",
            started.elapsed().as_secs_f64(),
            fresh - last
        );
        last = fresh;
    }
}

struct LedgerCheck {
    ok: bool,
    detail: String,
}

async fn check_ledger(
    store: &dyn crate::store::Store,
    before: &crate::store::LedgerSummary,
    primed: &ClientStats,
    measured: &ClientStats,
) -> anyhow::Result<LedgerCheck> {
    let after = store.ledger_summary().await.context("reading the ledger")?;
    let expected_rows = (primed.fresh_answered + measured.fresh_answered) as i64;
    let expected_cents = (primed.fresh_cents + measured.fresh_cents) as i64;
    let rows = after.disbursements - before.disbursements;
    let cents = after.total_cents - before.total_cents;
    let ok = rows == expected_rows
        && cents == expected_cents
        && after.mismatched_awards == 0
        && after.sequence_gaps == 0;
    let detail = format!(
        "disbursements +{rows} (unique submissions {expected_rows}), total +{cents} cents (expected {expected_cents}), \
         awards with totals off: {}, sequence gaps: {}",
        after.mismatched_awards, after.sequence_gaps
    );
    Ok(LedgerCheck { ok, detail })
}

struct Report {
    label: String,
    clients: usize,
    elapsed: Duration,
    deliveries: u64,
    claimed: u64,
    duplicates: u64,
    retries: u64,
    errors: BTreeMap<String, u64>,
    latency: Vec<(String, u64, [f64; 4])>,
    ledger: Option<LedgerCheck>,
    open: Option<rate::RateRun>,
    process: Option<rate::ProcUsage>,
}

impl Report {
    fn new(args: &BenchArgs, elapsed: Duration, s: &ClientStats, ledger: Option<LedgerCheck>) -> Self {
        let latency = s
            .by_class
            .iter()
            .map(|(k, h)| {
                let q = |p: f64| h.value_at_quantile(p) as f64 / 1000.0;
                (k.to_string(), h.len(), [q(0.5), q(0.9), q(0.99), q(0.999)])
            })
            .collect();
        Self {
            label: args.label.clone(),
            clients: args.clients,
            elapsed,
            deliveries: s.claimed + s.duplicates,
            claimed: s.claimed,
            duplicates: s.duplicates,
            retries: s.retries,
            errors: s.errors.clone(),
            latency,
            ledger,
            open: None,
            process: None,
        }
    }

    fn rate(&self, n: u64) -> f64 {
        n as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn print(&self) -> Result<(), crate::cli::StdoutError> {
        out!(
            "{}: {} clients, {:.1}s: {} deliveries = {:.0}/s (fresh claims {:.0}/s, duplicates {:.0}/s); retries {}; errors {:?}",
            self.label,
            self.clients,
            self.elapsed.as_secs_f64(),
            self.deliveries,
            self.rate(self.deliveries),
            self.rate(self.claimed),
            self.rate(self.duplicates),
            self.retries,
            self.errors
        )?;
        out!(
            "  {:<16} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "latency (ms)",
            "count",
            "p50",
            "p90",
            "p99",
            "p99.9"
        )?;
        for (k, n, q) in &self.latency {
            out!(
                "  {:<16} {:>9} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                k,
                n,
                q[0],
                q[1],
                q[2],
                q[3]
            )?;
        }
        if let Some(o) = &self.open {
            out!(
                "  open loop: {:.0}/s offered, {} scheduled, at most {} outstanding",
                o.offered,
                o.scheduled,
                o.max_in_flight
            )?;
        }
        if let Some(p) = &self.process {
            out!(
                "  process {}: {:.0} mCPU, {:.1} µs CPU and {:.2} thread sleeps per delivery, RSS {:.1} MiB",
                p.pid,
                p.millicores,
                p.cpu_us_per_op,
                p.switches_per_op,
                p.rss_mib
            )?;
        }
        if let Some(l) = &self.ledger {
            out!(
                "  ledger: {} — {}",
                if l.ok { "OK" } else { "MISMATCH" },
                l.detail
            )?;
        }
        Ok(())
    }

    fn json(&self) -> serde_json::Value {
        let latency: serde_json::Map<String, serde_json::Value> = self
            .latency
            .iter()
            .map(|(k, n, q)| {
                (
                    k.clone(),
                    serde_json::json!({"count": n, "p50_ms": q[0], "p90_ms": q[1], "p99_ms": q[2], "p999_ms": q[3]}),
                )
            })
            .collect();
        serde_json::json!({
            "label": self.label,
            "clients": self.clients,
            "seconds": self.elapsed.as_secs_f64(),
            "deliveries": self.deliveries,
            "deliveries_per_s": self.rate(self.deliveries),
            "claims_per_s": self.rate(self.claimed),
            "duplicates_per_s": self.rate(self.duplicates),
            "retries": self.retries,
            "errors": self.errors,
            "latency": latency,
            "ledger_ok": self.ledger.as_ref().map(|l| l.ok),
            "ledger": self.ledger.as_ref().map(|l| l.detail.clone()),
            "offered_per_s": self.open.as_ref().map(|o| o.offered),
            "scheduled": self.open.as_ref().map(|o| o.scheduled),
            "max_in_flight": self.open.as_ref().map(|o| o.max_in_flight),
            "process": self.process.as_ref().map(|p| serde_json::json!({
                "pid": p.pid,
                "millicores": p.millicores,
                "cpu_us_per_op": p.cpu_us_per_op,
                "rss_mib": p.rss_mib,
                "switches_per_op": p.switches_per_op,
            })),
        })
    }
}

/// The transport's limit: the same service and messages, answered at once.
struct Echo;

#[tonic::async_trait]
impl pb::gate_server::Gate for Echo {
    async fn submit(
        &self,
        req: tonic::Request<pb::Submission>,
    ) -> Result<tonic::Response<pb::Decision>, tonic::Status> {
        let s = req.into_inner();
        Ok(tonic::Response::new(pb::Decision {
            outcome: Outcome::Duplicate as i32,
            idempotency_key: "0".repeat(64),
            disbursement: Some(pb::Disbursement {
                id: "00000000-0000-0000-0000-000000000000".into(),
                award_id: s.award_id,
                amount_cents: s.amount_cents,
                recorded_at: "2026-01-01T00:00:00.000000Z".into(),
                sequence: 1,
            }),
            decided_by: Tier::LocalCache as i32,
        }))
    }

    async fn submit_batch(
        &self,
        _: tonic::Request<pb::SubmitBatchRequest>,
    ) -> Result<tonic::Response<pb::SubmitBatchResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("echo serves Submit only"))
    }

    async fn lookup(
        &self,
        _: tonic::Request<pb::LookupRequest>,
    ) -> Result<tonic::Response<pb::LookupResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("echo serves Submit only"))
    }
}

async fn serve_echo(addr: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    eprintln!("echo yardstick listening on {}", listener.local_addr()?);
    tonic::transport::Server::builder()
        .add_service(pb::gate_server::GateServer::new(Echo))
        .serve_with_incoming_shutdown(crate::app::incoming(listener), crate::shutdown::signal())
        .await?;
    Ok(())
}
