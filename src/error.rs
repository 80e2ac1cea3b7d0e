//! The service's one error type and its one mapping to `tonic::Status`.
//!
//! Database detail is logged where it happens and never sent to the client.

use tonic::{Code, Status};

/// Exit code for invalid configuration (EX_USAGE).
pub const EXIT_CONFIG: u8 = 64;

/// Exit code when stdout was closed under a command (`oncegate … | head -1`):
/// 128 + SIGPIPE, what a shell reports for a program a closed pipe ended, so a
/// script under `set -o pipefail` sees that the output was cut short, as it
/// does for `yes | head -1`, and a report cut short (`reconcile`, `audit
/// verify`) never reads as a clean one. No message: the reader chose to stop.
pub const EXIT_CLOSED_PIPE: u8 = 141;

/// A setting that is missing, malformed or contradicts another; the message
/// names the setting. The process exits with [`EXIT_CONFIG`], before any
/// port is bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl ConfigError {
    pub fn new(msg: impl Into<String>) -> Self {
        Self(msg.into())
    }
}

/// Every way a request can fail, as the client sees it.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// Bad input; nothing was written.
    #[error("{0}")]
    InvalidArgument(String),
    /// A key reused with a different award id, amount or payload.
    #[error("idempotency key reused with a different submission")]
    KeyReused,
    /// An effect's key reused with a different request (DESIGN §9).
    #[error("idempotency key reused with a different request")]
    RequestMismatch,
    /// The lease token is not the current lease's: it expired and was taken
    /// by another attempt, was released, or never existed.
    #[error("lease lost: the token does not hold this record's current lease")]
    LeaseLost,
    /// Complete repeated under the same token with another response.
    #[error("already completed under this lease with a different response")]
    ResponseConflict,
    /// The authoritative store cannot be reached; retry later.
    #[error("{0}")]
    Unavailable(String),
    /// Over the in-flight limit.
    #[error("{0}")]
    Overloaded(String),
    /// Over a size limit.
    #[error("{0}")]
    TooLarge(String),
    /// The caller's deadline passed before the decision was known.
    #[error("deadline exceeded before the decision was known; retry to learn the outcome")]
    DeadlineExceeded,
    /// A bug or an unexpected store state; detail is in the log.
    #[error("internal error")]
    Internal,
}

impl GateError {
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::InvalidArgument(msg.into())
    }

    /// The gRPC status code of this error.
    pub fn code(&self) -> Code {
        match self {
            Self::InvalidArgument(_) => Code::InvalidArgument,
            Self::KeyReused | Self::RequestMismatch | Self::LeaseLost | Self::ResponseConflict => {
                Code::FailedPrecondition
            }
            Self::Unavailable(_) => Code::Unavailable,
            Self::Overloaded(_) | Self::TooLarge(_) => Code::ResourceExhausted,
            Self::DeadlineExceeded => Code::DeadlineExceeded,
            Self::Internal => Code::Internal,
        }
    }

    /// A short label for metrics and audit rows.
    pub fn label(&self) -> &'static str {
        match self {
            Self::InvalidArgument(_) => "invalid_argument",
            Self::KeyReused => "key_reused",
            Self::RequestMismatch => "request_mismatch",
            Self::LeaseLost => "lease_lost",
            Self::ResponseConflict => "response_conflict",
            Self::Unavailable(_) => "unavailable",
            Self::Overloaded(_) => "overloaded",
            Self::TooLarge(_) => "too_large",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::Internal => "internal",
        }
    }
}

impl From<GateError> for Status {
    fn from(err: GateError) -> Self {
        Status::new(err.code(), err.to_string())
    }
}

