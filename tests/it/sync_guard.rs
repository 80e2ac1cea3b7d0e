//! The synchronous-standby guard (ONCEGATE_REQUIRE_SYNC_REPLICA, DESIGN §7.3)
//! against a real primary and streaming standby (`failover::Pair`), with
//! consumers that redeliver every refused delivery until it is answered.
//! Each test changes what the primary's replication looks like while the
//! sidecars serve — the way an HA manager or an operator does — then fails
//! over to the standby and counts what was lost: every delivery a consumer
//! had acknowledged (CLAIMED or DUPLICATE) must be on the new primary with
//! the same disbursement.
//!
//! Each prints its figures (`--nocapture`): answers given, acknowledged,
//! refused, lost, the time from the change to the first refusal and from
//! the repair to the first claim.

use crate::failover::{Pair, health, pg_url};
use crate::helpers::*;
use futures::FutureExt;
use oncegate::pb::gate_client::GateClient;
use oncegate::pb::{self, Outcome, Tier};
use sqlx::{Connection, Row};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};

/// One call a consumer made and what it got: the outcome, disbursement id
/// and deciding tier, or the status code and message.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) at: Instant,
    pub(crate) key: String,
    pub(crate) got: Result<(Outcome, String, Tier), (tonic::Code, String)>,
}

impl Call {
    pub(crate) fn answered_by_cache(&self) -> bool {
        matches!(self.got, Ok((_, _, Tier::LocalCache | Tier::Redis)))
    }

    fn refused_by_guard(&self) -> bool {
        matches!(&self.got, Err((tonic::Code::Unavailable, m)) if m.contains("ONCEGATE_REQUIRE_SYNC_REPLICA"))
    }

    pub(crate) fn claimed(&self) -> bool {
        matches!(self.got, Ok((Outcome::Claimed, _, _)))
    }
}

/// Consumers: each delivers a fresh submission until it is answered (an
/// error: the broker redelivers after a pause), one in four a redelivery of
/// one already answered.
pub(crate) struct Consumers {
    clients: Vec<GateClient<Channel>>,
    calls: Mutex<Vec<Call>>,
    pub(crate) answered: Mutex<Vec<pb::Submission>>,
    next: AtomicU64,
    stop: AtomicBool,
    award: String,
}

impl Consumers {
    pub(crate) fn start(addrs: &[SocketAddr], n: usize) -> (Arc<Self>, Vec<JoinHandle<()>>) {
        let clients = addrs
            .iter()
            .map(|a| {
                GateClient::new(
                    Endpoint::from_shared(format!("http://{a}"))
                        .unwrap()
                        .connect_lazy(),
                )
            })
            .collect();
        let me = Arc::new(Self {
            clients,
            calls: Mutex::default(),
            answered: Mutex::default(),
            next: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            award: unique("AWD-SG-"),
        });
        let handles = (0..n).map(|i| tokio::spawn(me.clone().consume(i))).collect();
        (me, handles)
    }

    fn fresh(&self) -> pb::Submission {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let ts = format!("2026-12-05T10:{:02}:{:02}.{:06}Z", n / 60 % 60, n % 60, n);
        submission(
            &format!("{}-{}", self.award, n % 3),
            &ts,
            &n.to_be_bytes(),
            100 + n as i64,
        )
    }

    async fn consume(self: Arc<Self>, seed: usize) {
        let mut i = seed;
        while !self.stop.load(Ordering::Relaxed) {
            i += 1;
            let redelivery = {
                let answered = self.answered.lock().unwrap();
                (i.is_multiple_of(4) && !answered.is_empty())
                    .then(|| answered[(i * 31) % answered.len()].clone())
            };
            let s = redelivery.unwrap_or_else(|| self.fresh());
            if self.deliver(&s, i).await {
                self.answered.lock().unwrap().push(s);
            }
        }
    }

