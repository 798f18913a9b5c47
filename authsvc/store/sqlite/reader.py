"""The SQLite store's read path: what the web process runs (the admin side: store/sqlite/store.py).

The web process opens the file read-only (``mode=ro`` plus ``query_only``), one
connection per thread of each worker process, opened lazily after fork.

A reader with ``max_staleness`` > 0 keeps one read transaction (a snapshot of
the file) open and starts a new one when the current one is that many seconds
old. A query inside an open transaction skips the lock and stat system calls
that begin and end a transaction in WAL mode, and the small api-key table is
read once per snapshot into a dict, so an authentication is one primary-key
lookup of the player: together more than half of the store's cost
(BENCHMARKS.md). An answer then reflects the store as it was at most
``max_staleness`` seconds earlier (AUTHSVC_MAX_STALENESS, default 1 s, at most
1 s; docs/stores.md). With 0, every authentication is one query of its own.
``fresh_credentials`` starts a new snapshot at once: asked for a token minted
after a change the snapshot predates (web/authenticate.py). An api key the
snapshot lacks is looked up again only if something was committed since the
snapshot began, which the WAL index header in the -shm file tells without a
system call (``_Snapshot.header``).
An idle worker ends its snapshot too: a thread per process ends any snapshot
older than the bound, since a checkpoint cannot pass an open read transaction
and the -wal file would grow with every admin write ("The -wal file").

A reader also notices a file replaced under it (``mv``/``rm`` and a new file at
the path): it compares the file it opened with the one the path names at each
snapshot, or before each query with 0, reopens a new file, and answers 503 while
the path is missing or the -wal/-shm beside a new file are the old one's
(docs/stores.md, "Outages").
"""

from __future__ import annotations

import contextlib
import logging
import math
import mmap
import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterator

from authsvc.errors import ConfigError, StoreUnavailable
from authsvc.store.base import Credentials, Game, Reader
from authsvc.store.common import ThreadConnections, check_schema, select_games, select_token_secrets
from authsvc.store.sqlite.url import path_from_url

log = logging.getLogger("authsvc.store")

MMAP_BYTES = 1 << 30  # the reader maps up to the first GiB of the file
SCHEMA_VERSION = (
    12  # len(sqlite.MIGRATIONS): the version this release reads (a newer one: common.check_schema)
)

# One row always, the player looked up whether or not the key exists (and the game
# whether or not it does: id 0 is never used): the same work for any key and player,
# so the time of an answer does not tell which exist (docs/stores.md). No key: game_id NULL.
# A missing player reads as a placeholder username (decoded into a str like a real one) and
# epoch 0; its ``enabled`` is NULL, which is how the reader tells it is missing.
# A key's expiry: unix seconds to the millisecond, the earlier of expires_at_ms and the whole
# seconds the previous release writes (NULL: none; docs/stores.md, "Schema and migrations").
KEY_EXPIRES_AT = "min(coalesce(k.expires_at_ms, k.expires_at * 1000), k.expires_at * 1000) / 1000.0"
CREDENTIALS_SQL = f"""
SELECT k.game_id, coalesce(g.enabled, 0), {KEY_EXPIRES_AT}, coalesce(p.username, 'no-such-player'),
       coalesce(p.epoch, 0), p.enabled
FROM (SELECT ? AS user_id, ? AS digest) AS q
LEFT JOIN players AS p ON p.user_id = q.user_id
LEFT JOIN api_keys AS k ON k.digest = q.digest
LEFT JOIN games AS g ON g.id = coalesce(k.game_id, 0)
"""
# With a snapshot: the keys once per snapshot, then the player by primary key, one row
# whether or not the player exists (a missing one: the placeholder, its epoch, NULL). A missing
# player's epoch is the one a signup would give it in the snapshot's data: a deleted id's epoch + 1
# (store/writes.py's continue_epochs), else 0, so a token minted right after the signup is one the
# authenticator looks again for (docs/stores.md, "A token minted after a change"). The
# deleted_players lookup is made for every player, existing or not: the same work.
KEYS_SQL = (
    f"SELECT k.digest, k.game_id, g.enabled, {KEY_EXPIRES_AT} "
    "FROM api_keys AS k JOIN games AS g ON g.id = k.game_id"
)
PLAYER_SQL = """
SELECT coalesce(p.username, 'no-such-player'), coalesce(p.epoch, d.epoch + 1, 0), p.enabled
FROM (SELECT ? AS user_id) AS q LEFT JOIN players AS p ON p.user_id = q.user_id
LEFT JOIN deleted_players AS d ON d.user_id = q.user_id
"""
NO_KEY = (None, 0, None)  # game_id NULL, as CREDENTIALS_SQL gives for an unknown key
# A key the snapshot lacks, looked up in a new transaction once something was committed since the
# snapshot (docs/design.md, "Freshness"): found, the snapshot is renewed.
KEY_SQL = "SELECT 1 FROM api_keys WHERE digest = ?"
# The WAL index header (https://www.sqlite.org/walformat.html): the first 48 bytes of the -shm file,
# which every commit rewrites (its change counter, last frame and checksums). SQLite itself compares
# it to tell whether its cache is still current.
WAL_INDEX_HEADER = 48


