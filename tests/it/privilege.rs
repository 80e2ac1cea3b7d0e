//! Least privilege on Postgres (migration 0004, `migrations/GRANTS.md`): the
//! application role that `oncegate_grant_app_role` sets up runs the whole
//! claim path, the relay and the retention purge, and cannot change or
//! remove ledger or audit rows, nor the retention floor — not with the
//! `oncegate.purge` session flag, and not even when someone grants it
//! UPDATE, DELETE or TRUNCATE directly. The grant function grants exactly
//! what GRANTS.md documents and refuses roles for which least privilege is
//! meaningless (superusers, the owner and its members, missing roles).

use crate::helpers::*;
use oncegate::pb::Outcome;
use oncegate::store::{AuditDecision, AuditEntry, RetentionPolicy};
use sqlx::Connection;
use std::sync::Arc;
use std::time::Duration;
use time::OffsetDateTime;

const TS: &str = "2026-11-29T10:00:00Z";
const DAY: u64 = 86_400;

fn url_for(role: &str, database: &str) -> String {
    format!("postgres://{role}@{}/{database}", pg_addr())
}

async fn scalar_as(url: &str, sql: &str) -> i64 {
    let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_one(&mut c)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// `SELECT oncegate_grant_app_role($1)` as `url`'s user, the way
/// `oncegate migrate` calls it (the role name bound as text).
async fn grant_app_role(url: &str, role: &str) -> Result<(), (String, String)> {
    let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
    sqlx::query("SELECT oncegate_grant_app_role($1)")
        .bind(role)
        .execute(&mut c)
        .await
        .map(|_| ())
        .map_err(sqlstate_and_message)
}

/// The admin connection's URL for another database.
fn admin_url_for(database: &str) -> String {
    let admin = admin_url();
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
    format!("{base}/{database}")
}

async fn admin_name() -> String {
    let mut c = sqlx::PgConnection::connect(&admin_url()).await.unwrap();
    sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&mut c)
        .await
        .unwrap()
}

/// Roles are cluster-wide: each test drops the roles (and the databases of
/// their own) it made. Their names start with `og_`, so the test script
/// cleans up after a run that panicked before `drop_all`.
#[derive(Default)]
struct Roles {
    roles: Vec<String>,
    databases: Vec<String>,
}

impl Roles {
    async fn create(&mut self, prefix: &str, attributes: &str) -> String {
        let role = unique(prefix);
        run_as(&admin_url(), &format!("CREATE ROLE {role} {attributes}"))
            .await
            .unwrap();
        self.roles.push(role.clone());
        role
    }

    /// Drops the databases made by `owned_database`, the roles' privileges
    /// in `shared` databases, then the roles.
    async fn drop_all(self, shared: &[&str]) {
        for db in &self.databases {
            run_as(
                &admin_url(),
                &format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
            )
            .await
            .unwrap_or_else(|e| panic!("drop database {db}: {e:?}"));
        }
        for db in shared {
            for role in &self.roles {
                run_as(&admin_url_for(db), &format!("DROP OWNED BY {role}"))
                    .await
                    .unwrap_or_else(|e| panic!("drop owned by {role}: {e:?}"));
            }
        }
        for role in self.roles.iter().rev() {
            run_as(&admin_url(), &format!("DROP ROLE IF EXISTS {role}"))
                .await
                .unwrap_or_else(|e| panic!("drop role {role}: {e:?}"));
        }
    }

    /// A database owned by a fresh non-superuser owner role and migrated as
    /// it, the way the migration Job migrates in production.
    async fn owned_database(&mut self) -> OwnedDb {
        let owner = self.create("og_owner_", "LOGIN").await;
        let name = unique("og_");
        run_as(&admin_url(), &format!("CREATE DATABASE {name} OWNER {owner}"))
            .await
            .unwrap();
        self.databases.push(name.clone());
        let owner_url = url_for(&owner, &name);
        open_store(&owner_url, 2)
            .await
            .unwrap()
            .migrate()
            .await
            .expect("the owner migrates");
        OwnedDb {
            name,
            owner,
            owner_url,
        }
    }
}

