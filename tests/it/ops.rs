//! The operator's commands (DESIGN §10) on both stores: reconcile is clean
//! after a normal run and after concurrent submitters with redeliveries;
//! each kind of mismatch, planted behind the guards' back (as superuser with
//! `session_replication_role = replica` on Postgres, the triggers dropped in
//! the planting connection on SQLite) or in the broker, is reported exactly,
//! with its key, and the command exits non-zero; `inspect` tells a key's
//! whole story; quarantined events are redriven in per-award order and the
//! redrive is audited; `serve` exports the result as gauges.

use crate::helpers::*;
use crate::relay::{TestStream, delete_key, drain, redis_sink, relay_settings, xrange};
use fred::prelude::*;
use oncegate::broker::{SinkSettings, SinkSpec};
use oncegate::pb;
use oncegate::reconcile::{Check, ReconcileSettings, Reconciler, Report};
use oncegate::relay::Relay;
use oncegate::store::{ClaimBatch, ClaimContext, Store, StoredResult};
use oncegate::submission::Submission;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

on_both_stores!(
    reconcile_is_clean_after_a_normal_run,
    reconcile_is_clean_after_concurrent_submitters_and_redeliveries,
    a_missing_ledger_row_is_reported_with_its_key,
    a_total_off_by_one_cent_is_reported_with_its_award,
    a_sequence_gap_is_reported_with_its_key,
    a_changed_amount_is_reported_with_its_key,
    a_missing_event_is_reported_with_its_key,
    an_extra_event_is_reported_with_its_key,
    the_redis_stream_must_hold_every_published_event_and_nothing_else,
    the_jetstream_stream_must_hold_every_published_event_and_nothing_else,
    inspect_shows_claim_ledger_row_event_and_the_four_audit_rows_in_order,
    quarantined_events_are_redriven_in_award_order_and_audited,
    serve_exports_the_reconciliation_gauges,
    the_operations_migration_keeps_the_audit_trail_and_its_guards,
    the_effect_answered_migration_keeps_the_audit_trail_and_its_guards,
);

const TS: &str = "2026-12-01T09:00:00Z";

/// Small batches, so that every range boundary is crossed.
fn settings(broker: Option<SinkSettings>) -> ReconcileSettings {
    ReconcileSettings {
        batch: 3,
        retention: Duration::from_secs(3 * 365 * 86_400),
        outbox_retention: Duration::from_secs(7 * 86_400),
        examples: 50,
        broker,
    }
}

fn redis_broker(stream: &str) -> SinkSettings {
    SinkSettings::new(SinkSpec::parse(&redis_url()).unwrap(), stream, "it-reconcile")
}

async fn reconcile(db: &TestDb, broker: Option<SinkSettings>) -> Report {
    Reconciler::new(db.open().await, settings(broker))
        .run()
        .await
        .expect("reconcile runs")
}

