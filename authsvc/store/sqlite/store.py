"""The embedded store: one SQLite file in WAL mode; this module is the admin side.

The admin side (the command, the admin API) opens the file read-write and writes; the web
process's read path (read-only connections, snapshots, a replaced file) is
SQLiteReader in store/sqlite/reader.py, which SQLiteStore extends.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator

from authsvc.errors import ConfigError, Conflict, StoreUnavailable
from authsvc.store import audit as trail
from authsvc.store import base, restore
from authsvc.store import events as event_tables
from authsvc.store.api_tables import API_TABLES
from authsvc.store.audit import Audit, Chain, Record
from authsvc.store.base import ApiToken, DeletedPlayer, Game, NotEmpty, Player, Store
from authsvc.store.common import TOKEN_SECRETS_TABLE, batches, select_games
from authsvc.store.dialect import SQLITE, SQLiteDialect
from authsvc.store.events import Delivery, Webhook
from authsvc.store.sqlite.errors import store_error as _store_error
from authsvc.store.sqlite.reader import CREDENTIALS_SQL, PLAYER_SQL, SQLiteReader
from authsvc.store.sqlite.url import path_from_url
from authsvc.store.writes import _TOKEN_COLUMNS, Tx, api_token

log = logging.getLogger("authsvc.store")

__all__ = [
    "CREDENTIALS_SQL",
    "PLAYER_SQL",
    "MIGRATIONS",
    "WAL_LIMIT_BYTES",
    "SQLiteStore",
    "path_from_url",
]

# The -wal file an admin command leaves behind, at most (docs/stores.md, "The -wal file"):
# about SQLite's automatic checkpoint of 1,000 pages. Readers let go of a snapshot within
# 2 x AUTHSVC_MAX_STALENESS (at most 2 s), so an admin command waits that long at most.
WAL_LIMIT_BYTES = 4 << 20
WAL_TRUNCATE_WAIT = 3.0
# Free space under the store that `authsvc check` asks for: the -wal file's growth to
# WAL_LIMIT_BYTES and the database file's by as much at the checkpoint. Less, and a write may fail
# with SQLITE_FULL.
MIN_FREE_BYTES = 2 * WAL_LIMIT_BYTES
# How long, after a write that deleted a player, the admin side waits for the readers' snapshots to
# let the -wal file go (docs/stores.md, "Erasure"): they do within 2 x AUTHSVC_MAX_STALENESS (at
# most 2 s); the answer follows, so the names leave the files within 10 s of it.
ERASE_WAIT = 8.0
# How long the deliverer's bookkeeping write (store/deliveries.py) waits for another connection's
# write lock: short, since the loop tries again at its next step.
BOOKKEEPING_WAIT = 2.0

MIGRATIONS: list[str] = [
    # 1: games, their api keys (SHA-256 digests), players.
    """
    CREATE TABLE games (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        name       TEXT NOT NULL UNIQUE,
        enabled    INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
        created_at INTEGER NOT NULL
    );
    CREATE TABLE api_keys (
        digest     TEXT PRIMARY KEY,
        game_id    INTEGER NOT NULL REFERENCES games (id),
        created_at INTEGER NOT NULL,
        expires_at INTEGER
    ) WITHOUT ROWID;
    CREATE INDEX api_keys_game_id ON api_keys (game_id);
    CREATE TABLE players (
        user_id  INTEGER PRIMARY KEY CHECK (user_id > 0),
        username TEXT NOT NULL,
        epoch    INTEGER NOT NULL DEFAULT 0,
        enabled  INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1))
    );
    """,
    # 2: the audit trail, one hash-chained record per change, and its anchor and head
    # (store/audit.py).
    trail.SQLITE_TABLES,
    # 3: the admin API's bearer tokens (digests) and Idempotency-Key records (store/api_tables.py).
    API_TABLES,
    # 4: when each player's row last changed, in unix milliseconds (base.Player.updated_at_ms). NULL
    # in the rows already there: when they last changed is not known. A change of the schema only
    # (no row is rewritten, however many players); the web path's queries never read it.
    "ALTER TABLE players ADD COLUMN updated_at_ms INTEGER",
    # 5: deleting players (docs/admin.md, "Erasure"). A deleted player's id and last credential
    # epoch, no name: the same id signed up again starts past it (store/writes.py's
    # continue_epochs). And the audit trail's sealing: each player's key, the clear values beside
    # the records, the mark of a record written before sealing whose names a deletion erased
    # (store/audit.py). New tables and a column without a default: no row is rewritten.
    """
    CREATE TABLE deleted_players (
        user_id INTEGER PRIMARY KEY CHECK (user_id > 0),
        epoch   INTEGER NOT NULL
    );
    """
    + trail.SQLITE_SEALING,
    # 6: the events outbox and the webhook subscriptions (store/events.py). New tables: no row is
    # rewritten.
    event_tables.SQLITE_TABLES,
    # 7: the indexes the deliverer's retention reads (store/deliveries.py's prune). Built from the
    # rows there, under the write lock: the admin side waits for it (about a second per million
    # deliveries).
    event_tables.RETENTION_INDEXES,
    # 8: the deliverer's state: each webhook's fan-out mark (the deliverer, not the change's
    # transaction, writes the deliveries: store/deliveries.py's fan_out) and its lease. One column
    # with a default, one row per webhook rewritten, a new table.
    event_tables.DELIVERER_STATE.format(bigint="INTEGER"),
    # 9: the token secrets' fingerprints (authsvc/tokens.py): which secrets the store was used with,
    # so a lost or wrong secret file is refused rather than every token. A new table: no row is
    # rewritten.
    TOKEN_SECRETS_TABLE.format(bigint="INTEGER"),
    # 10: the restore generation (store/restore.py): one row once a backup was restored. A new
    # table.
    restore.SQLITE_TABLE,
    # 11: an api key's expiry in unix milliseconds beside the whole seconds of expires_at, which the
    # previous release goes on reading (and writing: the reader takes the earlier of the two). NULL
    # in the rows already there: a change of the schema only.
    "ALTER TABLE api_keys ADD COLUMN expires_at_ms INTEGER",
    # 12: each webhook's due deliveries in due order (store/deliveries.py's due: a page holds a few
    # of every webhook's). An index of the pending rows only, built under the write lock.
    event_tables.WEBHOOK_DUE_INDEX,
]


def _mapped(method):
    """An admin method that raises the store's errors, never sqlite3's (IntegrityError is handled
    inside)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as e:
            self._drop()  # reopened on the next call: the file may come back
            raise _store_error(e, self.path) from None
        except OSError as e:  # a reader's stat of a path that is gone (see _connect)
            self._drop()
            raise StoreUnavailable(
                f"sqlite store {self.path} cannot be read: {e.strerror}"
            ) from None

    return wrapper


