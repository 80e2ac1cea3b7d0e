-- The shortest audit retention the database allows, owned by the schema
-- owner (2 CFR 200.334: three years). The purge functions run as the owner
-- (SECURITY DEFINER) and clamp whatever cutoff the caller passes to this
-- floor, so the application role can never erase audit rows early, whatever
-- ONCEGATE_RETENTION says. Change it as the owner:
--   UPDATE oncegate_retention_floor SET min_retention = interval '…';
CREATE TABLE oncegate_retention_floor (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    min_retention interval NOT NULL CHECK (min_retention >= interval '0')
);
INSERT INTO oncegate_retention_floor (min_retention) VALUES (interval '3 years');

-- The effective cutoff: never later than now() minus the floor.
CREATE FUNCTION oncegate_clamp_cutoff(cutoff timestamptz)
RETURNS timestamptz LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public AS $$
    SELECT least(cutoff, now() - (SELECT min_retention FROM public.oncegate_retention_floor))
$$;

CREATE OR REPLACE FUNCTION oncegate_drop_audit_partitions(cutoff timestamptz)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    r       record;
    n       bigint;
    dropped bigint := 0;
BEGIN
    cutoff := public.oncegate_clamp_cutoff(cutoff);
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

CREATE OR REPLACE FUNCTION oncegate_purge_audit_rows(cutoff timestamptz, batch integer)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    n bigint;
BEGIN
    cutoff := public.oncegate_clamp_cutoff(cutoff);
    PERFORM set_config('oncegate.purge', 'on', true);
    DELETE FROM public.audit_log
    WHERE (id, at) IN (SELECT id, at FROM public.audit_log WHERE at < cutoff LIMIT batch);
    GET DIAGNOSTICS n = ROW_COUNT;
    PERFORM set_config('oncegate.purge', 'off', true);
    RETURN n;
END $$;
