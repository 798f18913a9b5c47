"""The shipped nginx + gunicorn deployment, for real: TLS, both hosts, limits, logs.

One stack per module (tests/deploy_support.py), which its tests leave working;
at the module's end every log it wrote is read for secrets. The two tests that
break a stack on purpose (the store, for a 503 from the app; gunicorn, for
nginx's 502) start one of their own, so no test depends on the order they run in.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time

import pytest

from authsvc.web.authenticate import REASONS
from tests.deploy_support import (
    ADMIN_HOST,
    API_HOST,
    LEGACY_HOST,
    REPO,
    forty_client_headers,
    start_stack,
    stop,
    wait_for_log,
)
from tests.support import INVALID, MISSING

pytestmark = pytest.mark.slow

DOCS = REPO / "docs" / "operations.md"
JSON_TYPE = "application/json; charset=utf-8"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """One stack for the module's tests, which leave it working; at the end, whatever ran, no log
    holds a secret."""
    s = start_stack(tmp_path_factory.mktemp("deploy"))
    yield s
    stop(s.nginx)
    stop(s.gunicorn)
    assert_no_log_holds_a_secret(s)


def _error_shape(answer, code: int) -> None:
    assert answer.content_type == JSON_TYPE, answer.headers
    obj = answer.json()
    assert set(obj) == {"success", "error", "error_description"}, obj
    assert obj["success"] is False and obj["error"] == code, obj
    assert answer.headers["Cache-Control"] == "no-store"


def _cases(stack):
    bad_token = stack.token[:-1] + ("0" if stack.token[-1] != "0" else "1")
    return {
        "success": ("GET", stack.api_query(), None, {}),
        "bad token": ("GET", stack.api_query(game_auth_token=bad_token), None, {}),
        "bad key": ("GET", stack.api_query(api_key=stack.other_api_key), None, {}),
        "missing parameter": ("GET", stack.api_query(game_auth_token=None), None, {}),
        "guest user 0": ("GET", stack.api_query(user_id="0"), None, {}),
        "JSON body": (
            "POST",
            "/api/authenticate.json",
            json.dumps(
                {"user_id": stack.user_id, "game_auth_token": stack.token, "api_key": stack.api_key}
            ).encode(),
            {"Content-Type": "application/json"},
        ),
        "form body": (
            "POST",
            "/api/authenticate.json",
            f"user_id={stack.user_id}&game_auth_token={stack.token}&api_key={stack.api_key}".encode(),
            {"Content-Type": "application/x-www-form-urlencoded"},
        ),
        "wrong method": ("DELETE", stack.api_query(), None, {}),
    }


def test_both_hosts_give_the_same_answers(stack):
    expected = {
        "success": (200, {"success": True, "user_id": stack.user_id, "username": stack.username}),
        "bad token": (200, INVALID),
        "bad key": (200, INVALID),
        "missing parameter": (200, MISSING),
        "guest user 0": (200, INVALID),
        "JSON body": (200, {"success": True, "user_id": stack.user_id, "username": stack.username}),
        "form body": (200, {"success": True, "user_id": stack.user_id, "username": stack.username}),
        "wrong method": (
            405,
            {"success": False, "error": 405, "error_description": "Method not allowed"},
        ),
    }
    for name, (method, path, body, headers) in _cases(stack).items():
        https = stack.request("https", path, method=method, body=body, headers=headers)
        legacy = stack.request("http", path, method=method, body=body, headers=headers)
        for answer in (https, legacy):
            assert (answer.status, answer.json()) == expected[name], (
                name,
                answer.status,
                answer.body,
            )
            assert answer.content_type == JSON_TYPE, name
            assert answer.headers["Cache-Control"] == "no-store", name
        assert legacy.body == https.body, name


def test_http10_client_without_host_header_reaches_the_legacy_api(stack):
    with socket.create_connection(("127.0.0.1", stack.http_port), timeout=10) as sock:
        sock.sendall(f"GET {stack.api_query()} HTTP/1.0\r\n\r\n".encode())
        data = b""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"\r\nContent-Length: " in head and b"chunked" not in head.lower()
    assert json.loads(body) == {
        "success": True,
        "user_id": stack.user_id,
        "username": stack.username,
    }


def test_https_host_sends_hsts_and_verifies_against_the_test_ca(stack):
    answer = stack.request("https", stack.api_query())
    assert answer.headers["Strict-Transport-Security"] == "max-age=63072000"
    assert answer.headers["X-Content-Type-Options"] == "nosniff"
    assert stack.request("http", stack.api_query()).headers.get("Strict-Transport-Security") is None
    # The certificate really is checked: without the test CA the handshake fails.
    with pytest.raises(ssl.SSLCertVerificationError):
        stack.request("https", stack.api_query(), context=ssl.create_default_context())


@pytest.mark.parametrize("version", ["TLSv1_2", "TLSv1_3"])
def test_tls_12_and_13_accepted(stack, version):
    v = getattr(ssl.TLSVersion, version)
    ctx = stack.client_context(minimum_version=v, maximum_version=v)
    assert stack.request("https", stack.api_query(), context=ctx).status == 200


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_tls_11_refused_even_though_debian_main_conf_enables_it(stack):
    # The harness's main nginx.conf has Debian's "ssl_protocols TLSv1 TLSv1.1 TLSv1.2 TLSv1.3".
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(str(stack.ca_file))
    try:
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
        ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    except (ValueError, ssl.SSLError) as e:
        pytest.fail(
            f"this Python/OpenSSL cannot offer TLS 1.1, so the refusal cannot be shown: {e}"
        )
    for sni in (API_HOST, "unknown.authsvc.test"):
        with pytest.raises(ssl.SSLError) as info:
            stack.request("https", stack.api_query(), context=ctx, sni=sni)
        assert (
            "PROTOCOL_VERSION" in str(info.value).upper()
            or "UNSUPPORTED_PROTOCOL" in str(info.value).upper()
        )
    rendered = (stack.root / "deploy" / "nginx").rglob("*.conf")
    protocols = {
        m
        for f in rendered
        for m in re.findall(r"^\s*ssl_protocols\s+([^;]*);", f.read_text(), re.M)
    }
    assert protocols == {"TLSv1.2 TLSv1.3"}


def test_unknown_host_names_are_dropped(stack):
    # Plain HTTP: 444, the connection closes without an answer.
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
        stack.request("http", stack.api_query(), host="unknown.authsvc.test")
    # TLS with an unknown SNI name: the handshake is refused.
    with pytest.raises(ssl.SSLError) as info:
        stack.request(
            "https",
            stack.api_query(),
            sni="unknown.authsvc.test",
            context=_no_hostname_check(stack),
        )
    assert "UNRECOGNIZED_NAME" in str(info.value).upper()
    # No SNI at all: refused as well (docs/operations.md: clients must send SNI).
    no_sni = _no_hostname_check(stack)
    sock = socket.create_connection(("127.0.0.1", stack.https_port), timeout=10)
    with pytest.raises(ssl.SSLError), sock:
        no_sni.wrap_socket(sock, server_hostname=None)
    # The right SNI name but another Host header: dropped too.
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
        stack.request("https", stack.api_query(), host="unknown.authsvc.test", sni=API_HOST)


def _no_hostname_check(stack):
    ctx = stack.client_context()
    ctx.check_hostname = False
    return ctx


def test_legacy_host_redirects_other_paths_never_the_api_path(stack):
    api = stack.request("http", stack.api_query())
    assert api.status == 200 and api.json()["success"] is True
    for path in ("/", "/games/list?page=2", "/api/authenticate.jsonx"):
        answer = stack.request("http", path)
        assert answer.status == 301, path
        assert answer.headers["Location"] == f"https://{API_HOST}:{stack.https_port}{path}"
    # The API host over plain HTTP redirects (its plain-HTTP address is the legacy host).
    answer = stack.request("http", "/api/authenticate.json", host=API_HOST)
    assert answer.status == 301
    # ACME challenges are served from the webroot, not redirected.
    challenge = stack.root / "acme" / ".well-known" / "acme-challenge"
    challenge.mkdir(parents=True, exist_ok=True)
    (challenge / "tok3n").write_text("proof")
    answer = stack.request("http", "/.well-known/acme-challenge/tok3n", host=API_HOST)
    assert (answer.status, answer.body) == (200, b"proof")


def test_other_paths_on_the_https_host_are_json_404(stack):
    answer = stack.request("https", "/admin")
    assert answer.status == 404
    _error_shape(answer, 404)
    assert answer.headers["Strict-Transport-Security"] == "max-age=63072000"


def _wait_for_lines(path, count: int, marker: str = "") -> list[str]:
    """The log's lines holding ``marker``, once there are ``count`` (a line is written just after
    its answer)."""
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in path.read_text().splitlines() if marker in line]
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


ADMIN_PATHS = [
    ("GET", "/v1/players/1"),
    ("PUT", "/v1/players/1"),
    ("POST", "/v1/players/1/revoke"),
    ("POST", "/v1/tokens"),
    ("GET", "/v1/games"),
    ("POST", "/v1/games"),
    ("GET", "/v1/games/1"),
    ("GET", "/v1/audit?limit=1"),
    ("GET", "/v1"),
    ("GET", "//v1/tokens"),
    ("GET", "/openapi.json"),
]


def test_neither_public_host_answers_an_admin_path(stack):
    """The admin API is its own service (docs/admin-api.md): the public hosts answer nginx's own
    JSON 404 to every admin path, on HTTPS and on the legacy host alike (no redirect there), and
    forward nothing."""
    body = b'{"username": "mallory", "game_id": 1, "user_id": 1}'
    headers = {
        "Authorization": "Bearer asv_not-a-real-token",
        "Content-Type": "application/json",
        "User-Agent": "admin-path-probe",
    }
    for scheme in ("https", "http"):
        for method, path in ADMIN_PATHS:
            answer = stack.request(
                scheme,
                path,
                method=method,
                headers=headers,
                body=body if method in ("PUT", "POST") else None,
            )
            assert answer.status == 404, (
                scheme,
                method,
                path,
                answer.status,
                answer.headers.get("Location"),
            )
            _error_shape(answer, 404)
    # Nothing reached gunicorn: nginx's lines show no upstream for any of them.
    lines = _wait_for_lines(
        stack.logs / "authsvc-access.log", 2 * len(ADMIN_PATHS), "admin-path-probe"
    )
    assert all(" 404 " in line and " upstream=- " in line for line in lines), lines


def test_the_optional_admin_server_proxies_to_the_admin_api_for_allowed_addresses_only(tmp_path):
    """Opted in (scripts/install --admin-host): its own TLS server and port, the allow list, the
    admin socket behind it; the public hosts still answer no admin path."""
    s = start_stack(tmp_path, admin=True)
    try:
        auth = {"Authorization": f"Bearer {s.admin_token}", "User-Agent": "admin-server-probe"}
        player = s.request(
            "https", f"/v1/players/{s.user_id}", host=ADMIN_HOST, port=s.admin_port, headers=auth
        )
        assert player.status == 200, player.body
        assert player.json()["username"] == s.username and player.headers["ETag"]
        minted = s.request(
            "https",
            "/v1/tokens",
            method="POST",
            host=ADMIN_HOST,
            port=s.admin_port,
            headers={**auth, "Content-Type": "application/json"},
            body=json.dumps({"game_id": s.game_id, "user_id": s.user_id}).encode(),
        )
        assert (minted.status, minted.json()["game_auth_token"]) == (200, s.token)
        # The app's own problems pass through: no token, 401 with WWW-Authenticate.
        anonymous = s.request(
            "https", "/v1/tokens", method="POST", host=ADMIN_HOST, port=s.admin_port
        )
        assert anonymous.status == 401 and anonymous.headers["WWW-Authenticate"].startswith(
            "Bearer"
        )
        # Another address (127.0.0.2, not in ADMIN_ALLOW): nginx's 403 problem, nothing forwarded
        # (the next allowed request is the one line the admin API logs after the three above).
        admin_log = s.logs / "gunicorn-admin-access.log"
        _wait_for_lines(admin_log, 3)
        denied = s.request(
            "https",
            f"/v1/players/{s.user_id}",
            host=ADMIN_HOST,
            port=s.admin_port,
            headers=auth,
            source="127.0.0.2",
        )
        assert denied.status == 403 and denied.content_type == "application/problem+json", (
            denied.body
        )
        assert denied.json()["status"] == 403
        assert (
            s.request(
                "https",
                f"/v1/players/{s.user_id}",
                host=ADMIN_HOST,
                port=s.admin_port,
                headers=auth,
            ).status
            == 200
        )
        assert len(_wait_for_lines(admin_log, 4)) == 4, admin_log.read_text()
        # The public hosts, with the admin server on, still answer no admin path.
        for scheme in ("https", "http"):
            answer = s.request(scheme, f"/v1/players/{s.user_id}", headers=auth)
            assert answer.status == 404 and answer.json()["error"] == 404, (scheme, answer.body)
        # Neither nginx log holds the token.
        logs = "".join(s.log_texts().values())
        assert s.admin_token not in logs and s.admin_token.split("_", 1)[1] not in logs
        admin_lines = (s.logs / "authsvc-admin-access.log").read_text()
        assert '"GET /v1/players/{user_id} HTTP/1.1" 200' in admin_lines
        # nginx's line names the admin API's own request id, the one its answer and audit records
        # hold
        assert re.fullmatch(r"[0-9a-f]{32}", player.headers["X-Request-Id"])
        assert f" app_rid={player.headers['X-Request-Id']}\n" in admin_lines, admin_lines
    finally:
        stop(s.nginx)
        stop(s.gunicorn)
        stop(s.admin_gunicorn)


def test_forwarded_headers_come_from_nginx_not_the_client(stack):
    """nginx's line (the record behind nginx) holds the connection's address and nginx's own request
    id; gunicorn, which would believe these headers from nginx, gets nginx's values
    (tests/integration/test_forged_log_fields.py shows gunicorn's own line, access_record =
    "app")."""
    spoof = {
        "X-Forwarded-For": "203.0.113.9",
        "X-Forwarded-Proto": "https",
        "X-Request-Id": "spoofed-id",
    }
    for scheme in ("http", "https"):
        stack.request(
            scheme, stack.api_query(), headers={**spoof, "User-Agent": f"forwarded-{scheme}"}
        )
    nginx_log = wait_for_log(stack, "authsvc-access.log", ['"forwarded-http"', '"forwarded-https"'])
    for scheme in ("http", "https"):
        [line] = _lines_with(nginx_log, f'"forwarded-{scheme}"')
        assert re.match(r"^\S+ [0-9a-f]{32} 127\.0\.0\.1 ", line), line
        assert " result=200 reason=success " in line, line
    logs = stack.log_texts()
    for name in ("authsvc-access.log", "gunicorn-access.log", "gunicorn-error.log"):
        assert "203.0.113.9" not in logs[name] and "spoofed-id" not in logs[name], name


# What nginx passes on to gunicorn (deploy/nginx/snippets/authsvc-proxy.conf): the headers the app
# and gunicorn read, nginx's own, and nothing of the client's.
FORWARDED = {
    "HTTP_HOST",
    "HTTP_X_FORWARDED_FOR",
    "HTTP_X_FORWARDED_PROTO",
    "HTTP_X_REQUEST_ID",
    "HTTP_X_REQUEST_START",
}


def test_only_the_headers_the_app_reads_reach_gunicorn(tmp_path):
    """A client's 40 headers (and its own X-Forwarded-*, Forwarded, X-Request-Start) never reach
    gunicorn, which would parse and copy each; a form body arrives with its Content-Type and a
    Content-Length, a chunked one too."""
    s = start_stack(tmp_path, workers=1, app="tests.headers_app:application")
    try:
        extra = forty_client_headers("game-server/1.0", "application/json")
        assert len(extra) == 40
        for scheme in ("http", "https"):
            answer = s.request(scheme, "/api/authenticate.json?user_id=1", headers=extra)
            assert answer.status == 200, answer.body
            assert set(answer.json()["headers"]) == FORWARDED, answer.json()
            form = b"user_id=1&api_key=k"
            answer = s.request(
                scheme,
                "/api/authenticate.json",
                method="POST",
                body=form,
                headers={**extra, "Content-Type": "application/x-www-form-urlencoded"},
            )
            assert set(answer.json()["headers"]) == FORWARDED | {
                "CONTENT_TYPE",
                "CONTENT_LENGTH",
            }, answer.json()
            assert answer.json()["body"] == form.decode()
            assert answer.json()["content_type"] == "application/x-www-form-urlencoded"
        chunked = b"7\r\nuser_id\r\n4\r\n=1&a\r\n0\r\n\r\n"
        answer = s.request(
            "http",
            "/api/authenticate.json",
            method="POST",
            body=chunked,
            headers={
                "Transfer-Encoding": "chunked",
                "Content-Type": "application/x-www-form-urlencoded",
            },
        )
        assert set(answer.json()["headers"]) == FORWARDED | {"CONTENT_TYPE", "CONTENT_LENGTH"}, (
            answer.json()
        )
        assert answer.json()["body"] == "user_id=1&a"
    finally:
        stop(s.nginx)
        stop(s.gunicorn)


def test_nginx_limits_answer_in_json(stack):
    # Body over 16 KiB: nginx's 413, in the service's shape.
    answer = stack.request(
        "http",
        stack.api_query(),
        method="POST",
        body=b"a" * 20000,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert answer.status == 413
    _error_shape(answer, 413)
    # Request line over 8 KiB, the api key in it: 414 on both hosts.
    long_path = stack.api_query() + "&pad=" + "p" * 9000
    for scheme in ("http", "https"):
        answer = stack.request(scheme, long_path)
        assert answer.status == 414, scheme
        _error_shape(answer, 414)
    # A header over 8 KiB: 400.
    answer = stack.request("https", stack.api_query(), headers={"X-Padding": "h" * 9000})
    assert answer.status == 400
    _error_shape(answer, 400)


def test_rate_limit_per_client_address_answers_429_json(stack):
    # From 127.0.0.2, so the other tests (127.0.0.1) keep their own bucket. At once, more
    # than the burst: a client that waits for each answer is slowed to RATE (delay=), never
    # refused; what is past the burst is refused at once.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(100) as pool:
        answers = list(
            pool.map(
                lambda _: stack.request("http", stack.api_query(), source="127.0.0.2"), range(100)
            )
        )
    statuses = [answer.status for answer in answers]
    limited = next((answer for answer in answers if answer.status == 429), None)
    assert limited is not None, f"no 429 in {len(statuses)} requests at once: {statuses}"
    _error_shape(limited, 429)
    assert limited.json()["error_description"] == "Too many requests, slow down"
    # Another address is not limited by 127.0.0.2's bucket.
    assert stack.request("http", stack.api_query(), source="127.0.0.1").status == 200


def _check_cmd(stack, key_file, *extra):
    return [
        sys.executable,
        "-m",
        "authsvc.cli.command",
        "check",
        "--base-url",
        f"https://{API_HOST}:{stack.https_port}",
        "--base-url",
        f"http://{LEGACY_HOST}:{stack.http_port}",
        "--resolve",
        f"{API_HOST}:{stack.https_port}:127.0.0.1",
        "--resolve",
        f"{LEGACY_HOST}:{stack.http_port}:127.0.0.1",
        "--cafile",
        str(stack.ca_file),
        "--game-id",
        str(stack.game_id),
        "--user-id",
        str(stack.user_id),
        "--api-key-file",
        str(key_file),
        *extra,
    ]


def test_authsvc_check_passes_against_both_hosts(stack, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(stack.api_key + "\n")
    done = subprocess.run(
        _check_cmd(stack, key_file), env=stack.env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("ok")]
    assert len(lines) == 8, done.stdout
    assert "all 8 checks passed" in done.stdout
    for secret in (stack.api_key, stack.token, stack.token_secret):
        assert secret not in done.stdout + done.stderr


def test_authsvc_check_fails_on_mismatch_without_showing_secrets(stack, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(stack.other_api_key + "\n")  # a real key, of another game
    done = subprocess.run(
        _check_cmd(stack, key_file, "--json"),
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads(done.stdout)
    by_case = {(r["base_url"].split(":")[0], r["case"]): r["ok"] for r in report["results"]}
    assert by_case[("https", "success")] is False and by_case[("http", "success")] is False
    assert by_case[("https", "missing parameter")] is True
    for secret in (stack.api_key, stack.other_api_key, stack.token):
        assert secret not in done.stdout + done.stderr
    # An unreachable URL is a failure too, not a crash.
    closed = subprocess.run(
        [
            sys.executable,
            "-m",
            "authsvc.cli.command",
            "check",
            "--base-url",
            "http://127.0.0.1:9",
            "--game-id",
            str(stack.game_id),
            "--user-id",
            str(stack.user_id),
            "--api-key-file",
            str(key_file),
        ],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert closed.returncode == 1 and "cannot connect" in closed.stdout


def test_socket_activation_notify_and_graceful_reload(stack):
    assert "READY=1" in stack.ready_message
    log = (stack.logs / "gunicorn-error.log").read_text()
    assert f"Listening at: unix:{stack.root / 'authsvc.sock'}" in log
    before = stack.gunicorn_worker_pids()
    assert len(before) == 2, before
    os.kill(stack.gunicorn.pid, signal.SIGHUP)
    deadline = time.monotonic() + 30
    while True:
        after = stack.gunicorn_worker_pids()
        if len(after) == 2 and not (after & before):
            break
        assert time.monotonic() < deadline, f"workers not replaced after HUP: {before} -> {after}"
        time.sleep(0.1)
    assert stack.gunicorn.poll() is None
    assert stack.request("https", stack.api_query()).json()["success"] is True


def test_gunicorn_writes_nothing_in_home_or_tmp(stack):
    assert list((stack.root / "home").iterdir()) == []  # no ~/.gunicorn control socket
    assert list((stack.root / "gunicorn-tmp").iterdir()) == []


def test_backup_while_serving_as_documented(stack, tmp_path):
    """docs/operations.md section 8: `authsvc backup` while gunicorn reads the store; the copy is in
    WAL mode."""
    copy = tmp_path / "backup.db"
    assert "sudo authsvc backup /var/backups/authsvc-$(date +%F).db" in DOCS.read_text()
    done = subprocess.run(
        [sys.executable, "-m", "authsvc.cli.command", "backup", str(copy)],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert copy.read_bytes()[18:20] == b"\x02\x02"  # WAL mode, read from the file header
    assert stack.request("https", stack.api_query()).json()["success"] is True
    env = {**stack.env, "AUTHSVC_STORE": f"sqlite://{copy}"}
    games = subprocess.run(
        [sys.executable, "-m", "authsvc.cli.command", "game", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert [g["name"] for g in json.loads(games.stdout)["games"]] == ["Chess", "Go"]


def _unix_exchange(stack, request: bytes) -> bytes:
    """One raw request straight to gunicorn's socket (what scripts/serve exposes on loopback)."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(stack.root / "authsvc.sock"))
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


