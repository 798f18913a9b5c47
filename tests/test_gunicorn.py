"""The app under a real gunicorn, over real HTTP on loopback."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.parse

import pytest

from tests.support import free_port, wait_for_port

PATH = "/api/authenticate.json"
SUCCESS = b'{"success":true,"user_id":4242,"username":"alice"}'


def start_gunicorn(env: dict, port: int, *args: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "gunicorn", "--bind", f"127.0.0.1:{port}", "--workers", "2",
               "--no-control-socket", *args, "authsvc.wsgi:application"]
    return subprocess.Popen(command, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.fixture
def server(env, world):
    port = free_port()
    proc = start_gunicorn(env, port)
    try:
        wait_for_port(port)
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        params = world.params()
        assert params["api_key"] not in err and params["game_auth_token"] not in err


def get(port: int, params: dict, method: str = "GET") -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, PATH + "?" + urllib.parse.urlencode(params))
    response = conn.getresponse()
    response.body = response.read()
    conn.close()
    return response


def test_success_403_and_400_over_http(server, world):
    r = get(server, world.params())
    assert r.status == 200 and json.loads(r.body) == {"success": True, "user_id": 4242, "username": "alice"}
    assert r.getheader("Content-Type") == "application/json; charset=utf-8"
    assert r.getheader("Content-Length") == str(len(r.body))
    r = get(server, world.params(api_key="wrong"))
    assert r.status == 200 and json.loads(r.body)["error"] == 403
    r = get(server, world.params(user_id=None))
    assert r.status == 200 and json.loads(r.body)["error"] == 400
    r = get(server, world.params(), method="HEAD")
    assert r.status == 200 and r.body == b"" and r.getheader("Content-Length") == str(len(SUCCESS))


def test_http_1_0_client_gets_content_length_and_no_chunking(server, world):
    query = urllib.parse.urlencode(world.params())
    with socket.create_connection(("127.0.0.1", server), timeout=10) as s:
        s.sendall(f"GET {PATH}?{query} HTTP/1.0\r\n\r\n".encode())
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.") and b" 200 " in head.split(b"\r\n")[0]
    assert f"content-length: {len(SUCCESS)}".encode() in head.lower()
    assert b"transfer-encoding" not in head.lower()
    assert body == SUCCESS


def test_post_json_over_http(server, world):
    conn = http.client.HTTPConnection("127.0.0.1", server, timeout=10)
    conn.request("POST", PATH, body=json.dumps(world.params()), headers={"Content-Type": "application/json"})
    assert json.loads(conn.getresponse().read())["success"] is True
    conn.close()


def test_bad_configuration_stops_gunicorn_at_boot_with_a_clear_message(env, tmp_path):
    broken = dict(env, AUTHSVC_STORE="sqlite://" + str(tmp_path / "never-initialised.db"))
    proc = start_gunicorn(broken, free_port())
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert "does not exist (run 'authsvc init')" in err
