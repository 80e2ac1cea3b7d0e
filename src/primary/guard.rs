//! The synchronous-standby guard (`ONCEGATE_REQUIRE_SYNC_REPLICA`, DESIGN §7.3):
//! whether a commit the primary acknowledges is also on a synchronous
//! standby, checked all the time.
//!
//! Three checks, from coarse to exact:
//! - **The probe** reads [`Replication`] on every identity probe and at
//!   start: what the primary names in `synchronous_standby_names`, how many
//!   of those standbys stream, and `synchronous_commit` as the application
//!   role's sessions get it (a role- or database-level setting counts).
//!   Short of what is required, [`SyncGuard`] refuses new claims at once
//!   (UNAVAILABLE naming what is missing), the gRPC health of the Gate says
//!   NOT_SERVING and a gauge says why; the next probe that finds it back
//!   resumes by itself.
//! - **Before COMMIT**, inside every claim transaction, the same standby
//!   reading (`oncegate_sync_standbys()`): a transaction that would commit
//!   without a standby is rolled back, nothing written. The transaction
//!   also sets `synchronous_commit = on` locally, so a role, database or
//!   server setting changed while serving cannot make its commit stop
//!   waiting.
//! - **After COMMIT**, before the answer: `synchronous_standby_names` read
//!   again. A commit waiting for a standby that is gone is released — and
//!   acknowledged unreplicated — when the names are cleared (what Patroni
//!   does in its non-strict `synchronous_mode`); the release comes from the
//!   configuration reload, which every session processes before its next
//!   statement, so a commit released that way is seen here and answered
//!   UNAVAILABLE, never CLAIMED. It stays committed on the primary alone,
//!   unacknowledged: the redelivery resolves it (a duplicate once the
//!   standby has it, a fresh claim on a promoted standby that never had it).

use std::sync::Mutex;

/// How the application role's sessions commit, as read on the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replication {
    /// `synchronous_standby_names` as the server has it.
    pub standby_names: String,
    /// How many standbys must confirm a commit: 0 when none is named.
    pub required: i32,
    /// Synchronous standbys streaming now (`sync` or `quorum`); `None` when
    /// the schema owner may not see them (it needs `pg_read_all_stats`).
    pub streaming: Option<i32>,
    /// `synchronous_commit` as a new session of the application role gets
    /// it, and from where; `None` when unknown (see [`CommitSetting`]).
    pub commit: Option<CommitSetting>,
}

/// A `synchronous_commit` value and where it is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitSetting {
    pub value: String,
    /// "role oncegate_app", "database test", "the server", …
    pub set_for: String,
}

/// What is missing for an acknowledged commit to be on a standby.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shortfall {
    /// `synchronous_standby_names` is empty: commits wait for no standby.
    NoStandbyNamed,
    /// `synchronous_commit` is `local` or `off` for the role's sessions.
    CommitDoesNotWait(CommitSetting),
    /// Fewer synchronous standbys stream than the names require: commits
    /// would wait, unacknowledged, until enough come back.
    NotStreaming {
        streaming: i32,
        required: i32,
        names: String,
    },
    /// The schema owner may not read `pg_stat_replication`.
    StandbysUnreadable,
    /// The replication settings could not be read (the store is down, or
    /// the migration with `oncegate_sync_standbys()` has not run).
    Unknown(String),
}

impl Shortfall {
    /// The `reason` label of `oncegate_sync_standby_shortfall`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::NoStandbyNamed => "no_standby_named",
            Self::CommitDoesNotWait(_) => "commit_does_not_wait",
            Self::NotStreaming { .. } => "standby_not_streaming",
            Self::StandbysUnreadable => "standbys_unreadable",
            Self::Unknown(_) => "unknown",
        }
    }

    /// What a refused caller is told (it names settings, never data).
    pub fn refusal(&self) -> String {
        format!(
            "refused until a synchronous standby confirms commits \
             (ONCEGATE_REQUIRE_SYNC_REPLICA): {self}; retry"
        )
    }

    /// Every label, for the gauge's other series.
    pub const LABELS: [&'static str; 5] = [
        "no_standby_named",
        "commit_does_not_wait",
        "standby_not_streaming",
        "standbys_unreadable",
        "unknown",
    ];
}

