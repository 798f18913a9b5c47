"""Restoring a SQLite backup over the store's file (docs/operations.md, section 8; store/restore.py
says what the restored copy gets). Nothing is stopped here: the live file is locked exclusively for
the whole restore, which SQLite grants only while no other process (a web worker, the admin API, the
deliverer, a command) has the file open, so a restore never runs beside a writer or a reader."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3

from authsvc.errors import ConfigError, StoreLocked
from authsvc.store import ledger as restore_ledger
from authsvc.store.audit import Audit
from authsvc.store.restore import Restored, apply
from authsvc.store.sqlite.store import SQLiteStore

__all__ = ["restore"]

_HEADER = b"SQLite format 3\x00"


def _hold(path: str) -> sqlite3.Connection | None:
    """The live store locked against every other process, or None if there is no readable store
    there. StoreLocked if another process has it open."""
    if not os.path.exists(path):
        return None
    conn = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        conn.execute("PRAGMA locking_mode = EXCLUSIVE")
        conn.execute("BEGIN EXCLUSIVE")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as e:
        conn.close()
        if "locked" in str(e) or "busy" in str(e):
            raise StoreLocked(
                f"sqlite store {path} is open in another process: stop authsvc.socket, "
                "authsvc.service, authsvc-admin.socket, authsvc-admin.service and "
                "authsvc-deliver.service first (docs/operations.md section 8)"
            ) from None
        return None  # unreadable: the ledger alone says what was deleted
    except sqlite3.DatabaseError:
        conn.close()
        return None
    return conn


def _live_facts(conn: sqlite3.Connection, into: restore_ledger.Ledger) -> None:
    """What the live store knows that the backup may not: its restore generation, its deleted
    players."""
    with contextlib.suppress(sqlite3.Error):
        into.generation = max(
            into.generation,
            conn.execute("SELECT max(generation) FROM restore_generation").fetchone()[0] or 0,
        )
    with contextlib.suppress(sqlite3.Error):
        for user_id, epoch in conn.execute("SELECT user_id, epoch FROM deleted_players"):
            into.add_deleted(user_id, epoch)


def restore(backup: str, store_path: str, ledger_path: str, audit: Audit) -> tuple[Restored, bool]:
    """Replace the store at ``store_path`` by a changed copy of ``backup``; (what changed, whether
    the live store was read). The copy is made, checked and changed beside the store, then renamed
    over it."""
    try:
        with open(backup, "rb") as f:
            if f.read(16) != _HEADER:
                raise ConfigError(f"{backup} is not a SQLite file ('authsvc backup' makes one)")
    except OSError as e:
        raise ConfigError(f"backup {backup} cannot be read: {e.strerror}") from None
    if os.path.exists(backup + "-wal"):
        raise ConfigError(f"{backup} has a -wal file beside it: not a copy 'authsvc backup' made")
    if os.path.exists(store_path) and os.path.samefile(backup, store_path):
        raise ConfigError("the backup is the store itself")
    known = restore_ledger.read(ledger_path)
    directory = os.path.dirname(os.path.abspath(store_path))
    work = os.path.join(directory, "." + os.path.basename(store_path) + ".restoring")
    held = _hold(store_path)
    try:
        if held is not None:
            _live_facts(held, known)
        for leftover in (work, work + "-wal", work + "-shm", work + "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(leftover)
        shutil.copyfile(backup, work)
        os.chmod(work, 0o600)
        copy = SQLiteStore("sqlite://" + work, readonly=False)
        try:
            if copy._conn().execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise ConfigError(f"backup {backup} is damaged (PRAGMA quick_check)")
            copy.migrate()
            with copy.write(audit) as tx:
                done = apply(tx, known.generation, known.deleted)
            copy._conn().execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.DatabaseError as e:
            raise ConfigError(f"backup {backup} cannot be restored: {e}") from None
        finally:
            copy.close()
        restore_ledger.append_generation(ledger_path, done.generation)  # before the store changes
        owner = os.stat(store_path if os.path.exists(store_path) else directory)
        if os.geteuid() == 0:
            os.chown(work, owner.st_uid, owner.st_gid)
        fd = os.open(work, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        if held is not None:
            held.close()
        for leftover in (work, work + "-wal", work + "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(leftover)
        raise
    if held is not None:
        held.close()  # the live file's last connection: nothing of it is kept
    for stale in (store_path + "-wal", store_path + "-shm", work + "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(stale)
    os.replace(work, store_path)
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return done, held is not None
