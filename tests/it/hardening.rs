//! Regulatory hardening: every decision audited, totals that cannot
//! overflow, one rule for repeats inside a batch, strict validation, a stuck
//! row lock that stalls only its award, and ledger times in sequence order.

use crate::helpers::*;
use oncegate::group_commit::claim_batch;
use oncegate::pb::{self, Outcome};
use oncegate::store::{ClaimContext, ClaimOutcome};
use oncegate::submission::{Limits, Submission};
use sqlx::Connection;
use std::time::Duration;
use tonic::Code;

const TS: &str = "2026-11-29T10:00:00Z";

on_both_stores!(
    repeats_coalesced_in_one_transaction_each_get_an_audit_row,
    a_genuine_duplicate_after_a_refused_reuse_in_one_batch_is_a_duplicate,
    an_amount_that_would_overflow_the_total_is_refused_and_writes_nothing,
    overflow_against_the_stored_total_is_refused_naming_the_award,
    malformed_values_never_reach_the_ledger,
    four_hundred_cache_duplicates_then_sigkill_leave_four_hundred_audit_rows_after_restart,
);

fn validated(raw: &pb::Submission) -> Submission {
    Submission::validate(raw, Limits::default()).expect("valid submission")
}

fn ctx() -> ClaimContext {
    ClaimContext {
        instance: "it-hardening".into(),
    }
}

fn keyed(award: &str, key: &str, amount: i64) -> pb::Submission {
    let mut s = submission(award, TS, b"{}", amount);
    s.idempotency_key = Some(key.into());
    s
}

/// Per-item answers of a SubmitBatch, as `Claimed`/`Duplicate` or the code.
fn answers(results: &[pb::Result]) -> Vec<String> {
    results
        .iter()
        .map(|r| match r.result.as_ref().unwrap() {
            pb::result::Result::Decision(d) => format!("{:?}", outcome(d)),
            pb::result::Result::Error(e) => format!("{:?}", Code::from_i32(e.code)),
        })
        .collect()
}

/// Two deliveries of one key coalesced into one group-commit transaction,
/// and a reuse of the key in the same transaction: one audit row each.
async fn repeats_coalesced_in_one_transaction_each_get_an_audit_row(kind: Kind) {
    let db = TestDb::new(kind).await;
    let store = db.open().await;
    let first = validated(&keyed("AWD-R", "intent-r", 100));
    let reuse = validated(&keyed("AWD-R", "intent-r", 999));
    let items = vec![first.clone(), first.clone(), reuse];
    let outcomes = claim_batch(&*store, &items, &ctx()).await.unwrap();
    assert!(matches!(outcomes[0], ClaimOutcome::Claimed(_)), "{outcomes:?}");
    assert!(matches!(outcomes[1], ClaimOutcome::Duplicate(_)), "{outcomes:?}");
    assert!(matches!(outcomes[2], ClaimOutcome::KeyReused(_)), "{outcomes:?}");
    let n = db.counts().await;
    assert_eq!(n.ledger(), (1, 1, 100, 1));
    assert_eq!(
        (n.audit_processed, n.audit_duplicate, n.audit_rejected),
        (1, 1, 1),
        "one audit row per decision"
    );
    let tiers = db
        .scalar("SELECT count(*) FROM audit_log WHERE decision <> 'processed' AND tier = 'DATABASE'")
        .await;
    assert_eq!(tiers, 2, "repeats are decided by the database transaction");
}

