-- Operations (DESIGN §10): `oncegate reconcile`, `inspect` and
-- `outbox list|retry`.

-- 1. The audit trail's decisions. A redrive of a quarantined outbox event is
-- audited as 'redriven'; the effect_* decisions are the idempotency records'
-- (DESIGN §9), listed now so that this CHECK changes once.
--
-- SQLite cannot alter a CHECK, so audit_log is rebuilt inside this
-- migration's transaction: the same columns under the new CHECK, every row
-- copied with its id, the AUTOINCREMENT counter carried over (ids of purged
-- rows are never reused), then the index and the append-only triggers of
-- 0001_init.sql exactly as they were. DROP TABLE fires no DELETE trigger.
CREATE TABLE audit_log_new (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    at              INTEGER NOT NULL,
    decision        TEXT    NOT NULL CHECK (decision IN (
        'processed', 'duplicate', 'rejected', 'redriven',
        'effect_acquired', 'effect_completed', 'effect_released', 'effect_retaken', 'effect_rejected')),
    tier            TEXT,
    key_prefix      TEXT    NOT NULL,
    award_id        TEXT    NOT NULL,
    instance        TEXT    NOT NULL,
    payload_changed INTEGER NOT NULL DEFAULT 0,
    detail          TEXT
);
INSERT INTO audit_log_new (id, at, decision, tier, key_prefix, award_id, instance, payload_changed, detail)
SELECT id, at, decision, tier, key_prefix, award_id, instance, payload_changed, detail
FROM audit_log ORDER BY id;
DELETE FROM sqlite_sequence WHERE name = 'audit_log_new';
INSERT INTO sqlite_sequence (name, seq) SELECT 'audit_log_new', seq FROM sqlite_sequence WHERE name = 'audit_log';
DROP TABLE audit_log;
ALTER TABLE audit_log_new RENAME TO audit_log;
CREATE INDEX audit_log_at ON audit_log (at);

CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only: UPDATE is not allowed');
END;
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
WHEN NOT EXISTS (SELECT 1 FROM oncegate_purge_gate)
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only: DELETE is not allowed');
END;

-- 2. Indexes: an event by its ledger row (reconcile, inspect, `outbox list
-- --award`), the quarantined events, a key's audit history (audit rows hold
-- the key's first 12 characters).
CREATE INDEX outbox_award_sequence ON outbox (award_id, sequence);
CREATE INDEX outbox_quarantined ON outbox (created_at, sequence)
    WHERE quarantined_at IS NOT NULL AND published_at IS NULL;
CREATE INDEX audit_log_key_prefix ON audit_log (key_prefix);
