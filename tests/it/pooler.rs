//! Behind a transaction-pooling PgBouncer (ONCEGATE_DB_POOLER=transaction;
//! Debian's `pgbouncer`, `pool_mode = transaction`). A pooler keeps the
//! sidecars' own connections open across a failover — no new connection
//! reads the new primary's identity — so only the identity probe (and a
//! claim that loses its server) can tell; and every transaction may run on
//! another server connection, so nothing of a session survives one.
//!
//! The failover of `failover::Pair` (asynchronous standby, its link cut, the
//! primary killed, the standby promoted, the Service repointed) with both
//! sidecars behind the pooler: the claims acknowledged after the cut are
//! lost, and no cache answers for any of them after the promotion.

use crate::chaos::{run as run_ok, running_as_root};
use crate::failover::{Pair, run};
use crate::helpers::*;
use crate::sync_guard::{Call, Consumers, acked_after, claimed_after};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

/// A PgBouncer of the test's own in transaction mode, in front of `upstream`.
struct Bouncer {
    port: u16,
    dir: tempfile::TempDir,
}

impl Bouncer {
    async fn start(upstream: SocketAddr) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let ini = dir.path().join("pgbouncer.ini");
        // Quick to retry a server that refused (the default waits 15 s).
        let config = format!(
            "[databases]\npostgres = host=127.0.0.1 port={} dbname=postgres user=root\n\
             [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = trust\nauth_file = {d}/users.txt\npool_mode = transaction\n\
             default_pool_size = 8\nmax_client_conn = 200\nignore_startup_parameters = extra_float_digits\n\
             server_login_retry = 1\nserver_connect_timeout = 2\nquery_wait_timeout = 10\n\
             logfile = {d}/pgbouncer.log\npidfile = {d}/pgbouncer.pid\n",
            upstream.port(),
            d = dir.path().display()
        );
        std::fs::write(&ini, config).unwrap();
        std::fs::write(dir.path().join("users.txt"), "\"root\" \"\"\n").unwrap();
        let mut cmd = if running_as_root() {
            // PgBouncer refuses to run as root.
            run_ok(
                std::process::Command::new("chown")
                    .args(["-R", "postgres"])
                    .arg(dir.path()),
            );
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--", "pgbouncer"]);
            c
        } else {
            std::process::Command::new("pgbouncer")
        };
        run_ok(cmd.arg("-d").arg(&ini));
        let up = eventually(Duration::from_secs(10), || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok()
        })
        .await;
        assert!(up, "pgbouncer listens on {port}");
        Self { port, dir }
    }

    fn url(&self) -> String {
        format!("postgres://root@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.path().join("pgbouncer.pid")) {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", pid.trim()])
                .status();
        }
    }
}

/// Sidecar `i` behind the bouncer in transaction mode, with Redis (L2
/// under `prefix`).
async fn sidecar_behind(bouncer: &Bouncer, prefix: &str, i: usize) -> Sidecar {
    let extra = [
        ("ONCEGATE_DB_POOLER", "transaction".to_string()),
        // What a transaction pooler cannot carry runs elsewhere.
        ("ONCEGATE_MIGRATE_ON_START", "false".into()),
        ("ONCEGATE_RECONCILE_INTERVAL", "0s".into()),
        ("ONCEGATE_AUDIT_VERIFY_INTERVAL", "0s".into()),
        ("REDIS_URL", redis_url()),
        ("ONCEGATE_REDIS_KEY_PREFIX", prefix.to_string()),
    ];
    start_sidecar(bouncer.url(), format!("pb-{i}"), &extra).await
}

async fn identity_confirmed(s: &Sidecar) -> Option<f64> {
    metric(&s.metrics().await, "oncegate_store_identity_confirmed")
}

/// Every submission answered so far, redelivered to each of `sidecars`.
async fn sweep(load: &Consumers, sidecars: &[&Sidecar]) -> Vec<Call> {
    let addrs: Vec<SocketAddr> = sidecars.iter().map(|s| s.addr).collect();
    let (sweeper, none) = Consumers::start(&addrs, 0);
    let answered = load.answered.lock().unwrap().clone();
    for (i, s) in answered.iter().enumerate() {
        for k in 0..addrs.len() {
            assert!(
                sweeper.deliver(s, i * addrs.len() + k).await,
                "answered in the sweep"
            );
        }
    }
    sweeper.stop(none).await
}

