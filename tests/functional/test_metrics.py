"""Prometheus metrics at /metrics (docs/operations.md, "Monitoring"; authsvc/web/metrics.py).

In process (WebTest, one process): counts per game and reason, the histogram per
route, the store-outage counter, the key-expiry gauge, and the JSON 404 without the
extra. Under a real gunicorn with two workers and the shipped config (multiprocess
mode): every scrape, whichever worker answers it, shows the exact counts of all
workers, and a killed worker's counts stay; a process forked after counting (a preloaded
app's worker) counts into its own file. The real Prometheus server:
tests/integration/test_prometheus.py.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import re
import signal
import sys
import time
import urllib.parse

import pytest
import webtest

from authsvc.store import open_store
from authsvc.tokens import api_key_digest, mint_token, new_api_key
from authsvc.web.app import App, make_app
from authsvc.web.metrics import Metrics
from tests import factories
from tests.support import (
    PATH,
    free_port,
    get_text,
    skip_or_fail,
    start_gunicorn,
    until_both_workers_counted,
    wait_for_port,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SQLITE_ONLY = pytest.mark.engine("sqlite")


def samples(text: str) -> dict[str, float]:
    """{'name{labels}': value} of an exposition, comments left out."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def auth_counts(text: str) -> dict[tuple[str, str], float]:
    found = {}
    for name, value in samples(text).items():
        m = re.fullmatch(
            r'authsvc_authentications_total\{game="([^"]+)",result="([a-z_]+)"\}', name
        )
        if m and value:
            found[m[1], m[2]] = value
    return found


@pytest.fixture
def metrics_app(world):
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        skip_or_fail("prometheus_client is not installed (pip install -e '.[metrics]')")
    app = webtest.TestApp(make_app(world.settings), lint=True)
    assert app.app.metrics is not None, "prometheus_client is installed: the app must have metrics"
    yield app
    app.app.store.close()


@pytest.fixture
def multiprocess(tmp_path, monkeypatch):
    """prometheus_client's value class in multiprocess mode over tmp_path, chosen again as at its
    import."""
    try:
        from prometheus_client import values
    except ImportError:
        skip_or_fail("prometheus_client is not installed (pip install -e '.[metrics]')")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(values, "ValueClass", values.get_value_class())
    yield tmp_path
    values.ValueClass.close_all_files()


def scripted_mix(world) -> tuple[list[dict], dict[tuple[str, str], int]]:
    """Requests with each reason that needs no store change, and the counts they must give."""
    game = str(world.game_id)
    mix = [
        (world.params(), (game, "success")),
        (world.params(api_key=None), ("none", "missing_parameters")),
        (world.params(user_id="07"), ("none", "malformed")),
        (world.params(api_key=new_api_key()), ("none", "unknown_key")),
        (
            world.params(
                user_id="4243",
                game_auth_token=mint_token(world.settings.token_secrets[0], world.game_id, 4243, 0),
            ),
            (game, "unknown_player"),
        ),
        (world.params(game_auth_token="0" * 64), (game, "wrong_token")),
    ]
    requests, expected = [], {}
    for n, (params, key) in enumerate(mix):
        for _ in range(n + 1):  # 1, 2, 3, ... of each: a swapped label would show
            requests.append(params)
            expected[key] = expected.get(key, 0) + 1
    return requests, expected


def test_counts_per_game_and_reason(metrics_app, world):
    requests, expected = scripted_mix(world)
    for params in requests:
        metrics_app.get(PATH, params=params)
    res = metrics_app.get("/metrics")
    assert res.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "X-Authsvc-Result" in res.headers
    assert auth_counts(res.text) == expected
    got = samples(res.text)
    assert got['authsvc_request_duration_seconds_count{route="/api/authenticate.json"}'] == len(
        requests
    )
    assert got["authsvc_store_unavailable_total"] == 0
    assert got[f'authsvc_api_key_expiry_timestamp_seconds{{game="{world.game_id}"}}'] == math.inf
    assert any(name.startswith("authsvc_build_info{") for name in got)
    for params in requests:  # no key, token or user id in any label
        for value in (params.get("api_key"), params.get("game_auth_token")):
            assert not value or value not in res.text


def test_the_expiry_gauges(metrics_app, world):
    """Newest live key: +Inf after a rotation (the new key never expires); next expiry: the retired
    key's."""
    now = int(time.time())
    other_id, _ = world.add_game("Go")
    factories.add_api_key(
        world.store, other_id, api_key_digest(new_api_key()), now + 1, now + 3 * 86400
    )
    got = samples(metrics_app.get("/metrics").text)
    for game_id in (world.game_id, other_id):
        assert got[f'authsvc_api_key_expiry_timestamp_seconds{{game="{game_id}"}}'] == math.inf
    assert (
        got[f'authsvc_api_key_next_expiry_timestamp_seconds{{game="{world.game_id}"}}'] == math.inf
    )
    assert (
        got[f'authsvc_api_key_next_expiry_timestamp_seconds{{game="{other_id}"}}']
        == now + 3 * 86400
    )
    factories.set_game_enabled(world.store, other_id, False)
    got = samples(metrics_app.get("/metrics").text)
    assert f'authsvc_api_key_expiry_timestamp_seconds{{game="{other_id}"}}' not in got