struct OwnedDb {
    name: String,
    owner: String,
    owner_url: String,
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

fn policy(retention_days: u64) -> RetentionPolicy {
    RetentionPolicy {
        retention: Duration::from_secs(retention_days * DAY),
        outbox_retention: Duration::from_secs(DAY),
        batch_size: 100,
    }
}

/// What changing or removing the trail looks like, for a role with the
/// function's grants (refused by privilege) or with extra grants (refused
/// by the triggers). Each must fail with SQLSTATE 42501.
const TAMPERING: &[&str] = &[
    "SET oncegate.purge = 'on'; DELETE FROM audit_log",
    "BEGIN; SET LOCAL oncegate.purge = 'on'; DELETE FROM audit_log; COMMIT",
    "BEGIN; SET LOCAL oncegate.purge = 'on'; DELETE FROM audit_log_default; COMMIT",
    "UPDATE disbursements SET amount_cents = amount_cents + 1",
    "DELETE FROM disbursements",
    "TRUNCATE disbursements",
    "UPDATE audit_log SET award_id = 'forged'",
    "DELETE FROM audit_log",
    "DELETE FROM audit_log_default",
    "TRUNCATE audit_log",
    "TRUNCATE audit_log_default",
    "UPDATE oncegate_retention_floor SET min_retention = interval '0'",
    "DELETE FROM oncegate_retention_floor",
    "TRUNCATE oncegate_retention_floor",
    "ALTER TABLE audit_log DISABLE TRIGGER audit_log_append_only",
    "ALTER TABLE disbursements DISABLE TRIGGER ALL",
];

async fn assert_tampering_refused(role_url: &str, who: &str) {
    for sql in TAMPERING {
        let (code, msg) = run_as(role_url, sql)
            .await
            .expect_err(&format!("{who}: {sql} must fail"));
        assert_eq!(code, "42501", "{who}: {sql}: {msg}");
    }
}

/// "<object> <privilege>" for every privilege `role` effectively holds on
/// the oncegate tables, sequences and functions, sorted.
async fn effective_privileges(url: &str, role: &str) -> Vec<String> {
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar(
        "SELECT c.relname || ' ' || p FROM pg_class c \
           CROSS JOIN unnest(ARRAY['SELECT','INSERT','UPDATE','DELETE','TRUNCATE','REFERENCES','TRIGGER']) p \
         WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') \
           AND c.relname <> '_sqlx_migrations' AND has_table_privilege($1::name, c.oid, p) \
         UNION ALL \
         SELECT c.relname || ' ' || p FROM pg_class c CROSS JOIN unnest(ARRAY['USAGE','SELECT','UPDATE']) p \
         WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'S' AND has_sequence_privilege($1::name, c.oid, p) \
         UNION ALL \
         SELECT f.oid::regprocedure::text || ' EXECUTE' FROM pg_proc f \
         WHERE f.pronamespace = 'public'::regnamespace AND f.prokind = 'f' AND f.prorettype <> 'trigger'::regtype \
           AND has_function_privilege($1::name, f.oid, 'EXECUTE') \
         ORDER BY 1",
    )
    .bind(role)
    .fetch_all(&mut c)
    .await
    .unwrap()
}

/// The real server as the app role: claims, a duplicate, a key-reuse
/// rejection (audit rows), the relay (outbox UPDATE, LISTEN) and the purge
/// (advisory lock, claim DELETE, the SECURITY DEFINER functions) all work;
/// changing or removing the trail does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_granted_app_role_runs_the_claim_path_but_cannot_change_the_trail() {
    let db = TestDb::new(Kind::Postgres).await;
    let mut roles = Roles::default();
    let role = roles.create("og_app_priv_", "LOGIN").await;
    grant_app_role(&db.url, &role).await.expect("granted");
    let role_url = url_for(&role, &db.name);

