-- Idempotency records for effects outside the ledger (DESIGN §9); the same
-- table and meaning as postgres/0007_effects.sql. Times are INTEGER
-- microseconds since the Unix epoch; the one writer makes every statement
-- on the row serial, so the lease taken in one statement is never held twice.
CREATE TABLE effects (
    namespace        TEXT    NOT NULL,
    idempotency_key  TEXT    NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 128),
    fingerprint      TEXT    NOT NULL,
    state            TEXT    NOT NULL CHECK (state IN ('in_progress', 'completed', 'released')),
    lease_token      TEXT    NOT NULL,
    lease_expires_at INTEGER,
    attempt          INTEGER NOT NULL CHECK (attempt > 0),
    taken_over_from  TEXT    CHECK (taken_over_from IN ('released', 'expired')),
    response         BLOB,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    completed_at     INTEGER,
    PRIMARY KEY (namespace, idempotency_key),
    CHECK (length(namespace) BETWEEN 1 AND 64 AND namespace NOT GLOB '*[^-a-z0-9._]*'),
    CHECK ((state = 'completed') = (response IS NOT NULL AND completed_at IS NOT NULL)),
    CHECK ((state = 'in_progress') = (lease_expires_at IS NOT NULL))
) WITHOUT ROWID;
CREATE INDEX effects_updated_at ON effects (updated_at);

-- A completed record is final: only the retention purge removes it.
CREATE TRIGGER effects_completed_is_final BEFORE UPDATE ON effects
WHEN OLD.state = 'completed'
BEGIN
    SELECT RAISE(ABORT, 'effects: a completed record is final');
END;