impl std::fmt::Display for Shortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoStandbyNamed => write!(
                f,
                "synchronous_standby_names is empty on the primary: commits wait for no standby"
            ),
            Self::CommitDoesNotWait(c) => write!(
                f,
                "synchronous_commit = {} for {}: commits do not wait for a standby",
                c.value, c.set_for
            ),
            Self::NotStreaming {
                streaming,
                required,
                names,
            } => write!(
                f,
                "{streaming} of {required} required synchronous standbys streaming \
                 (synchronous_standby_names = {names:?})"
            ),
            Self::StandbysUnreadable => write!(
                f,
                "the schema owner may not read pg_stat_replication, so whether a synchronous \
                 standby streams is unknown (GRANT pg_read_all_stats TO the owner; migrations/GRANTS.md)"
            ),
            Self::Unknown(why) => write!(f, "the replication settings could not be read: {why}"),
        }
    }
}

/// `synchronous_commit` values that make a commit wait for a standby.
fn waits(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "on" | "true" | "yes" | "1" | "remote_write" | "remote_apply"
    )
}

impl Replication {
    /// What is missing for the role's commits to be on a standby when
    /// acknowledged; `None` when nothing is.
    pub fn shortfall(&self) -> Option<Shortfall> {
        if let Some(c) = self.commit.as_ref().filter(|c| !waits(&c.value)) {
            return Some(Shortfall::CommitDoesNotWait(c.clone()));
        }
        self.standby_shortfall()
    }

    /// The standbys alone (the claim transaction sets its own
    /// `synchronous_commit`): named, and enough of them streaming.
    pub fn standby_shortfall(&self) -> Option<Shortfall> {
        if self.required <= 0 {
            return Some(Shortfall::NoStandbyNamed);
        }
        match self.streaming {
            None => Some(Shortfall::StandbysUnreadable),
            Some(n) if n < self.required => Some(Shortfall::NotStreaming {
                streaming: n,
                required: self.required,
                names: self.standby_names.clone(),
            }),
            Some(_) => None,
        }
    }
}

/// The guard's state, shared by the probe, the claim path and the health
/// service. Not required (the setting off): never refuses.
#[derive(Debug)]
pub struct SyncGuard {
    required: bool,
    short: Mutex<Option<Shortfall>>,
    /// True while claims are accepted: the Gate's gRPC health follows it.
    serving: tokio::sync::watch::Sender<bool>,
}

impl SyncGuard {
    /// With `required`, nothing is accepted until the first reading says
    /// the standby is there.
    pub fn new(required: bool) -> Self {
        let short = required.then(|| Shortfall::Unknown("not read yet".into()));
        if required {
            set_gauges(short.as_ref());
        }
        Self {
            required,
            serving: tokio::sync::watch::Sender::new(short.is_none()),
            short: Mutex::new(short),
        }
    }

