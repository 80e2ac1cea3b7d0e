//! Which server the store is talking to, and whether the caches may answer
//! for it (DESIGN §7.2, Postgres failover).
//!
//! A standby promoted after an asynchronous failover does not hold every
//! claim the old primary acknowledged, yet L1 and L2 still do. So every
//! cached answer is tied to the identity of the primary that committed it:
//! its system identifier and WAL timeline (a promotion starts a new
//! timeline; a restore from backup does too). The store reports the
//! identity it sees on every new connection and on a periodic probe; when
//! it changes, the [`PrimaryWatch`] moves to a new [`Epoch`]: L1 entries
//! tagged with an older generation stop answering (and are dropped), and L2
//! values carry the epoch's tag, so every pod's entries from before stop
//! answering too. An L1 or L2 hit touches no connection, so a failed probe
//! (or a lost connection) *suspends* cache answers until a connection has
//! confirmed the identity again: the same server resumes, a new one starts
//! a new epoch first.
//!
//! # The cache window
//! A primary that vanishes without a reset (a frozen host, dropped packets)
//! fails no call: only the probe notices, when its answer does not come. So
//! caches answer only while the last confirmation is recent: a confirmation
//! counts from the moment its query was *sent* (the identity held then, not
//! necessarily when the answer arrived) and lasts the probe's interval plus
//! its timeout ([`PrimaryWatch::set_confirmation_lease`]). Whatever happens
//! to the probe task (a busy machine delays timers too), no cache answers
//! later than that after the primary vanished: the window is at most
//! `ONCEGATE_PRIMARY_PROBE_INTERVAL + ONCEGATE_PRIMARY_PROBE_TIMEOUT`.
//!
//! The same watch carries the synchronous-standby [`guard`], and whether
//! the store refuses claims although it answers ([`Refusal`]: a grant
//! missing, a read-only server): that is an outage of the store, shown in
//! the Gate's health until a claim succeeds again, but not a lost
//! connection — the server that answered is the one confirmed, so cached
//! confirmed results go on answering.

pub mod guard;

use guard::SyncGuard;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// What identifies a primary's history: a promoted standby has the same
/// system identifier as its old primary but a new timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerIdentity {
    pub system_identifier: i64,
    pub timeline: u32,
}

impl ServerIdentity {
    /// The L2 tag of results committed on this server: `{sysid hex}.{timeline}`.
    pub fn tag(&self) -> String {
        format!("{:x}.{}", self.system_identifier, self.timeline)
    }
}

/// The caches' current epoch: L1 entries carry `generation`, L2 values `tag`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Epoch {
    pub generation: u64,
    pub tag: std::sync::Arc<str>,
}

#[derive(Debug)]
struct State {
    identity: Option<ServerIdentity>,
    epoch: Epoch,
    /// A connection has confirmed `identity` and none has failed since.
    confirmed: bool,
    /// When the latest confirming read was sent.
    confirmed_at: Option<Instant>,
    /// How long a confirmation lets caches answer; `None`: until suspended.
    lease: Option<Duration>,
}

/// The identity last seen and whether caches may answer (see the module doc).
#[derive(Debug)]
pub struct PrimaryWatch {
    state: Mutex<State>,
    /// False for a store without servers (SQLite): always trusted.
    watched: bool,
    /// Asks the probe to re-read the identity now (a connection was lost).
    probe_now: tokio::sync::Notify,
    /// Whether commits are on a synchronous standby (when required).
    guard: SyncGuard,
    /// Why the store refuses claims now, if it does.
    refusal: Mutex<Option<Refusal>>,
    /// `refusal` is set (read without the lock on every claim).
    refusing: AtomicBool,
    /// False while the store refuses claims (health).
    taking_claims: tokio::sync::watch::Sender<bool>,
}

impl PrimaryWatch {
    /// For a store with a server: nothing confirmed yet, so no cache answers
    /// until the first connection has read the identity. With
    /// `require_sync_standby`, no claim is accepted until the guard has
    /// read the primary's standbys.
    pub fn new(require_sync_standby: bool) -> Self {
        metrics::gauge!("oncegate_store_identity_confirmed").set(0.0);
        Self::with(false, true, require_sync_standby)
    }

    /// For an embedded store (no failover possible): always trusted, tag "".
    pub fn embedded() -> Self {
        Self::with(true, false, false)
    }

