"""The shipped nginx site and gunicorn config, as systemd would run them (tests/deploy_support.py):
/metrics, /healthz and /readyz on the monitoring server only (METRICS_LISTEN, loopback), the
JSON 404 for them on the game-facing hosts (docs/operations.md, "Monitoring")."""

from __future__ import annotations

import http.client
import json
import re
import selectors
import socket
import time

import pytest

from harness.processes import stop
from tests.deploy_support import forty_client_headers, start_stack
from tests.support import skip_or_fail

NOT_FOUND = {"success": False, "error": 404, "error_description": "Not found"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        skip_or_fail("prometheus_client is not installed (pip install -e '.[metrics]')")
    s = start_stack(tmp_path_factory.mktemp("monitoring"))
    yield s
    stop(s.nginx)
    stop(s.gunicorn)


def monitor(stack, path: str) -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", stack.metrics_port, timeout=10)
    try:
        conn.request("GET", path)
        res = conn.getresponse()
        return res.status, res.getheader("Content-Type", ""), res.read().decode()
    finally:
        conn.close()


@pytest.mark.parametrize("path", ["/metrics", "/healthz", "/readyz", "/metrics/"])
def test_game_facing_hosts_answer_the_json_404(stack, path):
    for scheme in ("https", "http"):
        answer = stack.request(scheme, path)
        assert answer.status == 404 and answer.json() == NOT_FOUND, (
            scheme,
            path,
            answer.status,
            answer.body,
        )


def test_the_monitoring_server_serves_metrics_and_probes(stack):
    for _ in range(3):
        assert (
            stack.request("https", stack.api_query(game_auth_token="0" * 64)).json()["error"] == 403
        )
    assert stack.request("http", stack.api_query()).json()["success"] is True
    status, content_type, text = monitor(stack, "/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4"), (status, text)
    counts = {
        (game, result): float(value)
        for game, result, value in re.findall(
            r'authsvc_authentications_total\{game="(\d+|none)",result="([a-z_]+)"\} (\S+)', text
        )
    }
    assert counts[str(stack.game_id), "wrong_token"] == 3
    assert counts[str(stack.game_id), "success"] == 1
    assert monitor(stack, "/healthz")[0] == 200
    assert monitor(stack, "/readyz")[0] == 200
    status, _, body = monitor(stack, "/api/authenticate.json")
    assert status == 404 and '"error":404' in body  # the API is not served here
    assert stack.api_key not in text and stack.token not in text


def test_the_record_names_the_host(stack):
    """Behind nginx (access_record = "edge") a request's record is nginx's line: the host asked for,
    nginx's request id, and the app's result, reason, game and user; the app writes no auth line
    (docs/logs.md)."""
    answer = stack.request(
        "https",
        stack.api_query(api_key="4f0c6a4e-0000-4000-8000-000000000000"),
        headers={"User-Agent": "record-host-https"},
    )
    assert answer.json()["error"] == 403
    assert stack.request(
        "http", stack.api_query(), headers={"User-Agent": "record-host-legacy"}
    ).json()["success"]
    deadline = time.monotonic() + 5
    while True:
        log = (stack.logs / "authsvc-access.log").read_text()
        if (
            '"record-host-https"' in log
            and '"record-host-legacy"' in log
            or time.monotonic() > deadline
        ):
            break
        time.sleep(0.05)
    assert re.search(
        r'^\S+ [0-9a-f]{32} 127\.0\.0\.1 "api\.authsvc\.test" .* result=403 reason=unknown_key '
        r'game=none user=4242 "record-host-https"$',
        log,
        re.M,
    ), log[-2000:]
    assert re.search(
        rf'^\S+ [0-9a-f]{{32}} 127\.0\.0\.1 "legacy\.authsvc\.test" .* result=200 reason=success '
        rf'game={stack.game_id} user=4242 "record-host-legacy"$',
        log,
        re.M,
    ), log[-2000:]
    assert " auth rid=" not in (stack.logs / "gunicorn-error.log").read_text()
    assert stack.api_key not in log and stack.token not in log


# What nginx's own headers are on the monitoring server: no X-Request-Start (a probe is never shed).
MONITOR_FORWARDED = {
    "HTTP_HOST",
    "HTTP_X_FORWARDED_FOR",
    "HTTP_X_FORWARDED_PROTO",
    "HTTP_X_REQUEST_ID",
}


def test_only_the_headers_the_app_reads_reach_gunicorn_from_the_monitoring_server(tmp_path):
    """A scraper's or a probe's 40 headers (its own X-Forwarded-*, Forwarded, X-Request-Start among
    them) never reach gunicorn, as on the public hosts (tests/integration/test_deploy.py): only
    nginx's own."""
    s = start_stack(tmp_path, workers=1, app="tests.headers_app:application")
    try:
        extra = forty_client_headers("Prometheus/2.45", "text/plain")
        assert len(extra) == 40
        for path in ("/metrics", "/healthz", "/readyz"):
            conn = http.client.HTTPConnection("127.0.0.1", s.metrics_port, timeout=10)
            try:
                conn.request("GET", path, headers=extra)
                res = conn.getresponse()
                body = res.read()
            finally:
                conn.close()
            assert res.status == 200, (path, res.status, body)
            assert set(json.loads(body)["headers"]) == MONITOR_FORWARDED, (path, body)
    finally:
        stop(s.nginx)
        stop(s.gunicorn)


# -- the monitoring server has the public hosts' connection limits and hides its version --


def rendered_header_timeout(stack) -> float:
    text = (stack.root / "deploy" / "nginx" / "snippets" / "authsvc-limits.conf").read_text()
    return float(re.search(r"^client_header_timeout (\d+)s;", text, re.M).group(1))


def test_the_monitoring_server_does_not_name_its_version(stack):
    for path in ("/healthz", "/nope"):
        conn = http.client.HTTPConnection("127.0.0.1", stack.metrics_port, timeout=10)
        try:
            conn.request("GET", path)
            res = conn.getresponse()
            res.read()
            assert res.getheader("Server") == "nginx", (path, res.getheader("Server"))
        finally:
            conn.close()


def test_a_half_sent_request_on_the_monitoring_server_is_cut_at_the_header_timeout(stack):
    """nginx's default is 60 s; the public hosts' is 5 s (authsvc-limits.conf). Bounded at
    three times the rendered timeout, far below the default, so a slow machine passes."""
    timeout = rendered_header_timeout(stack)
    with socket.create_connection(("127.0.0.1", stack.metrics_port), timeout=10) as sock:
        sock.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n")
        sock.settimeout(3 * timeout)
        started = time.monotonic()
        try:
            data = sock.recv(4096)
        except ConnectionResetError:
            data = b""
        except TimeoutError:
            data = None
        assert data == b"", f"still open after {time.monotonic() - started:.1f} s ({data!r})"


def test_requests_past_the_per_address_limit_on_the_monitoring_server_get_a_json_429(stack):
    """Requests whose body never comes (headers read, so limit_conn counts them): CONN_LIMIT
    of them are held, every one past that is answered 429 at once, in JSON."""
    site = (stack.root / "deploy" / "nginx" / "snippets" / "authsvc-limits.conf").read_text()
    limit = int(re.search(r"^limit_conn authsvc_conn (\d+);", site, re.M).group(1))
    extra = 4
    head = b"POST /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    socks = []
    try:
        for _ in range(limit + extra):
            sock = socket.create_connection(
                ("127.0.0.1", stack.metrics_port), timeout=10, source_address=("127.0.5.1", 0)
            )
            sock.sendall(head)
            socks.append(sock)
        answered = []
        with selectors.DefaultSelector() as sel:
            for sock in socks:
                sel.register(sock, selectors.EVENT_READ)
            deadline = time.monotonic() + 5
            while len(answered) < extra and time.monotonic() < deadline:
                for key, _ in sel.select(0.2):
                    sel.unregister(key.fileobj)
                    answered.append(key.fileobj.recv(65536))
        assert len(answered) == extra, (
            f"{len(answered)} of {extra} requests past the limit answered"
        )
        for raw in answered:
            head_, _, body = raw.partition(b"\r\n\r\n")
            assert head_.startswith(b"HTTP/1.1 429 "), raw[:300]
            assert json.loads(body) == {
                "success": False,
                "error": 429,
                "error_description": "Too many requests, slow down",
            }
    finally:
        for sock in socks:
            sock.close()