/// What a report found: (check, kind, key, award) of every mismatch.
type Found = BTreeSet<(Check, &'static str, Option<String>, Option<String>)>;

fn found(report: &Report) -> Found {
    report
        .checks
        .iter()
        .flat_map(|c| {
            assert_eq!(c.mismatches, c.examples.len() as u64, "all kept: {report}");
            c.examples
                .iter()
                .map(|m| (c.check, m.kind, m.idempotency_key.clone(), m.award_id.clone()))
        })
        .collect()
}

fn one(check: Check, kind: &'static str, key: Option<&str>, award: &str) -> Found {
    BTreeSet::from([(check, kind, key.map(str::to_string), Some(award.to_string()))])
}

/// The real binary against the test's store: (exit code, stdout).
async fn oncegate(db: &TestDb, args: &[&str]) -> (i32, String) {
    oncegate_at(&db.url, args).await
}

/// The real binary against the store at `url`.
async fn oncegate_at(url: &str, args: &[&str]) -> (i32, String) {
    let run = run_oncegate(args, &[("DATABASE_URL", url)]).await;
    let code = run.code.unwrap_or(-1);
    assert!(
        code != 64,
        "oncegate {args:?} refused its settings: {}",
        run.stderr
    );
    (code, run.stdout)
}

/// Claims `per_award` submissions for each award, straight through the
/// store (no server: the tests below are about what the store holds).
async fn ledger_of(db: &TestDb, awards: &[&str], per_award: usize) -> Vec<StoredResult> {
    ledger_in(&*db.open().await, awards, per_award).await
}

async fn ledger_in(store: &dyn Store, awards: &[&str], per_award: usize) -> Vec<StoredResult> {
    let items: Vec<Submission> = (0..per_award)
        .flat_map(|i| awards.iter().map(move |a| (a, i)))
        .map(|(a, i)| {
            let raw = submission(a, TS, format!("{a}-{i}").as_bytes(), 100 + i as i64);
            Submission::validate(&raw, Default::default()).unwrap()
        })
        .collect();
    let ctx = ClaimContext {
        instance: "it-ops".into(),
    };
    let outcomes = store
        .claim_batch(&ClaimBatch::new(&items), &ctx)
        .await
        .expect("claims");
    outcomes.into_iter().map(|o| o.stored().clone()).collect()
}

/// The row of `award` with `sequence`.
fn row(rows: &[StoredResult], award: &str, sequence: i64) -> StoredResult {
    rows.iter()
        .find(|r| r.disbursement.award_id == award && r.disbursement.sequence == sequence)
        .cloned()
        .expect("the row exists")
}

/// Runs `sql` behind the append-only guards' back (test-only: a superuser
/// session on Postgres, the ledger's triggers dropped and restored around it
/// in one connection on SQLite).
async fn plant(db: &TestDb, sql: &str) {
    match db.kind {
        Kind::Postgres => {
            db.exec(&format!("SET session_replication_role = replica; {sql}"))
                .await
        }
        Kind::Sqlite => {
            let restore = "CREATE TRIGGER disbursements_no_update BEFORE UPDATE ON disbursements \
                 BEGIN SELECT RAISE(ABORT, 'disbursements is append-only: UPDATE is not allowed'); END; \
                 CREATE TRIGGER disbursements_no_delete BEFORE DELETE ON disbursements \
                 BEGIN SELECT RAISE(ABORT, 'disbursements is append-only: DELETE is not allowed'); END;";
            db.exec(&format!(
                "DROP TRIGGER disbursements_no_update; DROP TRIGGER disbursements_no_delete; {sql}; {restore}"
            ))
            .await
        }
    }
}

/// `payload` with one field set to a JSON value, in the store's dialect.
fn json_set(kind: Kind, field: &str, value: &str) -> String {
    match kind {
        Kind::Postgres => format!("jsonb_set(payload, '{{{field}}}', '{value}')"),
        Kind::Sqlite => format!("json_set(payload, '$.{field}', json('{value}'))"),
    }
}

/// Asserts the report holds exactly `expected`, and the binary says so too:
/// exit 1 and every key or award named.
async fn assert_reported(db: &TestDb, expected: Found) {
    let report = reconcile(db, None).await;
    assert_eq!(found(&report), expected, "{report}");
    assert!(!report.clean);
    let (code, out) = oncegate(db, &["reconcile"]).await;
    assert_eq!(code, 1, "exit 1 on a mismatch: {out}");
    for (_, kind, key, award) in &expected {
        assert!(out.contains(&format!("MISMATCH {kind}")), "{out}");
        if let Some(k) = key {
            assert!(out.contains(&format!("key={k}")), "names the key: {out}");
        }
        assert!(
            out.contains(&format!("award={}", award.as_deref().unwrap())),
            "{out}"
        );
    }
}

async fn reconcile_is_clean_after_a_normal_run(kind: Kind) {
    let db = TestDb::new(kind).await;
    let stream = unique("og-it-recon-");
    let mut args = serve_args(&db);
    args.relay.broker.relay_sink = SinkSpec::parse(&redis_url()).unwrap();
    args.relay.broker.stream.relay_stream = stream.clone();
    args.relay.relay_poll = Duration::from_millis(100);
    let app = TestApp::spawn(args).await;
    let mut c = app.client().await;
    for i in 0..12 {
        let s = submission(
            &format!("AWD-N{}", i % 3),
            TS,
            format!("n-{i}").as_bytes(),
            1000 + i,
        );
        c.submit(s.clone()).await.unwrap();
        c.submit(s).await.unwrap();
    }
    let s = stream.clone();
    assert!(
        eventually(Duration::from_secs(15), || {
            let s = s.clone();
            async move { xrange(&s).await.len() >= 12 }
        })
        .await
    );
    app.shutdown().await;

    let report = reconcile(&db, Some(redis_broker(&stream))).await;
    assert!(report.clean, "{report}");
    let checked = |c| report.check(c).checked;
    assert_eq!(
        [
            Check::Claims,
            Check::Totals,
            Check::Sequences,
            Check::Outbox,
            Check::Broker
        ]
        .map(checked),
        [12, 3, 3, 12, 12],
        "{report}"
    );
    assert_eq!(report.check(Check::Broker).notes["published_events_checked"], 12);
    assert_eq!(
        report.check(Check::Outbox).notes["ledger_rows_with_their_event"],
        12
    );
    let broker = ["--sink", &redis_url(), "--stream", &stream];
    let (code, out) = oncegate(&db, &[&["reconcile"][..], &broker].concat()).await;
    assert_eq!((code, out.lines().last()), (0, Some("clean")), "{out}");
    let (code, json) = oncegate(&db, &[&["reconcile", "--json"][..], &broker].concat()).await;
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        (code, &json["clean"], &json["mismatches"]),
        (0, &true.into(), &0.into())
    );
    delete_key(&stream).await;
}

/// Submissions shared by the submitters: redeliveries pick from here.
#[derive(Default)]
struct Delivered {
    subs: Vec<pb::Submission>,
    keys: HashSet<String>,
}

/// One consumer: fresh submissions and redeliveries of anyone's earlier
/// ones, to either instance, some as a batch with a repeat.
async fn submitter(apps: Arc<Vec<String>>, delivered: Arc<Mutex<Delivered>>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut clients = Vec::new();
    for addr in apps.iter() {
        clients.push(pb::gate_client::GateClient::connect(addr.clone()).await.unwrap());
    }
    for n in 0..25 {
        let again = rng.random_bool(0.4);
        let s = {
            let d = delivered.lock().unwrap();
            match again && !d.subs.is_empty() {
                true => d.subs[rng.random_range(0..d.subs.len())].clone(),
                false => submission(
                    &format!("AWD-C{}", rng.random_range(0..4)),
                    TS,
                    format!("c-{seed}-{n}").as_bytes(),
                    rng.random_range(1..50_000),
                ),
            }
        };
        let pick = rng.random_range(0..clients.len());
        let c = &mut clients[pick];
        let decided = if rng.random_bool(0.2) {
            let batch = vec![s.clone(), s.clone()];
            let r = c
                .submit_batch(pb::SubmitBatchRequest { submissions: batch })
                .await;
            r.unwrap().into_inner().results.len() == 2
        } else {
            c.submit(s.clone()).await.is_ok()
        };
        assert!(decided, "every delivery is decided");
        let mut d = delivered.lock().unwrap();
        if d.keys
            .insert(oncegate::key::derive_key(&s.award_id, TS, &s.payload))
        {
            d.subs.push(s);
        }
    }
}

