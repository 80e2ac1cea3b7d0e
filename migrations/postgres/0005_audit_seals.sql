-- The sealed audit trail (DESIGN §10; README "Audit trail and retention").
--
-- audit_seals is a hash chain over audit_log: seal n covers the audit ids
-- first_id..=last_id (seal 1 starts at id 1, each next seal right after the
-- previous one), and its digest is SHA-256 over its own fields, the previous
-- seal's digest and every covered row's canonical bytes (computed by the
-- sidecar, `src/seal/`). Seals are kept forever and nobody may change or
-- remove one. audit_purges records what the retention purge removed, so
-- that verification tells "purged under the retention policy" from
-- "missing". Only the purge functions below write it.

CREATE TABLE audit_seals (
    seq         bigint PRIMARY KEY CHECK (seq > 0),
    first_id    bigint      NOT NULL UNIQUE,
    last_id     bigint      NOT NULL,
    row_count   bigint      NOT NULL CHECK (row_count > 0),
    -- ids in first_id..=last_id that held no row when sealed ("a..b,c")
    absent_ids  text        NOT NULL,
    min_at      timestamptz NOT NULL,
    max_at      timestamptz NOT NULL,
    sealed_at   timestamptz NOT NULL,
    sealed_by   text        NOT NULL,
    prev_digest text        NOT NULL,
    digest      text        NOT NULL,
    -- the first 4 bytes of each covered row's hash, in id order: they name
    -- the row that no longer matches
    row_tags    bytea       NOT NULL,
    CHECK (last_id >= first_id),
    CHECK (octet_length(row_tags) = 4 * row_count)
);

CREATE TABLE audit_purges (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    purged_at   timestamptz NOT NULL,
    -- the effective cutoff: every row removed was older (its whole seal was)
    cutoff      timestamptz NOT NULL,
    method      text        NOT NULL,
    -- NULL: rows removed before any seal covered them
    seal_seq    bigint REFERENCES audit_seals (seq),
    seal_digest text,
    row_count   bigint      NOT NULL CHECK (row_count > 0),
    ids         text        NOT NULL
);
CREATE INDEX audit_purges_seal ON audit_purges (seal_seq);

-- Append-only for every role, the owner included (oncegate_reject_change
-- lets DELETE through only for audit_log inside the purge).
CREATE TRIGGER audit_seals_append_only BEFORE UPDATE OR DELETE ON audit_seals
    FOR EACH ROW EXECUTE FUNCTION oncegate_reject_change();
CREATE TRIGGER audit_seals_no_truncate BEFORE TRUNCATE ON audit_seals
    FOR EACH STATEMENT EXECUTE FUNCTION oncegate_reject_truncate();
CREATE TRIGGER audit_purges_append_only BEFORE UPDATE OR DELETE ON audit_purges
    FOR EACH ROW EXECUTE FUNCTION oncegate_reject_change();
CREATE TRIGGER audit_purges_no_truncate BEFORE TRUNCATE ON audit_purges
    FOR EACH STATEMENT EXECUTE FUNCTION oncegate_reject_truncate();

-- A seal must extend the chain: the next number, right after the newest
-- seal's range, carrying its digest (the genesis digest is 64 zeros). Two
-- sealers racing for one number: the primary key refuses the second.
CREATE FUNCTION oncegate_seal_follows() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    newest public.audit_seals%ROWTYPE;
BEGIN
    SELECT * INTO newest FROM public.audit_seals ORDER BY seq DESC LIMIT 1;
    IF NEW.seq <> coalesce(newest.seq, 0) + 1
       OR NEW.first_id <> coalesce(newest.last_id, 0) + 1
       OR NEW.prev_digest <> coalesce(newest.digest, repeat('0', 64)) THEN
        RAISE EXCEPTION 'audit_seals is a chain: seal % (ids from %) does not follow seal %',
            NEW.seq, NEW.first_id, coalesce(newest.seq, 0)
            USING ERRCODE = '23514';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER audit_seals_chain BEFORE INSERT ON audit_seals
    FOR EACH ROW EXECUTE FUNCTION oncegate_seal_follows();

