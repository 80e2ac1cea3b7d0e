//! Effects outside the ledger (DESIGN §9), on both stores, through the real
//! server (and the real binary where a holder crashes), with real Redis:
//! tiers answer only with completed records, leases are fenced, a waiting
//! Begin waits, and a consumer killed at random points still performs every
//! effect exactly once at the provider.

use crate::helpers::*;
use oncegate::pb::effects_client::EffectsClient;
use oncegate::pb::{self, Tier, begin_response::Outcome};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::Channel;
use tonic::{Code, Request};

on_both_stores!(
    a_completed_record_is_answered_by_every_tier,
    concurrent_begins_across_instances_wait_for_the_one_holder,
    a_crashed_holders_lease_expires_and_its_token_is_fenced,
    a_consumer_killed_at_random_points_performs_each_effect_once,
    requests_and_namespaces_are_kept_apart,
    release_lets_the_next_begin_acquire_at_once_and_every_transition_is_audited,
    bad_input_is_refused_naming_the_field_and_writes_nothing,
    records_past_retention_are_purged_in_batches,
    the_effect_subcommands_begin_complete_release_and_get,
    a_waiting_begin_ends_when_its_sidecar_drains,
);

async fn effects_client(addr: std::net::SocketAddr) -> EffectsClient<Channel> {
    EffectsClient::connect(format!("http://{addr}"))
        .await
        .expect("connect")
}

fn begin_req(ns: &str, key: &str, request: &[u8], ttl: Duration) -> pb::BeginRequest {
    pb::BeginRequest {
        namespace: ns.into(),
        idempotency_key: key.into(),
        request: request.to_vec(),
        lease_ttl: Some(prost_types::Duration {
            seconds: ttl.as_secs() as i64,
            nanos: ttl.subsec_nanos() as i32,
        }),
    }
}

fn with_deadline<T>(msg: T, timeout: Duration) -> Request<T> {
    let mut r = Request::new(msg);
    r.set_timeout(timeout);
    r
}

async fn begin(c: &mut EffectsClient<Channel>, req: pb::BeginRequest) -> Result<Outcome, tonic::Status> {
    let r = c.begin(with_deadline(req, Duration::from_secs(20))).await?;
    Ok(r.into_inner().outcome.expect("an outcome"))
}

fn acquired(o: Outcome) -> pb::Acquired {
    match o {
        Outcome::Acquired(a) => a,
        other => panic!("expected Acquired, got {other:?}"),
    }
}

fn completed(o: Outcome) -> pb::Completed {
    match o {
        Outcome::Completed(c) => c,
        other => panic!("expected Completed, got {other:?}"),
    }
}

fn tier_of(c: &pb::Completed) -> Tier {
    Tier::try_from(c.decided_by).expect("known tier")
}

async fn complete(
    c: &mut EffectsClient<Channel>,
    ns: &str,
    key: &str,
    token: &str,
    response: &[u8],
) -> Result<String, tonic::Status> {
    let r = c
        .complete(pb::CompleteRequest {
            namespace: ns.into(),
            idempotency_key: key.into(),
            lease_token: token.into(),
            response: response.to_vec(),
        })
        .await?;
    Ok(r.into_inner().completed_at)
}

async fn release(
    c: &mut EffectsClient<Channel>,
    ns: &str,
    key: &str,
    token: &str,
    reason: &str,
) -> Result<(), tonic::Status> {
    c.release(pb::ReleaseRequest {
        namespace: ns.into(),
        idempotency_key: key.into(),
        lease_token: token.into(),
        reason: reason.into(),
    })
    .await
    .map(|_| ())
}

const TTL: Duration = Duration::from_secs(30);

async fn audit_count(db: &TestDb, ns: &str, decision: &str) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM audit_log WHERE award_id = '{ns}' AND decision = '{decision}'"
    ))
    .await
}

