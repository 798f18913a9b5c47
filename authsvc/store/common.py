"""What both engines share: batching, grouping keys into games, fork handling, URL redaction.

The SQL stays in each engine's module; this module imports neither engine, so
both (and the package's ``open_store``) import it without a circle.
"""

from __future__ import annotations

import itertools
import os
import threading
import urllib.parse
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

from authsvc.store.base import ApiKey, Game

T = TypeVar("T")

BATCH = 10_000  # rows per executemany / COPY chunk and per progress report


def batches(rows: Iterable[T], size: int = BATCH) -> Iterator[list[T]]:
    """``rows`` in lists of at most ``size``, read lazily: an import holds one batch in memory."""
    rows = iter(rows)
    while batch := list(itertools.islice(rows, size)):
        yield batch


def games_with_keys(games: Iterable[Sequence], keys: Iterable[Sequence]) -> list[Game]:
    """Game rows (id, name, enabled, created_at) with their key rows (game_id, digest, created_at, expires_at).

    ``keys`` ordered by game id (then created_at, digest), as both engines select them.
    """
    by_game = {gid: tuple(ApiKey(*k[1:]) for k in group) for gid, group in itertools.groupby(keys, lambda k: k[0])}
    return [Game(gid, name, bool(enabled), created, by_game.get(gid, ())) for gid, name, enabled, created in games]


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


def redact_url(url: str) -> str:
    """The store URL with any password (``user:PASSWORD@`` or ``?password=``) masked, for messages."""
    parts = urllib.parse.urlsplit(url)
    netloc, query = parts.netloc, parts.query
    if parts.password is not None:
        userinfo, _, hostport = netloc.rpartition("@")
        netloc = userinfo.split(":", 1)[0] + ":***@" + hostport
    if "password" in query.lower():
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
        query = "&".join(
            f"{name}=***" if name.lower() == "password" else urllib.parse.urlencode({name: value})
            for name, value in pairs
        )
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))
