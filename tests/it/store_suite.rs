//! The store conformance suite: every store-level behaviour, run through the
//! real gRPC server against both stores (Postgres and embedded SQLite) from
//! the same test code.

use crate::helpers::*;
use oncegate::pb::{self, Outcome, Tier};
use tonic::Code;

on_both_stores!(
    first_delivery_is_claimed_with_sequence_and_total,
    duplicate_is_rejected_atomically_with_the_same_result,
    replay_after_lost_ack_is_a_database_duplicate,
    failing_outbox_insert_writes_nothing_and_retry_succeeds,
    concurrent_deliveries_on_two_instances_claim_once,
    submit_batch_answers_every_item_in_order,
    every_invalid_field_is_named_and_nothing_is_written,
    reused_producer_key_is_refused_at_every_tier,
    late_redelivery_after_claim_purge_is_not_double_posted,
    changed_payload_is_processed_and_flagged,
    lookup_finds_stored_results_only,
    per_award_sequences_are_dense_under_group_commit,
);

const TS: &str = "2026-11-29T10:00:00Z";

async fn first_delivery_is_claimed_with_sequence_and_total(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    let a = c
        .submit(submission("AWD-1", TS, b"one", 150))
        .await
        .unwrap()
        .into_inner();
    let b = c
        .submit(submission("AWD-1", TS, b"two", 250))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((outcome(&a), tier(&a)), (Outcome::Claimed, Tier::Database));
    assert_eq!(outcome(&b), Outcome::Claimed);
    assert_eq!(a.disbursement.as_ref().unwrap().sequence, 1);
    assert_eq!(b.disbursement.as_ref().unwrap().sequence, 2);
    assert_eq!(a.idempotency_key, oncegate::key::derive_key("AWD-1", TS, b"one"));
    let n = db.counts().await;
    assert_eq!(n.ledger(), (2, 2, 400, 2));
    assert_eq!(n.audit_processed, 2);
    app.shutdown().await;
}

async fn duplicate_is_rejected_atomically_with_the_same_result(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    let s = submission("AWD-7", TS, b"{\"grant\":1}", 125_000);
    let first = c.submit(s.clone()).await.unwrap().into_inner();
    let after_first = db.counts().await;
    let second = c.submit(s).await.unwrap().into_inner();
    assert_eq!(outcome(&first), Outcome::Claimed);
    assert_eq!(outcome(&second), Outcome::Duplicate);
    assert_eq!(first.disbursement, second.disbursement, "identical stored result");
    assert_eq!(first.idempotency_key, second.idempotency_key);
    app.shutdown().await; // flushes the duplicate's audit row
    let after = db.counts().await;
    assert_eq!(
        after.ledger(),
        after_first.ledger(),
        "no new rows but the audit trail"
    );
    assert_eq!(after.ledger(), (1, 1, 125_000, 1));
    assert_eq!((after.audit_processed, after.audit_duplicate), (1, 1));
}

async fn replay_after_lost_ack_is_a_database_duplicate(kind: Kind) {
    let db = TestDb::new(kind).await;
    let s = submission("AWD-9", TS, b"payload", 5_000);
    let first = {
        let app = TestApp::spawn(serve_args(&db)).await;
        let d = app.client().await.submit(s.clone()).await.unwrap().into_inner();
        app.shutdown().await; // the consumer crashed before acking; the broker redelivers
        d
    };
    let app = TestApp::spawn(serve_args(&db)).await; // a new instance, empty L1
    let replay = app.client().await.submit(s).await.unwrap().into_inner();
    assert_eq!(
        (outcome(&replay), tier(&replay)),
        (Outcome::Duplicate, Tier::Database)
    );
    assert_eq!(replay.disbursement, first.disbursement);
    let n = db.counts().await;
    assert_eq!(n.ledger(), (1, 1, 5_000, 1));
    assert_eq!(
        n.audit_duplicate, 1,
        "the database-decided duplicate is audited in its transaction"
    );
    app.shutdown().await;
}

