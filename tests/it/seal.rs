//! The sealed audit trail (DESIGN §10.3): a normal run verifies clean on both
//! stores (claims, cache duplicates from the audit queue, rejections, two
//! instances sealing at once); every kind of after-the-fact tampering by
//! the owner — a row changed, removed, inserted, a seal changed or removed —
//! is named exactly, in the database and in a hand-edited export (and the
//! plain Python script refuses the edited export); writers committing out
//! of id order with long transactions never get a row skipped or sealed
//! twice; a retention purge of old months verifies clean and is reported as
//! lawful, while a row removed outside it is reported missing.

use crate::helpers::*;
use oncegate::pb::{Outcome, Tier};
use oncegate::retention::Retention;
use oncegate::seal::export::{self, Target};
use oncegate::seal::verify::{Finding, VerifyReport, verify_store};
use oncegate::seal::{SealRun, SealSettings, Sealer};
use oncegate::store::{AuditDecision, AuditEntry, RetentionPolicy, Store, TimeRange};
use sqlx::Connection;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;

on_both_stores!(
    a_normal_run_on_two_instances_seals_every_row_once_and_verifies_clean,
    tampering_in_the_database_is_named_exactly,
    tampering_in_an_export_is_named_exactly_and_the_python_script_refuses_it,
    long_transactions_committing_out_of_id_order_never_get_a_row_skipped_or_sealed_twice,
    a_purge_of_old_months_verifies_clean_and_is_lawful_while_a_removed_row_is_missing,
    a_seal_that_no_longer_follows_the_chain_or_its_rows_is_not_appended,
    an_owners_full_reseal_passes_the_hash_chain_but_not_the_public_key,
    an_owners_reseal_and_a_cut_off_tail_are_caught_by_the_anchors_and_a_forged_signature_is_refused,
    seals_reach_the_broker_as_audit_sealed_events_that_anchor_the_chain_and_reconcile_accepts,
    racing_sidecar_and_command_seals_each_match_their_anchors_in_the_file_and_the_broker,
);

const TS: &str = "2026-11-29T10:00:00Z";
const DAY: u64 = 86_400;

fn settings(max_rows: i64, wait: Duration) -> SealSettings {
    SealSettings {
        wait,
        max_rows,
        instance: Arc::from(unique("sealer-")),
        signer: None,
        anchors: None,
    }
}

fn sealer(store: Arc<dyn Store>, max_rows: i64) -> Sealer {
    Sealer::new(store, settings(max_rows, Duration::from_secs(5)))
}

/// Seals until nothing is left below the horizon.
async fn seal_all(sealer: &Sealer) -> SealRun {
    loop {
        match sealer.step().await.expect("seal") {
            SealRun::Busy | SealRun::Raced => tokio::time::sleep(Duration::from_millis(20)).await,
            run => return run,
        }
    }
}

async fn verify(store: &dyn Store) -> VerifyReport {
    verify_store(store, &TimeRange::default(), Default::default(), &mut |_, _| {})
        .await
        .expect("verify")
}

fn row(award: &str, at: OffsetDateTime) -> AuditEntry {
    AuditEntry {
        at,
        decision: AuditDecision::Duplicate,
        tier: Some(oncegate::store::Tier::LocalCache),
        key_prefix: "0123456789ab".into(),
        award_id: award.into(),
        instance: Arc::from("it"),
        payload_changed: false,
        detail: None,
    }
}

/// `n` audit rows `{prefix}-{i}` at `at`.
async fn append(store: &dyn Store, prefix: &str, n: usize, at: OffsetDateTime) {
    let rows: Vec<AuditEntry> = (0..n).map(|i| row(&format!("{prefix}-{i}"), at)).collect();
    store.append_audit(&rows).await.expect("append");
}

/// Runs `sql` as the owner with the append-only guards out of the way: on
/// Postgres as a superuser with `session_replication_role = replica`
/// (ordinary triggers off for the session), on SQLite by dropping the
/// triggers and creating them again afterwards.
async fn as_owner(db: &TestDb, sql: &str) {
    match db.kind {
        Kind::Postgres => {
            db.exec(&format!("SET session_replication_role = replica; {sql}"))
                .await
        }
        Kind::Sqlite => {
            let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
            let triggers: Vec<(String, String)> =
                sqlx::query_as("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'")
                    .fetch_all(&mut c)
                    .await
                    .unwrap();
            for (name, _) in &triggers {
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TRIGGER {name}")))
                    .execute(&mut c)
                    .await
                    .unwrap();
            }
            sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
                .execute(&mut c)
                .await
                .unwrap();
            for (_, create) in triggers {
                sqlx::raw_sql(sqlx::AssertSqlSafe(create))
                    .execute(&mut c)
                    .await
                    .unwrap();
            }
        }
    }
}

/// Makes the next audit id absent for good: a rolled-back insert on
/// Postgres (its id is spent), the next row written with an id one higher
/// on SQLite (which reuses rolled-back ids).
async fn skip_an_id(db: &TestDb) {
    let insert = "INSERT INTO audit_log (at, decision, key_prefix, award_id, instance) \
                  VALUES (now(), 'rejected', 'x', 'ROLLED-BACK', 'it')";
    match db.kind {
        Kind::Postgres => db.exec(&format!("BEGIN; {insert}; ROLLBACK")).await,
        Kind::Sqlite => {
            db.exec(
                "INSERT INTO audit_log (id, at, decision, key_prefix, award_id, instance) \
                 SELECT coalesce(max(id), 0) + 2, CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER), \
                   'duplicate', '0123456789ab', 'AFTER-GAP', 'it' FROM audit_log",
            )
            .await
        }
    }
}

/// Every audit row is covered by exactly one seal.
async fn assert_each_row_sealed_once(db: &TestDb) {
    let rows = db.scalar("SELECT count(*) FROM audit_log").await;
    let once = db
        .scalar(
            "SELECT count(*) FROM audit_log a WHERE \
             (SELECT count(*) FROM audit_seals s WHERE a.id BETWEEN s.first_id AND s.last_id) = 1",
        )
        .await;
    let sealed = db
        .scalar("SELECT CAST(coalesce(sum(row_count), 0) AS BIGINT) FROM audit_seals")
        .await;
    assert!(rows > 0);
    assert_eq!(
        (once, sealed),
        (rows, rows),
        "each of {rows} rows in exactly one seal"
    );
}