/// Store failures, classified for the retry decision.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store cannot be reached, or the pool has no connection to give.
    /// The transaction did not commit, or its outcome is unknown; either way a
    /// retry resolves it through the claim.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Certainly aborted (serialization failure, deadlock): safe to retry now.
    #[error("transaction aborted, retryable: {0}")]
    Retryable(String),
    /// Keys whose claim row was purged but whose ledger row exists: a very
    /// late redelivery. The transaction was rolled back.
    #[error("late redelivery of {} purged claim(s)", .0.len())]
    LateRedelivery(Vec<String>),
    /// The item would take its award's running total past the largest
    /// amount a total can hold. The transaction was rolled back.
    #[error("amount_cents would overflow the running total of award {0:?}")]
    TotalOverflow(String),
    /// A statement waited past `lock_timeout` or ran past
    /// `statement_timeout`: certainly rolled back, but not retried at once
    /// (the lock is likely still held).
    #[error("store timed out: {0}")]
    Timeout(String),
    /// `ONCEGATE_REQUIRE_SYNC_REPLICA`: no synchronous standby confirms
    /// commits. Found before the commit, the transaction was rolled back;
    /// found after it, the commit is on the primary alone and was not
    /// acknowledged (a redelivery resolves it). Never retried at once.
    #[error("no synchronous standby: {0}")]
    NoSyncStandby(crate::primary::guard::Shortfall),
    /// The server answered and refused the statement: an outage of the
    /// store that a lost connection is not (no failover suspected, cached
    /// confirmed results still answer). Certainly rolled back; it lasts
    /// until someone changes the server (a grant, the read-only setting).
    #[error("store refused: {0}")]
    Refused(crate::primary::Refusal),
    /// Anything else.
    #[error("store error: {0}")]
    Other(String),
}

impl StoreError {
    /// Classifies a sqlx error by kind and SQLSTATE.
    pub fn from_sqlx(err: sqlx::Error) -> Self {
        use sqlx::Error as E;
        match &err {
            // A protocol error is a broken connection (e.g. a server that went
            // away mid-handshake); like I/O it is retried, and the claim makes
            // the retry safe whatever the outcome was.
            E::PoolTimedOut | E::PoolClosed | E::Io(_) | E::Tls(_) | E::Protocol(_) | E::WorkerCrashed => {
                Self::Unavailable(err.to_string())
            }
            E::Database(db) => {
                let code = db.code().map(|c| c.into_owned()).unwrap_or_default();
                match code.as_str() {
                    // serialization_failure, deadlock_detected
                    "40001" | "40P01" => Self::Retryable(err.to_string()),
                    // lock_not_available (lock_timeout), query_canceled
                    // (statement_timeout), idle-in-transaction timeout
                    "55P03" | "57014" | "25P03" => Self::Timeout(err.to_string()),
                    // SQLite: database is locked / busy
                    "5" | "6" | "517" | "261" => Self::Retryable(err.to_string()),
                    "42501" => Self::Refused(crate::primary::Refusal::InsufficientPrivilege {
                        detail: db.message().to_string(),
                    }),
                    "25006" => Self::Refused(crate::primary::Refusal::ReadOnly),
                    // connection exceptions, admin shutdown, crash shutdown,
                    // cannot connect now, too many connections
                    c if c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03" | "53300") => {
                        Self::Unavailable(err.to_string())
                    }
                    _ => Self::Other(err.to_string()),
                }
            }
            _ => Self::Other(err.to_string()),
        }
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        Self::from_sqlx(err)
    }
}

impl From<StoreError> for GateError {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Unavailable(_) | StoreError::Retryable(_) => {
                GateError::Unavailable("authoritative store unavailable; retry".into())
            }
            StoreError::Timeout(_) => GateError::Unavailable(
                "the store timed out waiting for a lock held by another transaction; retry".into(),
            ),
            StoreError::NoSyncStandby(short) => GateError::Unavailable(short.refusal()),
            StoreError::Refused(r) => GateError::Unavailable(r.answer()),
            StoreError::TotalOverflow(award) => GateError::InvalidArgument(format!(
                "amount_cents would overflow the running total of award {award:?}; nothing was written"
            )),
            StoreError::LateRedelivery(_) | StoreError::Other(_) => GateError::Internal,
        }
    }
}