    let mut args = serve_args(&db);
    args.store.database_url = Some(role_url.clone());
    args.migrate_on_start = false;
    args.relay.broker.relay_sink = oncegate::broker::SinkSpec::parse("log").unwrap();
    let app = TestApp::spawn(args).await;
    let mut c = app.client().await;
    for i in 0..2 {
        let s = submission("AWD-PRIV", TS, format!("p{i}").as_bytes(), 1_000);
        assert_eq!(
            outcome(&c.submit(s).await.unwrap().into_inner()),
            Outcome::Claimed
        );
    }
    let again = submission("AWD-PRIV", TS, b"p0", 1_000);
    assert_eq!(
        outcome(&c.submit(again).await.unwrap().into_inner()),
        Outcome::Duplicate
    );
    let mut reused = submission("AWD-PRIV", TS, b"keyed", 250);
    reused.idempotency_key = Some(unique("priv-key-"));
    assert_eq!(
        outcome(&c.submit(reused.clone()).await.unwrap().into_inner()),
        Outcome::Claimed
    );
    reused.amount_cents = 1;
    assert_eq!(
        c.submit(reused).await.unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            let n = db.counts().await;
            n.audit_duplicate == 1 && n.audit_rejected >= 1
        })
        .await,
        "audit rows written as the role: {:?}",
        db.counts().await
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            db.scalar("SELECT count(*) FROM outbox WHERE published_at IS NULL")
                .await
                == 0
        })
        .await,
        "the relay marks events published as the role"
    );
    let report = open_store(&role_url, 1)
        .await
        .unwrap()
        .purge(&policy(30))
        .await
        .expect("the purge runs as the role");
    assert!(report.ran);
    app.shutdown().await;
    let before = db.counts().await;
    assert_eq!(before.ledger(), (3, 3, 2_250, 3));
    assert_eq!(before.audit_processed, 3);

    assert_tampering_refused(&role_url, "the granted role").await;
    for sql in [
        "SET session_replication_role = replica",
        "SELECT setval('audit_log_id_seq', 1)",
        "SELECT oncegate_clamp_cutoff(now())",
        "CREATE TABLE public.shadow_ledger (id int)",
        "CREATE TRIGGER hide BEFORE INSERT ON audit_log FOR EACH ROW EXECUTE FUNCTION oncegate_outbox_notify()",
        "INSERT INTO audit_log_default (decision, key_prefix, award_id, instance) VALUES ('processed', 'x', 'x', 'x')",
    ] {
        let (code, msg) = run_as(&role_url, sql).await.expect_err(sql);
        assert_eq!(code, "42501", "{sql}: {msg}");
    }
    let (code, msg) = grant_app_role(&role_url, &role)
        .await
        .expect_err("the role cannot run the grant function");
    assert_eq!(code, "42501", "{msg}");
    assert_eq!(db.counts().await, before, "nothing changed");
    assert_eq!(
        db.scalar("SELECT count(*) FROM audit_log WHERE award_id = 'forged'")
            .await,
        0
    );

    roles.drop_all(&[&db.name]).await;
}