/// Stored K/100; batch [K/200, K/100] is [refused, duplicate], and both
/// decisions are audited.
async fn a_genuine_duplicate_after_a_refused_reuse_in_one_batch_is_a_duplicate(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    c.submit(keyed("AWD-K", "intent-k", 100)).await.unwrap();
    let batch = vec![keyed("AWD-K", "intent-k", 200), keyed("AWD-K", "intent-k", 100)];
    for round in ["from the store", "from L1"] {
        let results = c
            .submit_batch(pb::SubmitBatchRequest {
                submissions: batch.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .results;
        assert_eq!(answers(&results), ["FailedPrecondition", "Duplicate"], "{round}");
    }
    let audited = eventually(Duration::from_secs(5), || async {
        let n = db.counts().await;
        n.audit_rejected == 2 && n.audit_duplicate == 2
    })
    .await;
    let n = db.counts().await;
    assert!(audited, "two refusals and two duplicates audited: {n:?}");
    assert_eq!(n.ledger(), (1, 1, 100, 1));
    app.shutdown().await;
}

/// Two fresh submissions of 5·10^18 cents for one award in one batch: the
/// first is claimed, the second would overflow the running total.
async fn an_amount_that_would_overflow_the_total_is_refused_and_writes_nothing(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    let big = 5_000_000_000_000_000_000;
    let batch = vec![
        submission("AWD-BIG", TS, b"one", big),
        submission("AWD-BIG", TS, b"two", big),
        submission("AWD-SMALL", TS, b"three", 7),
    ];
    let results = c
        .submit_batch(pb::SubmitBatchRequest { submissions: batch })
        .await
        .unwrap()
        .into_inner()
        .results;
    let got = answers(&results);
    assert_eq!(got.iter().filter(|a| *a == "Claimed").count(), 2, "{got:?}");
    let refused: Vec<&pb::Error> = results
        .iter()
        .filter_map(|r| match r.result.as_ref().unwrap() {
            pb::result::Result::Error(e) => Some(e),
            _ => None,
        })
        .collect();
    assert_eq!(refused.len(), 1, "{got:?}");
    assert_eq!(refused[0].code, Code::InvalidArgument as i32);
    assert!(
        refused[0].message.contains("AWD-BIG"),
        "names the award: {}",
        refused[0].message
    );
    let n = db.counts().await;
    assert_eq!(
        n.ledger(),
        (2, 2, big + 7, 2),
        "nothing written for the refused item"
    );
    let total = db
        .scalar("SELECT total_cents FROM award_balances WHERE award_id = 'AWD-BIG'")
        .await;
    assert_eq!(total, big, "the total is exact, never wrapped");
    if kind == Kind::Sqlite {
        let kind_of = db
            .scalar("SELECT count(*) FROM award_balances WHERE typeof(total_cents) <> 'integer'")
            .await;
        assert_eq!(kind_of, 0, "no total became a REAL");
    }
    app.shutdown().await;
}

/// A single submission that would overflow the award's stored total.
async fn overflow_against_the_stored_total_is_refused_naming_the_award(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    c.submit(submission("AWD-MAX", TS, b"a", i64::MAX - 10))
        .await
        .unwrap();
    let err = c
        .submit(submission("AWD-MAX", TS, b"b", 11))
        .await
        .expect_err("would overflow");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("AWD-MAX"), "{}", err.message());
    let ok = c.submit(submission("AWD-MAX", TS, b"c", 10)).await.unwrap();
    assert_eq!(outcome(ok.get_ref()), Outcome::Claimed, "up to the limit is fine");
    let n = db.counts().await;
    assert_eq!(n.ledger(), (2, 2, i64::MAX, 2));
    app.shutdown().await;
}

/// A control character in a timestamp and an invisible character in an
/// award id are refused, naming the field, and nothing is written — the
/// other items of the batch proceed.
async fn malformed_values_never_reach_the_ledger(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    let batch = vec![
        submission("AWD-V", "2026-11-29\u{0}10:00:00Z", b"nul", 1),
        submission("AWD-V", "2026-11-29x10:00:00Z", b"x", 2),
        submission("AWD\u{200B}-V", TS, b"zero-width", 3),
        submission("AWD\u{202E}-V", TS, b"bidi", 4),
        submission("AWD-V", TS, b"fine", 5),
    ];
    let results = c
        .submit_batch(pb::SubmitBatchRequest { submissions: batch })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(
        answers(&results),
        [
            "InvalidArgument",
            "InvalidArgument",
            "InvalidArgument",
            "InvalidArgument",
            "Claimed"
        ]
    );
    for (r, field) in results.iter().zip([
        "submission_timestamp",
        "submission_timestamp",
        "award_id",
        "award_id",
    ]) {
        let Some(pb::result::Result::Error(e)) = &r.result else {
            unreachable!()
        };
        assert!(e.message.contains(field), "{}", e.message);
    }
    assert_eq!(db.counts().await.ledger(), (1, 1, 5, 1));
    app.shutdown().await;
}

/// The sidecar's `(sequence, recorded_at)` for a decision.
fn seq_and_time(d: &pb::Decision) -> (i64, String) {
    let b = d.disbursement.as_ref().unwrap();
    (b.sequence, b.recorded_at.clone())
}

/// A transaction that starts first but waits (here: on another session's
/// uncommitted claim of the same key) gets the later sequence number; its
/// `recorded_at` must not be earlier than the one before it in the award.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_at_follows_sequence_order_within_an_award() {
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let first = submission("AWD-T", TS, b"waits", 1);
    let key = oncegate::key::derive_key("AWD-T", TS, b"waits");
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id) \
         VALUES ('{key}', 'AWD-T', 'held', gen_random_uuid())"
    )))
    .execute(&mut holder)
    .await
    .unwrap();
    let mut c1 = app.client().await;
    let waiting = tokio::spawn(async move { c1.submit(first).await.map(|r| r.into_inner()) });
    // The state under test: the first transaction started and waits.
    assert!(
        eventually(Duration::from_secs(30), || async {
            sessions_waiting_on_a_lock(&db).await > 0
        })
        .await,
        "the first submission waits on the held claim"
    );
    let mut c2 = app.client().await;
    let overtaking = c2
        .submit(submission("AWD-T", TS, b"overtakes", 1))
        .await
        .unwrap()
        .into_inner();
    sqlx::raw_sql("ROLLBACK").execute(&mut holder).await.unwrap();
    let waited = waiting
        .await
        .unwrap()
        .expect("claimed once the other session rolled back");
    let (seq_a, at_a) = seq_and_time(&overtaking);
    let (seq_b, at_b) = seq_and_time(&waited);
    assert_eq!((seq_a, seq_b), (1, 2), "the waiting transaction numbered second");
    assert!(
        at_b >= at_a,
        "recorded_at runs with the sequence: {at_a} (1) then {at_b} (2)"
    );
    let out_of_order = db
        .scalar(
            "SELECT count(*) FROM disbursements a JOIN disbursements b \
             ON a.award_id = b.award_id AND a.sequence < b.sequence AND a.recorded_at > b.recorded_at",
        )
        .await;
    assert_eq!(out_of_order, 0);
    app.shutdown().await;
}