/// The binary: exit code and stdout.
async fn binary(args: &[&str]) -> (i32, String) {
    let out = tokio::process::Command::new(oncegate_bin())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .await
        .expect("oncegate runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), format!("{stdout}{stderr}"))
}

/// Two instances serving at once, sealing every 100 ms into seals of at
/// most 7 rows while claims, cache duplicates (written only by the shutdown
/// drain: the flush interval is an hour) and key-reuse refusals arrive.
/// Afterwards every row is in exactly one seal, the chain verifies clean
/// (library and binary) and the sealed-rows counter moved.
async fn a_normal_run_on_two_instances_seals_every_row_once_and_verifies_clean(kind: Kind) {
    let db = TestDb::new(kind).await;
    let spawn = || {
        let mut args = serve_args(&db);
        args.audit_flush_interval = Duration::from_secs(3_600);
        args.audit_seal.audit_seal_interval = Duration::from_millis(100);
        args.audit_seal.seal.audit_seal_max_rows = 7;
        TestApp::spawn(args)
    };
    let (one, two) = (spawn().await, spawn().await);
    let traffic = |addr: std::net::SocketAddr, name: &'static str| async move {
        let mut c = oncegate::pb::gate_client::GateClient::connect(format!("http://{addr}"))
            .await
            .unwrap();
        {
            for i in 0..12 {
                let s = submission(
                    &format!("{name}-{}", i % 3),
                    TS,
                    format!("{name}{i}").as_bytes(),
                    100,
                );
                assert_eq!(
                    outcome(&c.submit(s.clone()).await.unwrap().into_inner()),
                    Outcome::Claimed
                );
                let dup = c.submit(s.clone()).await.unwrap().into_inner();
                assert_eq!(
                    (outcome(&dup), tier(&dup)),
                    (Outcome::Duplicate, Tier::LocalCache)
                );
                let mut reused = s;
                reused.idempotency_key = Some(format!("{name}-producer-key"));
                let _ = c.submit(reused).await;
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
        }
    };
    tokio::join!(traffic(one.addr, "ONE"), traffic(two.addr, "TWO"));
    let queued = db.counts().await.audit_duplicate;
    one.shutdown().await;
    two.shutdown().await;
    let n = db.counts().await;
    assert_eq!(
        (n.disbursements, n.audit_duplicate),
        (26, 24),
        "queued {queued} before the drain"
    );
    assert!(n.audit_rejected >= 22, "{n:?}");
    assert!(db.scalar("SELECT count(*) FROM audit_seals").await >= 10);
    assert_each_row_sealed_once(&db).await;
    let report = verify(&*db.open().await).await;
    assert!(report.is_clean(), "{report}");
    assert_eq!(
        report.unsealed.map(|u| u.count),
        Some(0),
        "the last seal ran after the flush: {report}"
    );
    assert_eq!(
        report.rows_checked as i64,
        db.scalar("SELECT count(*) FROM audit_log").await
    );
    let (code, out) = binary(&["audit", "verify", "--database-url", &db.url]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("result: OK"), "{out}");
    let (latest_seq, latest_digest) = report.latest.clone().unwrap();
    assert!(
        out.contains(&format!("latest digest: seal {latest_seq} {latest_digest}")),
        "{out}"
    );
    let metrics = oncegate::metrics::handle().render();
    assert!(metric(&metrics, "oncegate_audit_rows_sealed_total").unwrap_or(0.0) >= 1.0);
    assert!(
        metric(&metrics, "oncegate_audit_last_seal_age_seconds").is_some(),
        "{metrics}"
    );
}

/// Rows 1..=10 and 12..=40 (11 absent for good), sealed 10 rows at a time:
/// seal 1 = ids 1..10, seal 2 = 11..21, seal 3 = 22..31, seal 4 = 32..40.
async fn four_seals(db: &TestDb) -> Arc<dyn Store> {
    let store = db.open().await;
    append(&*store, "A", 10, OffsetDateTime::now_utc()).await;
    skip_an_id(db).await;
    let allocated = match db.kind {
        Kind::Postgres => {
            "SELECT pg_sequence_last_value(pg_get_serial_sequence('audit_log', 'id')::regclass)"
        }
        Kind::Sqlite => "SELECT seq FROM sqlite_sequence WHERE name = 'audit_log'",
    };
    let left = 40 - db.scalar(allocated).await as usize;
    append(&*store, "B", left, OffsetDateTime::now_utc()).await;
    let run = seal_all(&sealer(store.clone(), 10)).await;
    assert!(
        matches!(
            run,
            SealRun::Sealed {
                seals: Some((1, 4)),
                rows: 39,
                ..
            }
        ),
        "{run:?}"
    );
    let ranges: Vec<(i64, i64, i64)> = sqlx_ranges(db).await;
    assert_eq!(ranges, [(1, 10, 10), (11, 21, 10), (22, 31, 10), (32, 40, 9)]);
    store
}

async fn sqlx_ranges(db: &TestDb) -> Vec<(i64, i64, i64)> {
    let mut out = Vec::new();
    for seq in 1..=db.scalar("SELECT count(*) FROM audit_seals").await {
        let get = |col: &str| format!("SELECT {col} FROM audit_seals WHERE seq = {seq}");
        out.push((
            db.scalar(&get("first_id")).await,
            db.scalar(&get("last_id")).await,
            db.scalar(&get("row_count")).await,
        ));
    }
    out
}

/// As the owner, past the guards: row 3's award id changed, row 25
/// removed, a row with the absent id 11 inserted, seal 4's `sealed_by`
/// edited. Verify names each, in chain order; the binary exits 65 naming
/// the first. Then, on a fresh trail, a row below the first seal, a seal's
/// digest edited and a seal removed (a gap).
async fn tampering_in_the_database_is_named_exactly(kind: Kind) {
    let db = TestDb::new(kind).await;
    let store = four_seals(&db).await;
    assert!(verify(&*store).await.is_clean());
    let values = match kind {
        Kind::Postgres => "OVERRIDING SYSTEM VALUE VALUES (11, now(),",
        Kind::Sqlite => "VALUES (11, CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER),",
    };
    as_owner(&db, "UPDATE audit_log SET award_id = 'FORGED' WHERE id = 3").await;
    as_owner(&db, "DELETE FROM audit_log WHERE id = 25").await;
    as_owner(
        &db,
        &format!(
            "INSERT INTO audit_log (id, at, decision, key_prefix, award_id, instance) {values} \
             'processed', 'ffffffffffff', 'PLANTED', 'it')"
        ),
    )
    .await;
    as_owner(
        &db,
        "UPDATE audit_seals SET sealed_by = 'someone-else' WHERE seq = 4",
    )
    .await;
    let report = verify(&*store).await;
    assert_eq!(
        report.findings,
        [
            Finding::RowChanged { id: 3, seal: 1 },
            Finding::RowInserted {
                id: 11,
                seal: Some(2),
                why: "its id was absent when the seal was made"
            },
            Finding::RowRemoved { id: 25, seal: 3 },
            Finding::SealChanged {
                seal: 4,
                why: "its digest does not match its fields and rows".into()
            },
        ],
        "{report}"
    );
    let (code, out) = binary(&["audit", "verify", "--database-url", &db.url]).await;
    assert_eq!(code, 65, "{out}");
    assert!(out.contains("first mismatch: row 3 (seal 1) changed"), "{out}");
    assert!(out.contains("result: FAILED (4 mismatches)"), "{out}");

    // On a fresh trail: a row below the first seal, seal 3's digest edited
    // (named once: seal 4 still links to seal 3's true digest), then seal 2
    // removed (a gap).
    let db = TestDb::new(kind).await;
    let store = four_seals(&db).await;
    let values = values.replace("(11,", "(0,");
    as_owner(
        &db,
        &format!(
            "INSERT INTO audit_log (id, at, decision, key_prefix, award_id, instance) {values} \
             'processed', 'ffffffffffff', 'PLANTED', 'it')"
        ),
    )
    .await;
    as_owner(
        &db,
        "UPDATE audit_seals SET digest = replace(digest, substr(digest, 1, 1), 'x') WHERE seq = 3",
    )
    .await;
    let seal3 = Finding::SealChanged {
        seal: 3,
        why: "its digest does not match its fields and rows".into(),
    };
    let below = Finding::RowInserted {
        id: 0,
        seal: None,
        why: "its id is below the first seal's range",
    };
    let report = verify(&*store).await;
    assert_eq!(report.findings, [below.clone(), seal3.clone()], "{report}");
    as_owner(&db, "DELETE FROM audit_seals WHERE seq = 2").await;
    let report = verify(&*store).await;
    let gap = Finding::SealsMissing {
        after: 1,
        next: 3,
        ids: (11, 21),
    };
    assert_eq!(report.findings, [below, gap, seal3], "{report}");
}

/// The whole trail exported to the file at `path`.
async fn export_whole_trail(store: &dyn Store, path: &Path) {
    export::export(
        store,
        &TimeRange::default(),
        &Target::for_path(path),
        &mut |_, _| {},
    )
    .await
    .unwrap();
}

fn python(args: &[&Path]) -> (i32, String) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/verify-audit-export");
    let out = std::process::Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .expect("python3 on PATH");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// A copy of the export with line `n` (counting from 0) changed by `edit`
/// (`None`: removed, a second value: inserted after it).
fn edited(
    src: &Path,
    dir: &Path,
    name: &str,
    edit: impl Fn(usize, &str) -> Vec<String>,
) -> std::path::PathBuf {
    let text = std::fs::read_to_string(src).unwrap();
    let lines: Vec<String> = text.lines().enumerate().flat_map(|(i, l)| edit(i, l)).collect();
    let path = dir.join(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// The line index of the row with `id` in an export.
fn row_line(src: &Path, id: i64) -> usize {
    let text = std::fs::read_to_string(src).unwrap();
    text.lines()
        .position(|l| l.starts_with(&format!("{{\"type\":\"row\",\"id\":{id},")))
        .unwrap_or_else(|| panic!("row {id} exported"))
}

async fn verify_file(path: &Path) -> VerifyReport {
    export::verify_export(path, Default::default(), &mut |_, _| {})
        .await
        .expect("readable export")
}

/// The four seals exported to one file and to a directory: both verify
/// clean with the binary and the Python script, which print the same latest
/// digest. Edited by hand — a row's award id changed, a row line removed, a
/// row line repeated, a seal's `sealed_by` changed — each is named exactly,
/// and the Python script refuses each, naming the seal.
async fn tampering_in_an_export_is_named_exactly_and_the_python_script_refuses_it(kind: Kind) {
    let db = TestDb::new(kind).await;
    let store = four_seals(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("audit.jsonl");
    let summary = export::export(
        &*store,
        &TimeRange::default(),
        &Target::File(file.clone()),
        &mut |_, _| {},
    )
    .await
    .unwrap();
    assert_eq!((summary.seals, summary.rows), (4, 39));
    let monthly = dir.path().join("monthly/");
    let (code, out) = binary(&[
        "audit",
        "export",
        "--database-url",
        &db.url,
        "--out",
        monthly.to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, 0, "{out}");
    let (seq, digest) = summary.latest.clone().unwrap();
    for exported in [&file, &monthly] {
        let report = verify_file(exported).await;
        assert!(report.is_clean() && report.rows_checked == 39, "{report}");
        let (code, out) = binary(&["audit", "verify", "--export", exported.to_str().unwrap()]).await;
        assert_eq!(code, 0, "{out}");
        let (code, out) = python(&[exported]);
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains(&format!("latest digest: seal {seq} {digest}")),
            "{out}"
        );
    }
    let again = binary(&[
        "audit",
        "export",
        "--database-url",
        &db.url,
        "--out",
        file.to_str().unwrap(),
    ])
    .await;
    assert!(again.0 != 0 && again.1.contains("never overwrites"), "{again:?}");

    let r3 = row_line(&file, 3);
    let changed = edited(&file, dir.path(), "changed.jsonl", |i, l| {
        vec![if i == r3 {
            l.replace("\"A-2\"", "\"FORGED\"")
        } else {
            l.to_string()
        }]
    });
    let r25 = row_line(&file, 25);
    let removed = edited(&file, dir.path(), "removed.jsonl", |i, l| {
        if i == r25 { vec![] } else { vec![l.to_string()] }
    });
    let r15 = row_line(&file, 15);
    let inserted = edited(&file, dir.path(), "inserted.jsonl", |i, l| {
        if i == r15 {
            vec![l.to_string(), l.to_string()]
        } else {
            vec![l.to_string()]
        }
    });
    let seal4 = edited(&file, dir.path(), "seal.jsonl", |_, l| {
        vec![if l.starts_with("{\"type\":\"seal\",\"seq\":4,") {
            l.replace("\"sealed_by\":\"", "\"sealed_by\":\"x")
        } else {
            l.to_string()
        }]
    });
    for (path, finding, seal) in [
        (&changed, Finding::RowChanged { id: 3, seal: 1 }, 1),
        (&removed, Finding::RowRemoved { id: 25, seal: 3 }, 3),
        (
            &inserted,
            Finding::RowInserted {
                id: 15,
                seal: Some(2),
                why: "a second row with this id",
            },
            2,
        ),
        (
            &seal4,
            Finding::SealChanged {
                seal: 4,
                why: "its digest does not match its fields and rows".into(),
            },
            4,
        ),
    ] {
        let report = verify_file(path).await;
        assert_eq!(report.findings, [finding], "{}: {report}", path.display());
        let (code, out) = python(&[path]);
        assert_eq!(code, 65, "{}: {out}", path.display());
        assert!(out.contains(&format!("seal {seal}")), "{}: {out}", path.display());
    }
    let (code, out) = binary(&["audit", "verify", "--export", changed.to_str().unwrap()]).await;
    assert_eq!(code, 65, "{out}");
    assert!(out.contains("first mismatch: row 3 (seal 1) changed"), "{out}");

    // The last seal and its rows cut off: the header still lists it.
    let seal4_line = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .position(|l| l.starts_with("{\"type\":\"seal\",\"seq\":4,"))
        .unwrap();
    let truncated = edited(&file, dir.path(), "truncated.jsonl", |i, l| {
        if i < seal4_line {
            vec![l.to_string()]
        } else {
            vec![]
        }
    });
    let report = verify_file(&truncated).await;
    assert_eq!(
        report.findings,
        [Finding::ExportTruncated { after: 3, last: 4 }],
        "{report}"
    );
    // A line that is not an export line at all is an error, not a verdict.
    let broken = edited(&file, dir.path(), "broken.jsonl", |i, l| {
        vec![if i == r3 {
            l[..l.len() / 2].to_string()
        } else {
            l.to_string()
        }]
    });
    let (code, out) = binary(&["audit", "verify", "--export", broken.to_str().unwrap()]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("line {}", r3 + 1)), "{out}");
}

/// A seal is appended only while it still follows the newest seal and its
/// range still holds exactly its rows (another sealer, or a purge, in
/// between); nothing is written otherwise.
async fn a_seal_that_no_longer_follows_the_chain_or_its_rows_is_not_appended(kind: Kind) {
    use oncegate::seal::canonical::{Head, SealBuilder};
    use oncegate::store::RowCursor;
    let db = TestDb::new(kind).await;
    let store = db.open().await;
    append(&*store, "A", 3, OffsetDateTime::now_utc()).await;
    let build = |head: Head| {
        let store = store.clone();
        async move {
            let mut b = SealBuilder::after(&head);
            for row in store
                .audit_rows(RowCursor::after_id(head.last_id), i64::MAX, 100)
                .await
                .unwrap()
            {
                b.push(&row).unwrap();
            }
            b.finish(&head, 0, "it").unwrap()
        }
    };
    let first = build(Head::genesis()).await;
    assert!(store.insert_audit_seal(&first).await.unwrap());
    assert!(
        !store.insert_audit_seal(&first).await.unwrap(),
        "its number is taken"
    );
    let stale = build(Head::genesis()).await;
    assert!(
        !store.insert_audit_seal(&stale).await.unwrap(),
        "it does not follow seal 1"
    );
    append(&*store, "B", 2, OffsetDateTime::now_utc()).await;
    let next = build(Head::from(&first)).await;
    as_owner(&db, &format!("DELETE FROM audit_log WHERE id = {}", next.last_id)).await;
    assert!(
        !store.insert_audit_seal(&next).await.unwrap(),
        "a row of its range went meanwhile"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM audit_seals").await, 1);
}

/// Writers that insert audit rows and hold their transactions open for up
/// to 100 ms (one in ten rolls back) commit out of id order, while two
/// sealers seal every few milliseconds. On Postgres the harness also holds
/// one transaction with its audit row open, far past the seal wait, while
/// the others commit rows after it, until a sealer has deferred on it.
/// Afterwards every committed row is in exactly one seal and the chain
/// verifies clean; sealing kept up while the writers wrote.
async fn long_transactions_committing_out_of_id_order_never_get_a_row_skipped_or_sealed_twice(kind: Kind) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let db = TestDb::new(kind).await;
    let seed = test_seed();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..6)
        .map(|w| tokio::spawn(writer(db.url.clone(), kind, seed.wrapping_add(w), stop.clone())))
        .collect();
    let (deferred, sealed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let sealers: Vec<_> = (0..2)
        .map(|_| {
            let (url, stop, deferred, sealed) =
                (db.url.clone(), stop.clone(), deferred.clone(), sealed.clone());
            tokio::spawn(async move {
                let store = open_store(&url, 2).await.unwrap();
                let sealer = Sealer::new(store, settings(25, Duration::from_millis(250)));
                while !stop.load(Ordering::Relaxed) {
                    match sealer.step().await.expect("seal") {
                        SealRun::Deferred { .. } => deferred.fetch_add(1, Ordering::Relaxed),
                        SealRun::Sealed { rows, .. } => sealed.fetch_add(rows, Ordering::Relaxed),
                        _ => 0,
                    };
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();
    let started = tokio::time::Instant::now();
    let mut held_rows = 0;
    if kind == Kind::Postgres {
        // The state under test: a transaction that took an audit row's id
        // and stays open past the wait while later ids commit.
        let mut held = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("BEGIN; {}", insert_audit(kind))))
            .execute(&mut held)
            .await
            .unwrap();
        let waited = eventually(Duration::from_secs(60), || async {
            deferred.load(Ordering::Relaxed) > 0
        })
        .await;
        sqlx::raw_sql("COMMIT").execute(&mut held).await.unwrap();
        held_rows = 1;
        assert!(
            waited,
            "a sealer deferred while a transaction held its audit row past the wait"
        );
    }
    // Writing goes on for 4 s at least, and until sealing has kept up with it.
    let kept_up = eventually(Duration::from_secs(60), || async {
        started.elapsed() >= Duration::from_secs(4) && sealed.load(Ordering::Relaxed) > 0
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut committed = held_rows;
    for w in writers {
        committed += w.await.unwrap();
    }
    for s in sealers {
        s.await.unwrap();
    }
    assert!(kept_up, "sealing kept up while the writers wrote");
    let store = db.open().await;
    seal_all(&sealer(store.clone(), 25)).await;
    assert_eq!(db.scalar("SELECT count(*) FROM audit_log").await, committed);
    assert_each_row_sealed_once(&db).await;
    let report = verify(&*store).await;
    assert!(
        report.is_clean() && report.unsealed.map(|u| u.count) == Some(0),
        "{report}"
    );
}

/// One audit row, as the writers insert it.
fn insert_audit(kind: Kind) -> &'static str {
    match kind {
        Kind::Postgres => {
            "INSERT INTO audit_log (at, decision, key_prefix, award_id, instance) \
                           VALUES (now(), 'processed', 'k', 'W', 'it')"
        }
        Kind::Sqlite => {
            "INSERT INTO audit_log (at, decision, key_prefix, award_id, instance) \
                         VALUES (CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER), 'processed', 'k', 'W', 'it')"
        }
    }
}

/// One writer: transactions of 1–3 audit rows held open 0–100 ms, one in
/// ten rolled back, until `stop`. Returns the rows it committed.
async fn writer(url: String, kind: Kind, seed: u64, stop: Arc<std::sync::atomic::AtomicBool>) -> i64 {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut committed = 0;
    let insert = insert_audit(kind);
    let mut pg = None;
    let mut lite = None;
    match kind {
        Kind::Postgres => pg = Some(sqlx::PgConnection::connect(&url).await.unwrap()),
        Kind::Sqlite => lite = Some(sqlx::SqliteConnection::connect(&url).await.unwrap()),
    }
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let hold = rng.random_range(0..100);
        // SQLite has one writer: short holds, or the others only wait.
        let hold = if kind == Kind::Sqlite { hold / 20 } else { hold };
        let (rows, commit) = (rng.random_range(1..=3), rng.random_range(0..10) != 0);
        let end = if commit { "COMMIT" } else { "ROLLBACK" };
        let begin = if kind == Kind::Sqlite {
            "BEGIN IMMEDIATE"
        } else {
            "BEGIN"
        };
        let body = vec![insert; rows].join("; ");
        if let Some(c) = pg.as_mut() {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("{begin}; {body}")))
                .execute(&mut *c)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(hold)).await;
            sqlx::raw_sql(sqlx::AssertSqlSafe(end.to_string()))
                .execute(&mut *c)
                .await
                .unwrap();
        }
        if let Some(c) = lite.as_mut() {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!("{begin}; {body}")))
                .execute(&mut *c)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(hold)).await;
            sqlx::raw_sql(sqlx::AssertSqlSafe(end.to_string()))
                .execute(&mut *c)
                .await
                .unwrap();
        }
        if commit {
            committed += rows as i64;
        }
    }
    committed
}

