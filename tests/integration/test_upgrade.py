"""Upgrades without a flap (docs/operations.md, "Upgrades"; docs/design.md, "Schema compatibility").

During a rolling upgrade the new release migrates the store while the previous release still
serves. This release plays the previous one: real gunicorn serves a store that a "next release"
then migrates one step further, compatibly (a column and a table added): /readyz stays 200 over
many schema checks (every 0.2 s here, tests/schema_check_app.py, instead of once a minute) and
the answers stay right. A migration that takes away what this release reads (a renamed column)
fails readiness, and start-up, with the reason. On both engines.
"""

from __future__ import annotations

import http.client
import os
import time
import urllib.parse

import pytest

from authsvc.errors import ConfigError
from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.tokens import api_key_digest, mint_token, new_api_key
from authsvc.web.app import make_app
from harness.processes import stop
from tests import factories
from tests.support import free_port, serve_gunicorn, store_sql

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INTERVAL = 0.2  # seconds between two schema checks of a worker (AUTHSVC_TEST_SCHEMA_CHECK_INTERVAL)


@pytest.fixture
def own_store(store_url, request):
    """A store of this test's own: a new SQLite file, or a new PostgreSQL database (the session's is
    shared, and this test changes its schema)."""
    if store_url.startswith("sqlite://"):
        return store_url
    return request.getfixturevalue("pg_databases").create(migrate=False)


def _version(url: str) -> int:
    if url.startswith("sqlite://"):
        return store_sql(url, "PRAGMA user_version")[0][0]
    return store_sql(url, "SELECT max(version) FROM authsvc_schema")[0][0]


def next_release(url: str, statements: list[str]) -> int:
    """What a later release's `authsvc init` does: its migration, then the schema version one
    higher."""
    version = _version(url) + 1
    for statement in statements:
        store_sql(url, statement)
    if url.startswith("sqlite://"):
        store_sql(url, f"PRAGMA user_version = {version:d}")
    else:
        store_sql(url, f"UPDATE authsvc_schema SET version = {version:d}")
    return version


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        res = conn.getresponse()
        return res.status, res.read()
    finally:
        conn.close()


def test_the_previous_release_stays_ready_on_a_compatibly_migrated_store(
    own_store, secret_file, tmp_path
):
    env = {
        "AUTHSVC_STORE": own_store,
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
        "AUTHSVC_MAX_STALENESS": "0",
    }
    settings = Settings.from_env(env)
    admin = open_store(own_store, readonly=False, settings=settings)
    try:
        admin.migrate()
        api_key = new_api_key()
        game = factories.add_game(admin, "Chess", api_key_digest(api_key), int(time.time()))
        factories.add_player(admin, 4242, "alice")
    finally:
        admin.close()
    token = mint_token(settings.token_secrets[0], game.id, 4242, 0)
    good = "/api/authenticate.json?" + urllib.parse.urlencode(
        {"user_id": "4242", "game_auth_token": token, "api_key": api_key}
    )
    bad = good.replace(token, token[:-1] + ("0" if token[-1] != "0" else "1"))
    port = free_port()
    log_path = tmp_path / "gunicorn.log"
    proc = serve_gunicorn(
        {**env, "PYTHONPATH": REPO, "AUTHSVC_TEST_SCHEMA_CHECK_INTERVAL": str(INTERVAL)},
        port=port,
        log_path=log_path,
        app="tests.schema_check_app:application",
        workers=2,
    )
    try:
        assert _get(port, "/readyz") == (200, b'{"success":true,"status":"ready"}')

        next_release(
            own_store,
            [
                "ALTER TABLE players ADD COLUMN nickname text",
                "CREATE TABLE next_release_notes (id integer PRIMARY KEY, note text)",
            ],
        )
        probes = not_ready = 0
        started = time.monotonic()
        # Many schema checks of both workers: at least 15 intervals and 60 probes, bounded in count.
        while probes < 400 and (probes < 60 or time.monotonic() - started < 15 * INTERVAL):
            status, _ = _get(port, "/readyz")
            probes += 1
            not_ready += status != 200
            assert _get(port, good) == (200, b'{"success":true,"user_id":4242,"username":"alice"}')
            status, body = _get(port, bad)
            assert (status, body) == (
                200,
                b'{"success":false,"error":403,"error_description":"Invalid credentials"}',
            )
            time.sleep(INTERVAL / 4)
        assert not_ready == 0, (
            f"{not_ready} of {probes} probes answered 503 on a compatible newer store"
        )
        # A process of this release starts on it too (a host restarted during the rolling upgrade).
        make_app(settings).store.close()
        # The admin side of this release does not write a newer store: it says to upgrade this host.
        admin = open_store(own_store, readonly=False, settings=settings)
        try:
            with pytest.raises(ConfigError, match="newer than this release"):
                admin.check()
        finally:
            admin.close()

        # A later migration this release cannot serve: a column it reads (for /metrics) is gone. The
        # authentications still run, but readiness fails, and the log says why.
        newer = next_release(own_store, ["ALTER TABLE games RENAME COLUMN created_at TO added_at"])
        deadline = time.monotonic() + 30
        while _get(port, "/readyz")[0] != 503:
            assert time.monotonic() < deadline, (
                "/readyz stayed 200 on a store this release cannot read"
            )
            time.sleep(INTERVAL / 2)
        # Another that takes away what the authentication reads: no process of this release starts
        # on it.
        newest = next_release(own_store, ["ALTER TABLE players RENAME COLUMN epoch TO generation"])
        with pytest.raises(ConfigError) as refused:
            make_app(settings)
        reason = str(refused.value)
        assert (
            f"is at schema version {newest}, newer than this release" in reason
            and "epoch" in reason
        ), reason
    finally:
        stop(proc)
    log = log_path.read_text(errors="replace")
    assert f"not ready: {own_store.partition('://')[0]}" in log and "created_at" in log, log[-3000:]
    assert f"is at schema version {newer}, newer than this release" in log, log[-3000:]