    /// Delivers `s` until it is answered or the consumers stop.
    pub(crate) async fn deliver(&self, s: &pb::Submission, mut attempt: usize) -> bool {
        let key = oncegate::key::derive_key(&s.award_id, &s.submission_timestamp, &s.payload);
        while !self.stop.load(Ordering::Relaxed) {
            let mut c = self.clients[attempt % self.clients.len()].clone();
            attempt += 1;
            let mut req = tonic::Request::new(s.clone());
            req.set_timeout(Duration::from_secs(5));
            let got = match c.submit(req).await {
                Ok(d) => {
                    let d = d.into_inner();
                    let tier = tier(&d);
                    Ok((outcome(&d), d.disbursement.expect("a disbursement").id, tier))
                }
                Err(e) => Err((e.code(), e.message().to_string())),
            };
            let ok = got.is_ok();
            let call = Call {
                at: Instant::now(),
                key: key.clone(),
                got,
            };
            self.calls.lock().unwrap().push(call);
            if ok {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Waits until `f` holds for the calls so far; fails naming `what`.
    pub(crate) async fn until(&self, what: &str, within: Duration, f: impl Fn(&[Call]) -> bool) {
        let reached = eventually(within, || {
            let holds = f(&self.calls.lock().unwrap());
            async move { holds }
        })
        .await;
        let calls = self.calls();
        assert!(reached, "{what}: not reached in {within:?}; {}", summary(&calls));
    }

    pub(crate) async fn stop(&self, handles: Vec<JoinHandle<()>>) -> Vec<Call> {
        self.stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.await.unwrap();
        }
        self.calls()
    }
}

fn summary(calls: &[Call]) -> String {
    let mut by: HashMap<String, usize> = HashMap::new();
    for c in calls {
        let label = match &c.got {
            Ok((o, _, t)) => format!("{o:?} by {t:?}"),
            Err((code, m)) => format!("{code:?}: {}", m.chars().take(160).collect::<String>()),
        };
        *by.entry(label).or_default() += 1;
    }
    format!("{} calls: {by:?}", calls.len())
}

pub(crate) fn acked_after(calls: &[Call], n: usize) -> bool {
    calls.iter().filter(|c| c.got.is_ok()).count() >= n
}

fn refused_after(calls: &[Call], since: Instant, n: usize) -> bool {
    calls
        .iter()
        .filter(|c| c.at > since && c.refused_by_guard())
        .count()
        >= n
}

pub(crate) fn claimed_after(calls: &[Call], since: Instant) -> bool {
    calls.iter().any(|c| c.at > since && c.claimed())
}

/// What a test measured.
struct Figures {
    given: usize,
    acknowledged: usize,
    refused: usize,
    lost: Vec<String>,
    to_refuse: Option<Duration>,
    to_resume: Option<Duration>,
}

impl Figures {
    /// `changed`: when replication stopped being what is required;
    /// `repaired`: when it was made whole again (if it was); `rows`: the
    /// new primary's ledger, key → disbursement id.
    fn of(
        calls: &[Call],
        changed: Instant,
        repaired: Option<Instant>,
        rows: &HashMap<String, String>,
    ) -> Self {
        let mut acked: HashMap<&str, &str> = HashMap::new();
        for c in calls {
            if let Ok((_, id, _)) = &c.got {
                acked.entry(&c.key).or_insert(id);
            }
        }
        let lost = acked
            .iter()
            .filter(|(k, id)| rows.get(**k).is_none_or(|r| r != **id))
            .map(|(k, _)| k.to_string())
            .collect();
        let first = |f: &dyn Fn(&Call) -> bool, since: Instant| {
            calls
                .iter()
                .filter(|c| c.at > since && f(c))
                .map(|c| c.at - since)
                .min()
        };
        Self {
            given: calls.len(),
            acknowledged: acked.len(),
            refused: calls.iter().filter(|c| c.refused_by_guard()).count(),
            lost,
            to_refuse: first(&|c| c.refused_by_guard(), changed),
            to_resume: repaired.and_then(|r| first(&|c| c.claimed(), r)),
        }
    }

    fn print(&self, name: &str, extra: &str) {
        println!(
            "sync_guard[{name}]: answers given {}, acknowledged {} (distinct deliveries), refused {}, lost {}; \
             change → first refusal {:?}; repair → first claim {:?}{extra}",
            self.given,
            self.acknowledged,
            self.refused,
            self.lost.len(),
            self.to_refuse,
            self.to_resume,
        );
    }
}

/// Sidecar `i` on `url`, requiring a synchronous standby, with `extra`.
async fn guarded_sidecar(url: String, i: usize, extra: &[(&str, String)]) -> Sidecar {
    let mut env = vec![
        ("ONCEGATE_REQUIRE_SYNC_REPLICA", "true".to_string()),
        ("ONCEGATE_DB_LOCK_TIMEOUT", "1s".into()),
        ("ONCEGATE_DB_STATEMENT_TIMEOUT", "2s".into()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, v.clone())));
    start_sidecar(url, format!("sg-{i}"), &env).await
}

/// Kills the primary, promotes the standby, and reads its ledger.
async fn fail_over(pair: &Pair) -> HashMap<String, String> {
    pair.kill_primary();
    pair.promote().await;
    let mut c = sqlx::PgConnection::connect(&pg_url(pair.standby_port))
        .await
        .expect("new primary");
    sqlx::query("SELECT idempotency_key, id::text AS id FROM disbursements")
        .fetch_all(&mut c)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get("idempotency_key"), r.get("id")))
        .collect()
}