    pub fn required(&self) -> bool {
        self.required
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Shortfall>> {
        self.short.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why new claims are refused now, as the client reads it; `None` while
    /// they are accepted (always, when the guard is not required).
    pub fn refusal(&self) -> Option<String> {
        if !self.required {
            return None;
        }
        self.lock().as_ref().map(Shortfall::refusal)
    }

    /// The current shortfall, if any.
    pub fn shortfall(&self) -> Option<Shortfall> {
        self.lock().clone()
    }

    /// A reading of the primary (the probe, start-up): refuses or resumes.
    pub fn observe(&self, r: &Replication) {
        self.set(r.shortfall());
    }

    /// The claim path found `s` (before or after a commit): refuse at once.
    pub fn fell_short(&self, s: Shortfall) {
        self.set(Some(s));
    }

    /// Resolves with the serving flag whenever it changes (health).
    pub fn serving(&self) -> tokio::sync::watch::Receiver<bool> {
        self.serving.subscribe()
    }

    fn set(&self, now: Option<Shortfall>) {
        if !self.required {
            return;
        }
        let mut short = self.lock();
        if *short == now {
            return;
        }
        match (&*short, &now) {
            (_, Some(s)) => {
                tracing::warn!(reason = s.label(), why = %s, "claims refused: no synchronous standby confirms commits")
            }
            (Some(before), None) => tracing::info!(
                after = before.label(),
                "synchronous standby confirms commits again: claims accepted"
            ),
            (None, None) => {}
        }
        set_gauges(now.as_ref());
        self.serving.send_replace(now.is_none());
        *short = now;
    }
}

fn set_gauges(short: Option<&Shortfall>) {
    metrics::gauge!("oncegate_db_sync_replica").set(if short.is_none() { 1.0 } else { 0.0 });
    for label in Shortfall::LABELS {
        let on = short.is_some_and(|s| s.label() == label);
        metrics::gauge!("oncegate_sync_standby_shortfall", "reason" => label).set(if on { 1.0 } else { 0.0 });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(names: &str, required: i32, streaming: Option<i32>, commit: &str) -> Replication {
        Replication {
            standby_names: names.into(),
            required,
            streaming,
            commit: Some(CommitSetting {
                value: commit.into(),
                set_for: "the server".into(),
            }),
        }
    }

    #[test]
    fn a_named_streaming_standby_and_a_waiting_commit_is_enough() {
        assert_eq!(r("s1", 1, Some(1), "on").shortfall(), None);
        assert_eq!(r("ANY 1 (s1, s2)", 1, Some(2), "remote_apply").shortfall(), None);
        assert_eq!(r("FIRST 2 (a, b)", 2, Some(2), "remote_write").shortfall(), None);
        assert_eq!(r("s1", 1, Some(1), "true").shortfall(), None);
    }

    #[test]
    fn each_missing_part_is_named() {
        assert_eq!(
            r("", 0, Some(0), "on").shortfall(),
            Some(Shortfall::NoStandbyNamed)
        );
        let local = r("s1", 1, Some(1), "local").shortfall().expect("short");
        assert_eq!(local.label(), "commit_does_not_wait");
        assert!(
            local
                .to_string()
                .contains("synchronous_commit = local for the server")
        );
        assert_eq!(
            r("s1", 1, Some(1), "off").shortfall().map(|s| s.label()),
            Some("commit_does_not_wait")
        );
        let behind = r("ANY 1 (s1)", 1, Some(0), "on").shortfall().expect("short");
        assert_eq!(
            behind.to_string(),
            "0 of 1 required synchronous standbys streaming (synchronous_standby_names = \"ANY 1 (s1)\")"
        );
        assert_eq!(
            r("FIRST 2 (a, b)", 2, Some(1), "on")
                .shortfall()
                .map(|s| s.label()),
            Some("standby_not_streaming")
        );
        assert_eq!(
            r("s1", 1, None, "on").shortfall(),
            Some(Shortfall::StandbysUnreadable)
        );
    }

    #[test]
    fn the_claim_transaction_checks_the_standbys_alone() {
        assert_eq!(r("s1", 1, Some(1), "local").standby_shortfall(), None);
        let unknown_commit = Replication {
            commit: None,
            ..r("s1", 1, Some(1), "on")
        };
        assert_eq!(unknown_commit.shortfall(), None);
    }

    #[test]
    fn refuses_until_read_and_resumes_by_itself() {
        let g = SyncGuard::new(true);
        let serving = g.serving();
        assert!(g.refusal().expect("not read yet").contains("not read yet"));
        assert!(!*serving.borrow());
        g.observe(&r("s1", 1, Some(1), "on"));
        assert_eq!(g.refusal(), None);
        assert!(*serving.borrow());
        g.fell_short(Shortfall::NoStandbyNamed);
        let why = g.refusal().expect("refused");
        assert!(
            why.contains("ONCEGATE_REQUIRE_SYNC_REPLICA")
                && why.contains("synchronous_standby_names is empty")
        );
        assert!(!*serving.borrow());
        g.observe(&r("s1", 1, Some(1), "on"));
        assert_eq!(g.refusal(), None);
    }

    #[test]
    fn not_required_never_refuses() {
        let g = SyncGuard::new(false);
        g.fell_short(Shortfall::NoStandbyNamed);
        assert_eq!(g.refusal(), None);
        assert!(*g.serving().borrow());
    }
}