/// Seals every audit row and verifies the trail: effect rows are sealed and
/// verified as any other.
async fn assert_sealed_and_verified(db: &TestDb) {
    use oncegate::seal::{SealRun, SealSettings, Sealer, verify::verify_store};
    let store = db.open().await;
    let settings = SealSettings {
        wait: Duration::from_secs(5),
        max_rows: 1_000,
        instance: Arc::from("it-sealer"),
        signer: None,
        anchors: None,
    };
    let sealer = Sealer::new(store.clone(), settings);
    while let SealRun::Busy | SealRun::Raced = sealer.step().await.expect("seal") {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let report = verify_store(&*store, &Default::default(), Default::default(), &mut |_, _| {})
        .await
        .expect("verify");
    assert!(report.is_clean(), "{report}");
    assert_eq!(
        report.rows_checked as i64,
        db.scalar("SELECT count(*) FROM audit_log").await,
        "every row sealed and checked: {report}"
    );
}

async fn flush(redis: &ThrowawayRedis) {
    use fred::prelude::*;
    let client = redis_client(&redis.url()).await;
    let _: () = client.flushall(false).await.unwrap();
}

/// (1) First Begin acquires attempt 1; after Complete every Begin returns
/// the stored response: from L1, from L2 on another instance, and from the
/// store once Redis is flushed; each answer leaves an `effect_answered`
/// audit row with the tier that answered.
async fn a_completed_record_is_answered_by_every_tier(kind: Kind) {
    let db = TestDb::new(kind).await;
    let redis = ThrowawayRedis::start().await;
    let prefix = unique("fx:");
    let a = TestApp::spawn(with_redis(serve_args(&db), &redis.url(), &prefix)).await;
    let b = TestApp::spawn(with_redis(serve_args(&db), &redis.url(), &prefix)).await;
    let (mut ca, mut cb) = (effects_client(a.addr).await, effects_client(b.addr).await);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", a.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "oncegate.v1.Effects".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let lease = acquired(
        begin(&mut ca, begin_req("pay", "k-1", b"req", TTL))
            .await
            .unwrap(),
    );
    assert_eq!(lease.attempt, 1);
    let at = complete(&mut ca, "pay", "k-1", &lease.lease_token, b"receipt-1")
        .await
        .unwrap();
    let local = completed(
        begin(&mut ca, begin_req("pay", "k-1", b"req", TTL))
            .await
            .unwrap(),
    );
    assert_eq!(
        (tier_of(&local), local.response.as_slice(), local.attempt),
        (Tier::LocalCache, &b"receipt-1"[..], 1)
    );
    assert_eq!(local.completed_at, at);
    let shared = completed(
        begin(&mut cb, begin_req("pay", "k-1", b"req", TTL))
            .await
            .unwrap(),
    );
    assert_eq!(
        (tier_of(&shared), shared.completed_at.as_str()),
        (Tier::Redis, at.as_str())
    );
    flush(&redis).await;
    let c = TestApp::spawn(with_redis(serve_args(&db), &redis.url(), &prefix)).await;
    let mut cc = effects_client(c.addr).await;
    let stored = completed(
        begin(&mut cc, begin_req("pay", "k-1", b"req", TTL))
            .await
            .unwrap(),
    );
    assert_eq!(
        (
            tier_of(&stored),
            stored.response.as_slice(),
            stored.completed_at.as_str()
        ),
        (Tier::Database, &b"receipt-1"[..], at.as_str())
    );
    // Queued off the hot path and flushed on the interval, without a shutdown.
    let arrived = eventually(Duration::from_secs(10), || async {
        audit_count(&db, "pay", "effect_answered").await == 3
    })
    .await;
    assert!(arrived, "one effect_answered row per answered Begin");
    for app in [a, b, c] {
        app.shutdown().await;
    }
    for tier in ["LOCAL_CACHE", "REDIS", "DATABASE"] {
        let rows = db
            .scalar(&format!(
                "SELECT count(*) FROM audit_log WHERE decision = 'effect_answered' AND tier = '{tier}' \
                 AND award_id = 'pay' AND key_prefix = 'k-1' AND detail = 'attempt 1'"
            ))
            .await;
        assert_eq!(rows, 1, "the Begin answered by {tier} is audited with its tier");
    }
    assert_eq!(audit_count(&db, "pay", "effect_answered").await, 3);
    assert_sealed_and_verified(&db).await;
    assert_eq!(
        db.scalar("SELECT count(*) FROM effects WHERE state = 'completed'")
            .await,
        1
    );
    assert_eq!(audit_count(&db, "pay", "effect_acquired").await, 1);
    assert_eq!(audit_count(&db, "pay", "effect_completed").await, 1);
    let event = db
        .scalar("SELECT count(*) FROM outbox WHERE event_type = 'effect.completed' AND award_id = 'pay' AND sequence = 1")
        .await;
    assert_eq!(event, 1, "one effect.completed event from Complete's transaction");
}

/// A Begin as a caller makes it: again after `UNAVAILABLE`, which the
/// contract says to retry (32 Begins and their re-reads share a pool of 3
/// connections per instance: on a starved machine one can wait out the
/// pool's acquire timeout). Any other error ends it.
async fn begin_retrying(
    c: &mut EffectsClient<Channel>,
    req: pb::BeginRequest,
) -> Result<Outcome, tonic::Status> {
    let mut unavailable = 0;
    loop {
        match begin(c, req.clone()).await {
            Err(e) if e.code() == Code::Unavailable && unavailable < 10 => {
                unavailable += 1;
                println!(
                    "Begin answered UNAVAILABLE ({unavailable}), retried: {}",
                    e.message()
                );
            }
            other => return other,
        }
    }
}