@SQLITE_ONLY
def test_store_outage_is_counted(metrics_app, world, tmp_path):
    params = world.params()
    path = world.settings.store.removeprefix("sqlite://")
    world.store.close()
    os.rename(path, tmp_path / "moved.db")
    for _ in range(3):
        metrics_app.get(PATH, params=params, status=503)
    metrics_app.get("/readyz", status=503)
    got = samples(metrics_app.get("/metrics").text)
    assert got["authsvc_store_unavailable_total"] == 4
    assert got['authsvc_server_errors_total{code="503",route="/api/authenticate.json"}'] == 3
    assert got['authsvc_server_errors_total{code="503",route="/readyz"}'] == 1
    assert auth_counts(metrics_app.get("/metrics").text) == {("none", "store_unavailable"): 3}


def test_without_the_extra_metrics_is_the_json_404(world, monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed: import fails
    app = webtest.TestApp(make_app(world.settings), lint=True)
    assert app.app.metrics is None
    assert app.get("/metrics", status=404).json == {
        "success": False,
        "error": 404,
        "error_description": "Not found",
    }
    assert app.get(PATH, params=world.params()).json["success"] is True
    app.app.store.close()


def test_the_core_imports_no_prometheus_client_by_itself(world):
    """authsvc/web/metrics.py imports prometheus_client inside functions only; App() without metrics
    never does."""
    store = open_store(world.settings.store, readonly=True, settings=world.settings)
    app = webtest.TestApp(App(world.settings, store), lint=True)
    assert app.get("/metrics", status=404).json["error"] == 404
    store.close()


# -- under gunicorn, two workers, the shipped config ---------------------------------------


def worker_pids(master_pid: int) -> list[int]:
    with open(f"/proc/{master_pid}/task/{master_pid}/children") as f:
        return [int(p) for p in f.read().split()]


def test_a_forked_child_counts_into_its_own_file(multiprocess):
    """As a gunicorn worker forked from the master (preload): the child's counts go to its own file,
    the parent's stay, and neither overwrites the other (the parent counted before and after the
    fork)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.mmap_dict import MmapedDict
    from prometheus_client.multiprocess import MultiProcessCollector

    metrics = Metrics(store=None)
    for _ in range(3):
        metrics.authentication(1, "success")
    pid = os.fork()
    if pid == 0:  # the child: count, then leave without pytest's teardown
        code = 1
        try:
            for _ in range(5):
                metrics.authentication(1, "success")
            metrics.request("/api/authenticate.json", 0.001)
            code = 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    metrics.authentication(1, "success")
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(multiprocess))
    assert (
        samples(generate_latest(registry).decode())[
            'authsvc_authentications_total{game="1",result="success"}'
        ]
        == 9
    )
    for process, count in ((os.getpid(), 4), (pid, 5)):
        counts = MmapedDict.read_all_values_from_file(str(multiprocess / f"counter_{process}.db"))
        assert [value for key, value, *_ in counts if "authsvc_authentications" in key] == [count]


@SQLITE_ONLY
@pytest.mark.parametrize("threads", [1, 4], ids=["sync", "gthread"])
def test_under_gunicorn_every_scrape_shows_every_workers_counts(env, world, tmp_path, threads):
    """Two workers (sync, or gthread with 4 threads and requests sent 8 at a time), each request on
    a new connection (either worker answers), 10 scrapes that must all show the same exact counts;
    then a worker is killed, replaced, and the counts stay."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        skip_or_fail("prometheus_client is not installed (pip install -e '.[metrics]')")
    metrics_dir = tmp_path / "metrics"
    env = {**env, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir), "AUTHSVC_THREADS": str(threads)}
    requests, expected = scripted_mix(world)
    port = free_port()
    proc = start_gunicorn(
        env,
        "--graceful-timeout",
        "5",
        port=port,
        workers=2,
        config=os.path.join(REPO, "deploy", "gunicorn.conf.py"),
    )
    try:
        wait_for_port(port)
        with concurrent.futures.ThreadPoolExecutor(1 if threads == 1 else 8) as pool:
            list(
                pool.map(
                    lambda params: get_text(port, PATH + "?" + urllib.parse.urlencode(params)),
                    requests * 3,
                )
            )
        expected = {k: v * 3 for k, v in expected.items()}
        expected[str(world.game_id), "success"] += until_both_workers_counted(
            port, world.params(), metrics_dir
        )
        for _ in range(10):
            status, text = get_text(port, "/metrics")
            assert status == 200 and auth_counts(text) == expected, text
        deadline = time.monotonic() + 20
        while len(pids := worker_pids(proc.pid)) != 2:  # the second worker may still be booting
            assert time.monotonic() < deadline and proc.poll() is None, pids
            time.sleep(0.1)
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            now = worker_pids(proc.pid)
            if len(now) == 2 and pids[0] not in now:
                break
            time.sleep(0.1)
        else:
            pytest.fail("gunicorn did not replace the killed worker")
        wait_for_port(port)
        get_text(port, PATH + "?" + urllib.parse.urlencode(world.params()))
        expected[str(world.game_id), "success"] += 1
        for _ in range(5):
            status, text = get_text(port, "/metrics")
            assert status == 200 and auth_counts(text) == expected, text
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert world.api_key not in out + err