async fn reconcile_is_clean_after_concurrent_submitters_and_redeliveries(kind: Kind) {
    let db = TestDb::new(kind).await;
    let (stream, prefix) = (unique("og-it-chaos-"), unique("t:"));
    let mut apps = Vec::new();
    for _ in 0..2 {
        let mut args = with_redis(serve_args(&db), &redis_url(), &prefix);
        args.relay.broker.relay_sink = SinkSpec::parse(&redis_url()).unwrap();
        args.relay.broker.stream.relay_stream = stream.clone();
        args.relay.relay_poll = Duration::from_millis(100);
        apps.push(TestApp::spawn(args).await);
    }
    let addrs = Arc::new(
        apps.iter()
            .map(|a| format!("http://{}", a.addr))
            .collect::<Vec<_>>(),
    );
    let delivered = Arc::new(Mutex::new(Delivered::default()));
    let seed = test_seed();
    let tasks: Vec<_> = (0..6)
        .map(|i| tokio::spawn(submitter(addrs.clone(), delivered.clone(), seed.wrapping_add(i))))
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let unique_keys = delivered.lock().unwrap().keys.len() as i64;
    let store = db.open().await;
    let drained = eventually(Duration::from_secs(30), || {
        let store = store.clone();
        async move { store.outbox_stats().await.unwrap().backlog == 0 }
    })
    .await;
    assert!(drained, "both relays published everything");
    for app in apps {
        app.shutdown().await;
    }
    assert_eq!(db.counts().await.disbursements, unique_keys);
    let report = reconcile(&db, Some(redis_broker(&stream))).await;
    assert!(report.clean, "{report}");
    assert_eq!(report.check(Check::Claims).checked, unique_keys as u64);
    assert!(report.check(Check::Broker).checked >= unique_keys as u64);
    delete_key(&stream).await;
}

async fn a_missing_ledger_row_is_reported_with_its_key(kind: Kind) {
    let db = TestDb::new(kind).await;
    let rows = ledger_of(&db, &["AWD-M1", "AWD-M2"], 3).await;
    assert!(reconcile(&db, None).await.clean);
    let gone = row(&rows, "AWD-M1", 3);
    plant(
        &db,
        &format!("DELETE FROM disbursements WHERE idempotency_key = '{}'", gone.key),
    )
    .await;
    let key = Some(gone.key.clone());
    let award = Some("AWD-M1".to_string());
    let expected = BTreeSet::from([
        (
            Check::Claims,
            "claim_without_ledger_row",
            key.clone(),
            award.clone(),
        ),
        (Check::Totals, "total_differs", None, award.clone()),
        (Check::Outbox, "event_without_ledger_row", key, award),
    ]);
    assert_reported(&db, expected).await;
}

async fn a_total_off_by_one_cent_is_reported_with_its_award(kind: Kind) {
    let db = TestDb::new(kind).await;
    ledger_of(&db, &["AWD-T1", "AWD-T2"], 3).await;
    plant(
        &db,
        "UPDATE award_balances SET total_cents = total_cents + 1 WHERE award_id = 'AWD-T2'",
    )
    .await;
    assert_reported(&db, one(Check::Totals, "total_differs", None, "AWD-T2")).await;
    let report = reconcile(&db, None).await;
    let detail = &report.check(Check::Totals).examples[0].detail;
    assert!(detail.contains("(+1 cents, +0 rows)"), "{detail}");
}

/// The award's last row renumbered from 3 to 4 (its event too, and the
/// running total's counter): the ledger skips sequence 3.
async fn a_sequence_gap_is_reported_with_its_key(kind: Kind) {
    let db = TestDb::new(kind).await;
    let rows = ledger_of(&db, &["AWD-G1", "AWD-G2"], 3).await;
    let last = row(&rows, "AWD-G1", 3);
    plant(
        &db,
        &format!(
            "UPDATE disbursements SET sequence = 4 WHERE idempotency_key = '{}'; \
             UPDATE outbox SET sequence = 4, payload = {} WHERE award_id = 'AWD-G1' AND sequence = 3; \
             UPDATE award_balances SET last_sequence = 4 WHERE award_id = 'AWD-G1';",
            last.key,
            json_set(kind, "sequence", "4")
        ),
    )
    .await;
    let expected = one(Check::Sequences, "sequence_gap", Some(&last.key), "AWD-G1");
    assert_reported(&db, expected).await;
    let detail = reconcile(&db, None).await.check(Check::Sequences).examples[0]
        .detail
        .clone();
    assert!(detail.starts_with("sequence 3 is missing"), "{detail}");
}

