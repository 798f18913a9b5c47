"""A restore revives nothing (docs/operations.md section 8), on both engines, with real processes:
back up; revoke A, disable B, delete C, each holding a token minted before; restore; a
gunicorn-served app then refuses all three old tokens, C's name is nowhere in the store, `authsvc
audit verify` passes, and a token minted after the restore authenticates. And a restore refuses
while a process has the store open."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pgserver import ThrowawayPostgres, find_bin_dir
from tests.support import apply_roles, free_port, get, serve_gunicorn, skip_or_fail

NAME_C = "carol-x7q2-erased"


def _authsvc(env: dict, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "authsvc.cli.command", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def _json(env: dict, *args: str) -> dict:
    return json.loads(_authsvc(env, *args, "--json").stdout)


def _token(env: dict, game: int, user: int) -> str:
    return _json(env, "token", "issue", "--game", str(game), "--user", str(user))["game_auth_token"]


def _result(port: int, api_key: str, user: int, token: str) -> dict:
    response = get(port, {"user_id": str(user), "game_auth_token": token, "api_key": api_key})
    return json.loads(response.body)


def _world(env: dict) -> tuple[int, str, dict[int, str]]:
    """A game and players A (1), B (2), C (3), each with a token minted now."""
    _authsvc(env, "init")
    game = _json(env, "game", "add", "Chess")
    for user, name in ((1, "anna"), (2, "bert"), (3, NAME_C)):
        _authsvc(env, "player", "add", str(user), name)
    return (
        game["game_id"],
        game["api_key"],
        {user: _token(env, game["game_id"], user) for user in (1, 2, 3)},
    )


def _after_backup(env: dict) -> None:
    _authsvc(env, "player", "revoke", "1")
    _authsvc(env, "player", "disable", "2")
    _authsvc(env, "player", "delete", "3")


def _check_nothing_revived(
    env: dict, tmp_path: Path, game: int, api_key: str, old: dict[int, str]
) -> None:
    port = free_port()
    proc = serve_gunicorn(env, port=port, log_path=tmp_path / "gunicorn.log")
    try:
        for user, token in old.items():
            assert _result(port, api_key, user, token) != {"result": "ok"} and "error" in _result(
                port, api_key, user, token
            ), f"player {user}'s token from before the restore authenticated"
        fresh = _token(env, game, 1)
        deadline = time.monotonic() + 30
        while (answer := _result(port, api_key, 1, fresh)).get(
            "error"
        ) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "error" not in answer, answer
        assert _authsvc(env, "player", "show", "3", ok=False).returncode == 1
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    _authsvc(env, "audit", "verify")


@pytest.fixture
def sqlite_env(tmp_path, secret_file):
    (tmp_path / "state").mkdir()
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "AUTHSVC_STORE": f"sqlite://{tmp_path}/state/authsvc.db",
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
    }


def test_sqlite_restore_revives_no_token_and_no_deleted_player(tmp_path, sqlite_env):
    env = sqlite_env
    game, api_key, old = _world(env)
    backup = tmp_path / "backup.db"
    _authsvc(env, "backup", str(backup))
    _after_backup(env)

    started = time.monotonic()
    _authsvc(env, "restore", str(backup))
    print(f"restore: {time.monotonic() - started:.2f} s")

    _check_nothing_revived(env, tmp_path, game, api_key, old)
    for path in (tmp_path / "state").iterdir():
        assert NAME_C.encode() not in path.read_bytes(), (
            f"{path.name} holds the deleted player's name"
        )
    assert (
        _json(env, "player", "show", "2")["enabled"] is True
    )  # disabled after the backup: the platform re-syncs


def test_sqlite_restore_refuses_while_the_store_is_open(tmp_path, sqlite_env):
    env = sqlite_env
    _world(env)
    backup = tmp_path / "backup.db"
    _authsvc(env, "backup", str(backup))
    port = free_port()
    proc = serve_gunicorn(env, port=port, log_path=tmp_path / "gunicorn.log")
    try:
        get(
            port, {"user_id": "1", "game_auth_token": "x", "api_key": "y"}
        )  # a worker opens the store
        done = _authsvc(env, "restore", str(backup), ok=False)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert done.returncode == 1
    assert "is open in another process: stop authsvc.socket" in done.stderr


@pytest.fixture
def pg_env(pg_server_url, secret_file, tmp_path):
    bin_dir = find_bin_dir()
    if bin_dir is None:
        skip_or_fail("this test needs the PostgreSQL server binaries to run a server of its own")
    server = ThrowawayPostgres(bin_dir)
    try:
        server.start()
        role_url = apply_roles(server)
        yield (
            server,
            role_url,
            {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "AUTHSVC_STORE": role_url("authsvc_owner"),
                "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
                "AUTHSVC_RESTORE_LEDGER": str(tmp_path / "ledger"),
            },
        )
    finally:
        server.destroy()


def test_postgres_restore_revives_no_token_and_no_deleted_player(tmp_path, pg_env):
    server, role_url, owner = pg_env
    admin = owner | {"AUTHSVC_STORE": role_url("authsvc_admin")}
    web = owner | {"AUTHSVC_STORE": role_url("authsvc_web")}
    game, api_key, old = _world(owner)
    backup = tmp_path / "backup.dump"
    _authsvc(owner, "backup", str(backup))
    _after_backup(admin)

    started = time.monotonic()
    done = _authsvc(owner, "restore", str(backup))
    print(f"restore: {time.monotonic() - started:.2f} s")
    assert "error" not in done.stderr.lower(), done.stderr

    # Web as the web role, the commands as the admin role (docs/stores.md, "PostgreSQL roles").
    port = free_port()
    proc = serve_gunicorn(web, port=port, log_path=tmp_path / "gunicorn.log")
    try:
        for user, token in old.items():
            assert "error" in _result(port, api_key, user, token), (
                f"player {user}'s old token authenticated"
            )
        fresh = _token(admin, game, 1)
        assert "error" not in _result(port, api_key, 1, fresh)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert _authsvc(admin, "player", "show", "3", ok=False).returncode == 1
    _authsvc(owner, "audit", "verify")
    dump = subprocess.run(
        ["pg_dump", "--data-only", role_url("authsvc_owner")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert NAME_C not in dump
    assert _json(admin, "player", "show", "1")["username"] == "anna"
