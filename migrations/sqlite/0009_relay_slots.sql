-- The relay across pods (DESIGN §4, "Across pods"): slots own the work.
-- The same tables as migrations/postgres/0013_relay_slots.sql. The award
-- hash (the first four bytes of SHA-256 of the award id, big-endian,
-- unsigned) is computed by the sidecar: it fills it for the rows written
-- before this migration right after migrating (SQLite has no SHA-256).
ALTER TABLE outbox ADD COLUMN award_hash INTEGER;

-- Per-row leases are gone: leased_until only postpones a rejected event.
ALTER TABLE outbox DROP COLUMN lease_owner;

CREATE TABLE relay_slots (
    slot         INTEGER PRIMARY KEY CHECK (slot >= 0),
    in_use       INTEGER NOT NULL DEFAULT 1,
    owner        TEXT,
    generation   INTEGER NOT NULL DEFAULT 0,
    leased_until INTEGER,
    changed_at   INTEGER NOT NULL
);

CREATE TABLE relay_members (
    member     TEXT    PRIMARY KEY,
    instance   TEXT    NOT NULL,
    sink       TEXT    NOT NULL,
    seen_until INTEGER NOT NULL,
    joined_at  INTEGER NOT NULL
);
