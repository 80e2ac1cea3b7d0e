-- The audit trail's decisions, once more (DESIGN §9): a `Begin` answered
-- with an effect's completed record, from L1, L2 or the store, is audited
-- as 'effect_answered' (with the tier that answered), as in
-- postgres/0010_effect_answered.sql.
--
-- SQLite cannot alter a CHECK, so audit_log is rebuilt inside this
-- migration's transaction exactly as in 0004_operations.sql: the same
-- columns under the new CHECK, every row copied with its id, the
-- AUTOINCREMENT counter carried over (ids of purged rows are never reused),
-- then the indexes of 0004_operations.sql and the append-only triggers of
-- 0001_init.sql (as 0004 recreated them) exactly as they were. DROP TABLE
-- fires no DELETE trigger. The seal tables of 0003_audit_seals.sql refer to
-- audit ids by value only, so the seals stay valid: every row keeps its id
-- and its values.
CREATE TABLE audit_log_new (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    at              INTEGER NOT NULL,
    decision        TEXT    NOT NULL CHECK (decision IN (
        'processed', 'duplicate', 'rejected', 'redriven',
        'effect_acquired', 'effect_completed', 'effect_released', 'effect_retaken', 'effect_rejected',
        'effect_answered')),
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
CREATE INDEX audit_log_key_prefix ON audit_log (key_prefix);

CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only: UPDATE is not allowed');
END;
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
WHEN NOT EXISTS (SELECT 1 FROM oncegate_purge_gate)
BEGIN
    SELECT RAISE(ABORT, 'audit_log is append-only: DELETE is not allowed');
END;
