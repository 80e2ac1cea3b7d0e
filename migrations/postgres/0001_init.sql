-- oncegate schema (Postgres). See README "Storage" and migrations/GRANTS.md.

-- The claim: one row per idempotency key ever processed (until purged by
-- retention). The stored result is the ledger row it points at.
CREATE TABLE processed_messages (
    idempotency_key text PRIMARY KEY,
    award_id        text        NOT NULL,
    fingerprint     text        NOT NULL,
    disbursement_id uuid        NOT NULL,
    claimed_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX processed_messages_claimed_at ON processed_messages (claimed_at);

-- The ledger. Never updated or deleted. Its unique key on the idempotency key
-- is the last guard against a redelivery older than every cache and claim.
CREATE TABLE disbursements (
    id                   uuid PRIMARY KEY,
    idempotency_key      text        NOT NULL,
    award_id             text        NOT NULL,
    amount_cents         bigint      NOT NULL CHECK (amount_cents > 0),
    sequence             bigint      NOT NULL CHECK (sequence > 0),
    submission_timestamp text        NOT NULL,
    payload_digest       text        NOT NULL,
    fingerprint          text        NOT NULL,
    recorded_at          timestamptz NOT NULL,
    CONSTRAINT disbursements_idempotency_key_key UNIQUE (idempotency_key),
    CONSTRAINT disbursements_award_sequence_key UNIQUE (award_id, sequence)
);
CREATE INDEX disbursements_award_timestamp ON disbursements (award_id, submission_timestamp);

-- Running totals per award: a relative increment, exactly what a double-post
-- would corrupt. last_sequence numbers the award's disbursements.
CREATE TABLE award_balances (
    award_id           text PRIMARY KEY,
    total_cents        bigint      NOT NULL,
    disbursement_count bigint      NOT NULL,
    last_sequence      bigint      NOT NULL,
    updated_at         timestamptz NOT NULL DEFAULT now()
);

-- Transactional outbox, drained by the relay.
CREATE TABLE outbox (
    event_id       uuid PRIMARY KEY,
    event_type     text        NOT NULL,
    award_id       text        NOT NULL,
    sequence       bigint      NOT NULL,
    payload        jsonb       NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    published_at   timestamptz,
    attempts       integer     NOT NULL DEFAULT 0,
    leased_until   timestamptz,
    lease_owner    text,
    last_error     text,
    quarantined_at timestamptz
);
CREATE INDEX outbox_pending ON outbox (created_at)
    WHERE published_at IS NULL AND quarantined_at IS NULL;
CREATE INDEX outbox_published_at ON outbox (published_at)
    WHERE published_at IS NOT NULL;

CREATE FUNCTION oncegate_outbox_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('oncegate_outbox', '');
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION oncegate_outbox_notify();

-- Append-only audit trail, partitioned by month (retention drops partitions).
CREATE TABLE audit_log (
    id              bigint GENERATED ALWAYS AS IDENTITY,
    at              timestamptz NOT NULL DEFAULT now(),
    decision        text        NOT NULL CHECK (decision IN ('processed', 'duplicate', 'rejected')),
    tier            text,
    key_prefix      text        NOT NULL,
    award_id        text        NOT NULL,
    instance        text        NOT NULL,
    payload_changed boolean     NOT NULL DEFAULT false,
    detail          text,
    PRIMARY KEY (id, at)
) PARTITION BY RANGE (at);
-- Catches rows outside every monthly partition (e.g. maintenance lapsed);
-- the purge deletes from it row by row.
CREATE TABLE audit_log_default PARTITION OF audit_log DEFAULT;
CREATE INDEX audit_log_at ON audit_log (at);

-- The ledger and the audit trail reject UPDATE and DELETE for every role.
-- The only way rows leave audit_log is the retention purge below, which sets
-- a transaction-local flag inside a SECURITY DEFINER function.
CREATE FUNCTION oncegate_reject_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME LIKE 'audit_log%' AND TG_OP = 'DELETE'
       AND current_setting('oncegate.purge', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP
        USING ERRCODE = '42501';
END $$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION oncegate_reject_change();
CREATE TRIGGER disbursements_append_only BEFORE UPDATE OR DELETE ON disbursements
    FOR EACH ROW EXECUTE FUNCTION oncegate_reject_change();

-- Creates the monthly audit partitions from `from_month` up to `months_ahead`
-- months after the current one. Returns how many it created.
-- Names are schema-qualified: with `search_path = pg_catalog, public` an
-- unqualified CREATE TABLE would target pg_catalog. A partition another
-- instance just created is skipped; one whose month already has rows in the
-- default partition cannot be created and is reported as a warning (the
-- purge deletes those rows one by one instead).
CREATE FUNCTION oncegate_ensure_audit_partitions(from_month date, months_ahead integer)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    m       date := date_trunc('month', from_month)::date;
    last_m  date := (date_trunc('month', now() AT TIME ZONE 'UTC') + make_interval(months => months_ahead))::date;
    part    text;
    created integer := 0;
BEGIN
    WHILE m <= last_m LOOP
        part := format('audit_log_%s', to_char(m, 'YYYY_MM'));
        IF to_regclass(format('public.%I', part)) IS NULL THEN
            BEGIN
                EXECUTE format(
                    'CREATE TABLE public.%I PARTITION OF public.audit_log FOR VALUES FROM (%L) TO (%L)',
                    part, m::text || ' 00:00:00+00', (m + interval '1 month')::date::text || ' 00:00:00+00');
                created := created + 1;
            EXCEPTION
                WHEN duplicate_table THEN NULL;
                WHEN check_violation THEN
                    RAISE WARNING 'cannot create audit partition %: %', part, SQLERRM;
            END;
        END IF;
        m := (m + interval '1 month')::date;
    END LOOP;
    RETURN created;
END $$;
SELECT oncegate_ensure_audit_partitions((now() AT TIME ZONE 'UTC')::date, 3);

-- Retention, step 1: drop monthly partitions that lie wholly before `cutoff`.
-- Returns the number of rows they held.
CREATE FUNCTION oncegate_drop_audit_partitions(cutoff timestamptz)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    r       record;
    n       bigint;
    dropped bigint := 0;
BEGIN
    FOR r IN
        SELECT c.relname
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'public.audit_log'::regclass AND c.relname ~ '^audit_log_[0-9]{4}_[0-9]{2}$'
    LOOP
        IF (to_date(substr(r.relname, 11), 'YYYY_MM') + interval '1 month')::timestamp AT TIME ZONE 'UTC' <= cutoff THEN
            EXECUTE format('SELECT count(*) FROM public.%I', r.relname) INTO n;
            EXECUTE format('DROP TABLE public.%I', r.relname);
            dropped := dropped + n;
        END IF;
    END LOOP;
    RETURN dropped;
END $$;

-- Retention, step 2: delete up to `batch` remaining rows older than `cutoff`
-- (the boundary month and the default partition). Returns rows deleted.
CREATE FUNCTION oncegate_purge_audit_rows(cutoff timestamptz, batch integer)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    n bigint;
BEGIN
    PERFORM set_config('oncegate.purge', 'on', true);
    DELETE FROM public.audit_log
    WHERE (id, at) IN (SELECT id, at FROM public.audit_log WHERE at < cutoff LIMIT batch);
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM set_config('oncegate.purge', 'off', true);
    RETURN n;
END $$;