/// Seal 1: rows from 150 and 100 days ago (two old months). Seal 2: a row
/// from 75 days ago and one from now (it straddles the cutoff, so it stays
/// whole, and keeps its old month's partition). Seal 3: rows from now. And
/// one row from 200 days ago no seal covers yet. A purge with a 30-day
/// retention removes seal 1's rows (one partition dropped whole at least)
/// and the unsealed old row, records both, and verify is clean, reporting
/// them as purged under the retention policy. A row of seal 3 removed by
/// the owner afterwards is reported missing.
async fn a_purge_of_old_months_verifies_clean_and_is_lawful_while_a_removed_row_is_missing(kind: Kind) {
    let db = TestDb::new(kind).await;
    if kind == Kind::Postgres {
        db.exec("UPDATE oncegate_retention_floor SET min_retention = interval '0'")
            .await;
        db.exec("SELECT oncegate_ensure_audit_partitions((now() - interval '400 days')::date, 0)")
            .await;
    }
    let store = db.open().await;
    let s = sealer(store.clone(), 1_000);
    append(&*store, "OLD-150", 3, days_ago(150.0)).await;
    append(&*store, "OLD-100", 2, days_ago(100.0)).await;
    seal_all(&s).await;
    append(&*store, "STRADDLE-75", 1, days_ago(75.0)).await;
    append(&*store, "STRADDLE-NOW", 1, OffsetDateTime::now_utc()).await;
    seal_all(&s).await;
    append(&*store, "NEW", 3, OffsetDateTime::now_utc()).await;
    seal_all(&s).await;
    append(&*store, "UNSEALED-200", 1, days_ago(200.0)).await;
    assert_eq!(db.scalar("SELECT count(*) FROM audit_seals").await, 3);

    let policy = RetentionPolicy {
        retention: Duration::from_secs(30 * DAY),
        outbox_retention: Duration::from_secs(DAY),
        batch_size: 2,
    };
    let report = Retention::new(store.clone(), policy).step().await.unwrap();
    assert_eq!(report.audit_deleted, 6, "seal 1's five rows and the unsealed one");
    let mut left = Vec::new();
    for award in ["OLD", "STRADDLE", "NEW", "UNSEALED"] {
        left.push(
            db.scalar(&format!(
                "SELECT count(*) FROM audit_log WHERE award_id LIKE '{award}%'"
            ))
            .await,
        );
    }
    assert_eq!(left, [0, 2, 3, 0]);
    assert_eq!(
        db.scalar("SELECT CAST(sum(row_count) AS BIGINT) FROM audit_purges WHERE seal_seq = 1")
            .await,
        5
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM audit_purges WHERE seal_seq IS NULL")
            .await,
        1
    );
    if kind == Kind::Postgres {
        let old = days_ago(150.0);
        let partition = format!("audit_log_{:04}_{:02}", old.year(), old.month() as u8);
        let exists = format!("SELECT count(*) FROM pg_class WHERE relname = '{partition}'");
        assert_eq!(db.scalar(&exists).await, 0, "{partition} dropped whole");
        let straddle = days_ago(75.0);
        let kept = format!("audit_log_{:04}_{:02}", straddle.year(), straddle.month() as u8);
        let exists = format!("SELECT count(*) FROM pg_class WHERE relname = '{kept}'");
        assert_eq!(
            db.scalar(&exists).await,
            1,
            "{kept} holds a row of seal 2, which stays"
        );
        let methods = db
            .scalar("SELECT count(*) FROM audit_purges WHERE method LIKE 'dropped partition %'")
            .await;
        assert!(methods >= 1);
    }

    let verified = verify(&*store).await;
    assert!(verified.is_clean(), "{verified}");
    assert_eq!(
        (verified.purged_seals, verified.purged_rows),
        (1, 5),
        "{verified}"
    );
    assert_eq!(verified.purged_unsealed_rows, 1, "{verified}");
    let text = verified.to_string();
    assert!(
        text.contains("purged under the retention policy: 5 rows (1 seal whole, 0 in part)"),
        "{text}"
    );
    assert!(text.contains("each kept at least 30days"), "{text}");
    assert!(text.contains("result: OK"), "{text}");
    // Exported, the purged seal travels with its purge records: both
    // verifiers accept it.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("after-purge.jsonl");
    export_whole_trail(&*store, &file).await;
    let exported = verify_file(&file).await;
    assert!(exported.is_clean() && exported.purged_seals == 1, "{exported}");
    let (code, out) = python(&[&file]);
    assert_eq!(code, 0, "{out}");
    // The last ten days: seals 2 and 3, continuing from seal 1's digest.
    let recent = TimeRange {
        from: Some(days_ago(10.0)),
        to: None,
    };
    let ranged = verify_store(&*store, &recent, Default::default(), &mut |_, _| {})
        .await
        .unwrap();
    let seal1 = db.scalar("SELECT count(*) FROM audit_seals WHERE seq = 1").await;
    assert_eq!(seal1, 1);
    assert!(ranged.is_clean(), "{ranged}");
    assert_eq!(
        (ranged.seals, ranged.anchor.as_ref().map(|a| a.0)),
        (Some((2, 3)), Some(1)),
        "{ranged}"
    );

    let new_row = db
        .scalar("SELECT min(id) FROM audit_log WHERE award_id LIKE 'NEW%'")
        .await;
    as_owner(&db, &format!("DELETE FROM audit_log WHERE id = {new_row}")).await;
    let verified = verify(&*store).await;
    assert_eq!(
        verified.findings,
        [Finding::RowRemoved { id: new_row, seal: 3 }],
        "{verified}"
    );
    assert_eq!(
        verified.purged_seals, 1,
        "seal 1 is still lawfully purged: {verified}"
    );

    // A purge record forged for a seal whose rows were not past the cutoff.
    let straddle = db
        .scalar("SELECT min(id) FROM audit_log WHERE award_id LIKE 'STRADDLE%'")
        .await;
    let (now, cutoff) = match kind {
        Kind::Postgres => ("now()".to_string(), "now() - interval '30 days'".to_string()),
        Kind::Sqlite => {
            let now = oncegate::time_fmt::to_micros(OffsetDateTime::now_utc());
            (now.to_string(), (now - 30 * DAY as i64 * 1_000_000).to_string())
        }
    };
    as_owner(
        &db,
        &format!(
            "DELETE FROM audit_log WHERE id = {straddle}; \
             INSERT INTO audit_purges (purged_at, cutoff, method, seal_seq, row_count, ids) \
             VALUES ({now}, {cutoff}, 'deleted rows', 2, 1, '{straddle}')"
        ),
    )
    .await;
    let verified = verify(&*store).await;
    assert!(
        matches!(&verified.findings[0], Finding::SealChanged { seal: 2, why }
            if why.starts_with("a purge record removed its rows at cutoff")),
        "{verified}"
    );
}

