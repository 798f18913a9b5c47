"""What both engines share: batching, the games and their keys, fork handling, URL redaction.

The SQL stays in each engine's module but for the games' two plain selects; this module
imports neither engine, so both (and the package's ``open_store``) import it without a circle.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from authsvc.errors import ConfigError
from authsvc.store.base import ApiKey, Game

T = TypeVar("T")

BATCH = 10_000  # rows per executemany / COPY chunk and per progress report


def batches(rows: Iterable[T], size: int = BATCH) -> Iterator[list[T]]:
    """``rows`` in lists of at most ``size``, read lazily: an import holds one batch in memory."""
    rows = iter(rows)
    while batch := list(itertools.islice(rows, size)):
        yield batch


def games_with_keys(games: Iterable[Sequence], keys: Iterable[Sequence]) -> list[Game]:
    """Game rows (id, name, enabled, created_at) with their key rows (game_id, digest, created_at,
    expires_at).

    ``keys`` ordered by game id (then created_at, digest), as both engines select them.
    """
    by_game = {
        gid: tuple(ApiKey(*k[1:]) for k in group)
        for gid, group in itertools.groupby(keys, lambda k: k[0])
    }
    return [
        Game(gid, name, bool(enabled), created, by_game.get(gid, ()))
        for gid, name, enabled, created in games
    ]


GAMES_SQL = "SELECT id, name, enabled, created_at FROM games {where} ORDER BY id"
KEYS_SQL = (
    "SELECT game_id, digest, created_at, expires_at FROM api_keys ORDER BY game_id, "
    "created_at, digest{collate}"
)


def select_games(conn: Any, where: str = "", args: tuple = (), collate: str = "") -> list[Game]:
    """The games (``where``: the engine's placeholders) with their keys, on an sqlite3 or psycopg
    connection; ``collate`` orders the digests as SQLite does (PostgreSQL: ' COLLATE "C"')."""
    games = conn.execute(GAMES_SQL.format(where=where), args).fetchall()
    keys = conn.execute(KEYS_SQL.format(collate=collate)).fetchall()
    return games_with_keys(games, keys)


# The token secrets' fingerprints (authsvc/tokens.py), never a secret: SQLite's migration 9,
# PostgreSQL's 10.
TOKEN_SECRETS_TABLE = """
CREATE TABLE token_secret_fingerprints (
    fingerprint TEXT PRIMARY KEY,
    added_at_ms {bigint} NOT NULL
);
"""


def select_token_secrets(conn: Any) -> dict[str, int]:
    """Each token secret's fingerprint the store knows (authsvc/tokens.py), with when it was
    recorded (unix ms), on an sqlite3 or psycopg connection."""
    return dict(
        conn.execute("SELECT fingerprint, added_at_ms FROM token_secret_fingerprints").fetchall()
    )


def check_schema(
    where: str, version: int, reads: int, readonly: bool, queries_fail: Callable[[], str | None]
) -> None:
    """The schema gate of ``check`` (docs/design.md, "Schema compatibility"): a store at ``reads``,
    the version this release reads, passes; an older one never; a newer one passes for a reader (the
    web process) as long as this release's read queries still run on it (``queries_fail``: None, or
    why not), so a compatible migration of the next release takes no host of this one out of the
    load balancer. The admin side writes only the schema it knows: a newer one is refused."""
    if version == reads:
        return
    if version < reads:
        raise ConfigError(
            f"{where} is at schema version {version}, this release needs {reads} (run 'authsvc "
            "init')"
        )
    if not readonly:
        raise ConfigError(
            f"{where} is at schema version {version}, newer than this release ({reads}): upgrade "
            "authsvc on this host (docs/operations.md, section 9)"
        )
    reason = queries_fail()
    if reason is not None:
        raise ConfigError(
            f"{where} is at schema version {version}, newer than this release ({reads}), and this "
            f"release's queries fail on it: {reason}; upgrade authsvc on this host, or roll the "
            "store back (docs/operations.md, section 9)"
        )


class ThreadConnections:
    """Base of both engines' stores: one connection per thread, none inherited across fork.

    A forked child (a gunicorn worker) starts with an empty ``_local``: it must
    neither use nor close its parent's connections, so the parent's are kept,
    untouched, in ``_inherited``. The hook runs once per fork, not per query (an
    ``os.getpid()`` per query is a system call on the hot path).
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._inherited: object = None
        store = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _after_fork(store))

    def _after_fork(self) -> None:
        self._inherited, self._local = self._local, threading.local()


def _after_fork(store: weakref.ref) -> None:
    if (s := store()) is not None:
        s._after_fork()
