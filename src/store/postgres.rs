//! The production store. This file has the connection pool, the claims'
//! capability (the transaction itself is in `claim`, its session handling in
//! `tx`) and administration, with the retention purge (one instance at a
//! time, by advisory lock). Each other capability is a file of its own:
//! the relay's in `slots`, effects in `effect`, reconcile and inspect in
//! `ops`, the sealed audit trail in `seal`.

mod claim;
mod effect;

mod ops;
mod seal;
mod slots;
mod tx;

pub use tx::ClaimTx;

use super::shared::{LEDGER_SUMMARY_SQL, ledger_summary_from_row};
use super::*;
use crate::error::StoreError;
use crate::store::rows::stored_result;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool, Row};
use std::collections::HashMap;
use std::str::FromStr;
use tokio::sync::Mutex;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// Everything the connected role may do that the application role must
/// not (migrations/GRANTS.md), one label each; empty for least privilege.
const PRIVILEGE_EXCESS_SQL: &str = "SELECT array_remove(ARRAY[ \
       CASE WHEN r.rolsuper THEN 'superuser' END, \
       CASE WHEN r.rolcreaterole THEN 'CREATEROLE' END, \
       CASE WHEN pg_has_role(current_user, c.relowner, 'MEMBER') THEN 'owner of the schema objects' END, \
       CASE WHEN has_table_privilege('public.disbursements', 'UPDATE,DELETE,TRUNCATE,TRIGGER') \
              OR has_any_column_privilege('public.disbursements', 'UPDATE') \
            THEN 'may change disbursements' END, \
       CASE WHEN has_table_privilege('public.audit_log', 'UPDATE,DELETE,TRUNCATE,TRIGGER') \
              OR has_any_column_privilege('public.audit_log', 'UPDATE') \
            THEN 'may change audit_log' END, \
       CASE WHEN has_table_privilege(to_regclass('public.audit_seals'), 'UPDATE,DELETE,TRUNCATE,TRIGGER') \
              OR has_any_column_privilege(to_regclass('public.audit_seals'), 'UPDATE') \
            THEN 'may change audit_seals' END, \
       CASE WHEN has_table_privilege(to_regclass('public.audit_purges'), 'INSERT,UPDATE,DELETE,TRUNCATE,TRIGGER') \
            THEN 'may write audit_purges' END, \
       CASE WHEN has_table_privilege('public.oncegate_retention_floor', 'INSERT,UPDATE,DELETE,TRUNCATE') \
              OR has_any_column_privilege('public.oncegate_retention_floor', 'UPDATE') \
            THEN 'may change the retention floor' END, \
       CASE WHEN has_schema_privilege('public', 'CREATE') THEN 'may create objects in schema public' END \
     ], NULL) \
     FROM pg_roles r, pg_class c \
     WHERE r.rolname = current_user AND c.oid = 'public.audit_log'::regclass";

/// Everything the connected role may do beyond reading (the console's
/// role, migrations/GRANTS.md), one label each; empty when it only reads:
/// any write on a table of schema `public` (partitions included), running
/// a function that changes something, creating objects, roles, ownership.
const READ_ONLY_EXCESS_SQL: &str = "SELECT array_remove(ARRAY[ \
       CASE WHEN r.rolsuper THEN 'superuser' END, \
       CASE WHEN r.rolcreaterole THEN 'CREATEROLE' END, \
       CASE WHEN r.rolbypassrls THEN 'BYPASSRLS' END, \
       CASE WHEN pg_has_role(current_user, o.relowner, 'MEMBER') THEN 'owner of the schema objects' END, \
       CASE WHEN has_schema_privilege('public', 'CREATE') THEN 'may create objects in schema public' END \
     ], NULL) \
     || ARRAY(SELECT format('may write %s', c.relname) FROM pg_class c \
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') \
          AND (has_table_privilege(c.oid, 'INSERT,UPDATE,DELETE,TRUNCATE,REFERENCES,TRIGGER') \
               OR has_any_column_privilege(c.oid, 'INSERT,UPDATE,REFERENCES')) \
        ORDER BY c.relname) \
     || ARRAY(SELECT format('may run %s', p.oid::regprocedure) FROM pg_proc p \
        WHERE p.pronamespace = 'public'::regnamespace \
          AND p.proname IN ('oncegate_ensure_audit_partitions', 'oncegate_drop_audit_partitions', \
            'oncegate_purge_audit_rows', 'oncegate_audit_seal_horizon', 'oncegate_clamp_cutoff', \
            'oncegate_grant_app_role', 'oncegate_grant_console_role', 'oncegate_audit_purge_bounds', \
            'oncegate_record_audit_purge', 'oncegate_seal_lock_key') \
          AND has_function_privilege(p.oid, 'EXECUTE') \
        ORDER BY 1) \
     FROM pg_roles r, pg_class o \
     WHERE r.rolname = current_user AND o.oid = 'public.audit_log'::regclass";

