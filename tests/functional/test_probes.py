"""Liveness and readiness apart (docs/api.md, "Health"): /healthz never touches the store,
/readyz runs the authentication query and checks the schema version.

Under real gunicorn with a store outage: tests/store/test_store_replaced.py.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import sqlite3
import urllib.parse

import pytest
import webtest

from authsvc.store import open_store
from authsvc.store.sqlite.store import MIGRATIONS
from authsvc.web.app import SCHEMA_CHECK_INTERVAL, App
from tests.support import free_port, start_gunicorn, wait_for_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SQLITE_ONLY = pytest.mark.engine("sqlite")
OK = {"success": True, "status": "ok"}
READY = {"success": True, "status": "ready"}
UNAVAILABLE = {
    "success": False,
    "error": 503,
    "error_description": "Service temporarily unavailable, try again",
}


class CountingStore:
    """The real store, with a count of the calls the app makes to it."""

    def __init__(self, store):
        self.store, self.calls = store, []

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.store, name)


def test_healthz_never_asks_the_store(world, settings):
    store = CountingStore(open_store(settings.store, readonly=True, settings=settings))
    app = webtest.TestApp(App(settings, store), lint=True)  # type: ignore[arg-type]
    for _ in range(3):
        assert app.get("/healthz").json == OK
    assert store.calls == []
    assert app.get("/readyz").json == READY
    assert store.calls == ["credentials", "check"]
    store.store.close()


@SQLITE_ONLY
def test_readyz_fails_while_the_schema_is_not_current(world, settings):
    """A store set back to an older schema (an old backup restored) is not ready; /healthz stays
    200."""
    now = [1000.0]
    app = webtest.TestApp(
        App(
            settings,
            open_store(settings.store, readonly=True, settings=settings),
            monotonic=lambda: now[0],
        ),
        lint=True,
    )
    assert app.get("/readyz").json == READY
    path = settings.store.removeprefix("sqlite://")
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA user_version = 0")
    now[0] += SCHEMA_CHECK_INTERVAL
    for _ in range(2):  # a failed check is not remembered: every probe checks again
        res = app.get("/readyz", status=503)
        assert res.json == UNAVAILABLE and res.headers["X-Authsvc-Result"] == "503"
    assert app.get("/healthz").json == OK
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")
    assert app.get("/readyz").json == READY
    app.app.store.close()


@SQLITE_ONLY
def test_readyz_fails_while_the_store_is_missing(world, settings, tmp_path):
    app = webtest.TestApp(
        App(settings, open_store(settings.store, readonly=True, settings=settings)), lint=True
    )
    world.store.close()
    path = settings.store.removeprefix("sqlite://")
    os.rename(path, tmp_path / "moved.db")
    assert app.get("/readyz", status=503).json == UNAVAILABLE
    assert app.get("/healthz").json == OK
    os.rename(tmp_path / "moved.db", path)
    assert app.get("/readyz").json == READY
    app.app.store.close()


def _request(port: int, path: str, headers: dict | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        res = conn.getresponse()
        res.read()
        return res.status
    finally:
        conn.close()


@SQLITE_ONLY
def test_under_gunicorn_probes_stay_out_of_the_info_logs(env, world):
    """The shipped gunicorn config: 20 successful probes write no access line; an authentication
    writes its access line (stdout) and its ``auth ... reason=`` line (stderr), joined by the
    request id."""
    params = world.params(game_auth_token="0" * 64)
    port = free_port()
    proc = start_gunicorn(
        env,
        "--graceful-timeout",
        "5",
        port=port,
        config=os.path.join(REPO, "deploy", "gunicorn.conf.py"),
    )
    try:
        wait_for_port(port)
        for _ in range(10):
            assert _request(port, "/healthz") == 200
            assert _request(port, "/readyz") == 200
        query = urllib.parse.urlencode(params)
        assert (
            _request(port, f"/api/authenticate.json?{query}", {"X-Request-Id": "0123abcd"}) == 200
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert "healthz" not in out and "readyz" not in out
    assert "rid=0123abcd result=403" in out
    auth = [line for line in err.splitlines() if " auth rid=" in line]
    assert (
        len(auth) == 1
        and f"auth rid=0123abcd host=legacy game={world.game_id} user={world.user_id} "
        "reason=wrong_token ms="
        in auth[0]
    ), err
    # docs/logs.md's prefix: the time to the second and a worker's process id, not the
    # master's (the preloaded app is built in the master; authsvc/loglines.py).
    prefix = re.match(
        r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}) \[(\d+)\] \[INFO\] authsvc\.auth: auth ",
        auth[0],
    )
    assert prefix and int(prefix[2]) != proc.pid, auth[0]
    assert params["api_key"] not in out + err and params["game_auth_token"] not in out + err
