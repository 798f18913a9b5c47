"""A client that reaches gunicorn directly (docs/scaling.md lets Prometheus do so) cannot write
the log's fields (docs/logs.md, "Access log lines"): a real gunicorn with the shipped config.

The access line's address is the connection's unless the peer is a trusted proxy
(``forwarded_allow_ips``), its ``proto`` is the scheme gunicorn itself took, and a request
id is logged only in its documented shape, in the access line as in the auth line.
"""

from __future__ import annotations

import http.client
import os
import re
from pathlib import Path

import pytest

from harness.processes import stop
from tests.support import free_port, start_gunicorn, wait_for_port

REPO = Path(__file__).resolve().parents[2]
CONF = str(REPO / "deploy" / "gunicorn.conf.py")
pytestmark = pytest.mark.engine("sqlite")

FORGED_ADDRESS = (
    '198.51.100.7 "GET /api/authenticate.json HTTP/1.1" 200 71 1ms proto=https rid=x '
    "result=200 forged=1"
)
# Each: (sent X-Request-Id, what both lines log).
REQUEST_IDS = [
    ("e403c0fcef6463d39fc7a9b815431506", "e403c0fcef6463d39fc7a9b815431506"),  # nginx's $request_id
    ("client-7.retry_2", "client-7.retry_2"),
    ("abc result=200 forged=1", "-"),
    ("\u00e9t\u00e9", "-"),  # alphanumeric, not ASCII: isalnum() let it through
    ("a" * 65, "-"),
    ("abc\tresult=200", "-"),
]


def _serve(tmp_path, env: dict, **extra: str):
    """gunicorn as the unit runs it, on TCP loopback; returns (process, port, access log, error
    log)."""
    port = free_port()
    config = tmp_path / "authsvc.toml"
    config.write_text("[gunicorn]\nworkers = 1\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AUTHSVC_")}
    full = {
        **clean,
        **env,
        "AUTHSVC_CONFIG": str(config),
        "AUTHSVC_BIND": f"127.0.0.1:{port}",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
        **extra,
    }
    access, errors = tmp_path / "access.log", tmp_path / "error.log"
    with access.open("wb") as out, errors.open("wb") as err:
        proc = start_gunicorn(
            full,
            app="",
            workers=None,
            config=CONF,
            inherit_env=False,
            cwd=tmp_path,
            stdout=out,
            stderr=err,
            new_session=True,
        )
    try:
        wait_for_port(port, timeout=30)
    except TimeoutError:
        stop(proc)
        pytest.fail(f"gunicorn did not listen: {errors.read_text(encoding='utf-8')}")
    return proc, port, access, errors


def _get(port: int, path: str, headers: dict) -> http.client.HTTPMessage:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest("GET", path, skip_accept_encoding=True)
    for name, value in headers.items():
        conn.putheader(
            name, value.encode("utf-8")
        )  # as a client sends them: any byte but CR and LF
    conn.endheaders()
    response = conn.getresponse()
    response.read()
    conn.close()
    return response.headers


def _requests(world, port: int, forwarded_for: str, forwarded_proto: str) -> None:
    """One authentication per request id of REQUEST_IDS, each with these forwarded headers."""
    query = "/api/authenticate.json?" + "&".join(f"{k}={v}" for k, v in world.params().items())
    for sent, _ in REQUEST_IDS:
        _get(
            port,
            query,
            {
                "X-Forwarded-For": forwarded_for,
                "X-Forwarded-Proto": forwarded_proto,
                "X-Request-Id": sent,
            },
        )


def _lines(access, errors, batches: int) -> list[tuple[list[str], list[str]]]:
    """Per batch of REQUEST_IDS: (its access lines, its auth lines), in the order sent (one
    worker)."""
    lines = [
        line
        for line in access.read_text(encoding="utf-8").splitlines()
        if "/api/authenticate.json" in line
    ]
    auths = [
        line for line in errors.read_text(encoding="utf-8").splitlines() if " auth rid=" in line
    ]
    n = len(REQUEST_IDS)
    assert len(lines) == len(auths) == batches * n, (lines, auths)
    return [(lines[i * n : (i + 1) * n], auths[i * n : (i + 1) * n]) for i in range(batches)]


def _assert_fields_are_the_services(access_lines, auth_lines, address: str, proto: str) -> None:
    for line, auth, (_, logged) in zip(access_lines, auth_lines, REQUEST_IDS, strict=True):
        assert line.startswith(f'{address} "GET /api/authenticate.json HTTP/1.1" 200 '), line
        assert line.count("result=") == 1 and "forged" not in line and "198.51.100.7" not in line, (
            line
        )
        assert re.search(rf" proto={proto} rid={re.escape(logged)} result=\d+$", line), line
        assert line.isascii(), line
        assert f" auth rid={logged} host=" in auth and "forged" not in auth and auth.isascii(), auth


