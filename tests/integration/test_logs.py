"""What the app gives the logs (docs/logs.md): route names, never a client's path; the
result code for the access logs (X-Authsvc-Result); one "store unavailable" line per 10 s.

The same through the real nginx + gunicorn stack: tests/integration/test_deploy.py.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import webtest

from authsvc.store import open_store
from authsvc.web.app import App, LogThrottle, route_name
from tests.deploy_support import start_stack, stop
from tests.support import skip_or_fail

KEY = "9e258f6c-a232-442b-8d2d-f22da9c19d49"


def test_route_names():
    assert route_name("/api/authenticate.json") == "/api/authenticate.json"
    assert route_name("/healthz") == "/healthz"
    assert route_name("/readyz") == "/readyz"
    assert route_name(f"/api/authenticate.json?api_key={KEY}") == "<other>"
    assert route_name(None) == "<other>"
    assert route_name("") == "<other>"
    assert route_name("/") == "<other>"


@pytest.mark.parametrize(
    "path", ["//api/authenticate.json", "/api//authenticate.json", "/api/authenticate.json/"]
)
def test_route_names_of_the_api_path_with_repeated_or_trailing_slashes(path):
    """The app answers these like the API path (docs/api.md), so the logs name them so."""
    assert route_name(path) == "/api/authenticate.json"
    assert route_name(f"{path}?api_key={KEY}") == "<other>"
    assert route_name(path + "x") == "<other>"


# -- X-Authsvc-Result: the result code (docs/api.md) for the access logs ----------------


@pytest.mark.engine("sqlite")
@pytest.mark.parametrize("error_status", ["200", "http"])
def test_every_answer_carries_its_result_code(world, error_status):
    settings = dataclasses.replace(world.settings, error_status=error_status)
    app = webtest.TestApp(
        App(settings, open_store(settings.store, readonly=True, settings=settings)), lint=True
    )
    wire = (lambda code: 200) if error_status == "200" else (lambda code: code)
    cases = [
        (world.params(), 200, 200),
        (world.params(game_auth_token="0" * 64), 403, wire(403)),
        (world.params(api_key=None), 400, wire(400)),
    ]
    for params, result, status in cases:
        res = app.get("/api/authenticate.json", params=params, status=status)
        assert res.headers["X-Authsvc-Result"] == str(result)
        assert res.json.get("error", 200) == result
    assert app.get("/nope", status=404).headers["X-Authsvc-Result"] == "404"
    assert app.delete("/api/authenticate.json", status=405).headers["X-Authsvc-Result"] == "405"
    assert app.get("/healthz").headers["X-Authsvc-Result"] == "200"
    app.app.store.close()


# -- access_record = "edge": the record rides X-Authsvc-Result to nginx's line ----------

NGINX = {"REMOTE_ADDR": "127.0.0.1"}  # a peer of forwarded_allow_ips (the default): nginx
DIRECT = {"REMOTE_ADDR": "203.0.113.9"}  # any other peer: a client that reaches the app itself
# Spaces, quotes, a newline, a forged field: the user id is malformed, and none of it may be echoed.
CRAFTED_USER = '4242 reason=success game=1 user=1"\nx'


def _edge_app(world, **overrides):
    settings = dataclasses.replace(world.settings, access_record="edge", **overrides)
    return webtest.TestApp(
        App(settings, open_store(settings.store, readonly=True, settings=settings)), lint=True
    )


@pytest.mark.engine("sqlite")
def test_at_the_edge_the_record_rides_the_result_header_and_the_app_writes_no_line(world, caplog):
    app = _edge_app(world)
    game, user = world.game_id, world.user_id
    cases = [
        (world.params(), f"200 reason=success game={game} user={user}"),
        (world.params(game_auth_token="0" * 64), f"403 reason=wrong_token game={game} user={user}"),
        (world.params(api_key=KEY), f"403 reason=unknown_key game=none user={user}"),
        (world.params(user_id="999"), f"403 reason=unknown_player game={game} user=999"),
        (world.params(api_key=None), "400 reason=missing_parameters game=none user=-"),
        (world.params(user_id=CRAFTED_USER), "403 reason=malformed game=none user=-"),
    ]
    with caplog.at_level(logging.DEBUG, logger="authsvc"):
        for params, record in cases:
            # A client's own X-Authsvc-Result is a request header: never read, never echoed.
            res = app.get(
                "/api/authenticate.json",
                params=params,
                extra_environ=NGINX,
                headers={"X-Authsvc-Result": "200 reason=success game=1 user=1"},
            )
            assert res.headers["X-Authsvc-Result"] == record, params
        assert app.get("/healthz", extra_environ=NGINX).headers["X-Authsvc-Result"] == "200"
        assert (
            app.get("/nope", status=404, extra_environ=NGINX).headers["X-Authsvc-Result"] == "404"
        )
        # An IPv4 peer of a dual-stack socket is that IPv4 address; gunicorn's REMOTE_ADDR over the
        # unix socket is no address: nginx too.
        res = app.get(
            "/api/authenticate.json",
            params=world.params(),
            extra_environ={"REMOTE_ADDR": "::ffff:127.0.0.1"},
        )
        assert res.headers["X-Authsvc-Result"] == f"200 reason=success game={game} user={user}"
        res = app.get(
            "/api/authenticate.json", params=world.params(), extra_environ={"REMOTE_ADDR": ""}
        )
        assert res.headers["X-Authsvc-Result"] == f"200 reason=success game={game} user={user}"
    assert caplog.records == [], caplog.text
    app.app.store.close()


@pytest.mark.engine("sqlite")
def test_at_the_edge_a_client_that_reaches_the_app_itself_gets_the_code_only_and_the_auth_line(
    world, caplog
):
    """The reason is never on the wire (docs/api.md): only nginx, which strips the header, gets
    it."""
    app = _edge_app(world)
    with caplog.at_level(logging.INFO, logger="authsvc.auth"):
        res = app.get(
            "/api/authenticate.json",
            params=world.params(game_auth_token="0" * 64),
            extra_environ=DIRECT,
        )
    assert res.headers["X-Authsvc-Result"] == "403"
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("auth rid=- host=legacy ") and " reason=wrong_token " in line, line
    app.app.store.close()


@pytest.mark.engine("sqlite")
def test_with_the_app_record_the_header_is_the_code_and_the_auth_line_is_written(world, caplog):
    app = webtest.TestApp(
        App(
            world.settings, open_store(world.settings.store, readonly=True, settings=world.settings)
        ),
        lint=True,
    )
    assert world.settings.access_record == "app"
    with caplog.at_level(logging.INFO, logger="authsvc.auth"):
        res = app.get(
            "/api/authenticate.json", params=world.params(user_id=CRAFTED_USER), extra_environ=NGINX
        )
    assert res.headers["X-Authsvc-Result"] == "403"
    [line] = [r.getMessage() for r in caplog.records]
    assert " user=- reason=malformed " in line and "\n" not in line and '"' not in line, line
    app.app.store.close()


@pytest.mark.engine("sqlite")
def test_at_the_edge_an_outage_503_carries_its_reason(world, settings, tmp_path):
    path = settings.store.removeprefix("sqlite://")
    params = world.params()
    world.store.close()
    app = _edge_app(world)
    os.rename(path, tmp_path / "moved.db")
    res = app.get("/api/authenticate.json", params=params, status=503, extra_environ=NGINX)
    assert res.headers["X-Authsvc-Result"] == "503 reason=store_unavailable game=none user=-"
    app.app.store.close()


# -- "store unavailable": at most one line per 10 s per worker --------------------------


def test_log_throttle_counts_what_it_holds_back():
    now = [100.0]
    throttle = LogThrottle(10.0, lambda: now[0])
    assert throttle.allow() == 0
    assert [throttle.allow() for _ in range(5)] == [None] * 5
    now[0] = 109.9
    assert throttle.allow() is None
    now[0] = 110.0
    assert throttle.allow() == 6
    now[0] = 125.0
    assert throttle.allow() == 0


@pytest.mark.engine("sqlite")
def test_a_store_outage_logs_one_line_per_ten_seconds(world, settings, tmp_path, caplog):
    path = settings.store.removeprefix("sqlite://")
    params = world.params()
    world.store.close()
    now = [1000.0]
    app = webtest.TestApp(
        App(
            settings,
            open_store(settings.store, readonly=True, settings=settings),
            monotonic=lambda: now[0],
        ),
        lint=True,
    )
    os.rename(path, tmp_path / "moved.db")
    with caplog.at_level(logging.WARNING, logger="authsvc"):
        for _ in range(50):
            app.get("/api/authenticate.json", params=params, status=503)
            now[0] += 0.1  # 50 requests in 5 s: one line
        assert [r.getMessage() for r in caplog.records] == [
            "store unavailable on /api/authenticate.json"
        ]
        now[0] += 5.0
        for _ in range(3):
            res = app.get("/readyz", status=503)
        assert res.headers["X-Authsvc-Result"] == "503"
        assert [r.getMessage() for r in caplog.records][1:] == [
            "store unavailable on /readyz (49 more since the last such line)"
        ]
    assert KEY not in caplog.text and params["api_key"] not in caplog.text
    app.app.store.close()


# -- the brute-force alert of docs/logs.md, run as documented on a real nginx log -----


def documented_alert() -> str:
    """The alert command exactly as docs/logs.md gives it (its "Alerts" section)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "logs.md").read_text()
    section = text.split("## Alerts: a brute-force run", 1)[1].split("\n## ", 1)[0]
    (command,) = re.findall(r"```sh\n(awk .*?)```", section, re.S)
    assert "/var/log/nginx/authsvc-access.log" in command, command
    return command


