//! The sealed audit trail (DESIGN §10.3): audit rows sealed, in id order, into
//! a hash chain that proves after the fact whether anyone — the database
//! owner, a restore from an edited backup, a careless migration — changed,
//! removed or inserted a row.
//!
//! - [`Sealer`]: one sealing run ([`Sealer::step`]: `serve` every
//!   `ONCEGATE_AUDIT_SEAL_INTERVAL` and once more after the audit queue is
//!   flushed on shutdown; `oncegate audit seal` once). One instance at a time
//!   ([`crate::store::AuditStore::lock_sealing`]). A run seals the rows written
//!   since the last seal, up to the store's horizon
//!   ([`crate::store::AuditStore::audit_seal_horizon`]): every row that will ever
//!   hold an id up to it is already committed and visible, so no row is
//!   skipped; each seal starts right after the previous one's last id, so
//!   none is covered twice. A seal covers at most `max_rows` rows; a run
//!   makes as many as it needs.
//! - [`canonical`]: the encoding and the digests; [`verify`]: the check and
//!   its report; [`export`]: JSON Lines out and back in.
//!
//! Retention removes a sealed row only together with its whole seal (the
//! store's purge, which records what it removed): the seals stay, and
//! verification tells "purged under the retention policy" from "missing".

pub mod anchor;
pub mod canonical;
pub mod export;
pub mod signing;
pub mod verify;

use crate::error::StoreError;
use crate::shutdown::Stop;
use crate::store::{AuditSeal, AuditStore, RowCursor, SealHorizon, TimeRange};
use canonical::{Head, SealBuilder};
use std::sync::Arc;
use std::time::Duration;

/// How a sealing run behaves.
#[derive(Debug, Clone)]
pub struct SealSettings {
    /// How long a run waits for writers whose open transactions may still
    /// add a row below the horizon (Postgres); past it the run seals nothing.
    pub wait: Duration,
    /// Most rows one seal covers.
    pub max_rows: i64,
    /// Written into each seal (`sealed_by`).
    pub instance: Arc<str>,
    /// Signs each seal's digest (`ONCEGATE_AUDIT_SIGNING_KEY_FILE`).
    pub signer: Option<Arc<signing::SealSigner>>,
    /// Each seal is appended here and synced before the run reports it
    /// (`ONCEGATE_AUDIT_ANCHOR_FILE`).
    pub anchors: Option<Arc<anchor::AnchorFile>>,
}

/// When `serve` seals and verifies.
#[derive(Debug, Clone)]
pub struct SealSchedule {
    pub settings: SealSettings,
    /// Between sealing runs; zero: `serve` never seals.
    pub interval: Duration,
    /// Between full verifications in `serve`; zero: never.
    pub verify_interval: Duration,
}

/// What one sealing run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SealRun {
    /// Sealed `rows` rows into seals `first..=last` (possibly none: nothing
    /// new). `head` is the newest seal afterwards.
    Sealed {
        seals: Option<(i64, i64)>,
        rows: u64,
        head: Option<(i64, String)>,
    },
    /// Another instance holds the sealing lock.
    Busy,
    /// `writers` open transactions outlived the wait; nothing sealed.
    Deferred { writers: usize },
    /// Another sealer (or a purge) got there first; sealed nothing more.
    Raced,
}

/// Rows read per query while sealing.
const PAGE: i64 = 5_000;

pub struct Sealer {
    store: Arc<dyn AuditStore>,
    settings: SealSettings,
}

impl Sealer {
    pub fn new(store: Arc<dyn AuditStore>, settings: SealSettings) -> Self {
        Self { store, settings }
    }

    /// One sealing run, with its metrics.
    pub async fn step(&self) -> Result<SealRun, StoreError> {
        let started = std::time::Instant::now();
        let Some(lock) = self.store.lock_sealing().await? else {
            return Ok(SealRun::Busy);
        };
        let run = self.seal_locked().await;
        if let Err(e) = lock.release().await {
            tracing::warn!(error = %e, "releasing the sealing lock failed; it goes with its connection");
        }
        let run = run?;
        match &run {
            SealRun::Sealed {
                seals: Some((first, last)),
                rows,
                ..
            } => {
                metrics::counter!("oncegate_audit_rows_sealed_total").increment(*rows);
                tracing::info!(
                    first_seal = first,
                    last_seal = last,
                    rows,
                    ms = started.elapsed().as_millis() as u64,
                    "audit rows sealed"
                );
            }
            SealRun::Deferred { writers } => {
                metrics::counter!("oncegate_audit_seal_deferred_total").increment(1);
                tracing::warn!(
                    writers,
                    wait_ms = self.settings.wait.as_millis() as u64,
                    "sealing deferred: transactions that may still add audit rows outlived the wait"
                );
            }
            _ => {}
        }
        self.report_gauges().await;
        Ok(run)
    }

    async fn seal_locked(&self) -> Result<SealRun, StoreError> {
        let mut head = match self.store.last_audit_seal().await? {
            Some(s) => Head::from(&s),
            None => Head::genesis(),
        };
        let through = match self.store.audit_seal_horizon(self.settings.wait).await? {
            SealHorizon::Through(id) => id,
            SealHorizon::Blocked { writers, .. } => return Ok(SealRun::Deferred { writers }),
        };
        let (mut seals, mut rows) = (None::<(i64, i64)>, 0u64);
        while head.last_id < through {
            let Some(seal) = self.next_seal(&head, through).await? else {
                break;
            };
            if !self.store.insert_audit_seal(&seal).await? {
                return Ok(SealRun::Raced);
            }
            self.anchor(&seal).await?;
            rows += seal.row_count as u64;
            seals = Some((seals.map_or(seal.seq, |s| s.0), seal.seq));
            head = Head::from(&seal);
        }
        let newest = (head.seq > 0).then(|| (head.seq, head.digest.clone()));
        Ok(SealRun::Sealed {
            seals,
            rows,
            head: newest,
        })
    }

