-- PostgreSQL roles and database for authsvc (docs/stores.md, "PostgreSQL roles"). Run once, as a superuser:
--     psql -v ON_ERROR_STOP=1 -f deploy/postgres/roles.sql
-- then give the four login roles passwords (\password authsvc_owner, \password authsvc_admin,
-- \password authsvc_web, \password authsvc_heartbeat_writer) and put them in each side's passfile,
-- never in a URL.
-- What each role may do is in privileges.sql, which this script runs at its end.

-- SELECT on the tables only; `authsvc init` grants it. The web role is a member.
CREATE ROLE authsvc_reader NOLOGIN;
-- Owns the tables: `authsvc init` and `authsvc audit prune` connect as it (deploy/postgres/owner.toml).
CREATE ROLE authsvc_owner LOGIN;
-- Every other admin command connects as it (deploy/postgres/admin.toml): it writes games, keys and
-- players, but may only read and append the audit trail (`authsvc init` grants its rights).
CREATE ROLE authsvc_admin LOGIN;
-- The web process (gunicorn) connects as it: it can read, never write.
CREATE ROLE authsvc_web LOGIN IN ROLE authsvc_reader;
-- `authsvc heartbeat` connects as it: it writes the heartbeat row and reads the schema
-- version, nothing else (`authsvc init` grants both); it is not a reader.
CREATE ROLE authsvc_heartbeat_writer LOGIN;

CREATE DATABASE authsvc OWNER authsvc_owner;

\connect authsvc
\ir privileges.sql