/// The window the seal boundary closes: a transaction takes an id (the
/// sequence's next value) and has not written its row when a later id
/// commits. The highest visible id then passes over it; the sealer must
/// wait, and defers when it outlives the wait. Once it commits, one seal
/// covers both rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_taken_by_an_open_transaction_holds_the_seal_until_it_commits() {
    let db = TestDb::new(Kind::Postgres).await;
    let store = db.open().await;
    append(&*store, "BEFORE", 1, OffsetDateTime::now_utc()).await;
    let mut held = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut held).await.unwrap();
    let id: i64 = sqlx::query_scalar("SELECT nextval(pg_get_serial_sequence('audit_log', 'id'))")
        .fetch_one(&mut held)
        .await
        .unwrap();
    append(&*store, "LATER", 1, OffsetDateTime::now_utc()).await;
    assert_eq!(
        db.scalar("SELECT max(id) FROM audit_log").await,
        id + 1,
        "a later id is visible"
    );

    let impatient = Sealer::new(store.clone(), settings(100, Duration::from_millis(300)));
    assert_eq!(impatient.step().await.unwrap(), SealRun::Deferred { writers: 1 });
    assert_eq!(
        db.scalar("SELECT count(*) FROM audit_seals").await,
        0,
        "nothing sealed past the open id"
    );

    let writer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        sqlx::query(
            "INSERT INTO audit_log (id, at, decision, key_prefix, award_id, instance) \
             OVERRIDING SYSTEM VALUE VALUES ($1, now(), 'processed', 'k', 'HELD', 'it')",
        )
        .bind(id)
        .execute(&mut held)
        .await
        .unwrap();
        sqlx::raw_sql("COMMIT").execute(&mut held).await.unwrap();
    });
    let patient = Sealer::new(store.clone(), settings(100, Duration::from_secs(10)));
    let run = patient.step().await.unwrap();
    writer.await.unwrap();
    assert!(
        matches!(
            run,
            SealRun::Sealed {
                seals: Some((1, 1)),
                rows: 3,
                ..
            }
        ),
        "{run:?}"
    );
    assert_each_row_sealed_once(&db).await;
    assert!(verify(&*store).await.is_clean());
}

