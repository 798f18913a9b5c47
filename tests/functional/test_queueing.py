"""An authentication that waited in the queue past AUTHSVC_MAX_QUEUE_WAIT is shed before any store
work.

nginx stamps the time it passed the request on (``X-Request-Start: t=<unix s>.<ms>``);
the app compares it with its own clock (authsvc/web/queueing.py, docs/operations.md
"Login storms"). The WSGI app is driven directly with a fixed clock and a store that
records every call made to it, so "before any store work" is checked, not assumed.
"""

from __future__ import annotations

import dataclasses
import logging
import urllib.parse

import pytest
import webtest

from authsvc.settings import Settings, read_settings
from authsvc.store import open_store
from authsvc.web.app import make_app
from tests.support import FakeClock

pytestmark = pytest.mark.engine("sqlite")

SHED = {
    "success": False,
    "error": 503,
    "error_description": "Service temporarily unavailable, try again",
}


class RecordingStore:
    """The real store, with the name of every method called on it recorded."""

    def __init__(self, store):
        self.store = store
        self.calls: list[str] = []

    def __getattr__(self, name):
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        def record(*args, **kwargs):
            self.calls.append(name)
            return attr(*args, **kwargs)

        return record


@pytest.fixture
def queued(world):
    """(the app on a recording store with the shipped max_queue_wait and a fixed clock, the store,
    the clock)."""
    store = RecordingStore(open_store(world.settings.store, readonly=True, settings=world.settings))
    app = make_app(world.settings, store)
    clock = FakeClock()
    clock.now = 1_800_000_000.0
    app.clock = clock
    yield webtest.TestApp(app, lint=True), store, clock
    store.store.close()


def ask(testapp: webtest.TestApp, world, stamp: str | None):
    headers = {} if stamp is None else {"X-Request-Start": stamp}
    return testapp.get(
        "/api/authenticate.json?" + urllib.parse.urlencode(world.params()),
        headers=headers,
        expect_errors=True,
    )


def test_the_bound_is_read_once_into_settings_and_on_by_default(tmp_path):
    assert Settings.max_queue_wait > 0  # the dataclass default: the declared one
    assert read_settings({"AUTHSVC_MAX_QUEUE_WAIT": "0"})["max_queue_wait"] == 0


def test_a_request_that_waited_past_the_bound_is_503_with_retry_after_before_any_store_call(
    world, queued, caplog
):
    testapp, store, clock = queued
    bound = world.settings.max_queue_wait
    with caplog.at_level(logging.INFO, logger="authsvc"):
        answer = ask(testapp, world, f"t={clock.now - bound - 0.002:.3f}")
    assert answer.status_int == 503
    assert answer.json == SHED
    assert answer.headers["Retry-After"] == "1"
    assert answer.headers["Content-Type"] == "application/json; charset=utf-8"
    assert answer.headers["X-Authsvc-Result"] == "503"
    assert store.calls == []  # answered before any store work
    messages = [r.getMessage() for r in caplog.records]
    assert [
        m
        for m in messages
        if m.startswith("auth ") and "reason=waited_too_long" in m and "game=none" in m
    ]
    assert [m for m in messages if "AUTHSVC_MAX_QUEUE_WAIT" in m]

    # The warning is throttled like the store's: a second shed within the interval writes no second
    # one.
    ask(testapp, world, f"t={clock.now - bound - 1:.3f}")
    assert len([r for r in caplog.records if "AUTHSVC_MAX_QUEUE_WAIT" in r.getMessage()]) == 1
    assert store.calls == []

    # Counted as its own result, with no game (bounded labels); a shed, not a server error.
    metrics = testapp.app.metrics
    if metrics is not None:  # the metrics extra is installed
        text = metrics.exposition()[0].decode()
        assert 'authsvc_authentications_total{game="none",result="waited_too_long"} 2.0' in text, (
            text
        )
        assert "authsvc_server_errors_total{" not in text, text


@pytest.mark.parametrize(
    "stamp",
    [
        "fresh",
        "future",
        "at the bound",
        None,
        "",
        "1800000000.000",
        "t=",
        "t=abc",
        "t=nan",
        "t=inf",
        "t=-5",
        "t=1e3",
        "t=1_000",
        "t= 1000",
        "t=1000.5.5",
        "t=1000;t=1",
        "t=١٠٠٠",
        "t=1000\x00",
    ],
)
def test_a_fresh_future_missing_or_malformed_stamp_is_served(world, queued, stamp):
    testapp, store, clock = queued
    bound = world.settings.max_queue_wait
    stamp = {
        "fresh": f"t={clock.now - bound / 2:.3f}",
        "future": f"t={clock.now + 3600:.3f}",
        "at the bound": f"t={clock.now - bound:.3f}",
    }.get(stamp, stamp)
    if stamp is not None and not stamp.isascii() or stamp and "\x00" in stamp:
        testapp.lint = False  # a header WebTest's lint refuses; a server may still pass it on
    answer = ask(testapp, world, stamp)
    assert answer.status_int == 200, (stamp, answer.body)
    assert answer.json["success"] is True
    assert store.calls  # the store was asked


def test_zero_turns_the_check_off(world):
    settings = dataclasses.replace(world.settings, max_queue_wait=0.0)
    store = open_store(settings.store, readonly=True, settings=settings)
    try:
        testapp = webtest.TestApp(make_app(settings, store), lint=True)
        answer = ask(testapp, world, "t=1000.000")  # decades old
        assert answer.status_int == 200 and answer.json["success"] is True
    finally:
        store.close()


def test_only_the_api_path_is_checked(world, queued):
    """Probes are not authentications: a load balancer must not take a busy, healthy host out."""
    testapp, _, clock = queued
    for path in ("/healthz", "/readyz"):
        answer = testapp.get(path, headers={"X-Request-Start": "t=1000.000"})
        assert answer.status_int == 200


def test_a_request_that_waited_for_a_restart_is_served_its_wait_counted_from_the_start(
    world, queued
):
    """A restart (an upgrade's) holds requests in the socket's backlog until the new app is built:
    that wait is the restart's, not the queue's, and such a request is served (nginx's max_conns
    bounds how many)."""
    testapp, store, clock = queued
    bound = world.settings.max_queue_wait
    testapp.app.serving_since = clock.now - bound / 2  # the app built while the request waited
    assert ask(testapp, world, f"t={clock.now - bound - 1:.3f}").status_int == 200
    # A request that waited past the bound after the start is shed as ever.
    testapp.app.serving_since = clock.now - bound - 0.5
    assert ask(testapp, world, f"t={clock.now - bound - 1:.3f}").json == SHED
