"""The admin API under real gunicorn (authsvc.api.wsgi:application), beside the game-facing service
under its own gunicorn, on one store: signup, mint, authenticate, revoke, and the revocation promise
(docs/admin-api.md, "The revocation promise"): after ``effective_by`` the old token is refused,
also when the revoke is issued while a sync of many batches is writing.

Both listeners the docs name: a unix socket (the default) and TCP loopback. The
game-facing service runs with the default staleness bound (1 s) here, not the
suite's 0, so the promise is tested where it is not trivially kept.
"""

from __future__ import annotations

import datetime
import http.client
import json
import socket
import threading
import time
import urllib.parse

import pytest

from authsvc.operations import api_tokens
from authsvc.operations.context import Context
from tests.support import (
    INVALID,
    PATH,
    admin_request,
    free_port,
    start_gunicorn,
    store_sql,
    until_both_workers_counted,
    wait_for_port,
)


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.path)


def call(
    connect, method: str, path: str, token: str, body: dict | None = None
) -> tuple[int, dict, dict]:
    conn = connect()
    response = admin_request(conn, method, path, token, body)
    payload = json.loads(response.read())
    conn.close()
    return response.status, dict(response.getheaders()), payload


def authenticate(port: int, params: dict) -> dict:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", PATH + "?" + urllib.parse.urlencode(params))
    payload = json.loads(conn.getresponse().read())
    conn.close()
    return payload


