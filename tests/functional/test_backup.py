"""Backups restore into WAL mode (docs/operations.md section 8), and a store that is not
in WAL mode is named in a start-up warning: readers in rollback-journal mode wait for
every admin write, and a large import then gives 503s."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from authsvc.settings import Settings, load_token_secrets
from authsvc.store.readers import open_reader
from authsvc.web.app import make_app


def _header_journal_mode(path: Path) -> str:
    """WAL or not, read from the file header (bytes 18-19 are 2 in WAL mode) without opening
    a connection that could change it."""
    header = path.read_bytes()[:20]
    return "wal" if header[18:20] == b"\x02\x02" else "rollback"


@pytest.fixture
def env(tmp_path):
    secret = tmp_path / "token-secret"
    secret.write_text(secrets.token_hex(32) + "\n")
    secret.chmod(0o600)
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "AUTHSVC_STORE": f"sqlite://{tmp_path}/state/authsvc.db",
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret),
    }


def _authsvc(env: dict, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "authsvc.cli.command", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _restore(backup: Path, store: Path, env: dict) -> None:
    """docs/operations.md section 8's restore steps (service stopped; chown/chmod as root aside)."""
    shutil.copyfile(backup, store)
    for leftover in (Path(f"{store}-wal"), Path(f"{store}-shm")):
        leftover.unlink(missing_ok=True)
    _authsvc(env, "init")


def test_backup_and_documented_restore_give_a_wal_store(tmp_path, env):
    store = tmp_path / "state/authsvc.db"
    _authsvc(env, "init")
    _authsvc(env, "game", "add", "Chess")
    _authsvc(env, "player", "add", "42", "alice")
    backup = tmp_path / "state/backup.db"

    _authsvc(env, "backup", str(backup))

    assert _header_journal_mode(backup) == "wal"
    assert not Path(f"{backup}-wal").exists()  # the copy is whole on its own
    _authsvc(env, "player", "add", "43", "bob")  # after the backup: gone after the restore
    _restore(backup, store, env)
    assert _header_journal_mode(store) == "wal"
    assert "alice" in _authsvc(env, "player", "show", "42")
    assert "Chess" in _authsvc(env, "game", "list")
    with pytest.raises(AssertionError):
        _authsvc(env, "player", "show", "43")


def test_backup_refuses_an_existing_target(tmp_path, env):
    _authsvc(env, "init")
    target = tmp_path / "taken.db"
    target.write_bytes(b"keep me")
    done = subprocess.run(
        [sys.executable, "-m", "authsvc.cli.command", "backup", str(target)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "exists" in done.stderr
    assert target.read_bytes() == b"keep me"


def test_restore_of_a_vacuum_into_copy_ends_in_wal_mode(tmp_path, env):
    """A backup made the old way (VACUUM INTO: rollback-journal mode) is fixed by the restore's
    'authsvc init'."""
    store = tmp_path / "state/authsvc.db"
    _authsvc(env, "init")
    old = tmp_path / "old-backup.db"
    with sqlite3.connect(store) as conn:
        conn.execute("VACUUM INTO ?", (str(old),))
    conn.close()
    assert _header_journal_mode(old) == "rollback"
    _restore(old, store, env)
    assert _header_journal_mode(store) == "wal"


def _settings(env: dict) -> Settings:
    return Settings(
        store=env["AUTHSVC_STORE"],
        token_secret_file=env["AUTHSVC_TOKEN_SECRET_FILE"],
        token_secrets=load_token_secrets(env["AUTHSVC_TOKEN_SECRET_FILE"]),
    )


def test_rollback_journal_store_warns_at_start_up(tmp_path, env, caplog):
    store = tmp_path / "state/authsvc.db"
    _authsvc(env, "init")
    conn = sqlite3.connect(store)
    conn.execute("PRAGMA journal_mode = DELETE")
    conn.close()
    assert _header_journal_mode(store) == "rollback"

    with caplog.at_level(logging.WARNING, logger="authsvc"):
        make_app(_settings(env))

    warnings = [r for r in caplog.records if r.name == "authsvc" and r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
    message = warnings[0].getMessage()
    assert str(store) in message and "not WAL" in message and "authsvc init" in message


def test_the_journal_mode_advice_never_stops_a_start_when_the_store_is_locked(tmp_path, env):
    """The advice is read after the start-up check, on the same connection: a write lock taken in
    between (an admin write to a rollback-journal store) makes it unreadable for a moment. No
    advice then, rather than a database error out of make_app that fails the worker's boot."""
    store = tmp_path / "state/authsvc.db"
    _authsvc(env, "init")
    conn = sqlite3.connect(store, isolation_level=None)
    conn.execute("PRAGMA journal_mode = DELETE")
    reader = open_reader(env["AUTHSVC_STORE"], _settings(env))
    try:
        conn.execute("BEGIN EXCLUSIVE")
        conn.execute("DELETE FROM players")  # nothing there: the lock is what counts
        assert reader.journal_mode_warning() is None
        conn.execute("ROLLBACK")
        assert "is in delete journal mode, not WAL" in (reader.journal_mode_warning() or "")
    finally:
        reader.close()
        conn.close()


def test_wal_store_starts_without_a_warning(env, caplog):
    _authsvc(env, "init")
    with caplog.at_level(logging.WARNING, logger="authsvc"):
        make_app(_settings(env))
    assert not [
        r for r in caplog.records if r.name == "authsvc" and r.levelno >= logging.WARNING
    ], caplog.text