/// Backends on the primary waiting for a synchronous standby.
async fn sync_rep_waiters(pair: &Pair) -> i64 {
    let mut c = sqlx::PgConnection::connect(&pg_url(pair.primary_port))
        .await
        .expect("primary");
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
        .fetch_one(&mut c)
        .await
        .unwrap()
}

async fn gate_health_is(addrs: &[SocketAddr], want: &str) -> bool {
    eventually(Duration::from_secs(10), || async move {
        for a in addrs {
            if health(*a, "oncegate.v1.Gate").await != want {
                return false;
            }
        }
        true
    })
    .await
}

async fn shortfall_reason(s: &Sidecar, reason: &str) -> Option<f64> {
    metric(
        &s.metrics().await,
        &format!("oncegate_sync_standby_shortfall{{reason=\"{reason}\"}}"),
    )
}

/// Patroni's non-strict `synchronous_mode` when its standby fails: the
/// standby stops receiving (its link frozen: no reset, so the primary still
/// counts it as streaming and commits wait for it), then
/// `synchronous_standby_names` is cleared and reloaded while the sidecars
/// serve — which releases the waiting commits unreplicated — and the
/// primary fails over to that standby. Nothing acknowledged is lost: the
/// released commits are answered UNAVAILABLE (the post-commit check), every
/// later claim too (before COMMIT, and at admission once the guard knows),
/// both Gates say NOT_SERVING, and the gauge names the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_replication_turned_off_while_serving_loses_nothing_in_the_failover() {
    let pair = Pair::start(true).await;
    let a = guarded_sidecar(pair.url(), 0, &[]).await;
    let b = guarded_sidecar(pair.url(), 1, &[]).await;
    let (load, handles) = Consumers::start(&[a.addr, b.addr], 8);
    load.until("claims acknowledged", Duration::from_secs(30), |c| {
        acked_after(c, 30)
    })
    .await;
    pair.link.freeze();
    let waiting = eventually(Duration::from_secs(20), || sync_rep_waiters(&pair).map(|n| n > 0)).await;
    assert!(waiting, "a commit waits for the frozen standby");
    let changed = Instant::now();
    pair.primary_sql("ALTER SYSTEM SET synchronous_standby_names = ''")
        .await;
    pair.primary_sql("SELECT pg_reload_conf()").await;
    load.until("claims refused", Duration::from_secs(20), |c| {
        refused_after(c, changed, 20)
    })
    .await;
    assert!(
        gate_health_is(&[a.addr, b.addr], "NotServing").await,
        "both Gates NOT_SERVING"
    );
    let unconfirmed: f64 = futures::future::join_all([&a, &b].map(|s| s.metrics()))
        .await
        .iter()
        .map(|m| metric(m, "oncegate_sync_guard_unconfirmed_commits_total").unwrap_or(0.0))
        .sum();
    let reason = shortfall_reason(&a, "no_standby_named").await;
    let rows = fail_over(&pair).await;
    let calls = load.stop(handles).await;
    let f = Figures::of(&calls, changed, None, &rows);
    f.print(
        "synchronous replication turned off while serving",
        &format!("; commits released by the clearing and answered UNAVAILABLE: {unconfirmed}"),
    );
    assert!(f.lost.is_empty(), "acknowledged and lost: {:?}", f.lost);
    assert!(
        unconfirmed >= 1.0,
        "the commit that waited when the names were cleared was released and refused"
    );
    assert_eq!(reason, Some(1.0), "the gauge names the reason");
    let late_claims: Vec<&Call> = calls
        .iter()
        .filter(|c| c.at > changed + Duration::from_secs(1) && c.claimed())
        .collect();
    assert!(
        late_claims.is_empty(),
        "claims acknowledged with no standby: {late_claims:?}"
    );
}

