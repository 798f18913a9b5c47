"""``authsvc deliver``'s Prometheus metrics, served at ``AUTHSVC_DELIVER_METRICS`` (host:port) when
set, with the optional extra ``authsvc[metrics]`` (docs/operations.md, section 12).

The deliverer serves them itself: it is the one process that sees each attempt's outcome, and it
reads the store as the admin role (the web role may not read deliveries). Its attempts are counted
as they are written (``authsvc_webhook_delivery_attempts_total{outcome}``, from 0 at each start);
the backlog is read from the store at each scrape, one statement (store/deliveries.py's backlog),
so a deliverer that waits for the lease reports the same backlog as the one that works. Labels: the
webhook's id and fixed words only, never a URL, a secret or a player.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from authsvc.errors import StoreUnavailable
from authsvc.store.base import Store

# An attempt's outcome: delivered, failed with another try to come, failed and given up (24 h).
OUTCOMES = ("delivered", "retry", "failed")


class DeliveryMetrics:
    def __init__(self, store: Store, clock: Callable[[], int] = lambda: int(time.time() * 1000)):
        from prometheus_client import CollectorRegistry, Counter

        self.registry = CollectorRegistry(auto_describe=True)
        self.attempts = Counter(
            "authsvc_webhook_delivery_attempts",
            "POSTs of deliveries by outcome: delivered, retry (failed, tried again later), failed "
            "(given up).",
            ["outcome"],
            registry=self.registry,
        )
        self._children = {
            outcome: self.attempts.labels(outcome) for outcome in OUTCOMES
        }  # 0 from the start
        self.registry.register(Backlog(store, clock))

    def attempt(self, outcome: str) -> None:
        self._children[outcome].inc()

    def serve(self, host: str, port: int):
        """prometheus_client's HTTP server in a daemon thread: ``GET /metrics``; (server,
        thread)."""
        from prometheus_client import start_http_server

        return start_http_server(port, host, registry=self.registry)


class Backlog:
    """Read at each scrape: per live webhook, its pending and failed deliveries and the age of its
    oldest pending one (0 with none). Absent while the store does not answer (the deliverer's log
    says why)."""

    def __init__(self, store: Store, clock: Callable[[], int]):
        self.store = store
        self.clock = clock

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        try:
            rows = self.store.delivery_backlog()
        except StoreUnavailable:
            return
        now = self.clock()
        count = GaugeMetricFamily(
            "authsvc_webhook_deliveries",
            "Per live webhook: its deliveries pending and failed (kept until retention).",
            labels=["webhook", "state"],
        )
        oldest = GaugeMetricFamily(
            "authsvc_webhook_oldest_pending_seconds",
            "Per live webhook: seconds since its oldest pending delivery's event (or retry); "
            "0 with none pending.",
            labels=["webhook"],
        )
        for webhook_id, pending, failed, first in rows:
            count.add_metric([str(webhook_id), "pending"], pending)
            count.add_metric([str(webhook_id), "failed"], failed)
            oldest.add_metric(
                [str(webhook_id)], 0.0 if first is None else max(0, now - first) / 1000
            )
        yield count
        yield oldest