/// One cent more on a ledger row, its event and its running total: only the
/// claim's fingerprint still tells the amount that was claimed.
async fn a_changed_amount_is_reported_with_its_key(kind: Kind) {
    let db = TestDb::new(kind).await;
    let rows = ledger_of(&db, &["AWD-A1"], 3).await;
    let changed = row(&rows, "AWD-A1", 2);
    let amount = changed.disbursement.amount_cents + 1;
    plant(
        &db,
        &format!(
            "UPDATE disbursements SET amount_cents = {amount} WHERE idempotency_key = '{}'; \
             UPDATE outbox SET payload = {} WHERE award_id = 'AWD-A1' AND sequence = 2; \
             UPDATE award_balances SET total_cents = total_cents + 1 WHERE award_id = 'AWD-A1';",
            changed.key,
            json_set(kind, "amount_cents", &amount.to_string())
        ),
    )
    .await;
    assert_reported(
        &db,
        one(Check::Claims, "amount_differs", Some(&changed.key), "AWD-A1"),
    )
    .await;
}

async fn a_missing_event_is_reported_with_its_key(kind: Kind) {
    let db = TestDb::new(kind).await;
    let rows = ledger_of(&db, &["AWD-E1", "AWD-E2"], 3).await;
    db.exec("DELETE FROM outbox WHERE award_id = 'AWD-E2' AND sequence = 2")
        .await;
    let key = row(&rows, "AWD-E2", 2).key;
    assert_reported(&db, one(Check::Outbox, "missing_event", Some(&key), "AWD-E2")).await;
}

async fn an_extra_event_is_reported_with_its_key(kind: Kind) {
    let db = TestDb::new(kind).await;
    ledger_of(&db, &["AWD-X1"], 2).await;
    let id = uuid::Uuid::now_v7();
    let body = format!(
        r#"{{"event_id":"{id}","type":"disbursement.recorded","award_id":"AWD-X1","sequence":9,
            "amount_cents":500,"idempotency_key":"planted-key","disbursement_id":"{id}",
            "recorded_at":"2026-12-01T09:00:00.000000Z"}}"#
    );
    let created = match kind {
        Kind::Postgres => "now()".to_string(),
        Kind::Sqlite => oncegate::time_fmt::to_micros(time::OffsetDateTime::now_utc()).to_string(),
    };
    db.exec(&format!(
        "INSERT INTO outbox (event_id, event_type, award_id, sequence, payload, created_at) \
         VALUES ('{id}', 'disbursement.recorded', 'AWD-X1', 9, '{body}', {created})"
    ))
    .await;
    let expected = one(
        Check::Outbox,
        "event_without_ledger_row",
        Some("planted-key"),
        "AWD-X1",
    );
    assert_reported(&db, expected).await;
}

/// A fake event for a key the ledger does not have.
fn stray_body(id: uuid::Uuid) -> String {
    serde_json::json!({"event_id": id, "type": "disbursement.recorded", "award_id": "AWD-B1",
        "sequence": 9, "amount_cents": 1, "idempotency_key": "not-in-the-ledger",
        "disbursement_id": id, "recorded_at": "2026-12-01T09:00:00.000000Z"})
    .to_string()
}

async fn the_redis_stream_must_hold_every_published_event_and_nothing_else(kind: Kind) {
    let db = TestDb::new(kind).await;
    let rows = ledger_of(&db, &["AWD-B1", "AWD-B2"], 3).await;
    let stream = unique("og-it-broker-");
    let relay = Relay::new(
        db.open().await,
        redis_sink(&stream).await,
        relay_settings("it", 10, Duration::from_secs(30), 3),
    );
    assert_eq!(drain(&relay).await, 6);
    let report = reconcile(&db, Some(redis_broker(&stream))).await;
    assert!(report.clean, "{report}");
    assert_eq!(report.check(Check::Broker).checked, 6);

    // An entry deleted from the stream, and one planted that the ledger does not know.
    let r = redis_client(&redis_url()).await;
    let entries: Vec<(String, std::collections::HashMap<String, String>)> =
        r.xrange(&stream, "-", "+", None).await.unwrap();
    let lost = row(&rows, "AWD-B2", 2);
    let (entry, _) = entries
        .iter()
        .find(|(_, f)| f["award_id"] == "AWD-B2" && f["sequence"] == "2")
        .unwrap();
    let _: i64 = r.xdel(&stream, entry.as_str()).await.unwrap();
    let stray = uuid::Uuid::now_v7();
    let fields = vec![
        ("event_id", stray.to_string()),
        ("type", "disbursement.recorded".into()),
        ("award_id", "AWD-B1".into()),
        ("sequence", "9".into()),
        ("data", stray_body(stray)),
    ];
    let _: String = r.xadd(&stream, false, None::<()>, "*", fields).await.unwrap();
    let report = reconcile(&db, Some(redis_broker(&stream))).await;
    // The gap is also the award out of sequence where it shows: its next entry.
    let next = row(&rows, "AWD-B2", 3);
    let expected = BTreeSet::from([
        (
            Check::Broker,
            "missing_from_broker",
            Some(lost.key.clone()),
            Some("AWD-B2".into()),
        ),
        (
            Check::Broker,
            "award_out_of_sequence",
            Some(next.key.clone()),
            Some("AWD-B2".into()),
        ),
        (
            Check::Broker,
            "entry_without_ledger_row",
            Some("not-in-the-ledger".into()),
            Some("AWD-B1".into()),
        ),
    ]);
    assert_eq!(found(&report), expected, "{report}");
    let (code, out) = oncegate(&db, &["reconcile", "--sink", &redis_url(), "--stream", &stream]).await;
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!("MISMATCH missing_from_broker key={}", lost.key)),
        "{out}"
    );
    let _ = r.quit().await;
    delete_key(&stream).await;
}

