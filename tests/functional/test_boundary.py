"""The one error boundary (authsvc/web/app.py): whatever fails inside the app (the store, the
metrics, the logger, or all three at once), the WSGI callable calls ``start_response`` once
and answers in the JSON shape of docs/api.md; no exception ever leaves it for the server.

Driven directly, as any WSGI server would call it, without gunicorn's JSON worker
(authsvc/serving/workers.py) in between. When only the metrics or the logging fail, the
answer is the one the request would get anyway (docs/operations.md, "Monitoring").

Under gunicorn: a scrape while a worker is creating its metrics files.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import urllib.parse
import wsgiref.util
import wsgiref.validate

import pytest

from authsvc.errors import StoreUnavailable
from authsvc.store import open_store
from authsvc.web.app import App
from tests.support import (
    ERROR_KEYS,
    INVALID,
    MISSING,
    PATH,
    free_port,
    get_text,
    skip_or_fail,
    start_gunicorn,
    wait_for_port,
)

pytestmark = pytest.mark.engine("sqlite")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JSON_TYPE = "application/json; charset=utf-8"
EXPOSITION = b"# HELP up 1\n"


def error(code: int, description: str) -> dict:
    return {"success": False, "error": code, "error_description": description}


INTERNAL = error(500, "Internal server error")
UNAVAILABLE = error(503, "Service temporarily unavailable, try again")


class FailingMetrics:
    """Metrics whose every method raises (a bug, a full disk under the metrics files)."""

    def __getattr__(self, name):
        def fail(*args, **kwargs):
            raise RuntimeError(f"metrics: {name} failed")

        return fail


class ScrapeOnlyMetrics(FailingMetrics):
    """The scrape works; counting it afterwards does not."""

    def exposition(self):
        return EXPOSITION, "text/plain; version=0.0.4; charset=utf-8"


class FailingStore:
    """A store whose every method raises ``error``."""

    def __init__(self, error: Exception):
        self.error = error

    def __getattr__(self, name):
        def fail(*args, **kwargs):
            raise self.error

        return fail


class FailingHandler(logging.Handler):
    def emit(self, record):
        raise RuntimeError("the log is broken")


@pytest.fixture
def failing_logger():
    """Every line of the app's loggers ("authsvc", "authsvc.auth") raises, the auth lines
    included."""
    logger = logging.getLogger("authsvc")
    handler, level = FailingHandler(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield
    logger.removeHandler(handler)
    logger.setLevel(level)


def call(app, path: str, query: str = "", method: str = "GET") -> tuple[int, dict, bytes]:
    """One request straight to the WSGI callable (wsgiref's checker around it): (status, headers,
    body); fails unless start_response was called exactly once."""
    environ: dict = {}
    wsgiref.util.setup_testing_defaults(environ)
    environ.update(REQUEST_METHOD=method, PATH_INFO=path, QUERY_STRING=query)
    calls = []

    def start_response(status, headers, exc_info=None):
        calls.append((status, headers))

    result = wsgiref.validate.validator(app)(environ, start_response)
    try:
        body = b"".join(result)
    finally:
        result.close()
    assert len(calls) == 1, calls
    status, headers = calls[0]
    return int(status.split()[0]), dict(headers), body


def call_json(app, path: str, query: str = "", method: str = "GET") -> tuple[int, dict]:
    status, headers, body = call(app, path, query, method)
    assert headers["Content-Type"] == JSON_TYPE and int(headers["Content-Length"]) == len(body)
    answer = json.loads(body)
    assert headers["X-Authsvc-Result"] == str(answer.get("error", 200))
    if not answer["success"]:
        assert set(answer) == ERROR_KEYS
    return status, answer


def real_store(world):
    return open_store(world.settings.store, readonly=True, settings=world.settings)


def requests(world) -> list[tuple[str, str, str, int, dict]]:
    """(method, path, query, HTTP status, answer) of each route when the store answers."""
    return [
        (
            "GET",
            PATH,
            urllib.parse.urlencode(world.params()),
            200,
            {"success": True, "user_id": world.user_id, "username": world.username},
        ),
        (
            "POST",
            PATH,
            urllib.parse.urlencode(world.params(game_auth_token="0" * 64)),
            200,
            INVALID,
        ),
        ("GET", PATH, urllib.parse.urlencode(world.params(api_key=None)), 200, MISSING),
        ("GET", "/healthz", "", 200, {"success": True, "status": "ok"}),
        ("GET", "/readyz", "", 200, {"success": True, "status": "ready"}),
        ("GET", "/nothing", "", 404, error(404, "Not found")),
        ("DELETE", PATH, "", 405, error(405, "Method not allowed")),
    ]


def test_failing_metrics_change_no_answer(world):
    """Every route answers as it would without metrics; the scrape itself is the opaque 500."""
    store = real_store(world)
    app = App(world.settings, store, metrics=FailingMetrics())  # type: ignore[arg-type]
    for method, path, query, status, answer in requests(world):
        assert call_json(app, path, query, method) == (status, answer), (method, path)
    for method in ("GET", "HEAD"):
        status, headers, body = call(app, "/metrics", method=method)
        assert (status, headers["Content-Type"], headers["X-Authsvc-Result"]) == (
            500,
            JSON_TYPE,
            "500",
        )
        assert body == (
            b"" if method == "HEAD" else json.dumps(INTERNAL, separators=(",", ":")).encode()
        )
    store.close()


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_scrape_counted_after_it_is_answered_once(world, method):
    """Counting the scrape fails after the exposition is made: still one 200 with the exposition."""
    store = real_store(world)
    app = App(world.settings, store, metrics=ScrapeOnlyMetrics())  # type: ignore[arg-type]
    status, headers, body = call(app, "/metrics", method=method)
    assert (status, headers["Content-Type"]) == (200, "text/plain; version=0.0.4; charset=utf-8")
    assert body == (b"" if method == "HEAD" else EXPOSITION) and headers["Content-Length"] == str(
        len(EXPOSITION)
    )
    store.close()


def test_a_failing_logger_changes_no_answer(world, failing_logger):
    store = real_store(world)
    app = App(world.settings, store)
    for method, path, query, status, answer in requests(world):
        assert call_json(app, path, query, method) == (status, answer), (method, path)
    store.close()


@pytest.mark.parametrize(
    ("store_error", "status", "answer"),
    [
        (RuntimeError("a bug"), 500, INTERNAL),
        (StoreUnavailable("down"), 503, UNAVAILABLE),
    ],
    ids=["bug", "outage"],
)
@pytest.mark.parametrize("metrics", [None, FailingMetrics()], ids=["no-metrics", "failing-metrics"])
def test_a_failing_store_with_failing_metrics_and_logger_is_still_json(
    world, failing_logger, store_error, status, answer, metrics
):
    """The store fails, and so does everything the error branches call to count and log it."""
    app = App(world.settings, FailingStore(store_error), metrics=metrics)  # type: ignore[arg-type]
    for path, query in ((PATH, urllib.parse.urlencode(world.params())), ("/readyz", "")):
        for method in ("GET", "HEAD"):
            status_got, headers, body = call(app, path, query, method)
            assert (status_got, headers["Content-Type"], headers["X-Authsvc-Result"]) == (
                status,
                JSON_TYPE,
                str(status),
            )
            if method == "GET":
                assert json.loads(body) == answer
    assert call_json(app, "/healthz") == (200, {"success": True, "status": "ok"})


def test_failing_metrics_are_reported_once_per_interval(world, caplog):
    """Not silently: one error line (the exception type and frames, no message) per 10 s, however
    many requests fail to be counted meanwhile."""
    store = real_store(world)
    now = [1000.0]
    app = App(world.settings, store, metrics=FailingMetrics(), monotonic=lambda: now[0])  # type: ignore[arg-type]
    query = urllib.parse.urlencode(world.params())
    with caplog.at_level(logging.INFO, logger="authsvc"):
        for _ in range(5):
            assert call_json(app, PATH, query)[0] == 200
        now[0] += 10
        assert call_json(app, PATH, query)[0] == 200
    lines = [
        r.getMessage() for r in caplog.records if r.name == "authsvc" and r.levelno == logging.ERROR
    ]
    assert len(lines) == 2, lines
    assert (
        lines[0].startswith("metrics or logging failed: RuntimeError\n")
        and "failed\n" not in lines[0]
    ), lines[0]
    assert "more since the last such line" in lines[1]
    for secret in (world.api_key, world.params()["game_auth_token"]):
        assert secret not in caplog.text
    store.close()


def test_a_scrape_while_a_worker_creates_its_metrics_file(env, world, tmp_path):
    """prometheus_client creates a worker's file empty and sizes it a moment later (a worker killed
    in between leaves it empty for good): a scrape that finds such a file still answers, with
    every other worker's counts."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        skip_or_fail("prometheus_client is not installed (pip install -e '.[metrics]')")
    metrics_dir = tmp_path / "metrics"
    env = {**env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    port = free_port()
    proc = start_gunicorn(
        env,
        "--graceful-timeout",
        "5",
        port=port,
        workers=1,
        config=os.path.join(REPO, "deploy", "gunicorn.conf.py"),
    )
    try:
        wait_for_port(port)
        assert get_text(port, PATH + "?" + urllib.parse.urlencode(world.params()))[0] == 200
        (
            metrics_dir / "counter_999999.db"
        ).touch()  # as MmapedDict leaves it between open and truncate
        status, text = get_text(port, "/metrics")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert status == 200, text
    assert f'authsvc_authentications_total{{game="{world.game_id}",result="success"}} 1.0' in text
    assert "unhandled" not in err, err
