"""The admin API's tables, one migration on each engine (docs/admin-api.md).

``api_tokens``: the bearer tokens of the admin API, made by ``authsvc api-token add``;
only the SHA-256 digest of a token is kept, never the token. A name is never reused
(the audit trail names tokens by it). ``idempotency_keys``: the first answer to a
POST with an ``Idempotency-Key``, kept 24 hours, so a retry replays it instead of
writing again; an answer that held a secret is not kept (authsvc/admin/idempotency.py).

The web process's roles get no grant on either (store/postgres_schema.py grants the
admin role). The SQL runs on both engines: the column types below are spelled so
that SQLite and PostgreSQL read them alike (text, bigint).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

from authsvc.store.sqlite_errors import store_error

if TYPE_CHECKING:
    from authsvc.store.sqlite import SQLiteStore

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


class SQLiteTransactions:
    """SQLiteStore's ``admin_transaction`` (store/base.py), beside the tables whose SQL it runs."""

    @contextlib.contextmanager
    def admin_transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on any exception); sqlite3's errors become the store's."""
        store = cast("SQLiteStore", self)
        try:
            with store._write() as conn:
                yield conn
        except sqlite3.Error as e:
            store._drop()
            raise store_error(e, store.path) from None
