"""The token secret file against the store's fingerprints, and its rotation with no restart
(docs/tokens.md, "Rotation"; docs/operations.md, "Rotate the token secret"), on real gunicorn
processes and the real command.

- A secret file the store was never used with (a lost file replaced by `authsvc init`, a wrong copy)
is
  refused by the game-facing app, the admin API, the command and `authsvc check`, naming the file
  and its backup copy: never every token refused while `check` passes.
- `authsvc init` on a store with players and no secret file refuses and writes nothing, unless told
  `--new-secret`, which says every token is refused.
- `authsvc secret rotate` while both services run: a token the admin API mints right after it
authenticates
  on every game-facing worker at once, the tokens minted before keep working (none refused
  meanwhile) until `authsvc secret retire`, then stop.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from tests import factories
from tests.support import (
    PATH,
    admin_request,
    authentications_by_worker,
    free_port,
    get_text,
    serve_gunicorn,
    start_gunicorn,
)

USER_ID = 4242
RESTORE = "from its backup copy"  # what every refusal of a wrong or missing file tells to do


def command(env: dict, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The real `authsvc` command in a process of its own, with ``env`` only (and PATH)."""
    return subprocess.run(
        [sys.executable, "-m", "authsvc.cli.command", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PATH": os.environ["PATH"], "SUDO_USER": "alice", **env},
    )


def provisioned(env: dict) -> tuple[int, str]:
    """`authsvc init` (the secret's fingerprint recorded), a game and the player USER_ID: (game id,
    api key)."""
    assert command(env, "init").returncode == 0
    added = command(env, "game", "add", "Chess", "--json")
    assert added.returncode == 0, added.stderr
    game = json.loads(added.stdout)
    assert command(env, "player", "add", str(USER_ID), "alice").returncode == 0
    return game["game_id"], game["api_key"]


def wrong_secret(path: Path) -> None:
    """The file replaced by another secret, as `authsvc init` did for a lost file before."""
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)


def refused_at_start(env: dict, app: str, log_path: Path) -> str:
    """gunicorn (the app preloaded) on ``app``, which must exit without serving; its output."""
    with log_path.open("wb") as log:
        proc = start_gunicorn(
            env, port=free_port(), app=app, preload=True, workers=1, stdout=log, stderr=log
        )
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=20)
        raise AssertionError("it started:\n" + log_path.read_text(errors="replace")) from None
    assert proc.returncode != 0
    return log_path.read_text(errors="replace")


def authenticate(port: int, api_key: str, token: str) -> tuple[int, dict]:
    status, body = get_text(
        port,
        PATH
        + "?"
        + urllib.parse.urlencode(
            {"user_id": str(USER_ID), "game_auth_token": token, "api_key": api_key}
        ),
    )
    return status, json.loads(body)