def test_access_logs_name_the_route_never_a_decoded_path(stack):
    """A percent-encoded '?' puts the query in the path: both access logs show "<other>"."""
    encoded = stack.api_query().replace("?", "%3F", 1)
    https = stack.request("https", encoded, headers={"User-Agent": "encoded-https"})
    assert https.status == 404
    legacy = stack.request("http", encoded, headers={"User-Agent": "encoded-http"})
    assert legacy.status == 301
    # The redirect gives the client back its own request; only the log must not keep it.
    assert legacy.headers["Location"] == f"https://{API_HOST}:{stack.https_port}{encoded}"
    direct = _unix_exchange(
        stack,
        f"GET {encoded} HTTP/1.1\r\nHost: x\r\nX-Request-Id: encoded-direct\r\nConnection: "
        "close\r\n\r\n".encode(),
    )
    assert direct.startswith(b"HTTP/1.1 404 "), direct[:100]
    nginx_log = wait_for_log(stack, "authsvc-access.log", ['"encoded-https"', '"encoded-http"'])
    for ua in ("encoded-https", "encoded-http"):
        [line] = _lines_with(nginx_log, f'"{ua}"')
        assert '"GET <other> HTTP/1.1"' in line, line
    # Behind nginx gunicorn's access log is off (access_record = "edge"); its route names, with
    # access_record = "app": tests/integration/test_forged_log_fields.py.
    gunicorn_log = (stack.logs / "gunicorn-access.log").read_text()
    assert gunicorn_log == "", gunicorn_log[-2000:]
    # The known paths keep their name.
    stack.request("https", stack.api_query(), headers={"User-Agent": "route-known"})
    nginx_log = wait_for_log(stack, "authsvc-access.log", ['"route-known"'])
    assert (
        '"GET /api/authenticate.json HTTP/1.1" 200 ' in _lines_with(nginx_log, '"route-known"')[0]
    )
    for text in (nginx_log, gunicorn_log):
        assert stack.api_key not in text and stack.token not in text and "api_key=" not in text


