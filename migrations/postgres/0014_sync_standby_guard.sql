-- The synchronous-standby guard (ONCEGATE_REQUIRE_SYNC_REPLICA, DESIGN §7):
-- what the primary's synchronous replication looks like right now, for a
-- role that may not read pg_stat_replication itself.
--
-- pg_stat_replication shows an ordinary role its rows with state and
-- sync_state NULL; only a superuser or a member of pg_read_all_stats (which
-- pg_monitor includes) sees them. This function runs with its owner's rights
-- (SECURITY DEFINER, the schema owner), so the application role learns how
-- many synchronous standbys stream without being granted pg_read_all_stats
-- itself — the owner needs it: GRANT pg_read_all_stats TO <owner> (by a
-- superuser, once). Without it `streaming` is NULL and the guard says so.
--
-- It returns nothing the caller could not read already except that count:
-- synchronous_standby_names is readable by every role, and the count is a
-- number. So EXECUTE stays with PUBLIC (the default for a new function),
-- and the application role needs no grant of its own (migrations/GRANTS.md).
--
--   standby_names  synchronous_standby_names as this session has it
--   required       how many standbys must confirm a commit: N of "FIRST N
--                  (…)", "ANY N (…)" or "N (…)", 1 for a plain list, 0 when
--                  none is named (commits then wait for no standby)
--   streaming      standbys streaming now whose sync_state is sync or quorum
--                  (the ones a commit waits for); NULL when the owner may not
--                  see them
--
-- A commit waits for a standby only when `required` > 0 and the session's
-- synchronous_commit is on, remote_write or remote_apply; it waits for ever
-- (it is not acknowledged) when fewer than `required` stream.
CREATE FUNCTION oncegate_sync_standbys(OUT standby_names text, OUT required integer, OUT streaming integer)
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT n,
           CASE WHEN btrim(n) = '' THEN 0
                WHEN n ~* '^\s*((first|any)\s+)?[0-9]+\s*\('
                    THEN substring(n FROM '(?i)^\s*(?:(?:first|any)\s+)?([0-9]+)')::integer
                ELSE 1 END,
           CASE WHEN pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') THEN
               (SELECT count(*)::integer FROM pg_stat_get_wal_senders() w
                WHERE w.state = 'streaming' AND w.sync_state IN ('sync', 'quorum'))
           END
    FROM current_setting('synchronous_standby_names') AS n
$$;