/// The bug 0004 fixes: the session flag any role can set let a role that had
/// been granted DELETE on audit_log remove every row (before 0004 this test
/// fails there). Now the triggers refuse UPDATE, DELETE and TRUNCATE of the
/// trail (and changes of the floor) for such a role, flag or not; the purge
/// function still deletes; and the next migrate's grant function takes the
/// stray grants back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_grants_and_the_purge_flag_do_not_open_the_trail() {
    let mut roles = Roles::default();
    let OwnedDb { name, owner_url, .. } = roles.owned_database().await;
    let role = roles.create("og_app_priv_", "LOGIN").await;
    // The documented grants by hand, as a deployment before 0004 had them.
    for g in documented_grants(&role) {
        run_as(&owner_url, &g)
            .await
            .unwrap_or_else(|e| panic!("{g}: {e:?}"));
    }
    let role_url = url_for(&role, &name);

    let store = open_store(&role_url, 2).await.unwrap();
    store
        .append_audit(&[
            audit_row("RECENT", OffsetDateTime::now_utc()),
            audit_row("OLD", days_ago(4.0 * 365.0)),
        ])
        .await
        .expect("the role appends audit rows");
    run_as(
        &role_url,
        "INSERT INTO disbursements (id, idempotency_key, award_id, amount_cents, sequence, \
           submission_timestamp, payload_digest, fingerprint, recorded_at) \
         VALUES (gen_random_uuid(), 'k-direct', 'AWD-D', 100, 1, 'ts', 'd', 'f', now())",
    )
    .await
    .expect("the role inserts ledger rows");

    // The mistake: someone grants the app role what it must never have.
    run_as(
        &owner_url,
        &format!(
            "GRANT UPDATE, DELETE, TRUNCATE ON audit_log, audit_log_default, disbursements TO {role}; \
             GRANT INSERT, UPDATE, DELETE, TRUNCATE ON oncegate_retention_floor TO {role}"
        ),
    )
    .await
    .unwrap();
    assert_tampering_refused(&role_url, "a role granted DELETE directly").await;
    let (_, msg) = run_as(
        &role_url,
        "BEGIN; SET LOCAL oncegate.purge = 'on'; DELETE FROM audit_log; COMMIT",
    )
    .await
    .unwrap_err();
    assert!(msg.contains("append-only"), "the trigger refused it: {msg}");
    let (_, msg) = run_as(
        &role_url,
        "UPDATE oncegate_retention_floor SET min_retention = '0'",
    )
    .await
    .unwrap_err();
    assert!(msg.contains("belongs to the schema owner"), "{msg}");
    assert_eq!(scalar_as(&owner_url, "SELECT count(*) FROM audit_log").await, 2);
    assert_eq!(
        scalar_as(&owner_url, "SELECT count(*) FROM disbursements").await,
        1
    );
    assert_eq!(
        scalar_as(
            &owner_url,
            "SELECT count(*) FROM oncegate_retention_floor WHERE min_retention = interval '3 years'"
        )
        .await,
        1,
        "the floor is unchanged"
    );

    // The SECURITY DEFINER purge is still the one way out, clamped to the floor.
    let report = store.purge(&policy(30)).await.expect("purge as the role");
    assert_eq!(
        report.audit_deleted, 1,
        "only the row older than the 3-year floor"
    );
    assert_eq!(
        scalar_as(
            &owner_url,
            "SELECT count(*) FROM audit_log WHERE award_id = 'RECENT'"
        )
        .await,
        1
    );

    // The next migrate's grant takes the stray grants back.
    grant_app_role(&owner_url, &role).await.expect("regranted");
    for (table, privilege) in [
        ("audit_log", "DELETE"),
        ("audit_log_default", "DELETE"),
        ("disbursements", "UPDATE"),
        ("oncegate_retention_floor", "UPDATE"),
    ] {
        assert_eq!(
            scalar_as(
                &owner_url,
                &format!("SELECT has_table_privilege('{role}', '{table}', '{privilege}')::int::bigint")
            )
            .await,
            0,
            "{privilege} on {table} revoked"
        );
    }
    drop(store);
    roles.drop_all(&[]).await;
}