async fn fail_outbox(db: &TestDb) {
    match db.kind {
        Kind::Postgres => {
            db.exec(
                "CREATE FUNCTION test_fail() RETURNS trigger LANGUAGE plpgsql AS \
                 $$ BEGIN RAISE EXCEPTION 'injected outbox failure'; END $$; \
                 CREATE TRIGGER test_fail BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION test_fail();",
            )
            .await
        }
        Kind::Sqlite => {
            db.exec(
                "CREATE TRIGGER test_fail BEFORE INSERT ON outbox \
                 BEGIN SELECT RAISE(ABORT, 'injected outbox failure'); END;",
            )
            .await
        }
    }
}

async fn heal_outbox(db: &TestDb) {
    db.exec(match db.kind {
        Kind::Postgres => "DROP TRIGGER test_fail ON outbox",
        Kind::Sqlite => "DROP TRIGGER test_fail",
    })
    .await;
}

async fn failing_outbox_insert_writes_nothing_and_retry_succeeds(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    c.submit(submission("AWD-1", TS, b"before", 100)).await.unwrap();
    let before = db.counts().await;
    fail_outbox(&db).await;
    let s = submission("AWD-1", TS, b"atomic", 700);
    let err = c.submit(s.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert!(
        !err.message().contains("injected"),
        "database detail is not sent to clients"
    );
    let during = db.counts().await;
    assert_eq!(
        during, before,
        "no claim, no disbursement, no total change, no audit"
    );
    heal_outbox(&db).await;
    let retry = c.submit(s).await.unwrap().into_inner();
    assert_eq!(outcome(&retry), Outcome::Claimed);
    assert_eq!(
        retry.disbursement.unwrap().sequence,
        2,
        "the failed attempt consumed no sequence number"
    );
    assert_eq!(db.counts().await.ledger(), (2, 2, 800, 2));
    app.shutdown().await;
}

async fn concurrent_deliveries_on_two_instances_claim_once(kind: Kind) {
    let db = TestDb::new(kind).await;
    let a = TestApp::spawn(serve_args(&db)).await;
    let b = TestApp::spawn(serve_args(&db)).await;
    let s = submission("AWD-64", TS, b"the same delivery", 9_999);
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..64 {
        let mut c = if i % 2 == 0 {
            a.client().await
        } else {
            b.client().await
        };
        let s = s.clone();
        calls.spawn(async move { c.submit(s).await.map(|r| r.into_inner()) });
    }
    let mut claimed = 0;
    let mut ids = std::collections::HashSet::new();
    while let Some(r) = calls.join_next().await {
        let d = r
            .unwrap()
            .expect("every concurrent duplicate gets an answer, never an error");
        if outcome(&d) == Outcome::Claimed {
            claimed += 1;
        }
        ids.insert(d.disbursement.unwrap().id);
    }
    assert_eq!(claimed, 1);
    assert_eq!(ids.len(), 1, "every answer carries the one stored result");
    assert_eq!(db.counts().await.ledger(), (1, 1, 9_999, 1));
    a.shutdown().await;
    b.shutdown().await;
}

async fn submit_batch_answers_every_item_in_order(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    let old = submission("AWD-B", TS, b"old", 10);
    c.submit(old.clone()).await.unwrap();
    let fresh = submission("AWD-B", TS, b"fresh", 20);
    let mut invalid = submission("AWD-B", TS, b"bad", 30);
    invalid.amount_cents = 0;
    let mut reused = submission("AWD-C", TS, b"x", 40);
    reused.idempotency_key = Some("intent-1".into());
    let mut reused_other = reused.clone();
    reused_other.amount_cents = 41;
    let items = vec![
        fresh.clone(),
        old,
        fresh.clone(),
        invalid,
        reused,
        reused_other,
        fresh,
    ];
    let results = c
        .submit_batch(pb::SubmitBatchRequest { submissions: items })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(results.len(), 7);
    let kinds: Vec<String> = results
        .iter()
        .map(|r| match r.result.as_ref().unwrap() {
            pb::result::Result::Decision(d) => format!("{:?}", outcome(d)),
            pb::result::Result::Error(e) => format!("error {}", Code::from_i32(e.code) as i32),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "Claimed",
            "Duplicate",
            "Duplicate",
            &format!("error {}", Code::InvalidArgument as i32),
            "Claimed",
            &format!("error {}", Code::FailedPrecondition as i32),
            "Duplicate"
        ]
    );
    if let pb::result::Result::Error(e) = results[3].result.as_ref().unwrap() {
        assert!(e.message.contains("amount_cents"), "{}", e.message);
    }
    let n = db.counts().await;
    assert_eq!(n.ledger(), (3, 3, 10 + 20 + 40, 3));
    app.shutdown().await;
}

async fn every_invalid_field_is_named_and_nothing_is_written(kind: Kind) {
    let db = TestDb::new(kind).await;
    let mut args = serve_args(&db);
    args.max_payload_bytes = 1024;
    let app = TestApp::spawn(args).await;
    let mut c = app.client().await;
    let ok = submission("AWD-1", TS, b"ok", 100);
    type Mutation = fn(&mut pb::Submission);
    let cases: Vec<(Mutation, Code, &str)> = vec![
        (|s| s.award_id.clear(), Code::InvalidArgument, "award_id"),
        (
            |s| s.award_id = "a".repeat(129),
            Code::InvalidArgument,
            "award_id",
        ),
        (|s| s.award_id = "AWD|1".into(), Code::InvalidArgument, "award_id"),
        (
            |s| s.award_id = "AWD\n1".into(),
            Code::InvalidArgument,
            "award_id",
        ),
        (
            |s| s.submission_timestamp.clear(),
            Code::InvalidArgument,
            "submission_timestamp",
        ),
        (
            |s| s.submission_timestamp = "29/11/2026".into(),
            Code::InvalidArgument,
            "submission_timestamp",
        ),
        (
            |s| s.submission_timestamp = "2026-11-29".into(),
            Code::InvalidArgument,
            "submission_timestamp",
        ),
        (|s| s.amount_cents = 0, Code::InvalidArgument, "amount_cents"),
        (|s| s.amount_cents = -1, Code::InvalidArgument, "amount_cents"),
        (
            |s| s.idempotency_key = Some(String::new()),
            Code::InvalidArgument,
            "idempotency_key",
        ),
        (
            |s| s.idempotency_key = Some("k".repeat(129)),
            Code::InvalidArgument,
            "idempotency_key",
        ),
        (
            |s| s.idempotency_key = Some("has space".into()),
            Code::InvalidArgument,
            "idempotency_key",
        ),
        (|s| s.payload = vec![7; 1025], Code::ResourceExhausted, "payload"),
    ];
    for (mutate, code, field) in cases {
        let mut s = ok.clone();
        mutate(&mut s);
        let err = c.submit(s).await.unwrap_err();
        assert_eq!(err.code(), code, "{field}: {err:?}");
        assert!(
            err.message().contains(field),
            "{:?} should name {field}",
            err.message()
        );
    }
    app.shutdown().await;
    assert_eq!(
        db.counts().await,
        Counts::default(),
        "nothing written anywhere, not even audit"
    );
}

async fn reused_producer_key_is_refused_at_every_tier(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    let mut s = submission("AWD-K", TS, b"intent", 1_000);
    s.idempotency_key = Some("5f0c8d3e-intent-0001".into());
    let first = c.submit(s.clone()).await.unwrap().into_inner();
    assert_eq!(first.idempotency_key, "5f0c8d3e-intent-0001");
    let variants: Vec<pb::Submission> = vec![
        pb::Submission {
            amount_cents: 1_001,
            ..s.clone()
        },
        pb::Submission {
            award_id: "AWD-OTHER".into(),
            ..s.clone()
        },
        pb::Submission {
            payload: b"changed".to_vec(),
            ..s.clone()
        },
    ];
    for v in &variants {
        // From L1 (same instance) ...
        let err = c.submit(v.clone()).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition);
        assert_eq!(
            err.message(),
            "idempotency key reused with a different submission"
        );
    }
    // ... and from the database (new instance, empty cache).
    app.shutdown().await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    for v in &variants {
        assert_eq!(
            c.submit(v.clone()).await.unwrap_err().code(),
            Code::FailedPrecondition
        );
    }
    let same = c.submit(s).await.unwrap().into_inner();
    assert_eq!(outcome(&same), Outcome::Duplicate);
    app.shutdown().await;
    let n = db.counts().await;
    assert_eq!(n.ledger(), (1, 1, 1_000, 1));
    assert_eq!(n.audit_rejected, 6, "every refusal is audited");
}