def _identity(path: str) -> tuple[int, int]:
    """The file ``path`` names now: (device, inode)."""
    st = os.stat(path)
    return st.st_dev, st.st_ino


def _identities(
    path: str,
) -> tuple[tuple[int, int], tuple[int, int] | None, tuple[int, int] | None]:
    """The database file ``path`` names now, and its -wal and -shm files (None: none)."""
    wal_shm: list[tuple[int, int] | None] = []
    for suffix in ("-wal", "-shm"):
        try:
            wal_shm.append(_identity(path + suffix))
        except FileNotFoundError:
            wal_shm.append(None)
    return _identity(path), wal_shm[0], wal_shm[1]


class _Snapshot:
    """One thread's read transaction and the api keys read in it.

    ``lock`` is held by the request that uses the snapshot (an authentication, and the
    schema check and game listing of the probes and scrapes: ``_held``) and by the reaper
    while it ends one, so a connection is never used by two threads at once.
    """

    __slots__ = ("lock", "conn", "cursor", "taken_at", "shm", "header", "keys", "__weakref__")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.lock = threading.Lock()
        self.conn = conn
        self.cursor = (
            conn.cursor()
        )  # reused by every lookup of the snapshot: no Cursor made per request
        self.taken_at = 0.0
        # The connection's -shm file mapped (b"": not in WAL mode, where a snapshot's shared lock
        # keeps any commit out until it ends), and its WAL index header just before the snapshot
        # began: equal now, nothing was committed since.
        self.shm: mmap.mmap | bytes = b""
        self.header = b""
        self.keys: dict[str, tuple] | None = None  # None: no snapshot open

    def end(self) -> None:
        if self.keys is not None and self.conn.in_transaction:
            self.conn.execute("COMMIT")
        self.keys = None


def _reap(store_ref: weakref.ref) -> None:
    """Every max_staleness seconds, end each snapshot older than that which no request is using.

    A snapshot would otherwise stay open until the worker's next request: while the
    service is idle, no checkpoint could pass it and the -wal file would grow with
    every admin write (docs/stores.md). Runs while the store exists.
    """
    while (store := store_ref()) is not None:
        period = max(store.max_staleness, 0.05)
        del store  # no reference while asleep: the store can be collected
        time.sleep(period)
        if (store := store_ref()) is None:
            return
        with store._snapshots_lock:
            snapshots = list(store._snapshots)
        for snapshot in snapshots:
            if not snapshot.lock.acquire(blocking=False):
                continue  # in use by a request, which renews it itself
            try:
                if (
                    snapshot.keys is not None
                    and store.clock() - snapshot.taken_at >= store.max_staleness
                ):
                    snapshot.end()
            except sqlite3.Error:
                snapshot.keys = None  # the request path notices a broken file itself
            finally:
                snapshot.lock.release()
        del store, snapshots


