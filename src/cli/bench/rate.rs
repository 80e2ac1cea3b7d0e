//! `oncegate bench --rate N`: an open loop. Deliveries are sent on a fixed
//! schedule (the n-th at `start + n / N`) whether or not earlier ones were
//! answered, and each one's latency runs from its *scheduled* send time, not
//! from when it went out: a server that stalls is charged for every delivery
//! it held up (no coordinated omission, which a closed loop of clients hides
//! by sending less while the server is slow). A delivery answered
//! `UNAVAILABLE` or the like is retried as a consumer would, its latency
//! still counted from its schedule.
//!
//! With `--cpu-of PID` the measured window's CPU time of that process (the
//! sidecar, or the echo) is read from `/proc/PID/stat`, and its resident
//! memory from `/proc/PID/status` at the end: millicores at the offered
//! rate, the figure sidecars are compared by.

use super::{BenchArgs, ClientStats, Shared};
use crate::pb::gate_client::GateClient;
use crate::pb::{Outcome, Tier};
use rand::{Rng, SeedableRng};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tonic::transport::Channel;

/// What the open loop adds to the report.
pub(super) struct RateRun {
    /// The offered rate (deliveries per second).
    pub offered: f64,
    /// Deliveries scheduled in the window.
    pub scheduled: u64,
    /// The most deliveries outstanding at once.
    pub max_in_flight: u64,
}

/// State the schedule's deliveries share.
struct Open {
    stats: Mutex<ClientStats>,
    /// Redelivery targets: the primed submissions and every fresh one answered.
    history: Mutex<Vec<u64>>,
    in_flight: std::sync::atomic::AtomicU64,
    max_in_flight: std::sync::atomic::AtomicU64,
}

/// Runs the schedule for `args.duration` (or `--deliveries`), then waits for
/// the deliveries still outstanding.
pub(super) async fn measure(
    args: &BenchArgs,
    rate: f64,
    shared: &Arc<Shared>,
    chans: &[Channel],
    histories: Vec<Vec<u64>>,
) -> anyhow::Result<(Duration, ClientStats, RateRun)> {
    let open = Arc::new(Open {
        stats: Mutex::new(ClientStats::new()),
        history: Mutex::new(histories.into_iter().flatten().collect()),
        in_flight: Default::default(),
        max_in_flight: Default::default(),
    });
    let clients: Vec<GateClient<Channel>> = chans.iter().cloned().map(GateClient::new).collect();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    let mut tasks = tokio::task::JoinSet::new();
    let started = Instant::now();
    let mut scheduled = 0u64;
    loop {
        let due = started + Duration::from_secs_f64(scheduled as f64 / rate);
        if due - started >= args.duration || shared.stop_at.is_some_and(|n| scheduled >= n) {
            break;
        }
        tokio::time::sleep_until(due).await;
        // (reap finished deliveries so the set stays small)
        while let Some(done) = tasks.try_join_next() {
            done?;
        }
        let redeliver = args.duplicate_ratio > 0.0 && rng.random_bool(args.duplicate_ratio);
        let n = if redeliver {
            let history = open.history.lock().expect("not poisoned");
            (!history.is_empty()).then(|| history[rng.random_range(0..history.len())])
        } else {
            None
        };
        let client = clients[scheduled as usize % clients.len()].clone();
        tasks.spawn(one(client, shared.clone(), open.clone(), n, due));
        scheduled += 1;
    }
    while let Some(done) = tasks.join_next().await {
        done?;
    }
    let elapsed = started.elapsed();
    let stats = std::mem::replace(&mut *open.stats.lock().expect("not poisoned"), ClientStats::new());
    let run = RateRun {
        offered: rate,
        scheduled,
        max_in_flight: open.max_in_flight.load(Ordering::Relaxed),
    };
    Ok((elapsed, stats, run))
}

/// One scheduled delivery: a redelivery of `n`, or a fresh submission.
async fn one(
    mut client: GateClient<Channel>,
    shared: Arc<Shared>,
    open: Arc<Open>,
    redeliver: Option<u64>,
    due: Instant,
) {
    let now = open.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
    open.max_in_flight.fetch_max(now, Ordering::Relaxed);
    let n = redeliver.unwrap_or_else(|| shared.next_fresh.fetch_add(1, Ordering::Relaxed));
    let s = shared.generator.submission(n);
    // (errors and retries only: a histogram per delivery would cost more
    // than the delivery; latencies go straight into the shared ones)
    let mut mine = ClientStats::new();
    let answer = super::deliver(&mut client, &s, shared.deadline, &mut mine).await;
    open.in_flight.fetch_sub(1, Ordering::Relaxed);
    let micros = due.elapsed().as_micros() as u64;
    let Some((d, _)) = answer else {
        open.stats.lock().expect("not poisoned").merge(mine);
        return;
    };
    if redeliver.is_none() {
        mine.fresh_answered += 1;
        mine.fresh_cents += s.amount_cents as i128;
        open.history.lock().expect("not poisoned").push(n);
    }
    let outcome = if d.outcome == Outcome::Claimed as i32 {
        mine.claimed += 1;
        "CLAIMED"
    } else {
        mine.duplicates += 1;
        "DUPLICATE"
    };
    let tier = match Tier::try_from(d.decided_by) {
        Ok(Tier::LocalCache) => "by LOCAL_CACHE",
        Ok(Tier::Redis) => "by REDIS",
        Ok(Tier::Database) => "by DATABASE",
        _ => "by UNKNOWN",
    };
    let mut stats = open.stats.lock().expect("not poisoned");
    stats.merge(mine);
    stats.record(outcome, micros);
    stats.record(tier, micros);
    stats.record("ALL", micros);
}