@pytest.mark.slow
def test_the_documented_brute_force_alert_fires_on_a_real_access_log(tmp_path):
    """60 wrong tokens from one address, one of them retried on a second app host (a longer
    upstream= and addr=), must be counted; 60 successes whose user agent holds
    " result=403 " must not (the agent comes after the real result=)."""
    awk = shutil.which("awk")
    if awk is None:
        skip_or_fail("awk is not installed")
    stack = start_stack(tmp_path, values={"RATE": "1000r/s"}, extra_app_hosts=1)
    try:
        bad = stack.api_query(game_auth_token="0" * 64)
        # The second app host goes away: the next authentication nginx sends it fails to
        # connect and is retried on the unix socket (upstream=502, 200).
        ((_, other_host),) = stack.app_hosts
        stop(other_host)
        for _ in range(60):
            answer = stack.request("http", bad, source="127.0.0.7", headers={"User-Agent": "guess"})
            assert answer.json()["error"] == 403, answer.body
        for _ in range(60):
            answer = stack.request(
                "http",
                stack.api_query(),
                source="127.0.0.8",
                headers={"User-Agent": "x result=403 y"},
            )
            assert answer.json()["success"] is True, answer.body
        log = stack.logs / "authsvc-access.log"
        deadline = time.monotonic() + 10
        while log.read_text().count('"x result=403 y"') < 60:  # nginx logs as each answer ends
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        text = log.read_text()
        assert re.search(
            r'upstream=502, 200 .* addr="127\.0\.0\.1:\d+, unix:.*" result=403 reason=wrong_token '
            r'game=\d+ user=\d+ "guess"',
            text,
        ), text
        command = documented_alert().replace(
            "/var/log/nginx/authsvc-access.log", shlex.quote(str(log))
        )
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split("\n") == ["60 127.0.0.7", ""], done.stdout
    finally:
        stop(stack.nginx)
        stop(stack.gunicorn)
        for _, proc in stack.app_hosts:
            stop(proc)
