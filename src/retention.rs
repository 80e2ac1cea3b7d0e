//! Retention (2 CFR §200.334): claims and audit rows older than the
//! retention period are purged; published outbox rows after their own,
//! shorter window. One instance purges at a time (the store's lock).

use crate::shutdown::Stop;
use crate::store::{AdminStore, PurgeReport, RetentionPolicy};
use std::sync::Arc;
use std::time::Duration;

/// Refuses a retention below the floor the database holds (Postgres): a
/// configuration error naming both values, never a silent clamp.
pub async fn check_floor(store: &dyn AdminStore, policy: &RetentionPolicy) -> anyhow::Result<()> {
    use anyhow::Context;
    let floor = store
        .retention_floor()
        .await
        .context("reading the retention floor")?;
    match floor {
        Some(floor) if policy.retention < floor => Err(crate::error::ConfigError(format!(
            "ONCEGATE_RETENTION is {}, below the database's retention floor of {} \
             (oncegate_retention_floor, 2 CFR 200.334); only the schema owner can lower the floor",
            humantime::format_duration(policy.retention),
            humantime::format_duration(floor)
        ))
        .into()),
        _ => Ok(()),
    }
}

pub struct Retention {
    store: Arc<dyn AdminStore>,
    policy: RetentionPolicy,
}

impl Retention {
    pub fn new(store: Arc<dyn AdminStore>, policy: RetentionPolicy) -> Self {
        Self { store, policy }
    }

    /// One purge run, with its metrics.
    pub async fn step(&self) -> Result<PurgeReport, crate::error::StoreError> {
        let report = self.store.purge(&self.policy).await?;
        if report.ran {
            metrics::counter!("oncegate_purge_deleted_total", "table" => "processed_messages")
                .increment(report.claims_deleted);
            metrics::counter!("oncegate_purge_deleted_total", "table" => "audit_log")
                .increment(report.audit_deleted);
            metrics::counter!("oncegate_purge_deleted_total", "table" => "outbox")
                .increment(report.outbox_deleted);
            metrics::counter!("oncegate_purge_deleted_total", "table" => "effects")
                .increment(report.effects_deleted);
            let lag = report
                .oldest_claim_age
                .map(|age| age.saturating_sub(self.policy.retention))
                .unwrap_or_default();
            metrics::gauge!("oncegate_purge_lag_seconds").set(lag.as_secs_f64());
            tracing::info!(
                claims = report.claims_deleted,
                audit = report.audit_deleted,
                outbox = report.outbox_deleted,
                effects = report.effects_deleted,
                "retention purge done"
            );
        } else {
            tracing::debug!("retention purge skipped: another instance holds the lock");
        }
        Ok(report)
    }

    /// Purges every `interval` until shutdown.
    pub async fn run(self, interval: Duration, mut stop: Stop) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.requested() => return,
                _ = tick.tick() => {
                    if let Err(e) = self.step().await {
                        tracing::warn!(error = %e, "retention purge failed");
                    }
                }
            }
        }
    }
}