/// A process's CPU time and resident memory, read from `/proc` (Linux).
#[derive(Clone, Copy)]
pub(super) struct ProcSample {
    /// utime + stime, in clock ticks.
    ticks: u64,
    /// VmRSS, KiB.
    rss_kib: u64,
    /// Context switches of all its threads (voluntary: each one a sleep and
    /// a wake-up).
    switches: u64,
    at: std::time::Instant,
}

impl ProcSample {
    /// Reads `/proc/PID/stat` and `/proc/PID/status`; the error names the file.
    pub fn read(pid: u32) -> anyhow::Result<Self> {
        use anyhow::Context;
        let at = std::time::Instant::now();
        let path = format!("/proc/{pid}/stat");
        let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        // Fields after the parenthesised name (which may hold spaces): state
        // is field 3, utime 14, stime 15.
        let rest = stat
            .rsplit_once(')')
            .map(|(_, r)| r)
            .with_context(|| format!("{path}: no ')' after the name"))?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| -> anyhow::Result<u64> {
            fields
                .get(n - 3)
                .and_then(|f| f.parse().ok())
                .with_context(|| format!("{path}: field {n} is not a number"))
        };
        let ticks = field(14)? + field(15)?;
        let path = format!("/proc/{pid}/status");
        let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        let rss_kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("{path}: no VmRSS line"))?;
        Ok(Self {
            ticks,
            rss_kib,
            switches: switches(pid),
            at,
        })
    }
}

/// The voluntary context switches of every thread of `pid` (0 where a thread
/// is gone meanwhile).
fn switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}

/// The watched process over the measured window.
pub(super) struct ProcUsage {
    pub pid: u32,
    /// CPU time over wall time, in thousandths of a core.
    pub millicores: f64,
    /// CPU microseconds per answered delivery.
    pub cpu_us_per_op: f64,
    /// VmRSS at the end, MiB.
    pub rss_mib: f64,
    /// Voluntary context switches (thread sleeps) per answered delivery.
    pub switches_per_op: f64,
}

impl ProcUsage {
    pub fn between(pid: u32, a: ProcSample, b: ProcSample, deliveries: u64) -> Self {
        // /proc counts in USER_HZ, which Linux fixes at 100 in its user-space
        // ABI (sysconf(_SC_CLK_TCK)) on every architecture.
        const USER_HZ: f64 = 100.0;
        let cpu_s = b.ticks.saturating_sub(a.ticks) as f64 / USER_HZ;
        let wall_s = b.at.duration_since(a.at).as_secs_f64().max(1e-9);
        Self {
            pid,
            millicores: cpu_s / wall_s * 1000.0,
            cpu_us_per_op: cpu_s * 1e6 / deliveries.max(1) as f64,
            rss_mib: b.rss_kib as f64 / 1024.0,
            switches_per_op: b.switches.saturating_sub(a.switches) as f64 / deliveries.max(1) as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_usage_is_read_from_proc() {
        let pid = std::process::id();
        let a = ProcSample::read(pid).expect("own /proc entry");
        // Burn some CPU so the window has some.
        let mut x = 0u64;
        let until = std::time::Instant::now() + Duration::from_millis(60);
        while std::time::Instant::now() < until {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let b = ProcSample::read(pid).expect("own /proc entry");
        let u = ProcUsage::between(pid, a, b, 10);
        assert!(u.rss_mib > 0.0, "RSS {}", u.rss_mib);
        assert!(
            u.millicores >= 0.0 && u.millicores <= 64_000.0,
            "{}",
            u.millicores
        );
        assert!((u.cpu_us_per_op * 10.0 - (b.ticks - a.ticks) as f64 * 10_000.0).abs() < 1e-6);
    }

    #[test]
    fn a_missing_process_is_named_in_the_error() {
        let err = ProcSample::read(u32::MAX).err().expect("no such pid");
        assert!(
            format!("{err:#}").contains(&format!("/proc/{}/stat", u32::MAX)),
            "{err:#}"
        );
    }
}