/// The failover behind the pooler, asynchronous standby: the new primary's
/// identity is seen (both sidecars count the failover, and a claim succeeds
/// after the promotion without a restart), the claims acknowledged after
/// the cut are lost, and no cache answers for any of them after the
/// promotion — not on the two sidecars, not on a third started afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_behind_a_transaction_pooler_is_seen_and_no_cache_answers_for_a_lost_commit() {
    let pair = Pair::start(false).await;
    let (code, err) = run(&["migrate", "--database-url", &pair.url()], &[]).await;
    assert_eq!(code, 0, "migrated: {err}");
    let bouncer = Bouncer::start(pair.service.addr).await;
    let prefix = unique("pb:");
    let a = sidecar_behind(&bouncer, &prefix, 0).await;
    let b = sidecar_behind(&bouncer, &prefix, 1).await;
    let (load, handles) = Consumers::start(&[a.addr, b.addr], 8);
    load.until("claims acknowledged", Duration::from_secs(30), |c| {
        acked_after(c, 40)
    })
    .await;
    let cut = Instant::now();
    pair.link.cut();
    // The case under test: caches holding claims the standby never got.
    load.until(
        "cache answers for claims after the cut",
        Duration::from_secs(30),
        |c| {
            let fresh: HashSet<&str> = c
                .iter()
                .filter(|x| x.at > cut && x.claimed())
                .map(|x| x.key.as_str())
                .collect();
            fresh.len() >= 20
                && c.iter()
                    .filter(|x| x.answered_by_cache() && fresh.contains(x.key.as_str()))
                    .count()
                    >= 5
        },
    )
    .await;
    let killed = Instant::now();
    pair.kill_primary();
    // As an HA manager does, promotion comes after the sidecars noticed.
    for s in [&a, &b] {
        let noticed = eventually(Duration::from_secs(10), || async move {
            identity_confirmed(s).await == Some(0.0)
        })
        .await;
        assert!(
            noticed,
            "the sidecar suspends cache answers once the primary is gone"
        );
    }
    pair.promote().await;
    let promoted = Instant::now();
    load.until("a claim after the promotion", Duration::from_secs(30), |c| {
        claimed_after(c, promoted)
    })
    .await;
    let calls = load.stop(handles).await;
    let c = sidecar_behind(&bouncer, &prefix, 2).await;
    let swept = sweep(&load, &[&a, &b, &c]).await;
    let failovers: Vec<f64> = futures::future::join_all([&a, &b, &c].map(|s| s.metrics()))
        .await
        .iter()
        .map(|m| metric(m, "oncegate_store_failovers_total").unwrap_or(0.0))
        .collect();
    let rows = fail_over_rows(&pair).await;
    check(&calls, &swept, &rows, (cut, killed, promoted), &failovers);
}

/// The new primary's ledger (the old one is dead: nothing to kill).
async fn fail_over_rows(pair: &Pair) -> HashMap<String, String> {
    use sqlx::{Connection, Row};
    let mut conn = sqlx::PgConnection::connect(&crate::failover::pg_url(pair.standby_port))
        .await
        .expect("new primary");
    sqlx::query("SELECT idempotency_key, id::text AS id FROM disbursements")
        .fetch_all(&mut conn)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get("idempotency_key"), r.get("id")))
        .collect()
}

fn check(
    calls: &[Call],
    swept: &[Call],
    rows: &HashMap<String, String>,
    (cut, killed, promoted): (Instant, Instant, Instant),
    failovers: &[f64],
) {
    let id_of = |c: &Call| c.got.as_ref().ok().map(|(_, id, _)| id.clone());
    let mut first: HashMap<&str, String> = HashMap::new();
    for c in calls.iter().filter(|c| c.at < killed) {
        if let Some(id) = id_of(c) {
            first.entry(&c.key).or_insert(id);
        }
    }
    let lost: HashSet<&str> = first
        .iter()
        .filter(|(k, id)| rows.get(**k) != Some(*id))
        .map(|(k, _)| *k)
        .collect();
    let after: Vec<&Call> = calls.iter().filter(|c| c.at > promoted).chain(swept).collect();
    let stale: Vec<&&Call> = after
        .iter()
        .filter(|c| {
            c.answered_by_cache()
                && lost.contains(c.key.as_str())
                && id_of(c) == first.get(c.key.as_str()).cloned()
        })
        .collect();
    let wrong: Vec<&&Call> = after
        .iter()
        .filter(|c| id_of(c).is_some_and(|id| rows.get(&c.key) != Some(&id)))
        .collect();
    println!(
        "pooler[transaction, asynchronous failover]: answers given {} (+{} in the sweep), acknowledged before the kill {}, \
         lost {}, cache answers for a lost commit after the promotion {}; cut → kill {:?}, kill → promotion {:?}; \
         failovers counted {failovers:?}",
        calls.len(),
        swept.len(),
        first.len(),
        lost.len(),
        stale.len(),
        killed - cut,
        promoted - killed,
    );
    assert!(
        !lost.is_empty(),
        "the claims after the cut are lost (the case under test)"
    );
    assert!(stale.is_empty(), "cache answers for lost commits: {stale:?}");
    assert!(
        wrong.is_empty(),
        "answers after the promotion that are not the new primary's: {wrong:?}"
    );
    assert!(
        failovers[..2].iter().all(|n| *n >= 1.0),
        "the new identity is seen: {failovers:?}"
    );
    assert_eq!(
        failovers[2], 0.0,
        "the third sidecar only ever saw the new primary"
    );
}