/// A non-superuser owner, as in production: the app role purges through the
/// functions (claims, partitions, rows) only what is older than the owner's
/// floor; when the owner lowers the floor, the same call purges more. New
/// partitions take the role's rows through the parent without grants of
/// their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purge_removes_only_rows_older_than_the_floor_as_the_app_role() {
    let mut roles = Roles::default();
    let OwnedDb { name, owner_url, .. } = roles.owned_database().await;
    let role = roles.create("og_app_priv_", "LOGIN").await;
    grant_app_role(&owner_url, &role).await.expect("granted");
    let role_url = url_for(&role, &name);

    // Monthly partitions back to 2020, made by the role through the function.
    assert!(
        scalar_as(
            &role_url,
            "SELECT oncegate_ensure_audit_partitions('2020-01-01', 0)::bigint"
        )
        .await
            > 60
    );
    let store = open_store(&role_url, 2).await.unwrap();
    store
        .append_audit(&[
            audit_row("Y4", days_ago(4.0 * 365.0)),
            audit_row("D400", days_ago(400.0)),
            audit_row("D10", days_ago(10.0)),
            audit_row("NOW", OffsetDateTime::now_utc()),
        ])
        .await
        .expect("rows reach the partitions through the parent");
    let (code, _) = run_as(
        &role_url,
        "INSERT INTO audit_log_2020_03 (at, decision, key_prefix, award_id, instance) \
         VALUES ('2020-03-15', 'processed', 'x', 'x', 'x')",
    )
    .await
    .expect_err("no privileges on a partition directly");
    assert_eq!(code, "42501");

    let first = store.purge(&policy(30)).await.unwrap();
    assert_eq!(first.audit_deleted, 1, "the 3-year floor keeps D400");
    let left = |award: &'static str| {
        let url = owner_url.clone();
        async move {
            scalar_as(
                &url,
                &format!("SELECT count(*) FROM audit_log WHERE award_id = '{award}'"),
            )
            .await
        }
    };
    assert_eq!(
        (left("Y4").await, left("D400").await, left("D10").await),
        (0, 1, 1)
    );
    let (code, _) = run_as(
        &role_url,
        "UPDATE oncegate_retention_floor SET min_retention = '0'",
    )
    .await
    .expect_err("only the owner lowers the floor");
    assert_eq!(code, "42501");

    run_as(
        &owner_url,
        "UPDATE oncegate_retention_floor SET min_retention = interval '0'",
    )
    .await
    .expect("the owner lowers the floor");
    let second = store.purge(&policy(30)).await.unwrap();
    assert_eq!(second.audit_deleted, 1, "now D400 goes too");
    assert_eq!(
        (left("D400").await, left("D10").await, left("NOW").await),
        (0, 1, 1),
        "rows younger than the retention stay"
    );
    drop(store);
    roles.drop_all(&[]).await;
}

/// The function grants what GRANTS.md documents, nothing more (nothing on
/// partitions or sequences, no owner-only functions), and is idempotent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grant_function_grants_exactly_the_documented_privileges() {
    let db = TestDb::new(Kind::Postgres).await;
    let mut roles = Roles::default();
    let by_function = roles.create("og_app_fn_", "LOGIN").await;
    let by_hand = roles.create("og_app_doc_", "LOGIN").await;
    grant_app_role(&db.url, &by_function).await.expect("granted");
    grant_app_role(&db.url, &by_function).await.expect("idempotent");
    for g in documented_grants(&by_hand) {
        db.try_exec(&g).await.unwrap_or_else(|e| panic!("{g}: {e}"));
    }
    let granted = effective_privileges(&db.url, &by_function).await;
    assert_eq!(granted, effective_privileges(&db.url, &by_hand).await);
    for expected in [
        "processed_messages DELETE",
        "disbursements INSERT",
        "award_balances UPDATE",
        "outbox DELETE",
        "audit_log INSERT",
        "oncegate_retention_floor SELECT",
        "effects UPDATE",
        "relay_slots UPDATE",
        "relay_members DELETE",
        "oncegate_purge_audit_rows(timestamp with time zone,integer) EXECUTE",
    ] {
        assert!(granted.iter().any(|g| g == expected), "{expected} in {granted:?}");
    }
    for g in &granted {
        assert!(
            !g.starts_with("audit_log_")
                && !g.contains("_seq ")
                && !g.contains("clamp_cutoff")
                && !g.contains("grant_app_role"),
            "{g}"
        );
    }
    assert!(
        !granted
            .iter()
            .any(|g| g.starts_with("disbursements ") && !g.ends_with("SELECT") && !g.ends_with("INSERT")),
        "{granted:?}"
    );
    assert!(
        !granted.iter().any(|g| g == "relay_slots DELETE"),
        "slots are never deleted: {granted:?}"
    );
    roles.drop_all(&[&db.name]).await;
}