def wait_for_unix(path: str, proc, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(path)
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {path}")


@pytest.mark.parametrize("listener", ["unix", "tcp"])
def test_signup_mint_authenticate_revoke_refused_after_effective_by(
    listener, env, admin_store, world, tmp_path
):
    _, token = api_tokens.add_api_token(
        admin_store, Context(actor="cli:test"), "web-tier", ["players:write", "tokens:mint"]
    )
    web_env = env | {"AUTHSVC_MAX_STALENESS": "1"}
    web_port = free_port()
    if listener == "unix":
        sock = str(tmp_path / "admin.sock")
        bind = "unix:" + sock

        def connect():
            return UnixConnection(sock)
    else:
        admin_port = free_port()
        bind = f"127.0.0.1:{admin_port}"

        def connect():
            return http.client.HTTPConnection("127.0.0.1", admin_port, timeout=10)

    admin = start_gunicorn(
        env | {"AUTHSVC_MAX_STALENESS": "1"},
        "--access-logfile",
        "-",
        bind=bind,
        app="authsvc.api.wsgi:application",
        workers=1,
    )
    web = start_gunicorn(web_env, port=web_port, workers=2)
    try:
        if listener == "unix":
            wait_for_unix(sock, admin)
        else:
            wait_for_port(admin_port)
        wait_for_port(web_port)
        status, headers, player = call(
            connect, "PUT", "/v1/players/777", token, {"username": "newbie"}
        )
        assert status == 201 and player["epoch"] == 0 and headers["ETag"]
        status, _, minted = call(
            connect, "POST", "/v1/tokens", token, {"game_id": world.game_id, "user_id": 777}
        )
        assert status == 200
        params = {
            "user_id": "777",
            "game_auth_token": minted["game_auth_token"],
            "api_key": world.api_key,
        }
        assert authenticate(web_port, params)["success"] is True
        status, _, revoked = call(connect, "POST", "/v1/players/777/revoke", token)
        assert status == 200 and revoked["epoch"] == 1
        effective_by = datetime.datetime.fromisoformat(revoked["effective_by"]).timestamp()
        while time.time() <= effective_by:  # wait for the promised moment: a bound, not a race
            time.sleep(0.05)
        for _ in range(20):  # requests that start after effective_by, across both workers
            assert authenticate(web_port, params)["success"] is False
        status, _, fresh = call(
            connect, "POST", "/v1/tokens", token, {"game_id": world.game_id, "user_id": 777}
        )
        assert fresh["epoch"] == 1
        params["game_auth_token"] = fresh["game_auth_token"]
        assert authenticate(web_port, params)["success"] is True
        status, headers, body = call(connect, "GET", "/v1/players/777", "asv_" + "x" * 43)
        assert status == 401 and headers["Content-Type"] == "application/problem+json"
    finally:
        for proc in (admin, web):
            proc.terminate()
        logs = [proc.communicate(timeout=30) for proc in (admin, web)]
    assert "/v1/players/777/revoke" in logs[0][0]  # the access log is on, and holds no secret:
    for out, err in logs:
        for secret in (token, minted["game_auth_token"], world.api_key):
            assert secret not in out and secret not in err


SYNC_BATCHES = 50
SYNC_FIRST_ID = 1_000_000
SYNC_PAUSE_AFTER = (
    10  # batches written before the revoke is sent: it is issued while 40 are still to come
)


def _sync(
    connect, token: str, paused: threading.Event, go: threading.Event, answers: list, failure: list
) -> None:
    """What a web tier's initial sync does: SYNC_BATCHES calls of 1,000 new players each, one after
    another. It waits once, after SYNC_PAUSE_AFTER batches, until the test says go (the revoke is
    then sent at once, with the rest of the sync still to come)."""
    try:
        for batch in range(SYNC_BATCHES):
            if batch == SYNC_PAUSE_AFTER:
                paused.set()
                assert go.wait(60), "the test never said go"
            first = SYNC_FIRST_ID + batch * 1000
            players = [{"user_id": first + i, "username": f"sync{first + i}"} for i in range(1000)]
            status, _, answer = call(
                connect, "POST", "/v1/players/batch", token, {"players": players}
            )
            answers.append((status, answer.get("counts")))
    except BaseException as e:  # re-raised by the test, not lost in the thread
        failure.append(e)
    finally:
        paused.set()


def test_a_revoke_issued_during_a_sync_takes_effect_by_effective_by(
    env, admin_store, world, store_url, tmp_path
):
    """The promise under write load: while a sync writes 50 batches of 1,000 players, a revoke still
    stops the old token by its effective_by on every game-facing worker (each of which holds a read
    snapshot of up to 1 s on SQLite), a token minted after it works, and the sync loses nothing."""
    ctx = Context(actor="cli:test")
    _, token = api_tokens.add_api_token(
        admin_store, ctx, "web-tier", ["players:write", "tokens:mint"]
    )
    _, sync_token = api_tokens.add_api_token(
        admin_store, ctx, "sync", ["players:write"]
    )  # its own rate bucket
    admin_port, web_port = free_port(), free_port()
    metrics_dir = tmp_path / "metrics"  # where each web worker counts its answers: tells them apart
    metrics_dir.mkdir()

    def connect():
        return http.client.HTTPConnection("127.0.0.1", admin_port, timeout=30)

    # Two admin workers, so the revoke is served beside a batch, not queued behind it.
    admin = start_gunicorn(
        env | {"AUTHSVC_MAX_STALENESS": "1"},
        port=admin_port,
        app="authsvc.api.wsgi:application",
        workers=2,
    )
    web = start_gunicorn(
        env | {"AUTHSVC_MAX_STALENESS": "1", "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)},
        port=web_port,
        workers=2,
    )
    paused, go, answers, failure = threading.Event(), threading.Event(), [], []
    syncer = threading.Thread(
        target=_sync, args=(connect, sync_token, paused, go, answers, failure), daemon=True
    )
    try:
        wait_for_port(admin_port)
        wait_for_port(web_port)
        status, _, _ = call(connect, "PUT", "/v1/players/777", token, {"username": "newbie"})
        assert status == 201
        status, _, minted = call(
            connect, "POST", "/v1/tokens", token, {"game_id": world.game_id, "user_id": 777}
        )
        assert status == 200 and minted["epoch"] == 0
        old = {
            "user_id": "777",
            "game_auth_token": minted["game_auth_token"],
            "api_key": world.api_key,
        }
        syncer.start()
        assert paused.wait(120) and not failure, failure
        # Both web workers accept the old token now, so each holds a snapshot from before the
        # revoke.
        until_both_workers_counted(web_port, old, metrics_dir, result="success")
        go.set()
        status, _, revoked = call(connect, "POST", "/v1/players/777/revoke", token)
        assert status == 200 and revoked["epoch"] == 1, revoked
        effective_by = datetime.datetime.fromisoformat(revoked["effective_by"]).timestamp()
        while (
            left := effective_by - time.time()
        ) >= 0:  # wait for the promised moment, by the clock
            time.sleep(min(left + 0.001, 0.05))
        # From here on every authentication starts after effective_by: the old token is refused by
        # each worker, for as long as the sync goes on (and at least until both have refused it).
        refused = until_both_workers_counted(
            web_port, old, metrics_dir, result="wrong_token", answer=INVALID
        )
        while syncer.is_alive() and refused < 2000:
            assert authenticate(web_port, old) == INVALID
            refused += 1
        status, _, fresh = call(
            connect, "POST", "/v1/tokens", token, {"game_id": world.game_id, "user_id": 777}
        )
        assert status == 200 and fresh["epoch"] == 1
        until_both_workers_counted(
            web_port,
            old | {"game_auth_token": fresh["game_auth_token"]},
            metrics_dir,
            result="success",
        )
        syncer.join(300)
        assert not syncer.is_alive(), "the sync did not finish in 5 minutes"
    finally:
        go.set()
        for proc in (admin, web):
            proc.terminate()
        for proc in (admin, web):
            proc.communicate(timeout=30)
    assert not failure, failure
    created = {"created": 1000, "updated": 0, "unchanged": 0, "error": 0}
    assert answers == [(200, created)] * SYNC_BATCHES
    assert store_sql(
        store_url, "SELECT count(*) FROM players WHERE user_id >= ?", (SYNC_FIRST_ID,)
    ) == [(50_000,)]
    assert store_sql(store_url, "SELECT epoch FROM players WHERE user_id = ?", (777,)) == [(1,)]


@pytest.mark.engine("sqlite")
def test_the_admin_entry_refuses_to_start_on_a_store_that_is_not_migrated(env, tmp_path):
    proc = start_gunicorn(
        env | {"AUTHSVC_STORE": "sqlite://" + str(tmp_path / "none.db")},
        port=free_port(),
        app="authsvc.api.wsgi:application",
        workers=1,
        preload=True,
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "authsvc-admin: error:" in err and "Traceback" not in err
