"""Prometheus metrics at ``GET /metrics``, with the optional extra ``authsvc[metrics]``
(prometheus_client).

Without the extra nothing here is imported by the core and ``/metrics`` is the
JSON 404 (``create`` returns None). With it, under gunicorn, every worker counts
into its own files in ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's
multiprocess mode, set up and cleaned by deploy/gunicorn.conf.py), and a scrape
answered by any worker sums them all; a worker that dies leaves its files, so no
count is lost or doubled. Without that variable (one process: tests,
``scripts/serve`` sets one) the counts are this process's.

Label cardinality is bounded by the number of games: ``game`` is a game id, or
``none`` when no game has the api key (never a label per unknown key).
The hot path is one dict lookup and prometheus_client's own inc or observe per metric
(BENCHMARKS.md, "Metrics cost"; writing its multiprocess files directly saved too little to pay
for its internals: "Internals"). docs/operations.md, "Monitoring".
"""

from __future__ import annotations

import glob
import logging
import math
import os
import platform
import time
from collections.abc import Callable
from typing import Any

from authsvc import release
from authsvc.errors import StoreUnavailable
from authsvc.store.base import Reader

# Seconds. An authentication takes tens of µs in-process, a few ms across a network store.
log = logging.getLogger("authsvc")

# The text format every Prometheus 2.x reads (generate_latest writes it; newer clients label it
# 1.0.0).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def create(store: Reader, clock=time.time) -> Metrics | None:
    """The metrics, or None without prometheus_client (the ``metrics`` extra)."""
    try:
        from prometheus_client import values
    except ImportError:
        return None
    if getattr(values.ValueClass, "_multiprocess", False) and not os.environ.get(
        "PROMETHEUS_MULTIPROC_DIR"
    ):
        log.warning(
            "metrics off: prometheus_client is in multiprocess mode but PROMETHEUS_MULTIPROC_DIR "
            "is unset"
        )
        return None
    return Metrics(store, clock)


class Metrics:
    def __init__(self, store: Reader, clock=time.time):
        from prometheus_client import CollectorRegistry, Counter, Histogram, values

        self.store = store
        self.clock = clock
        # Multiprocess when prometheus_client chose it, at its import (the variable set then).
        multiprocess = getattr(values.ValueClass, "_multiprocess", False)
        self.multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") if multiprocess else None
        self.registry = CollectorRegistry(auto_describe=True)
        self.authentications = Counter(
            "authsvc_authentications",
            "Authentications by game id (none: no game has the key) and reason (docs/logs.md).",
            ["game", "result"],
            registry=self.registry,
        )
        self.durations = Histogram(
            "authsvc_request_duration_seconds",
            "Time the app took to answer, by route.",
            ["route"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.store_unavailable_counter = Counter(
            "authsvc_store_unavailable",
            "Answers of 503 because the store did not answer.",
            registry=self.registry,
        )
        self.server_errors = Counter(
            "authsvc_server_errors",
            "Answers of 5xx by the app, by route and code (503: the store; 500: a bug).",
            ["route", "code"],
            registry=self.registry,
        )
        self.authentication, self.request = self._counters()
        self.extra = StoreCollector(store, clock)
        if self.multiprocess_dir is None:
            self.registry.register(self.extra)

    def _auth_child(self, game_id: int | None, reason: str):
        return self.authentications.labels("none" if game_id is None else str(game_id), reason)

    def _counters(self) -> tuple[Callable[[int | None, str], None], Callable[[str, float], None]]:
        """authentication(game_id, reason) and request(route, seconds): prometheus_client's own inc
        and observe of label children cached per (game, reason) and per route."""
        auth_children: dict[tuple[int | None, str], Any] = {}
        route_children: dict[str, Any] = {}

        def authentication(game_id: int | None, reason: str) -> None:
            child = auth_children.get((game_id, reason))
            if child is None:
                child = auth_children[game_id, reason] = self._auth_child(game_id, reason)
            child.inc()

        def request(route: str, seconds: float) -> None:
            child = route_children.get(route)
            if child is None:
                child = route_children[route] = self.durations.labels(route)
            child.observe(seconds)

        return authentication, request

    def store_unavailable(self) -> None:
        self.store_unavailable_counter.inc()

    def server_error(self, route: str, code: int) -> None:
        self.server_errors.labels(route, str(code)).inc()

    def exposition(self) -> tuple[bytes, str]:
        """(the text exposition format of every worker's metrics, its content type)."""
        from prometheus_client import CollectorRegistry, generate_latest

        registry = self.registry
        if self.multiprocess_dir is not None:
            registry = CollectorRegistry()
            registry.register(WorkerFiles(self.multiprocess_dir))
            registry.register(self.extra)
        return generate_latest(registry), CONTENT_TYPE


class WorkerFiles:
    """prometheus_client's MultiProcessCollector without the files that hold nothing yet.

    prometheus_client creates a worker's file and only then sizes it, and fails reading a
    file in between (empty: no header), failing the whole scrape: a scrape at the moment a
    worker writes its first value would be a 500, and one killed at that moment would leave
    an empty file that fails every scrape until the service restarts. A file shorter than
    its 8-byte header has no value in it; files only grow, so skipping it loses nothing.
    """

    HEADER_BYTES = 8

    def __init__(self, path: str):
        self.path = path

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.multiprocess import MultiProcessCollector

        files = []
        for path in glob.glob(os.path.join(self.path, "*.db")):  # as MultiProcessCollector.collect
            try:
                if os.path.getsize(path) >= self.HEADER_BYTES:
                    files.append(path)
            except FileNotFoundError:
                continue  # removed since the listing (prometheus_client's mark_process_dead)
        return MultiProcessCollector.merge(files, accumulate=True)


class StoreCollector:
    """Read at each scrape, by the worker that answers it: build info, and per enabled game the
    expiry time of its newest live api key (+Inf when it has none; in the past when every key has
    expired)."""

    def __init__(self, store: Reader, clock=time.time):
        self.store = store
        self.clock = clock

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        info = GaugeMetricFamily(
            "authsvc_build_info",
            "Version of authsvc and of Python; always 1.",
            labels=["version", "python"],
        )
        info.add_metric([release(), platform.python_version()], 1)
        yield info
        expiry = GaugeMetricFamily(
            "authsvc_api_key_expiry_timestamp_seconds",
            "Per enabled game: unix time its newest live api key expires (+Inf: never).",
            labels=["game"],
        )
        try:
            games = self.store.list_games()
        except StoreUnavailable:
            return  # the 503s of the same outage are counted; the gauge is absent meanwhile
        retiring = GaugeMetricFamily(
            "authsvc_api_key_next_expiry_timestamp_seconds",
            "Per enabled game: unix time its next live api key expires, the one a rotation retires "
            "(+Inf: none).",
            labels=["game"],
        )
        now = self.clock()
        for game in games:
            if not game.enabled or not game.keys:
                continue
            live = [k for k in game.keys if k.expires_at is None or k.expires_at > now]
            newest = max(live or game.keys, key=lambda k: (k.created_at, k.expires_at or math.inf))
            expiry.add_metric(
                [str(game.id)], math.inf if newest.expires_at is None else float(newest.expires_at)
            )
            ends = [k.expires_at for k in live if k.expires_at is not None]
            retiring.add_metric([str(game.id)], float(min(ends)) if ends else math.inf)
        yield expiry
        yield retiring
