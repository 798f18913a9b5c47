"""The stock schemathesis command, run as a developer runs it from the repository root, against both
services on loopback (docs/api.md and docs/admin-api.md, "The OpenAPI document"):

    schemathesis run http://127.0.0.1:PORT/openapi.json [-H "Authorization: Bearer <admin token>"]

It reads the shipped schemathesis.toml, which names the answers the documents describe that a check
judging by the status alone would take for failures, each with its reason; every default check runs,
none is left out on the command line, and the run must be green. tests/functional/test_openapi.py
and tests/integration/test_admin_openapi.py test the documents further (the http error mode, real
ids, the links), each in its own way.

Bounded: a fixed seed, at most EXAMPLES cases per operation in each phase, no example database (the
same cases each run, none carried over from an earlier one), each run under RUN_TIMEOUT seconds.
schemathesis's own cache of what earlier runs found (.schemathesis/, not tracked) is read as it
would be for the developer: a case it replays must pass too.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from authsvc.operations import api_tokens
from authsvc.operations.context import Context
from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.tokens import api_key_digest, new_api_key
from tests import factories
from tests.support import free_port, serve_gunicorn

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCHEMATHESIS = Path(sys.executable).with_name(
    "schemathesis"
)  # the venv's console script, as a developer runs it
EXAMPLES = 15
SEED = 1
RUN_TIMEOUT = 300
ALL_SCOPES = [
    "players:read",
    "players:write",
    "tokens:mint",
    "games:read",
    "games:write",
    "audit:read",
    "webhooks:read",
    "webhooks:write",
]


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """{"game-facing": its base URL, "admin": its base URL, "token": an admin token with every
    scope}: both services under gunicorn on 127.0.0.1 (the game-facing one with the shipped config,
    in its default error mode), on one SQLite store holding a game and a player."""
    root = tmp_path_factory.mktemp("schemathesis-run")
    secret = root / "token-secret"
    secret.write_text(os.urandom(32).hex() + "\n")
    secret.chmod(0o600)
    # The admin API's rate limit off: one caller sending as fast as it can would get a run of 429s
    # (in the document, and accepted by the checks) and leave the resources untried.
    env = {
        "AUTHSVC_STORE": "sqlite://" + str(root / "authsvc.db"),
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret),
        "AUTHSVC_ADMIN_RATE": "0",
    }
    settings = Settings.from_env(env)
    store = open_store(settings.store, readonly=False, settings=settings)
    store.migrate()
    factories.add_game(store, "Chess", api_key_digest(new_api_key()), int(time.time()))
    factories.add_player(store, 1001, "demo_player")
    _, token = api_tokens.add_api_token(
        store, Context(actor="cli:test"), "schemathesis", ALL_SCOPES, None
    )
    store.close()
    game_port, admin_port = free_port(), free_port()
    servers = [
        serve_gunicorn(
            env,
            "--graceful-timeout",
            "5",
            port=game_port,
            log_path=root / "game.log",
            config=REPO / "deploy" / "gunicorn.conf.py",
        ),
        serve_gunicorn(
            env,
            "--graceful-timeout",
            "5",
            port=admin_port,
            log_path=root / "admin.log",
            app="authsvc.api.wsgi:application",
            workers=2,
        ),
    ]
    yield {
        "game-facing": f"http://127.0.0.1:{game_port}",
        "admin": f"http://127.0.0.1:{admin_port}",
        "token": token,
    }
    for server in servers:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=20)
    for log in ("game.log", "admin.log"):
        assert "Traceback" not in (root / log).read_text(errors="replace"), (
            log
        )  # no request made an app fail


@pytest.mark.parametrize("service", ["game-facing", "admin"])
def test_the_stock_schemathesis_run_passes_with_the_shipped_configuration(services, service):
    assert (REPO / "schemathesis.toml").is_file()
    command = [
        str(SCHEMATHESIS),
        "run",
        f"{services[service]}/openapi.json",
        "--max-examples",
        str(EXAMPLES),
        "--seed",
        str(SEED),
        "--generation-database",
        "none",
    ]
    if service == "admin":
        command += ["-H", f"Authorization: Bearer {services['token']}"]
    env = {
        name: value for name, value in os.environ.items() if not name.startswith("SCHEMATHESIS_")
    }
    done = subprocess.run(
        command,
        cwd=REPO,
        env={**env, "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert (
        f"Configuration:    {REPO / 'schemathesis.toml'}" in output
    )  # the shipped one, found from the root
    assert (
        "Loaded specification from" in output and "Test cases:" in output
    )  # it ran, and read the document
    assert services["token"] not in output
