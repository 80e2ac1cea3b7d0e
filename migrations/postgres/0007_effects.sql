-- Idempotency records for effects outside the ledger (DESIGN §9): the
-- payment instruction, the notice, the call to another service. Service
-- oncegate.v1.Effects: Begin takes a record's lease (or answers its stored
-- response), Complete commits the response under that lease, Release gives
-- the lease back.
--
-- One row per (namespace, idempotency_key). The request itself is never
-- stored: only its SHA-256 (fingerprint), which every later Begin must
-- match. The lease lives here, not in Redis: taking an expired or released
-- lease bumps `attempt` and writes a new `lease_token` in one statement, and
-- Complete and Release name the token in the statement that changes the
-- row (fencing). Times are the database's clock, the same for every
-- instance.
--
-- state: 'in_progress' (a lease is held; it may have expired), 'completed'
-- (response and completed_at set; final), 'released' (the holder said the
-- effect did not happen; the next Begin acquires at once).
-- taken_over_from: what the current lease took over, for the audit row:
-- NULL (first lease), 'released' or 'expired'.
--
-- Retention: rows are purged in batches through the index on updated_at,
-- like claims (a row's last change is its completion or release).
CREATE TABLE effects (
    namespace        text        NOT NULL CHECK (namespace ~ '^[a-z0-9._-]{1,64}$'),
    idempotency_key  text        NOT NULL CHECK (char_length(idempotency_key) BETWEEN 1 AND 128),
    fingerprint      text        NOT NULL,
    state            text        NOT NULL CHECK (state IN ('in_progress', 'completed', 'released')),
    lease_token      text        NOT NULL,
    lease_expires_at timestamptz,
    attempt          integer     NOT NULL CHECK (attempt > 0),
    taken_over_from  text        CHECK (taken_over_from IN ('released', 'expired')),
    response         bytea,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    PRIMARY KEY (namespace, idempotency_key),
    CHECK ((state = 'completed') = (response IS NOT NULL AND completed_at IS NOT NULL)),
    CHECK ((state = 'in_progress') = (lease_expires_at IS NOT NULL))
);
CREATE INDEX effects_updated_at ON effects (updated_at);

-- A completed record is final: its response never changes, and it never
-- goes back to another state. Only the retention purge removes it.
CREATE FUNCTION oncegate_effects_final() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF OLD.state = 'completed' THEN
        RAISE EXCEPTION 'effects: a completed record is final (% %)', OLD.namespace, left(OLD.idempotency_key, 12)
            USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER effects_completed_is_final BEFORE UPDATE ON effects
    FOR EACH ROW EXECUTE FUNCTION oncegate_effects_final();

-- The application role's grants on effects (SELECT, INSERT, UPDATE; DELETE:
-- the retention purge) are in oncegate_grant_app_role as defined by
-- 0009_app_role_grants.sql, together with 0005's.