/// Advisory lock key held by the instance that runs retention ("oncegate").
const PURGE_LOCK: i64 = 0x6f6e_6365_6761_7465;
pub(super) const OUTBOX_CHANNEL: &str = "oncegate_outbox";
const NOTIFY_SQL: &str = "SELECT pg_notify('oncegate_outbox', '')";

/// The server's identity (DESIGN §7.2): its system identifier and the WAL
/// timeline it writes now. The timeline comes from the current WAL file's
/// name, which changes the moment a standby is promoted
/// (`pg_control_checkpoint()` lags until the next checkpoint); on a standby
/// `pg_current_wal_lsn()` fails, so a connection that reaches a server in
/// recovery is refused rather than used.
const IDENTITY_SQL: &str = "SELECT (SELECT system_identifier FROM pg_control_system()), \
     ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int4";

/// The pool's sessions: the timeouts and server-side keepalives as startup
/// options. Behind a transaction pooler no session setting lasts (and
/// PgBouncer refuses the `options` startup parameter): the timeouts are set
/// in every transaction instead ([`tx`]), no statement is cached, and the
/// keepalives are the pooler's own to configure.
fn session_options(base: &PgConnectOptions, settings: &StoreSettings) -> PgConnectOptions {
    if settings.pooler == Pooler::Transaction {
        return base.clone().statement_cache_capacity(0);
    }
    let ms = |d: Duration| d.as_millis().to_string();
    let keepalive = settings.tcp_keepalive.as_secs().max(1);
    base.clone().options([
        ("lock_timeout", ms(settings.lock_timeout)),
        ("statement_timeout", ms(settings.statement_timeout)),
        (
            "idle_in_transaction_session_timeout",
            ms(settings.idle_in_transaction_timeout),
        ),
        ("tcp_keepalives_idle", keepalive.to_string()),
        ("tcp_keepalives_interval", (keepalive / 3).max(1).to_string()),
        ("tcp_keepalives_count", "3".to_string()),
    ])
}

/// Reads the identity on `conn` and reports it to `watch`.
async fn read_identity(conn: &mut PgConnection, watch: &PrimaryWatch) -> Result<(), sqlx::Error> {
    let sent = tokio::time::Instant::now();
    // The simple protocol: one message, whatever a pooler does between them.
    let row = sqlx::raw_sql(IDENTITY_SQL).fetch_one(conn).await?;
    let (system_identifier, timeline): (i64, i32) = (row.try_get(0)?, row.try_get(1)?);
    watch.observe(
        ServerIdentity {
            system_identifier,
            timeline: timeline as u32,
        },
        sent,
    );
    Ok(())
}