    fn with(confirmed: bool, watched: bool, require_sync_standby: bool) -> Self {
        // Exported from the start, 0 (the alert and the dashboard read them).
        for cause in Refusal::LABELS {
            metrics::gauge!("oncegate_store_refusing", "cause" => cause).set(0.0);
            metrics::counter!("oncegate_store_refusals_total", "cause" => cause).increment(0);
        }
        Self {
            state: Mutex::new(State {
                identity: None,
                epoch: Epoch {
                    generation: 0,
                    tag: "".into(),
                },
                confirmed,
                confirmed_at: None,
                lease: None,
            }),
            watched,
            probe_now: tokio::sync::Notify::new(),
            guard: SyncGuard::new(require_sync_standby),
            refusal: Mutex::new(None),
            refusing: AtomicBool::new(false),
            taking_claims: tokio::sync::watch::Sender::new(true),
        }
    }

    /// The synchronous-standby guard.
    pub fn guard(&self) -> &SyncGuard {
        &self.guard
    }

    /// From now on a confirmation lets caches answer for `lease` after its
    /// read was sent (the probe's interval plus its timeout), unless a newer
    /// one extends it: see the module doc's cache window.
    pub fn set_confirmation_lease(&self, lease: Duration) {
        if self.watched {
            self.lock().lease = Some(lease);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The epoch caches may answer in, or `None` while suspended or once
    /// the last confirmation is older than the lease.
    pub fn trusted(&self) -> Option<Epoch> {
        let state = self.lock();
        let fresh = match (state.lease, state.confirmed_at) {
            (Some(lease), Some(at)) => Instant::now() < at + lease,
            (Some(_), None) => !self.watched,
            (None, _) => true,
        };
        (state.confirmed && fresh).then(|| state.epoch.clone())
    }

    /// The identity last confirmed (none yet, or an embedded store: `None`).
    pub fn identity(&self) -> Option<ServerIdentity> {
        self.lock().identity
    }

    /// A connection read `seen` with a query sent at `sent`: confirms it,
    /// or — a different server than before — moves to a new epoch first
    /// (counted and logged). Returns whether the epoch moved. A read sent
    /// before the latest confirmation that names another server is stale
    /// (an old primary answering late) and ignored.
    pub fn observe(&self, seen: ServerIdentity, sent: Instant) -> bool {
        let mut state = self.lock();
        if let (Some(known), Some(at)) = (state.identity, state.confirmed_at)
            && known != seen
            && sent < at
        {
            // Sent before a read that already saw `known`: an answer from
            // the old server arriving late says nothing about today.
            tracing::info!(
                timeline = seen.timeline,
                "a stale identity read (sent before the latest confirmation) ignored"
            );
            return false;
        }
        state.confirmed_at = Some(state.confirmed_at.map_or(sent, |at| at.max(sent)));
        let moved = match state.identity {
            Some(known) if known == seen => false,
            Some(known) => {
                metrics::counter!("oncegate_store_failovers_total").increment(1);
                tracing::warn!(
                    system_identifier = seen.system_identifier,
                    timeline = seen.timeline,
                    previous_system_identifier = known.system_identifier,
                    previous_timeline = known.timeline,
                    "the store is a different primary: caches start a new epoch, answers from before are dropped"
                );
                true
            }
            None => {
                tracing::info!(
                    system_identifier = seen.system_identifier,
                    timeline = seen.timeline,
                    "store identity read"
                );
                false
            }
        };
        if moved || state.identity.is_none() {
            state.identity = Some(seen);
            state.epoch = Epoch {
                generation: state.epoch.generation + u64::from(moved),
                tag: seen.tag().into(),
            };
        }
        if !state.confirmed {
            state.confirmed = true;
            metrics::gauge!("oncegate_store_identity_confirmed").set(1.0);
            if !moved {
                tracing::info!(
                    timeline = seen.timeline,
                    "store identity confirmed; caches answer again"
                );
            }
        }
        moved
    }

    /// The connection to the primary is lost or unconfirmed: no cache
    /// answers until [`observe`](Self::observe) confirms it again.
    pub fn suspend(&self, why: &str) {
        if !self.watched {
            return;
        }
        let mut state = self.lock();
        if state.confirmed {
            state.confirmed = false;
            metrics::gauge!("oncegate_store_identity_confirmed").set(0.0);
            tracing::warn!(why, "store identity unconfirmed: cache answers suspended");
        }
    }
}

impl PrimaryWatch {
    /// A store call lost its connection (or found none): suspends cache
    /// answers at once and asks the probe to re-read the identity now, so
    /// a primary that is merely busy is confirmed again within a round trip.
    pub fn connection_lost(&self, why: &str) {
        self.suspend(why);
        if self.watched {
            self.probe_now.notify_one();
        }
    }

    /// Asks the probe to read the primary now, without suspending caches
    /// (the guard found the standby short in a claim transaction).
    pub fn request_probe(&self) {
        if self.watched {
            self.probe_now.notify_one();
        }
    }

    /// Resolves when a probe was asked for ([`connection_lost`](Self::connection_lost),
    /// [`request_probe`](Self::request_probe)).
    pub async fn probe_requested(&self) {
        self.probe_now.notified().await;
    }
}

impl PrimaryWatch {
    /// The server answered a claim with `refusal`: counted; from the first
    /// one on, the Gate's health says NOT_SERVING and the log says why
    /// once, until [`claims_taken`](Self::claims_taken). Cache answers are
    /// not suspended: the server that answered is the one confirmed.
    pub fn refused(&self, refusal: &Refusal) {
        metrics::counter!("oncegate_store_refusals_total", "cause" => refusal.label()).increment(1);
        let mut now = self.refusal.lock().unwrap_or_else(|p| p.into_inner());
        if now.as_ref() == Some(refusal) {
            return;
        }
        tracing::warn!(
            cause = refusal.label(),
            why = %refusal,
            "the store refuses claims: answered UNAVAILABLE, Gate health NOT_SERVING until a claim succeeds"
        );
        for cause in Refusal::LABELS {
            let on = cause == refusal.label();
            metrics::gauge!("oncegate_store_refusing", "cause" => cause).set(if on { 1.0 } else { 0.0 });
        }
        *now = Some(refusal.clone());
        self.refusing.store(true, Ordering::Release);
        self.taking_claims.send_replace(false);
    }

    /// A claim committed: whatever refused claims before is over.
    pub fn claims_taken(&self) {
        if !self.refusing.load(Ordering::Acquire) {
            return;
        }
        let mut now = self.refusal.lock().unwrap_or_else(|p| p.into_inner());
        let Some(before) = now.take() else { return };
        self.refusing.store(false, Ordering::Release);
        tracing::info!(after = before.label(), "the store takes claims again");
        for cause in Refusal::LABELS {
            metrics::gauge!("oncegate_store_refusing", "cause" => cause).set(0.0);
        }
        self.taking_claims.send_replace(true);
    }

    /// Why the store refuses claims now, if it does.
    pub fn refusal(&self) -> Option<Refusal> {
        self.refusal.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Resolves with whether the store takes claims whenever it changes
    /// (health).
    pub fn taking_claims(&self) -> tokio::sync::watch::Receiver<bool> {
        self.taking_claims.subscribe()
    }
}

/// Why a server that answered refused a write (SQLSTATE 42501, 25006):
/// not a lost connection, not a bug.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 42501: the role lacks a privilege; `detail` is the server's message
    /// ("permission denied for table disbursements"), naming the object.
    InsufficientPrivilege { detail: String },
    /// 25006: the server takes no writes (`default_transaction_read_only`,
    /// a managed Postgres near a full disk, a standby).
    ReadOnly,
}

impl Refusal {
    /// Every cause, for the metrics' zero series.
    pub const LABELS: [&'static str; 2] = ["insufficient_privilege", "read_only"];

    /// The `cause` label of `oncegate_store_refusals_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::InsufficientPrivilege { .. } => "insufficient_privilege",
            Self::ReadOnly => "read_only",
        }
    }

    /// What a refused caller reads: the cause and the object the server
    /// named (a table name, never data), and that a retry will do.
    pub fn answer(&self) -> String {
        format!("the store refused the write: {self}; nothing was written, retry")
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::InsufficientPrivilege { detail } => write!(
                f,
                "insufficient privilege ({detail}): the database role lacks a grant (migrations/GRANTS.md)"
            ),
            Self::ReadOnly => write!(
                f,
                "the server is read-only (default_transaction_read_only, or a standby)"
            ),
        }
    }
}

