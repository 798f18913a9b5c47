"""The admin API's per-token rate limit: a token bucket per API token, in each worker process.

``AUTHSVC_ADMIN_RATE`` requests a second per token, in bursts of up to
``AUTHSVC_ADMIN_BURST`` (docs/admin-api.md, "Rate limit"). A request over it is
answered 429 with ``Retry-After`` before its body is read or the store is written.
The buckets live in the process: with N gunicorn workers a token may get up to N
times the rate, and a restart refills them. That is enough for what the limit is
for, keeping one runaway caller from starving the others and the store's writer;
a limit exact across workers would cost a store round trip per request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class RateLimit:
    """Token buckets by API token name; ``rate`` 0 turns the limit off."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (tokens left, when counted)
        self._lock = threading.Lock()  # gthread workers serve requests in threads

    def wait(self, name: str) -> float:
        """0 if the request may run now (and it is counted), else the seconds until it may."""
        if self.rate <= 0:
            return 0.0
        with self._lock:
            now = self.clock()
            tokens, then = self._buckets.get(name, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + max(0.0, now - then) * self.rate)
            if tokens >= 1:
                self._buckets[name] = (tokens - 1, now)
                return 0.0
            self._buckets[name] = (tokens, now)
            return (1 - tokens) / self.rate