/// The primary's synchronous replication as the application role's
/// sessions get it (the guard, [`crate::primary::guard`]): the standbys
/// from `oncegate_sync_standbys()` (migration 0014, which reads
/// `pg_stat_replication` with the owner's rights), and `synchronous_commit`
/// as a new session of this role in this database gets it — from a role
/// or database setting (`ALTER ROLE … SET`, highest precedence first, as
/// Postgres applies them at connection) or else from the server. The
/// server's value is this session's when the session took it from the
/// server (its source is the configuration, not a role setting); when a
/// role setting this session started with is gone, it is unknown here
/// (NULL) and the probe reads again on a new session.
const REPLICATION_SQL: &str = "SELECT s.standby_names, s.required, s.streaming,        coalesce(r.value, CASE WHEN g.source IN ('default', 'environment variable', 'configuration file', 'command line')                               THEN g.reset_val END) AS commit_value,        coalesce(r.set_for, 'the server') AS commit_set_for      FROM oncegate_sync_standbys() s      CROSS JOIN (SELECT source, reset_val FROM pg_settings WHERE name = 'synchronous_commit') g      LEFT JOIN LATERAL (        SELECT substr(c, length('synchronous_commit=') + 1) AS value,               CASE WHEN d.setrole <> 0 AND d.setdatabase <> 0                      THEN format('role %s in database %s', session_user, current_database())                    WHEN d.setrole <> 0 THEN format('role %s', session_user)                    WHEN d.setdatabase <> 0 THEN format('database %s', current_database())                    ELSE 'all roles' END AS set_for        FROM pg_db_role_setting d, unnest(d.setconfig) AS c        WHERE c LIKE 'synchronous_commit=%'          AND d.setrole IN (0, (SELECT oid FROM pg_roles WHERE rolname = session_user))          AND d.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database()))        ORDER BY (d.setrole <> 0) DESC, (d.setdatabase <> 0) DESC LIMIT 1) r ON true";

/// Reads [`REPLICATION_SQL`] on `conn`.
async fn read_replication(conn: &mut PgConnection) -> Result<Replication, sqlx::Error> {
    let row = sqlx::raw_sql(REPLICATION_SQL).fetch_one(conn).await?;
    let value: Option<String> = row.try_get("commit_value")?;
    let set_for: String = row.try_get("commit_set_for")?;
    Ok(Replication {
        standby_names: row.try_get("standby_names")?,
        required: row.try_get("required")?,
        streaming: row.try_get("streaming")?,
        commit: value.map(|value| CommitSetting { value, set_for }),
    })
}

pub struct PostgresStore {
    pool: PgPool,
    /// How transactions begin and end: confirmed by the guard when it is
    /// required, self-contained behind a transaction pooler.
    tx: tx::Transactions,
    /// The identity every new connection (and the probe) reports to.
    primary: Arc<PrimaryWatch>,
    /// The probe's own connection, kept between probes: its loss is the
    /// loss of the primary.
    probe: Mutex<Option<PgConnection>>,
    probe_options: PgConnectOptions,
    /// Without the session timeouts: for migrations, which may rightly
    /// take long (an index on a large table).
    migration_options: PgConnectOptions,
    listener: Mutex<Option<PgListener>>,
    /// Wakes this instance's relay after a commit that wrote outbox rows
    /// (`notify_one`: a wake-up that arrives while the relay is busy is
    /// kept as a permit, never lost).
    outbox_written: tokio::sync::Notify,
    /// Other processes' relays are told by a `pg_notify` outside the claim
    /// transaction, at most one in flight and one per [`NOTIFY_INTERVAL`].
    notifier: Arc<OutboxNotifier>,
}

/// A pooled connection idle this long is tested (a round trip) before it is
/// used; one used more recently is used as it is. A server that went away
/// within that second fails the statement instead, answered UNAVAILABLE
/// (retryable) like any claim in flight when a server goes away.
const TESTED_IF_IDLE_FOR: Duration = Duration::from_secs(1);

/// Shortest time between two cross-process outbox notifications.
const NOTIFY_INTERVAL: Duration = Duration::from_millis(20);

/// Coalesces "new outbox rows" into few `pg_notify` calls, each its own
/// tiny transaction: NOTIFY serialises committing transactions in Postgres,
/// so it must never ride in a claim transaction.
#[derive(Default)]
struct OutboxNotifier {
    in_flight: std::sync::atomic::AtomicBool,
    /// Set when rows were written while a notification was in flight.
    again: std::sync::atomic::AtomicBool,
}

