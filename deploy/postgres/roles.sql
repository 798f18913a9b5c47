-- PostgreSQL roles and database for authsvc (docs/stores.md). Run once, as a superuser:
--     psql -v ON_ERROR_STOP=1 -f deploy/postgres/roles.sql
-- then give the two login roles passwords (\password authsvc_owner, \password authsvc_web)
-- and put them in each side's passfile, never in a URL.

-- SELECT on the tables only; `authsvc init` grants it. The web role is a member.
CREATE ROLE authsvc_reader NOLOGIN;
-- Owns the tables: `authsvc init` and every admin command connect as it.
CREATE ROLE authsvc_owner LOGIN;
-- The web process (gunicorn) connects as it: it can read, never write.
CREATE ROLE authsvc_web LOGIN IN ROLE authsvc_reader;
ALTER ROLE authsvc_web SET default_transaction_read_only = on;

CREATE DATABASE authsvc OWNER authsvc_owner;
REVOKE ALL ON DATABASE authsvc FROM PUBLIC;
GRANT CONNECT ON DATABASE authsvc TO authsvc_web;

\connect authsvc
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
