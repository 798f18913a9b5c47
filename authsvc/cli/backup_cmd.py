"""``authsvc backup`` and ``authsvc restore`` (docs/operations.md, section 8): the rules around the
store's copy.

A restore stops nothing: it refuses while any process has the store open (SQLite: an exclusive lock;
PostgreSQL: another session, or the deliverer's fresh lease) and names the units to stop. What the
restored copy gets (no token minted before it authenticates; players deleted after the backup stay
deleted; no webhook) is store/restore.py's.
"""

from __future__ import annotations

import time

from authsvc.errors import ConfigError
from authsvc.operations import stores
from authsvc.operations.context import admin_store, command_context
from authsvc.store import ledger_beside, redact_url
from authsvc.store.sqlite.url import path_from_url

__all__ = ["UNITS_TO_START", "cmd_backup", "cmd_restore"]

UNITS_TO_START = "authsvc.socket authsvc-admin.socket authsvc-deliver.service"


def _engine(url: str) -> str:
    scheme = url.split(":", 1)[0].lower()
    return "sqlite" if scheme == "sqlite" else "postgresql"


def cmd_backup(args, settings):
    if _engine(settings.store) == "sqlite":
        with admin_store(settings) as store:
            stores.backup(store, args.file)
        return (
            0,
            {"file": args.file},
            f"backed up {redact_url(settings.store)} to {args.file} (WAL mode)",
        )
    from authsvc.store.postgres.restore import backup

    backup(settings.store, args.file)
    return (
        0,
        {"file": args.file},
        f"backed up {redact_url(settings.store)} to {args.file} (pg_dump, custom format)",
    )


def cmd_restore(args, settings):
    started = time.monotonic()
    audit = command_context().audit()
    if _engine(settings.store) == "sqlite":
        from authsvc.store.sqlite.restore import restore

        path = path_from_url(settings.store)
        ledger = settings.restore_ledger or ledger_beside(path)
        done, live = restore(args.file, path, ledger, audit)
    else:
        try:
            from authsvc.store.postgres.restore import restore as pg_restore
        except ImportError as e:
            raise ConfigError(f"the PostgreSQL store needs the 'postgres' extra: {e}") from None
        ledger = settings.restore_ledger or None
        done, live = pg_restore(args.file, settings.store, ledger, audit, settings)
    seconds = time.monotonic() - started
    obj = {
        "file": args.file,
        "generation": done.generation,
        "players": done.players,
        "erased": done.erased,
        "webhooks_removed": done.webhooks,
        "live_store_read": live,
        "seconds": round(seconds, 3),
    }
    text = (
        f"restored {args.file} to {redact_url(settings.store)} in {seconds:.1f} s: restore "
        f"generation {done.generation}; every token minted before now is void ({done.players} "
        f"players: each needs a new one, re-sync them from the platform); {done.erased} players "
        f"deleted after the backup deleted again; {done.webhooks} webhooks removed (subscribe "
        "again)"
        + (
            ""
            if live
            else "; the live store could not be read: only the restore ledger said who was deleted"
        )
        + f"\nnext: systemctl start {UNITS_TO_START}"
    )
    return 0, obj, text


def add_arguments(backup_parser, restore_parser) -> None:
    backup_parser.add_argument(
        "file", help="a new file: SQLite, a copy in WAL mode; PostgreSQL, a pg_dump archive"
    )
    restore_parser.add_argument("file", help="a file 'authsvc backup' made")