async fn late_redelivery_after_claim_purge_is_not_double_posted(kind: Kind) {
    let db = TestDb::new(kind).await;
    let s = submission("AWD-L", TS, b"very late", 4_200);
    let app = TestApp::spawn(serve_args(&db)).await;
    let first = app.client().await.submit(s.clone()).await.unwrap().into_inner();
    app.shutdown().await;
    // Older than every cache and than the claim retention: the claim is gone.
    db.exec("DELETE FROM processed_messages").await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let late = app.client().await.submit(s).await.unwrap().into_inner();
    assert_eq!(outcome(&late), Outcome::Duplicate);
    assert_eq!(
        late.disbursement, first.disbursement,
        "the ledger row is the stored result"
    );
    let n = db.counts().await;
    assert_eq!((n.disbursements, n.balance_cents, n.outbox), (1, 4_200, 1));
    assert_eq!(n.claims, 1, "the claim is restored from the ledger");
    app.shutdown().await;
}

async fn changed_payload_is_processed_and_flagged(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    let a = c
        .submit(submission("AWD-P", TS, b"v1", 100))
        .await
        .unwrap()
        .into_inner();
    let b = c
        .submit(submission("AWD-P", TS, b"v2", 100))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(a.idempotency_key, b.idempotency_key);
    assert_eq!(
        outcome(&b),
        Outcome::Claimed,
        "a changed payload is a new key and is processed"
    );
    let flagged = db
        .scalar("SELECT count(*) FROM audit_log WHERE payload_changed")
        .await;
    assert_eq!(flagged, 1, "the second one is flagged for the auditor");
    let metrics = app.metrics().await;
    assert!(metrics.contains("oncegate_payload_changed_resubmissions_total"));
    app.shutdown().await;
}

