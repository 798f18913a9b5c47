"""The admin API's tables, one migration on each engine (docs/admin-api.md).

``api_tokens``: the bearer tokens of the admin API, made by ``authsvc api-token add``;
only the SHA-256 digest of a token is kept, never the token. A name is never reused
(the audit trail names tokens by it). ``idempotency_keys``: the first answer to a
POST with an ``Idempotency-Key``, kept 24 hours, so a retry replays it instead of
writing again; an answer that held a secret is not kept (authsvc/api/idempotency.py). The
answer is written in the transaction of the write it answers (store/writes.py); ``status`` 0
("running") is what the release before wrote while a request ran, and is read as no answer.

The web process's roles get no grant on either (store/postgres/schema.py grants the
admin role). The SQL runs on both engines: the column types below are spelled so
that SQLite and PostgreSQL read them alike (text, bigint).
"""

from __future__ import annotations

API_TABLES = """
CREATE TABLE api_tokens (
    name       text PRIMARY KEY,
    digest     text NOT NULL UNIQUE,
    scopes     text NOT NULL,
    created_at bigint NOT NULL,
    expires_at bigint,
    revoked_at bigint
);
CREATE TABLE idempotency_keys (
    token_name   text NOT NULL,
    key          text NOT NULL,
    request_hash text NOT NULL,
    created_at   bigint NOT NULL,
    status       integer NOT NULL,
    body         text,
    PRIMARY KEY (token_name, key)
);
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);
"""