/// One instance seals at a time: while another session holds the sealing
/// lock, a run is skipped, and the purge of audit rows waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_seals_at_a_time() {
    let db = TestDb::new(Kind::Postgres).await;
    let store = db.open().await;
    append(&*store, "A", 3, OffsetDateTime::now_utc()).await;
    let mut other = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(oncegate_seal_lock_key())")
        .execute(&mut other)
        .await
        .unwrap();
    let s = sealer(store.clone(), 100);
    assert_eq!(s.step().await.unwrap(), SealRun::Busy);
    let (code, out) = binary(&["audit", "seal", "--database-url", &db.url]).await;
    assert_eq!((code, out.trim()), (0, "skipped: another instance is sealing"));
    let purge = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .purge(&RetentionPolicy {
                    retention: Duration::from_secs(4 * 365 * DAY),
                    outbox_retention: Duration::from_secs(DAY),
                    batch_size: 100,
                })
                .await
        }
    });
    let waits = eventually(Duration::from_secs(30), || async {
        sessions_waiting_on_a_lock(&db).await > 0
    })
    .await;
    assert!(
        waits && !purge.is_finished(),
        "the purge waits for the sealing lock"
    );
    sqlx::query("SELECT pg_advisory_unlock(oncegate_seal_lock_key())")
        .execute(&mut other)
        .await
        .unwrap();
    assert!(purge.await.unwrap().unwrap().ran);
    let (code, out) = binary(&["audit", "seal", "--database-url", &db.url]).await;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with("sealed 3 audit rows into seal 1; latest digest: seal 1 "),
        "{out}"
    );
}

