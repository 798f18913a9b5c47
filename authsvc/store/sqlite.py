"""The embedded store: one SQLite file in WAL mode.

The web process opens it read-only (``mode=ro`` plus ``query_only``), one
connection per thread of each worker process, opened lazily after fork. The
admin command opens it read-write and is the only writer.

A reader with ``max_staleness`` > 0 keeps one read transaction (a snapshot of
the file) open and starts a new one when the current one is that many seconds
old. A query inside an open transaction skips the lock and stat system calls
that begin and end a transaction in WAL mode, and the small api-key table is
read once per snapshot into a dict, so an authentication is one primary-key
lookup of the player: together more than half of the store's cost
(BENCHMARKS.md). An answer then reflects the store as it was at most
``max_staleness`` seconds earlier (AUTHSVC_MAX_STALENESS, default 1 s, at most
1 s; docs/stores.md). With 0, every authentication is one query of its own.

A reader also notices a file replaced under it (``mv``/``rm`` and a new file at
the path): it compares the file it opened with the one the path names at each
snapshot, or before each query with 0, reopens a new file, and answers 503 while
the path is missing or the -wal/-shm beside a new file are the old one's
(docs/stores.md, "Outages").
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterable, Iterator

from authsvc.errors import ConfigError, StoreFull, StoreLocked, StoreUnavailable
from authsvc.store import base
from authsvc.store.base import ApiKey, Conflict, Credentials, Game, NotEmpty, Player, Store

log = logging.getLogger("authsvc.store")

BATCH = 10_000
MMAP_BYTES = 1 << 30  # the reader maps up to the first GiB of the file

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
]

# One row always, the player looked up whether or not the key exists (and the game
# whether or not it does: id 0 is never used): the same work for any key and player,
# so the time of an answer does not tell which exist (docs/stores.md). No key: game_id NULL.
CREDENTIALS_SQL = """
SELECT k.game_id, coalesce(g.enabled, 0), k.expires_at, p.username, coalesce(p.epoch, 0), coalesce(p.enabled, 0)
FROM (SELECT ? AS user_id, ? AS digest) AS q
LEFT JOIN players AS p ON p.user_id = q.user_id
LEFT JOIN api_keys AS k ON k.digest = q.digest
LEFT JOIN games AS g ON g.id = coalesce(k.game_id, 0)
"""
# With a snapshot: the keys once per snapshot, then the player by primary key, one row
# whether or not the player exists (a missing one: NULL, 0, 0).
KEYS_SQL = "SELECT k.digest, k.game_id, g.enabled, k.expires_at FROM api_keys AS k JOIN games AS g ON g.id = k.game_id"
PLAYER_SQL = """
SELECT p.username, coalesce(p.epoch, 0), coalesce(p.enabled, 0)
FROM (SELECT ? AS user_id) AS q LEFT JOIN players AS p ON p.user_id = q.user_id
"""
NO_KEY = (None, 0, None)  # game_id NULL, as CREDENTIALS_SQL gives for an unknown key


def _identity(path: str) -> tuple[int, int]:
    """The file ``path`` names now: (device, inode)."""
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _identities(path: str) -> tuple[tuple[int, int], tuple[int, int] | None, tuple[int, int] | None]:
    """The database file ``path`` names now, and its -wal and -shm files (None: none)."""
    wal_shm = []
    for suffix in ("-wal", "-shm"):
        try:
            wal_shm.append(_identity(path + suffix))
        except FileNotFoundError:
            wal_shm.append(None)
    return _identity(path), wal_shm[0], wal_shm[1]


def path_from_url(url: str) -> str:
    """The file named by a ``sqlite://PATH`` store URL: the one parser for the admin command and the web process.

    Everything after ``sqlite://`` is the path, taken literally (no %-decoding, no
    query string or fragment), so ``sqlite:///var/x.db`` is absolute and
    ``sqlite://var/x.db`` relative to the working directory. SQLAlchemy's
    ``sqlite:////var/x.db`` is absolute too: two or more leading slashes are one.
    Anything else raises ConfigError with one line (docs/configuration.md).
    """
    scheme, sep, path = url.partition("://")
    if scheme.lower() != "sqlite" or not sep:
        raise ConfigError(_bad_url("it does not start with sqlite://"))
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    if os.path.basename(path) in ("", ".", ".."):
        raise ConfigError(_bad_url("it names no file after sqlite://"))
    if "\0" in path:
        raise ConfigError(_bad_url("the path holds a NUL character"))
    return path


def _bad_url(reason: str) -> str:
    return (
        f"AUTHSVC_STORE is not a usable sqlite:// URL: {reason}; write sqlite:///absolute/path.db "
        "or sqlite://relative/path.db (docs/configuration.md)"
    )


def _store_error(error: sqlite3.Error, path: str) -> StoreUnavailable:
    """sqlite3's error as the store's own (store/base.py, "Errors"), in one line."""
    code = getattr(error, "sqlite_errorcode", 0) & 0xFF  # the primary result code
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return StoreLocked(
            f"sqlite store {path} stayed locked by another writer (an import?) for {base.ADMIN_LOCK_WAIT:g} s; "
            "nothing was written, try again"
        )
    if code == sqlite3.SQLITE_FULL:
        return StoreFull(f"sqlite store {path}: the disk is full; nothing was written")
    return StoreUnavailable(f"sqlite store {path} cannot be read or written: {' '.join(str(error).split())}")


def _mapped(method):
    """An admin method that raises the store's errors, never sqlite3's (IntegrityError is handled inside)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as e:
            self.close()  # reopened on the next call: the file may come back
            raise _store_error(e, self.path) from None
        except OSError as e:  # a reader's stat of a path that is gone (see _connect)
            self.close()
            raise StoreUnavailable(f"sqlite store {self.path} cannot be read: {e.strerror}") from None

    return wrapper


