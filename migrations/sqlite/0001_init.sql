-- oncegate schema (embedded SQLite). Same tables and meaning as the Postgres
-- schema; uuids are TEXT, times are INTEGER microseconds since the Unix epoch.

CREATE TABLE processed_messages (
    idempotency_key TEXT PRIMARY KEY,
    award_id        TEXT    NOT NULL,
    fingerprint     TEXT    NOT NULL,
    disbursement_id TEXT    NOT NULL,
    claimed_at      INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX processed_messages_claimed_at ON processed_messages (claimed_at);

CREATE TABLE disbursements (
    id                   TEXT PRIMARY KEY,
    idempotency_key      TEXT    NOT NULL UNIQUE,
    award_id             TEXT    NOT NULL,
    amount_cents         INTEGER NOT NULL CHECK (amount_cents > 0),
    sequence             INTEGER NOT NULL CHECK (sequence > 0),
    submission_timestamp TEXT    NOT NULL,
    payload_digest       TEXT    NOT NULL,
    fingerprint          TEXT    NOT NULL,
    recorded_at          INTEGER NOT NULL,
    UNIQUE (award_id, sequence)
);
CREATE INDEX disbursements_award_timestamp ON disbursements (award_id, submission_timestamp);

CREATE TABLE award_balances (
    award_id           TEXT PRIMARY KEY,
    total_cents        INTEGER NOT NULL,
    disbursement_count INTEGER NOT NULL,
    last_sequence      INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE outbox (
    event_id       TEXT PRIMARY KEY,
    event_type     TEXT    NOT NULL,
    award_id       TEXT    NOT NULL,
    sequence       INTEGER NOT NULL,
    payload        TEXT    NOT NULL,
    created_at     INTEGER NOT NULL,
    published_at   INTEGER,
    attempts       INTEGER NOT NULL DEFAULT 0,
    leased_until   INTEGER,
    lease_owner    TEXT,
    last_error     TEXT,
    quarantined_at INTEGER
);
CREATE INDEX outbox_pending ON outbox (created_at)
    WHERE published_at IS NULL AND quarantined_at IS NULL;
CREATE INDEX outbox_published_at ON outbox (published_at)
    WHERE published_at IS NOT NULL;

-- Not partitioned: one file, one writer; the purge deletes rows in batches.
CREATE TABLE audit_log (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    at              INTEGER NOT NULL,
    decision        TEXT    NOT NULL CHECK (decision IN ('processed', 'duplicate', 'rejected')),
    tier            TEXT,
    key_prefix      TEXT    NOT NULL,
    award_id        TEXT    NOT NULL,
    instance        TEXT    NOT NULL,
    payload_changed INTEGER NOT NULL DEFAULT 0,
    detail          TEXT
);
CREATE INDEX audit_log_at ON audit_log (at);

-- A row here exists only inside the purge's own transaction (one writer), so
-- no other statement ever sees the gate open.
CREATE TABLE oncegate_purge_gate (open INTEGER NOT NULL);

CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only: UPDATE is not allowed');
END;
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
WHEN NOT EXISTS (SELECT 1 FROM oncegate_purge_gate)
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only: DELETE is not allowed');
END;
CREATE TRIGGER disbursements_no_update BEFORE UPDATE ON disbursements
BEGIN
    SELECT RAISE(ABORT, 'disbursements is append-only: UPDATE is not allowed');
END;
CREATE TRIGGER disbursements_no_delete BEFORE DELETE ON disbursements
BEGIN
    SELECT RAISE(ABORT, 'disbursements is append-only: DELETE is not allowed');
END;