/// The standby's link cut while serving (its walsender ends: 0 of 1
/// streaming): claims refused at once, naming the missing standby; the
/// link back: the standby catches up and claims resume by themselves;
/// then a failover loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_gone_while_serving_refuses_claims_and_they_resume_when_it_is_back() {
    let pair = Pair::start(true).await;
    let a = guarded_sidecar(pair.url(), 0, &[]).await;
    let (load, handles) = Consumers::start(&[a.addr], 6);
    load.until("claims acknowledged", Duration::from_secs(30), |c| {
        acked_after(c, 20)
    })
    .await;
    let changed = Instant::now();
    pair.link.cut();
    load.until("claims refused", Duration::from_secs(20), |c| {
        refused_after(c, changed, 10)
    })
    .await;
    assert!(gate_health_is(&[a.addr], "NotServing").await);
    let reason = shortfall_reason(&a, "standby_not_streaming").await;
    let named = load
        .calls()
        .iter()
        .find(|c| c.at > changed && c.refused_by_guard())
        .map(|c| format!("{:?}", c.got))
        .unwrap_or_default();
    let repaired = Instant::now();
    pair.link.restore();
    load.until("claims resume", Duration::from_secs(30), |c| {
        claimed_after(c, repaired)
    })
    .await;
    assert!(
        gate_health_is(&[a.addr], "Serving").await,
        "the Gate serves again"
    );
    load.until("more claims", Duration::from_secs(30), |c| {
        c.iter().filter(|x| x.at > repaired && x.claimed()).count() >= 10
    })
    .await;
    let rows = fail_over(&pair).await;
    let calls = load.stop(handles).await;
    let f = Figures::of(&calls, changed, Some(repaired), &rows);
    f.print("standby gone while serving, then back", "");
    assert!(f.lost.is_empty(), "acknowledged and lost: {:?}", f.lost);
    assert_eq!(reason, Some(1.0), "the gauge names the reason");
    assert!(
        named.contains("of 1 required synchronous standbys streaming") && named.contains("standby1"),
        "the refusal names the missing standby: {named}"
    );
}

