-- Least privilege (see migrations/GRANTS.md). Migrations run as the schema
-- owner; the sidecar runs as an application role that can write claims,
-- ledger, totals, outbox and audit rows but can never change or remove the
-- ledger or the audit trail, change the retention floor, or switch off the
-- append-only guard.

-- 1. The triggers: what no role may do, whatever it was granted.
--
-- Until now a DELETE on audit_log passed whenever the session setting
-- oncegate.purge was 'on'. Any role can set a custom setting, so any role
-- that had been granted DELETE on audit_log could `SET LOCAL oncegate.purge
-- = 'on'` and delete every row. Now a DELETE passes only when the flag is on
-- AND the current user is the owner of public.audit_log. Inside the SECURITY
-- DEFINER purge function (owned by the schema owner) current_user is the
-- owner; a role that was granted DELETE directly is refused even with the
-- flag set, and so is a partition addressed directly. The flag stays as an
-- intent marker: the owner's own stray `DELETE FROM audit_log` is refused
-- too.
--
-- current_user = owner is the strongest distinction Postgres offers without
-- a superuser: it means "the owner itself, or code running with the owner's
-- rights". The only SECURITY DEFINER code that deletes audit rows is
-- oncegate_purge_audit_rows, which clamps its cutoff to the owner's retention
-- floor. Guarding against the owner is out of scope: the owner can drop or
-- disable these triggers, drop the tables and lower the floor; the owner's
-- credential belongs to the migration Job alone.
--
-- disbursements stays fully append-only (UPDATE and DELETE refused for every
-- role, the owner included); UPDATE of audit rows is refused for everyone.
-- Keep the functions and public.audit_log owned by the same role (REASSIGN
-- OWNED moves both), or the purge cannot delete rows.
CREATE OR REPLACE FUNCTION oncegate_reject_change() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'DELETE'
       AND pg_partition_root(TG_RELID) = 'public.audit_log'::regclass
       AND current_setting('oncegate.purge', true) = 'on'
       AND current_user = (SELECT pg_get_userbyid(c.relowner) FROM pg_class c
                           WHERE c.oid = 'public.audit_log'::regclass) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP
        USING ERRCODE = '42501';
END $$;

-- TRUNCATE fires no row trigger, so the rule above cannot see it. A statement
-- trigger refuses it on the ledger, on audit_log and on every audit
-- partition (statement triggers are not inherited by partitions, so each one
-- gets its own; oncegate_ensure_audit_partitions adds it to new ones).
-- Retention never truncates: it drops whole partitions (which needs
-- ownership) or deletes through the purge function.
CREATE FUNCTION oncegate_reject_truncate() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: TRUNCATE is not allowed', TG_TABLE_NAME
        USING ERRCODE = '42501';
END $$;
CREATE TRIGGER disbursements_no_truncate BEFORE TRUNCATE ON disbursements
    FOR EACH STATEMENT EXECUTE FUNCTION oncegate_reject_truncate();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION oncegate_reject_truncate();
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'public.audit_log'::regclass
    LOOP
        EXECUTE format('CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON public.%I '
                       'FOR EACH STATEMENT EXECUTE FUNCTION public.oncegate_reject_truncate()', r.relname);
    END LOOP;
END $$;

-- The retention floor is the owner's decision, also against a stray grant:
-- a row trigger lets only the owner (or a member of it, or a superuser)
-- insert, update or delete it, and TRUNCATE is refused for everyone (the
-- owner UPDATEs it). Without its row the floor would be gone, so the clamp
-- below then keeps everything instead.
CREATE FUNCTION oncegate_floor_owner_only() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        RAISE EXCEPTION 'oncegate_retention_floor cannot be truncated; the owner UPDATEs it'
            USING ERRCODE = '42501';
    END IF;
    IF pg_has_role(current_user, (SELECT c.relowner FROM pg_class c
                                  WHERE c.oid = 'public.oncegate_retention_floor'::regclass), 'USAGE') THEN
        RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
    END IF;
    RAISE EXCEPTION 'oncegate_retention_floor belongs to the schema owner: % by % is not allowed', TG_OP, current_user
        USING ERRCODE = '42501';
