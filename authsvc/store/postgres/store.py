"""The shared store: PostgreSQL through psycopg 3 (the ``authsvc[postgres]`` extra); the admin
command's side.

The admin command connects as the owner role and writes in transactions; the
web process's read path (a read-only role, one prepared query per request) is
PostgresReader in store/postgres/reader.py, which PostgresStore extends.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import psycopg
from psycopg import conninfo as pg_conninfo

from authsvc.errors import ConfigError, Conflict, StoreFull, StoreLocked, StoreUnavailable
from authsvc.store import audit as trail
from authsvc.store import base
from authsvc.store import events as event_tables
from authsvc.store.audit import Audit, Chain, Record
from authsvc.store.base import ApiToken, DeletedPlayer, Game, NotEmpty, Player, Store
from authsvc.store.common import BATCH, batches, select_games
from authsvc.store.dialect import Dialect
from authsvc.store.events import Delivery, Webhook
from authsvc.store.postgres.reader import (
    COLLATE_C,
    CREDENTIALS_SQL,
    PostgresReader,
    _reason,
)
from authsvc.store.postgres.schema import (
    ADMIN_GRANTS_SQL,
    ADMIN_ROLE,
    HEARTBEAT_GRANTS_SQL,
    HEARTBEAT_ROLE,
    MIGRATION_LOCK,
    MIGRATION_LOCK_WAIT,
    MIGRATIONS,
    VERSION_TABLE_SQL,
)
from authsvc.store.writes import _TOKEN_COLUMNS, Tx, api_token
from authsvc.urls import redact_url

__all__ = [
    "ADMIN_GRANTS_SQL",
    "ADMIN_ROLE",
    "CREDENTIALS_SQL",
    "HEARTBEAT_GRANTS_SQL",
    "HEARTBEAT_ROLE",
    "MIGRATION_LOCK",
    "MIGRATION_LOCK_WAIT",
    "MIGRATIONS",
    "VERSION_TABLE_SQL",
    "PostgresStore",
]


def _value(cursor: psycopg.Cursor) -> Any:
    """The first column of the one row a query always returns (an aggregate, EXISTS, RETURNING)."""
    row = cursor.fetchone()
    if row is None:  # not for these queries; a clear error rather than a TypeError on None[0]
        raise StoreUnavailable(
            "postgresql store: a query that always returns one row returned none"
        )
    return row[0]


# One heartbeat, one round trip (a multi-statement simple query: no named statement, so pgbouncer's
# transaction mode is fine): flushed locally at commit, so the WAL sender ships it at once (without
# waiting for a synchronous standby: one that is down must not stop the heartbeat of the others),
# and bounded should the server hang. The row is put back if it was deleted.
HEARTBEAT_SQL = """
SET LOCAL synchronous_commit = local;
SET LOCAL statement_timeout = '2s';
INSERT INTO authsvc_heartbeat (id, at) VALUES (1, now())
ON CONFLICT (id) DO UPDATE SET at = EXCLUDED.at
"""

# A row whose name is already the one given is left as it is, its updated_at_ms with it.
UPSERT_SQL = """
INSERT INTO players (user_id, username, updated_at_ms)
SELECT DISTINCT ON (user_id) user_id, username, %s::bigint FROM players_import
ORDER BY user_id, n DESC
ON CONFLICT (user_id) DO UPDATE
SET username = EXCLUDED.username, updated_at_ms = EXCLUDED.updated_at_ms
WHERE players.username <> EXCLUDED.username
"""

# The players UPSERT_SQL is about to add (true) or rename (false): their events (store/events.py).
IMPORT_CHANGES_SQL = """
SELECT i.user_id, p.user_id IS NULL FROM
(SELECT DISTINCT ON (user_id) user_id, username FROM players_import ORDER BY user_id, n DESC) AS i
LEFT JOIN players AS p ON p.user_id = i.user_id WHERE p.user_id IS NULL OR p.username <> i.username
ORDER BY i.user_id
"""

# Many players in one statement: their rows as arrays, unnested (store/dialect.py's write_players).
WRITE_PLAYERS_SQL = """
INSERT INTO players (user_id, username, enabled, updated_at_ms)
SELECT *, %s::bigint FROM unnest(%s::bigint[], %s::text[], %s::boolean[])
ON CONFLICT (user_id) DO UPDATE SET username = EXCLUDED.username, enabled = EXCLUDED.enabled,
    updated_at_ms = EXCLUDED.updated_at_ms