/// Twelve concurrent calls, every fourth for `locked` (when given), the
/// others for awards of their own: each call's award, result and latency.
async fn burst(
    app: &TestApp,
    locked: Option<&str>,
    tag: &str,
) -> Vec<(String, Result<oncegate::pb::Decision, tonic::Status>, Duration)> {
    let started = std::time::Instant::now();
    let mut calls = Vec::new();
    for i in 0..12 {
        let award = match locked {
            Some(locked) if i % 4 == 0 => locked.to_string(),
            _ => format!("AWD-FREE-{tag}-{i}"),
        };
        let mut c = app.client().await;
        calls.push(tokio::spawn(async move {
            // A deadline, so a stalled instance fails the test instead of
            // hanging it.
            let mut request = tonic::Request::new(submission(&award, TS, format!("p{i}").as_bytes(), 1));
            request.set_timeout(Duration::from_secs(8));
            let r = c.submit(request).await;
            (award, r.map(|d| d.into_inner()), started.elapsed())
        }));
    }
    futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect()
}

/// A session holding award A's balance row (a stuck client, a half-open
/// connection) stalls only A: other awards' deliveries in the same moment
/// are claimed while A is still locked, waiting at most for the batches that
/// carried one of A's calls to hit their lock timeout (measured against the
/// same burst with nothing locked, on this machine, just before); A's
/// caller gets UNAVAILABLE after the lock timeout, and nothing is written
/// for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stuck_row_lock_stalls_only_its_award() {
    let db = TestDb::new(Kind::Postgres).await;
    let mut args = serve_args(&db);
    let lock_timeout = Duration::from_millis(500);
    args.store.db_lock_timeout = lock_timeout;
    let app = TestApp::spawn(args).await;
    let mut c = app.client().await;
    c.submit(submission("AWD-LOCKED", TS, b"first", 1)).await.unwrap();
    // The yardstick: the same burst, nothing locked.
    let unlocked = burst(&app, None, "yardstick").await;
    let yardstick = unlocked.iter().map(|(.., took)| *took).max().unwrap();
    assert!(unlocked.iter().all(|(_, r, _)| r.is_ok()), "{unlocked:?}");
    let mut holder = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql("BEGIN; SELECT * FROM award_balances WHERE award_id = 'AWD-LOCKED' FOR UPDATE")
        .execute(&mut holder)
        .await
        .unwrap();
    let mut free_slowest = Duration::ZERO;
    let mut locked_calls = 0;
    for (award, result, took) in burst(&app, Some("AWD-LOCKED"), "locked").await {
        if award == "AWD-LOCKED" {
            let err = result.expect_err("the locked award cannot be claimed now");
            assert_eq!(err.code(), Code::Unavailable, "{err:?}");
            locked_calls += 1;
        } else {
            assert_eq!(outcome(&result.expect("other awards flow")), Outcome::Claimed);
            free_slowest = free_slowest.max(took);
        }
    }
    // Each of the locked award's calls can cost the others two lock timeouts
    // at most: one in the batch it joined (batches run one after another),
    // one holding a pool connection (of 3) in its own retry, one by one.
    // Never the holder's time: it lets go only after this burst.
    let bound = yardstick + lock_timeout * 2 * (locked_calls + 1);
    println!("other awards: slowest {free_slowest:?} (nothing locked: {yardstick:?}; bound {bound:?})");
    assert!(
        free_slowest < bound,
        "other awards waited {free_slowest:?}: more than the same burst with nothing locked ({yardstick:?}) \
         and two lock timeouts per locked call ({locked_calls} × 2 × {lock_timeout:?})"
    );
    sqlx::raw_sql("COMMIT").execute(&mut holder).await.unwrap();
    let n = db.counts().await;
    assert_eq!(
        n.ledger(),
        (22, 22, 22, 22),
        "nothing written for the locked award's refused calls"
    );
    let retried = c.submit(submission("AWD-LOCKED", TS, b"p0", 1)).await.unwrap();
    assert_eq!(
        outcome(retried.get_ref()),
        Outcome::Claimed,
        "a retry after the lock is gone"
    );
    app.shutdown().await;
}

