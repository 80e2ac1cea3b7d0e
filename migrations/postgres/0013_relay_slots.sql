-- The relay across pods (DESIGN §4, "Across pods"): slots own the work.
--
-- The outbox is divided into a fixed number of slots by a stable hash of
-- the award: the first four bytes of the SHA-256 of the award id's UTF-8
-- bytes, read big-endian as an unsigned 32-bit number; an event's slot is
-- that hash modulo the slot count. The sidecar stores the hash with every
-- event it writes (award_hash); oncegate_award_hash computes the same in
-- SQL for rows written before this migration, or by an older sidecar still
-- running during the upgrade.
CREATE FUNCTION oncegate_award_hash(award text) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT ('x' || encode(substring(sha256(convert_to(award, 'UTF8')) FROM 1 FOR 4), 'hex'))::bit(32)::bigint
$$;

ALTER TABLE outbox ADD COLUMN award_hash bigint;
UPDATE outbox SET award_hash = oncegate_award_hash(award_id) WHERE published_at IS NULL;

-- Per-row leases are gone: a slot's holder reads its slot's events, and
-- leased_until now only postpones a rejected event until its retry. The
-- lease owner column goes with them, which also stops the relays of older
-- sidecars still running during the upgrade: their lease statement names
-- it and fails, so they publish nothing beside the slot holders (they go on
-- serving claims until they are replaced).
ALTER TABLE outbox DROP COLUMN lease_owner;

-- One row per slot that ever existed; the slots in use are 0 .. count - 1
-- (in_use). A relay holds a slot while owner is its member id and
-- leased_until has not passed; generation goes up on every change of owner
-- (and on every resize), and every write a relay makes for a slot names the
-- generation it holds. The first relay to start creates the slots
-- (ONCEGATE_RELAY_SLOTS); `oncegate outbox slots --set N` changes the count.
CREATE TABLE relay_slots (
    slot         integer     PRIMARY KEY CHECK (slot >= 0),
    in_use       boolean     NOT NULL DEFAULT true,
    owner        text,
    generation   bigint      NOT NULL DEFAULT 0,
    leased_until timestamptz,
    changed_at   timestamptz NOT NULL DEFAULT now()
);

-- The live relays (one row per relay process), renewed every second or so:
-- the fair share of slots is computed from it.
CREATE TABLE relay_members (
    member     text        PRIMARY KEY,
    instance   text        NOT NULL,
    sink       text        NOT NULL,
    seen_until timestamptz NOT NULL,
    joined_at  timestamptz NOT NULL DEFAULT now()
);

-- The application role's privileges with the two relay tables: 0009's
-- definition with them added, the one in force. (relay_slots: no DELETE,
-- slots are never removed, only taken out of use.)
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
        'relay_members',            jsonb_build_array('SELECT', 'INSERT', 'UPDATE', 'DELETE'));
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
