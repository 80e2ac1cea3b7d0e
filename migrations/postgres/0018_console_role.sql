-- The console's database role (docs/CONSOLE.md, migrations/GRANTS.md):
-- it reads, and can do nothing else. oncegate_grant_console_role(role)
-- gives a role SELECT on the tables the console reads and nothing more,
-- then checks what the role can *effectively* do (through PUBLIC, its
-- memberships and other grantors too) and raises naming each excess, as
-- oncegate_grant_app_role does for the application role. `oncegate
-- migrate --console-role NAME` calls it after migrating; `oncegate
-- console` checks its own role at start and exits 64 when it can do more.
--
-- Additive: a new function, nothing that pods of the previous release
-- use changes.
CREATE FUNCTION oncegate_grant_console_role(console_role name) RETURNS void
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- the tables the console reads: SELECT, nothing else
    readable constant text[] := ARRAY['processed_messages', 'disbursements', 'award_balances', 'outbox',
        'audit_log', 'audit_seals', 'audit_purges', 'relay_slots', 'relay_members', 'outbox_queue'];
    -- oncegate's other tables: nothing at all
    hidden constant text[] := ARRAY['effects', 'oncegate_retention_floor'];
    all_privs constant text[] := ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER'];
    -- functions that change something: never the console's
    writing_fns constant text[] := ARRAY[
        'public.oncegate_ensure_audit_partitions(date, integer)',
        'public.oncegate_drop_audit_partitions(timestamptz)',
        'public.oncegate_purge_audit_rows(timestamptz, integer)',
        'public.oncegate_audit_seal_horizon()',
        'public.oncegate_clamp_cutoff(timestamptz)',
        'public.oncegate_grant_app_role(name)',
        'public.oncegate_grant_console_role(name)',
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
    SELECT * INTO role_row FROM pg_roles WHERE rolname = console_role;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'oncegate_grant_console_role: role "%" does not exist', console_role
            USING ERRCODE = '42704', HINT = 'Create it first, e.g. CREATE ROLE oncegate_console LOGIN PASSWORD ''…''.';
    END IF;
    IF role_row.rolsuper OR role_row.rolcreaterole OR role_row.rolbypassrls THEN
        RAISE EXCEPTION 'oncegate_grant_console_role: role "%" is a superuser or has CREATEROLE or BYPASSRLS; the console role must be an ordinary role', console_role
            USING ERRCODE = '22023';
    END IF;
    IF pg_has_role(console_role, owner_role, 'MEMBER') THEN
        RAISE EXCEPTION 'oncegate_grant_console_role: role "%" is the schema owner "%" or a member of it', console_role, owner_role
            USING ERRCODE = '22023', HINT = 'Run the console as a separate role that is not a member of the owner.';
    END IF;
    IF NOT pg_has_role(current_user, owner_role, 'USAGE') THEN
        RAISE EXCEPTION 'oncegate_grant_console_role: run it as the schema owner "%", not as "%"', owner_role, current_user
            USING ERRCODE = '42501';
    END IF;

    IF has_schema_privilege(current_user, 'public', 'USAGE WITH GRANT OPTION') THEN
        EXECUTE format('GRANT USAGE ON SCHEMA public TO %I', console_role);
    END IF;
    IF has_schema_privilege(current_user, 'public', 'CREATE WITH GRANT OPTION') THEN
        EXECUTE format('REVOKE CREATE ON SCHEMA public FROM %I', console_role);
    END IF;
    FOREACH t IN ARRAY readable || hidden LOOP
        EXECUTE format('REVOKE ALL ON TABLE public.%I FROM %I', t, console_role);
    END LOOP;
    FOREACH t IN ARRAY readable LOOP
        EXECUTE format('GRANT SELECT ON TABLE public.%I TO %I', t, console_role);
    END LOOP;
    FOR rel IN
        SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'public.audit_log'::regclass
    LOOP
        EXECUTE format('REVOKE ALL ON TABLE public.%I FROM %I', rel.relname, console_role);
    END LOOP;
    FOREACH f IN ARRAY writing_fns LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM %I', f, console_role);
    END LOOP;

    -- What the role can effectively do.
    IF NOT has_schema_privilege(console_role, 'public', 'USAGE') THEN
        problems := problems || 'lacks USAGE on schema public'::text;
    END IF;
    IF has_schema_privilege(console_role, 'public', 'CREATE') THEN
        problems := problems || 'has CREATE on schema public (REVOKE CREATE ON SCHEMA public FROM PUBLIC, the Postgres 15 default)'::text;
    END IF;
    FOREACH t IN ARRAY readable || hidden LOOP
        FOREACH p IN ARRAY all_privs LOOP
            want := p = 'SELECT' AND t = ANY (readable);
            IF has_table_privilege(console_role, format('public.%I', t), p) <> want THEN
                problems := problems || format('%s %s on %s', CASE WHEN want THEN 'lacks' ELSE 'has' END, p, t);
            ELSIF NOT want AND p IN ('SELECT', 'INSERT', 'UPDATE', 'REFERENCES')
                  AND has_any_column_privilege(console_role, format('public.%I', t), p) THEN
                problems := problems || format('has column-level %s on %s', p, t);
            END IF;
        END LOOP;
    END LOOP;
    FOR rel IN
        SELECT c.oid, c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'public.audit_log'::regclass
    LOOP
        FOREACH p IN ARRAY all_privs LOOP
            IF p <> 'SELECT' AND has_table_privilege(console_role, rel.oid, p) THEN
                problems := problems || format('has %s on partition %s', p, rel.relname);
            END IF;
        END LOOP;
    END LOOP;
    FOREACH f IN ARRAY writing_fns LOOP
        IF has_function_privilege(console_role, f, 'EXECUTE') THEN
            problems := problems || format('has EXECUTE on %s', f);
        END IF;
    END LOOP;
    IF cardinality(problems) > 0 THEN
        RAISE EXCEPTION 'oncegate_grant_console_role: role "%" %', console_role, array_to_string(problems, '; ')
            USING ERRCODE = '22023',
                  HINT = 'A privilege it holds through PUBLIC, a role it belongs to or a grant by another role cannot be revoked here; revoke it at its source.';
    END IF;
END $$;
REVOKE EXECUTE ON FUNCTION oncegate_grant_console_role(name) FROM PUBLIC;
