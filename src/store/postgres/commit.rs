//! Transactions whose commit must be on a synchronous standby before it is
//! answered (`ONCEGATE_REQUIRE_SYNC_REPLICA`; the three checks are in
//! [`crate::primary::guard`]). Without the guard these are plain
//! transactions on the pool.

use crate::error::StoreError;
use crate::primary::PrimaryWatch;
use crate::primary::guard::{Replication, Shortfall};
use sqlx::{PgPool, Postgres, Transaction};
use std::sync::Arc;

/// `BEGIN` under the guard: the transaction's own `synchronous_commit`, so
/// a role, database or server setting changed while serving cannot make
/// its commit stop waiting for the standby (`on`: the standby has flushed
/// the commit, which is what survives a promotion).
const BEGIN_SYNC: &str = "BEGIN; SET LOCAL synchronous_commit = on";

/// Read after a COMMIT returned, in a statement of its own (a
/// configuration reload is taken up between statements, never within one).
const STANDBY_NAMES_SQL: &str = "SELECT current_setting('synchronous_standby_names')";

#[derive(Clone)]
pub(super) struct Commits {
    pub(super) pool: PgPool,
    /// The guard is required.
    sync: bool,
    primary: Arc<PrimaryWatch>,
}

impl Commits {
    pub(super) fn new(pool: PgPool, primary: Arc<PrimaryWatch>) -> Self {
        Self {
            sync: primary.guard().required(),
            pool,
            primary,
        }
    }

    /// Whether the guard is on (claim transactions then read the standbys
    /// before COMMIT).
    pub(super) fn guarded(&self) -> bool {
        self.sync
    }

    pub(super) async fn begin(&self) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        if self.sync {
            self.pool.begin_with(BEGIN_SYNC).await
        } else {
            self.pool.begin().await
        }
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
        let names: String = sqlx::query_scalar(STANDBY_NAMES_SQL)
            .fetch_one(&self.pool)
            .await?;
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