# nginx's line as docs/logs.md gives it: time, request id, address, host, request, status, bytes,
# time, upstream, addr=, the record (result= reason= game= user=), user agent.
NGINX_LINE = re.compile(
    r"^(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d) (?P<rid>[0-9a-f]{32}) "
    r'(?P<address>\S+) "(?P<host>[^"]+)" "(?P<request>[^"]+)" (?P<status>\d{3}) \d+ \d+ [\d.]+ '
    r'upstream=(?P<upstream>.+?) addr="[^"]*" result=(?P<result>\d{3}|-) '
    r"reason=(?P<reason>[a-z_]+|-) game=(?P<game>\d+|none|-) user=(?P<user>\d+|-) "
    r'"(?P<agent>[^"]*)"(?P<sampled> sampled=1/100)?$'
)
# A user id with spaces, quotes, a newline and forged fields: malformed, never echoed.
CRAFTED_USER = "4242%20reason%3Dsuccess%20game%3D777%20user%3D777%22%0Aforged-user-text"


def test_an_authentication_behind_nginx_is_one_nginx_line_and_the_header_stays_inside(stack):
    """access_record = "edge" (the shipped authsvc.toml): nginx's line holds result, reason, game
    and user (the app's X-Authsvc-Result, which nginx strips); gunicorn's access log and the app's
    auth line hold nothing. A client's own X-Authsvc-Result request header changes nothing."""
    bad_token = stack.token[:-1] + ("0" if stack.token[-1] != "0" else "1")
    game, user = str(stack.game_id), str(stack.user_id)
    cases = {
        "ok": (stack.api_query(), ("200", "success", game, user)),
        "bad": (stack.api_query(game_auth_token=bad_token), ("403", "wrong_token", game, user)),
        "nokey": (
            stack.api_query(api_key="9e258f6c-a232-442b-8d2d-f22da9c19d49"),
            ("403", "unknown_key", "none", user),
        ),
        "nobody": (stack.api_query(user_id="999"), ("403", "unknown_player", game, "999")),
        "missing": (stack.api_query(api_key=None), ("400", "missing_parameters", "none", "-")),
        "crafted": (stack.api_query(user_id=CRAFTED_USER), ("403", "malformed", "none", "-")),
    }
    forged = {"X-Authsvc-Result": "200 reason=success game=777 user=777"}
    for scheme in ("https", "http"):
        for name, (path, _) in cases.items():
            answer = stack.request(
                scheme, path, headers={**forged, "User-Agent": f"record-{name}-{scheme}"}
            )
            assert answer.status == 200, (scheme, name)
            assert "X-Authsvc-Result" not in answer.headers, answer.headers
    needles = [f'"record-{n}-{s}"' for n in cases for s in ("https", "http")]
    nginx_log = wait_for_log(stack, "authsvc-access.log", needles)
    rids = []
    for scheme in ("https", "http"):
        for name, (_, record) in cases.items():
            [line] = _lines_with(nginx_log, f'"record-{name}-{scheme}"')
            fields = NGINX_LINE.match(line)
            assert fields, line
            assert (fields["result"], fields["reason"], fields["game"], fields["user"]) == record, (
                line
            )
            assert (
                fields["request"] == "GET /api/authenticate.json HTTP/1.1"
                and fields["status"] == "200"
            ), line
            assert fields["address"] == "127.0.0.1" and fields["upstream"].startswith("200 "), line
            assert fields["host"] == (API_HOST if scheme == "https" else LEGACY_HOST), line
            rids.append(fields["rid"])
    assert "forged-user-text" not in nginx_log and "=777" not in nginx_log
    # Nothing else holds these requests: no gunicorn access line, no auth line.
    logs = stack.log_texts()
    assert logs["gunicorn-access.log"] == "", logs["gunicorn-access.log"][-2000:]
    assert "authsvc.auth" not in logs["gunicorn-error.log"], logs["gunicorn-error.log"][-2000:]
    for name, text in logs.items():
        if name != "authsvc-access.log":
            assert not any(rid in text for rid in rids), name
        # The wrong token and the unknown key sent above, like the right ones, are in no log.
        assert bad_token not in text and "9e258f6c-a232-442b-8d2d-f22da9c19d49" not in text, name
    # nginx's own answers have no upstream record.
    stack.request("https", "/admin", headers={"User-Agent": "result-none"})
    [line] = _lines_with(
        wait_for_log(stack, "authsvc-access.log", ['"result-none"']), '"result-none"'
    )
    assert " 404 " in line and " result=- reason=- game=- user=- " in line, line


