"""The API path with repeated or trailing slashes, through the shipped nginx + gunicorn stack.

The original service's router (Rails) squeezed runs of "/" and dropped a trailing
one; clients whose base URL ends in "/" send "//api/authenticate.json". Both hosts
answer these like the API path, with no redirect, and the access logs name the API
route (docs/api.md, docs/logs.md). The app's own handling: tests/functional/test_endpoint.py.
"""

from __future__ import annotations

import json
import socket

import pytest

from tests.deploy_support import API_HOST, start_stack, stop, wait_for_log

pytestmark = pytest.mark.slow

API_PATH = "/api/authenticate.json"
VARIANTS = [
    "//api/authenticate.json",
    "/api//authenticate.json",
    "/api/authenticate.json/",
    "///api//authenticate.json//",
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = start_stack(tmp_path_factory.mktemp("paths"))
    yield s
    stop(s.nginx)
    stop(s.gunicorn)


def _unix_get(stack, target: str, request_id: str) -> bytes:
    """One raw GET straight to gunicorn's socket, the request target exactly as given."""
    request = (
        f"GET {target} HTTP/1.1\r\nHost: x\r\nX-Request-Id: {request_id}\r\nConnection: "
        "close\r\n\r\n"
    )
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(stack.root / "authsvc.sock"))
        sock.sendall(request.encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.mark.parametrize("scheme", ["https", "http"])
@pytest.mark.parametrize("path", VARIANTS)
def test_api_path_with_extra_slashes_answers_like_the_api_path(stack, scheme, path):
    success = {"success": True, "user_id": stack.user_id, "username": stack.username}
    tag = f"slashes-{scheme}-{path}"
    query = stack.api_query().partition("?")[2]
    get = stack.request(scheme, f"{path}?{query}", headers={"User-Agent": f"{tag}-get"})
    assert get.status == 200, (get.status, get.headers.get("Location"), get.body[:200])
    assert get.json() == success
    body = json.dumps(
        {"user_id": stack.user_id, "game_auth_token": stack.token, "api_key": stack.api_key}
    ).encode()
    post = stack.request(
        scheme,
        path,
        method="POST",
        body=body,
        headers={"Content-Type": "application/json", "User-Agent": f"{tag}-post"},
    )
    assert post.status == 200 and post.json() == success, (post.status, post.body[:200])
    form = stack.request(
        scheme,
        path,
        method="POST",
        body=query.encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert form.status == 200 and form.json() == success, (form.status, form.body[:200])
    nginx_log = wait_for_log(stack, "authsvc-access.log", [f'"{tag}-get"', f'"{tag}-post"'])
    for method in ("get", "post"):
        [line] = [line for line in nginx_log.splitlines() if f'"{tag}-{method}"' in line]
        assert f'"{method.upper()} {API_PATH} HTTP/1.1" 200 ' in line, line
        assert "upstream=200 " in line and "result=200 " in line, line
    assert stack.api_key not in nginx_log and stack.token not in nginx_log


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_nginx_limits_name_the_api_route_for_the_trailing_slash(stack, scheme):
    """nginx answers 413 before its rewrite of "/api/authenticate.json/": the log still names the
    API route."""
    tag = f"slashes-413-{scheme}"
    answer = stack.request(
        scheme,
        "/api/authenticate.json/",
        method="POST",
        body=b"a" * 20000,
        headers={"Content-Type": "application/x-www-form-urlencoded", "User-Agent": tag},
    )
    assert answer.status == 413
    log = wait_for_log(stack, "authsvc-access.log", [f'"{tag}"'])
    [line] = [line for line in log.splitlines() if f'"{tag}"' in line]
    assert f'"POST {API_PATH} HTTP/1.1" 413 ' in line, line


@pytest.mark.parametrize("path", VARIANTS)
def test_gunicorn_answers_them_as_the_api_route(stack, path):
    """Straight to gunicorn's socket (nginx's place): the app's record for nginx's line is an
    authentication's (access_record = "edge"; gunicorn's access log is off, its route names:
    tests/integration/test_logs.py)."""
    request_id = f"slashes-direct-{VARIANTS.index(path)}"
    answer = _unix_get(stack, f"{path}?{stack.api_query().partition('?')[2]}", request_id)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:100]
    assert b'"success":true' in answer
    assert (
        f"\r\nX-Authsvc-Result: 200 reason=success game={stack.game_id} user=4242\r\n".encode()
        in answer
    ), answer


def test_other_paths_keep_their_answers(stack):
    """Only the API path is widened: a longer path is still 404 on HTTPS and a redirect on the
    legacy host."""
    for path in (
        "/api/authenticate.json/x",
        "//api/authenticate.json/x",
        "/api/authenticate.jsonx",
        "/",
    ):
        assert stack.request("https", path).status == 404, path
        legacy = stack.request("http", path)
        assert legacy.status == 301, path
        assert legacy.headers["Location"] == f"https://{API_HOST}:{stack.https_port}{path}"
    # The API host over plain HTTP redirects every path, the API path's variants included.
    for path in (API_PATH, *VARIANTS):
        plain = stack.request("http", path, host=API_HOST)
        assert plain.status == 301, path
        assert plain.headers["Location"] == f"https://{API_HOST}:{stack.https_port}{path}"
