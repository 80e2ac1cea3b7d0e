//! The front-line tiers (L1 moka, L2 Redis) and their invariant: a tier
//! answers DUPLICATE only holding the stored result of a committed claim.
//! Degraded modes: Redis down or gone, Postgres unreachable.

use crate::helpers::*;
use fred::prelude::*;
use oncegate::pb::{Outcome, Tier};
use std::time::Duration;
use tonic::Code;

const TS: &str = "2026-11-29T12:00:00Z";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_call_on_one_instance_is_a_local_cache_duplicate() {
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(with_redis(serve_args(&db), &redis_url(), &unique("t:"))).await;
    let mut c = app.client().await;
    let s = submission("AWD-L1", TS, b"l1", 300);
    let first = c.submit(s.clone()).await.unwrap().into_inner();
    let second = c.submit(s).await.unwrap().into_inner();
    assert_eq!(
        (outcome(&first), tier(&first)),
        (Outcome::Claimed, Tier::Database)
    );
    assert_eq!(
        (outcome(&second), tier(&second)),
        (Outcome::Duplicate, Tier::LocalCache)
    );
    assert_eq!(first.disbursement, second.disbursement);
    app.shutdown().await;
    let n = db.counts().await;
    assert_eq!(n.ledger(), (1, 1, 300, 1));
    let cached = db
        .scalar("SELECT count(*) FROM audit_log WHERE tier = 'LOCAL_CACHE'")
        .await;
    assert_eq!(cached, 1, "the cache-tier duplicate is audited off the hot path");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_instance_answers_from_redis_without_its_database() {
    let prefix = unique("t:");
    let db_a = TestDb::new(Kind::Postgres).await;
    // B's own database stays empty: had B consulted it, it would have
    // claimed the key (CLAIMED by DATABASE) and written a row there.
    let db_b = TestDb::new(Kind::Postgres).await;
    let a = TestApp::spawn(with_redis(serve_args(&db_a), &redis_url(), &prefix)).await;
    let b = TestApp::spawn(with_redis(serve_args(&db_b), &redis_url(), &prefix)).await;
    let s = submission("AWD-L2", TS, b"shared", 4_000);
    let first = a.client().await.submit(s.clone()).await.unwrap().into_inner();
    let redelivery = b.client().await.submit(s.clone()).await.unwrap().into_inner();
    assert_eq!(
        (outcome(&redelivery), tier(&redelivery)),
        (Outcome::Duplicate, Tier::Redis)
    );
    assert_eq!(redelivery.disbursement, first.disbursement);
    let again = b.client().await.submit(s).await.unwrap().into_inner();
    assert_eq!(tier(&again), Tier::LocalCache, "a Redis hit fills L1");
    a.shutdown().await;
    b.shutdown().await;
    assert_eq!(
        db_b.counts().await.ledger(),
        (0, 0, 0, 0),
        "B's database was not consulted"
    );
    assert_eq!(db_a.counts().await.ledger(), (1, 1, 4_000, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_in_flight_token_is_never_a_duplicate() {
    let prefix = unique("t:");
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(with_redis(serve_args(&db), &redis_url(), &prefix)).await;
    let s = submission("AWD-TOK", TS, b"fresh", 50);
    let key = oncegate::key::derive_key("AWD-TOK", TS, b"fresh");
    let redis = redis_client(&redis_url()).await;
    let _: () = redis
        .set(
            format!("{prefix}{key}"),
            "t:another-pod:0123456789",
            Some(Expiration::EX(60)),
            None,
            false,
        )
        .await
        .unwrap();
    let d = app.client().await.submit(s).await.unwrap().into_inner();
    assert_eq!((outcome(&d), tier(&d)), (Outcome::Claimed, Tier::Database));
    let stored: Option<String> = redis.get(format!("{prefix}{key}")).await.unwrap();
    assert!(
        stored.unwrap().starts_with("r2|"),
        "the committed result replaced the token"
    );
    assert_eq!(db.counts().await.ledger(), (1, 1, 50, 1));
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_transaction_releases_its_redis_lease() {
    let prefix = unique("t:");
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(with_redis(serve_args(&db), &redis_url(), &prefix)).await;
    let mut c = app.client().await;
    db.exec(
        "CREATE FUNCTION test_fail() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'injected'; END $$; \
         CREATE TRIGGER test_fail BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION test_fail();",
    )
    .await;
    let s = submission("AWD-REL", TS, b"lease", 60);
    let key = oncegate::key::derive_key("AWD-REL", TS, b"lease");
    assert_eq!(c.submit(s.clone()).await.unwrap_err().code(), Code::Internal);
    let redis = redis_client(&redis_url()).await;
    let left: Option<String> = redis.get(format!("{prefix}{key}")).await.unwrap();
    assert_eq!(left, None, "our own token was released (compare-and-delete)");
    db.exec("DROP TRIGGER test_fail ON outbox").await;
    let retry = c.submit(s).await.unwrap().into_inner();
    assert_eq!(
        (outcome(&retry), tier(&retry)),
        (Outcome::Claimed, Tier::Database)
    );
    assert_eq!(db.counts().await.ledger(), (1, 1, 60, 1));
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_opens_the_breaker_and_serving_continues_then_resumes() {
    let db = TestDb::new(Kind::Postgres).await;
    let mut redis = ThrowawayRedis::start().await;
    let sidecar = Sidecar::start(&[
        ("DATABASE_URL", db.url.clone()),
        ("REDIS_URL", redis.url()),
        ("ONCEGATE_REDIS_BREAKER_COOLDOWN", "300ms".into()),
        ("ONCEGATE_REDIS_TIMEOUT", "50ms".into()),
    ])
    .await;
    let mut c = sidecar.client().await;
    let before = c
        .submit(submission("AWD-R", TS, b"before", 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(outcome(&before), Outcome::Claimed);

    redis.stop().await;
    for i in 0..10u8 {
        let d = c
            .submit(submission("AWD-R", TS, &[b'd', i], 1))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (outcome(&d), tier(&d)),
            (Outcome::Claimed, Tier::Database),
            "served from Postgres"
        );
    }
    let dup = c
        .submit(submission("AWD-R", TS, b"before", 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(outcome(&dup), Outcome::Duplicate);
    let m = sidecar.metrics().await;
    assert_eq!(
        metric(&m, "oncegate_redis_breaker_state"),
        Some(1.0),
        "breaker open:\n{m}"
    );
    assert!(metric(&m, "oncegate_redis_breaker_transitions_total{to=\"open\"}").unwrap_or(0.0) >= 1.0);
    sidecar
        .log_containing("circuit open", Duration::from_secs(5))
        .await;
    // Every request above has been answered: any line of theirs is written
    // within the log writer's flush interval.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let log = sidecar.log_text();
    assert_eq!(
        log.matches("circuit open").count(),
        1,
        "logged once per state change, not per request"
    );

    redis.restart().await;
    let mut i = 0u32;
    let resumed = eventually(Duration::from_secs(10), || {
        i += 1;
        let mut c = c.clone();
        let addr = sidecar.metrics_addr;
        async move {
            c.submit(submission("AWD-R", TS, &i.to_le_bytes(), 1))
                .await
                .unwrap();
            metric(&scrape(addr).await, "oncegate_redis_breaker_state") == Some(0.0)
        }
    })
    .await;
    assert!(resumed, "breaker closes once Redis is back");
    let probe = submission("AWD-R", TS, b"after", 1);
    c.submit(probe).await.unwrap();
    let key = oncegate::key::derive_key("AWD-R", TS, b"after");
    let client = redis_client(&redis.url()).await;
    let stored: Option<String> = client.get(format!("oncegate:{key}")).await.unwrap();
    assert!(
        stored.is_some_and(|v| v.starts_with("r2|")),
        "the tier is used again"
    );
    assert_eq!(sidecar.terminate().await.code(), Some(0));
    let s = db.open().await.ledger_summary().await.unwrap();
    assert_eq!((s.mismatched_awards, s.sequence_gaps), (0, 0));
}

/// Redis down when the sidecar starts: claims are served from the store at
/// once; when Redis comes up the tier heals at the first probe after the
/// client reconnected — it keeps reconnecting instead of giving up after its
/// first try, faster than the breaker probes, so at most one probe fails
/// after Redis is back — and another instance's duplicate is answered from
/// Redis. (Counted in probes, not seconds: how long the cooldown has grown
/// by then depends on how many probes failed while Redis was down.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_at_start_heals_within_one_probe_and_answers_other_instances() {
    let db = TestDb::new(Kind::Postgres).await;
    let mut redis = ThrowawayRedis::start().await;
    redis.stop().await;
    let env = |redis: &ThrowawayRedis| {
        vec![
            ("DATABASE_URL", db.url.clone()),
            ("REDIS_URL", redis.url()),
            ("ONCEGATE_REDIS_BREAKER_COOLDOWN", "1s".to_string()),
            // Met by a loaded machine's Redis; claims still never wait for it.
            ("ONCEGATE_REDIS_TIMEOUT", "300ms".to_string()),
        ]
    };
    let a = Sidecar::start(&env(&redis)).await;
    let mut c = a.client().await;
    for i in 0..5u8 {
        let d = tokio::time::timeout(
            Duration::from_secs(2),
            c.submit(submission("AWD-RS", TS, &[b's', i], 1)),
        )
        .await
        .expect("a claim does not wait for Redis")
        .unwrap()
        .into_inner();
        assert_eq!((outcome(&d), tier(&d)), (Outcome::Claimed, Tier::Database));
    }
    let m = a.metrics().await;
    assert_eq!(metric(&m, "oncegate_redis_breaker_state"), Some(1.0), "{m}");

    let opens = |m: &str| metric(m, "oncegate_redis_breaker_transitions_total{to=\"open\"}").unwrap_or(0.0);
    redis.restart().await;
    let up = tokio::time::Instant::now();
    let opened_before = opens(&a.metrics().await);
    let mut i = 0u32;
    let closed = eventually(Duration::from_secs(10), || {
        i += 1;
        let mut c = c.clone();
        let addr = a.metrics_addr;
        async move {
            c.submit(submission("AWD-RS", TS, &i.to_be_bytes(), 1))
                .await
                .unwrap();
            metric(&scrape(addr).await, "oncegate_redis_breaker_state") == Some(0.0)
        }
    })
    .await;
    let healed = up.elapsed();
    assert!(closed, "breaker closes once Redis answers:\n{}", a.log_text());
    let failed_probes = opens(&a.metrics().await) - opened_before;
    println!("healed {healed:?} after Redis was back; probes failed meanwhile: {failed_probes}");
    assert!(
        failed_probes <= 1.0,
        "the client reconnected before the breaker's next probe: {failed_probes} probes failed after Redis was back"
    );
    let fresh = submission("AWD-RS", TS, b"after", 1);
    let first = c.submit(fresh.clone()).await.unwrap().into_inner();
    assert_eq!(outcome(&first), Outcome::Claimed);
    let b = Sidecar::start(&env(&redis)).await;
    let again = b.client().await.submit(fresh).await.unwrap().into_inner();
    assert_eq!(
        (outcome(&again), tier(&again)),
        (Outcome::Duplicate, Tier::Redis),
        "the other instance's duplicate comes from Redis"
    );
    assert_eq!(again.disbursement, first.disbursement);
    assert_eq!(a.terminate().await.code(), Some(0));
    assert_eq!(b.terminate().await.code(), Some(0));
}

/// Postgres unreachable (DESIGN §7.2): an L1/L2 hit touches no connection, so
/// once the identity probe fails cache answers are suspended — duplicates
/// and fresh work both get UNAVAILABLE, never a guess about a primary that
/// may be gone. The same server back: the caches answer again, L1 kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_unreachable_suspends_cache_answers_and_refuses_fresh_work() {
    let prefix = unique("t:");
    let db = TestDb::new(Kind::Postgres).await;
    let proxy = FaultProxy::start(pg_addr()).await;
    let via_proxy = |db: &TestDb| {
        let mut args = with_redis(serve_args(db), &redis_url(), &prefix);
        args.store.database_url = Some(proxy.pg_url(db));
        args.primary_probe_interval = Duration::from_millis(200);
        args
    };
    let a = TestApp::spawn(via_proxy(&db)).await;
    let b = TestApp::spawn(via_proxy(&db)).await;
    let known = submission("AWD-DOWN", TS, b"known", 10);
    a.client().await.submit(known.clone()).await.unwrap();

    proxy.cut();
    for app in [&a, &b] {
        let suspended = eventually(Duration::from_secs(5), || {
            let (c, known) = (app.client(), known.clone());
            async move {
                let err = c.await.submit(known).await.err();
                err.is_some_and(|e| e.code() == Code::Unavailable)
            }
        })
        .await;
        assert!(
            suspended,
            "a cached duplicate is not answered while the primary is unconfirmed"
        );
    }
    let fresh = submission("AWD-DOWN", TS, b"fresh", 20);
    let started = std::time::Instant::now();
    let err = a.client().await.submit(fresh.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "fails fast: {:?}",
        started.elapsed()
    );

    proxy.restore();
    // The same server confirmed again: L1 resumes as it was, and so does L2.
    let resumed = eventually(Duration::from_secs(10), || {
        let (c, known) = (a.client(), known.clone());
        async move {
            let d = c.await.submit(known).await.ok().map(|d| d.into_inner());
            d.is_some_and(|d| (outcome(&d), tier(&d)) == (Outcome::Duplicate, Tier::LocalCache))
        }
    })
    .await;
    assert!(resumed, "L1 answers again once the same primary is confirmed");
    let from_l2 = eventually(Duration::from_secs(10), || {
        let (c, known) = (b.client(), known.clone());
        async move {
            let d = c.await.submit(known).await.ok().map(|d| d.into_inner());
            // (L2, or L1 filled from L2 before the suspension.)
            d.is_some_and(|d| outcome(&d) == Outcome::Duplicate && tier(&d) != Tier::Database)
        }
    })
    .await;
    assert!(
        from_l2,
        "the caches answer again once the same primary is confirmed"
    );
    assert_eq!(
        db.counts().await.ledger(),
        (1, 1, 10, 1),
        "nothing written while down"
    );
    // The fresh submission's lease was released: the retry is claimed, not stuck.
    let retry = b.client().await.submit(fresh).await.unwrap().into_inner();
    assert_eq!(
        (outcome(&retry), tier(&retry)),
        (Outcome::Claimed, Tier::Database)
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_redis_and_restarted_instance_still_find_duplicates_in_the_database() {
    let db = TestDb::new(Kind::Postgres).await;
    let redis = ThrowawayRedis::start().await;
    let s = submission("AWD-FL", TS, b"flush", 99);
    let a = TestApp::spawn(with_redis(serve_args(&db), &redis.url(), "oncegate:")).await;
    let first = a.client().await.submit(s.clone()).await.unwrap().into_inner();
    a.shutdown().await;
    let client = redis_client(&redis.url()).await;
    let _: () = client.flushall(false).await.unwrap();
    let b = TestApp::spawn(with_redis(serve_args(&db), &redis.url(), "oncegate:")).await;
    let redelivery = b.client().await.submit(s).await.unwrap().into_inner();
    assert_eq!(
        (outcome(&redelivery), tier(&redelivery)),
        (Outcome::Duplicate, Tier::Database)
    );
    assert_eq!(redelivery.disbursement, first.disbursement);
    assert_eq!(db.counts().await.ledger(), (1, 1, 99, 1));
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_endpoint_serves_the_named_series() {
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(with_redis(serve_args(&db), &redis_url(), &unique("t:"))).await;
    let mut c = app.client().await;
    let s = submission("AWD-M", TS, b"m", 5);
    c.submit(s.clone()).await.unwrap();
    c.submit(s).await.unwrap();
    let _ = c.submit(submission("", TS, b"m", 5)).await.unwrap_err();
    let text = app.metrics().await;
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    for series in [
        "oncegate_decisions_total{outcome=\"CLAIMED\",tier=\"DATABASE\"}",
        "oncegate_decisions_total{outcome=\"DUPLICATE\",tier=\"LOCAL_CACHE\"}",
        "oncegate_request_duration_seconds_bucket{method=\"Submit\",result=\"claimed\"",
        "oncegate_tier_lookups_total{tier=\"LOCAL_CACHE\",result=\"hit\"}",
        "oncegate_tier_lookups_total{tier=\"REDIS\",result=\"miss\"}",
        "oncegate_rejections_total{reason=\"invalid_argument\"}",
        "oncegate_redis_breaker_state",
        "oncegate_db_transactions_total{result=\"commit\"}",
        "oncegate_db_pool_connections{state=\"idle\"}",
        "oncegate_group_commit_batch_size_bucket",
        "# TYPE oncegate_decisions_total counter",
        "# HELP oncegate_decisions_total",
    ] {
        assert!(text.contains(series), "missing {series} in:\n{text}");
    }
    app.shutdown().await;
}