class SQLiteReader(ThreadConnections, Reader):
    """Connections, the credentials read path and the start-up check; SQLiteStore adds the admin
    side."""

    def __init__(
        self,
        url: str,
        *,
        readonly: bool,
        max_staleness: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__()
        self.path = path_from_url(url)
        self.readonly = readonly
        self.max_staleness = max_staleness if readonly else 0.0
        self.clock = clock
        self._snapshots: weakref.WeakSet[_Snapshot] = (
            weakref.WeakSet()
        )  # every thread's, for the reaper
        self._snapshots_lock = threading.Lock()
        self._reaper = False

    def _after_fork(self) -> None:
        """The child's snapshots, their locks and the registry's lock are new: the parent's
        reaper may have held one at the fork. Threads do not survive a fork: no reaper yet."""
        super()._after_fork()
        self._snapshots = weakref.WeakSet()
        self._snapshots_lock = threading.Lock()
        self._reaper = False

    # -- connections --------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        """A read-only connection (SQLiteStore opens the admin's)."""
        uri = (
            "file://" + urllib.parse.quote(os.path.abspath(self.path)) + "?mode=ro"
        )  # empty authority
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA query_only = ON")
        # Pages read straight from the OS page cache, shared by all workers, without a
        # read() per page: a 10M-player store costs 1.07x a 100k one, not 1.2x+ (BENCHMARKS.md).
        conn.execute(f"PRAGMA mmap_size = {MMAP_BYTES:d}")
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
        raise sqlite3.OperationalError(
            "the store file was replaced three times while it was being opened"
        )

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
                    "answering 503 until they are removed (docs/stores.md)",
                    self.path,
                    self.path,
                )
            raise StoreUnavailable("sqlite store replaced without its -wal and -shm files")
        self._close_conn()  # the next _conn() opens the new file, with its own -wal and -shm

    @staticmethod
    def _hold(local: threading.local) -> None:
        """Keep the connection, but end its snapshot (the old file's WAL may be checkpointed).

        Like _close_conn, called with the snapshot's lock held (or with no snapshot).
        """
        snapshot = getattr(local, "snapshot", None)
        if snapshot is not None:
            snapshot.end()
        if local.conn.in_transaction:
            local.conn.execute("COMMIT")

    def _conn(self) -> sqlite3.Connection:
        local = self._local
        if not hasattr(local, "conn"):  # first use in this thread of this process
            local.conn = self._connect()
        return local.conn

    def _snapshot(self) -> _Snapshot:
        """This thread's snapshot holder, made on first use; the first one in a process starts the
        reaper."""
        snapshot = _Snapshot(self._conn())
        with self._snapshots_lock:
            self._snapshots.add(snapshot)
            if not self._reaper:
                self._reaper = True
                threading.Thread(
                    target=_reap, args=(weakref.ref(self),), name="authsvc-snapshots", daemon=True
                ).start()
        self._local.snapshot = snapshot
        return snapshot

    def _new_snapshot(self, snapshot: _Snapshot) -> dict[str, tuple]:
        """End this thread's snapshot and start another; returns its keys (the caller holds
        ``snapshot.lock``).

        The file is checked first, so no snapshot is taken of a file the path stopped
        naming before this one began: a replaced store is read within the same bound.
        """
        now = self.clock()
        snapshot.end()
        self._check_file()
        conn = self._conn()
        if conn.in_transaction:
            conn.execute("COMMIT")
        shm = getattr(self._local, "shm", None)
        if shm is None:
            shm = self._local.shm = self._map_shm(conn)
        snapshot.shm, snapshot.header = (
            shm,
            shm[:WAL_INDEX_HEADER],
        )  # before the snapshot: a commit after is seen
        conn.execute("BEGIN")  # the snapshot is taken by the next SELECT, after ``now``
        keys = {
            digest: (game_id, enabled, expires_at)
            for digest, game_id, enabled, expires_at in conn.execute(KEYS_SQL)
        }
        if snapshot.conn is not conn:
            snapshot.conn, snapshot.cursor = conn, conn.cursor()
        snapshot.taken_at, snapshot.keys = now, keys
        return keys

    def _map_shm(self, conn: sqlite3.Connection) -> mmap.mmap | bytes:
        """The -shm file of this thread's connection, mapped read-only (b"" when the store is not in
        WAL mode).

        Called after ``_check_file``, with the connection open: the path names its file, so the -shm
        beside it is the one SQLite uses, and no connection truncates a -shm while another has it
        open.
        """
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            return b""
        with open(self.path + "-shm", "rb") as f:
            if os.fstat(f.fileno()).st_size < WAL_INDEX_HEADER:
                return b""
            return mmap.mmap(f.fileno(), WAL_INDEX_HEADER, access=mmap.ACCESS_READ)

    def _key_committed(
        self, snapshot: _Snapshot, keys: dict[str, tuple], key_digest: str
    ) -> dict[str, tuple]:
        """Something was committed since the snapshot began, and it lacks ``key_digest``: is that
        key there now?

        A new transaction, one lookup by primary key; found (a key added since), the snapshot is
        renewed. Not found, the keys stay as they were (as old as ``taken_at``, within the bound)
        and the next unknown key costs no lookup until the next commit. So unknown keys cost at most
        one lookup per commit.
        """
        conn = snapshot.conn
        conn.execute("COMMIT")
        snapshot.header = snapshot.shm[:WAL_INDEX_HEADER]
        conn.execute("BEGIN")
        if snapshot.cursor.execute(KEY_SQL, (key_digest,)).fetchone() is None:
            return keys
        return self._new_snapshot(snapshot)

    def close(self) -> None:
        self._drop()

    def _drop(self) -> None:
        """Close this thread's connection (reopened on next use), never while the reaper uses it."""
        snapshot = getattr(self._local, "snapshot", None)
        if snapshot is None:
            self._close_conn()
        else:
            with snapshot.lock:
                self._close_conn()

    def _close_conn(self) -> None:
        local = self._local
        snapshot = getattr(local, "snapshot", None)
        if snapshot is not None:
            snapshot.keys = None  # its connection is closed here: no snapshot open
        conn = getattr(local, "conn", None)
        if conn is not None:
            conn.close()
        shm = getattr(local, "shm", None)
        if isinstance(shm, mmap.mmap):
            shm.close()
        local.__dict__.clear()
        if snapshot is not None:
            local.snapshot = snapshot  # the reaper knows it: the next request fills it again

    # -- read path ------------------------------------------------------------------
    def credentials(self, key_digest: str, user_id: int) -> Credentials | None:
        try:
            # Either path does the same work for a known or unknown key, an existing or
            # missing player: one query, one row, a username decoded, one Credentials built
            # (docs/stores.md).
            if not self.max_staleness:
                self._check_file()
                row = self._conn().execute(CREDENTIALS_SQL, (user_id, key_digest)).fetchone()
            else:
                snapshot = getattr(self._local, "snapshot", None) or self._snapshot()
                with snapshot.lock:  # the reaper ends a snapshot only between two requests
                    keys, now = snapshot.keys, self.clock()
                    if keys is None or now - snapshot.taken_at >= self.max_staleness:
                        keys = self._new_snapshot(snapshot)
                    elif (
                        key_digest not in keys
                        and snapshot.shm[:WAL_INDEX_HEADER] != snapshot.header
                    ):
                        # A key added since the snapshot (a rotation, a new game) works at once. No
                        # call before this branch (a slice, a comparison), so a known key does the
                        # same calls (tests/functional/test_equal_work.py); a lookup only after a
                        # commit.
                        keys = self._key_committed(snapshot, keys, key_digest)
                    player = snapshot.cursor.execute(PLAYER_SQL, (user_id,)).fetchone()
                row = (*keys.get(key_digest, NO_KEY), *player)
            # The contract's username None for a missing player, picked by indexing, not by a
            # branch.
            game_id, game_enabled, expires_at, username, epoch, enabled = row
            found = Credentials._make(
                (
                    game_id,
                    game_enabled,
                    expires_at,
                    (None, username)[enabled is not None],
                    epoch,
                    enabled == 1,
                )
            )
            return None if game_id is None else found
        except (sqlite3.Error, OSError):
            self._drop()  # reopen on the next request: the file may come back
            raise StoreUnavailable("sqlite store unreadable") from None

    def fresh_credentials(self, key_digest: str, user_id: int) -> Credentials | None:
        snapshot = getattr(
            self._local, "snapshot", None
        )  # None: no snapshot (or none yet), a read of the latest
        if snapshot is not None:
            snapshot.taken_at = (
                -math.inf
            )  # too old: credentials() starts a new one under its lock (the reaper may first)
        return self.credentials(key_digest, user_id)

    @contextlib.contextmanager
    def _held(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, for a read other than an authentication (the schema check of
        /readyz, the games of /metrics): with this thread's snapshot lock held, as an authentication
        holds it, so the reaper never ends the snapshot (a COMMIT) on it meanwhile."""
        snapshot = getattr(self._local, "snapshot", None)
        if snapshot is None:  # no snapshot: the reaper does not know this connection
            yield self._conn()
            return
        with snapshot.lock:
            yield self._conn()

    def list_games(self) -> list[Game]:
        try:
            with self._held() as conn:  # /metrics reads them on a request thread's connection
                return select_games(conn)
        except (sqlite3.Error, OSError):
            self._drop()
            raise StoreUnavailable("sqlite store unreadable") from None

    def token_secrets(self) -> dict[str, int]:
        try:
            with self._held() as conn:
                return select_token_secrets(conn)
        except (sqlite3.Error, OSError):
            self._drop()
            raise StoreUnavailable("sqlite store unreadable") from None

    def check(self) -> None:
        if not os.path.exists(self.path):
            raise ConfigError(f"sqlite store {self.path} does not exist (run 'authsvc init')")
        try:
            with self._held() as conn:
                version = self._version(conn)
                check_schema(
                    f"sqlite store {self.path}",
                    version,
                    SCHEMA_VERSION,
                    self.readonly,
                    lambda: self._queries_fail(conn),
                )
        except (sqlite3.Error, OSError) as e:
            self._drop()
            raise ConfigError(f"sqlite store {self.path} cannot be read: {e}") from None

    @staticmethod
    def _queries_fail(conn: sqlite3.Connection) -> str | None:
        """Why this release's read queries fail on a newer schema, or None: each one run once."""
        try:
            conn.execute(CREDENTIALS_SQL, (0, "")).fetchall()
            conn.execute(KEYS_SQL).fetchall()
            conn.execute(KEY_SQL, ("",)).fetchall()
            conn.execute(PLAYER_SQL, (0,)).fetchall()
            select_games(conn)
            select_token_secrets(conn)
        except sqlite3.OperationalError as e:
            return str(e)
        return None

    @staticmethod
    def _version(conn: sqlite3.Connection) -> int:
        return conn.execute("PRAGMA user_version").fetchone()[0]

    def journal_mode_warning(self) -> str | None:
        """Why a restored copy is slow, for the start-up log: readers wait for admin writes
        (docs/operations.md s. 8). None also when the file cannot be read this moment (an admin
        write's lock taken after the start-up check): advice, never a reason not to start."""
        try:
            mode = self._conn().execute("PRAGMA journal_mode").fetchone()[0]
        except (sqlite3.Error, OSError):
            self._drop()  # as after a failed read: the next one opens the file again
            return None
        return (
            None
            if mode == "wal"
            else (
                f"sqlite store {self.path} is in {mode} journal mode, not WAL: admin writes "
                "block authentication; run 'authsvc init' (docs/operations.md section 8)"
            )
        )