def test_the_monitoring_server_never_shows_the_header(stack):
    for path in ("/healthz", "/readyz", "/metrics", "/nope"):
        answer = stack.request("http", path, host="127.0.0.1", port=stack.metrics_port)
        assert "X-Authsvc-Result" not in answer.headers, (path, answer.headers)


def test_rate_limited_and_dropped_answers_are_sampled_in_the_access_log(stack):
    """A flood of 429s (or of 444s) writes about one line in 100; every other answer is logged."""
    source = "127.0.0.5"  # a bucket of its own
    sent: dict[int, int] = {}
    conn = http.client.HTTPConnection(
        "127.0.0.1", stack.http_port, timeout=10, source_address=(source, 0)
    )
    try:
        for _batch in range(20):  # at most 10,000 requests; about 5 lines expected per batch
            for _ in range(500):
                # A path outside the API: its rate limit answers 429 to a client that waits
                # for each answer (the API path's delay= slows such a client instead).
                conn.request(
                    "GET", "/healthz", headers={"Host": LEGACY_HOST, "User-Agent": "flood"}
                )
                response = conn.getresponse()
                response.read()
                sent[response.status] = sent.get(response.status, 0) + 1
            logged = _lines_with((stack.logs / "authsvc-access.log").read_text(), '"flood"')
            if any(" 429 " in line for line in logged):
                break
    finally:
        conn.close()
    assert set(sent) == {404, 429} and sent[404] > 0, sent
    # nginx writes a line once the answer is sent: wait for the last ones.
    deadline = time.monotonic() + 5
    while True:
        logged = _lines_with((stack.logs / "authsvc-access.log").read_text(), '"flood"')
        logged_429 = sum(" 429 " in line for line in logged)
        if len(logged) - logged_429 >= sent[404] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(logged) - logged_429 == sent[404], "every answer that is not a 429 is logged"
    assert 0 < logged_429 <= sent[429] / 10, (logged_429, sent)

    # Unknown host names: nginx drops the connection (444), each a new connection.
    dropped = 0
    for _ in range(5000):
        with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
            stack.request(
                "http",
                "/",
                host="unknown.authsvc.test",
                source=source,
                headers={"User-Agent": "drop"},
            )
        dropped += 1
        if dropped % 250 == 0 and '"drop"' in (stack.logs / "authsvc-access.log").read_text():
            break
    logged_444 = len(_lines_with((stack.logs / "authsvc-access.log").read_text(), '"drop"'))
    assert 0 < logged_444 <= dropped / 10, (logged_444, dropped)


