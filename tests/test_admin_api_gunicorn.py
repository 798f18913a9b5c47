"""The admin API under real gunicorn (authsvc.admin.wsgi:application), beside the game-facing service
under its own gunicorn, on one store: signup, mint, authenticate, revoke, and the revocation promise
(docs/admin-api.md, "The revocation promise"): after ``effective_by`` the old token is refused.

Both listeners the docs name: a unix socket (the default) and TCP loopback. The
game-facing service runs with the default staleness bound (1 s) here, not the
suite's 0, so the promise is tested where it is not trivially kept.
"""

from __future__ import annotations

import datetime
import http.client
import json
import socket
import time
import urllib.parse

import pytest

from authsvc.admin import operations as ops
from tests.support import PATH, free_port, start_gunicorn, wait_for_port


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("localhost", timeout=10)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self.path)


def call(connect, method: str, path: str, token: str, body: dict | None = None) -> tuple[int, dict, dict]:
    conn = connect()
    headers = {"Authorization": f"Bearer {token}"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    response = conn.getresponse()
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
def test_signup_mint_authenticate_revoke_refused_after_effective_by(listener, env, admin_store, world, tmp_path):
    _, token = ops.add_api_token(admin_store, ops.Context(actor="cli:test"), "web-tier",
                                 ["players:write", "tokens:mint"])
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

    admin = start_gunicorn(env | {"AUTHSVC_MAX_STALENESS": "1"}, "--access-logfile", "-", bind=bind,
                           app="authsvc.admin.wsgi:application", workers=1)
    web = start_gunicorn(web_env, port=web_port, workers=2)
    try:
        if listener == "unix":
            wait_for_unix(sock, admin)
        else:
            wait_for_port(admin_port)
        wait_for_port(web_port)
        status, headers, player = call(connect, "PUT", "/v1/players/777", token, {"username": "newbie"})
        assert status == 201 and player["epoch"] == 0 and headers["ETag"]
        status, _, minted = call(connect, "POST", "/v1/tokens", token, {"game_id": world.game_id, "user_id": 777})
        assert status == 200
        params = {"user_id": "777", "game_auth_token": minted["game_auth_token"], "api_key": world.api_key}
        assert authenticate(web_port, params)["success"] is True
        status, _, revoked = call(connect, "POST", "/v1/players/777/revoke", token)
        assert status == 200 and revoked["epoch"] == 1
        effective_by = datetime.datetime.fromisoformat(revoked["effective_by"]).timestamp()
        while time.time() <= effective_by:  # wait for the promised moment: a bound, not a race
            time.sleep(0.05)
        for _ in range(20):  # requests that start after effective_by, across both workers
            assert authenticate(web_port, params)["success"] is False
        status, _, fresh = call(connect, "POST", "/v1/tokens", token, {"game_id": world.game_id, "user_id": 777})
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


@pytest.mark.engine("sqlite")
def test_the_admin_entry_refuses_to_start_on_a_store_that_is_not_migrated(env, tmp_path):
    proc = start_gunicorn(env | {"AUTHSVC_STORE": "sqlite://" + str(tmp_path / "none.db")},
                          port=free_port(), app="authsvc.admin.wsgi:application", workers=1, preload=True)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "authsvc-admin: error:" in err and "Traceback" not in err
