//! How this store begins and ends its transactions.
//!
//! - **The guard** (`ONCEGATE_REQUIRE_SYNC_REPLICA`; the three checks are
//!   in [`crate::primary::guard`]): claim and effect transactions commit
//!   under their own `synchronous_commit` and are answered only once the
//!   commit is known to have waited for a synchronous standby.
//! - **Behind a transaction pooler** (`ONCEGATE_DB_POOLER=transaction`:
//!   PgBouncer or another pooler that hands each transaction to whichever
//!   server connection is free): nothing of a session survives a
//!   transaction, so the session settings (lock, statement and
//!   idle-in-transaction timeouts) are set in every transaction, every
//!   statement with parameters runs inside an explicit transaction (the
//!   extended protocol's parse and bind would otherwise reach different
//!   server connections), and statements are unnamed (a named one would be
//!   prepared on one server connection and missing, or taken, on the next).
//!   Statements without parameters use the simple protocol, one message.
//!
//! Otherwise these are plain transactions on the pool.

use crate::error::StoreError;
use crate::primary::PrimaryWatch;
use crate::primary::guard::{Replication, Shortfall};
use crate::store::{Pooler, StoreSettings};
use sqlx::pool::PoolConnection;
use sqlx::postgres::PgTransactionManager;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Postgres, Row, SqlSafeStr, Transaction};
use sqlx_core::transaction::TransactionManager;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Read after a COMMIT returned, in a statement of its own (a
/// configuration reload is taken up between statements, never within one).
const STANDBY_NAMES_SQL: &str = "SELECT current_setting('synchronous_standby_names')";

/// Set once a store in this process runs behind a transaction pooler:
/// from then on the statements of the claim, effect, lookup and audit
/// paths are unnamed ([`named`]). A process serves one store; in a test
/// process that opens several, the others merely lose their statement
/// cache.
static UNNAMED_STATEMENTS: AtomicBool = AtomicBool::new(false);

/// Whether statements may be prepared under a name and cached (the
/// `persistent` flag of each query on the serving path).
pub(super) fn named() -> bool {
    !UNNAMED_STATEMENTS.load(Ordering::Relaxed)
}

#[derive(Clone)]
pub(super) struct Transactions {
    pub(super) pool: PgPool,
    /// The guard is required.
    sync: bool,
    /// Behind a transaction pooler.
    pooled: bool,
    /// `BEGIN` of a transaction whose commit the guard confirms.
    begin_commit: Arc<str>,
    /// `BEGIN` of any other transaction.
    begin_other: Arc<str>,
    primary: Arc<PrimaryWatch>,
    /// Claim transactions hand their connections back for their runners to
    /// keep ([`commit_claim`](Self::commit_claim)).
    keep: bool,
}

/// The smallest pool whose claim transactions hand back their connections:
/// one group-commit lane's two runners and one connection for everything
/// else. In a smaller pool (where `GroupCommitSettings::fit` runs one lane
/// all the same) a kept connection would be the one a lookup, or the
/// lane's other runner, is waiting for.
const KEEP_FROM_POOL_SIZE: u32 = 3;

impl Transactions {
    pub(super) fn new(pool: PgPool, primary: Arc<PrimaryWatch>, settings: &StoreSettings) -> Self {
        let pooled = settings.pooler == Pooler::Transaction;
        if pooled {
            UNNAMED_STATEMENTS.store(true, Ordering::Relaxed);
        }
        let sync = primary.guard().required();
        let mut begin = String::from("BEGIN");
        if pooled {
            let ms = |d: std::time::Duration| d.as_millis();
            begin += &format!(
                "; SET LOCAL lock_timeout = {}; SET LOCAL statement_timeout = {}; \
                 SET LOCAL idle_in_transaction_session_timeout = {}",
                ms(settings.lock_timeout),
                ms(settings.statement_timeout),
                ms(settings.idle_in_transaction_timeout)
            );
        }
        // The guard's transactions commit under their own
        // synchronous_commit, so a role, database or server setting changed
        // while serving cannot make them stop waiting for the standby (`on`:
        // the standby has flushed the commit, which is what survives a
        // promotion).
        let guarded = if sync {
            format!("{begin}; SET LOCAL synchronous_commit = on")
        } else {
            begin.clone()
        };
        Self {
            pool,
            sync,
            pooled,
            begin_commit: guarded.into(),
            begin_other: begin.into(),
            primary,
            keep: settings.pool_size >= KEEP_FROM_POOL_SIZE,
        }
    }

    /// Whether the guard is on (claim transactions then read the standbys
    /// before COMMIT).
    pub(super) fn guarded(&self) -> bool {
        self.sync
    }

    /// A transaction whose commit [`commit`](Self::commit) confirms.
    pub(super) async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        self.pool
            .begin_with(AssertSqlSafe(self.begin_commit.clone()))
            .await
    }

    /// A claim transaction, on `kept` — the connection of the last claim
    /// transaction its group-commit runner committed — or on one from the
    /// pool.
    pub(super) async fn begin_claim(
        &self,
        kept: Option<PoolConnection<Postgres>>,
    ) -> Result<ClaimTx, sqlx::Error> {
        let conn = match kept {
            Some(conn) => conn,
            None => self.pool.acquire().await?,
        };
        let mut tx = ClaimTx { conn: Some(conn) };
        let begin = AssertSqlSafe(self.begin_commit.clone()).into_sql_str();
        PgTransactionManager::begin(&mut tx, Some(begin)).await?;
        Ok(tx)
    }

    /// Commits `tx` as [`commit`](Self::commit) does, and hands back its
    /// connection for the runner to keep (unless the pool is too small to
    /// spare it: [`KEEP_FROM_POOL_SIZE`]).
    pub(super) async fn commit_claim(
        &self,
        mut tx: ClaimTx,
    ) -> Result<Option<PoolConnection<Postgres>>, StoreError> {
        PgTransactionManager::commit(&mut tx).await?;
        let conn = tx
            .conn
            .take()
            .expect("an open claim transaction has its connection");
        if self.sync {
            self.confirm_commit().await?;
        }
        Ok(self.keep.then_some(conn))
    }

    /// Where a statement with parameters runs outside a claim or effect
    /// transaction: a pooled connection, or behind a transaction pooler a
    /// transaction of its own. End it with [`Session::finish`].
    pub(super) async fn session(&self) -> Result<Session, sqlx::Error> {
        Ok(if self.pooled {
            Session::InTx(
                self.pool
                    .begin_with(AssertSqlSafe(self.begin_other.clone()))
                    .await?,
            )
        } else {
            Session::Pooled(self.pool.acquire().await?)
        })
    }

    /// The standbys a claim transaction read just before COMMIT: short of
    /// them, the guard refuses from now on and the caller rolls back.
    pub(super) fn check_before_commit(&self, read: Option<&Replication>) -> Result<(), StoreError> {
        if !self.sync {
            return Ok(());
        }
        let short = match read {
            Some(r) => r.standby_shortfall(),
            None => Some(Shortfall::Unknown(
                "the claim transaction read no standbys".into(),
            )),
        };
        match short {
            Some(s) => Err(self.fell_short(s)),
            None => Ok(()),
        }
    }

    /// Commits `tx`; under the guard, returns only once the commit is known
    /// to have waited for a standby.
    pub(super) async fn commit(&self, tx: Transaction<'static, Postgres>) -> Result<(), StoreError> {
        tx.commit().await?;
        if self.sync {
            self.confirm_commit().await?;
        }
        Ok(())
    }

    /// A COMMIT waiting for a standby is released unreplicated when
    /// `synchronous_standby_names` is cleared, and a commit that began
    /// after the clearing does not wait at all. The reload that clears it
    /// is signalled to every session before the process that releases the
    /// waiters, and a session takes it up before its next statement: so a
    /// statement sent after the COMMIT returned — on any session of this
    /// server — reads the cleared value whenever the commit did not wait.
    async fn confirm_commit(&self) -> Result<(), StoreError> {
        let names: String = sqlx::raw_sql(STANDBY_NAMES_SQL)
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        if !names.trim().is_empty() {
            return Ok(());
        }
        metrics::counter!("oncegate_sync_guard_unconfirmed_commits_total").increment(1);
        tracing::warn!(
            "a commit returned while synchronous_standby_names was cleared: it is on the primary alone, \
             answered UNAVAILABLE (not acknowledged); its redelivery resolves it"
        );
        Err(self.fell_short(Shortfall::NoStandbyNamed))
    }

    /// Refuses from now on, and asks the probe to read the primary again
    /// (it resumes claims when the standby is back).
    fn fell_short(&self, s: Shortfall) -> StoreError {
        self.primary.guard().fell_short(s.clone());
        self.primary.request_probe();
        StoreError::NoSyncStandby(s)
    }
}