END $$;
CREATE TRIGGER retention_floor_owner_only BEFORE INSERT OR UPDATE OR DELETE ON oncegate_retention_floor
    FOR EACH ROW EXECUTE FUNCTION oncegate_floor_owner_only();
CREATE TRIGGER retention_floor_no_truncate BEFORE TRUNCATE ON oncegate_retention_floor
    FOR EACH STATEMENT EXECUTE FUNCTION oncegate_floor_owner_only();

-- As 0002, but a missing floor row clamps every cutoff to -infinity (nothing
-- is purged) instead of removing the floor (least() ignores a NULL).
CREATE OR REPLACE FUNCTION oncegate_clamp_cutoff(cutoff timestamptz)
RETURNS timestamptz LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT least(cutoff, coalesce(now() - (SELECT min_retention FROM public.oncegate_retention_floor),
                                  '-infinity'::timestamptz))
$$;

-- As 0001, plus the TRUNCATE guard on each partition it creates.
CREATE OR REPLACE FUNCTION oncegate_ensure_audit_partitions(from_month date, months_ahead integer)
RETURNS integer LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
                EXECUTE format(
                    'CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON public.%I '
                    'FOR EACH STATEMENT EXECUTE FUNCTION public.oncegate_reject_truncate()', part);
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

-- 2. The SECURITY DEFINER functions run as the owner and are callable by the
-- application role (and by no one else: EXECUTE is revoked from PUBLIC). Every name in them is schema-qualified, so their search
-- path needs no schema a non-owner might write to: pg_catalog, then pg_temp
-- last (left out, pg_temp would be searched first for tables, e.g. a temporary
-- "pg_inherits" of the caller's making).
ALTER FUNCTION oncegate_drop_audit_partitions(timestamptz) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION oncegate_purge_audit_rows(timestamptz, integer) SET search_path = pg_catalog, pg_temp;

-- Functions are executable by PUBLIC by default; only the owner and the
-- roles oncegate_grant_app_role (or GRANTS.md by hand) grants may call these.
REVOKE EXECUTE ON FUNCTION oncegate_ensure_audit_partitions(date, integer),
                           oncegate_drop_audit_partitions(timestamptz),
                           oncegate_purge_audit_rows(timestamptz, integer),
                           oncegate_clamp_cutoff(timestamptz) FROM PUBLIC;

-- 3. oncegate_grant_app_role(app_role): gives `app_role` exactly the
-- privileges of migrations/GRANTS.md on the oncegate objects and verifies
-- the result. `oncegate migrate` calls it after migrating when
-- ONCEGATE_APP_ROLE is set; it is idempotent (it revokes everything on the
-- oncegate objects from the role, then grants the documented set), so it
-- runs at every migrate. Run it as the schema owner.
--
-- It refuses (raises) when the role does not exist, is a superuser, has
-- CREATEROLE (which can make itself a member of the owner), is the owner or
-- a member of it, or when, after the grants, the role still holds any
-- privilege beyond the documented set (through PUBLIC, a role it belongs to,
-- or a grant by another grantor) or lacks one of them.
--
-- Later migrations that add tables, sequences or functions the sidecar uses
-- must extend this function (CREATE OR REPLACE) and GRANTS.md.
CREATE FUNCTION oncegate_grant_app_role(app_role name) RETURNS void
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
        'oncegate_retention_floor', jsonb_build_array('SELECT'));
    all_privs constant text[] := ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER'];
    granted_fns constant text[] := ARRAY[
        'public.oncegate_ensure_audit_partitions(date, integer)',
        'public.oncegate_drop_audit_partitions(timestamptz)',
        'public.oncegate_purge_audit_rows(timestamptz, integer)'];
    owner_only_fns constant text[] := ARRAY[
        'public.oncegate_clamp_cutoff(timestamptz)',
        'public.oncegate_grant_app_role(name)'];
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
