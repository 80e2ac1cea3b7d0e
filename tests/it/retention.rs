//! The durable trail: the audit log and the ledger refuse UPDATE and DELETE
//! (Postgres also by privilege, for a role with exactly the documented
//! grants), the retention purge removes exactly what is older than the
//! retention and nothing newer, one instance purges at a time, a purged
//! claim's late redelivery is still a duplicate, and cache-answered
//! duplicates reach the audit log, also on shutdown.

use crate::helpers::*;
use oncegate::audit::AuditQueue;
use oncegate::pb::{Outcome, Tier};
use oncegate::retention::Retention;
use oncegate::store::{AuditDecision, AuditEntry, RetentionPolicy};
use sqlx::Connection;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;

on_both_stores!(
    audit_log_and_ledger_reject_update_and_delete,
    purge_removes_exactly_the_rows_older_than_retention,
    late_redelivery_after_the_real_purge_is_not_double_posted,
    local_cache_duplicates_are_audited_and_flushed_on_shutdown,
    redis_duplicates_are_audited,
);

const TS: &str = "2026-11-29T10:00:00Z";
const DAY: u64 = 86_400;
/// The advisory lock key in `src/store/postgres.rs` ("oncegate").
const PURGE_LOCK: i64 = 0x6f6e_6365_6761_7465;

fn policy(retention_days: u64, outbox_days: u64, batch: i64) -> RetentionPolicy {
    RetentionPolicy {
        retention: Duration::from_secs(retention_days * DAY),
        outbox_retention: Duration::from_secs(outbox_days * DAY),
        batch_size: batch,
    }
}

/// Lowers the database's retention floor (an owner decision; 3 years by
/// default) so a test can purge with a short retention. SQLite has no floor.
async fn lower_the_retention_floor(db: &TestDb) {
    if db.kind == Kind::Postgres {
        db.exec("UPDATE oncegate_retention_floor SET min_retention = interval '0'")
            .await;
    }
}

/// A timestamp `secs` seconds ago, as a SQL expression of the column's type.
fn ago(kind: Kind, secs: i64) -> String {
    match kind {
        Kind::Postgres => format!("(now() - interval '{secs} seconds')"),
        Kind::Sqlite => {
            format!("(CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER) - {secs} * 1000000)")
        }
    }
}