/// Duplicate rows of `award` in the audit log.
async fn duplicate_rows(db: &TestDb, award: &str) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM audit_log WHERE decision = 'duplicate' AND award_id = '{award}'"
    ))
    .await
}

/// One claim of `award`, then `n` duplicates answered by L1.
async fn claim_then_duplicates(sidecar: &Sidecar, award: &str, n: usize) {
    let mut c = sidecar.client().await;
    let sub = submission(award, TS, b"spooled", 100);
    let first = c.submit(sub.clone()).await.unwrap().into_inner();
    assert_eq!(outcome(&first), Outcome::Claimed);
    for _ in 0..n {
        let d = c.submit(sub.clone()).await.unwrap().into_inner();
        assert_eq!(
            (outcome(&d), tier(&d)),
            (Outcome::Duplicate, pb::Tier::LocalCache)
        );
    }
}

/// Cache duplicates wait in the audit queue (the flush interval is an hour
/// here). Without a spool a SIGKILL loses them: the control, 50 duplicates,
/// 0 rows after a restart. With `ONCEGATE_AUDIT_SPOOL_DIR`, 400 duplicates
/// then SIGKILL: none in the database at the kill, all 400 once each after
/// a restart on the same directory (and still 400 after a clean shutdown).
async fn four_hundred_cache_duplicates_then_sigkill_leave_four_hundred_audit_rows_after_restart(kind: Kind) {
    let db = TestDb::new(kind).await;
    let spool = tempfile::tempdir().unwrap();
    let mut env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("ONCEGATE_AUDIT_FLUSH_INTERVAL", "1h".to_string()),
        ("ONCEGATE_AUDIT_SEAL_INTERVAL", "0s".to_string()),
    ];
    let control = Sidecar::start(&env).await;
    claim_then_duplicates(&control, "AWD-NO-SPOOL", 50).await;
    control.kill().await;
    Sidecar::start(&env).await.terminate().await;
    assert_eq!(
        duplicate_rows(&db, "AWD-NO-SPOOL").await,
        0,
        "the control loses them"
    );

    env.push(("ONCEGATE_AUDIT_SPOOL_DIR", spool.path().display().to_string()));
    let sidecar = Sidecar::start(&env).await;
    claim_then_duplicates(&sidecar, "AWD-SPOOLED", 400).await;
    sidecar.kill().await;
    assert_eq!(
        duplicate_rows(&db, "AWD-SPOOLED").await,
        0,
        "killed before any flush"
    );
    let again = Sidecar::start(&env).await;
    let written = eventually(Duration::from_secs(15), || async {
        duplicate_rows(&db, "AWD-SPOOLED").await == 400
    })
    .await;
    assert!(
        written,
        "{} of 400 rows",
        duplicate_rows(&db, "AWD-SPOOLED").await
    );
    let metrics = again.metrics().await;
    assert!(
        metrics.contains("oncegate_audit_spool_replayed_total 400"),
        "{metrics}"
    );
    assert!(again.terminate().await.success());
    Sidecar::start(&env).await.terminate().await;
    assert_eq!(duplicate_rows(&db, "AWD-SPOOLED").await, 400, "each row once");
}