/// The function refuses roles for which granting is meaningless or least
/// privilege impossible, and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grant_function_refuses_a_superuser_the_owner_and_a_missing_role() {
    let mut roles = Roles::default();
    let OwnedDb { owner, owner_url, .. } = roles.owned_database().await;
    let member = roles.create("og_member_", "LOGIN").await;
    run_as(&admin_url(), &format!("GRANT {owner} TO {member}"))
        .await
        .unwrap();
    let creator = roles.create("og_creator_", "LOGIN CREATEROLE").await;
    let superuser = roles.create("og_super_", "LOGIN SUPERUSER").await;
    let grouped = roles.create("og_grouped_", "LOGIN").await;
    let group = roles.create("og_group_", "NOLOGIN").await;
    run_as(&admin_url(), &format!("GRANT {group} TO {grouped}"))
        .await
        .unwrap();
    run_as(&owner_url, &format!("GRANT UPDATE ON disbursements TO {group}"))
        .await
        .unwrap();

    let missing = unique("og_missing_");
    let admin = admin_name().await;
    for (role, code, says) in [
        (missing.as_str(), "42704", "does not exist"),
        (superuser.as_str(), "22023", "is a superuser"),
        (admin.as_str(), "22023", "is a superuser"),
        (owner.as_str(), "22023", "schema owner"),
        (member.as_str(), "22023", "schema owner"),
        (creator.as_str(), "22023", "CREATEROLE"),
        (grouped.as_str(), "22023", "has UPDATE on disbursements"),
    ] {
        let (got, msg) = grant_app_role(&owner_url, role)
            .await
            .expect_err(&format!("{role} refused"));
        assert_eq!(got, code, "{role}: {msg}");
        assert!(msg.contains(says), "{role}: {msg}");
    }
    // A refusal grants nothing (the whole call rolls back).
    assert_eq!(
        scalar_as(
            &owner_url,
            &format!("SELECT has_table_privilege('{grouped}', 'audit_log', 'INSERT')::int::bigint")
        )
        .await,
        0
    );
    roles.drop_all(&[]).await;
}

