"""authsvc/web/metrics_values.py: the cheaper writes into prometheus_client's multiprocess files.

In process, in prometheus_client's multiprocess mode (as under deploy/gunicorn.conf.py): the
writes give exactly what prometheus_client's own inc/observe give (every bucket bound, +Inf),
a forked child counts into its own file without touching its parent's, and threads neither lose
an increment nor let a scrape see a counter go back. Under gunicorn (sync and gthread workers,
a worker killed): tests/test_metrics.py.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from authsvc.web import metrics_values
from authsvc.web.metrics import BUCKETS, Metrics
from authsvc.web.metrics_values import Writer
from tests.support import skip_or_fail

API = "/api/authenticate.json"


@pytest.fixture
def values(tmp_path, monkeypatch):
    """prometheus_client's value class in multiprocess mode over tmp_path, chosen again as at its import."""
    try:
        from prometheus_client import values
    except ImportError:
        skip_or_fail("prometheus_client is not installed (pip install -e '.[metrics]')")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(values, "ValueClass", values.get_value_class())
    yield values
    values.ValueClass.close_all_files()


def exposition(path) -> dict[str, float]:
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(path))
    out = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def counter_values(path, pid: int) -> dict[str, float]:
    from prometheus_client.mmap_dict import MmapedDict

    return {key: value for key, value, *_ in MmapedDict.read_all_values_from_file(str(path / f"counter_{pid}.db"))}


def test_the_writes_are_prometheus_clients_own(values, tmp_path):
    """The same operations through prometheus_client's API, on metrics of another name, give the same samples."""
    from prometheus_client import CollectorRegistry, Counter, Histogram

    metrics = Metrics(store=None)
    assert metrics.writer is not None, "this prometheus_client must get the cheaper writes (authsvc/web/metrics_values.py)"
    registry = CollectorRegistry()
    ref_auth = Counter("ref_authentications", "", ["game", "result"], registry=registry)
    ref_durations = Histogram("ref_request_duration_seconds", "", ["route"], buckets=BUCKETS, registry=registry)
    # Every bound exactly (le is "less or equal"), between bounds, 0, and above the last (+Inf).
    amounts = [0.0, 1e-6, *BUCKETS, *(b * 1.5 for b in BUCKETS), 7.0]
    for n, amount in enumerate(amounts):
        game, reason = (None, "unknown_key") if n % 3 == 0 else (n % 2 + 1, "success")
        metrics.authentication(game, reason)
        ref_auth.labels("none" if game is None else str(game), reason).inc()
        route = API if n % 4 else "/healthz"
        metrics.request(route, amount)
        ref_durations.labels(route).observe(amount)
    got = exposition(tmp_path)
    ours = {k: v for k, v in got.items() if k.startswith(("authsvc_authentications_total", "authsvc_request_duration"))}
    ref = {k.replace("ref_", "authsvc_", 1): v for k, v in got.items() if k.startswith("ref_")}
    assert ours == ref
    assert ours[f'authsvc_request_duration_seconds_count{{route="{API}"}}'] > 0


def test_the_public_api_without_multiprocess_mode():
    """prometheus_client's in-process values (no PROMETHEUS_MULTIPROC_DIR) are not its mmap ones: no Writer."""
    try:
        from prometheus_client.values import MutexValue
    except ImportError:
        skip_or_fail("prometheus_client is not installed (pip install -e '.[metrics]')")

    assert Writer.of(MutexValue, MutexValue("counter", "x", "x_total", (), (), "")) is None


def test_a_forked_child_counts_into_its_own_file(values, tmp_path):
    """As a gunicorn worker forked from the master (preload): the child's counts go to its own file, the
    parent's stay, and neither overwrites the other (the parent counted before and after the fork)."""
    metrics = Metrics(store=None)
    for _ in range(3):
        metrics.authentication(1, "success")
    pid = os.fork()
    if pid == 0:  # the child: count, then leave without pytest's teardown
        code = 1
        try:
            for _ in range(5):
                metrics.authentication(1, "success")
            metrics.request(API, 0.001)
            code = 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    metrics.authentication(1, "success")
    key = 'authsvc_authentications_total{game="1",result="success"}'
    assert exposition(tmp_path)[key] == 9
    parent = counter_values(tmp_path, os.getpid())
    child = counter_values(tmp_path, pid)
    assert [v for k, v in parent.items() if "authsvc_authentications" in k] == [4]
    assert [v for k, v in child.items() if "authsvc_authentications" in k] == [5]