class SQLiteStore(SQLiteReader, Store):
    """A reader (store/sqlite/reader.py) that also writes: what the admin command opens."""

    def _open(self) -> sqlite3.Connection:
        if self.readonly:
            return super()._open()
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(
            f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES:d}"
        )  # cut back when the WAL restarts
        conn.execute("PRAGMA busy_timeout = 2000")
        # What a write deletes or overwrites is zeroed in its page, and a freed page is zeroed: a
        # deleted player's name (or a renamed one's old name) is not left in the file's free space
        # (docs/stores.md).
        conn.execute("PRAGMA secure_delete = ON")
        return conn

    def close(self) -> None:
        """Close this thread's connection; an admin's leaves the -wal file at most
        WAL_LIMIT_BYTES."""
        if not self.readonly:
            self._truncate_wal()
        self._drop()

    def _truncate_wal(self) -> None:
        """Checkpoint and empty a -wal file over WAL_LIMIT_BYTES, waiting at most WAL_TRUNCATE_WAIT
        for readers.

        SQLite's own checkpoints never make the file smaller, and the file is cut back
        to the limit only at the next write: without this, a burst of admin writes
        would leave a large -wal file until the next admin command (docs/stores.md).
        """
        conn = getattr(self._local, "conn", None)
        try:
            if conn is None or os.path.getsize(self.path + "-wal") <= WAL_LIMIT_BYTES:
                return
            conn.execute(f"PRAGMA busy_timeout = {round(WAL_TRUNCATE_WAIT * 1000):d}")
            conn.execute(
                "PRAGMA wal_checkpoint(TRUNCATE)"
            )  # a reader still in a snapshot: it stays as it is
        except (OSError, sqlite3.Error):
            pass  # no -wal file, or the store is failing: the next admin command tries again

    def _erase_wal(self) -> None:
        """After a write that deleted a player or removed a webhook: checkpoint and empty the -wal
        file, whose older frames still hold the pages as they were before (the names, the webhook's
        secret). The main file then has the pages as they are now, the deleted content zeroed
        (secure_delete). A checkpoint cannot pass a reader still in a snapshot of those frames: wait
        up to ERASE_WAIT for the web workers to let theirs go (docs/stores.md)."""
        conn = self._conn()
        deadline = time.monotonic() + ERASE_WAIT
        try:
            while True:
                wait = max(deadline - time.monotonic(), 0.0)
                conn.execute(f"PRAGMA busy_timeout = {round(wait * 1000):d}")
                busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                if not busy:
                    return
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
            log.warning(
                "sqlite store %s: a reader held a snapshot for %g s after a player's deletion or a "
                "webhook's removal; its -wal file still holds what it erased until the next "
                "checkpoint (docs/stores.md)",
                self.path,
                ERASE_WAIT,
            )
        except sqlite3.Error as e:
            log.warning(
                "sqlite store %s: the checkpoint after a player's deletion or a webhook's removal "
                "failed (%s); its -wal file still holds what it erased until the next checkpoint "
                "(docs/stores.md)",
                self.path,
                e,
            )
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("PRAGMA busy_timeout = 2000")  # as _open left it

    # -- admin ----------------------------------------------------------------------
    def _write(self):
        conn = self._conn()
        conn.execute(f"PRAGMA busy_timeout = {round(base.ADMIN_LOCK_WAIT * 1000):d}")
        conn.execute("BEGIN IMMEDIATE")
        return _Transaction(conn)

    @_mapped
    def migrate(self) -> tuple[int, int]:
        conn = self._conn()
        conn.execute("PRAGMA journal_mode = WAL")
        with self._write():
            before = self._version(conn)
            if before > len(MIGRATIONS):
                raise ConfigError(f"store schema version {before} is newer than this release")
            for version, script in enumerate(MIGRATIONS[before:], start=before + 1):
                for statement in filter(str.strip, script.split(";")):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {version:d}")
        return before, len(MIGRATIONS)

    def disk_full(self) -> str | None:
        """Free space of the store's file system (as the user running this sees it: no root
        reserve)."""
        directory = os.path.dirname(os.path.abspath(self.path))
        try:
            st = os.statvfs(directory)
        except OSError as e:
            return f"cannot see the free space of {directory}: {e.strerror}"
        free = st.f_bavail * st.f_frsize
        if free >= MIN_FREE_BYTES:
            return None
        return (
            f"the disk of sqlite store {self.path} has {free >> 10} KiB free, under "
            f"{MIN_FREE_BYTES >> 20} MiB: admin writes fail with 'the disk is full'; free space "
            "there (docs/operations.md, section 7)"
        )

    def backup(self, target: str) -> None:
        """A live-consistent copy by SQLite's backup API, in WAL mode: fast once restored
        (operations.md s. 8).

        The copy keeps no webhook secret (store/events.py): its webhooks are removed, their secrets
        zeroed in the file (secure_delete, then a checkpoint that empties the copy's -wal); after a
        restore, subscribe again."""
        if os.path.exists(target):
            raise ConfigError(f"backup target {target} exists; give a new file name")
        try:
            with contextlib.closing(sqlite3.connect(target, isolation_level=None)) as copy:
                self._conn().backup(copy)
                copy.execute("PRAGMA journal_mode = WAL")
                copy.execute("PRAGMA secure_delete = ON")
                now_ms = int(time.time() * 1000)
                copy.execute("BEGIN IMMEDIATE")
                copy.execute(
                    "UPDATE deliveries SET state = 'failed', done_at = ?, last_error = 'not in a "
                    "backup' WHERE state = 'pending'",
                    (now_ms,),
                )
                copy.execute(
                    "UPDATE webhooks SET secret = '', deleted_at = coalesce(deleted_at, ?)",
                    (now_ms,),
                )
                copy.execute("COMMIT")
                copy.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as e:
            for leftover in (target, target + "-wal", target + "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(leftover)
            raise ConfigError(f"backup to {target} failed: {e}") from None

    @contextlib.contextmanager
    def write(self, audit: Audit | None = None) -> Iterator[Tx]:
        """BEGIN IMMEDIATE (the writer lock: store/writes.py) ... COMMIT, ROLLBACK on any exception;
        sqlite3's errors become the store's. Inside an open write on this thread: that one. After
        the COMMIT, the chain's new head is logged if the write appended records (store/audit.py,
        log_head)."""
        open_tx = getattr(self._local, "tx", None)
        if open_tx is not None:
            yield open_tx.joined(audit)
            return
        try:
            with self._write() as conn:
                tx = self._local.tx = SQLiteTx(
                    conn, SQLITE, audit or trail.unattributed(), ledger=self.ledger
                )
                try:
                    yield tx
                    head = tx.head()
                finally:
                    self._local.tx = None
        except sqlite3.Error as e:
            self._drop()
            raise _store_error(e, self.path) from None
        trail.log_head(head)  # committed: a rolled-back write never gets here
        if (
            tx.erased
        ):  # committed: what a deletion or a webhook's removal freed leaves the -wal file too
            self._erase_wal()

    @contextlib.contextmanager
    def bookkeeping(self, write: bool) -> Iterator[tuple[sqlite3.Connection, SQLiteDialect]]:
        """BEGIN IMMEDIATE ... COMMIT (``write``), else an autocommit read; no writer lock beyond
        SQLite's own for the moment of the transaction, which waits for an admin write at most
        BOOKKEEPING_WAIT."""
        conn = self._conn()
        try:
            if not write:
                yield conn, SQLITE
                return
            conn.execute(
                f"PRAGMA busy_timeout = {round(BOOKKEEPING_WAIT * 1000):d}"
            )  # an admin write left 30 s
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn, SQLITE
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as e:
            self._drop()
            raise _store_error(e, self.path, BOOKKEEPING_WAIT if write else None) from None

    def _games(self, where: str = "", args: tuple = ()) -> list[Game]:
        with self._held() as conn:
            return select_games(conn, where, args)

    @_mapped
    def get_game(self, game_id: int) -> Game | None:
        found = self._games("WHERE id = ?", (game_id,))
        return found[0] if found else None

    @_mapped
    def list_games(self) -> list[Game]:
        return self._games()

    @_mapped
    def get_player(self, user_id: int) -> Player | None:
        row = (
            self._conn()
            .execute(
                "SELECT user_id, username, epoch, enabled, updated_at_ms FROM players WHERE "
                "user_id = ?",
                (user_id,),
            )
            .fetchone()
        )
        return Player(row[0], row[1], row[2], bool(row[3]), row[4]) if row else None

    # -- the admin API's bearer tokens ----------------------------------------------------
    @_mapped
    def api_tokens(self) -> list[ApiToken]:
        rows = (
            self._conn()
            .execute(f"SELECT {_TOKEN_COLUMNS} FROM api_tokens ORDER BY name")
            .fetchall()
        )
        return [api_token(row) for row in rows]

    @_mapped
    def api_token_by_digest(self, token_digest: str) -> ApiToken | None:
        """Outside any transaction (an autocommit read): it never waits for a writer."""
        row = (
            self._conn()
            .execute(f"SELECT {_TOKEN_COLUMNS} FROM api_tokens WHERE digest = ?", (token_digest,))
            .fetchone()
        )
        return None if row is None else api_token(row)

    @contextlib.contextmanager
    def _read_transaction(self) -> Iterator[sqlite3.Connection]:
        """The connection inside one read transaction (one snapshot for every read in the block, a
        generator's too); an sqlite3 error leaves as the store's own (store/sqlite/errors.py)."""
        try:
            conn = self._conn()
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as e:
            self._drop()
            raise _store_error(e, self.path) from None

    # -- webhook subscriptions (store/events.py) ---------------------------------------
    @_mapped
    def webhooks(self, webhook_id: int | None = None, *, removed: bool = False) -> list[Webhook]:
        return event_tables.select_webhooks(self._conn(), SQLITE, webhook_id, removed)

    def deliveries(
        self, webhook_id: int, *, state: str | None, limit: int, after: int
    ) -> list[Delivery]:
        with self._read_transaction() as conn:  # the deliveries and their attempts
            return event_tables.select_deliveries(
                conn, SQLITE, webhook_id, state=state, limit=limit, after=after
            )

    # -- the audit trail (store/audit.py) ----------------------------------------------
    @_mapped
    def audit_records(self, **filters) -> list[Record]:
        return trail.select(self._conn(), SQLITE, **filters)

    def audit_walk(self) -> Iterator[Chain | Record]:
        """The chain row, then every record oldest first, from one snapshot."""
        with self._read_transaction() as conn:
            yield trail.read_chain(conn, SQLITE)
            yield from trail.walk(conn, SQLITE)

    # -- moving between stores --------------------------------------------------------
    @_mapped
    def game_id_high_water(self) -> int:
        conn = self._conn()
        row = conn.execute(
            "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'games'), 0), "
            "coalesce((SELECT max(id) FROM games), 0))"
        ).fetchone()
        return row[0]

    def dump(self) -> Iterator[Game | Player | DeletedPlayer]:
        with self._read_transaction() as conn:  # games and players
            yield from self._games()
            cur = conn.execute(
                "SELECT user_id, username, epoch, enabled, updated_at_ms FROM players ORDER BY "
                "user_id"
            )
            for user_id, username, epoch, enabled, updated_at_ms in cur:
                yield Player(user_id, username, epoch, bool(enabled), updated_at_ms)
            for user_id, epoch in conn.execute(
                "SELECT user_id, epoch FROM deleted_players ORDER BY user_id"
            ):
                yield DeletedPlayer(user_id, epoch)


class SQLiteTx(Tx):
    """A write transaction on SQLite: the engine's bulk writes (store/writes.py's Tx declares
    them)."""

    def import_players(
        self, rows: Iterable[tuple[int, str]], progress: Callable[[int], None] | None = None
    ) -> int:
        count = 0
        # The record's time as a literal (an int), so the rows go to executemany as they come; a row
        # whose name is already the one given is left as it is, its updated_at_ms with it.
        sql = (
            f"INSERT INTO players (user_id, username, updated_at_ms) VALUES (?, ?, {self.at_ms:d}) "
            "ON CONFLICT (user_id) DO UPDATE SET username = excluded.username, "
            "updated_at_ms = excluded.updated_at_ms WHERE players.username <> excluded.username"
        )
        conn = self.bulk_connection()
        changes: dict[int, str] = {}  # user id -> its event: created, or renamed
        for batch in batches(rows):
            names = {row[0]: row[1] for row in SQLITE.current_players(conn, [r[0] for r in batch])}
            for user_id, username in batch:
                if user_id not in names:
                    changes[user_id] = "player.created"
                elif names[user_id] != username:
                    changes.setdefault(user_id, "player.renamed")
                names[user_id] = username
            conn.executemany(sql, batch)
            count += len(batch)
            if progress:
                progress(count)
        self.continue_epochs()
        self.emit_players((user_id, event) for user_id, event in changes.items())
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
        conn = self.bulk_connection()
        self.locked()
        if conn.execute(
            "SELECT EXISTS (SELECT 1 FROM games) OR EXISTS (SELECT 1 FROM players) "
            "OR EXISTS (SELECT 1 FROM deleted_players)"
        ).fetchone()[0]:
            raise NotEmpty()
        for game in games:
            try:
                conn.execute(
                    "INSERT INTO games (id, name, enabled, created_at) VALUES (?, ?, ?, ?)",
                    (game.id, game.name, int(game.enabled), game.created_at),
                )
            except sqlite3.IntegrityError:
                raise Conflict("two games have the same id or name") from None
            for key in game.keys:
                try:
                    conn.execute(
                        "INSERT INTO api_keys (digest, game_id, created_at, expires_at) VALUES (?, "
                        "?, ?, ?)",
                        (key.digest, game.id, key.created_at, key.expires_at),
                    )
                except sqlite3.IntegrityError:
                    raise Conflict("that api key digest is already in use") from None
            n_games += 1
            top = max(top, game.id)
        # AUTOINCREMENT keeps its high-water mark here: ids are never handed out twice.
        if (
            conn.execute(
                "UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'games'", (top,)
            ).rowcount
            == 0
        ):
            conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('games', ?)", (top,))
        sql = (
            "INSERT INTO players (user_id, username, epoch, enabled, updated_at_ms) VALUES (?, "
            "?, ?, ?, ?)"
        )
        for batch in batches(players):
            alive = [p for p in batch if isinstance(p, Player)]
            try:
                conn.executemany(
                    sql,
                    [
                        (p.user_id, p.username, p.epoch, int(p.enabled), p.updated_at_ms)
                        for p in alive
                    ],
                )
                conn.executemany(
                    "INSERT INTO deleted_players (user_id, epoch) VALUES (?, ?)",
                    [(p.user_id, p.epoch) for p in batch if isinstance(p, DeletedPlayer)],
                )
            except sqlite3.IntegrityError:
                raise Conflict("a player appears twice") from None
            n_players += len(alive)
            if progress:
                progress(n_players)
        if conn.execute(
            "SELECT EXISTS (SELECT 1 FROM deleted_players AS d JOIN players AS p "
            "ON p.user_id = d.user_id)"
        ).fetchone()[0]:
            raise Conflict("a player appears both as a player and as a deleted one")
        after = {"games": n_games, "players": n_players}
        self.record("store.import", after=after)
        return n_games, n_players


class _Transaction:
    """``with store._write() as conn``: COMMIT on success, ROLLBACK on any exception."""

    def __init__(self, conn: sqlite3.Connection):
        self._conn = conn

    def __enter__(self) -> sqlite3.Connection:
        return self._conn

    def __exit__(self, exc_type, exc, tb) -> None:
        if not exc_type:
            self._conn.execute("COMMIT")
        elif self._conn.in_transaction:  # SQLITE_FULL and friends roll back by themselves
            self._conn.execute("ROLLBACK")