async fn the_jetstream_stream_must_hold_every_published_event_and_nothing_else(kind: Kind) {
    let db = TestDb::new(kind).await;
    let rows = ledger_of(&db, &["AWD-B1", "AWD-B2"], 3).await;
    let js = TestStream::new().await;
    let relay = Relay::new(
        db.open().await,
        js.sink().await,
        relay_settings("it", 10, Duration::from_secs(30), 3),
    );
    assert_eq!(drain(&relay).await, 6);
    let mut broker = SinkSettings::new(SinkSpec::parse(&nats_url()).unwrap(), &js.name, "it-reconcile");
    broker
        .options
        .set(&oncegate::broker::nats::SUBJECT, js.subject.clone());
    let report = reconcile(&db, Some(broker.clone())).await;
    assert!(report.clean, "{report}");
    assert_eq!(report.check(Check::Broker).checked, 6);

    let lost = row(&rows, "AWD-B2", 2);
    let stream = js.js.get_stream(&js.name).await.unwrap();
    let mut lost_seq = None;
    for seq in 1..=6 {
        let m = stream.get_raw_message(seq).await.unwrap();
        if String::from_utf8_lossy(&m.payload).contains(&lost.key) {
            lost_seq = Some(seq);
        }
    }
    assert!(stream.delete_message(lost_seq.unwrap()).await.unwrap());
    let stray = uuid::Uuid::now_v7();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-Msg-Id", stray.to_string().as_str());
    let ack = js
        .js
        .publish_with_headers(js.subject.clone(), headers, stray_body(stray).into())
        .await
        .unwrap();
    ack.await.unwrap();
    let report = reconcile(&db, Some(broker)).await;
    // The gap is also the award out of sequence where it shows: its next entry.
    let next = row(&rows, "AWD-B2", 3);
    let expected = BTreeSet::from([
        (
            Check::Broker,
            "missing_from_broker",
            Some(lost.key.clone()),
            Some("AWD-B2".into()),
        ),
        (
            Check::Broker,
            "award_out_of_sequence",
            Some(next.key.clone()),
            Some("AWD-B2".into()),
        ),
        (
            Check::Broker,
            "entry_without_ledger_row",
            Some("not-in-the-ledger".into()),
            Some("AWD-B1".into()),
        ),
    ]);
    assert_eq!(found(&report), expected, "{report}");
    let (code, out) = oncegate(&db, &["reconcile", "--sink", &nats_url(), "--stream", &js.name]).await;
    assert_eq!(code, 1, "{out}");
    js.delete().await;
}

/// CLAIMED on A, then DUPLICATE from A's L1, from Redis on B (which shares
/// A's Redis but not its L1), and from the store on C (no Redis at all).
async fn inspect_shows_claim_ledger_row_event_and_the_four_audit_rows_in_order(kind: Kind) {
    let db = TestDb::new(kind).await;
    let prefix = unique("t:");
    let a = TestApp::spawn(with_redis(serve_args(&db), &redis_url(), &prefix)).await;
    let b = TestApp::spawn(with_redis(serve_args(&db), &redis_url(), &prefix)).await;
    let c = TestApp::spawn(serve_args(&db)).await;
    let s = submission("AWD-I1", TS, b"inspect me", 4200);
    let mut tiers = Vec::new();
    for app in [&a, &a, &b, &c] {
        let d = app.client().await.submit(s.clone()).await.unwrap().into_inner();
        tiers.push((outcome(&d), tier(&d)));
    }
    use pb::{Outcome::*, Tier::*};
    assert_eq!(
        tiers,
        [
            (Claimed, Database),
            (Duplicate, LocalCache),
            (Duplicate, Redis),
            (Duplicate, Database)
        ]
    );
    for app in [a, b, c] {
        app.shutdown().await;
    }
    let key = oncegate::key::derive_key("AWD-I1", TS, b"inspect me");
    let (code, json) = oncegate(&db, &["inspect", &key, "--json"]).await;
    assert_eq!(code, 0, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let audit: Vec<(String, Option<String>)> = v["audit"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["decision"].as_str().unwrap().into(),
                r["tier"].as_str().map(Into::into),
            )
        })
        .collect();
    let want = |d: &str, t: Option<&str>| (d.to_string(), t.map(str::to_string));
    assert_eq!(
        audit,
        [
            want("processed", None),
            want("duplicate", Some("LOCAL_CACHE")),
            want("duplicate", Some("REDIS")),
            want("duplicate", Some("DATABASE")),
        ],
        "all four audit rows, in time order"
    );
    assert_eq!(v["claim"]["award_id"], "AWD-I1");
    assert_eq!(
        (&v["ledger"]["amount_cents"], &v["ledger"]["sequence"]),
        (&4200.into(), &1.into())
    );
    assert_eq!(v["events"].as_array().unwrap().len(), 1);
    assert_eq!(
        (&v["events"][0]["state"], &v["events"][0]["attempts"]),
        (&"pending".into(), &0.into())
    );
    let (code, human) = oncegate(&db, &["inspect", &key]).await;
    assert_eq!(code, 0);
    let at = |needle: &str| {
        human
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} in {human}"))
    };
    assert!(
        at("processed") < at("LOCAL_CACHE")
            && at("LOCAL_CACHE") < at("REDIS")
            && at("REDIS") < at("DATABASE")
    );
    assert!(human.contains("pending since"), "{human}");
    let (code, award) = oncegate(&db, &["inspect", "--award", "AWD-I1"]).await;
    assert!(
        code == 0 && award.contains("running total 4200 cents over 1 disbursements"),
        "{award}"
    );
    assert!(award.contains(&key), "{award}");
    let (code, _) = oncegate(&db, &["inspect", "no-such-key"]).await;
    assert_eq!(code, 1, "an unknown key is not found");
}