"""


# Whether this session's role owns the tables (authsvc_schema stands for them): only the owner
# grants.
OWNS_SCHEMA_SQL = (
    "SELECT coalesce((SELECT pg_has_role(relowner, 'USAGE') FROM pg_class "
    "WHERE oid = to_regclass('authsvc_schema')), false)"
)


class PostgresDialect(Dialect):
    name = "postgresql"
    WRITER_LOCK = Dialect.WRITER_LOCK + " FOR UPDATE"
    SUBSCRIBED = "w.events::jsonb @> jsonb_build_array(e.type)"
    DATA_WITHOUT_USERNAME = "(data::jsonb - 'username')::text"

    def sql(self, text: str) -> str:
        return text.replace("?", "%s")

    @contextlib.contextmanager
    def savepoint(self, conn: Any) -> Iterator[None]:
        with conn.transaction():
            yield

    def insert_game(self, conn: Any, name: str, now: int) -> int:
        return _value(
            conn.execute(
                "INSERT INTO games (name, created_at) VALUES (%s, %s) RETURNING id", (name, now)
            )
        )

    def current_players(self, conn: Any, user_ids: Sequence[int]) -> list[tuple]:
        return conn.execute(
            "SELECT user_id, username, enabled, epoch FROM players WHERE user_id = "
            "ANY(%s::bigint[])",
            (list(user_ids),),
        ).fetchall()

    def write_players(self, conn: Any, rows: Sequence[tuple[int, str, bool]], at_ms: int) -> None:
        conn.execute(
            WRITE_PLAYERS_SQL,
            (at_ms, [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]),
        )

    def deleted_players(self, conn: Any, user_ids: Sequence[int]) -> list[tuple]:
        return conn.execute(
            "SELECT user_id, epoch FROM deleted_players WHERE user_id = ANY(%s::bigint[])",
            (list(user_ids),),
        ).fetchall()

    def player_keys(self, conn: Any, user_ids: Sequence[int]) -> list[tuple]:
        return conn.execute(
            "SELECT user_id, key FROM player_keys WHERE user_id = ANY(%s::bigint[])",
            (list(user_ids),),
        ).fetchall()

    def erase_names(self, conn: Any, record_id: int, changes: str, by_record: int) -> None:
        # The admin role may not change a record: the owner's function does this one change,
        # checked.
        conn.execute("SELECT authsvc_erase_names(%s, %s, %s)", (record_id, changes, by_record))


POSTGRES = PostgresDialect()


class PostgresStore(PostgresReader, Store):
    """A reader (store/postgres/reader.py) that also writes: what the admin command opens."""

    @contextlib.contextmanager
    def _admin(
        self, transaction: bool = True, mode: str | None = None
    ) -> Iterator[psycopg.Connection]:
        """An admin connection, in a transaction (SET TRANSACTION ``mode`` first if given);
        psycopg's errors become the store's (store/base.py, "Errors")."""
        where = f"postgresql store {redact_url(self.url)}"
        try:
            conn = self._conn()
            if transaction:
                with conn.transaction():
                    if mode:
                        conn.execute(f"SET TRANSACTION {mode}")
                    # Wait for another session's lock at most ADMIN_LOCK_WAIT, not forever.
                    conn.execute(
                        "SELECT set_config('lock_timeout', %s, true)",
                        (f"{round(base.ADMIN_LOCK_WAIT * 1000)}ms",),
                    )
                    yield conn
            else:
                yield conn
        except psycopg.errors.LockNotAvailable:
            raise StoreLocked(
                f"{where}: another session held a lock this write needs for "
                f"{base.ADMIN_LOCK_WAIT:g} s, "
                "the longest a write waits; nothing was written, try again"
            ) from None
        except psycopg.errors.DiskFull:
            raise StoreFull(f"{where}: the server's disk is full; nothing was written") from None
        except psycopg.errors.ReadOnlySqlTransaction:
            raise ConfigError(
                f"postgresql store {redact_url(self.url)}: this role may not write "
                "(the admin command connects as the admin role, init and audit prune as the owner, "
                "docs/stores.md)"
            ) from None
        except psycopg.errors.InsufficientPrivilege:
            raise ConfigError(
                f"postgresql store {redact_url(self.url)}: permission denied for this role "
                "(the admin command connects as the admin role, init and audit prune as the owner, "
                "docs/stores.md)"
            ) from None
        except (psycopg.OperationalError, psycopg.InterfaceError) as e:
            self._drop()
            raise StoreUnavailable(f"{where}: {_reason(e, self._secrets)}") from None

    @contextlib.contextmanager
    def write(self, audit: Audit | None = None) -> Iterator[Tx]:
        """One transaction (the writer lock is its first statement: store/writes.py), psycopg's
        errors mapped as ``_admin`` maps them. Inside an open write on this thread: that one. After
        the COMMIT, the chain's new head is logged if the write appended records (store/audit.py,
        log_head)."""
        open_tx = getattr(self._local, "tx", None)
        if open_tx is not None:
            yield open_tx.joined(audit)
            return
        with self._admin() as conn:
            tx = self._local.tx = PostgresTx(
                conn, POSTGRES, audit or trail.unattributed(), collate=COLLATE_C, ledger=self.ledger
            )
            try:
                yield tx
                head = tx.head()
            finally:
                self._local.tx = None
        trail.log_head(head)  # committed: a rolled-back write never gets here

    @contextlib.contextmanager
    def bookkeeping(self, write: bool) -> Iterator[tuple[psycopg.Connection, PostgresDialect]]:
        """A transaction (``write``) or an autocommit read, errors mapped as ``_admin`` maps them;
        no writer lock."""
        with self._admin(transaction=write) as conn:
            yield conn, POSTGRES

    # -- admin ----------------------------------------------------------------------
    def migrate(self) -> tuple[int, int]:
        """Migrate as the owner (the advisory lock, the tables, the grants). A store already at this
        release's version is left as it is for any other role: `authsvc init` on an up-to-date store
        needs no right to migrate (scripts/install runs it on every upgrade, as the owner only where
        owner.toml exists)."""
        with self._admin(transaction=False) as conn:
            if self._version(conn) == len(MIGRATIONS) and not _value(conn.execute(OWNS_SCHEMA_SQL)):
                return len(MIGRATIONS), len(MIGRATIONS)
        with self._admin() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(VERSION_TABLE_SQL)
            before = self._version(conn)
            if before > len(MIGRATIONS):
                raise ConfigError(f"store schema version {before} is newer than this release")
            lock_wait = _value(conn.execute("SELECT current_setting('lock_timeout')"))
            for version, script in enumerate(MIGRATIONS[before:], start=before + 1):
                try:
                    with conn.transaction():
                        conn.execute(script)
                    conn.execute(
                        "SELECT set_config('lock_timeout', %s, true)", (lock_wait,)
                    )  # a script's SET LOCAL
                except psycopg.errors.LockNotAvailable:
                    raise StoreLocked(
                        f"migration {version}: another session (a pg_dump, a long read) held a "
                        f"table it changes for {MIGRATION_LOCK_WAIT}; nothing was changed, run "
                        "'authsvc init' again"
                    ) from None
                except psycopg.DatabaseError as e:
                    raise ConfigError(
                        f"migration {version} failed: {_reason(e, self._secrets)} "
                        f"(docs/stores.md lists what the owner role needs)"
                    ) from None
            conn.execute("DELETE FROM authsvc_schema")
            conn.execute("INSERT INTO authsvc_schema (version) VALUES (%s)", (len(MIGRATIONS),))
            conn.execute(HEARTBEAT_GRANTS_SQL)
            conn.execute(ADMIN_GRANTS_SQL)
        return before, len(MIGRATIONS)

    def _games(self, conn: psycopg.Connection, where: str = "", args: tuple = ()) -> list[Game]:
        return select_games(conn, where, args, COLLATE_C)

    def get_game(self, game_id: int) -> Game | None:
        with self._admin(transaction=False) as conn:
            found = self._games(conn, "WHERE id = %s", (game_id,))
        return found[0] if found else None

    def list_games(self) -> list[Game]:
        with self._admin() as conn:  # one snapshot for games and keys
            return self._games(conn)

    def get_player(self, user_id: int) -> Player | None:
        with self._admin(transaction=False) as conn:
            row = conn.execute(
                "SELECT user_id, username, epoch, enabled, updated_at_ms FROM players WHERE "
                "user_id = %s",
                (user_id,),
            ).fetchone()
        return Player(*row) if row else None

    # -- the admin API's bearer tokens ----------------------------------------------------
    def api_tokens(self) -> list[ApiToken]:
        with self._admin(transaction=False) as conn:
            rows = conn.execute(f"SELECT {_TOKEN_COLUMNS} FROM api_tokens ORDER BY name").fetchall()
        return [api_token(row) for row in rows]

    def api_token_by_digest(self, token_digest: str) -> ApiToken | None:
        """One autocommit read: it never waits for a writer."""
        with self._admin(transaction=False) as conn:
            row = conn.execute(
                f"SELECT {_TOKEN_COLUMNS} FROM api_tokens WHERE digest = %s", (token_digest,)
            ).fetchone()
        return None if row is None else api_token(row)

    # -- webhook subscriptions (store/events.py) ---------------------------------------
    def webhooks(self, webhook_id: int | None = None, *, removed: bool = False) -> list[Webhook]:
        with self._admin(transaction=False) as conn:
            return event_tables.select_webhooks(conn, POSTGRES, webhook_id, removed)

    def deliveries(
        self, webhook_id: int, *, state: str | None, limit: int, after: int
    ) -> list[Delivery]:
        with self._admin(mode="ISOLATION LEVEL REPEATABLE READ, READ ONLY") as conn:
            return event_tables.select_deliveries(
                conn, POSTGRES, webhook_id, state=state, limit=limit, after=after
            )

    # -- the audit trail (store/audit.py) ----------------------------------------------
    def audit_records(self, **filters) -> list[Record]:
        with self._admin(transaction=False) as conn:
            return trail.select(conn, POSTGRES, **filters)

    def audit_walk(self) -> Iterator[Chain | Record]:
        """The chain row, then every record oldest first, from one snapshot."""
        with self._admin(mode="ISOLATION LEVEL REPEATABLE READ, READ ONLY") as conn:
            yield trail.read_chain(conn, POSTGRES)
            yield from trail.walk(conn, POSTGRES)

    def heartbeat_connections(self) -> None:
        """Before the first heartbeat: a dead network noticed within seconds (the kernel's default
        is minutes of retransmissions, all that time without a heartbeat), and a name in
        pg_stat_activity."""
        params = {
            name: str(value) for name, value in pg_conninfo.conninfo_to_dict(self._conninfo).items()
        }
        params.setdefault("tcp_user_timeout", "3000")
        if params.get("application_name") == "authsvc-admin":
            params["application_name"] = "authsvc-heartbeat"
        self._conninfo = pg_conninfo.make_conninfo(**params)

    def write_heartbeat(self) -> None:
        """The primary's time now into the heartbeat row (``authsvc heartbeat``, docs/stores.md)."""
        with self._admin(transaction=False) as conn:
            conn.execute(HEARTBEAT_SQL)

    # -- moving between stores --------------------------------------------------------
    def game_id_high_water(self) -> int:
        with self._admin(transaction=False) as conn:
            return _value(
                conn.execute(
                    "SELECT "
                    "greatest(coalesce(pg_sequence_last_value(pg_get_serial_sequence('games', "
                    "'id')::regclass), 0), coalesce((SELECT max(id) FROM games), 0))"
                )
            )

    def dump(self) -> Iterator[Game | Player | DeletedPlayer]:
        with self._admin(mode="ISOLATION LEVEL REPEATABLE READ, READ ONLY") as conn:
            yield from self._games(conn)
            with conn.cursor(name="authsvc_dump") as cur:
                cur.itersize = BATCH
                cur.execute(
                    "SELECT user_id, username, epoch, enabled, updated_at_ms FROM players ORDER BY "
                    "user_id"
                )
                for row in cur:
                    yield Player(*row)
            with conn.cursor(name="authsvc_dump_deleted") as cur:
                cur.itersize = BATCH
                cur.execute("SELECT user_id, epoch FROM deleted_players ORDER BY user_id")
                for row in cur:
                    yield DeletedPlayer(*row)


