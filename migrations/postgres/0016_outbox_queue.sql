-- The relay's queue (DESIGN §4): the unpublished events get a narrow table
-- of their own, so the relay's reads and marks stop growing with the
-- outbox and its dead index entries.
--
-- Before: the relay read the outbox through a partial index of its
-- unpublished rows, and marking an event published updated the outbox row
-- in a way that inserted into three indexes (published_at was indexed and
-- in the partial indexes' predicates). Every mark left a dead entry in the
-- read's index until VACUUM, and on an outbox kept for years VACUUM comes
-- rarely: the reads walked ever more of them.
--
-- After: outbox_queue holds one row per event waiting to be published,
-- written by the trigger below in the transaction that writes the event
-- (every writer: claims, effects, seals, an older sidecar during the
-- upgrade). The relay reads the queue in order and joins the outbox for
-- the event; marking an event published deletes its queue row and sets
-- published_at on the outbox row, which no index covers any more, so the
-- update can stay on its page (HOT) without index inserts. A rejection
-- postpones the queue row (leased_until) and records the attempt on the
-- outbox row; a quarantined event leaves the queue, and a redrive puts it
-- back. The queue stays as small as the backlog, and autovacuum (at its
-- thresholds for a small table) clears it often.
CREATE TABLE outbox_queue (
    event_id     uuid        PRIMARY KEY,
    award_id     text        NOT NULL,
    award_hash   bigint      NOT NULL,
    created_at   timestamptz NOT NULL,
    sequence     bigint      NOT NULL,
    -- set while a rejected event waits for its retry
    leased_until timestamptz
);
-- The read's order.
CREATE INDEX outbox_queue_order ON outbox_queue (created_at, sequence);
-- The hold-back of an award behind an event waiting for its retry.
CREATE INDEX outbox_queue_retry_wait ON outbox_queue (award_id, created_at, sequence)
    WHERE leased_until IS NOT NULL;

INSERT INTO outbox_queue (event_id, award_id, award_hash, created_at, sequence, leased_until)
SELECT event_id, award_id, coalesce(award_hash, oncegate_award_hash(award_id)), created_at, sequence,
       leased_until
FROM outbox WHERE published_at IS NULL AND quarantined_at IS NULL;

-- Every event written unpublished is queued in the same statement. The
-- function runs with the writer's privileges (INSERT on outbox_queue).
CREATE FUNCTION oncegate_outbox_enqueue() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO outbox_queue (event_id, award_id, award_hash, created_at, sequence)
    SELECT n.event_id, n.award_id, coalesce(n.award_hash, oncegate_award_hash(n.award_id)),
           n.created_at, n.sequence
    FROM oncegate_new_events n
    WHERE n.published_at IS NULL AND n.quarantined_at IS NULL;
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_enqueue AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS oncegate_new_events
    FOR EACH STATEMENT EXECUTE FUNCTION oncegate_outbox_enqueue();

-- The outbox's indexes no longer mention what a relay changes
-- (published_at, leased_until, attempts, last_error), and the table leaves
-- room on each page for a row's published version.
DROP INDEX outbox_unpublished;
DROP INDEX outbox_retry_wait;
DROP INDEX outbox_published_at;
-- Retention finds published rows by age of the event (an event is
-- published after it was created, so "published before the cutoff" is
-- among "created before the cutoff"). On a large outbox, build it
-- beforehand without blocking claims (README, "Upgrading to the queue").
CREATE INDEX IF NOT EXISTS outbox_created_at ON outbox (created_at);
DROP INDEX outbox_quarantined;
CREATE INDEX outbox_quarantined ON outbox (created_at, sequence) WHERE quarantined_at IS NOT NULL;
ALTER TABLE outbox SET (fillfactor = 70);

-- The read, same semantics as 0015's: the slot's events in (created_at,
-- sequence) order, nothing once the slot is not held with `generation`,
-- nothing behind an earlier event of its award that waits for a retry.
-- An event whose outbox row is already published (marked by an older
-- sidecar's relay during the upgrade) is skipped. The settings hold its
-- plan to the one the statement is written for: walk the queue in order,
-- fetch each event by its key, stop at the batch. (Planned while the
-- tables were empty, a cached plan otherwise joined by reading the whole
-- outbox once per queued row.)
CREATE OR REPLACE FUNCTION oncegate_slot_pending(slot integer, generation bigint, slots bigint, batch bigint)
RETURNS TABLE (event_id uuid, event_type text, award_id text, sequence bigint, payload text,
               attempts integer, traceparent text)
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off
SET enable_sort = off
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET max_parallel_workers_per_gather = 0
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT o.event_id, o.event_type, o.award_id, o.sequence, o.payload::text, o.attempts, o.traceparent
    FROM outbox_queue q JOIN outbox o ON o.event_id = q.event_id
    WHERE q.award_hash % $3 = $1
      AND (q.leased_until IS NULL OR q.leased_until <= now())
      AND o.published_at IS NULL AND o.quarantined_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM outbox_queue e
        WHERE e.award_id = q.award_id AND e.leased_until IS NOT NULL AND e.leased_until > now()
          AND (e.created_at, e.sequence) < (q.created_at, q.sequence))
      AND EXISTS (SELECT 1 FROM relay_slots s
        WHERE s.slot = $1 AND s.generation = $2 AND s.leased_until > now())
    ORDER BY q.created_at, q.sequence
    LIMIT $4;
END $$;

-- The application role's privileges with outbox_queue: 0013's definition
-- with it added, the one in force.
CREATE OR REPLACE FUNCTION oncegate_grant_app_role(app_role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- table => privileges the role gets on it; every other table privilege
    -- on these tables (and any on audit_log's partitions) is refused.
    allowed constant jsonb := jsonb_build_object(
        'processed_messages',       jsonb_build_array('SELECT', 'INSERT', 'DELETE'),
        'disbursements',            jsonb_build_array('SELECT', 'INSERT'),
        'award_balances',           jsonb_build_array('SELECT', 'INSERT', 'UPDATE'),
        'outbox',                   jsonb_build_array('SELECT', 'INSERT', 'UPDATE', 'DELETE'),
        'audit_log',                jsonb_build_array('SELECT', 'INSERT'),
        'effects',                  jsonb_build_array('SELECT', 'INSERT', 'UPDATE', 'DELETE'),
        'audit_seals',              jsonb_build_array('SELECT', 'INSERT'),
        'audit_purges',             jsonb_build_array('SELECT'),
        'oncegate_retention_floor', jsonb_build_array('SELECT'),
        'relay_slots',              jsonb_build_array('SELECT', 'INSERT', 'UPDATE'),
        'relay_members',            jsonb_build_array('SELECT', 'INSERT', 'UPDATE', 'DELETE'),
        'outbox_queue',             jsonb_build_array('SELECT', 'INSERT', 'UPDATE', 'DELETE'));
    all_privs constant text[] := ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER'];
    granted_fns constant text[] := ARRAY[
        'public.oncegate_ensure_audit_partitions(date, integer)',
        'public.oncegate_drop_audit_partitions(timestamptz)',
        'public.oncegate_purge_audit_rows(timestamptz, integer)',
        'public.oncegate_audit_seal_horizon()'];
    owner_only_fns constant text[] := ARRAY[
        'public.oncegate_clamp_cutoff(timestamptz)',
        'public.oncegate_grant_app_role(name)',
        'public.oncegate_audit_purge_bounds(timestamptz)',
        'public.oncegate_record_audit_purge(timestamptz, text, text, bigint[])',
        'public.oncegate_seal_lock_key()'];
    owner_role name;
    role_row   pg_roles%ROWTYPE;
    rel        record;
    t          text;
    p          text;
    f          text;
    want       boolean;
    problems   text[] := '{}';
BEGIN
    SELECT pg_get_userbyid(c.relowner) INTO owner_role
    FROM pg_class c WHERE c.oid = 'public.audit_log'::regclass;

    SELECT * INTO role_row FROM pg_roles WHERE rolname = app_role;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'oncegate_grant_app_role: role "%" does not exist', app_role
            USING ERRCODE = '42704', HINT = 'Create it first, e.g. CREATE ROLE oncegate_app LOGIN PASSWORD ''…''.';
    END IF;
    IF role_row.rolsuper THEN
        RAISE EXCEPTION 'oncegate_grant_app_role: role "%" is a superuser; the application role must be an ordinary role', app_role
            USING ERRCODE = '22023';
    END IF;
    IF role_row.rolcreaterole THEN
        RAISE EXCEPTION 'oncegate_grant_app_role: role "%" has CREATEROLE (it can make itself a member of the owner); the application role must not', app_role
            USING ERRCODE = '22023';
    END IF;
    -- The owner of any oncegate table, or a member of it (with or without
    -- INHERIT: a member can SET ROLE to it), is not least privilege.
    FOR rel IN
        SELECT DISTINCT pg_get_userbyid(c.relowner) AS owner
        FROM pg_class c
        WHERE c.oid = ANY (ARRAY(SELECT to_regclass('public.' || k) FROM jsonb_object_keys(allowed) k))
    LOOP
        IF pg_has_role(app_role, rel.owner, 'MEMBER') THEN
            RAISE EXCEPTION 'oncegate_grant_app_role: role "%" is the schema owner "%" or a member of it; granting it privileges is meaningless', app_role, rel.owner
                USING ERRCODE = '22023', HINT = 'Run the sidecar as a separate role that is not a member of the owner.';
        END IF;
    END LOOP;
    IF NOT pg_has_role(current_user, owner_role, 'USAGE') THEN
        RAISE EXCEPTION 'oncegate_grant_app_role: run it as the schema owner "%", not as "%"', owner_role, current_user
            USING ERRCODE = '42501';
    END IF;

    -- The schema: USAGE (usually through PUBLIC already), never CREATE.
    IF has_schema_privilege(current_user, 'public', 'USAGE WITH GRANT OPTION') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA public TO %I', app_role);
    END IF;
    IF has_schema_privilege(current_user, 'public', 'CREATE WITH GRANT OPTION') THEN
        EXECUTE format('REVOKE CREATE ON SCHEMA public FROM %I', app_role);
    END IF;

    -- Tables: everything off (column privileges too), then the documented set.
    FOR t IN SELECT jsonb_object_keys(allowed) LOOP
        EXECUTE format('REVOKE ALL ON TABLE public.%I FROM %I', t, app_role);
        EXECUTE format('GRANT %s ON TABLE public.%I TO %I',
                       (SELECT string_agg(x, ', ') FROM jsonb_array_elements_text(allowed -> t) x), t, app_role);
    END LOOP;
    -- audit_log's partitions, present and future, need nothing: rows are
    -- inserted and read through the parent, whose privileges are the ones
    -- checked. Nothing on a partition directly.
    FOR rel IN
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'public.audit_log'::regclass
    LOOP
        EXECUTE format('REVOKE ALL ON TABLE public.%I FROM %I', rel.relname, app_role);
    END LOOP;
    -- audit_log.id is an identity column: inserting needs no privilege on
    -- its sequence, so the role gets none (setval would be UPDATE).
    FOR rel IN
        SELECT s.oid::regclass AS seq
        FROM pg_class s JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = s.oid
        WHERE s.relkind = 'S' AND d.refobjid = ANY (ARRAY(SELECT to_regclass('public.' || k) FROM jsonb_object_keys(allowed) k))
    LOOP
        EXECUTE format('REVOKE ALL ON SEQUENCE %s FROM %I', rel.seq, app_role);
    END LOOP;

    -- Functions: the purge/partition functions, not the owner's helpers.
    FOREACH f IN ARRAY granted_fns || owner_only_fns LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM %I', f, app_role);
    END LOOP;
    FOREACH f IN ARRAY granted_fns LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, app_role);
    END LOOP;

    -- Verify what the role can effectively do (through PUBLIC, memberships
    -- and other grantors too), not just what this function granted.
    IF NOT has_schema_privilege(app_role, 'public', 'USAGE') THEN
        problems := problems || 'lacks USAGE on schema public'::text;
    END IF;
    IF has_schema_privilege(app_role, 'public', 'CREATE') THEN
        problems := problems || 'has CREATE on schema public (REVOKE CREATE ON SCHEMA public FROM PUBLIC, the Postgres 15 default)'::text;
    END IF;
    FOR t IN SELECT jsonb_object_keys(allowed) LOOP
        FOREACH p IN ARRAY all_privs LOOP
            want := (allowed -> t) ? p;
            IF has_table_privilege(app_role, format('public.%I', t), p) <> want THEN
                problems := problems || format('%s %s on %s', CASE WHEN want THEN 'lacks' ELSE 'has' END, p, t);
            ELSIF NOT want AND p IN ('SELECT', 'INSERT', 'UPDATE', 'REFERENCES')
                  AND has_any_column_privilege(app_role, format('public.%I', t), p) THEN
                problems := problems || format('has column-level %s on %s', p, t);
            END IF;
        END LOOP;
    END LOOP;
    FOR rel IN
        SELECT c.oid, c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'public.audit_log'::regclass
    LOOP
        FOREACH p IN ARRAY all_privs LOOP
            IF has_table_privilege(app_role, rel.oid, p)
               OR (p IN ('SELECT', 'INSERT', 'UPDATE', 'REFERENCES') AND has_any_column_privilege(app_role, rel.oid, p)) THEN
                problems := problems || format('has %s on partition %s', p, rel.relname);
            END IF;
        END LOOP;
    END LOOP;
    FOR rel IN
        SELECT s.oid, s.relname
        FROM pg_class s JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = s.oid
        WHERE s.relkind = 'S' AND d.refobjid = ANY (ARRAY(SELECT to_regclass('public.' || k) FROM jsonb_object_keys(allowed) k))
    LOOP
        FOREACH p IN ARRAY ARRAY['USAGE', 'SELECT', 'UPDATE'] LOOP
            IF has_sequence_privilege(app_role, rel.oid, p) THEN
                problems := problems || format('has %s on sequence %s', p, rel.relname);
            END IF;
        END LOOP;
    END LOOP;
    FOREACH f IN ARRAY granted_fns LOOP
        IF NOT has_function_privilege(app_role, f, 'EXECUTE') THEN
            problems := problems || format('lacks EXECUTE on %s', f);
        END IF;
    END LOOP;
    FOREACH f IN ARRAY owner_only_fns LOOP
        IF has_function_privilege(app_role, f, 'EXECUTE') THEN
            problems := problems || format('has EXECUTE on %s', f);
        END IF;
    END LOOP;
    IF cardinality(problems) > 0 THEN
        RAISE EXCEPTION 'oncegate_grant_app_role: role "%" %', app_role, array_to_string(problems, '; ')
            USING ERRCODE = '22023',
                  HINT = 'A privilege it holds through PUBLIC, a role it belongs to or a grant by another role cannot be revoked here; revoke it at its source.';
    END IF;
END $$;
REVOKE EXECUTE ON FUNCTION oncegate_grant_app_role(name) FROM PUBLIC;