impl OutboxNotifier {
    fn poke(self: &Arc<Self>, pool: &PgPool) {
        use std::sync::atomic::Ordering::SeqCst;
        self.again.store(true, SeqCst);
        if self.in_flight.swap(true, SeqCst) {
            return;
        }
        let (me, pool) = (self.clone(), pool.clone());
        // Notifies while asked to, then ends by itself; at shutdown at most
        // one notification is lost, which the relays' polling covers.
        tokio::spawn(async move {
            loop {
                while me.again.swap(false, SeqCst) {
                    // No parameter: one message of the simple protocol,
                    // which a transaction pooler passes on whole.
                    let sent = sqlx::raw_sql(NOTIFY_SQL).execute(&pool).await;
                    if let Err(e) = sent {
                        tracing::debug!(error = %e, "outbox notification failed; relays poll");
                    }
                    tokio::time::sleep(NOTIFY_INTERVAL).await;
                }
                me.in_flight.store(false, SeqCst);
                // A poke between the last check and the store above found
                // the flag still set and left; take over its request.
                if !me.again.load(SeqCst) || me.in_flight.swap(true, SeqCst) {
                    return;
                }
            }
        });
    }
}

impl PostgresStore {
    /// A lazily connecting pool: the sidecar starts (and answers cached
    /// duplicates) even while Postgres is down.
    ///
    /// Every pooled session gets `lock_timeout`, `statement_timeout` and
    /// `idle_in_transaction_session_timeout`, so one stuck row lock fails
    /// its transaction instead of stalling the instance, and server-side TCP
    /// keepalives, so a session whose client vanished (a half-open
    /// connection holding a lock) is ended by the server.
    pub async fn connect(settings: &StoreSettings) -> Result<Self, StoreError> {
        let migration_options = PgConnectOptions::from_str(&settings.url)
            .map_err(|e| StoreError::Other(format!("invalid DATABASE_URL: {e}")))?
            .application_name("oncegate");
        let options = session_options(&migration_options, settings);
        let primary = Arc::new(PrimaryWatch::new(settings.require_sync_standby));
        let watch = primary.clone();
        let pool = PgPoolOptions::new()
            .max_connections(settings.pool_size.max(1))
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(3))
            .after_connect(move |conn, _| {
                let watch = watch.clone();
                Box::pin(async move { read_identity(conn, &watch).await })
            })
            // A connection back from a use moments ago answered then: only
            // one idle longer is tested with a round trip before it is
            // handed out (sqlx tests every one: a round trip per transaction).
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move { Ok(meta.idle_for < TESTED_IF_IDLE_FOR || conn.ping().await.is_ok()) })
            })
            .connect_lazy_with(options.clone());
        Ok(Self {
            tx: tx::Transactions::new(pool.clone(), primary.clone(), settings),
            pool,
            primary,
            probe: Mutex::new(None),
            probe_options: options,
            migration_options,
            listener: Mutex::new(None),
            outbox_written: tokio::sync::Notify::new(),
            notifier: Arc::default(),
        })
    }

    /// The pool, for tests and pool metrics.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Claims `batch` in `tx` and commits (under the guard: only with the
    /// standbys there before COMMIT, answered only once confirmed after
    /// it); wakes the relay if a claim went in. Returns the transaction's
    /// connection with the outcomes, for its runner to keep, if the pool
    /// can spare it.
    async fn claim_in(
        &self,
        mut tx: ClaimTx,
        batch: &ClaimBatch<'_>,
        ctx: &ClaimContext,
    ) -> Result<(Vec<ClaimOutcome>, Option<KeptConnection>), StoreError> {
        let (outcomes, standbys) = claim::claim_in_tx(&mut tx, batch, ctx, self.tx.guarded()).await?;
        self.tx.check_before_commit(standbys.as_ref())?;
        let conn = self.tx.commit_claim(tx).await?;
        if outcomes.iter().any(|o| matches!(o, ClaimOutcome::Claimed(_))) {
            self.outbox_written.notify_one();
            self.notifier.poke(&self.pool);
        }
        Ok((outcomes, conn.map(KeptConnection::Postgres)))
    }
}

const SELECT_STORED_ANY: &str = "SELECT idempotency_key, fingerprint, id, award_id, amount_cents, \
     recorded_at, sequence FROM disbursements WHERE idempotency_key = ANY($1)";
