-- What authsvc's roles may do in its database, and when their sessions end (docs/stores.md,
-- "PostgreSQL roles"). roles.sql runs it after making the roles. On a cluster set up by an
-- earlier roles.sql, run it again as a superuser, after making the roles it lacks, then
-- `authsvc init` as the owner (which grants the heartbeat writer and the admin role their rights
-- on the tables):
--     psql -v ON_ERROR_STOP=1 -c 'CREATE ROLE authsvc_heartbeat_writer LOGIN'
--     psql -v ON_ERROR_STOP=1 -c 'CREATE ROLE authsvc_admin LOGIN'
--     psql -v ON_ERROR_STOP=1 -d authsvc -f deploy/postgres/privileges.sql
-- Every statement here can be run again and changes nothing the second time.

REVOKE ALL ON DATABASE authsvc FROM PUBLIC;  -- no TEMP tables, no CONNECT but as granted below
GRANT CONNECT ON DATABASE authsvc TO authsvc_web, authsvc_heartbeat_writer;
-- The admin role: `player import` fills a temporary table (the owner has both as the database's owner).
GRANT CONNECT, TEMPORARY ON DATABASE authsvc TO authsvc_admin;
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

-- When sessions end. The app never leaves a transaction open across round trips: the web process
-- runs one statement per request in autocommit, the heartbeat one multi-statement query, so a
-- session idle in a transaction has lost its client (or is a person's psql), and its locks go.
ALTER ROLE authsvc_web SET idle_in_transaction_session_timeout = '10s';
ALTER ROLE authsvc_heartbeat_writer SET idle_in_transaction_session_timeout = '5s';
-- A session merely idle is fine for the web role: its pooled connections wait, legitimately, for
-- as long as no one logs in; closing them would cost a reconnect (TLS, password, prepare) in the
-- first authentication after every quiet spell. The heartbeat writes five times a second: its
-- session idle for 30 s has no writer any more. (A closed connection is reopened by both: the web
-- process retries the query once on a fresh connection, the heartbeat at its next interval.)
SELECT current_setting('server_version_num')::int >= 140000 AS has_idle_session_timeout \gset
\if :has_idle_session_timeout
ALTER ROLE authsvc_heartbeat_writer SET idle_session_timeout = '30s';
\endif

-- A client whose host or network died leaves its backend behind (and any lock it holds) for as
-- long as the server's TCP notices nothing: two hours and more with the kernel's defaults. These
-- end it within about 15 s: keepalive probes after 5 s without traffic, 3 probes 2 s apart, and
-- at most 10 s for data the client does not acknowledge (a reply sent as the link died, when
-- keepalives do not run). A live client's kernel answers the probes, however long it idles.
-- TCP connections only; behind pgbouncer they end its server connections (its own
-- tcp_keepalive settings cover its clients). postgresql.conf takes the same four for every role.
ALTER ROLE authsvc_web SET tcp_keepalives_idle = 5;
ALTER ROLE authsvc_web SET tcp_keepalives_interval = 2;
ALTER ROLE authsvc_web SET tcp_keepalives_count = 3;
ALTER ROLE authsvc_web SET tcp_user_timeout = 10000;
ALTER ROLE authsvc_heartbeat_writer SET tcp_keepalives_idle = 5;
ALTER ROLE authsvc_heartbeat_writer SET tcp_keepalives_interval = 2;
ALTER ROLE authsvc_heartbeat_writer SET tcp_keepalives_count = 3;
ALTER ROLE authsvc_heartbeat_writer SET tcp_user_timeout = 10000;
ALTER ROLE authsvc_owner SET tcp_keepalives_idle = 5;
ALTER ROLE authsvc_owner SET tcp_keepalives_interval = 2;
ALTER ROLE authsvc_owner SET tcp_keepalives_count = 3;
ALTER ROLE authsvc_owner SET tcp_user_timeout = 10000;
ALTER ROLE authsvc_admin SET tcp_keepalives_idle = 5;
ALTER ROLE authsvc_admin SET tcp_keepalives_interval = 2;
ALTER ROLE authsvc_admin SET tcp_keepalives_count = 3;
ALTER ROLE authsvc_admin SET tcp_user_timeout = 10000;
