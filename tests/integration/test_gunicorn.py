"""The app under a real gunicorn, over real HTTP on loopback."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import time
import urllib.parse

import pytest

from harness.hostile_bodies import curl_form, many_parts, nested_multipart
from tests.support import MISSING, PATH, free_port, get, start_gunicorn, wait_for_port

SUCCESS = b'{"success":true,"user_id":4242,"username":"alice"}'


@pytest.fixture
def server(env, world):
    """gunicorn on the world's store, given 5 s to stop (the teardown waits 20).

    By gunicorn's code, a SIGTERM that reaches a worker between its fork and its
    own signal set-up runs the master's inherited handler there and is lost; the
    master then waits graceful_timeout (30 s by default) before SIGKILL. Short
    tests on a loaded machine were seen to outlast the teardown that way.
    """
    port = free_port()
    proc = start_gunicorn(env, "--graceful-timeout", "5", port=port)
    try:
        wait_for_port(port)
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        params = world.params()
        assert params["api_key"] not in err and params["game_auth_token"] not in err


def test_success_403_and_400_over_http(server, world):
    r = get(server, world.params())
    assert r.status == 200 and json.loads(r.body) == {
        "success": True,
        "user_id": 4242,
        "username": "alice",
    }
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
    conn.request(
        "POST", PATH, body=json.dumps(world.params()), headers={"Content-Type": "application/json"}
    )
    assert json.loads(conn.getresponse().read())["success"] is True
    conn.close()


def test_bad_configuration_stops_gunicorn_at_boot_with_a_clear_message(env, tmp_path):
    """Preloaded, as the service unit runs it: gunicorn's "app failed to load", 4, which the unit
    keeps stopped (docs/operations.md, "Exit statuses"; a worker's own boot:
    tests/integration/test_worker_boot.py)."""
    broken = dict(env, AUTHSVC_STORE="sqlite://" + str(tmp_path / "never-initialised.db"))
    proc = start_gunicorn(broken, port=free_port(), preload=True)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 4, err[-3000:]
    assert "does not exist (run 'authsvc init')" in err
    assert "Traceback" not in err


def post(port: int, body: bytes, content_type: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", PATH, body=body, headers={"Content-Type": content_type})
    response = conn.getresponse()
    answer = json.loads(response.read())
    conn.close()
    return response.status, answer


def best_seconds(function, runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - t0)
    return best


def test_probe_multipart_bodies_get_a_json_400_over_http(server, world):
    """The bodies that cost email.parser ~200 ms and ~100 ms: a 400, in the time of a plain form
    give or take.

    The bound is against a plain form timed in the same test, and generous (50 x):
    it catches work that grows with the parts (the probe measured 10,000 x), not
    a slow machine.
    """
    params = world.params()
    plain = curl_form(params)
    assert post(server, *plain) == (200, {"success": True, "user_id": 4242, "username": "alice"})
    assert post(server, *nested_multipart(params)) == (
        200,
        MISSING,
    )  # the api key inside is never read
    too_many = {
        "success": False,
        "error": 400,
        "error_description": "Request body has more than 8 multipart parts",
    }
    assert post(server, *many_parts()) == (200, too_many)
    reference = best_seconds(lambda: post(server, *plain))
    for probe in (nested_multipart(params), many_parts()):
        assert best_seconds(lambda probe=probe: post(server, *probe)) <= 50 * reference


def test_malformed_chunk_size_is_a_json_400_not_a_500(server):
    """gunicorn raises InvalidChunkSize from wsgi.input.read, inside the app: read_body turns it
    into a 400."""
    with socket.create_connection(("127.0.0.1", server), timeout=10) as s:
        s.sendall(
            f"POST {PATH} HTTP/1.1\r\nHost: localhost\r\nContent-Type: "
            "application/x-www-form-urlencoded\r\nTransfer-Encoding: chunked\r\nConnection: "
            "close\r\n\r\nzz\r\nuser_id=1\r\n0\r\n\r\n".encode()
        )
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] in (b"HTTP/1.1 200 OK", b"HTTP/1.0 200 OK"), raw[:300]
    assert json.loads(body) == {
        "success": False,
        "error": 400,
        "error_description": "Request body could not be read",
    }