/// `ANY 1 (standby1)` with standby1 not connected when the sidecar starts:
/// it starts (health of the process SERVING, the Gate NOT_SERVING) and
/// refuses claims naming the missing standby; when the standby connects,
/// claims resume; a failover then loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_1_naming_a_standby_not_connected_at_start_refuses_until_it_connects() {
    let pair = Pair::start(true).await;
    // Migrated while the standby streams: a migration's commits wait for
    // it too, so a sidecar migrating at start would wait with them.
    let (code, err) = crate::failover::run(&["migrate", "--database-url", &pair.url()], &[]).await;
    assert_eq!(code, 0, "migrated: {err}");
    pair.link.cut();
    pair.primary_sql("ALTER SYSTEM SET synchronous_standby_names = 'ANY 1 (standby1)'")
        .await;
    pair.primary_sql("SELECT pg_reload_conf()").await;
    let port = pair.primary_port;
    let gone = eventually(Duration::from_secs(20), || async move {
        crate::failover::replication_state(port).await.is_none()
    })
    .await;
    assert!(gone, "the standby is not connected");
    let changed = Instant::now();
    let a = guarded_sidecar(pair.url(), 0, &[("ONCEGATE_MIGRATE_ON_START", "false".into())]).await;
    assert_eq!(
        health(a.addr, "").await,
        "Serving",
        "the process serves (no restart loop)"
    );
    assert!(gate_health_is(&[a.addr], "NotServing").await);
    let (load, handles) = Consumers::start(&[a.addr], 4);
    load.until("claims refused", Duration::from_secs(20), |c| {
        refused_after(c, changed, 10)
    })
    .await;
    let named = format!(
        "{:?}",
        load.calls().iter().find(|c| c.refused_by_guard()).map(|c| &c.got)
    );
    let reason = shortfall_reason(&a, "standby_not_streaming").await;
    let repaired = Instant::now();
    pair.link.restore();
    load.until("claims resume", Duration::from_secs(30), |c| {
        claimed_after(c, repaired)
    })
    .await;
    load.until("more claims", Duration::from_secs(30), |c| {
        c.iter().filter(|x| x.at > repaired && x.claimed()).count() >= 10
    })
    .await;
    let rows = fail_over(&pair).await;
    let calls = load.stop(handles).await;
    let f = Figures::of(&calls, changed, Some(repaired), &rows);
    f.print("ANY 1 naming a standby not connected at start", "");
    assert!(f.lost.is_empty(), "acknowledged and lost: {:?}", f.lost);
    assert!(
        !calls.iter().any(|c| c.at < repaired && c.claimed()),
        "nothing claimed before the standby connected"
    );
    assert!(
        named.contains("0 of 1 required synchronous standbys streaming")
            && named.contains("ANY 1 (standby1)"),
        "{named}"
    );
    assert_eq!(reason, Some(1.0));
}

/// `synchronous_commit = local` set for the sidecar's (least-privileged)
/// application role while it serves: new sessions of the role would commit
/// without waiting, so the guard — reading the role's setting and the
/// standbys through the owner's function — refuses claims naming the
/// setting and the role; claim transactions meanwhile set their own
/// `synchronous_commit`, so none is acknowledged unreplicated. Reset:
/// claims resume. A failover loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_commit_local_for_the_app_role_while_serving_refuses_claims() {
    let pair = Pair::start(true).await;
    let role = unique("og_app_sg_").to_lowercase();
    pair.primary_sql(&format!("CREATE ROLE {role} LOGIN")).await;
    let (code, err) = crate::failover::run(
        &["migrate", "--database-url", &pair.url(), "--app-role", &role],
        &[],
    )
    .await;
    assert_eq!(code, 0, "migrated and granted: {err}");
    let app_url = format!("postgres://{role}@{}/postgres", pair.service.addr);
    let least = [
        ("ONCEGATE_MIGRATE_ON_START", "false".to_string()),
        ("ONCEGATE_REQUIRE_LEAST_PRIVILEGE", "true".to_string()),
    ];
    let a = guarded_sidecar(app_url, 0, &least).await;
    let (load, handles) = Consumers::start(&[a.addr], 6);
    load.until("claims acknowledged", Duration::from_secs(30), |c| {
        acked_after(c, 20)
    })
    .await;
    let changed = Instant::now();
    pair.primary_sql(&format!("ALTER ROLE {role} SET synchronous_commit = local"))
        .await;
    load.until("claims refused", Duration::from_secs(20), |c| {
        refused_after(c, changed, 10)
    })
    .await;
    let named = format!(
        "{:?}",
        load.calls()
            .iter()
            .find(|c| c.at > changed && c.refused_by_guard())
            .map(|c| &c.got)
    );
    let reason = shortfall_reason(&a, "commit_does_not_wait").await;
    let repaired = Instant::now();
    pair.primary_sql(&format!("ALTER ROLE {role} RESET synchronous_commit"))
        .await;
    load.until("claims resume", Duration::from_secs(30), |c| {
        claimed_after(c, repaired)
    })
    .await;
    let rows = fail_over(&pair).await;
    let calls = load.stop(handles).await;
    let f = Figures::of(&calls, changed, Some(repaired), &rows);
    f.print("synchronous_commit = local for the app role while serving", "");
    assert!(f.lost.is_empty(), "acknowledged and lost: {:?}", f.lost);
    assert!(
        named.contains(&format!("synchronous_commit = local for role {role}")),
        "names the setting and the role: {named}"
    );
    assert_eq!(reason, Some(1.0));
}