fn audit_row(award: &str, at: OffsetDateTime) -> AuditEntry {
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

async fn count_where(db: &TestDb, table: &str, cond: &str) -> i64 {
    db.scalar(&format!("SELECT count(*) FROM {table} WHERE {cond}"))
        .await
}

/// Claims `n` submissions of `award` through the real server.
async fn claim(app: &TestApp, award: &str, n: usize) {
    let mut c = app.client().await;
    for i in 0..n {
        let d = c
            .submit(submission(award, TS, format!("{award}-{i}").as_bytes(), 1_000))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(outcome(&d), Outcome::Claimed);
    }
}

async fn audit_log_and_ledger_reject_update_and_delete(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    claim(&app, "AWD-U", 2).await;
    app.shutdown().await;
    let before = db.counts().await;
    assert_eq!((before.disbursements, before.audit_processed), (2, 2));
    for sql in [
        "UPDATE audit_log SET award_id = 'forged'",
        "UPDATE audit_log SET decision = 'rejected'",
        "DELETE FROM audit_log",
        "UPDATE disbursements SET amount_cents = 1",
        "DELETE FROM disbursements",
    ] {
        let err = db.try_exec(sql).await.expect_err(sql);
        assert!(err.contains("append-only"), "{sql}: {err}");
    }
    assert_eq!(db.counts().await, before, "nothing changed");
    assert_eq!(count_where(&db, "audit_log", "award_id = 'forged'").await, 0);
    assert_eq!(count_where(&db, "disbursements", "amount_cents = 1").await, 0);
}

/// Claims, audit rows and outbox rows on both sides of every cutoff; the
/// purge (in batches of 2) removes exactly the older ones.
async fn purge_removes_exactly_the_rows_older_than_retention(kind: Kind) {
    let db = TestDb::new(kind).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    for (award, n) in [("OLD", 3), ("EDGE-OUT", 1), ("EDGE-IN", 1), ("NEW", 2)] {
        claim(&app, award, n).await;
    }
    app.shutdown().await;
    let store = db.open().await;
    let hour = 3_600;
    let month = 30 * DAY as i64;
    for (award, age) in [
        ("OLD", 40 * DAY as i64),
        ("EDGE-OUT", month + hour),
        ("EDGE-IN", month - hour),
    ] {
        db.exec(&format!(
            "UPDATE processed_messages SET claimed_at = {} WHERE award_id = '{award}'",
            ago(kind, age)
        ))
        .await;
    }
    let mut rows: Vec<AuditEntry> = (0..5).map(|_| audit_row("A-OLD", days_ago(400.0))).collect();
    rows.push(audit_row("A-EDGE-OUT", days_ago(30.0 + 1.0 / 24.0)));
    rows.push(audit_row("A-EDGE-IN", days_ago(30.0 - 1.0 / 24.0)));
    rows.push(audit_row("A-NEW", OffsetDateTime::now_utc()));
    store.append_audit(&rows).await.unwrap();
    // Outbox: created and published 2 days ago (goes), published now
    // (stays), never published though 40 days old (stays: the relay still
    // owes it).
    db.exec(&format!(
        "UPDATE outbox SET created_at = {0}, published_at = {0} WHERE award_id IN ('OLD', 'EDGE-OUT')",
        ago(kind, 2 * DAY as i64)
    ))
    .await;
    db.exec(&format!(
        "UPDATE outbox SET published_at = {} WHERE award_id = 'NEW'",
        ago(kind, 0)
    ))
    .await;
    db.exec(&format!(
        "UPDATE outbox SET created_at = {} WHERE award_id = 'EDGE-IN'",
        ago(kind, 40 * DAY as i64)
    ))
    .await;

    lower_the_retention_floor(&db).await;
    let retention = Retention::new(store.clone(), policy(30, 1, 2));
    let report = retention.step().await.unwrap();
    assert!(report.ran);
    assert_eq!(
        (report.claims_deleted, report.audit_deleted, report.outbox_deleted),
        (4, 6, 4)
    );
    let oldest = report.oldest_claim_age.expect("claims remain").as_secs();
    assert!(
        oldest > 29 * DAY && oldest < 30 * DAY,
        "oldest claim left is EDGE-IN: {oldest}s"
    );
    for (award, claims, ledger) in [
        ("OLD", 0, 3),
        ("EDGE-OUT", 0, 1),
        ("EDGE-IN", 1, 1),
        ("NEW", 2, 2),
    ] {
        let cond = format!("award_id = '{award}'");
        assert_eq!(
            count_where(&db, "processed_messages", &cond).await,
            claims,
            "claims of {award}"
        );
        assert_eq!(
            count_where(&db, "disbursements", &cond).await,
            ledger,
            "the ledger is never purged"
        );
    }
    for (award, left) in [("A-OLD", 0), ("A-EDGE-OUT", 0), ("A-EDGE-IN", 1), ("A-NEW", 1)] {
        assert_eq!(
            count_where(&db, "audit_log", &format!("award_id = '{award}'")).await,
            left,
            "audit rows of {award}"
        );
    }
    assert_eq!(
        db.counts().await.audit_processed,
        7,
        "this month's audit rows stay"
    );
    assert_eq!(
        count_where(&db, "outbox", "award_id IN ('OLD', 'EDGE-OUT')").await,
        0
    );
    assert_eq!(
        count_where(&db, "outbox", "award_id IN ('EDGE-IN', 'NEW')").await,
        3
    );
    let n = db.counts().await;
    assert_eq!(
        (n.disbursements, n.balance_cents),
        (7, 7_000),
        "the ledger is untouched"
    );

    let again = retention.step().await.unwrap();
    assert_eq!(
        (
            again.ran,
            again.claims_deleted,
            again.audit_deleted,
            again.outbox_deleted
        ),
        (true, 0, 0, 0),
        "a second run finds nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_partitions_older_than_retention_are_dropped_whole() {
    let db = TestDb::new(Kind::Postgres).await;
    assert_eq!(
        db.scalar("SELECT count(*) FROM pg_inherits WHERE inhparent = 'audit_log'::regclass")
            .await,
        5,
        "the migration made this month's and the next three months' partitions, and the default"
    );
    let created = db
        .scalar("SELECT CAST(oncegate_ensure_audit_partitions('2020-01-01', 0) AS BIGINT)")
        .await;
    assert!(created > 60, "monthly partitions from 2020 on: {created}");
    let store = db.open().await;
    let retention_days = 400;
    let cutoff = days_ago(retention_days as f64);
    let at = |s: &str| OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap();
    let mut rows: Vec<AuditEntry> = (0..3)
        .map(|_| audit_row("IN-2020-03", at("2020-03-15T12:00:00Z")))
        .collect();
    // Before every partition: the default partition, deleted row by row.
    rows.extend((0..2).map(|_| audit_row("DEFAULT-OLD", at("2019-06-01T00:00:00Z"))));
    // The boundary month: one row either side of the cutoff.
    rows.push(audit_row("EDGE-OUT", cutoff - Duration::from_secs(3_600)));
    rows.push(audit_row("EDGE-IN", cutoff + Duration::from_secs(3_600)));
    // Beyond the partitions made ahead: the default partition, kept.
    rows.push(audit_row(
        "DEFAULT-FUTURE",
        OffsetDateTime::now_utc() + Duration::from_secs(700 * DAY),
    ));
    rows.push(audit_row("NOW", OffsetDateTime::now_utc()));
    store.append_audit(&rows).await.unwrap();
    assert_eq!(
        db.scalar("SELECT count(*) FROM audit_log_default").await,
        3,
        "rows outside every month land in the default partition"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM audit_log_2020_03").await, 3);

    lower_the_retention_floor(&db).await;
    let report = Retention::new(store, policy(retention_days, 7, 2))
        .step()
        .await
        .unwrap();
    assert_eq!(report.audit_deleted, 6);
    let partition_exists =
        |name: String| format!("SELECT count(*) FROM pg_class WHERE relname = '{name}' AND relkind = 'r'");
    assert_eq!(
        db.scalar(&partition_exists("audit_log_2020_03".into())).await,
        0,
        "dropped whole"
    );
    let edge = cutoff + Duration::from_secs(3_600);
    let edge_partition = format!("audit_log_{:04}_{:02}", edge.year(), edge.month() as u8);
    assert_eq!(
        db.scalar(&partition_exists(edge_partition)).await,
        1,
        "the boundary month stays"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = 'audit_log'::regclass AND c.relname ~ '^audit_log_[0-9]{{4}}_[0-9]{{2}}$' \
               AND to_date(substr(c.relname, 11), 'YYYY_MM') + interval '1 month' \
                   <= now() - interval '{retention_days} days'"
        ))
        .await,
        0,
        "no partition wholly older than the retention is left"
    );
    for (award, left) in [
        ("IN-2020-03", 0),
        ("DEFAULT-OLD", 0),
        ("EDGE-OUT", 0),
        ("EDGE-IN", 1),
        ("DEFAULT-FUTURE", 1),
        ("NOW", 1),
    ] {
        assert_eq!(
            count_where(&db, "audit_log", &format!("award_id = '{award}'")).await,
            left,
            "audit rows of {award}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_purges_at_a_time() {
    let db = TestDb::new(Kind::Postgres).await;
    let app = TestApp::spawn(serve_args(&db)).await;
    claim(&app, "AWD-LOCK", 1).await;
    app.shutdown().await;
    db.exec(&format!(
        "UPDATE processed_messages SET claimed_at = {}",
        ago(Kind::Postgres, 40 * DAY as i64)
    ))
    .await;
    let retention = Retention::new(db.open().await, policy(30, 1, 100));

    let mut other = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(PURGE_LOCK)
        .execute(&mut other)
        .await
        .unwrap();
    let skipped = retention.step().await.unwrap();
    assert!(!skipped.ran, "another instance holds the purge lock");
    assert_eq!(skipped.claims_deleted, 0);
    assert_eq!(
        db.counts().await.claims,
        1,
        "nothing purged while the lock is held"
    );

    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(PURGE_LOCK)
        .execute(&mut other)
        .await
        .unwrap();
    let ran = retention.step().await.unwrap();
    assert!(ran.ran);
    assert_eq!(ran.claims_deleted, 1);
    assert_eq!(db.counts().await.claims, 0);
    // The lock is released after a run: the other instance can take it now.
    let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
        .bind(PURGE_LOCK)
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert!(free, "the purge released its lock");
}

async fn late_redelivery_after_the_real_purge_is_not_double_posted(kind: Kind) {
    let db = TestDb::new(kind).await;
    let s = submission("AWD-LATE", TS, b"three years later", 7_700);
    let app = TestApp::spawn(serve_args(&db)).await;
    let first = app.client().await.submit(s.clone()).await.unwrap().into_inner();
    assert_eq!(outcome(&first), Outcome::Claimed);
    app.shutdown().await;
    db.exec(&format!(
        "UPDATE processed_messages SET claimed_at = {}",
        ago(kind, (3 * 365 + 10) * DAY as i64)
    ))
    .await;
    let report = Retention::new(db.open().await, serve_args(&db).retention.policy().unwrap())
        .step()
        .await
        .unwrap();
    assert_eq!(report.claims_deleted, 1, "the default retention purged the claim");
    assert_eq!(db.counts().await.claims, 0);

    // A fresh instance: nothing cached anywhere, the claim gone.
    let app = TestApp::spawn(serve_args(&db)).await;
    let late = app.client().await.submit(s).await.unwrap().into_inner();
    assert_eq!(outcome(&late), Outcome::Duplicate);
    assert_eq!(
        late.disbursement, first.disbursement,
        "the ledger's stored result"
    );
    app.shutdown().await;
    let n = db.counts().await;
    assert_eq!(
        (n.disbursements, n.balance_cents, n.outbox),
        (1, 7_700, 1),
        "not double-posted"
    );
    assert_eq!(n.claims, 1, "the claim is restored");
}

async fn local_cache_duplicates_are_audited_and_flushed_on_shutdown(kind: Kind) {
    let db = TestDb::new(kind).await;
    let mut args = serve_args(&db);
    // Only the shutdown drain can write the rows before the test ends.
    args.audit_flush_interval = Duration::from_secs(3_600);
    let app = TestApp::spawn(args).await;
    let mut c = app.client().await;
    let s = submission("AWD-L1", TS, b"cached", 300);
    assert_eq!(
        outcome(&c.submit(s.clone()).await.unwrap().into_inner()),
        Outcome::Claimed
    );
    for _ in 0..3 {
        let d = c.submit(s.clone()).await.unwrap().into_inner();
        assert_eq!((outcome(&d), tier(&d)), (Outcome::Duplicate, Tier::LocalCache));
    }
    assert_eq!(db.counts().await.audit_duplicate, 0, "queued, not yet written");
    app.shutdown().await;
    let n = db.counts().await;
    assert_eq!((n.audit_processed, n.audit_duplicate), (1, 3));
    assert_eq!(
        count_where(
            &db,
            "audit_log",
            "decision = 'duplicate' AND tier = 'LOCAL_CACHE' AND award_id = 'AWD-L1'"
        )
        .await,
        3
    );
}

async fn redis_duplicates_are_audited(kind: Kind) {
    let db = TestDb::new(kind).await;
    let prefix = unique("og-it-audit-");
    let one = TestApp::spawn(with_redis(serve_args(&db), &redis_url(), &prefix)).await;
    let two = TestApp::spawn(with_redis(serve_args(&db), &redis_url(), &prefix)).await;
    let s = submission("AWD-L2", TS, b"shared", 400);
    let first = one.client().await.submit(s.clone()).await.unwrap().into_inner();
    assert_eq!(outcome(&first), Outcome::Claimed);
    let dup = two.client().await.submit(s).await.unwrap().into_inner();
    assert_eq!((outcome(&dup), tier(&dup)), (Outcome::Duplicate, Tier::Redis));
    // Flushed on the interval, without a shutdown.
    let arrived = eventually(Duration::from_secs(10), || async {
        count_where(&db, "audit_log", "decision = 'duplicate' AND tier = 'REDIS'").await == 1
    })
    .await;
    assert!(arrived, "the REDIS duplicate's audit row arrived");
    one.shutdown().await;
    two.shutdown().await;
    let n = db.counts().await;
    assert_eq!((n.audit_processed, n.audit_duplicate, n.disbursements), (1, 1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_audit_queue_counts_what_it_drops() {
    let db = TestDb::new(Kind::Sqlite).await;
    let _ = oncegate::metrics::handle();
    let dropped = || {
        metric(
            &oncegate::metrics::handle().render(),
            "oncegate_audit_dropped_total",
        )
        .unwrap_or(0.0)
    };
    let before = dropped();
    let (queue, mut flusher) = AuditQueue::new(2, db.open().await, 10, Duration::from_secs(3_600));
    for award in ["Q-1", "Q-2", "Q-3"] {
        queue.record(audit_row(award, OffsetDateTime::now_utc()));
    }
    assert!(dropped() >= before + 1.0, "the third row is counted as dropped");
    assert_eq!(flusher.step().await, 2);
    assert_eq!(db.counts().await.audit_duplicate, 2);
    assert_eq!(count_where(&db, "audit_log", "award_id = 'Q-3'").await, 0);
    queue.record(audit_row("Q-4", OffsetDateTime::now_utc()));
    flusher.drain().await;
    assert_eq!(
        count_where(&db, "audit_log", "award_id = 'Q-4'").await,
        1,
        "drained"
    );
}

fn url_as(url: &str, role: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let host = rest.split_once('@').map(|(_, h)| h).unwrap_or(rest);
    format!("{scheme}://{role}@{host}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn app_role_with_the_documented_grants_cannot_change_the_trail_but_can_purge() {
    let db = TestDb::new(Kind::Postgres).await;
    db.exec("SELECT oncegate_ensure_audit_partitions('2020-01-01', 0)")
        .await;
    let role = unique("og_app_");
    let grants = documented_grants(&role);
    assert!(grants.len() >= 7, "GRANTS.md lists the grants: {grants:?}");
    db.exec(&format!("CREATE ROLE {role} LOGIN")).await;
    for g in &grants {
        db.exec(g).await;
    }
    let role_url = url_as(&db.url, &role);

    // The whole claim path, and the audit flush, as the role.
    let mut args = serve_args(&db);
    args.store.database_url = Some(role_url.clone());
    args.migrate_on_start = false;
    let app = TestApp::spawn(args).await;
    claim(&app, "AWD-ROLE", 2).await;
    let s = submission("AWD-ROLE", TS, b"AWD-ROLE-0", 1_000);
    let dup = app.client().await.submit(s).await.unwrap().into_inner();
    assert_eq!(outcome(&dup), Outcome::Duplicate);
    app.shutdown().await;
    let n = db.counts().await;
    assert_eq!((n.disbursements, n.audit_processed, n.audit_duplicate), (2, 2, 1));

    let mut conn = sqlx::PgConnection::connect(&role_url).await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO audit_log (decision, key_prefix, award_id, instance) \
         VALUES ('rejected', 'x', 'AWD-ROLE', 'it')",
    )
    .execute(&mut conn)
    .await
    .expect("INSERT is granted");
    let seen: i64 = sqlx::query_scalar("SELECT count(*) FROM audit_log")
        .fetch_one(&mut conn)
        .await
        .expect("SELECT is granted");
    assert_eq!(seen, 4);
    for sql in [
        "UPDATE audit_log SET award_id = 'forged'",
        "DELETE FROM audit_log",
        "DELETE FROM audit_log_default",
        "TRUNCATE audit_log",
        "UPDATE disbursements SET amount_cents = 1",
        "DELETE FROM disbursements",
        "SET oncegate.purge = 'on'; DELETE FROM audit_log",
        "UPDATE oncegate_retention_floor SET min_retention = interval '0'",
    ] {
        let err = sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
            .execute(&mut conn)
            .await
            .expect_err(sql)
            .to_string();
        assert!(err.contains("permission denied"), "{sql}: {err}");
    }
    // The purge functions clamp any cutoff to the owner's retention floor:
    // a cutoff in the future removes nothing younger than three years.
    for sql in [
        "SELECT oncegate_purge_audit_rows(now() + interval '100 years', 1000000)",
        "SELECT oncegate_drop_audit_partitions(now() + interval '100 years')",
    ] {
        let removed: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string()))
            .fetch_one(&mut conn)
            .await
            .expect(sql);
        assert_eq!(removed, 0, "{sql}");
    }
    drop(conn);
    assert_eq!(db.counts().await.audit_rejected, 1);
    assert_eq!(
        db.scalar("SELECT count(*) FROM audit_log").await,
        4,
        "the trail is intact"
    );
    assert_eq!(count_where(&db, "audit_log", "award_id = 'forged'").await, 0);

    // Retention still works for the role, through the SECURITY DEFINER functions.
    let store = open_store(&role_url, 2).await.unwrap();
    let at = |s: &str| OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap();
    store
        .append_audit(&[
            audit_row("OLD-PARTITION", at("2020-03-15T12:00:00Z")),
            audit_row("OLD-DEFAULT", at("2019-06-01T00:00:00Z")),
        ])
        .await
        .unwrap();
    db.exec(&format!(
        "UPDATE processed_messages SET claimed_at = {}",
        ago(Kind::Postgres, 40 * DAY as i64)
    ))
    .await;
    let report = Retention::new(store.clone(), policy(30, 1, 100))
        .step()
        .await
        .unwrap();
    assert_eq!(
        (report.ran, report.claims_deleted, report.audit_deleted),
        (true, 2, 2)
    );
    assert_eq!(
        count_where(&db, "pg_class", "relname = 'audit_log_2020_03'").await,
        0
    );
    assert_eq!(count_where(&db, "audit_log", "award_id LIKE 'OLD-%'").await, 0);
    assert_eq!(db.counts().await.audit_processed, 2, "recent rows stay");
    drop(store);

    db.exec(&format!("DROP OWNED BY {role}")).await;
    db.exec(&format!("DROP ROLE {role}")).await;
}

async fn run_purge(db: &TestDb) -> (std::process::ExitStatus, String) {
    let out = tokio::process::Command::new(oncegate_bin())
        .arg("purge")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("DATABASE_URL", &db.url)
        .env("ONCEGATE_RETENTION", "30days")
        .output()
        .await
        .expect("oncegate purge");
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_subcommand_purges_once_or_skips_while_another_instance_purges() {
    let db = TestDb::new(Kind::Postgres).await;
    // ONCEGATE_RETENTION=30days is below the default floor (exit 64, see
    // privilege.rs); the owner lowers it first.
    db.exec("UPDATE oncegate_retention_floor SET min_retention = interval '1 day'")
        .await;
    let app = TestApp::spawn(serve_args(&db)).await;
    claim(&app, "AWD-CMD", 2).await;
    app.shutdown().await;
    db.exec(&format!(
        "UPDATE processed_messages SET claimed_at = {} WHERE idempotency_key IN \
         (SELECT idempotency_key FROM processed_messages LIMIT 1)",
        ago(Kind::Postgres, 40 * DAY as i64)
    ))
    .await;

    let mut other = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(PURGE_LOCK)
        .execute(&mut other)
        .await
        .unwrap();
    let (status, out) = run_purge(&db).await;
    assert!(status.success(), "{status:?}");
    assert_eq!(out, "skipped: another instance is purging");
    assert_eq!(db.counts().await.claims, 2);
    drop(other);

    let (status, out) = run_purge(&db).await;
    assert!(status.success(), "{status:?}");
    assert_eq!(out, "purged claims=1 audit=0 outbox=0 effects=0");
    assert_eq!(db.counts().await.claims, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retention_floor_keeps_audit_rows_a_shorter_retention_would_drop() {
    let db = TestDb::new(Kind::Postgres).await;
    let store = db.open().await;
    store
        .append_audit(&[
            audit_row("FLOOR-YOUNG", days_ago(40.0)),
            audit_row("FLOOR-OLD", days_ago(4.0 * 365.0)),
        ])
        .await
        .unwrap();
    // ONCEGATE_RETENTION=30days asks for more than the owner allows (3 years).
    let report = Retention::new(store, policy(30, 1, 100)).step().await.unwrap();
    assert_eq!(report.audit_deleted, 1, "only the row older than the floor goes");
    assert_eq!(count_where(&db, "audit_log", "award_id = 'FLOOR-YOUNG'").await, 1);
    assert_eq!(count_where(&db, "audit_log", "award_id = 'FLOOR-OLD'").await, 0);
}