/// The stream, as (award, sequence) in stream order.
async fn stream_order(stream: &str) -> Vec<(String, i64)> {
    xrange(stream)
        .await
        .iter()
        .map(|e| (e["award_id"].clone(), e["sequence"].parse().unwrap()))
        .collect()
}

async fn quarantined_events_are_redriven_in_award_order_and_audited(kind: Kind) {
    let db = TestDb::new(kind).await;
    let stream = unique("og-it-redrive-");
    // The broker refuses every write: the stream key holds a string (WRONGTYPE).
    let r = redis_client(&redis_url()).await;
    let _: () = r.set(&stream, "not a stream", None, None, false).await.unwrap();
    let mut args = serve_args(&db);
    args.relay.broker.relay_sink = SinkSpec::parse(&redis_url()).unwrap();
    args.relay.broker.stream.relay_stream = stream.clone();
    args.relay.relay_poll = Duration::from_millis(100);
    args.relay.relay_batch = 2;
    args.relay.relay_max_attempts = 2;
    args.relay.relay_retry_backoff = Duration::from_millis(20);
    let app = TestApp::spawn(args).await;
    let mut c = app.client().await;
    let mut keys = Vec::new();
    for (award, i) in [
        ("AWD-Q1", 0),
        ("AWD-Q2", 0),
        ("AWD-Q1", 1),
        ("AWD-Q2", 1),
        ("AWD-Q1", 2),
        ("AWD-Q2", 2),
    ] {
        let d = c
            .submit(submission(award, TS, format!("{award}-{i}").as_bytes(), 10))
            .await
            .unwrap();
        keys.push(d.into_inner().idempotency_key);
    }
    let store = app.store.clone();
    let quarantined = eventually(Duration::from_secs(20), || {
        let store = store.clone();
        async move { store.outbox_stats().await.unwrap().quarantined == 6 }
    })
    .await;
    assert!(quarantined, "every event quarantined by the refusing broker");
    let (code, listed) = oncegate(&db, &["outbox", "list", "--quarantined", "--json"]).await;
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let events = listed["events"].as_array().unwrap();
    assert_eq!((code, events.len()), (0, 6));
    assert!(
        events
            .iter()
            .all(|e| e["state"] == "quarantined" && e["attempts"] == 2)
    );
    assert!(
        events[0]["last_error"].as_str().unwrap().contains("WRONGTYPE"),
        "{events:?}"
    );
    let first_q1 = events
        .iter()
        .find(|e| e["award_id"] == "AWD-Q1" && e["sequence"] == 1)
        .unwrap();
    let first_q1 = first_q1["event_id"].as_str().unwrap().to_string();

    // The broker recovers. One event by id (and an id that does not exist), then the rest.
    let _: i64 = r.del(&stream).await.unwrap();
    let unknown = uuid::Uuid::now_v7().to_string();
    let retry = [
        "outbox",
        "retry",
        "--reason",
        "broker fixed",
        "--actor",
        "it-operator",
    ];
    let (code, out) = oncegate(
        &db,
        &[&retry[..], &[first_q1.as_str(), unknown.as_str()]].concat(),
    )
    .await;
    assert_eq!(code, 1, "one id was not found: {out}");
    assert!(
        out.contains(&format!("redriven        {first_q1}"))
            && out.contains(&format!("not found       {unknown}")),
        "{out}"
    );
    let s = stream.clone();
    assert!(
        eventually(Duration::from_secs(15), || {
            let s = s.clone();
            async move { stream_order(&s).await == [("AWD-Q1".to_string(), 1)] }
        })
        .await,
        "the relay picked the redriven event up: {:?}",
        stream_order(&stream).await
    );
    let (code, out) = oncegate(&db, &[&retry[..], &["--all-quarantined"]].concat()).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("5 event(s) back to pending"), "{out}");
    let s = stream.clone();
    assert!(
        eventually(Duration::from_secs(15), || {
            let s = s.clone();
            async move { stream_order(&s).await.len() == 6 }
        })
        .await
    );
    let order = stream_order(&stream).await;
    for award in ["AWD-Q1", "AWD-Q2"] {
        let seqs: Vec<i64> = order
            .iter()
            .filter(|(a, _)| a == award)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(seqs, [1, 2, 3], "{award} in sequence order: {order:?}");
    }
    app.shutdown().await;

    let audited = db
        .scalar(
            "SELECT count(*) FROM audit_log WHERE decision = 'redriven' AND instance = 'it-operator' \
             AND tier IS NULL AND detail LIKE '%broker fixed%' AND detail LIKE '%WRONGTYPE%'",
        )
        .await;
    assert_eq!(
        audited, 6,
        "each redrive audited with who, why and the failure it ended"
    );
    let (_, json) = oncegate(&db, &["inspect", &keys[0], "--json"]).await;
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let last = v["audit"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (&last["decision"], &last["instance"]),
        (&"redriven".into(), &"it-operator".into())
    );
    assert_eq!(v["events"][0]["state"], "published");
    let (_, listed) = oncegate(&db, &["outbox", "list", "--quarantined", "--json"]).await;
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&listed).unwrap()["quarantined"],
        0
    );
    assert!(reconcile(&db, Some(redis_broker(&stream))).await.clean);
    let _ = r.quit().await;
    delete_key(&stream).await;
}