/// (2) 32 concurrent Begins of one key across two instances: exactly one
/// acquires; when it completes, the other 31 get its response.
async fn concurrent_begins_across_instances_wait_for_the_one_holder(kind: Kind) {
    let db = TestDb::new(kind).await;
    let prefix = unique("fx:");
    let a = TestApp::spawn(with_redis(serve_args(&db), &redis_url(), &prefix)).await;
    let b = TestApp::spawn(with_redis(serve_args(&db), &redis_url(), &prefix)).await;
    let mut tasks = Vec::new();
    for i in 0..32 {
        let addr = if i % 2 == 0 { a.addr } else { b.addr };
        tasks.push(tokio::spawn(async move {
            let mut c = effects_client(addr).await;
            match begin_retrying(&mut c, begin_req("notices", "grantee-7", b"mail", TTL)).await? {
                Outcome::Acquired(lease) => {
                    // Everyone else is waiting by now.
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    // (Repeating a Complete with the same token and response is idempotent.)
                    let mut done =
                        complete(&mut c, "notices", "grantee-7", &lease.lease_token, b"sent #1").await;
                    for _ in 0..10 {
                        match &done {
                            Err(e) if e.code() == Code::Unavailable => {
                                done =
                                    complete(&mut c, "notices", "grantee-7", &lease.lease_token, b"sent #1")
                                        .await
                            }
                            _ => break,
                        }
                    }
                    done?;
                    Ok::<_, tonic::Status>(None)
                }
                Outcome::Completed(done) => Ok(Some(done.response)),
            }
        }));
    }
    let mut acquirers = 0;
    for t in tasks {
        match t
            .await
            .unwrap()
            .expect("no Begin sees an error but a retryable UNAVAILABLE")
        {
            None => acquirers += 1,
            Some(response) => assert_eq!(response, b"sent #1"),
        }
    }
    assert_eq!(acquirers, 1, "exactly one Begin acquires");
    a.shutdown().await;
    b.shutdown().await;
    assert_eq!(audit_count(&db, "notices", "effect_acquired").await, 1);
    assert_eq!(
        db.scalar("SELECT CAST(attempt AS BIGINT) FROM effects WHERE namespace = 'notices'")
            .await,
        1
    );
}

fn sidecar_env(db: &TestDb) -> Vec<(&'static str, String)> {
    vec![
        ("DATABASE_URL", db.url.clone()),
        ("ONCEGATE_AUDIT_FLUSH_INTERVAL", "100ms".into()),
    ]
}

/// (3) The holder (the real binary) is SIGKILLed after calling the
/// provider, before Complete: a Begin waits until the lease expires (never an
/// "in progress" error, bounded by its deadline), then acquires attempt 2;
/// the old token is fenced off ("lease lost").
async fn a_crashed_holders_lease_expires_and_its_token_is_fenced(kind: Kind) {
    let db = TestDb::new(kind).await;
    let holder = Sidecar::start(&sidecar_env(&db)).await;
    let mut ch = effects_client(holder.addr).await;
    let lease = acquired(
        begin(
            &mut ch,
            begin_req("pay", "inv-9", b"wire $5", Duration::from_secs(5)),
        )
        .await
        .unwrap(),
    );
    // Here the holder has called the provider with key inv-9; it dies
    // before Complete.
    holder.kill().await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = effects_client(app.addr).await;
    let early = c
        .begin(with_deadline(
            begin_req("pay", "inv-9", b"wire $5", TTL),
            // Long enough that the server's answer (100 ms before the
            // deadline) beats the client's own timer under load.
            Duration::from_secs(1),
        ))
        .await
        .expect_err("the lease is still live");
    assert_eq!(early.code(), Code::DeadlineExceeded, "{early:?}");
    let started = std::time::Instant::now();
    let again = acquired(
        begin(&mut c, begin_req("pay", "inv-9", b"wire $5", TTL))
            .await
            .unwrap(),
    );
    assert_eq!(
        again.attempt, 2,
        "attempt > 1: ask the provider before acting again"
    );
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "woken by the expiry, within the deadline"
    );
    assert_ne!(again.lease_token, lease.lease_token);
    let stale = complete(&mut c, "pay", "inv-9", &lease.lease_token, b"late")
        .await
        .expect_err("fenced");
    assert_eq!(stale.code(), Code::FailedPrecondition);
    assert!(stale.message().contains("lease lost"), "{stale:?}");
    let stale = release(&mut c, "pay", "inv-9", &lease.lease_token, "gave up")
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition);
    complete(&mut c, "pay", "inv-9", &again.lease_token, b"receipt")
        .await
        .unwrap();
    app.shutdown().await;
    assert_eq!(audit_count(&db, "pay", "effect_retaken").await, 1);
    let detail = db
        .scalar("SELECT count(*) FROM audit_log WHERE decision = 'effect_retaken' AND detail LIKE '%lease expired%'")
        .await;
    assert_eq!(detail, 1);
    assert_eq!(audit_count(&db, "pay", "effect_completed").await, 1);
    assert_eq!(
        db.scalar("SELECT count(*) FROM effects WHERE state = 'completed' AND attempt = 2")
            .await,
        1
    );
}