const SELECT_STORED_ONE: &str = "SELECT idempotency_key, fingerprint, id, award_id, amount_cents, \
     recorded_at, sequence FROM disbursements WHERE idempotency_key = $1";

async fn load_stored(
    tx: &mut PgConnection,
    keys: &[&str],
) -> Result<HashMap<String, StoredResult>, StoreError> {
    let rows = sqlx::query(SELECT_STORED_ANY)
        .bind(keys)
        .persistent(tx::named())
        .fetch_all(tx)
        .await?;
    rows.iter()
        .map(|r| stored_result(r).map(|s| (s.key.clone(), s)))
        .collect::<Result<_, _>>()
        .map_err(StoreError::from)
}

impl StoreBase for PostgresStore {
    fn backend(&self) -> Backend {
        Backend::Postgres
    }

    fn primary(&self) -> Arc<PrimaryWatch> {
        self.primary.clone()
    }
}

#[async_trait]
impl ClaimStore for PostgresStore {
    async fn claim_batch(
        &self,
        batch: &ClaimBatch<'_>,
        ctx: &ClaimContext,
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        let tx = self.tx.begin_claim(None).await?;
        Ok(self.claim_in(tx, batch, ctx).await?.0)
    }

    async fn begin_claim(&self, kept: Option<KeptConnection>) -> Result<Option<OpenClaim>, StoreError> {
        let kept = kept.map(|KeptConnection::Postgres(conn)| conn);
        Ok(Some(OpenClaim::Postgres(self.tx.begin_claim(kept).await?)))
    }

    async fn claim_batch_in(
        &self,
        open: OpenClaim,
        batch: &ClaimBatch<'_>,
        ctx: &ClaimContext,
    ) -> Result<(Vec<ClaimOutcome>, Option<KeptConnection>), StoreError> {
        let OpenClaim::Postgres(tx) = open;
        self.claim_in(tx, batch, ctx).await
    }

    async fn restore_claims(&self, keys: &[String]) -> Result<(), StoreError> {
        let mut session = self.tx.session().await?;
        sqlx::query(
            "INSERT INTO processed_messages (idempotency_key, award_id, fingerprint, disbursement_id, claimed_at) \
             SELECT idempotency_key, award_id, fingerprint, id, now() FROM disbursements \
             WHERE idempotency_key = ANY($1) ON CONFLICT (idempotency_key) DO NOTHING",
        )
        .bind(keys)
        .persistent(tx::named())
        .execute(&mut *session)
        .await?;
        session.finish().await?;
        Ok(())
    }

    async fn lookup(&self, key: &str) -> Result<Option<StoredResult>, StoreError> {
        let mut session = self.tx.session().await?;
        let row = sqlx::query(SELECT_STORED_ONE)
            .bind(key)
            .persistent(tx::named())
            .fetch_optional(&mut *session)
            .await?;
        session.finish().await?;
        Ok(row.as_ref().map(stored_result).transpose()?)
    }

    async fn append_audit(&self, rows: &[AuditEntry]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let at: Vec<OffsetDateTime> = rows.iter().map(|r| r.at).collect();
        let decision: Vec<&str> = rows.iter().map(|r| r.decision.as_str()).collect();
        let tier: Vec<Option<&str>> = rows.iter().map(|r| r.tier.map(Tier::as_str)).collect();
        let prefix: Vec<&str> = rows.iter().map(|r| r.key_prefix.as_str()).collect();
        let award: Vec<&str> = rows.iter().map(|r| r.award_id.as_str()).collect();
        let instance: Vec<&str> = rows.iter().map(|r| &*r.instance).collect();
        let changed: Vec<bool> = rows.iter().map(|r| r.payload_changed).collect();
        let detail: Vec<Option<&str>> = rows.iter().map(|r| r.detail.as_deref()).collect();
        let mut session = self.tx.session().await?;
        sqlx::query(
            "INSERT INTO audit_log (at, decision, tier, key_prefix, award_id, instance, payload_changed, detail) \
             SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[], $5::text[], \
               $6::text[], $7::bool[], $8::text[])",
        )
        .bind(&at)
        .bind(&decision)
        .bind(&tier)
        .bind(&prefix)
        .bind(&award)
        .bind(&instance)
        .bind(&changed)
        .bind(&detail)
        .persistent(tx::named())
        .execute(&mut *session)
        .await?;
        session.finish().await?;
        Ok(())
    }
}