impl Default for PrimaryWatch {
    fn default() -> Self {
        Self::new(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ServerIdentity = ServerIdentity {
        system_identifier: 7_312_000_000_000_000_001,
        timeline: 1,
    };

    #[test]
    fn nothing_answers_before_the_first_identity_nor_while_suspended() {
        let w = PrimaryWatch::new(false);
        assert_eq!(w.trusted(), None);
        assert!(!w.observe(A, Instant::now()));
        let first = w.trusted().expect("confirmed");
        assert_eq!((first.generation, &*first.tag), (0, "6579714265a80001.1"));
        w.suspend("probe failed");
        assert_eq!(w.trusted(), None);
        assert!(
            !w.observe(A, Instant::now()),
            "the same server resumes the same epoch"
        );
        assert_eq!(w.trusted(), Some(first));
    }

    #[test]
    fn a_new_timeline_or_system_is_a_new_epoch() {
        let w = PrimaryWatch::new(false);
        w.observe(A, Instant::now());
        let promoted = ServerIdentity { timeline: 2, ..A };
        assert!(w.observe(promoted, Instant::now()));
        let e = w.trusted().expect("confirmed");
        assert_eq!((e.generation, &*e.tag), (1, "6579714265a80001.2"));
        let other = ServerIdentity {
            system_identifier: 42,
            timeline: 2,
        };
        assert!(w.observe(other, Instant::now()));
        assert_eq!(w.trusted().map(|e| e.generation), Some(2));
        assert_eq!(w.identity(), Some(other));
    }

    /// The cache window: a confirmation lets caches answer for the lease
    /// from when its read was sent, and no longer, probe or no probe.
    #[tokio::test(start_paused = true)]
    async fn a_confirmation_lapses_after_the_lease_from_its_send_time() {
        let w = PrimaryWatch::new(false);
        w.set_confirmation_lease(Duration::from_millis(1000));
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(300)).await;
        w.observe(A, sent);
        tokio::time::advance(Duration::from_millis(699)).await;
        assert!(w.trusted().is_some(), "within the lease of the send time");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(w.trusted(), None, "lapsed: 1000 ms after the read was sent");
        // An older read arriving late does not move the confirmation back.
        w.observe(A, sent);
        assert_eq!(w.trusted(), None);
        w.observe(A, Instant::now());
        assert!(w.trusted().is_some(), "a new confirmation resumes");
    }

    /// An answer from the old primary that arrives after the new one was
    /// confirmed (sent earlier) does not move the epoch back to it.
    #[tokio::test(start_paused = true)]
    async fn a_late_answer_from_the_old_server_is_ignored() {
        let w = PrimaryWatch::new(false);
        w.set_confirmation_lease(Duration::from_millis(1000));
        let old_sent = Instant::now();
        w.observe(A, old_sent);
        tokio::time::advance(Duration::from_millis(100)).await;
        let promoted = ServerIdentity { timeline: 2, ..A };
        assert!(w.observe(promoted, Instant::now()));
        assert!(!w.observe(A, old_sent), "stale: sent before the confirmation");
        let e = w.trusted().expect("still confirmed");
        assert_eq!((e.generation, &*e.tag), (1, "6579714265a80001.2"));
        assert_eq!(w.identity(), Some(promoted));
    }

    /// A refusal from a server that answered keeps the caches answering,
    /// and the first claim taken after it ends it.
    #[test]
    fn a_refusal_does_not_suspend_the_caches_and_ends_with_a_claim() {
        let w = PrimaryWatch::new(false);
        w.observe(A, Instant::now());
        let serving = w.taking_claims();
        let revoked = Refusal::InsufficientPrivilege {
            detail: "permission denied for table disbursements".into(),
        };
        w.refused(&revoked);
        w.refused(&revoked);
        assert_eq!(w.refusal(), Some(revoked));
        assert!(!*serving.borrow());
        assert!(
            w.trusted().is_some(),
            "the confirmed server answered: caches answer"
        );
        w.refused(&Refusal::ReadOnly);
        assert_eq!(w.refusal(), Some(Refusal::ReadOnly));
        w.claims_taken();
        assert_eq!(w.refusal(), None);
        assert!(*serving.borrow());
    }

    #[test]
    fn an_embedded_store_is_always_trusted() {
        let w = PrimaryWatch::embedded();
        w.suspend("no such thing");
        assert_eq!(w.trusted().map(|e| e.generation), Some(0));
    }
}