async fn serve_exports_the_reconciliation_gauges(kind: Kind) {
    let db = TestDb::new(kind).await;
    let sidecar = Sidecar::start(&[
        ("DATABASE_URL", db.url.clone()),
        ("ONCEGATE_RECONCILE_INTERVAL", "300ms".into()),
    ])
    .await;
    let mut c = sidecar.client().await;
    for i in 0..3 {
        c.submit(submission("AWD-S1", TS, format!("s-{i}").as_bytes(), 70))
            .await
            .unwrap();
    }
    let gauge = |text: &str, check: &str| {
        metric(
            text,
            &format!("oncegate_reconciliation_mismatches{{check=\"{check}\"}}"),
        )
    };
    let addr = sidecar.metrics_addr;
    let clean = eventually(Duration::from_secs(15), || async move {
        let m = scrape(addr).await;
        gauge(&m, "totals") == Some(0.0)
            && metric(&m, "oncegate_reconciliation_last_run_timestamp_seconds").is_some_and(|t| t > 1.7e9)
    })
    .await;
    assert!(clean, "{}", sidecar.metrics().await);
    plant(&db, "UPDATE award_balances SET total_cents = total_cents + 1").await;
    let flagged = eventually(Duration::from_secs(15), || async move {
        let m = scrape(addr).await;
        gauge(&m, "totals") == Some(1.0) && gauge(&m, "claims") == Some(0.0)
    })
    .await;
    let m = sidecar.metrics().await;
    assert!(flagged, "{m}");
    assert_eq!(gauge(&m, "broker"), None, "no broker, no broker gauge");
    let needle = "reconciliation found mismatches";
    assert!(
        sidecar
            .log_containing(needle, Duration::from_secs(5))
            .await
            .contains(needle)
    );
    assert!(sidecar.terminate().await.success());
}

/// A database migrated up to (not including) migration `before` (the
/// Postgres and the SQLite number).
async fn migrated_before(kind: Kind, before: (u32, u32)) -> (TestDb, Option<tempfile::TempDir>) {
    let (sub, last) = match kind {
        Kind::Postgres => ("postgres", before.0),
        Kind::Sqlite => ("sqlite", before.1),
    };
    let db = TestDb::unmigrated(kind).await;
    let dir = tempfile::tempdir().unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(sub);
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let version: u32 = path.file_name().unwrap().to_str().unwrap()[..4].parse().unwrap();
        if version < last {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let migrator = sqlx::migrate::Migrator::new(dir.path()).await.unwrap();
    match kind {
        Kind::Postgres => migrator
            .run(&sqlx::PgPool::connect(&db.url).await.unwrap())
            .await
            .unwrap(),
        Kind::Sqlite => {
            let options: sqlx::sqlite::SqliteConnectOptions = db.url.parse().unwrap();
            let pool = sqlx::SqlitePool::connect_with(options.create_if_missing(true))
                .await
                .unwrap();
            migrator.run(&pool).await.unwrap()
        }
    }
    (db, Some(dir))
}

fn audit_insert(kind: Kind, decision: &str) -> String {
    let at = match kind {
        Kind::Postgres => "now()".to_string(),
        Kind::Sqlite => oncegate::time_fmt::to_micros(time::OffsetDateTime::now_utc()).to_string(),
    };
    format!(
        "INSERT INTO audit_log (at, decision, key_prefix, award_id, instance) \
         VALUES ({at}, '{decision}', 'abcdefabcdef', 'AWD-MIG', 'it')"
    )
}

/// The operations migration widens the audit decisions and keeps every
/// row, its id, the id counter and the append-only guards.
async fn the_operations_migration_keeps_the_audit_trail_and_its_guards(kind: Kind) {
    let widening = Widening {
        before: (6, 4),
        kept: ["processed", "duplicate", "rejected", "processed"],
        added: &[
            "redriven",
            "effect_acquired",
            "effect_completed",
            "effect_released",
            "effect_retaken",
            "effect_rejected",
        ],
        sqlite_objects_added: &["index:audit_log_key_prefix"],
    };
    widening.keeps_the_audit_trail_and_its_guards(kind).await;
}

/// The effect_answered migration (postgres 0010, sqlite 0006) likewise; on
/// SQLite the rebuilt table has exactly the indexes and triggers it had.
async fn the_effect_answered_migration_keeps_the_audit_trail_and_its_guards(kind: Kind) {
    let widening = Widening {
        before: (10, 6),
        kept: ["processed", "effect_rejected", "redriven", "duplicate"],
        added: &["effect_answered"],
        sqlite_objects_added: &[],
    };
    widening.keeps_the_audit_trail_and_its_guards(kind).await;
}

/// A migration that widens the audit decision CHECK.
struct Widening {
    /// The migration's number (Postgres, SQLite).
    before: (u32, u32),
    /// Decisions of four rows written before it.
    kept: [&'static str; 4],
    /// Decisions it allows.
    added: &'static [&'static str],
    /// The indexes and triggers on SQLite's `audit_log` it adds (`type:name`).
    sqlite_objects_added: &'static [&'static str],
}

