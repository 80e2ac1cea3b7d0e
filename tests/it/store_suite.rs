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
    the_consoles_reads_find_keys_pages_and_totals,
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

// ---- the relay's slots (DESIGN §4.2) ------------------------------------

mod slots {
    use crate::helpers::*;
    use crate::relay::outbox_of;
    use oncegate::store::slots::{RelayMember, SlotLease, award_hash, slot_of};
    use std::collections::{BTreeSet, HashMap};
    use std::time::Duration;

    on_both_stores!(
        slots_are_created_once_and_held_with_generations,
        a_relay_that_lost_a_slot_reads_and_writes_nothing_for_it,
        a_slot_reads_in_award_order_and_holds_an_award_back_behind_its_retry,
        every_event_is_in_its_awards_slot_by_the_documented_hash,
        a_resize_fences_every_holder_and_keeps_each_award_in_one_slot,
        heartbeats_list_the_live_relays,
    );

    const LONG: Duration = Duration::from_secs(60);

    fn member<'a>(id: &'a str) -> RelayMember<'a> {
        RelayMember {
            id,
            instance: "it",
            sink: "redis",
        }
    }

    async fn slots_are_created_once_and_held_with_generations(kind: Kind) {
        let db = TestDb::new(kind).await;
        let store = db.open().await;
        assert_eq!(store.relay_slots_init(4).await.unwrap(), 4);
        assert_eq!(
            store.relay_slots_init(6).await.unwrap(),
            4,
            "the count in force stays"
        );
        let held = store.take_slots("m1", 10, LONG).await.unwrap();
        assert_eq!(held.iter().map(|l| l.slot).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert!(held.iter().all(|l| l.slots == 4 && l.generation == 1), "{held:?}");
        assert!(
            store.take_slots("m2", 10, LONG).await.unwrap().is_empty(),
            "all held"
        );
        assert_eq!(store.renew_slots("m1", &held, LONG).await.unwrap().len(), 4);
        store.release_slot("m1", &held[2]).await.unwrap();
        let taken = store.take_slots("m2", 10, LONG).await.unwrap();
        assert_eq!(
            taken,
            [SlotLease {
                slot: 2,
                slots: 4,
                generation: 2
            }],
            "a new owner, a new generation"
        );
        let renewed = store.renew_slots("m1", &held, LONG).await.unwrap();
        assert_eq!(
            renewed.iter().map(|l| l.slot).collect::<Vec<_>>(),
            [0, 1, 3],
            "slot 2 is m2's"
        );
        let table = store.relay_slot_table().await.unwrap();
        assert_eq!(table.slots.len(), 4);
        assert_eq!(table.slots[2].owner.as_deref(), Some("m2"));
        assert!(table.slots.iter().all(|s| s.lease_left.is_some()));
    }

    async fn a_relay_that_lost_a_slot_reads_and_writes_nothing_for_it(kind: Kind) {
        let db = TestDb::new(kind).await;
        outbox_of(&db, &["AWD-L1", "AWD-L2", "AWD-L3"], 2).await;
        let store = db.open().await;
        store.relay_slots_init(1).await.unwrap();
        let old = store
            .take_slots("m1", 1, Duration::from_millis(200))
            .await
            .unwrap()[0];
        let events = store.slot_pending(&old, 100).await.unwrap();
        assert_eq!(events.len(), 6);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(
            store.slot_pending(&old, 100).await.unwrap().is_empty(),
            "the lease ran out: nothing to read"
        );
        let new = store.take_slots("m2", 1, LONG).await.unwrap()[0];
        assert_eq!(new.generation, old.generation + 1);
        let ids: Vec<uuid::Uuid> = events.iter().map(|e| e.event_id).collect();
        assert!(
            !store.mark_published(&old, &ids).await.unwrap(),
            "the old generation is refused"
        );
        let failure = store
            .record_publish_failure(&old, ids[0], "refused", 1, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(failure, None, "no attempt recorded for a slot that is not held");
        let untouched = "SELECT count(*) FROM outbox WHERE published_at IS NULL AND attempts = 0 AND quarantined_at IS NULL";
        assert_eq!(db.scalar(untouched).await, 6, "nothing changed");
        assert_eq!(store.renew_slots("m1", &[old], LONG).await.unwrap(), []);
        assert!(store.mark_published(&new, &ids[..2]).await.unwrap());
        assert_eq!(db.scalar(untouched).await, 4);
    }

    async fn a_slot_reads_in_award_order_and_holds_an_award_back_behind_its_retry(kind: Kind) {
        let db = TestDb::new(kind).await;
        outbox_of(&db, &["AWD-O1", "AWD-O2"], 3).await;
        let store = db.open().await;
        store.relay_slots_init(1).await.unwrap();
        let lease = store.take_slots("m1", 1, LONG).await.unwrap()[0];
        let events = store.slot_pending(&lease, 100).await.unwrap();
        let mut last: HashMap<&str, i64> = HashMap::new();
        for e in &events {
            let before = last.insert(&e.award_id, e.sequence).unwrap_or(0);
            assert_eq!(e.sequence, before + 1, "{} in sequence order", e.award_id);
        }
        let first = events.iter().find(|e| e.award_id == "AWD-O1").unwrap();
        let quarantined = store
            .record_publish_failure(&lease, first.event_id, "refused", 5, Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(quarantined, Some(false));
        let now: Vec<(String, i64)> = store
            .slot_pending(&lease, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.award_id, e.sequence))
            .collect();
        let others: Vec<(String, i64)> = (1..=3).map(|s| ("AWD-O2".to_string(), s)).collect();
        assert_eq!(
            now, others,
            "AWD-O1 waits behind its event's retry, AWD-O2 goes on"
        );
    }

    async fn every_event_is_in_its_awards_slot_by_the_documented_hash(kind: Kind) {
        let db = TestDb::new(kind).await;
        let awards: Vec<String> = (0..24).map(|i| format!("AWD-H{i}-é")).collect();
        let names: Vec<&str> = awards.iter().map(String::as_str).collect();
        outbox_of(&db, &names, 1).await;
        let store = db.open().await;
        store.relay_slots_init(5).await.unwrap();
        let leases = store.take_slots("m1", 5, LONG).await.unwrap();
        let mut seen = BTreeSet::new();
        for lease in &leases {
            for e in store.slot_pending(lease, 100).await.unwrap() {
                assert_eq!(
                    slot_of(&e.award_id, 5),
                    lease.slot,
                    "{} in slot {}",
                    e.award_id,
                    lease.slot
                );
                seen.insert(e.award_id);
            }
        }
        assert_eq!(seen.len(), 24, "every event in exactly one slot");
        let stored = db
            .scalar("SELECT count(*) FROM outbox WHERE award_hash IS NULL")
            .await;
        assert_eq!(stored, 0, "every event carries its hash");
        if kind == Kind::Postgres {
            // The database computes the same hash (rows older writers left without one).
            for award in &names {
                let sql = format!("SELECT oncegate_award_hash('{award}')");
                assert_eq!(db.scalar(&sql).await, award_hash(award), "{award}");
            }
        }
    }

    async fn a_resize_fences_every_holder_and_keeps_each_award_in_one_slot(kind: Kind) {
        let db = TestDb::new(kind).await;
        let awards: Vec<String> = (0..12).map(|i| format!("AWD-Z{i}")).collect();
        let names: Vec<&str> = awards.iter().map(String::as_str).collect();
        outbox_of(&db, &names, 2).await;
        let store = db.open().await;
        store.relay_slots_init(4).await.unwrap();
        let held = store.take_slots("m1", 4, LONG).await.unwrap();
        let seized = store.seize_slots("resize", LONG).await.unwrap();
        assert_eq!(seized.len(), 4);
        assert_eq!(
            store.renew_slots("m1", &held, LONG).await.unwrap(),
            [],
            "every holder fenced"
        );
        assert!(
            !store
                .mark_published(&held[0], &[uuid::Uuid::now_v7()])
                .await
                .unwrap()
        );
        assert!(store.finish_resize("resize", &seized, 6).await.unwrap());
        let grown = store.take_slots("m1", 10, LONG).await.unwrap();
        assert_eq!(
            grown.iter().map(|l| l.slot).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4, 5]
        );
        assert!(grown.iter().all(|l| l.slots == 6));
        let mut per_award: HashMap<String, BTreeSet<i32>> = HashMap::new();
        for lease in &grown {
            for e in store.slot_pending(lease, 100).await.unwrap() {
                per_award.entry(e.award_id).or_default().insert(lease.slot);
            }
        }
        assert_eq!(per_award.len(), 12);
        assert!(
            per_award.values().all(|s| s.len() == 1),
            "an award in one slot: {per_award:?}"
        );
        // A resize whose seized slot was taken meanwhile changes nothing.
        let seized = store
            .seize_slots("resize", Duration::from_millis(100))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        store.take_slots("m2", 1, LONG).await.unwrap();
        assert!(!store.finish_resize("resize", &seized, 3).await.unwrap());
        assert_eq!(store.relay_slot_table().await.unwrap().slots.len(), 6);
        // Shrinking: the slots past the count go out of use.
        let seized = store.seize_slots("resize", LONG).await.unwrap();
        assert!(store.finish_resize("resize", &seized, 3).await.unwrap());
        let shrunk = store.take_slots("m3", 10, LONG).await.unwrap();
        assert_eq!(
            shrunk.iter().map(|l| (l.slot, l.slots)).collect::<Vec<_>>(),
            [(0, 3), (1, 3), (2, 3)]
        );
    }

    /// Postgres keeps the events waiting for the relay in `outbox_queue`
    /// (migration 0016). An older sidecar's relay, still running during the
    /// rolling upgrade, marks an event on the outbox only: the new read
    /// skips it, the backlog it reports is the queue, and retention's run
    /// clears the queue row it left.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_event_an_older_relay_marked_is_not_read_again_and_its_queue_row_goes() {
        let db = TestDb::new(Kind::Postgres).await;
        outbox_of(&db, &["AWD-U1"], 3).await;
        let store = db.open().await;
        assert_eq!(
            db.scalar("SELECT count(*) FROM outbox_queue").await,
            3,
            "queued as written"
        );
        store.relay_slots_init(1).await.unwrap();
        let lease = store.take_slots("m1", 1, LONG).await.unwrap()[0];
        db.exec("UPDATE outbox SET published_at = now() WHERE sequence = 1")
            .await;
        let pending = store.slot_pending(&lease, 100).await.unwrap();
        let sequences: Vec<i64> = pending.iter().map(|e| e.sequence).collect();
        assert_eq!(sequences, [2, 3], "the event the older relay marked is not read");
        assert!(
            store
                .mark_published(&lease, &[pending[0].event_id])
                .await
                .unwrap()
        );
        assert_eq!(
            db.scalar("SELECT count(*) FROM outbox_queue").await,
            2,
            "a mark takes its row out"
        );
        let policy = oncegate::store::RetentionPolicy {
            retention: Duration::from_secs(3 * 365 * 86_400),
            outbox_retention: Duration::from_secs(3 * 365 * 86_400),
            batch_size: 100,
        };
        assert!(store.purge(&policy).await.unwrap().ran);
        assert_eq!(
            db.scalar("SELECT count(*) FROM outbox_queue").await,
            1,
            "only the unpublished event is left"
        );
        assert_eq!(store.outbox_stats().await.unwrap().backlog, 1);
    }

    async fn heartbeats_list_the_live_relays(kind: Kind) {
        let db = TestDb::new(kind).await;
        let store = db.open().await;
        store.relay_slots_init(3).await.unwrap();
        store
            .relay_heartbeat(&member("m-b"), Duration::from_millis(200))
            .await
            .unwrap();
        let view = store.relay_heartbeat(&member("m-a"), LONG).await.unwrap();
        assert_eq!(
            (view.members, view.slots),
            (vec!["m-a".to_string(), "m-b".to_string()], 3)
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        let view = store.relay_heartbeat(&member("m-a"), LONG).await.unwrap();
        assert_eq!(
            view.members,
            ["m-a"],
            "a relay that stopped renewing is forgotten"
        );
        store.relay_leave("m-a").await.unwrap();
        assert!(store.relay_slot_table().await.unwrap().members.is_empty());
    }
}