#[async_trait]
impl AdminStore for PostgresStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(3))
            .connect_with(self.migration_options.clone())
            .await?;
        let result = MIGRATOR.run(&pool).await;
        pool.close().await;
        result.map_err(|e| match e {
            sqlx::migrate::MigrateError::Execute(err) => StoreError::from_sqlx(err),
            other => StoreError::Other(format!("migration failed: {other}")),
        })
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::raw_sql("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn purge(&self, policy: &RetentionPolicy) -> Result<PurgeReport, StoreError> {
        // A connection of its own, closed at the end: the session-level lock
        // can never leak back into the pool.
        let mut conn = self.pool.acquire().await?.detach();
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(PURGE_LOCK)
            .fetch_one(&mut conn)
            .await?;
        if !locked {
            return Ok(PurgeReport::default());
        }
        let cutoff = OffsetDateTime::now_utc() - policy.retention;
        let outbox_cutoff = OffsetDateTime::now_utc() - policy.outbox_retention;
        let mut report = PurgeReport {
            ran: true,
            ..Default::default()
        };
        report.claims_deleted = delete_in_batches(
            &mut conn,
            "DELETE FROM processed_messages WHERE idempotency_key IN ( \
               SELECT idempotency_key FROM processed_messages WHERE claimed_at < $1 \
               ORDER BY claimed_at LIMIT $2)",
            cutoff,
            policy.batch_size,
        )
        .await?;
        report.audit_deleted = purge_audit(&mut conn, cutoff, policy.batch_size).await?;
        report.effects_deleted =
            delete_in_batches(&mut conn, effect::PURGE_SQL, cutoff, policy.batch_size).await?;
        report.outbox_deleted = delete_in_batches(
            &mut conn,
            "DELETE FROM outbox WHERE event_id IN ( \
               SELECT event_id FROM outbox WHERE created_at < $1 AND published_at < $1 \
               ORDER BY created_at LIMIT $2)",
            outbox_cutoff,
            policy.batch_size,
        )
        .await?;
        // Queue rows of events published by an older sidecar's relay during
        // the upgrade to migration 0016 (its mark did not know the queue).
        sqlx::query(
            "DELETE FROM outbox_queue q WHERE NOT EXISTS ( \
               SELECT 1 FROM outbox o WHERE o.event_id = q.event_id AND o.published_at IS NULL)",
        )
        .execute(&mut conn)
        .await?;
        let age: Option<f64> = sqlx::query_scalar(
            "SELECT extract(epoch FROM now() - min(claimed_at))::float8 FROM processed_messages",
        )
        .fetch_one(&mut conn)
        .await?;
        report.oldest_claim_age = age.map(|a| Duration::from_secs_f64(a.max(0.0)));
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(PURGE_LOCK)
            .execute(&mut conn)
            .await?;
        Ok(report)
    }

    async fn ledger_summary(&self) -> Result<LedgerSummary, StoreError> {
        let row = sqlx::query(LEDGER_SUMMARY_SQL).fetch_one(&self.pool).await?;
        Ok(ledger_summary_from_row(&row)?)
    }

    async fn privilege_excess(&self) -> Result<Option<Vec<String>>, StoreError> {
        let excess: Vec<String> = sqlx::raw_sql(PRIVILEGE_EXCESS_SQL)
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        Ok(Some(excess))
    }

    async fn replication(&self) -> Result<Option<Replication>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        Ok(Some(read_replication(&mut conn).await?))
    }

    async fn probe_primary(&self, timeout: Duration) -> Result<(), StoreError> {
        let mut probe = self.probe.lock().await;
        let read = tokio::time::timeout(timeout, async {
            let conn = match probe.as_mut() {
                Some(conn) => conn,
                None => probe.insert(PgConnection::connect_with(&self.probe_options).await?),
            };
            read_identity(&mut *conn, &self.primary).await?;
            if !self.primary.guard().required() {
                return Ok(true);
            }
            let r = read_replication(conn).await?;
            self.primary.guard().observe(&r);
            // The server's synchronous_commit is hidden behind a role
            // setting this session started with: read it on a new one.
            Ok::<_, sqlx::Error>(r.commit.is_some())
        })
        .await;
        match read {
            Ok(Ok(keep)) => {
                if !keep {
                    *probe = None;
                }
                Ok(())
            }
            failed => {
                // Broken, cut short, or on a server in recovery: the next
                // probe starts on a new connection.
                *probe = None;
                Err(match failed {
                    Ok(Err(e)) => StoreError::from(e),
                    _ => StoreError::Unavailable(format!("identity probe took over {timeout:?}")),
                })
            }
        }
    }

    async fn grant_app_role(&self, role: &str) -> Result<(), StoreError> {
        sqlx::query("SELECT oncegate_grant_app_role($1)")
            .bind(role)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn read_only_excess(&self) -> Result<Option<Vec<String>>, StoreError> {
        let excess: Vec<String> = sqlx::raw_sql(READ_ONLY_EXCESS_SQL)
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        Ok(Some(excess))
    }

    async fn grant_console_role(&self, role: &str) -> Result<(), StoreError> {
        sqlx::query("SELECT oncegate_grant_console_role($1)")
            .bind(role)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn retention_floor(&self) -> Result<Option<Duration>, StoreError> {
        let row =
            sqlx::raw_sql("SELECT extract(epoch FROM min_retention)::float8 FROM oncegate_retention_floor")
                .fetch_optional(&self.pool)
                .await?;
        let seconds: Option<f64> = row.map(|r| r.try_get(0)).transpose()?;
        Ok(seconds.map(|s| Duration::from_secs_f64(s.max(0.0))))
    }

    fn pool_usage(&self) -> Option<(u32, usize)> {
        Some((self.pool.size(), self.pool.num_idle()))
    }

    fn connections_held(&self) -> Option<u32> {
        // Locked: in use now, so open.
        let probe = self.probe.try_lock().map_or(1, |p| u32::from(p.is_some()));
        let listener = self.listener.try_lock().map_or(1, |l| u32::from(l.is_some()));
        Some(self.pool.size() + probe + listener)
    }
}

/// Audit rows older than `cutoff`: whole monthly partitions dropped, then
/// the boundary rows in batches (the functions clamp `cutoff` to the
/// database's retention floor, remove a sealed row only with its whole
/// seal, and record what they removed: migration 0005).
async fn purge_audit(
    conn: &mut sqlx::PgConnection,
    cutoff: OffsetDateTime,
    batch: i64,
) -> Result<u64, StoreError> {
    sqlx::query("SELECT oncegate_ensure_audit_partitions((now() AT TIME ZONE 'UTC')::date, 3)")
        .execute(&mut *conn)
        .await?;
    let dropped: i64 = sqlx::query_scalar("SELECT oncegate_drop_audit_partitions($1)")
        .bind(cutoff)
        .fetch_one(&mut *conn)
        .await?;
    let deleted = delete_in_batches(
        conn,
        "SELECT oncegate_purge_audit_rows($1, $2::int)",
        cutoff,
        batch,
    )
    .await?;
    Ok(dropped as u64 + deleted)
}

/// Runs a `(cutoff, batch)` delete (or a function returning a count) until a
/// batch comes back short; each batch is its own short transaction.
async fn delete_in_batches(
    conn: &mut sqlx::PgConnection,
    sql: &'static str,
    cutoff: OffsetDateTime,
    batch: i64,
) -> Result<u64, StoreError> {
    let mut total = 0u64;
    loop {
        let n = if sql.starts_with("SELECT") {
            sqlx::query_scalar::<_, i64>(sql)
                .bind(cutoff)
                .bind(batch)
                .fetch_one(&mut *conn)
                .await? as u64
        } else {
            sqlx::query(sql)
                .bind(cutoff)
                .bind(batch)
                .execute(&mut *conn)
                .await?
                .rows_affected()
        };
        total += n;
        if n < batch as u64 {
            return Ok(total);
        }
    }
}