/// Runs the real binary to completion; its exit code and standard error.
async fn run_binary(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = tokio::process::Command::new(oncegate_bin());
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .env_remove("ONCEGATE_APP_ROLE")
        .env_remove("ONCEGATE_REQUIRE_LEAST_PRIVILEGE")
        .env_remove("ONCEGATE_RETENTION")
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("the binary exits by itself")
        .expect("the binary runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `oncegate migrate` as the owner with ONCEGATE_APP_ROLE grants the role;
/// `serve` as that role with ONCEGATE_REQUIRE_LEAST_PRIVILEGE starts and
/// reports itself unprivileged; as the owner it exits 64, naming why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_reports_its_privileges_and_refuses_to_run_privileged_when_required() {
    let mut roles = Roles::default();
    let db = roles.owned_database().await;
    let app_role = roles.create("og_app_serve_", "LOGIN").await;
    let (code, err) = run_binary(
        &["migrate", "--database-url", &db.owner_url],
        &[("ONCEGATE_APP_ROLE", &app_role)],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("granted"), "{err}");
    let app_url = url_for(&app_role, &db.name);
    assert_eq!(
        scalar_as(
            &db.owner_url,
            &format!("SELECT has_table_privilege('{app_role}', 'disbursements', 'INSERT')::int::bigint")
        )
        .await,
        1,
        "migrate granted the role"
    );

    let mut args = serve_args_for_url(&app_url);
    args.require_least_privilege = true;
    args.migrate_on_start = false;
    let app = TestApp::spawn(args).await;
    let metrics = app.metrics().await;
    assert_eq!(
        metric(&metrics, "oncegate_db_role_privileged"),
        Some(0.0),
        "{metrics}"
    );
    app.shutdown().await;

    let (code, err) = run_binary(
        &[
            "serve",
            "--database-url",
            &db.owner_url,
            "--migrate-on-start",
            "false",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        &[("ONCEGATE_REQUIRE_LEAST_PRIVILEGE", "true")],
    )
    .await;
    assert_eq!(code, 64, "the owner is refused: {err}");
    assert!(err.contains("owner of the schema objects"), "names why: {err}");
    roles.drop_all(&[]).await;
}

/// A retention below the database's floor is exit 64 naming both values,
/// for `serve` and for `purge`; never a silent clamp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retention_below_the_database_floor_is_a_configuration_error() {
    let db = TestDb::new(Kind::Postgres).await;
    for sub in ["purge", "serve"] {
        let (code, err) = run_binary(
            &[
                sub,
                "--database-url",
                &db.url,
                "--retention",
                "2years",
                "--listen",
                "127.0.0.1:0",
                "--metrics-listen",
                "127.0.0.1:0",
            ][..if sub == "purge" { 5 } else { 9 }],
            &[],
        )
        .await;
        assert_eq!(code, 64, "{sub}: {err}");
        assert!(
            err.contains("2years") && err.contains("3years"),
            "{sub} names both values: {err}"
        );
    }
    db.exec("UPDATE oncegate_retention_floor SET min_retention = interval '1 year'")
        .await;
    let (code, err) = run_binary(
        &["purge", "--database-url", &db.url, "--retention", "2years"],
        &[],
    )
    .await;
    assert_eq!(code, 0, "the owner lowered the floor: {err}");
}

/// The console's role (migration 0018): `oncegate migrate --console-role`
/// grants it reading only; it can read every table the console reads and
/// write none; `read_only_excess` finds nothing. `oncegate console` as the
/// owner, or as the console role once someone grants it a write, exits 64
/// naming what it can do; the grant function takes that grant back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_role_can_only_read_and_the_console_refuses_more() {
    let mut roles = Roles::default();
    let db = roles.owned_database().await;
    let console = roles.create("og_console_", "LOGIN").await;
    let (code, err) = run_binary(
        &[
            "migrate",
            "--database-url",
            &db.owner_url,
            "--console-role",
            &console,
        ],
        &[],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("console role"), "{err}");
    let console_url = url_for(&console, &db.name);
    for table in [
        "disbursements",
        "audit_log",
        "audit_seals",
        "outbox",
        "relay_slots",
    ] {
        assert_eq!(
            scalar_as(&console_url, &format!("SELECT count(*) FROM {table}")).await,
            0
        );
    }
    for write in [
        "INSERT INTO award_balances VALUES ('a', 1, 1, 1, now())",
        "DELETE FROM processed_messages",
        "UPDATE outbox SET attempts = 0",
        "SELECT * FROM effects",
        "SELECT oncegate_audit_seal_horizon()",
        "CREATE TABLE t (x int)",
    ] {
        let refused = run_as(&console_url, write).await.expect_err(write);
        assert_eq!(refused.0, "42501", "{write}: {refused:?}");
    }
    let store = open_store(&console_url, 2).await.unwrap();
    assert_eq!(store.read_only_excess().await.unwrap(), Some(vec![]));

    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), "a-token-of-twenty-chars\n").unwrap();
    let console_args = |url: &str| {
        vec![
            "console".to_string(),
            "--database-url".into(),
            url.to_string(),
            "--console-listen".into(),
            "127.0.0.1:0".into(),
            "--console-token-file".into(),
            token.path().display().to_string(),
        ]
    };
    let args = console_args(&db.owner_url);
    let (code, err) = run_binary(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]).await;
    assert_eq!(code, 64, "the owner is refused: {err}");
    assert!(
        err.contains("owner of the schema objects") && err.contains("may write disbursements"),
        "{err}"
    );

    run_as(&db.owner_url, &format!("GRANT UPDATE ON outbox TO {console}"))
        .await
        .unwrap();
    let args = console_args(&console_url);
    let (code, err) = run_binary(&args.iter().map(String::as_str).collect::<Vec<_>>(), &[]).await;
    assert_eq!(code, 64, "a console role that can write is refused: {err}");
    assert!(err.contains("may write outbox"), "names the excess: {err}");
    let (code, err) = run_binary(
        &[
            "migrate",
            "--database-url",
            &db.owner_url,
            "--console-role",
            &console,
        ],
        &[],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        store.read_only_excess().await.unwrap(),
        Some(vec![]),
        "the grant function took it back"
    );
    drop(store);
    roles.drop_all(&[]).await;
}