/// The application role, with exactly its grants, seals and verifies, but
/// cannot change or remove a seal nor write a purge record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_role_seals_but_cannot_change_seals_or_write_purge_records() {
    let db = TestDb::new(Kind::Postgres).await;
    let role = unique("og_seal_");
    db.exec(&format!("CREATE ROLE {role} LOGIN")).await;
    db.exec(&format!("SELECT oncegate_grant_app_role('{role}')"))
        .await;
    let (scheme, rest) = db.url.split_once("://").unwrap();
    let host = rest.split_once('@').map_or(rest, |(_, h)| h);
    let role_url = format!("{scheme}://{role}@{host}");
    let store = open_store(&role_url, 2).await.unwrap();
    append(&*store, "ROLE", 4, OffsetDateTime::now_utc()).await;
    let run = sealer(store.clone(), 100).step().await.unwrap();
    assert!(matches!(run, SealRun::Sealed { rows: 4, .. }), "{run:?}");
    assert!(verify(&*store).await.is_clean());
    let mut c = sqlx::PgConnection::connect(&role_url).await.unwrap();
    for sql in [
        "UPDATE audit_seals SET sealed_by = 'x'",
        "DELETE FROM audit_seals",
        "TRUNCATE audit_seals",
        "INSERT INTO audit_purges (purged_at, cutoff, method, row_count, ids) VALUES (now(), now(), 'x', 1, '1')",
        "SELECT oncegate_record_audit_purge(now(), 'x', 'unnest($3::bigint[]) AS p(id)', '{1}')",
    ] {
        let err = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
            .execute(&mut c)
            .await
            .expect_err(sql)
            .to_string();
        assert!(err.contains("permission denied"), "{sql}: {err}");
    }
    for sql in [
        "UPDATE audit_seals SET sealed_by = 'x'",
        "DELETE FROM audit_seals",
    ] {
        let err = db.try_exec(sql).await.expect_err(sql);
        assert!(err.contains("append-only"), "even the owner: {sql}: {err}");
    }
    drop((c, store));
    db.exec(&format!("DROP OWNED BY {role}")).await;
    db.exec(&format!("DROP ROLE {role}")).await;
}

/// `ONCEGATE_AUDIT_SEAL_INTERVAL=0s` switches sealing off in `serve`
/// (nothing is sealed, not even on shutdown); `oncegate audit seal` still
/// seals, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interval_of_zero_switches_sealing_off() {
    let db = TestDb::new(Kind::Sqlite).await;
    let mut args = serve_args(&db);
    args.audit_seal.audit_seal_interval = Duration::ZERO;
    let app = TestApp::spawn(args).await;
    let d = app
        .client()
        .await
        .submit(submission("AWD-OFF", TS, b"x", 1))
        .await
        .unwrap();
    assert_eq!(outcome(&d.into_inner()), Outcome::Claimed);
    app.shutdown().await;
    assert_eq!(db.scalar("SELECT count(*) FROM audit_seals").await, 0);
    let (code, out) = binary(&["audit", "seal", "--database-url", &db.url]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("sealed 1 audit row into seal 1"), "{out}");
}

/// `serve` verifies on its interval and reports mismatches as a gauge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reports_a_verification_mismatch_as_a_gauge() {
    let db = TestDb::new(Kind::Sqlite).await;
    let mut args = serve_args(&db);
    args.audit_seal.audit_seal_interval = Duration::from_millis(100);
    args.audit_seal.audit_verify_interval = Duration::from_millis(200);
    let app = TestApp::spawn(args).await;
    let d = app
        .client()
        .await
        .submit(submission("AWD-G", TS, b"x", 1))
        .await
        .unwrap();
    assert_eq!(outcome(&d.into_inner()), Outcome::Claimed);
    assert!(
        eventually(Duration::from_secs(10), || async {
            db.scalar("SELECT count(*) FROM audit_seals").await == 1
        })
        .await
    );
    as_owner(&db, "UPDATE audit_log SET award_id = 'FORGED'").await;
    let mismatches = || async { metric(&app.metrics().await, "oncegate_audit_verify_mismatches") };
    assert!(
        eventually(Duration::from_secs(10), || async {
            mismatches().await == Some(1.0)
        })
        .await,
        "{}",
        app.metrics().await
    );
    app.shutdown().await;
}

/// The sealer refuses what it cannot seal soundly, and says why: two rows
/// with one id (one written by hand) and an identity sequence that hands out
/// cached ids (a later id could then still commit below the boundary).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sealer_refuses_two_rows_with_one_id_and_a_caching_sequence() {
    let db = TestDb::new(Kind::Postgres).await;
    let store = db.open().await;
    append(&*store, "A", 2, OffsetDateTime::now_utc()).await;
    as_owner(
        &db,
        "INSERT INTO audit_log (id, at, decision, key_prefix, award_id, instance) OVERRIDING SYSTEM VALUE \
         VALUES (2, now() + interval '1 second', 'processed', 'k', 'TWIN', 'it')",
    )
    .await;
    let err = sealer(store.clone(), 100).step().await.unwrap_err().to_string();
    assert!(err.contains("id 2") && err.contains("written by hand"), "{err}");
    assert_eq!(db.scalar("SELECT count(*) FROM audit_seals").await, 0);
    db.exec("ALTER SEQUENCE audit_log_id_seq CACHE 10").await;
    let err = sealer(store, 100).step().await.unwrap_err().to_string();
    assert!(err.contains("caches values"), "{err}");
}

/// Signed seals against the owner's re-seal: four signed seals verify clean
/// with and without the public key. Then, as the owner past the guards, row
/// 3's award id is changed and every row tag, digest and previous digest is
/// recomputed from the published encoding and written back: the hash chain
/// alone verifies clean (exit 0), `--public-key` refuses it (exit 65,
/// naming seal 1, the changed one, first). A key that did not sign the
/// seals refuses them too.
async fn an_owners_full_reseal_passes_the_hash_chain_but_not_the_public_key(kind: Kind) {
    use oncegate::seal::signing::{self, Keyring};
    let db = TestDb::new(kind).await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("seal.key");
    let other = dir.path().join("other.key");
    let (code, out) = binary(&["audit", "keygen", "--out", key.to_str().unwrap()]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions()) & 0o777,
        0o600
    );
    signing::keygen(&other).unwrap();
    let (public, other_public) = (signing::public_path(&key), signing::public_path(&other));
    let store = db.open().await;
    append(&*store, "A", 40, OffsetDateTime::now_utc()).await;
    let mut signed = settings(10, Duration::from_secs(5));
    signed.signer = Some(Arc::new(signing::SealSigner::load(&key).unwrap()));
    seal_all(&Sealer::new(store.clone(), signed)).await;
    assert_eq!(
        db.scalar("SELECT count(*) FROM audit_seals WHERE signature IS NOT NULL")
            .await,
        4
    );
    let keys = Keyring::load(std::slice::from_ref(&public)).unwrap();
    let verify_with = |keys: Option<Keyring>| {
        let store = store.clone();
        async move {
            let checks = oncegate::seal::verify::Checks { keys, anchors: None };
            verify_store(&*store, &TimeRange::default(), checks, &mut |_, _| {})
                .await
                .unwrap()
        }
    };
    assert!(verify_with(Some(keys.clone())).await.is_clean());
    let with_key = [
        "audit",
        "verify",
        "--database-url",
        &db.url,
        "--public-key",
        public.to_str().unwrap(),
    ];
    let (code, out) = binary(&with_key).await;
    assert_eq!(code, 0, "{out}");

    // The owner's re-seal, from the published encoding.
    owner_reseals(&db, &*store, None).await;
    assert!(
        verify(&*store).await.is_clean(),
        "the hash chain alone cannot tell"
    );
    let (code, out) = binary(&["audit", "verify", "--database-url", &db.url]).await;
    assert_eq!(code, 0, "{out}");
    let report = verify_with(Some(keys)).await;
    assert!(
        matches!(
            report.findings.first(),
            Some(Finding::SignatureBad { seal: 1, .. })
        ),
        "{:?}",
        report.findings
    );
    assert_eq!(
        report.findings_total, 4,
        "every re-sealed seal: {:?}",
        report.findings
    );
    let (code, out) = binary(&with_key).await;
    assert_eq!(code, 65, "{out}");
    assert!(out.contains("first mismatch: seal 1 signature refused"), "{out}");

    // Another key: every seal refused, by name.
    let (code, out) = binary(&[
        "audit",
        "verify",
        "--database-url",
        &db.url,
        "--public-key",
        other_public.to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, 65, "{out}");
    assert!(out.contains("seal 1 signature refused: signed by key"), "{out}");
}