class PostgresTx(Tx):
    """A write transaction on PostgreSQL: the engine's bulk writes (store/writes.py's Tx declares
    them)."""

    def import_players(
        self, rows: Iterable[tuple[int, str]], progress: Callable[[int], None] | None = None
    ) -> int:
        """COPY into a temporary table, then one INSERT ... ON CONFLICT; the last row of a user id
        wins."""
        count = 0
        conn = self.bulk_connection()
        # Into a temporary table before the writer lock: other writes wait only for the upsert.
        conn.execute(
            "CREATE TEMPORARY TABLE players_import (n bigint, user_id bigint, username text) ON "
            "COMMIT DROP"
        )
        with conn.cursor().copy("COPY players_import (n, user_id, username) FROM STDIN") as copy:
            for batch in batches(rows):
                for user_id, username in batch:
                    count += 1
                    copy.write_row((count, user_id, username))
                if progress:
                    progress(count)
        try:
            with conn.transaction():
                changes = conn.execute(IMPORT_CHANGES_SQL).fetchall()
                conn.execute(UPSERT_SQL, (self.at_ms,))
        except psycopg.errors.CheckViolation:
            raise Conflict("user ids must be from 1 to 2^63-1") from None
        self.continue_epochs()
        self.emit_players(
            (user_id, "player.created" if new else "player.renamed") for user_id, new in changes
        )
        self.record("player.import", after={"rows": count})
        return count

    def load(
        self,
        games: Iterable[Game],
        players: Iterable[Player | DeletedPlayer],
        game_id_high_water: int,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[int, int]:
        n_games = n_players = 0
        top = game_id_high_water
        try:
            conn = self.bulk_connection()
            self.locked()
            conn.execute("LOCK TABLE games, api_keys, players, deleted_players IN EXCLUSIVE MODE")
            if _value(
                conn.execute(
                    "SELECT EXISTS (SELECT FROM games) OR EXISTS (SELECT FROM players) "
                    "OR EXISTS (SELECT FROM deleted_players)"
                )
            ):
                raise NotEmpty()
            for game in games:
                conn.execute(
                    "INSERT INTO games (id, name, enabled, created_at) VALUES (%s, %s, %s, %s)",
                    (game.id, game.name, game.enabled, game.created_at),
                )
                for key in game.keys:
                    conn.execute(
                        "INSERT INTO api_keys (digest, game_id, created_at, expires_at) VALUES "
                        "(%s, %s, %s, %s)",
                        (key.digest, game.id, key.created_at, key.expires_at),
                    )
                n_games += 1
                top = max(top, game.id)
            if top > 0:
                conn.execute("SELECT setval(pg_get_serial_sequence('games', 'id'), %s)", (top,))
            columns = "user_id, username, epoch, enabled, updated_at_ms"
            # After the players (dump's order), the deleted players: written in batches of their
            # own.
            deleted: list[Player | DeletedPlayer] = []
            rest = iter(players)
            with conn.cursor().copy(f"COPY players ({columns}) FROM STDIN") as copy:
                for batch in batches(rest):
                    for p in batch:
                        if isinstance(p, DeletedPlayer) or deleted:
                            deleted.append(p)
                        else:
                            copy.write_row(
                                (p.user_id, p.username, p.epoch, p.enabled, p.updated_at_ms)
                            )
                            n_players += 1
                    if progress:
                        progress(n_players)
                    if deleted:
                        break
            for chunk in itertools.chain([deleted], batches(rest)):
                rows = [(p.user_id, p.epoch) for p in chunk if isinstance(p, DeletedPlayer)]
                if len(rows) < len(chunk):
                    raise Conflict("the players must come before the deleted players")
                if rows:
                    conn.cursor().executemany(
                        "INSERT INTO deleted_players (user_id, epoch) VALUES (%s, %s)", rows
                    )
            if _value(
                conn.execute(
                    "SELECT EXISTS (SELECT FROM deleted_players AS d JOIN players AS p "
                    "ON p.user_id = d.user_id)"
                )
            ):
                raise Conflict("a player appears both as a player and as a deleted one")
            after = {"games": n_games, "players": n_players}
            self.record("store.import", after=after)
        except psycopg.errors.IntegrityError as e:
            raise _conflict(e) from None
        return n_games, n_players


def _conflict(error: psycopg.errors.IntegrityError, name: str | None = None) -> Conflict:
    constraint = error.diag.constraint_name or ""
    if constraint == "games_name_key":
        return Conflict(f"a game named {name!r} exists" if name else "two games have the same name")
    if constraint == "api_keys_pkey":
        return Conflict("that api key digest is already in use")
    if constraint in ("players_pkey", "deleted_players_pkey"):
        return Conflict("a player appears twice")
    if constraint == "games_pkey":
        return Conflict("a game id appears twice")
    return Conflict(f"the data breaks the rule {constraint or type(error).__name__}")