/// A fake provider: an HTTP server that dedups on the idempotency key (as
/// a payment API does), counting calls and effects performed per key.
struct Provider {
    addr: std::net::SocketAddr,
    state: Arc<Mutex<ProviderState>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct ProviderState {
    calls: u64,
    calls_by_key: HashMap<String, u32>,
    performed: HashMap<String, u32>,
    receipts: HashMap<String, String>,
    /// Armed by [`Provider::hold_next`]: the next effect performed says so
    /// (its key) and holds its answer until released.
    hold: Option<(
        tokio::sync::oneshot::Sender<String>,
        tokio::sync::oneshot::Receiver<()>,
    )>,
}

/// A held answer: `performed` yields the key once the next effect has been
/// performed (its answer not yet sent); dropping `release` sends it.
struct Held {
    performed: tokio::sync::oneshot::Receiver<String>,
    release: tokio::sync::oneshot::Sender<()>,
}

impl Provider {
    async fn start() -> Self {
        use axum::extract::{Path, State};
        let state = Arc::new(Mutex::new(ProviderState::default()));
        let app = axum::Router::new()
            .route(
                "/pay/{key}",
                axum::routing::post(
                    |State(s): State<Arc<Mutex<ProviderState>>>, Path(key): Path<String>| async move {
                        let (receipt, hold) = {
                            let mut s = s.lock().unwrap();
                            s.calls += 1;
                            *s.calls_by_key.entry(key.clone()).or_default() += 1;
                            if let Some(r) = s.receipts.get(&key) {
                                return r.clone();
                            }
                            *s.performed.entry(key.clone()).or_default() += 1;
                            let receipt = format!("receipt-{key}-{}", s.calls);
                            s.receipts.insert(key.clone(), receipt.clone());
                            (receipt, s.hold.take())
                        };
                        if let Some((performed, release)) = hold {
                            let _ = performed.send(key);
                            let _ = release.await;
                        }
                        receipt
                    },
                ),
            )
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, state, task }
    }

    /// Holds the answer of the next effect performed (see [`Held`]).
    fn hold_next(&self) -> Held {
        let (performed_tx, performed) = tokio::sync::oneshot::channel();
        let (release, release_rx) = tokio::sync::oneshot::channel();
        self.state.lock().unwrap().hold = Some((performed_tx, release_rx));
        Held { performed, release }
    }
}

/// POST /pay/{key} over a plain HTTP/1.1 connection: the receipt.
async fn pay(provider: std::net::SocketAddr, key: &str) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(provider).await?;
    let req =
        format!("POST /pay/{key} HTTP/1.1\r\nHost: p\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut text = String::new();
    s.read_to_string(&mut text).await?;
    Ok(text.split("\r\n\r\n").nth(1).unwrap_or_default().to_string())
}