/// The owner, past the guards, changes row 3's award id and recomputes every
/// row tag, digest and previous digest from the published encoding; with
/// `forge`, signs each new digest with that key under that key id.
async fn owner_reseals(db: &TestDb, store: &dyn Store, forge: Option<(&ed25519_dalek::SigningKey, &str)>) {
    use ed25519_dalek::Signer;
    use oncegate::seal::canonical::{RowText, SealText};
    as_owner(db, "UPDATE audit_log SET award_id = 'FORGED' WHERE id = 3").await;
    let mut prev = "0".repeat(64);
    for seal in store.audit_seals(1, 100).await.unwrap() {
        let rows = store
            .audit_rows(
                oncegate::store::RowCursor::after_id(seal.first_id - 1),
                seal.last_id,
                100,
            )
            .await
            .unwrap();
        let hashes: Vec<[u8; 32]> = rows.iter().map(|r| RowText::from(r).hash()).collect();
        let mut text = SealText::from(&seal);
        text.prev_digest = prev.clone();
        let digest = text.digest_over(&hashes);
        let tags = hex::encode(hashes.iter().flat_map(|h| h[..4].to_vec()).collect::<Vec<u8>>());
        let tags = match db.kind {
            Kind::Postgres => format!("'\\x{tags}'::bytea"),
            Kind::Sqlite => format!("X'{tags}'"),
        };
        let signature = match forge {
            Some((key, id)) => {
                let sig = key.sign(&oncegate::seal::signing::signed_message(id, &digest));
                format!(", signature = '{}', key_id = '{id}'", hex::encode(sig.to_bytes()))
            }
            None => String::new(),
        };
        as_owner(
            db,
            &format!(
                "UPDATE audit_seals SET prev_digest = '{prev}', digest = '{digest}', row_tags = {tags}{signature} \
                 WHERE seq = {}",
                seal.seq
            ),
        )
        .await;
        prev = digest;
    }
}

/// Signed seals anchored to a file: four seals, four anchor lines; the
/// untouched chain passes `--public-key` and `--anchors` (exit 0). The
/// owner's full re-seal, each new digest signed with the owner's own key
/// under the sidecar's key id, verifies clean as a hash chain; `--public-key`
/// refuses every signature and `--anchors` every digest, each exit 65
/// naming seal 1 (the changed one) first. Signed under the owner's own key
/// id, the signatures are refused as by an unknown key. Then the newest seal
/// is cut off with its rows: `--anchors` names it missing.
async fn an_owners_reseal_and_a_cut_off_tail_are_caught_by_the_anchors_and_a_forged_signature_is_refused(
    kind: Kind,
) {
    use oncegate::seal::anchor::{AnchorFile, Anchors};
    use oncegate::seal::signing;
    let db = TestDb::new(kind).await;
    let dir = tempfile::tempdir().unwrap();
    let (key, anchors) = (dir.path().join("seal.key"), dir.path().join("anchors.jsonl"));
    let key_id = signing::keygen(&key).unwrap();
    let public = signing::public_path(&key);
    let store = db.open().await;
    append(&*store, "A", 40, OffsetDateTime::now_utc()).await;
    let mut anchored = settings(10, Duration::from_secs(5));
    anchored.signer = Some(Arc::new(signing::SealSigner::load(&key).unwrap()));
    anchored.anchors = Some(Arc::new(AnchorFile::open(&anchors).unwrap()));
    seal_all(&Sealer::new(store.clone(), anchored)).await;
    let read = Anchors::read(&anchors).unwrap();
    assert_eq!(read.by_seq.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3, 4]);
    assert_eq!(read.by_seq[&4][0].key_id.as_deref(), Some(key_id.as_str()));
    let run = |flag: &'static str, file: &Path| {
        let (url, file) = (db.url.clone(), file.to_str().unwrap().to_string());
        async move { binary(&["audit", "verify", "--database-url", &url, flag, &file]).await }
    };
    for (flag, file) in [("--public-key", &public), ("--anchors", &anchors)] {
        let (code, out) = run(flag, file).await;
        assert_eq!(code, 0, "nothing changed, {flag} passes: {out}");
    }
    let (_, out) = run("--anchors", &anchors).await;
    assert!(out.contains("4 seals"), "{out}");
    let python_checks = |export: &Path| {
        let (k, a) = (Path::new("--public-key"), Path::new("--anchors"));
        [python(&[k, &public, export]), python(&[a, &anchors, export])]
    };
    let before = dir.path().join("before.jsonl");
    export_whole_trail(&*store, &before).await;
    for (code, out) in python_checks(&before) {
        assert_eq!(code, 0, "the Python script passes the untouched export: {out}");
    }

    let forger = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
    owner_reseals(&db, &*store, Some((&forger, &key_id))).await;
    let (code, out) = binary(&["audit", "verify", "--database-url", &db.url]).await;
    assert_eq!(code, 0, "the hash chain alone cannot tell: {out}");
    let (code, out) = run("--public-key", &public).await;
    assert_eq!(code, 65, "{out}");
    assert!(
        out.contains(&format!(
            "first mismatch: seal 1 signature refused: its signature by key {key_id} does not verify"
        )),
        "{out}"
    );
    assert!(out.contains("FAILED (4 mismatches)"), "{out}");
    let (code, out) = run("--anchors", &anchors).await;
    assert_eq!(code, 65, "{out}");
    assert!(
        out.contains("first mismatch: seal 1 does not match its anchor: digest "),
        "{out}"
    );
    assert!(out.contains("FAILED (4 mismatches)"), "{out}");
    let after = dir.path().join("after.jsonl");
    export_whole_trail(&*store, &after).await;
    let [(kc, kout), (ac, aout)] = python_checks(&after);
    assert_eq!(
        (kc, kout.trim()),
        (
            65,
            format!("FAILED: seal 1 signature by key {key_id} does not verify").as_str()
        )
    );
    assert_eq!(
        (ac, aout.trim()),
        (65, "FAILED: seal 1 does not match its anchor: digest differs")
    );
    let (code, out) = python(&[&after]);
    assert_eq!(
        code, 0,
        "without keys or anchors the re-sealed export passes: {out}"
    );

    // The owner's own key id: an unknown key.
    let forger_id = signing::key_id(&forger.verifying_key());
    owner_reseals(&db, &*store, Some((&forger, &forger_id))).await;
    let (code, out) = run("--public-key", &public).await;
    assert_eq!(code, 65, "{out}");
    assert!(
        out.contains(&format!(
            "first mismatch: seal 1 signature refused: signed by key {forger_id}, which is not among the given public keys"
        )),
        "{out}"
    );

    // The newest seal cut off together with its rows.
    as_owner(
        &db,
        "DELETE FROM audit_log WHERE id BETWEEN 31 AND 40; DELETE FROM audit_seals WHERE seq = 4",
    )
    .await;
    let (code, out) = binary(&["audit", "verify", "--database-url", &db.url]).await;
    assert_eq!(code, 0, "the chain alone cannot tell a cut-off tail: {out}");
    let (code, out) = run("--anchors", &anchors).await;
    assert_eq!(code, 65, "{out}");
    assert!(
        out.contains("MISMATCH seal 4 missing: anchored outside the database, but the chain ends at seal 3"),
        "{out}"
    );
}

