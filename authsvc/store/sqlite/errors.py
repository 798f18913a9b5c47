"""sqlite3's errors as the store's own (store/base.py, "Errors"): one place for SQLiteStore and the
admin API's tables (store/api_tables.py)."""

from __future__ import annotations

import sqlite3

from authsvc.errors import StoreFull, StoreLocked, StoreUnavailable
from authsvc.store import base


def store_error(error: sqlite3.Error, path: str, waited: float | None = None) -> StoreUnavailable:
    """sqlite3's error as the store's own (store/base.py, "Errors"), in one line. A busy store: how
    long the write waited (``waited``, else ADMIN_LOCK_WAIT), never a guess at who held the lock
    (SQLite does not tell)."""
    code = getattr(error, "sqlite_errorcode", 0) & 0xFF  # the primary result code
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return StoreLocked(
            f"sqlite store {path}: another connection held the store's write lock for "
            f"{base.ADMIN_LOCK_WAIT if waited is None else waited:g} s, the longest this write "
            "waits; nothing was written, try again"
        )
    if code == sqlite3.SQLITE_FULL:
        return StoreFull(f"sqlite store {path}: the disk is full; nothing was written")
    return StoreUnavailable(
        f"sqlite store {path} cannot be read or written: {' '.join(str(error).split())}"
    )