async fn lookup_finds_stored_results_only(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    let d = c
        .submit(submission("AWD-Q", TS, b"q", 77))
        .await
        .unwrap()
        .into_inner();
    let found = c
        .lookup(pb::LookupRequest {
            idempotency_key: d.idempotency_key.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(found.found);
    assert_eq!(found.decision.unwrap().disbursement, d.disbursement);
    let missing = c
        .lookup(pb::LookupRequest {
            idempotency_key: "f".repeat(64),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!missing.found && missing.decision.is_none());
    let bad = c
        .lookup(pb::LookupRequest {
            idempotency_key: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert_eq!(db.counts().await.ledger(), (1, 1, 77, 1), "lookup writes nothing");
    app.shutdown().await;
}

async fn per_award_sequences_are_dense_under_group_commit(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..200u32 {
        let mut c = app.client().await;
        calls.spawn(async move {
            let s = submission(&format!("AWD-{}", i % 5), TS, &i.to_le_bytes(), 1 + i as i64);
            c.submit(s).await.unwrap().into_inner()
        });
    }
    while let Some(r) = calls.join_next().await {
        assert_eq!(outcome(&r.unwrap()), Outcome::Claimed);
    }
    let summary = app.store.ledger_summary().await.unwrap();
    assert_eq!(summary.disbursements, 200);
    assert_eq!(summary.total_cents, (1..=200).sum::<i64>());
    assert_eq!((summary.mismatched_awards, summary.sequence_gaps), (0, 0));
    app.shutdown().await;
}