/// One consumer's loop over `keys` from `from`: Begin, pay, Complete.
/// Returns when every key is done; may be aborted anywhere (a crash).
async fn consume(
    gate: std::net::SocketAddr,
    provider: std::net::SocketAddr,
    keys: Arc<Vec<String>>,
    done: Arc<Mutex<usize>>,
) {
    let mut c = effects_client(gate).await;
    loop {
        let i = *done.lock().unwrap();
        let Some(key) = keys.get(i) else { return };
        let req = begin_req("treasury", key, key.as_bytes(), Duration::from_millis(300));
        match begin(&mut c, req).await {
            Ok(Outcome::Completed(_)) => {
                let mut d = done.lock().unwrap();
                *d = (*d).max(i + 1);
            }
            Ok(Outcome::Acquired(lease)) => {
                // attempt > 1: an earlier attempt may have reached the
                // provider; asking it again with the same key is that check.
                let Ok(receipt) = pay(provider, key).await else {
                    continue;
                };
                let _ = complete(&mut c, "treasury", key, &lease.lease_token, receipt.as_bytes()).await;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Kills of the consumer that land between the provider's effect and
/// `Complete` (the harness holds the provider's answer until the kill).
const KILLS_MID_EFFECT: usize = 6;

/// (4) A consumer loop killed over a few hundred effects, at random points
/// (seeded: `ONCEGATE_TEST_SEED`) and, six times, certainly between the
/// provider's effect and `Complete`: each key's effect is performed exactly
/// once at the provider, the lease of every effect cut off that way is
/// taken again (attempt 2, which asks the provider again with the same
/// key), and every record ends completed with the provider's response.
async fn a_consumer_killed_at_random_points_performs_each_effect_once(kind: Kind) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(test_seed());
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let provider = Provider::start().await;
    let keys: Arc<Vec<String>> = Arc::new((0..300).map(|i| format!("pay-{i:04}")).collect());
    let done = Arc::new(Mutex::new(0usize));
    let mut kills_mid_effect: Vec<String> = Vec::new();
    let mut kills = 0;
    while *done.lock().unwrap() < keys.len() {
        let consumer = tokio::spawn(consume(app.addr, provider.addr, keys.clone(), done.clone()));
        if kills_mid_effect.len() < KILLS_MID_EFFECT && kills % 3 == 0 {
            // The state under test: the effect happened, Complete not sent.
            let held = provider.hold_next();
            let key = tokio::time::timeout(Duration::from_secs(30), held.performed)
                .await
                .expect("the consumer reaches the provider")
                .expect("the effect is performed");
            consumer.abort();
            let _ = consumer.await;
            drop(held.release); // its answer goes to a dead consumer
            kills_mid_effect.push(key);
            kills += 1;
            continue;
        }
        let life = Duration::from_millis(rng.random_range(5..120));
        tokio::time::sleep(life).await;
        if !consumer.is_finished() {
            consumer.abort();
            kills += 1;
        }
        let _ = consumer.await;
    }
    let mut c = effects_client(app.addr).await;
    let state = provider.state.lock().unwrap().receipts.clone();
    for key in keys.iter() {
        let answer = completed(
            begin(&mut c, begin_req("treasury", key, key.as_bytes(), TTL))
                .await
                .unwrap(),
        );
        assert_eq!(
            answer.response,
            state[key].as_bytes(),
            "{key} holds the provider's response"
        );
    }
    {
        let s = provider.state.lock().unwrap();
        assert_eq!(s.performed.len(), keys.len());
        assert!(
            s.performed.values().all(|&n| n == 1),
            "every effect performed exactly once"
        );
        assert!(s.calls >= keys.len() as u64);
        for key in &kills_mid_effect {
            assert!(
                s.calls_by_key[key] >= 2,
                "{key}: killed before Complete, the provider was asked again"
            );
        }
    }
    println!(
        "{kills} kills, {} of them between the effect and Complete",
        kills_mid_effect.len()
    );
    for key in &kills_mid_effect {
        let attempt = db
            .scalar(&format!(
                "SELECT CAST(attempt AS BIGINT) FROM effects WHERE namespace = 'treasury' AND idempotency_key = '{key}'"
            ))
            .await;
        assert!(
            attempt >= 2,
            "{key}: its lease was taken again (attempt {attempt})"
        );
    }
    assert!(
        audit_count(&db, "treasury", "effect_retaken").await >= kills_mid_effect.len() as i64,
        "each lease cut off mid-effect is audited as taken again"
    );
    provider.task.abort();
    app.shutdown().await;
    let completed_rows = db
        .scalar("SELECT count(*) FROM effects WHERE namespace = 'treasury' AND state = 'completed'")
        .await;
    assert_eq!(completed_rows, keys.len() as i64);
    assert_eq!(
        audit_count(&db, "treasury", "effect_completed").await,
        keys.len() as i64
    );
}

/// (5) Same key, another request: FAILED_PRECONDITION at every tier (and
/// while in progress, at once); the same key in two namespaces is two
/// records, and a response is never readable from another namespace.
async fn requests_and_namespaces_are_kept_apart(kind: Kind) {
    let db = TestDb::new(kind).await;
    let prefix = unique("fx:");
    let a = TestApp::spawn(with_redis(serve_args(&db), &redis_url(), &prefix)).await;
    let b = TestApp::spawn(with_redis(serve_args(&db), &redis_url(), &prefix)).await;
    let no_cache = TestApp::spawn(serve_args(&db)).await;
    let (mut ca, mut cb) = (effects_client(a.addr).await, effects_client(b.addr).await);
    let mut cn = effects_client(no_cache.addr).await;
    let one = acquired(begin(&mut ca, begin_req("ns-one", "k", b"A", TTL)).await.unwrap());
    let busy = begin(&mut cb, begin_req("ns-one", "k", b"B", TTL))
        .await
        .unwrap_err();
    assert_eq!(
        busy.code(),
        Code::FailedPrecondition,
        "in progress, other request: refused at once"
    );
    complete(&mut ca, "ns-one", "k", &one.lease_token, b"one")
        .await
        .unwrap();
    for c in [&mut ca, &mut cb, &mut cn] {
        let e = begin(c, begin_req("ns-one", "k", b"B", TTL)).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("different request"), "{e:?}");
    }
    let two = acquired(begin(&mut cb, begin_req("ns-two", "k", b"A", TTL)).await.unwrap());
    assert_eq!(two.attempt, 1, "another namespace: another record");
    complete(&mut cb, "ns-two", "k", &two.lease_token, b"two")
        .await
        .unwrap();
    for c in [&mut ca, &mut cb, &mut cn] {
        let r1 = completed(begin(c, begin_req("ns-one", "k", b"A", TTL)).await.unwrap());
        let r2 = completed(begin(c, begin_req("ns-two", "k", b"A", TTL)).await.unwrap());
        assert_eq!(
            (r1.response.as_slice(), r2.response.as_slice()),
            (&b"one"[..], &b"two"[..])
        );
    }
    let lost = complete(&mut ca, "ns-two", "k", &one.lease_token, b"one")
        .await
        .unwrap_err();
    assert_eq!(
        lost.code(),
        Code::FailedPrecondition,
        "a token of ns-one means nothing in ns-two"
    );
    for app in [a, b, no_cache] {
        app.shutdown().await;
    }
    assert_eq!(db.scalar("SELECT count(*) FROM effects").await, 2);
    assert_eq!(audit_count(&db, "ns-one", "effect_rejected").await, 4);
    let tiers = db
        .scalar("SELECT count(DISTINCT tier) FROM audit_log WHERE decision = 'effect_rejected'")
        .await;
    assert_eq!(tiers, 3, "refused at L1, at L2 and in the store");
}

/// (6) Release: the next Begin acquires at once with attempt + 1; fencing
/// and repeats; an audit row for every transition.
async fn release_lets_the_next_begin_acquire_at_once_and_every_transition_is_audited(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = effects_client(app.addr).await;
    let first = acquired(begin(&mut c, begin_req("pay", "r-1", b"req", TTL)).await.unwrap());
    release(
        &mut c,
        "pay",
        "r-1",
        &first.lease_token,
        "bank rejected: account closed",
    )
    .await
    .unwrap();
    release(&mut c, "pay", "r-1", &first.lease_token, "repeat")
        .await
        .expect("repeating a release is no error");
    let started = std::time::Instant::now();
    let second = acquired(begin(&mut c, begin_req("pay", "r-1", b"req", TTL)).await.unwrap());
    assert!(started.elapsed() < Duration::from_secs(1), "acquired at once");
    assert_eq!(second.attempt, 2);
    let stale = complete(&mut c, "pay", "r-1", &first.lease_token, b"x")
        .await
        .unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition);
    let at = complete(&mut c, "pay", "r-1", &second.lease_token, b"ok")
        .await
        .unwrap();
    let again = complete(&mut c, "pay", "r-1", &second.lease_token, b"ok")
        .await
        .unwrap();
    assert_eq!(again, at, "a repeated Complete answers the same completed_at");
    let other = complete(&mut c, "pay", "r-1", &second.lease_token, b"changed")
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::FailedPrecondition);
    let late = release(&mut c, "pay", "r-1", &second.lease_token, "too late")
        .await
        .unwrap_err();
    assert_eq!(
        late.code(),
        Code::FailedPrecondition,
        "a completed record cannot be released"
    );
    app.shutdown().await;
    assert_eq!(audit_count(&db, "pay", "effect_acquired").await, 2);
    assert_eq!(audit_count(&db, "pay", "effect_released").await, 1);
    assert_eq!(audit_count(&db, "pay", "effect_completed").await, 1);
    let reason = db
        .scalar("SELECT count(*) FROM audit_log WHERE decision = 'effect_released' AND detail = 'bank rejected: account closed'")
        .await;
    assert_eq!(reason, 1, "audited with the reason");
    let after_release = db
        .scalar("SELECT count(*) FROM audit_log WHERE decision = 'effect_acquired' AND detail LIKE '%after a release%'")
        .await;
    assert_eq!(after_release, 1);
    let prefix = db
        .scalar("SELECT count(*) FROM audit_log WHERE award_id = 'pay' AND key_prefix = 'r-1'")
        .await;
    assert_eq!(prefix, 4);
    assert_eq!(
        db.scalar("SELECT count(*) FROM outbox WHERE event_type = 'effect.completed' AND sequence = 2")
            .await,
        1
    );
}

