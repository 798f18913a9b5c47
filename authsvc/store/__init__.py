"""Pick the store engine from the ``AUTHSVC_STORE`` URL."""

from __future__ import annotations

from authsvc.errors import ConfigError
from authsvc.settings import default
from authsvc.store.base import Store
from authsvc.urls import redact_url

__all__ = ["ledger_beside", "open_store", "redact_url"]


def ledger_beside(path: str) -> str:
    """A SQLite store's restore ledger when AUTHSVC_RESTORE_LEDGER is empty (store/ledger.py)."""
    return path + ".restore-ledger"


def open_store(url: str, *, readonly: bool, settings=None) -> Store:
    """``sqlite://PATH`` or ``postgresql://...``; the engine module is imported only when chosen."""
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        from authsvc.store.sqlite.store import SQLiteStore

        # Without settings, the declared default (authsvc/settings.py): one number, not two.
        staleness = settings.max_staleness if settings is not None else default("max_staleness")
        embedded = SQLiteStore(url, readonly=readonly, max_staleness=staleness)
        if not readonly:
            embedded.ledger = getattr(settings, "restore_ledger", "") or ledger_beside(
                embedded.path
            )
        return embedded
    if scheme in ("postgresql", "postgres"):
        try:
            from authsvc.store.postgres.store import PostgresStore
        except ImportError as e:
            raise ConfigError(f"the PostgreSQL store needs the 'postgres' extra: {e}") from None
        store = PostgresStore(url, readonly=readonly, settings=settings)
        if not readonly:
            store.ledger = getattr(settings, "restore_ledger", "") or None
        return store
    raise ConfigError("AUTHSVC_STORE must start with sqlite:// or postgresql://")