    /// Appends the seal to the anchor file, if one is set, and syncs it.
    /// A failed append fails the run (the seal stays in the chain); the
    /// anchor is written with the next one.
    async fn anchor(&self, seal: &AuditSeal) -> Result<(), StoreError> {
        let Some(file) = &self.settings.anchors else {
            return Ok(());
        };
        if let Err(e) = file.append_blocking(vec![anchor::Anchor::of(seal)]).await {
            metrics::counter!("oncegate_audit_anchor_failures_total").increment(1);
            tracing::error!(error = %e, seal = seal.seq, path = %file.path().display(), "appending the seal's anchor failed");
            return Err(StoreError::Other(format!(
                "seal {} is in the chain but its anchor could not be written to {}: {e}",
                seal.seq,
                file.path().display()
            )));
        }
        Ok(())
    }

    /// The seal after `head`: its rows up to `through`, at most `max_rows`;
    /// `None` when no row is there.
    async fn next_seal(&self, head: &Head, through: i64) -> Result<Option<AuditSeal>, StoreError> {
        let max = self.settings.max_rows.max(1);
        let mut builder = SealBuilder::after(head);
        let mut cursor = RowCursor::after_id(head.last_id);
        let mut capped = false;
        loop {
            let limit = (max - builder.len() as i64).min(PAGE);
            let page = self.store.audit_rows(cursor, through, limit).await?;
            for row in &page {
                builder.push(row).map_err(StoreError::Other)?;
            }
            let Some(last) = page.last() else { break };
            cursor = RowCursor::after(last);
            if (page.len() as i64) < limit {
                break;
            }
            if builder.len() as i64 >= max {
                capped = true;
                break;
            }
        }
        // A full seal ends at its last row; otherwise at the horizon (the
        // ids after the last row up to it are absent for good).
        let last_id = if capped { cursor.id } else { through };
        let mut seal = builder.finish(head, last_id, &self.settings.instance);
        if let (Some(seal), Some(signer)) = (seal.as_mut(), &self.settings.signer) {
            seal.signature = Some(signer.sign(&seal.digest));
            seal.key_id = Some(signer.key_id().to_string());
        }
        Ok(seal)
    }

    /// Last seal age and rows waiting.
    async fn report_gauges(&self) {
        let head = match self.store.last_audit_seal().await {
            Ok(head) => head,
            Err(e) => return tracing::debug!(error = %e, "reading the newest seal for the gauges failed"),
        };
        if let Some(seal) = &head {
            let age = crate::time_fmt::now_micros() - seal.sealed_at;
            metrics::gauge!("oncegate_audit_last_seal_age_seconds").set(age.as_seconds_f64().max(0.0));
        }
        let after = head.map_or(0, |s| s.last_id);
        match self.store.audit_rows_after(after, &TimeRange::default()).await {
            Ok(span) => metrics::gauge!("oncegate_audit_unsealed_rows").set(span.count as f64),
            Err(e) => tracing::debug!(error = %e, "counting unsealed audit rows failed"),
        }
    }

    /// Seals every `interval` until `stop`; then, once `flushed` resolves
    /// (the audit queue is written out), seals a last time.
    pub async fn run(self, interval: Duration, mut stop: Stop, flushed: impl Future<Output = ()> + Send) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.requested() => break,
                _ = tick.tick() => self.step_logged().await,
            }
        }
        flushed.await;
        // Bounded: the drain must end even with the store gone.
        let bound = self.settings.wait + Duration::from_secs(10);
        if tokio::time::timeout(bound, self.step_logged()).await.is_err() {
            tracing::warn!("the last seal before shutdown did not finish in time");
        }
    }

    async fn step_logged(&self) {
        match self.step().await {
            Ok(SealRun::Raced) => tracing::info!("another sealer got there first; sealing again next round"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "sealing audit rows failed"),
        }
    }
}

/// Verifies the whole chain every `interval` (the first time one interval
/// after start) until `stop`, and sets `oncegate_audit_verify_mismatches`.
pub async fn run_verifier(store: Arc<dyn AuditStore>, interval: Duration, mut stop: Stop) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.requested() => return,
            _ = tick.tick() => {
                match verify::verify_store(&*store, &TimeRange::default(), Default::default(), &mut |_, _| {}).await {
                    Ok(report) => record_verification(&report),
                    Err(e) => tracing::warn!(error = %e, "verifying the audit trail failed"),
                }
            }
        }
    }
}

/// The verify gauge and a log line for a finished verification.
pub fn record_verification(report: &verify::VerifyReport) {
    metrics::gauge!("oncegate_audit_verify_mismatches").set(report.findings_total as f64);
    match report.findings.first() {
        None => tracing::info!(
            seals = report.seals_checked,
            rows = report.rows_checked,
            "audit trail verified"
        ),
        Some(first) => tracing::error!(
            mismatches = report.findings_total,
            first = %first,
            "audit trail does not verify"
        ),
    }
}