/// The console's reads (docs/CONSOLE.md) on both stores: keys by the
/// prefix the logs print, a disbursement's key, an award's ledger a page at
/// a time, its totals and reconcile's award checks.
async fn the_consoles_reads_find_keys_pages_and_totals(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    let mut c = app.client().await;
    for i in 0..3 {
        let ts = format!("2026-11-29T10:00:0{i}Z");
        c.submit(submission("AWD-C", &ts, b"x", 100 + i)).await.unwrap();
    }
    c.submit(submission("AWD-D", TS, b"y", 7)).await.unwrap();
    let store = app.store.clone();
    let first = store.award_ledger("AWD-C", 0, 2).await.unwrap();
    assert_eq!(first.iter().map(|d| d.sequence).collect::<Vec<_>>(), [1, 2]);
    let rest = store.award_ledger("AWD-C", 2, 2).await.unwrap();
    assert_eq!(
        rest.iter()
            .map(|d| (d.sequence, d.amount_cents))
            .collect::<Vec<_>>(),
        [(3, 102)]
    );
    let key = &first[0].idempotency_key;
    let found = store.find_keys(&key[..12], 5).await.unwrap();
    assert_eq!(
        &found,
        std::slice::from_ref(key),
        "the logged prefix finds the key"
    );
    assert!(
        store.find_keys("%", 5).await.unwrap().is_empty(),
        "a wildcard is a character"
    );
    assert!(store.find_keys("no-such-prefix", 5).await.unwrap().is_empty());
    assert_eq!(
        store.disbursement_key(first[0].id).await.unwrap().as_ref(),
        Some(key)
    );
    assert_eq!(store.disbursement_key(uuid::Uuid::nil()).await.unwrap(), None);
    let totals = store.award_totals("AWD-C").await.unwrap();
    assert_eq!(
        totals.balance.map(|b| (b.total_cents, b.disbursement_count)),
        Some((303, 3))
    );
    assert_eq!(totals.ledger.map(|l| l.rows), Some(3));
    let missing = store.award_totals("AWD-NONE").await.unwrap();
    assert!(missing.balance.is_none() && missing.ledger.is_none());
    assert!(
        oncegate::reconcile::check_award(&*store, "AWD-C")
            .await
            .unwrap()
            .is_empty()
    );
    app.shutdown().await;
}
