"""The admin API's limits per API token, in each worker process: what one caller may cost the
others.

- A rate: ``AUTHSVC_ADMIN_RATE`` units a second per token, in bursts of up to
  ``AUTHSVC_ADMIN_BURST`` (docs/admin-api.md, "Rate limit"). A request costs one unit, and one
  more for each ``BODY_UNIT`` of its body: a 4 MiB batch costs 65, as many as it costs the
  service next to a small call, where counting requests let one token send 12 such bodies in
  10 s and push another token's GET from 2 ms to 3.8 s. A body whose length is not known
  before it is read (chunked) pays for it once read. A request over the rate is answered 429
  with ``Retry-After`` before its body is read or the store is written.
- One large body at a time: a request whose body is longer than ``BODY_UNIT`` or chunked
  holds its token's one slot while it is read and served; another from the same token
  meanwhile is 429 (``Retry-After: 1``). So a token keeps at most one of a worker's threads
  busy reading and parsing bodies, however many connections it opens.

The buckets and slots live in the process: with N gunicorn workers a token may get up to N
times the rate and N large bodies at once, and a restart refills them. That is enough for
what they are for, keeping one runaway caller from starving the others and the store's
writer; a limit exact across workers would cost a store round trip per request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

BODY_UNIT = (
    64 * 1024
)  # bytes of body a unit of the rate pays for; a body longer than this is "large"


def body_cost(size: int) -> int:
    """What a body of ``size`` bytes adds to its request's one unit."""
    return size // BODY_UNIT


class RateLimit:
    """Token buckets by API token name (``rate`` 0 turns the rate off), and each token's large-body
    slot."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (units left, when counted)
        self._large: set[str] = set()  # names with a large body in flight
        self._lock = threading.Lock()  # gthread workers serve requests in threads

    def wait(self, name: str, cost: int = 1) -> float:
        """0 if a request of ``cost`` units may run now (and they are counted), else the seconds
        until it may. A request never costs more than a full bucket: one that large waits for a full
        one."""
        if self.rate <= 0:
            return 0.0
        cost = min(cost, self.burst)
        with self._lock:
            now = self.clock()
            units = self._units(name, now)
            if units >= cost:
                self._buckets[name] = (units - cost, now)
                return 0.0
            self._buckets[name] = (units, now)
            return (cost - units) / self.rate

    def charge(self, name: str, cost: int) -> None:
        """Count ``cost`` more units for a request already running (a chunked body, once read): the
        bucket may go below zero, and the token's next requests wait for it."""
        if self.rate <= 0 or cost <= 0:
            return
        with self._lock:
            now = self.clock()
            self._buckets[name] = (self._units(name, now) - min(cost, self.burst), now)

    def _units(self, name: str, now: float) -> float:
        units, then = self._buckets.get(name, (float(self.burst), now))
        return min(float(self.burst), units + max(0.0, now - then) * self.rate)

    def hold_large(self, name: str) -> bool:
        """Take the token's large-body slot: False if another of its large bodies is in flight."""
        with self._lock:
            if name in self._large:
                return False
            self._large.add(name)
            return True

    def release_large(self, name: str) -> None:
        with self._lock:
            self._large.discard(name)
