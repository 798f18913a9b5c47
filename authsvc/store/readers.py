"""open_reader(url): what the web process holds, a Reader (store/base.py) that has no method that
writes.

It imports the chosen engine's reader module only (sqlite/reader.py or postgres/reader.py), never
the admin side's sqlite/store.py or postgres/store.py: the web path cannot reach a write
(tests/unit/test_layout.py).
"""

from __future__ import annotations

from authsvc.errors import ConfigError
from authsvc.settings import Settings
from authsvc.store.base import Reader


def open_reader(url: str, settings: Settings) -> Reader:
    """``sqlite://PATH`` or ``postgresql://...``, opened read-only; the engine is imported only when
    chosen."""
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        from authsvc.store.sqlite.reader import SQLiteReader

        return SQLiteReader(url, readonly=True, max_staleness=settings.max_staleness)
    if scheme in ("postgresql", "postgres"):
        try:
            from authsvc.store.postgres.reader import PostgresReader
        except ImportError as e:
            raise ConfigError(f"the PostgreSQL store needs the 'postgres' extra: {e}") from None
        return PostgresReader(url, readonly=True, settings=settings)
    raise ConfigError("AUTHSVC_STORE must start with sqlite:// or postgresql://")
