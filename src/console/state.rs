//! What every console page shares: the store, the token, where the relays'
//! metrics are, and the trail's last verification.

use crate::seal::verify::{self, Checks, Finding, VerifyReport};
use crate::store::{Store, TimeRange};
use sha2::{Digest, Sha256};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use time::OffsetDateTime;

/// The name of the cookie that keeps the token a browser entered.
pub const TOKEN_COOKIE: &str = "oncegate_console_token";

/// The console's settings (filled by `config`'s `ConsoleArgs`).
#[derive(Clone)]
pub struct ConsoleSettings {
    /// Where the console listens (loopback by default).
    pub listen: SocketAddr,
    /// The bearer token every page needs (read from a file).
    pub token: String,
    /// The sidecars' (or relays') metrics listeners, read for the breaker.
    pub relay_metrics: Vec<SocketAddr>,
    /// How often the trail is verified in the background; zero: on demand only.
    pub verify_interval: std::time::Duration,
    /// Public keys (and anchors) the verification checks, as `audit verify`'s.
    pub checks: Checks,
    /// Refuse to start (exit 64) when the database role can do more than read.
    pub require_read_only: bool,
    /// Disbursements per page of an award.
    pub page_size: i64,
}

impl std::fmt::Debug for ConsoleSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleSettings")
            .field("listen", &self.listen)
            .field("token", &"***")
            .field("relay_metrics", &self.relay_metrics)
            .field("verify_interval", &self.verify_interval)
            .field("require_read_only", &self.require_read_only)
            .finish()
    }
}

/// How a verification was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    OnDemand,
    Scheduled,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OnDemand => "on demand",
            Self::Scheduled => "on schedule",
        }
    }
}

/// A finished verification of the whole trail.
#[derive(Debug, Clone)]
pub struct Verified {
    pub started: OffsetDateTime,
    pub finished: OffsetDateTime,
    pub trigger: Trigger,
    /// The report, or why the store could not be read (logged in full).
    pub report: Result<VerifyReport, String>,
}

impl Verified {
    /// What this verification says of seal `seq`: verified, failed, or not
    /// covered (newer than the verification).
    pub fn seal_status(&self, seq: i64) -> SealStatus {
        let Ok(report) = &self.report else {
            return SealStatus::NotVerified;
        };
        if report.findings.iter().any(|f| finding_seal(f) == Some(seq)) {
            return SealStatus::Failed;
        }
        match report.seals {
            Some((first, last)) if (first..=last).contains(&seq) && report.findings_total == 0 => {
                SealStatus::Verified
            }
            Some((first, last)) if (first..=last).contains(&seq) => SealStatus::InFailedRun,
            _ => SealStatus::NotVerified,
        }
    }
}

/// A seal as the last verification left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealStatus {
    Verified,
    Failed,
    /// Checked in a run that found problems elsewhere (not in this seal).
    InFailedRun,
    NotVerified,
}

/// The seal a finding names, if it names one.
fn finding_seal(f: &Finding) -> Option<i64> {
    match f {
        Finding::RowChanged { seal, .. }
        | Finding::RowRemoved { seal, .. }
        | Finding::SealChanged { seal, .. }
        | Finding::SignatureBad { seal, .. }
        | Finding::SignatureMissing { seal, .. }
        | Finding::AnchorDisagrees { seal, .. } => Some(*seal),
        Finding::RowInserted { seal, .. } => *seal,
        _ => None,
    }
}

/// The trail's verification: the one running (since when) and the last done.
#[derive(Debug, Default)]
pub struct Verification {
    pub running_since: Option<OffsetDateTime>,
    pub last: Option<Verified>,
}

/// Shared by every request.
pub struct State {
    pub store: Arc<dyn Store>,
    token_digest: [u8; 32],
    pub relay_metrics: Vec<SocketAddr>,
    pub checks: Checks,
    pub page_size: i64,
    pub verification: Mutex<Verification>,
}

impl State {
    pub fn new(store: Arc<dyn Store>, settings: &ConsoleSettings) -> Self {
        Self {
            store,
            token_digest: Sha256::digest(settings.token.as_bytes()).into(),
            relay_metrics: settings.relay_metrics.clone(),
            checks: settings.checks.clone(),
            page_size: settings.page_size,
            verification: Mutex::new(Verification::default()),
        }
    }

    /// Whether `offered` is the token, compared in constant time (over
    /// digests, so the length leaks nothing either).
    pub fn token_matches(&self, offered: &str) -> bool {
        let offered: [u8; 32] = Sha256::digest(offered.as_bytes()).into();
        offered
            .iter()
            .zip(self.token_digest.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Verification> {
        self.verification.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The verification state, copied out.
    pub fn verification(&self) -> (Option<OffsetDateTime>, Option<Verified>) {
        let v = self.lock();
        (v.running_since, v.last.clone())
    }

    /// Verifies the whole trail with `audit verify`'s code, unless a
    /// verification is already running; records the result and its time.
    pub async fn verify(&self, trigger: Trigger) {
        let started = OffsetDateTime::now_utc();
        {
            let mut v = self.lock();
            if v.running_since.is_some() {
                return;
            }
            v.running_since = Some(started);
        }
        let range = TimeRange { from: None, to: None };
        let result = verify::verify_store(&*self.store, &range, self.checks.clone(), &mut |_, _| {}).await;
        let report = result.map_err(|e| {
            tracing::warn!(error = %e, "console: verifying the audit trail failed");
            "the store could not be read (the console's log has the error)".to_string()
        });
        if let Ok(r) = &report {
            tracing::info!(
                clean = r.is_clean(),
                findings = r.findings_total,
                trigger = trigger.as_str(),
                "console: audit trail verified"
            );
        }
        let mut v = self.lock();
        v.running_since = None;
        v.last = Some(Verified {
            started,
            finished: OffsetDateTime::now_utc(),
            trigger,
            report,
        });
    }
}