def test_an_unparsable_request_line_is_logged_without_its_text(stack):
    """The probe: " and ' before the secrets and a raw non-ASCII byte pass nginx; gunicorn
    refuses the line and logs only the kind of error, never the line."""
    line = (
        f"GET /api/authenticate.json?q=\"x'&user_id={stack.user_id}&api_key={stack.api_key}"
        f"&game_auth_token={stack.token}&z=\xff HTTP/1.1"
    ).encode("latin-1")
    with socket.create_connection(
        ("127.0.0.1", stack.http_port), timeout=10
    ) as sock:  # through nginx
        sock.sendall(line + f"\r\nHost: {LEGACY_HOST}\r\nConnection: close\r\n\r\n".encode())
        while sock.recv(65536):
            pass
    _unix_exchange(stack, line + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
    log = wait_for_log(stack, "gunicorn-error.log", ["invalid request line (text withheld)"])
    assert len(_lines_with(log, "invalid request line (text withheld)")) >= 2, log[-2000:]
    for secret in (stack.api_key, stack.token):
        assert secret not in log
    assert "api_key=" not in log and "game_auth_token=" not in log
    assert 'File "<redacted>"' not in log  # traceback frames, if any, stay readable


def test_slow_service_is_a_json_504(stack):
    """Workers frozen (SIGSTOP) past UPSTREAM_TIMEOUT (2 s here): nginx's 504, in JSON."""
    workers = stack.gunicorn_worker_pids()
    assert workers
    for pid in workers:
        os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        answer = stack.request("https", stack.api_query())
        assert answer.status == 504, answer.body
        _error_shape(answer, 504)
        assert 1.5 < time.monotonic() - started < 9
    finally:
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
    assert stack.request("https", stack.api_query()).status == 200


@pytest.fixture
def own_stack(tmp_path):
    """A stack of this test's own, for a test that breaks it (the store, or gunicorn)."""
    s = start_stack(tmp_path)
    yield s
    stop(s.nginx)
    stop(s.gunicorn)


def test_unreadable_store_is_a_503_from_the_app_logged_without_the_query(own_stack):
    """The store breaks under a running service (here: its file zeroed after a write):
    the app answers 503 in JSON through nginx, and its "authsvc" logger reaches
    gunicorn's error log."""
    stack = own_stack
    assert stack.request("https", stack.api_query()).status == 200
    subprocess.run(
        [sys.executable, "-m", "authsvc.cli.command", "player", "add", "9001", "bob"],
        env=stack.env,
        check=True,
        capture_output=True,
        timeout=60,
    )  # new WAL frames: readers re-read
    store = stack.env["AUTHSVC_STORE"].removeprefix("sqlite://")
    fd = os.open(store, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes(os.path.getsize(store)), 0)
    finally:
        os.close(fd)
    for scheme in ("https", "http"):
        answer = stack.request(scheme, stack.api_query())
        assert answer.status == 503, (scheme, answer.body)
        _error_shape(answer, 503)
        assert answer.json()["error_description"] == "Service temporarily unavailable, try again"
        assert "X-Authsvc-Result" not in answer.headers, (
            answer.headers
        )  # the app's own 503: stripped too
    log = wait_for_log(
        stack,
        "gunicorn-error.log",
        ["[WARNING] authsvc: store unavailable on /api/authenticate.json"],
    )
    access = (stack.logs / "authsvc-access.log").read_text()
    assert "upstream=503" in access  # the app's answer, passed through
    assert " result=503 reason=store_unavailable game=none user=- " in access, access[-2000:]
    assert stack.api_key not in log
    assert_no_log_holds_a_secret(stack)


def test_502_is_json_then_no_log_holds_a_secret(own_stack):
    """Stop gunicorn, see nginx's 502 in JSON, then read every log of this stack."""
    stack = own_stack
    assert stack.request("https", stack.api_query()).status == 200
    assert stack.request("https", stack.api_query(), method="DELETE").status == 405
    stop(stack.gunicorn)
    for scheme in ("https", "http"):
        answer = stack.request(scheme, stack.api_query())
        assert answer.status == 502, scheme
        _error_shape(answer, 502)
    # A non-API legacy path with the key in its query string (redirected, logged).
    assert stack.request("http", "/old/page?api_key=" + stack.api_key).status == 301
    # The query in the path (a percent-encoded '?'): 404 on the HTTPS host, 301 on the legacy one.
    encoded = stack.api_query().replace("?", "%3F", 1)
    assert stack.request("https", encoded).status == 404
    assert stack.request("http", encoded).status == 301

    access = wait_for_log(stack, "authsvc-access.log", [" 502 ", " 404 "])
    for status in (" 200 ", " 301 ", " 404 ", " 405 ", " 502 "):
        assert status in access, f"this test should have logged a{status}answer"
    assert "GET /api/authenticate.json HTTP/1.1" in access and "GET <other> HTTP/1.1" in access
    assert (
        " result=405 reason=- game=- user=- " in access and " result=200 reason=success " in access
    )
    assert_no_log_holds_a_secret(stack)


def assert_no_log_holds_a_secret(stack) -> None:
    """No secret, no credential parameter, no body in any log nginx and gunicorn wrote."""
    logs = stack.log_texts()
    assert "Invalid credentials" not in logs.get(
        "authsvc-access.log", ""
    )  # bodies are not logged either
    assert logs.get("nginx-default-access.log", "") == ""  # every server has its own format
    secrets = {
        "api key": stack.api_key,
        "other api key": stack.other_api_key,
        "token": stack.token,
        "token secret": stack.token_secret,
    }
    for name, text in logs.items():
        for what, value in secrets.items():
            assert value not in text, f"{what} found in {name}"
        assert "api_key=" not in text and "game_auth_token=" not in text, name
        assert 'File "<redacted>"' not in text, name
    # The record's fields (from the app's X-Authsvc-Result) hold only a code, a reason word and ids:
    # never a client's text (CRAFTED_USER), a key or a token.
    for line in logs.get("authsvc-access.log", "").splitlines():
        fields = NGINX_LINE.match(line)
        assert fields, line
        assert fields["reason"] in (*REASONS, "-"), line
        assert "forged-user-text" not in line, line