impl Widening {
    /// The rows written before stay with their ids, the added decisions are
    /// accepted and nothing else is, ids continue after the counter, and
    /// `audit_log` stays append-only; on SQLite every index and trigger is
    /// kept as it was and the purge gate still opens.
    async fn keeps_the_audit_trail_and_its_guards(&self, kind: Kind) {
        let (db, _dir) = migrated_before(kind, self.before).await;
        for decision in self.kept {
            db.exec(&audit_insert(kind, decision)).await;
        }
        if kind == Kind::Sqlite {
            // The last row purged: the id counter (4) is past the largest id left (3).
            purge_audit_row(&db, 4).await;
        }
        assert!(
            db.try_exec(&audit_insert(kind, self.added[0])).await.is_err(),
            "not yet"
        );
        let objects = sqlite_audit_log_objects(&db).await;
        db.open().await.migrate().await.expect("the migration applies");
        let rows = db
            .scalar("SELECT count(*) FROM audit_log WHERE id IN (1, 2, 3) AND award_id = 'AWD-MIG'")
            .await;
        assert_eq!(rows, 3, "every row kept with its id");
        for decision in self.added {
            db.exec(&audit_insert(kind, decision)).await;
        }
        let err = db.try_exec(&audit_insert(kind, "bogus")).await.unwrap_err();
        assert!(err.to_lowercase().contains("check"), "{err}");
        let next = db
            .scalar(&format!(
                "SELECT min(id) FROM audit_log WHERE decision = '{}'",
                self.added[0]
            ))
            .await;
        match kind {
            Kind::Sqlite => assert_eq!(next, 5, "ids continue after the counter, never reusing one"),
            // An identity value is spent even by the refused insert above.
            Kind::Postgres => assert!(next > 4, "{next}"),
        }
        for change in ["UPDATE audit_log SET instance = 'x'", "DELETE FROM audit_log"] {
            let err = db.try_exec(change).await.unwrap_err();
            assert!(err.contains("append-only"), "{change}: {err}");
        }
        if kind == Kind::Sqlite {
            self.check_sqlite_objects(&db, objects).await;
        }
    }

    async fn check_sqlite_objects(&self, db: &TestDb, before: Vec<(String, String)>) {
        let (added, kept): (Vec<_>, Vec<_>) = sqlite_audit_log_objects(db)
            .await
            .into_iter()
            .partition(|(name, _)| self.sqlite_objects_added.contains(&name.as_str()));
        assert_eq!(kept, before, "indexes and triggers recreated exactly");
        let added: Vec<&str> = added.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(added, self.sqlite_objects_added);
        purge_audit_row(db, 1).await;
        assert_eq!(db.scalar("SELECT count(*) FROM audit_log WHERE id = 1").await, 0);
    }
}

/// The purge's way of deleting one SQLite audit row: through the gate.
async fn purge_audit_row(db: &TestDb, id: i64) {
    db.exec(&format!(
        "INSERT INTO oncegate_purge_gate (open) VALUES (1); DELETE FROM audit_log WHERE id = {id}; \
         DELETE FROM oncegate_purge_gate;"
    ))
    .await;
}

/// SQLite: the indexes and triggers on `audit_log` (`type:name`, and their
/// SQL), in name order; empty on Postgres.
async fn sqlite_audit_log_objects(db: &TestDb) -> Vec<(String, String)> {
    if db.kind != Kind::Sqlite {
        return Vec::new();
    }
    let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
    let objects: Vec<(String, String)> = sqlx::query_as(
        "SELECT type || ':' || name, sql FROM sqlite_master \
         WHERE tbl_name = 'audit_log' AND type IN ('index', 'trigger') AND sql IS NOT NULL ORDER BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    objects
}

/// The operator commands need nothing beyond the application role's grants
/// (migrations/GRANTS.md): reconcile, inspect, list and redrive as that role.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_commands_run_as_the_application_role() {
    let db = TestDb::new(Kind::Postgres).await;
    let role = unique("og_ops_");
    db.exec(&format!("CREATE ROLE {role} LOGIN")).await;
    db.exec(&format!("SELECT oncegate_grant_app_role('{role}')"))
        .await;
    let role_url = format!("postgres://{role}@{}/{}", pg_addr(), db.name);
    let store = open_store(&role_url, 2).await.unwrap();
    let rows = ledger_in(&*store, &["AWD-R1"], 2).await;
    // A relay's statements too: slots, reads and writes for a slot.
    assert_eq!(store.relay_slots_init(1).await.unwrap(), 1);
    let lease = store.take_slots("it", 1, Duration::from_secs(30)).await.unwrap()[0];
    let event = store.slot_pending(&lease, 1).await.unwrap();
    let quarantined = store
        .record_publish_failure(&lease, event[0].event_id, "refused", 1, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(quarantined, Some(true));
    store.release_slot("it", &lease).await.unwrap();
    let (code, out) = oncegate_at(&role_url, &["reconcile"]).await;
    assert_eq!(code, 0, "{out}");
    let (code, out) = oncegate_at(&role_url, &["inspect", &rows[0].key]).await;
    assert_eq!(code, 0, "{out}");
    let (code, out) = oncegate_at(&role_url, &["outbox", "list", "--quarantined"]).await;
    assert!(code == 0 && out.contains("QUARANTINED"), "{out}");
    let retry = [
        "outbox",
        "retry",
        "--all-quarantined",
        "--reason",
        "as the app role",
    ];
    let (code, out) = oncegate_at(&role_url, &retry).await;
    assert!(code == 0 && out.contains("1 event(s) back to pending"), "{out}");
    let audited = db
        .scalar(
            "SELECT count(*) FROM audit_log WHERE decision = 'redriven' AND detail LIKE '%as the app role%'",
        )
        .await;
    assert_eq!(audited, 1);
    drop(store);
    db.exec(&format!("DROP OWNED BY {role}; DROP ROLE {role}")).await;
}