def test_a_direct_client_cannot_write_the_access_and_auth_lines(tmp_path, env, world):
    """127.0.0.1 is not a trusted proxy here (as an app host's Prometheus is not): its headers are
    not believed."""
    proc, port, access, errors = _serve(tmp_path, env, AUTHSVC_FORWARDED_ALLOW_IPS="192.0.2.1")
    try:
        _requests(world, port, FORGED_ADDRESS, "https result=200 forged=1")
        _requests(world, port, "203.0.113.9", "https")
    finally:
        stop(proc)
    for lines, auths in _lines(access, errors, 2):
        _assert_fields_are_the_services(lines, auths, "127.0.0.1", "http")
    assert "203.0.113.9" not in access.read_text(encoding="utf-8")


def test_a_trusted_proxy_gives_the_client_address_in_its_shape_only(tmp_path, env, world):
    """127.0.0.1 trusted (the shipped default, nginx on this host): its X-Forwarded-For is the
    client's address when it is one, else the connection's; proto is the scheme gunicorn took."""
    proc, port, access, errors = _serve(tmp_path, env)
    try:
        _requests(world, port, "203.0.113.9", "https")
        _requests(world, port, FORGED_ADDRESS, "https result=200 forged=1")
        _requests(world, port, "2001:db8::7", "http")
    finally:
        stop(proc)
    (good, good_auths), (forged, forged_auths), (six, six_auths) = _lines(access, errors, 3)
    _assert_fields_are_the_services(good, good_auths, "203.0.113.9", "https")
    _assert_fields_are_the_services(forged, forged_auths, "127.0.0.1", "http")
    _assert_fields_are_the_services(six, six_auths, "2001:db8::7", "http")


def test_gunicorn_alone_names_the_route_never_the_decoded_path(tmp_path, env, world):
    """access_record = "app" (gunicorn without nginx, as scripts/serve runs it): a percent-encoded
    '?' puts the query string in the decoded path; gunicorn's line names the route "<other>"."""
    proc, port, access, errors = _serve(tmp_path, env)
    try:
        query = "&".join(f"{k}={v}" for k, v in world.params().items())
        _get(port, "/api/authenticate.json%3F" + query, {"X-Request-Id": "encoded-direct"})
        _get(port, "/api/authenticate.json?" + query, {"X-Request-Id": "plain-direct"})
    finally:
        stop(proc)
    text = access.read_text(encoding="utf-8")
    [encoded] = [line for line in text.splitlines() if "rid=encoded-direct" in line]
    assert '"GET <other> HTTP/1.1" 404 ' in encoded, encoded
    [plain] = [line for line in text.splitlines() if "rid=plain-direct" in line]
    assert plain.endswith(" rid=plain-direct result=200"), plain
    assert world.api_key not in text and "api_key=" not in text
    assert " auth rid=plain-direct host=legacy " in errors.read_text(encoding="utf-8")


def test_an_edge_host_reached_directly_writes_the_auth_line_and_never_shows_the_reason(
    tmp_path, env, world
):
    """access_record = "edge", but the peer is not nginx (not in forwarded_allow_ips: an app host's
    port that Prometheus may reach, docs/scaling.md): the client gets the code only, never the
    reason or the game (docs/api.md), and the app writes its auth line, since no nginx line will;
    gunicorn's access log is off."""
    proc, port, access, errors = _serve(
        tmp_path, env, AUTHSVC_ACCESS_RECORD="edge", AUTHSVC_FORWARDED_ALLOW_IPS="192.0.2.1"
    )
    try:
        query = "&".join(f"{k}={v}" for k, v in world.params(game_auth_token="0" * 64).items())
        headers = _get(port, "/api/authenticate.json?" + query, {"X-Request-Id": "direct-edge"})
    finally:
        stop(proc)
    assert headers["X-Authsvc-Result"] == "403", headers
    assert access.read_text(encoding="utf-8") == ""
    [auth] = [
        line for line in errors.read_text(encoding="utf-8").splitlines() if " auth rid=" in line
    ]
    assert " auth rid=direct-edge host=legacy " in auth and " reason=wrong_token " in auth, auth


def test_an_edge_host_behind_its_proxy_writes_no_line(tmp_path, env, world):
    """access_record = "edge" and the peer is nginx (127.0.0.1, the default forwarded_allow_ips):
    the record goes out in X-Authsvc-Result for nginx's line (nginx strips it), and gunicorn and the
    app write nothing."""
    proc, port, access, errors = _serve(tmp_path, env, AUTHSVC_ACCESS_RECORD="edge")
    try:
        query = "&".join(f"{k}={v}" for k, v in world.params(game_auth_token="0" * 64).items())
        headers = _get(port, "/api/authenticate.json?" + query, {"X-Request-Id": "proxied-edge"})
    finally:
        stop(proc)
    assert (
        headers["X-Authsvc-Result"]
        == f"403 reason=wrong_token game={world.game_id} user={world.user_id}"
    )
    assert access.read_text(encoding="utf-8") == ""
    assert " auth rid=" not in errors.read_text(encoding="utf-8")