def mint(port: int, bearer: str, game_id: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        response = admin_request(
            conn, "POST", "/v1/tokens", bearer, {"game_id": game_id, "user_id": USER_ID}
        )
        body = json.loads(response.read())
    finally:
        conn.close()
    assert response.status == 200, body
    return body["game_auth_token"]


SUCCESS = {"success": True, "user_id": USER_ID, "username": "alice"}


@pytest.mark.engine("sqlite", "postgresql")
def test_a_secret_file_the_store_never_saw_is_refused_by_app_admin_api_command_and_check(
    env, secret_file, tmp_path
):
    game_id, api_key = provisioned(env)
    wrong_secret(secret_file)
    expected = [
        f"token secret file {secret_file} holds none of the secrets this store was used with",
        f"restore {secret_file} {RESTORE}",
    ]

    issued = command(env, "token", "issue", "--game", str(game_id), "--user", str(USER_ID))
    assert issued.returncode == 1 and all(text in issued.stderr for text in expected), issued.stderr
    assert issued.stdout == ""

    key_file = tmp_path / "api-key"
    key_file.write_text(api_key + "\n")
    checked = command(
        env,
        "check",
        "--base-url",
        f"http://127.0.0.1:{free_port()}",
        "--game-id",
        str(game_id),
        "--user-id",
        str(USER_ID),
        "--api-key-file",
        str(key_file),
    )
    assert checked.returncode == 1 and all(text in checked.stderr for text in expected), (
        checked.stderr
    )
    assert "passed" not in checked.stdout

    for app in ("authsvc.wsgi:application", "authsvc.api.wsgi:application"):
        output = refused_at_start(env, app, tmp_path / f"{app.split(':')[0]}.log")
        assert all(text in output for text in expected), output
        assert secret_file.read_text().strip() not in output  # the secret itself never


@pytest.mark.engine("sqlite")
def test_init_on_a_store_with_players_and_no_secret_file_refuses_and_writes_nothing(
    env, secret_file
):
    game_id, _ = provisioned(env)
    old = secret_file.read_text()
    secret_file.unlink()

    refused = command(env, "init")
    assert refused.returncode == 1, refused.stdout
    assert f"token secret file {secret_file} is missing and the store has players" in refused.stderr
    assert f"restore it {RESTORE}" in refused.stderr and "--new-secret" in refused.stderr
    assert not secret_file.exists() and list(secret_file.parent.glob(".token-secret*")) == []

    # The hint of every other door no longer says to run `authsvc init`.
    issued = command(env, "token", "issue", "--game", str(game_id), "--user", str(USER_ID))
    assert (
        issued.returncode == 1 and RESTORE in issued.stderr and "authsvc init" not in issued.stderr
    )
    listed = command(env, "game", "list")
    assert listed.returncode == 0

    secret_file.write_text(old)  # restored from its backup: all is as before
    secret_file.chmod(0o600)
    assert command(env, "init").returncode == 0
    assert (
        command(env, "token", "issue", "--game", str(game_id), "--user", str(USER_ID)).returncode
        == 0
    )

    secret_file.unlink()
    told = command(env, "init", "--new-secret")
    assert told.returncode == 0, told.stderr
    assert "every token issued before is refused" in told.stdout
    assert (
        secret_file.exists()
        and secret_file.read_text() != old
        and secret_file.stat().st_mode & 0o777 == 0o600
    )
    assert (
        command(env, "token", "issue", "--game", str(game_id), "--user", str(USER_ID)).returncode
        == 0
    )


@pytest.mark.engine("sqlite")
def test_init_adopts_the_secret_of_a_store_from_before_fingerprints(env, secret_file, admin_store):
    factories.add_player(
        admin_store, USER_ID, "alice"
    )  # a store migrated and used without `authsvc init` recording it
    adopted = command(env, "init", "--json")
    assert adopted.returncode == 0, adopted.stderr
    assert json.loads(adopted.stdout)["token_secret"] == "adopted"
    assert json.loads(command(env, "init", "--json").stdout)["token_secret"] == "kept"
    wrong_secret(secret_file)
    again = command(env, "init")
    assert again.returncode == 1 and RESTORE in again.stderr


@pytest.mark.engine("sqlite", "postgresql")
def test_rotation_needs_no_restart_and_refuses_no_token_until_retire(env, secret_file, tmp_path):
    """Both services run with the shipped staleness bound (1 s) and two workers each; the
    game-facing workers are told apart by their metrics files."""
    game_id, api_key = provisioned(env)
    bearer = json.loads(
        command(env, "api-token", "add", "web", "--scope", "tokens:mint", "--json").stdout
    )["token"]
    run_env = env | {"AUTHSVC_MAX_STALENESS": "1", "AUTHSVC_ADMIN_RATE": "0"}
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    web_port, admin_port = free_port(), free_port()
    web = serve_gunicorn(
        run_env | {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
        port=web_port,
        log_path=tmp_path / "web.log",
        workers=2,
    )
    admin = serve_gunicorn(
        run_env,
        port=admin_port,
        log_path=tmp_path / "admin.log",
        workers=2,
        app="authsvc.api.wsgi:application",
    )
    refused: list[tuple[int, dict]] = []
    answered = [0]
    stop = threading.Event()
    try:
        before = mint(admin_port, bearer, game_id)
        assert authenticate(web_port, api_key, before) == (200, SUCCESS)

        def keep_authenticating():  # the token minted before, all through the rotation
            while not stop.is_set():
                answer = authenticate(web_port, api_key, before)
                answered[0] += 1
                if answer != (200, SUCCESS):
                    refused.append(answer)

        loop = threading.Thread(target=keep_authenticating)
        loop.start()
        rotated = command(env, "secret", "rotate")
        assert rotated.returncode == 0, rotated.stderr
        assert "authsvc secret retire" in rotated.stdout
        # Right after: whatever the admin API mints (the new secret within a second) authenticates
        # at once.
        counts = authentications_by_worker(metrics_dir)
        after, minted, deadline = before, 0, time.monotonic() + 30
        while after == before:
            assert time.monotonic() < deadline, "the admin API still mints with the old secret"
            after = mint(admin_port, bearer, game_id)
            minted += 1
            assert authenticate(web_port, api_key, after) == (200, SUCCESS)
        for _ in range(200):  # every game-facing worker, many times
            assert authenticate(web_port, api_key, after) == (200, SUCCESS)
        now = authentications_by_worker(metrics_dir)
        assert sum(now[f] > counts.get(f, 0) for f in now) == 2, now
        stop.set()
        loop.join(timeout=60)
        print(
            f"rotation: {answered[0]} authentications of the old token, {len(refused)} refused; "
            f"{minted} mints until the new secret"
        )
        assert refused == [] and answered[0] > 0

        listed = json.loads(command(env, "secret", "list", "--json").stdout)["secrets"]
        assert [(s["minted_with"], s["recorded_at"] is not None) for s in listed] == [
            (True, True),
            (False, True),
        ]

        retired = command(env, "secret", "retire")
        assert retired.returncode == 0 and "1 older secret(s) retired" in retired.stdout, (
            retired.stderr
        )
        deadline, in_a_row = time.monotonic() + 30, 0
        while (
            in_a_row < 20
        ):  # every worker has re-read the file (within AUTHSVC_MAX_STALENESS, 1 s)
            assert time.monotonic() < deadline, "the retired secret is still accepted"
            in_a_row = (
                0 if authenticate(web_port, api_key, before) == (200, SUCCESS) else in_a_row + 1
            )
        for _ in range(50):  # on every worker
            assert authenticate(web_port, api_key, before)[1]["error"] == 403
            assert authenticate(web_port, api_key, after) == (200, SUCCESS)
        assert mint(admin_port, bearer, game_id) == after
    finally:
        stop.set()
        for proc in (web, admin):
            proc.terminate()
            proc.wait(timeout=30)
    for name in ("web.log", "admin.log"):
        output = (tmp_path / name).read_text(errors="replace")
        assert "Traceback" not in output, output
        assert all(
            line.strip() not in output
            for line in secret_file.read_text().splitlines()
            if line[:1] != "#"
        )