-- Where a seal may end now, and who could still add a row below it.
--
-- Transactions commit out of id order and an uncommitted row is invisible,
-- so "the highest id visible" is no safe boundary: a transaction holding a
-- lower id may commit later. Instead: every transaction that takes an id
-- from audit_log's identity sequence (nextval) holds a lock on that
-- sequence from just before it takes the id until it commits or aborts
-- (sequence.c takes it for the top-level transaction). So, in this order:
--   1. horizon := the sequence's last value: every id up to it is handed out;
--   2. writers := the transactions holding a lock on the sequence now.
-- A transaction holding an id <= horizon either ended before step 2 (its
-- rows are committed and visible to any later snapshot, or aborted and will
-- never exist) or is in `writers`. Once every one of `writers` has ended
-- (the sidecar polls, bounded), every row that will ever have an id up to
-- the horizon is visible, and a seal up to it skips none. Locks are
-- released after a transaction becomes visible, so "lock gone" means done.
-- This needs values handed out one at a time (CACHE 1, the default): with a
-- cache, a session may hand out an id below the horizon much later.
CREATE FUNCTION oncegate_audit_seal_horizon(OUT horizon bigint, OUT writers text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    seq regclass := pg_get_serial_sequence('public.audit_log', 'id')::regclass;
BEGIN
    IF (SELECT seqcache FROM pg_sequence WHERE seqrelid = seq) <> 1 THEN
        RAISE EXCEPTION 'the audit_log id sequence caches values (CACHE > 1): ids are not handed out in order, so no seal boundary is safe'
            USING ERRCODE = '55000', HINT = 'ALTER SEQUENCE ... CACHE 1';
    END IF;
    horizon := coalesce(pg_sequence_last_value(seq), 0);
    SELECT coalesce(array_agg(DISTINCT l.virtualtransaction), '{}') INTO writers
    FROM pg_locks l
    WHERE l.locktype = 'relation' AND l.relation = seq
      AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
      AND l.mode <> 'AccessShareLock'
      AND l.pid IS DISTINCT FROM pg_backend_pid();
END $$;

-- What the retention purge may remove under `cutoff` (called with the seal
-- lock held): a sealed row goes only together with its whole seal, once
-- every seal up to it holds only rows older than the cutoff
-- (id <= expired_through); a row no seal covers yet (id > head_last) goes
-- when it is older than the cutoff.
CREATE FUNCTION oncegate_audit_purge_bounds(cutoff timestamptz, OUT head_last bigint, OUT expired_through bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT coalesce((SELECT max(s.last_id) FROM public.audit_seals s), 0),
           coalesce((SELECT max(s.last_id) FROM public.audit_seals s
                     WHERE s.seq < coalesce((SELECT min(u.seq) FROM public.audit_seals u WHERE u.max_at >= cutoff),
                                            9223372036854775807)), 0)
$$;

-- Records the rows `source` names (a FROM item with an `id` column; $3 is
-- `ids`) as purged: one audit_purges row per seal they belong to, and one
-- for rows no seal covers, with their ids as ranges ("a..b,c").
CREATE FUNCTION oncegate_record_audit_purge(cutoff timestamptz, method text, source text, ids bigint[])
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    EXECUTE format($q$
        WITH gone AS (SELECT p.id FROM %s),
        owned AS (
            SELECT g.id, s.seq, s.digest FROM gone g
            LEFT JOIN LATERAL (SELECT x.seq, x.digest, x.last_id FROM public.audit_seals x
                               WHERE x.first_id <= g.id ORDER BY x.first_id DESC LIMIT 1) s
                   ON g.id <= s.last_id),
        islands AS (
            SELECT seq, digest, min(id) AS lo, max(id) AS hi, count(*) AS n
            FROM (SELECT o.*, o.id - row_number() OVER (PARTITION BY o.seq ORDER BY o.id) AS island
                  FROM owned o) t
            GROUP BY seq, digest, island)
        INSERT INTO public.audit_purges (purged_at, cutoff, method, seal_seq, seal_digest, row_count, ids)
        SELECT now(), $1, $2, seq, digest, sum(n)::bigint,
               string_agg(CASE WHEN lo = hi THEN lo::text ELSE lo || '..' || hi END, ',' ORDER BY lo)
        FROM islands GROUP BY seq, digest$q$, source)
    USING cutoff, method, ids;
END $$;

-- The lock a sealer holds (session level, from the sidecar) and the purge
-- takes (transaction level): the purge never removes rows a seal in the
-- making has read. "onceseal".
CREATE FUNCTION oncegate_seal_lock_key() RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$ SELECT x'6f6e63657365616c'::bigint $$;

-- Retention, step 1, as in 0002 but seal-aware and recorded: drop the
-- monthly partitions that lie wholly before `cutoff` and hold no row of a
-- seal that must stay (a seal reaching into a later month keeps the
-- partition until the whole seal is past the cutoff), after recording what
-- each one held. Returns the number of rows they held.
CREATE OR REPLACE FUNCTION oncegate_drop_audit_partitions(cutoff timestamptz)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    r       record;
    b       record;
    n       bigint;
    kept    boolean;
    dropped bigint := 0;
BEGIN
    cutoff := public.oncegate_clamp_cutoff(cutoff);
    PERFORM pg_advisory_xact_lock(public.oncegate_seal_lock_key());
    SELECT * INTO b FROM public.oncegate_audit_purge_bounds(cutoff);
    FOR r IN
        SELECT c.relname
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'public.audit_log'::regclass AND c.relname ~ '^audit_log_[0-9]{4}_[0-9]{2}$'
    LOOP
        IF (to_date(substr(r.relname, 11), 'YYYY_MM') + interval '1 month')::timestamp AT TIME ZONE 'UTC' <= cutoff THEN
            -- No row can arrive between the record and the drop.
            EXECUTE format('LOCK TABLE public.%I IN SHARE MODE', r.relname);
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM public.%I WHERE id > $1 AND id <= $2)', r.relname)
                INTO kept USING b.expired_through, b.head_last;
            CONTINUE WHEN kept;
            EXECUTE format('SELECT count(*) FROM public.%I', r.relname) INTO n;
            IF n > 0 THEN
                PERFORM public.oncegate_record_audit_purge(cutoff, 'dropped partition ' || r.relname,
                                                           format('public.%I p', r.relname), NULL);
            END IF;
            EXECUTE format('DROP TABLE public.%I', r.relname);
            dropped := dropped + n;
        END IF;
    END LOOP;
    RETURN dropped;
END $$;

-- Retention, step 2, as in 0002 but seal-aware and recorded: delete up to
-- `batch` of the remaining rows the purge may remove (the oldest ids
-- first), and record them in the same transaction. Returns rows deleted.
CREATE OR REPLACE FUNCTION oncegate_purge_audit_rows(cutoff timestamptz, batch integer)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    b    record;
    gone bigint[];
BEGIN
    cutoff := public.oncegate_clamp_cutoff(cutoff);
    PERFORM pg_advisory_xact_lock(public.oncegate_seal_lock_key());
    SELECT * INTO b FROM public.oncegate_audit_purge_bounds(cutoff);
    PERFORM set_config('oncegate.purge', 'on', true);
    WITH d AS (
        DELETE FROM public.audit_log
        WHERE (id, at) IN (SELECT a.id, a.at FROM public.audit_log a
                           WHERE a.at < cutoff AND (a.id <= b.expired_through OR a.id > b.head_last)
                           ORDER BY a.id LIMIT batch)
        RETURNING id)
    SELECT array_agg(d.id) INTO gone FROM d;
    PERFORM set_config('oncegate.purge', 'off', true);
    IF gone IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM public.oncegate_record_audit_purge(cutoff, 'deleted rows', 'unnest($3::bigint[]) AS p(id)', gone);
    RETURN cardinality(gone);
END $$;

REVOKE EXECUTE ON FUNCTION oncegate_audit_seal_horizon(),
                           oncegate_audit_purge_bounds(timestamptz),
                           oncegate_record_audit_purge(timestamptz, text, text, bigint[]),
                           oncegate_seal_lock_key() FROM PUBLIC;

-- The application role's grants for these tables and functions (SELECT and
-- INSERT on audit_seals, SELECT on audit_purges, EXECUTE on
-- oncegate_audit_seal_horizon) are in oncegate_grant_app_role as defined by
-- 0009_app_role_grants.sql, together with 0007's.