/// Validation: INVALID_ARGUMENT naming the field, RESOURCE_EXHAUSTED over a
/// size limit (the field's, or the whole message's); nothing written.
async fn bad_input_is_refused_naming_the_field_and_writes_nothing(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = effects_client(app.addr).await;
    let long = Duration::from_secs(16 * 60);
    let cases = [
        (begin_req("", "k", b"", TTL), "namespace"),
        (begin_req("Pay", "k", b"", TTL), "namespace"),
        (begin_req(&"n".repeat(65), "k", b"", TTL), "namespace"),
        (begin_req("pay", "", b"", TTL), "idempotency_key"),
        (begin_req("pay", &"k".repeat(129), b"", TTL), "idempotency_key"),
        (begin_req("pay", "k\u{7}", b"", TTL), "idempotency_key"),
        (begin_req("pay", "k", b"", long), "lease_ttl"),
        (begin_req("pay", "k", b"", Duration::ZERO), "lease_ttl"),
    ];
    for (req, field) in cases {
        let e = c.begin(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{field}: {e:?}");
        assert!(e.message().contains(field), "names {field}: {}", e.message());
    }
    // Over 1 MiB: the field's limit answers, well within the message limit.
    let over = 1024 * 1024 + 1;
    let big = c
        .begin(begin_req("pay", "k", &vec![0; over], TTL))
        .await
        .unwrap_err();
    assert_eq!(big.code(), Code::ResourceExhausted, "{big:?}");
    assert_eq!(
        big.message(),
        "request is 1048577 bytes, the limit is 1048576 bytes"
    );
    let big = complete(&mut c, "pay", "k", "abc", &vec![0; over])
        .await
        .unwrap_err();
    assert_eq!(big.code(), Code::ResourceExhausted, "{big:?}");
    assert_eq!(
        big.message(),
        "response is 1048577 bytes, the limit is 1048576 bytes"
    );
    let bad = release(&mut c, "pay", "k", "abc", "line\nbreak")
        .await
        .unwrap_err();
    assert!(bad.message().contains("reason"), "{bad:?}");
    app.shutdown().await;
    // Past ONCEGATE_MAX_MESSAGE_BYTES the transport refuses the message, as
    // RESOURCE_EXHAUSTED too.
    let mut args = serve_args(&db);
    args.max_message_bytes = 64 * 1024;
    args.max_payload_bytes = 16 * 1024;
    let small = TestApp::spawn(args).await;
    let mut c = effects_client(small.addr).await;
    let whole = c
        .begin(begin_req("pay", "k", &vec![0; 100 * 1024], TTL))
        .await
        .unwrap_err();
    assert_eq!(whole.code(), Code::ResourceExhausted, "{whole:?}");
    assert!(whole.message().contains("too large"), "{whole:?}");
    let whole = complete(&mut c, "pay", "k", "abc", &vec![0; 100 * 1024])
        .await
        .unwrap_err();
    assert_eq!(whole.code(), Code::ResourceExhausted, "{whole:?}");
    small.shutdown().await;
    assert_eq!(db.scalar("SELECT count(*) FROM effects").await, 0);
    assert_eq!(
        db.scalar("SELECT count(*) FROM audit_log WHERE decision LIKE 'effect_%'")
            .await,
        0
    );
}

/// Records follow the retention policy: the store's purge deletes those
/// whose last change is older than the retention, in batches.
async fn records_past_retention_are_purged_in_batches(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = effects_client(app.addr).await;
    for key in ["old-1", "old-2", "old-3", "young"] {
        let lease = acquired(begin(&mut c, begin_req("pay", key, b"r", TTL)).await.unwrap());
        release(&mut c, "pay", key, &lease.lease_token, "not sent")
            .await
            .unwrap();
    }
    let lease = acquired(begin(&mut c, begin_req("pay", "done", b"r", TTL)).await.unwrap());
    complete(&mut c, "pay", "done", &lease.lease_token, b"ok")
        .await
        .unwrap();
    app.shutdown().await;
    db.exec(match kind {
        Kind::Postgres => "UPDATE effects SET updated_at = updated_at - interval '400 days' WHERE idempotency_key LIKE 'old-%'",
        Kind::Sqlite => "UPDATE effects SET updated_at = updated_at - 400 * 86400000000 WHERE idempotency_key LIKE 'old-%'",
    })
    .await;
    let policy = oncegate::store::RetentionPolicy {
        retention: Duration::from_secs(30 * 86_400),
        outbox_retention: Duration::from_secs(7 * 86_400),
        batch_size: 2,
    };
    let report = db.open().await.purge(&policy).await.unwrap();
    assert_eq!(report.effects_deleted, 3);
    assert_eq!(
        db.scalar("SELECT count(*) FROM effects").await,
        2,
        "the young and the completed stay"
    );
}

/// `oncegate effect begin|complete|release|get` against the real server
/// and store.
async fn the_effect_subcommands_begin_complete_release_and_get(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let target = format!("http://{}", app.addr);
    let record = ["--namespace", "cli", "--key", "k-7"];
    let begin_args = [
        &["effect", "begin", "--target", &target][..],
        &record,
        &["--request", "pay 5"],
    ]
    .concat();
    let token_of = |out: &str| {
        out.split_whitespace()
            .find_map(|w| w.strip_prefix("lease_token="))
            .expect("a token")
            .to_string()
    };
    let (ok, out, err) = run_oncegate(&begin_args, &[]).await.into_parts();
    assert!(ok && out.starts_with("ACQUIRED attempt=1"), "{out}{err}");
    let first = token_of(&out);
    let release_args = [
        &["effect", "release", "--target", &target][..],
        &record,
        &["--lease-token", &first, "--reason", "no"],
    ]
    .concat();
    let (ok, out, err) = run_oncegate(&release_args, &[]).await.into_parts();
    assert!(ok && out.starts_with("RELEASED"), "{out}{err}");
    let (ok, out, _) = run_oncegate(&begin_args, &[]).await.into_parts();
    assert!(ok && out.starts_with("ACQUIRED attempt=2"), "{out}");
    let second = token_of(&out);
    let complete_args = [
        &["effect", "complete", "--target", &target][..],
        &record,
        &["--lease-token", &second, "--response", "receipt 42"],
    ]
    .concat();
    let (ok, out, err) = run_oncegate(&complete_args, &[]).await.into_parts();
    assert!(ok && out.starts_with("COMPLETED completed_at="), "{out}{err}");
    let (ok, out, _) = run_oncegate(&begin_args, &[]).await.into_parts();
    assert!(
        ok && out.starts_with("COMPLETED attempt=2") && out.contains("receipt 42"),
        "{out}"
    );
    let (ok, _, err) = run_oncegate(&complete_args, &[]).await.into_parts();
    assert!(ok, "a repeated Complete is answered: {err}");
    let stale = [
        &["effect", "release", "--target", &target][..],
        &record,
        &["--lease-token", "0000"],
    ]
    .concat();
    let (ok, _, err) = run_oncegate(&stale, &[]).await.into_parts();
    assert!(!ok && err.contains("FailedPrecondition"), "{err}");
    app.shutdown().await;
    let get_args = [&["effect", "get", "--database-url", &db.url][..], &record].concat();
    let (ok, out, err) = run_oncegate(&get_args, &[]).await.into_parts();
    assert!(
        ok && out.starts_with("COMPLETED attempt=2") && out.contains("receipt 42"),
        "{out}{err}"
    );
    let missing = [
        &["effect", "get", "--database-url", &db.url][..],
        &["--namespace", "cli", "--key", "nope"],
    ]
    .concat();
    let (ok, out, _) = run_oncegate(&missing, &[]).await.into_parts();
    assert!(!ok && out.contains("not found"));
}

/// SIGTERM's drain does not wait out another holder's lease: a waiting Begin
/// ends with UNAVAILABLE (retry elsewhere) and the drain finishes at once.
async fn a_waiting_begin_ends_when_its_sidecar_drains(kind: Kind) {
    let db = TestDb::new(kind).await;
    let holder = TestApp::spawn(serve_args(&db)).await;
    let draining = TestApp::spawn(serve_args(&db)).await;
    let mut ch = effects_client(holder.addr).await;
    acquired(begin(&mut ch, begin_req("pay", "d-1", b"r", TTL)).await.unwrap());
    let mut cw = effects_client(draining.addr).await;
    let waiting = tokio::spawn(async move { begin(&mut cw, begin_req("pay", "d-1", b"r", TTL)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "waits for the live lease");
    let started = std::time::Instant::now();
    draining.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let err = waiting
        .await
        .unwrap()
        .expect_err("no answer from a draining sidecar");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    holder.shutdown().await;
}