class SQLiteStore(Store):
    def __init__(self, url: str, *, readonly: bool, max_staleness: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        self.path = path_from_url(url)
        self.readonly = readonly
        self.max_staleness = max_staleness if readonly else 0.0
        self.clock = clock
        self._local = threading.local()
        # A forked child (a gunicorn worker) starts without connections: it must
        # neither use nor close its parent's. Cheaper than os.getpid() per query.
        store = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (s := store()) is not None and s._forget_connections())

    # -- connections --------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        if self.readonly:
            uri = "file://" + urllib.parse.quote(os.path.abspath(self.path)) + "?mode=ro"  # empty authority
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA query_only = ON")
            # Pages read straight from the OS page cache, shared by all workers, without a
            # read() per page: a 10M-player store costs 1.07x a 100k one, not 1.2x+ (BENCHMARKS.md).
            conn.execute(f"PRAGMA mmap_size = {MMAP_BYTES:d}")
        else:
            conn = sqlite3.connect(self.path, isolation_level=None)
            conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA busy_timeout = 2000")
        return conn

    def _connect(self) -> sqlite3.Connection:
        """Open the file; a reader also records which files it opened (device, inode).

        sqlite3 gives no descriptor to fstat, so the paths are stat'ed before the open and
        again after a first read, which opens the -wal and -shm files too. Equal: the
        connection and its WAL files are the files the paths name. Not equal (a file was
        swapped meanwhile): open again. A stat after the open alone could record the new
        file for a connection to the old one, and never notice.
        """
        if not self.readonly:
            return self._open()
        for _ in range(3):
            before = _identities(self.path)
            conn = self._open()
            try:
                self._version(conn)
                if _identities(self.path) == before:
                    self._local.identity = before
                    return conn
            except BaseException:
                conn.close()
                raise
            conn.close()
        raise sqlite3.OperationalError("the store file was replaced three times while it was being opened")

    def _check_file(self) -> None:
        """Drop this thread's connection if the path no longer names the file it has open.

        A file renamed or deleted stays readable through an open descriptor for ever,
        so without this a store replaced by a new file (``authsvc init`` after ``mv``
        or ``rm``) would never be read: its revocations never seen. While the path is
        missing: HTTP 503.

        SQLite pairs a database with its -wal and -shm files by name. A new file moved
        over the old one finds the old one's -wal and -shm beside it, and reading the
        pair would give the old file's pages from the -wal (a revoked player accepted):
        while either is still the old file's, HTTP 503 too. In both cases the old
        connection stays open, unused, so the old files cannot be mistaken for new ones
        (their inodes cannot be reused) and are recognised when a file comes back.
        """
        local = self._local
        opened = getattr(local, "identity", None)
        if opened is None:
            return
        try:
            if _identity(self.path) == opened[0]:
                return
            main, wal, shm = _identities(self.path)
        except FileNotFoundError:
            self._hold(local)
            raise StoreUnavailable("sqlite store file missing") from None
        if (wal is not None and wal == opened[1]) or (shm is not None and shm == opened[2]):
            self._hold(local)
            if not getattr(local, "warned", False):
                local.warned = True
                log.error(
                    "sqlite store %s was replaced, but %s-wal or -shm beside it is the old file's: "
                    "answering 503 until they are removed (docs/stores.md)", self.path, self.path,
                )
            raise StoreUnavailable("sqlite store replaced without its -wal and -shm files")
        self.close()  # the next _conn() opens the new file, with its own -wal and -shm

    @staticmethod
    def _hold(local: threading.local) -> None:
        """Keep the connection, but end its snapshot (the old file's WAL may be checkpointed)."""
        if local.conn.in_transaction:
            local.conn.execute("COMMIT")
        local.snapshot = None

    def _forget_connections(self) -> None:
        self._local = threading.local()

    def _conn(self) -> sqlite3.Connection:
        local = self._local
        if not hasattr(local, "conn"):  # first use in this thread of this process
            local.conn = self._connect()
        return local.conn

    def _new_snapshot(self) -> tuple[float, sqlite3.Connection, dict[str, tuple]]:
        """End this thread's snapshot and start another; returns (taken at, connection, keys by digest).

        The file is checked first, so no snapshot is taken of a file the path stopped
        naming before this one began: a replaced store is read within the same bound.
        """
        now = self.clock()
        self._check_file()
        conn = self._conn()
        if conn.in_transaction:
            conn.execute("COMMIT")
        conn.execute("BEGIN")  # the snapshot is taken by the next SELECT, after ``now``
        keys = {digest: (game_id, enabled, expires_at) for digest, game_id, enabled, expires_at in conn.execute(KEYS_SQL)}
        self._local.snapshot = now, conn, keys
        return self._local.snapshot

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._forget_connections()

    # -- read path ------------------------------------------------------------------
    def credentials(self, key_digest: str, user_id: int) -> Credentials | None:
        try:
            # Either path does the same work for a known or unknown key, an existing or
            # missing player: one query, one row, one Credentials built (docs/stores.md).
            if not self.max_staleness:
                self._check_file()
                found = Credentials._make(self._conn().execute(CREDENTIALS_SQL, (user_id, key_digest)).fetchone())
            else:
                snapshot = getattr(self._local, "snapshot", None)
                if snapshot is None or self.clock() - snapshot[0] >= self.max_staleness:
                    snapshot = self._new_snapshot()
                _, conn, keys = snapshot
                found = Credentials._make((*keys.get(key_digest, NO_KEY), *conn.execute(PLAYER_SQL, (user_id,)).fetchone()))
            return None if found.game_id is None else found
        except (sqlite3.Error, OSError):
            self.close()  # reopen on the next request: the file may come back
            raise StoreUnavailable("sqlite store unreadable") from None

    def check(self) -> None:
        if not os.path.exists(self.path):
            raise ConfigError(f"sqlite store {self.path} does not exist (run 'authsvc init')")
        try:
            version = self._version(self._conn())
        except (sqlite3.Error, OSError) as e:
            self.close()
            raise ConfigError(f"sqlite store {self.path} cannot be read: {e}") from None
        if version != len(MIGRATIONS):
            raise ConfigError(
                f"sqlite store {self.path} is at schema version {version}, "
                f"this release needs {len(MIGRATIONS)} (run 'authsvc init')"
            )

    @staticmethod
    def _version(conn: sqlite3.Connection) -> int:
        return conn.execute("PRAGMA user_version").fetchone()[0]

    def journal_mode_warning(self) -> str | None:
        """Why a restored copy is slow, for the start-up log: readers wait for admin writes (docs/operations.md s. 8)."""
        mode = self._conn().execute("PRAGMA journal_mode").fetchone()[0]
        return None if mode == "wal" else (f"sqlite store {self.path} is in {mode} journal mode, not WAL: admin writes "
                                           "block authentication; run 'authsvc init' (docs/operations.md section 8)")

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

    def backup(self, target: str) -> None:
        """A live-consistent copy by SQLite's backup API, in WAL mode: fast once restored (operations.md s. 8)."""
        if os.path.exists(target):
            raise ConfigError(f"backup target {target} exists; give a new file name")
        try:
            with contextlib.closing(sqlite3.connect(target, isolation_level=None)) as copy:
                self._conn().backup(copy)
                copy.execute("PRAGMA journal_mode = WAL")
        except sqlite3.Error as e:
            for leftover in (target, target + "-wal", target + "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(leftover)
            raise ConfigError(f"backup to {target} failed: {e}") from None

    @_mapped
    def add_game(self, name: str, key_digest: str, now: int) -> Game:
        with self._write() as conn:
            try:
                cur = conn.execute("INSERT INTO games (name, created_at) VALUES (?, ?)", (name, now))
            except sqlite3.IntegrityError:
                raise Conflict(f"a game named {name!r} exists") from None
            game_id = cur.lastrowid
            self._insert_key(conn, key_digest, game_id, now)
        return Game(game_id, name, True, now, (ApiKey(key_digest, now, None),))

    def _games(self, where: str = "", args: tuple = ()) -> list[Game]:
        conn = self._conn()
        games = conn.execute(f"SELECT id, name, enabled, created_at FROM games {where} ORDER BY id", args).fetchall()
        keys = conn.execute(
            "SELECT game_id, digest, created_at, expires_at FROM api_keys ORDER BY game_id, created_at, digest"
        ).fetchall()
        by_game = {gid: tuple(ApiKey(*k[1:]) for k in grp) for gid, grp in itertools.groupby(keys, lambda k: k[0])}
        return [Game(gid, name, bool(en), created, by_game.get(gid, ())) for gid, name, en, created in games]

    @_mapped
    def get_game(self, game_id: int) -> Game | None:
        found = self._games("WHERE id = ?", (game_id,))
        return found[0] if found else None

    @_mapped
    def list_games(self) -> list[Game]:
        return self._games()

    @_mapped
    def set_game_enabled(self, game_id: int, enabled: bool) -> bool:
        with self._write() as conn:
            return conn.execute("UPDATE games SET enabled = ? WHERE id = ?", (int(enabled), game_id)).rowcount == 1

    @_mapped
    def add_api_key(self, game_id: int, key_digest: str, now: int, old_keys_expire_at: int | None) -> bool:
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM games WHERE id = ?", (game_id,)).fetchone() is None:
                return False
            if old_keys_expire_at is not None:
                conn.execute(
                    "UPDATE api_keys SET expires_at = ? WHERE game_id = ? AND (expires_at IS NULL OR expires_at > ?)",
                    (old_keys_expire_at, game_id, old_keys_expire_at),
                )
            self._insert_key(conn, key_digest, game_id, now)
        return True

    @staticmethod
    def _insert_key(conn: sqlite3.Connection, digest: str, game_id: int, now: int, expires_at=None) -> None:
        try:
            conn.execute(
                "INSERT INTO api_keys (digest, game_id, created_at, expires_at) VALUES (?, ?, ?, ?)",
                (digest, game_id, now, expires_at),
            )
        except sqlite3.IntegrityError:
            raise Conflict("that api key digest is already in use") from None

    @_mapped
    def get_player(self, user_id: int) -> Player | None:
        row = self._conn().execute(
            "SELECT user_id, username, epoch, enabled FROM players WHERE user_id = ?", (user_id,)
        ).fetchone()
        return Player(row[0], row[1], row[2], bool(row[3])) if row else None

    @_mapped
    def add_player(self, user_id: int, username: str) -> Player:
        with self._write() as conn:
            try:
                conn.execute("INSERT INTO players (user_id, username) VALUES (?, ?)", (user_id, username))
            except sqlite3.IntegrityError:
                raise Conflict(f"player {user_id} exists") from None
        return Player(user_id, username, 0, True)

    @_mapped
    def rename_player(self, user_id: int, username: str) -> bool:
        with self._write() as conn:
            return conn.execute("UPDATE players SET username = ? WHERE user_id = ?", (username, user_id)).rowcount == 1

    @_mapped
    def set_player_enabled(self, user_id: int, enabled: bool) -> bool:
        with self._write() as conn:
            sql = "UPDATE players SET enabled = ? WHERE user_id = ?"
            return conn.execute(sql, (int(enabled), user_id)).rowcount == 1

    @_mapped
    def revoke_player(self, user_id: int) -> int | None:
        with self._write() as conn:
            row = conn.execute(
                "UPDATE players SET epoch = epoch + 1 WHERE user_id = ? RETURNING epoch", (user_id,)
            ).fetchone()
        return row[0] if row else None

    @_mapped
    def upsert_players(
        self, rows: Iterable[tuple[int, str]], progress: Callable[[int], None] | None = None
    ) -> int:
        sql = (
            "INSERT INTO players (user_id, username) VALUES (?, ?) "
            "ON CONFLICT (user_id) DO UPDATE SET username = excluded.username"
        )
        count = 0
        rows = iter(rows)
        with self._write() as conn:
            while batch := list(itertools.islice(rows, BATCH)):
                conn.executemany(sql, batch)
                count += len(batch)
                if progress:
                    progress(count)
        return count


    # -- moving between stores --------------------------------------------------------
    @_mapped
    def game_id_high_water(self) -> int:
        conn = self._conn()
        row = conn.execute(
            "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'games'), 0), "
            "coalesce((SELECT max(id) FROM games), 0))"
        ).fetchone()
        return row[0]

    def dump(self) -> Iterator[Game | Player]:
        try:
            conn = self._conn()
            conn.execute("BEGIN")  # one read snapshot for games and players
            try:
                yield from self._games()
                cur = conn.execute("SELECT user_id, username, epoch, enabled FROM players ORDER BY user_id")
                for user_id, username, epoch, enabled in cur:
                    yield Player(user_id, username, epoch, bool(enabled))
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as e:
            self.close()
            raise _store_error(e, self.path) from None

    @_mapped
    def load(
        self,
        games: Iterable[Game],
        players: Iterable[Player],
        game_id_high_water: int,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[int, int]:
        n_games = n_players = 0
        top = game_id_high_water
        with self._write() as conn:
            if conn.execute("SELECT EXISTS (SELECT 1 FROM games) OR EXISTS (SELECT 1 FROM players)").fetchone()[0]:
                raise NotEmpty("the store already holds games or players")
            for game in games:
                try:
                    conn.execute(
                        "INSERT INTO games (id, name, enabled, created_at) VALUES (?, ?, ?, ?)",
                        (game.id, game.name, int(game.enabled), game.created_at),
                    )
                except sqlite3.IntegrityError:
                    raise Conflict("two games have the same id or name") from None
                for key in game.keys:
                    self._insert_key(conn, key.digest, game.id, key.created_at, key.expires_at)
                n_games += 1
                top = max(top, game.id)
            # AUTOINCREMENT keeps its high-water mark here: ids are never handed out twice.
            if conn.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'games'", (top,)).rowcount == 0:
                conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('games', ?)", (top,))
            sql = "INSERT INTO players (user_id, username, epoch, enabled) VALUES (?, ?, ?, ?)"
            players = iter(players)
            while batch := list(itertools.islice(players, BATCH)):
                try:
                    conn.executemany(sql, [(p.user_id, p.username, p.epoch, int(p.enabled)) for p in batch])
                except sqlite3.IntegrityError:
                    raise Conflict("a player appears twice") from None
                n_players += len(batch)
                if progress:
                    progress(n_players)
        return n_games, n_players


class _Transaction:
    """``with store._write() as conn``: COMMIT on success, ROLLBACK on any exception."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        return self.conn

    def __exit__(self, exc_type, exc, tb) -> None:
        if not exc_type:
            self.conn.execute("COMMIT")
        elif self.conn.in_transaction:  # SQLITE_FULL and friends roll back by themselves
            self.conn.execute("ROLLBACK")