def test_threads_lose_no_count_and_a_counter_never_goes_back(values, tmp_path, monkeypatch):
    """gthread workers: threads count at once while another reads the worker's file as a scrape
    would; every read is at least the one before it. To make the race likely, each write yields
    to the other threads between computing the new value and writing it (the same bytes)."""
    real_pack = metrics_values._PACK

    def yielding_pack(*numbers):
        packed = real_pack(*numbers)
        time.sleep(0)  # lets another thread run here
        return packed

    monkeypatch.setattr(metrics_values, "_PACK", yielding_pack)
    metrics = Metrics(store=None)
    metrics.authentication(1, "success")
    value = metrics.authentications.labels("1", "success")._value
    threads, each = 4, 1000
    done = threading.Event()
    seen: list[float] = []

    def count():
        for _ in range(each):
            metrics.authentication(1, "success")
            metrics.request(API, 0.25)

    def scrape():
        import struct

        file = value._file
        pos = file._positions[value._key]
        while not done.is_set():
            seen.append(struct.unpack_from("d", file._m, pos)[0])

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        reader = threading.Thread(target=scrape)
        reader.start()
        workers = [threading.Thread(target=count) for _ in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        done.set()
        reader.join()
    finally:
        sys.setswitchinterval(interval)
    went_back = [(a, b) for a, b in zip(seen, seen[1:], strict=False) if b < a]
    assert not went_back, went_back[:5]
    got = exposition(tmp_path)
    assert got['authsvc_authentications_total{game="1",result="success"}'] == 1 + threads * each
    assert got[f'authsvc_request_duration_seconds_count{{route="{API}"}}'] == threads * each
    assert got[f'authsvc_request_duration_seconds_sum{{route="{API}"}}'] == threads * each * 0.25


def test_unfamiliar_internals_fall_back_to_the_public_api(values, tmp_path, monkeypatch, caplog):
    """A prometheus_client whose multiprocess values are not as metrics_values.py expects: a warning,
    and the counts still right, through its public API."""

    class Unfamiliar:
        _multiprocess = True

        def inc(self, amount):
            pass

    assert Writer.of(Unfamiliar, Unfamiliar()) is None
    monkeypatch.setattr(Writer, "of", classmethod(lambda cls, value_class, sample: None))
    metrics = Metrics(store=None)
    assert metrics.writer is None
    assert "counting through its public API" in caplog.text
    for _ in range(3):
        metrics.authentication(None, "unknown_key")
        metrics.request(API, 0.001)
    got = exposition(tmp_path)
    assert got['authsvc_authentications_total{game="none",result="unknown_key"}'] == 3
    assert got[f'authsvc_request_duration_seconds_bucket{{le="0.001",route="{API}"}}'] == 3


def test_a_histogram_child_of_another_shape_is_observed_through_the_public_api(values, tmp_path, monkeypatch):
    """Writer.of checks the counters' values; a histogram whose children a release reshaped (here its
    sum renamed) is observed by prometheus_client itself, and counted right, not a 500 per request."""
    from prometheus_client.metrics import Histogram

    metrics = Metrics(store=None)
    assert metrics.writer is not None
    assert metrics_values._histogram_values(metrics.durations.labels("/healthz"))[0] is not None  # the cheap path

    real_init, real_observe = Histogram._metric_init, Histogram.observe

    def renamed_init(self):
        real_init(self)
        self._total = self.__dict__.pop("_sum")

    def observe(self, amount, exemplar=None):
        self._sum = self._total
        try:
            real_observe(self, amount, exemplar)
        finally:
            del self._sum

    monkeypatch.setattr(Histogram, "_metric_init", renamed_init)
    monkeypatch.setattr(Histogram, "observe", observe)
    metrics = Metrics(store=None)
    assert metrics.writer is not None  # the counters are as expected
    for _ in range(3):
        metrics.request(API, 0.001)
    got = exposition(tmp_path)
    assert got[f'authsvc_request_duration_seconds_bucket{{le="0.001",route="{API}"}}'] == 3
    assert got[f'authsvc_request_duration_seconds_sum{{route="{API}"}}'] == pytest.approx(0.003)
