-- What authsvc's roles may do in its database (docs/stores.md, "PostgreSQL roles").
-- roles.sql runs it after making the roles. On a cluster set up by an
-- earlier roles.sql, run it again as a superuser, after making the role it lacks, then
-- `authsvc init` (which grants the heartbeat writer its rights on the tables):
--     psql -v ON_ERROR_STOP=1 -c 'CREATE ROLE authsvc_heartbeat_writer LOGIN'
--     psql -v ON_ERROR_STOP=1 -d authsvc -f deploy/postgres/privileges.sql
-- Every statement here can be run again and changes nothing the second time.

REVOKE ALL ON DATABASE authsvc FROM PUBLIC;  -- no TEMP tables, no CONNECT but as granted below
GRANT CONNECT ON DATABASE authsvc TO authsvc_web, authsvc_heartbeat_writer;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;  -- the default since PostgreSQL 15, not before

-- Functions every role may call by default (EXECUTE to PUBLIC) that reach past the tables'
-- grants. Revoked in this database only (the privileges of built-in functions are per database).
--  * Large objects: lo_from_bytea, lo_create, lowrite, lo_put, lo_unlink, ... write rows of
--    pg_largeobject even inside a read-only transaction, so the web role could store data
--    (977 kB were written in a probe). No role of authsvc uses large objects.
--  * Advisory locks: `authsvc init` holds pg_advisory_xact_lock(MIGRATION_LOCK) so that two
--    migrations never interleave (authsvc/store/postgres.py). PostgreSQL cannot grant one lock
--    key to one role: whoever may call pg_advisory_lock may take that key and make `authsvc init`
--    fail (StoreLocked) for as long as it holds it. A lock on a table instead (LOCK TABLE, which
--    needs more than SELECT for any mode but ACCESS SHARE) would need the table to exist before
--    the first migration creates it. So: no one but the owner may call them, and the owner only
--    the one `authsvc init` uses.
DO $$
DECLARE
    f regprocedure;
BEGIN
    FOR f IN
        SELECT oid FROM pg_proc
        WHERE pronamespace = 'pg_catalog'::regnamespace
          AND (proname LIKE 'lo\_%' OR proname IN ('loread', 'lowrite') OR proname LIKE 'pg\_%advisory%')
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$$;
GRANT EXECUTE ON FUNCTION pg_advisory_xact_lock(bigint) TO authsvc_owner;

-- The web role reads only; its connections are read-only transactions as well (docs/stores.md).
ALTER ROLE authsvc_web SET default_transaction_read_only = on;
