-- The sealed audit trail (DESIGN §10), as in postgres/0005_audit_seals.sql:
-- audit_seals is the hash chain over audit_log, audit_purges what the
-- retention purge removed. Both are append-only. Times are INTEGER
-- microseconds since the Unix epoch.

CREATE TABLE audit_seals (
    seq         INTEGER PRIMARY KEY CHECK (seq > 0),
    first_id    INTEGER NOT NULL UNIQUE,
    last_id     INTEGER NOT NULL,
    row_count   INTEGER NOT NULL CHECK (row_count > 0),
    absent_ids  TEXT    NOT NULL,
    min_at      INTEGER NOT NULL,
    max_at      INTEGER NOT NULL,
    sealed_at   INTEGER NOT NULL,
    sealed_by   TEXT    NOT NULL,
    prev_digest TEXT    NOT NULL,
    digest      TEXT    NOT NULL,
    row_tags    BLOB    NOT NULL,
    CHECK (last_id >= first_id),
    CHECK (length(row_tags) = 4 * row_count)
);

CREATE TABLE audit_purges (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    purged_at   INTEGER NOT NULL,
    cutoff      INTEGER NOT NULL,
    method      TEXT    NOT NULL,
    seal_seq    INTEGER REFERENCES audit_seals (seq),
    seal_digest TEXT,
    row_count   INTEGER NOT NULL CHECK (row_count > 0),
    ids         TEXT    NOT NULL
);
CREATE INDEX audit_purges_seal ON audit_purges (seal_seq);

CREATE TRIGGER audit_seals_no_update BEFORE UPDATE ON audit_seals
BEGIN
    SELECT RAISE(ABORT, 'audit_seals is append-only: UPDATE is not allowed');
END;
CREATE TRIGGER audit_seals_no_delete BEFORE DELETE ON audit_seals
BEGIN
    SELECT RAISE(ABORT, 'audit_seals is append-only: DELETE is not allowed');
END;
CREATE TRIGGER audit_purges_no_update BEFORE UPDATE ON audit_purges
BEGIN
    SELECT RAISE(ABORT, 'audit_purges is append-only: UPDATE is not allowed');
END;
CREATE TRIGGER audit_purges_no_delete BEFORE DELETE ON audit_purges
BEGIN
    SELECT RAISE(ABORT, 'audit_purges is append-only: DELETE is not allowed');
END;

-- A seal must extend the chain: the next number, right after the newest
-- seal's range, carrying its digest (the genesis digest is 64 zeros).
CREATE TRIGGER audit_seals_chain BEFORE INSERT ON audit_seals
WHEN NEW.seq <> coalesce((SELECT max(seq) FROM audit_seals), 0) + 1
  OR NEW.first_id <> coalesce((SELECT last_id FROM audit_seals ORDER BY seq DESC LIMIT 1), 0) + 1
  OR NEW.prev_digest <> coalesce((SELECT digest FROM audit_seals ORDER BY seq DESC LIMIT 1),
                                 '0000000000000000000000000000000000000000000000000000000000000000')
BEGIN
    SELECT RAISE(ABORT, 'audit_seals is a chain: a seal must follow the newest seal');
END;