/// The relay publishes each seal as an `audit.sealed` event (pseudo-award
/// `|audit`, sequence = the seal's number), and the sealer appends it to the
/// anchor file. A sidecar seals on its own, twice: its schedule seals a
/// claim's row, and shutdown the four cache duplicates of it that the audit
/// queue writes in its drain (as a loaded machine splits a sidecar's rows
/// between seals). The next start relays the events to a Redis stream. `audit verify --anchors` with the
/// file and with `redis://… --stream` is clean (exit 0, both seals
/// compared) and reconcile is clean, the events noted as another type.
/// After the owner changes row 3 and re-seals the whole chain, exit 65
/// naming seal 2, which holds row 3; seal 1, which does not, still matches.
async fn seals_reach_the_broker_as_audit_sealed_events_that_anchor_the_chain_and_reconcile_accepts(
    kind: Kind,
) {
    let db = TestDb::new(kind).await;
    let dir = tempfile::tempdir().unwrap();
    let anchors = dir.path().join("anchors.jsonl").to_str().unwrap().to_string();
    let stream = unique("og-it-anchor-");
    let env = [
        ("DATABASE_URL", db.url.clone()),
        ("ONCEGATE_RELAY_SINK", redis_url()),
        ("ONCEGATE_RELAY_STREAM", stream.clone()),
        ("ONCEGATE_RELAY_POLL", "100ms".to_string()),
        ("ONCEGATE_AUDIT_ANCHOR_FILE", anchors.clone()),
        ("ONCEGATE_AUDIT_SEAL_INTERVAL", "100ms".to_string()),
        // Cache duplicates reach the table only in the shutdown drain.
        ("ONCEGATE_AUDIT_FLUSH_INTERVAL", "1h".to_string()),
    ];
    let sidecar = Sidecar::start(&env).await;
    let mut c = sidecar.client().await;
    let claim = submission("AWD-ANCHOR", TS, b"p0", 10);
    let first = c.submit(claim.clone()).await.unwrap().into_inner();
    assert_eq!(outcome(&first), Outcome::Claimed);
    let sealed = "SELECT count(*) FROM audit_seals";
    assert!(
        eventually(Duration::from_secs(15), || async { db.scalar(sealed).await == 1 }).await,
        "the schedule seals the claim's row"
    );
    for _ in 1..5 {
        let dup = c.submit(claim.clone()).await.unwrap().into_inner();
        assert_eq!(
            (outcome(&dup), tier(&dup)),
            (Outcome::Duplicate, Tier::LocalCache)
        );
    }
    assert!(sidecar.terminate().await.success());
    let ranges = "SELECT count(*) FROM audit_seals WHERE (seq = 1 AND first_id = 1 AND last_id = 1) \
                  OR (seq = 2 AND first_id = 2 AND last_id = 5)";
    assert_eq!((db.scalar(sealed).await, db.scalar(ranges).await), (2, 2));
    let event = "SELECT count(*) FROM outbox WHERE event_type = 'audit.sealed' AND award_id = '|audit' AND sequence IN (1, 2)";
    assert_eq!(db.scalar(event).await, 2);
    let again = Sidecar::start(&env[..4]).await;
    let published = "SELECT count(*) FROM outbox WHERE published_at IS NULL";
    assert!(
        eventually(Duration::from_secs(15), || async {
            db.scalar(published).await == 0
        })
        .await
    );
    assert!(again.terminate().await.success());

    let file = [
        "audit",
        "verify",
        "--database-url",
        &db.url,
        "--anchors",
        &anchors,
    ];
    let (code, out) = binary(&file).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(": 2 seals\n"), "{out}");
    let url = redis_url();
    let verify = [
        "audit",
        "verify",
        "--database-url",
        &db.url,
        "--anchors",
        &url,
        "--stream",
        &stream,
    ];
    let (code, out) = binary(&verify).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("compared with their anchors in the broker"), "{out}");
    assert!(out.contains(": 2 seals\n"), "{out}");
    let reconcile = [
        "reconcile",
        "--database-url",
        &db.url,
        "--sink",
        &url,
        "--stream",
        &stream,
    ];
    let (code, out) = binary(&reconcile).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("other"), "the audit.sealed event is noted: {out}");

    let store = db.open().await;
    owner_reseals(&db, &*store, None).await;
    for (code, out) in [binary(&verify).await, binary(&file).await] {
        assert_eq!(code, 65, "{out}");
        assert!(
            out.contains("first mismatch: seal 2 does not match its anchor: digest "),
            "{out}"
        );
        assert!(out.contains("FAILED (1 mismatch)"), "{out}");
    }
}

/// The sidecar seals every 50 ms into seals of at most 3 rows (signed, to an
/// anchor file and, through the relay, to a Redis stream) while claims and
/// cache duplicates (flushed every 20 ms) arrive and `oncegate audit seal`
/// runs again and again with the same key and anchor file; shutdown seals a
/// last time. Every row is in one seal, the sidecar and the command each
/// made seals, and every seal matches its anchor in the file and in the
/// broker (exit 0, each seal compared).
async fn racing_sidecar_and_command_seals_each_match_their_anchors_in_the_file_and_the_broker(kind: Kind) {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let db = TestDb::new(kind).await;
    let dir = tempfile::tempdir().unwrap();
    let (key, anchors) = (dir.path().join("seal.key"), dir.path().join("anchors.jsonl"));
    oncegate::seal::signing::keygen(&key).unwrap();
    let (key, anchors) = (
        key.to_str().unwrap().to_string(),
        anchors.to_str().unwrap().to_string(),
    );
    let stream = unique("og-it-race-");
    let mut env = vec![
        ("DATABASE_URL", db.url.clone()),
        ("ONCEGATE_INSTANCE_ID", "sidecar".to_string()),
        ("ONCEGATE_RELAY_SINK", redis_url()),
        ("ONCEGATE_RELAY_STREAM", stream.clone()),
        ("ONCEGATE_RELAY_POLL", "50ms".to_string()),
        ("ONCEGATE_AUDIT_FLUSH_INTERVAL", "20ms".to_string()),
        ("ONCEGATE_AUDIT_SEAL_MAX_ROWS", "3".to_string()),
        ("ONCEGATE_AUDIT_SIGNING_KEY_FILE", key.clone()),
        ("ONCEGATE_AUDIT_ANCHOR_FILE", anchors.clone()),
        ("ONCEGATE_AUDIT_SEAL_INTERVAL", "50ms".to_string()),
    ];
    let sidecar = Sidecar::start(&env).await;
    // Traffic goes on until the command has sealed some of it.
    let command_sealed = AtomicBool::new(false);
    let traffic = async {
        let mut c = sidecar.client().await;
        for i in 0.. {
            if i >= 24 && command_sealed.load(Relaxed) {
                break;
            }
            assert!(i < 1_000, "the command never sealed a row");
            let s = submission(&format!("AWD-RACE-{i}"), TS, b"p", 10);
            for _ in 0..3 {
                c.submit(s.clone()).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let seal_args = [
        "audit",
        "seal",
        "--database-url",
        db.url.as_str(),
        "--instance-id",
        "command",
        "--audit-seal-max-rows",
        "3",
        "--audit-signing-key-file",
        key.as_str(),
        "--audit-anchor-file",
        anchors.as_str(),
    ];
    let command = async {
        for run in 0.. {
            if run >= 8 && command_sealed.load(Relaxed) {
                break;
            }
            let (code, out) = binary(&seal_args).await;
            assert!(code == 0 || code == 75, "{out}");
            if out.starts_with("sealed ") {
                command_sealed.store(true, Relaxed);
            }
        }
    };
    tokio::join!(traffic, command);
    assert!(sidecar.terminate().await.success());
    assert_each_row_sealed_once(&db).await;
    let by = |who: &str| format!("SELECT count(*) FROM audit_seals WHERE sealed_by = '{who}'");
    let (sidecars, commands) = (db.scalar(&by("sidecar")).await, db.scalar(&by("command")).await);
    assert!(
        sidecars >= 2 && commands >= 1,
        "{sidecars} by the sidecar, {commands} by the command"
    );
    let seals = sidecars + commands;

    env.pop(); // the next start relays, and seals nothing
    let again = Sidecar::start(&env).await;
    let published = "SELECT count(*) FROM outbox WHERE published_at IS NULL";
    assert!(
        eventually(Duration::from_secs(15), || async {
            db.scalar(published).await == 0
        })
        .await
    );
    assert!(again.terminate().await.success());
    let url = redis_url();
    for source in [anchors.as_str(), url.as_str()] {
        let verify = [
            "audit",
            "verify",
            "--database-url",
            &db.url,
            "--anchors",
            source,
            "--stream",
            &stream,
        ];
        let (code, out) = binary(&verify).await;
        assert_eq!(code, 0, "{out}");
        assert!(
            out.contains(&format!(": {seals} seals\n")),
            "every seal compared: {out}"
        );
    }
}