/// A claim transaction on a pooled connection of its own, which its
/// group-commit runner may keep for its next batch once it has committed
/// ([`crate::store::KeptConnection`]). sqlx's own `Transaction` gives its
/// connection back to the pool at COMMIT, and sqlx tests every connection
/// going back with a round trip: at a steady rate, one round trip in five
/// of a claim transaction. Begun and ended through sqlx's transaction
/// manager, so that dropped uncommitted (an error, a future cut short) it
/// rolls back as a sqlx `Transaction` does: the ROLLBACK is queued and goes
/// out with the pool's test of the returning connection.
pub struct ClaimTx {
    /// `None` once committed.
    conn: Option<PoolConnection<Postgres>>,
}

impl Drop for ClaimTx {
    fn drop(&mut self) {
        if let Some(conn) = &mut self.conn {
            PgTransactionManager::start_rollback(conn);
        }
    }
}

impl std::ops::Deref for ClaimTx {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        self.conn
            .as_ref()
            .expect("an open claim transaction has its connection")
    }
}

impl std::ops::DerefMut for ClaimTx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn
            .as_mut()
            .expect("an open claim transaction has its connection")
    }
}

/// A connection for statements outside claim and effect transactions.
pub(super) enum Session {
    Pooled(PoolConnection<Postgres>),
    /// Behind a transaction pooler: the statements' own transaction.
    InTx(Transaction<'static, Postgres>),
}

impl Session {
    /// Commits the transaction, if there is one.
    pub(super) async fn finish(self) -> Result<(), sqlx::Error> {
        match self {
            Self::Pooled(_) => Ok(()),
            Self::InTx(tx) => tx.commit().await,
        }
    }
}

impl std::ops::Deref for Session {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        match self {
            Self::Pooled(c) => c,
            Self::InTx(tx) => tx,
        }
    }
}

impl std::ops::DerefMut for Session {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self {
            Self::Pooled(c) => c,
            Self::InTx(tx) => tx,
        }
    }
}
