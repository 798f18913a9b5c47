"""What differs between the engines' SQL, in one object each: placeholders, flags, savepoints, bulk
writes.

The statements of a write (store/writes.py) and of the audit trail (store/audit.py) are written
once, with ``?`` placeholders, and run on either engine through its dialect. What cannot be
written once (a game's new id, a many-row upsert) is a method here. SQLite's dialect lives here;
PostgreSQL's in store/postgres/store.py, which alone imports psycopg.
"""

from __future__ import annotations

import abc
import contextlib
import json
from collections.abc import Iterator, Sequence
from typing import Any


class Dialect(abc.ABC):
    """One engine's spelling of the store's statements."""

    name = ""
    # Taken by every write before its first statement (store/writes.py): the audit chain's one row,
    # so writers run one at a time, in the order their records take along the chain.
    WRITER_LOCK = "SELECT head_id, head_hash FROM audit_chain WHERE id = 1"
    # Whether webhook ``w`` subscribed to the type of event ``e`` (its events: a JSON array of
    # types).
    SUBSCRIBED = ""
    # An event's data with its username removed (a deleted player's earlier events:
    # store/writes.py).
    DATA_WITHOUT_USERNAME = ""

    def sql(self, text: str) -> str:
        return text

    def flag(self, value: bool) -> Any:
        return value

    @abc.abstractmethod
    def savepoint(self, conn: Any) -> contextlib.AbstractContextManager[None]:
        """``with d.savepoint(conn):`` the statements inside undone if it raises."""

    @abc.abstractmethod
    def insert_game(self, conn: Any, name: str, now: int) -> int:
        """The new game's id."""

    @abc.abstractmethod
    def current_players(self, conn: Any, user_ids: Sequence[int]) -> list[tuple]:
        """(user_id, username, enabled, epoch) of those of ``user_ids`` that exist."""

    @abc.abstractmethod
    def write_players(self, conn: Any, rows: Sequence[tuple[int, str, bool]], at_ms: int) -> None:
        """Insert or overwrite (user_id, username, enabled) rows, each stamped ``at_ms``."""

    @abc.abstractmethod
    def deleted_players(self, conn: Any, user_ids: Sequence[int]) -> list[tuple]:
        """(user_id, epoch) of those of ``user_ids`` that were deleted (table deleted_players)."""

    @abc.abstractmethod
    def player_keys(self, conn: Any, user_ids: Sequence[int]) -> list[tuple]:
        """(user_id, key) of those of ``user_ids`` that have a sealing key (store/audit.py)."""

    @abc.abstractmethod
    def erase_names(self, conn: Any, record_id: int, changes: str, by_record: int) -> None:
        """Put ``changes`` (its usernames erased) into record ``record_id`` written before sealing,
        marked erased by the deletion's record ``by_record`` (store/audit.py)."""


class SQLiteDialect(Dialect):
    name = "sqlite"
    SUBSCRIBED = "EXISTS (SELECT 1 FROM json_each(w.events) AS t WHERE t.value = e.type)"
    DATA_WITHOUT_USERNAME = "json_remove(data, '$.username')"

    def flag(self, value: bool) -> int:
        return int(value)

    @contextlib.contextmanager
    def savepoint(self, conn: Any) -> Iterator[None]:
        conn.execute("SAVEPOINT part")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK TO part")
            conn.execute("RELEASE part")
            raise
        conn.execute("RELEASE part")

    def insert_game(self, conn: Any, name: str, now: int) -> int:
        return conn.execute(
            "INSERT INTO games (name, created_at) VALUES (?, ?)", (name, now)
        ).lastrowid

    def current_players(self, conn: Any, user_ids: Sequence[int]) -> list[tuple]:
        return conn.execute(
            "SELECT user_id, username, enabled, epoch FROM players WHERE user_id IN "
            "(SELECT value FROM json_each(?))",
            (json.dumps(list(user_ids)),),
        ).fetchall()

    def write_players(self, conn: Any, rows: Sequence[tuple[int, str, bool]], at_ms: int) -> None:
        conn.executemany(
            "INSERT INTO players (user_id, username, enabled, updated_at_ms) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (user_id) DO UPDATE SET username = excluded.username, enabled = "
            "excluded.enabled, updated_at_ms = excluded.updated_at_ms",
            [(user_id, username, int(enabled), at_ms) for user_id, username, enabled in rows],
        )

    def deleted_players(self, conn: Any, user_ids: Sequence[int]) -> list[tuple]:
        return conn.execute(
            "SELECT user_id, epoch FROM deleted_players WHERE user_id IN "
            "(SELECT value FROM json_each(?))",
            (json.dumps(list(user_ids)),),
        ).fetchall()

    def player_keys(self, conn: Any, user_ids: Sequence[int]) -> list[tuple]:
        return conn.execute(
            "SELECT user_id, key FROM player_keys WHERE user_id IN "
            "(SELECT value FROM json_each(?))",
            (json.dumps(list(user_ids)),),
        ).fetchall()

    def erase_names(self, conn: Any, record_id: int, changes: str, by_record: int) -> None:
        conn.execute(
            "UPDATE audit SET changes = ?, erased_by = ? WHERE id = ?",
            (changes, by_record, record_id),
        )


SQLITE = SQLiteDialect()
