"""The demo loop's servers on real processes (docs/integrating.md), shared by the browser test and
the examples' own tests: authsvc's game-facing gunicorn and its admin API gunicorn (one SQLite
store, a game and an admin API token made with the real ``authsvc`` command), the demo platform
(examples/platform/) and the reference game server (examples/game/), each on a free loopback port.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

from harness.processes import stop
from tests.support import free_port, start_gunicorn, wait_for_port

REPO = Path(__file__).resolve().parent.parent


def authsvc(env: dict, *args: str) -> dict:
    """The real ``authsvc`` command (installed beside this interpreter), its --json answer."""
    command = shutil.which("authsvc", path=str(Path(sys.executable).parent)) or "authsvc"
    out = subprocess.run(
        [command, *args, "--json"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout)


def serve_example(module: str, log: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@contextlib.contextmanager
def demo_loop(tmp_path: Path, secret_file: Path, game_args: tuple[str, ...] = ()) -> Iterator[dict]:
    """The four servers; yields their ports and URLs, the secrets, the processes and the examples'
    databases; stops them all after. ``game_args``: more options of the game's ``serve``."""
    env = {
        "AUTHSVC_STORE": "sqlite://" + str(tmp_path / "authsvc.db"),
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
        "AUTHSVC_MAX_STALENESS": "0",
    }
    authsvc(env, "init")
    game = authsvc(env, "game", "add", "Demo Game")
    admin_token = authsvc(
        env,
        "api-token",
        "add",
        "demo-platform",
        "--scope",
        "players:write",
        "--scope",
        "tokens:mint",
    )
    (tmp_path / "api-key").write_text(game["api_key"])
    (tmp_path / "admin-token").write_text(admin_token["token"])
    ports = {name: free_port() for name in ("web", "admin", "platform", "game")}
    procs: dict[str, subprocess.Popen] = {}
    try:
        procs["web"] = start_gunicorn(
            env,
            port=ports["web"],
            workers=1,
            new_session=True,
            stdout=(tmp_path / "web.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        procs["admin"] = start_gunicorn(
            env,
            port=ports["admin"],
            app="authsvc.api.wsgi:application",
            workers=1,
            new_session=True,
            stdout=(tmp_path / "admin.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        platform_url = f"http://127.0.0.1:{ports['platform']}/"
        procs["platform"] = serve_example(
            "examples.platform",
            tmp_path / "platform.log",
            "--port",
            str(ports["platform"]),
            "--db",
            str(tmp_path / "platform.db"),
            "--admin-url",
            f"http://127.0.0.1:{ports['admin']}",
            "--admin-token-file",
            str(tmp_path / "admin-token"),
            "--game-id",
            str(game["game_id"]),
            "--game-url",
            f"http://127.0.0.1:{ports['game']}/play",
        )
        procs["game"] = serve_example(
            "examples.game",
            tmp_path / "game.log",
            "--db",
            str(tmp_path / "game.db"),
            "serve",
            "--port",
            str(ports["game"]),
            "--authsvc-url",
            f"http://127.0.0.1:{ports['web']}",
            "--api-key-file",
            str(tmp_path / "api-key"),
            "--platform-url",
            platform_url,
            *game_args,
        )
        for port in ports.values():
            wait_for_port(port, timeout=30)
        yield {
            "platform_url": platform_url,
            "procs": procs,
            "ports": ports,
            "game_id": game["game_id"],
            "admin_token": admin_token["token"],
            "secrets": [game["api_key"], admin_token["token"]],
            "game_db": tmp_path / "game.db",
            "platform_db": tmp_path / "platform.db",
        }
    finally:
        for proc in procs.values():
            stop(proc)


def admin_call(loop: dict, method: str, path: str, body: dict | None = None) -> dict:
    """One call of the loop's admin API with the platform's token (as the platform's server makes
    it)."""
    headers = {
        "Authorization": "Bearer " + loop["admin_token"],
        "Idempotency-Key": str(uuid.uuid4()),
    }
    if body is not None:
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(
        f"http://127.0.0.1:{loop['ports']['admin']}{path}",
        method=method,
        headers=headers,
        data=None if body is None else json.dumps(body).encode(),
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)
