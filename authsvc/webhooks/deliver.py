"""``authsvc deliver``: POSTs each event to its webhooks, signed, in order per player, until each is
taken.

The promise (docs/integrating.md, "Events"): at least once (a delivery is marked done only after
its 2xx, so a deliverer killed mid-POST sends it again, with the same ``webhook-id``); in order per
webhook and player (a player's next event goes only once the one before is delivered or failed:
store/deliveries.py); retried with backoff (BACKOFF, each with up to 10 % jitter) until EXPIRY after
the event, then ``failed``, where it stays, visible, until re-driven.

The loop: every POLL seconds (or as soon as a POST ends, but GAP apart), write the outcomes gathered
so far in one short transaction; fan the new events out to the webhooks subscribed to them (at
most FAN_OUT events a webhook, one short transaction: store/deliveries.py's fan_out); then read
a page of due deliveries (at most PAGE: memory stays bounded whatever the backlog) and hand each
chain's first one to a thread pool of ``deliver_concurrency`` threads; a thread that delivered
one goes on with the chain's next ones.

Fairness: the page holds a few chains of every webhook with work (store/deliveries.py's due:
round-robin, at most ``per_webhook`` each), never one webhook's backlog alone. A webhook has at
most its share of the threads under way: three quarters of them, or an equal part of them
while several webhooks have work (``_share``). A POST to a receiver that never answers holds its
thread for the timeout, so a slow or blackholed receiver keeps only its own share waiting and
another webhook's event starts at the next step.

Erasure: a POST's body is built from the event's data read right before the POST starts
(store/deliveries.py's event_data), never from what the page or the chain's read-ahead held: a
player deleted before then is sent without its names (docs/integrating.md, "Events").

One deliverer per store: each step starts by holding the store's lease (store/deliveries.py's
take_lease, renewed every LEASE_RENEW, good for LEASE); a second one waits, saying once who holds
it, and takes over once the lease runs out, at once if the holder let it go (SIGTERM) or was a
process of this host that is gone (a crash, then a restart). So a standby deliverer on another
host is safe to run (the hosts' clocks in step: the lease's time is the holder's clock). While it
waits it only reads the lease, each step. SIGTERM: no new POST starts, those under way end (within
the timeout), their outcomes are written, the lease is let go.

Retention: once a minute (at once again while there is a backlog), one short transaction deletes
up to PRUNE_BATCH deliveries delivered or failed longer than ``retention_ms`` ago, their attempts,
as many events that old that no delivery needs, and the rows of webhooks removed that long ago
once none of their deliveries is left (store/deliveries.py's prune).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from authsvc import times
from authsvc.errors import ConfigError, StoreUnavailable
from authsvc.settings import Settings, host_list
from authsvc.store import open_store, redact_url
from authsvc.store.base import Store
from authsvc.store.deliveries import DELIVERED, FAILED, PENDING, Due, Outcome
from authsvc.webhooks import sign
from authsvc.webhooks.connect import Client

BACKOFF = (5, 30, 120, 600, 1800, 3600)  # seconds after attempt 1, 2, ...; then hourly
EXPIRY_MS = 24 * 3600 * 1000  # after the event (or a re-drive), a delivery not yet taken is failed
POLL = 0.1  # seconds between two reads of the due deliveries when idle
GAP = 0.01  # seconds at least between two steps when busy: outcomes written a batch at a time
PAGE = 500  # due deliveries read at once
FAN_OUT = 2000  # events fanned out to each webhook by one step (one short transaction)
CHAIN = 50  # a thread's deliveries of one chain before it hands the chain back
SWEEP = 5.0  # seconds between two sweeps of deleted webhooks' deliveries
PRUNE_EVERY = 60.0  # seconds between two retention steps (sooner while a step finds a full batch)
PRUNE_BATCH = 1000  # deliveries, and events, deleted by one retention step (one short transaction)
RETENTION_MS = 7 * 24 * 3600 * 1000  # AUTHSVC_WEBHOOK_RETENTION's default
SUMMARY = 10.0  # seconds between two summary lines
LEASE_MS = (
    30_000  # a deliverer that stops renewing its lease loses it this long after its last renewal
)
LEASE_RENEW_MS = 5_000  # how often the holder renews it


def say(text: str) -> None:
    print(f"authsvc deliver: {text}", file=sys.stderr, flush=True)


def backoff_ms(attempts: int, rand: Callable[[], float] = random.random) -> int:
    """The wait after the ``attempts``-th failed attempt, with jitter."""
    base = BACKOFF[min(attempts, len(BACKOFF)) - 1]
    return int(base * 1000 * (1 + 0.1 * rand()))


def body(item: Due, data: str) -> bytes:
    """``{"type", "timestamp", "data"}``: the event's data is JSON already (an object)."""
    return b'{"type":%s,"timestamp":"%s","data":%s}' % (
        json.dumps(item.type).encode(),
        times.utc(item.at_ms).encode(),
        data.encode(),
    )


def cmd_deliver(args, settings: Settings):
    """``authsvc deliver``: the loop, until SIGTERM or SIGINT."""
    store = open_store(settings.store, readonly=False, settings=settings)
    client = Client(
        host_list(settings.webhook_allow_hosts),
        connect_timeout=min(3.0, settings.webhook_timeout),
        timeout=settings.webhook_timeout,
    )
    try:
        store.check()  # not migrated, wrong role: stop here
        metrics = (
            _serve_metrics(store, settings.deliver_metrics) if settings.deliver_metrics else None
        )
        deliverer = Deliverer(
            store,
            client,
            concurrency=settings.deliver_concurrency,
            retention_ms=settings.webhook_retention * 1000,
            metrics=metrics,
        )

        def stop(signum, frame) -> None:
            deliverer.stopping.set()
            deliverer._wake.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        say(
            f"delivering the events of {redact_url(settings.store)}, "
            f"{settings.deliver_concurrency} at once"
        )
        deliverer.run()
        say("stopped")
    finally:
        client.close()
        store.close()
    return 0, {"stopped": True}, "stopped"


def _serve_metrics(store: Store, listen: str):
    """authsvc/webhooks/metrics.py's metrics served at ``listen`` (host:port); without
    prometheus_client a ConfigError; an address it cannot listen at (a second deliverer on the host)
    is logged, and the deliveries go on without metrics."""
    try:
        from authsvc.webhooks.metrics import DeliveryMetrics

        metrics = DeliveryMetrics(store)
    except ImportError:
        raise ConfigError(
            "AUTHSVC_DELIVER_METRICS needs prometheus_client (pip install 'authsvc[metrics]')"
        ) from None
    host, _, port = listen.rpartition(":")
    try:
        metrics.serve(host.strip("[]"), int(port))
    except OSError as e:
        say(
            f"metrics: cannot listen at AUTHSVC_DELIVER_METRICS={listen} ({e.strerror}); "
            "delivering without them"
        )
        return None
    say(f"metrics at http://{listen}/metrics")
    return metrics


def _wall_ms() -> int:
    return int(time.time() * 1000)


def _gone(holder: str) -> bool:
    """Whether ``holder`` (host:pid:nonce) was a process of this host that no longer runs."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # a process of another user: alive
        return False
    return False


class Deliverer:
    """The loop (module docstring); ``clock`` gives unix milliseconds (tests move it)."""

    def __init__(
        self,
        store: Store,
        client: Client,
        *,
        concurrency: int = 16,
        clock: Callable[[], int] = _wall_ms,
        log: Callable[[str], None] = say,
        retention_ms: int = RETENTION_MS,
        metrics: Any = None,
    ) -> None:
        self.store = store
        self.client = client
        self.concurrency = concurrency
        self.per_webhook = max(1, concurrency * 3 // 4)
        self.clock = clock
        self.retention_ms = retention_ms
        self._prune_at = 0.0  # time.monotonic() of the next retention step
        self.log = log
        self.metrics = metrics  # authsvc/webhooks/metrics.py's, when AUTHSVC_DELIVER_METRICS is set
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="deliver")
        self._lock = threading.Lock()
        self._finished: list[
            tuple[tuple, list[Outcome]]
        ] = []  # chains done, outcomes not yet written
        self._unwritten: list[
            tuple[tuple, list[Outcome]]
        ] = []  # taken from _finished, a write failed
        self._busy: dict[
            tuple, int
        ] = {}  # chain key -> webhook id, while a thread has it or its outcomes are unwritten
        self._per_webhook: dict[int, int] = {}
        self._swept = 0.0
        self._counts = {"delivered": 0, "failed_attempts": 0, "failed": 0}
        self._last_error = ""
        self._summary_at = time.monotonic()
        self._store_trouble = ""
        # host:pid:nonce: the pid tells a process of this host that is gone (the nonce, two in one
        # process)
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._renew_at = 0  # clock ms of the next renewal of the lease; 0: not held
        self._waiting_for = ""  # who held the lease when this one last found it held

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> None:
        """Until ``stopping`` is set; then the POSTs under way end and their outcomes are
        written."""
        while not self.stopping.is_set():
            began = time.monotonic()
            self.step()
            self._wake.wait(POLL)
            self._wake.clear()
            self.stopping.wait(GAP - (time.monotonic() - began))
        self.finish()

    def step(self) -> int:
        """Write the finished outcomes, then start the due chains; how many started."""
        try:
            self._write()
            if not self.lease():
                return 0
            if self.store.fan_out_events(self.clock(), FAN_OUT)[1]:
                self._wake.set()  # more events than one step fans out: the next step comes at once
            if time.monotonic() - self._swept >= SWEEP:
                self._swept = time.monotonic()
                if dropped := self.store.fail_orphan_deliveries(self.clock()):
                    self.log(f"{dropped} pending deliveries of deleted webhooks marked failed")
            if time.monotonic() >= self._prune_at:
                more = self.prune()
                self._prune_at = time.monotonic() + (0.0 if more else PRUNE_EVERY)
            started = self._start()
        except StoreUnavailable as e:
            text = str(e).splitlines()[0]
            if text != self._store_trouble:
                self._store_trouble = text
                self.log(f"store: {text}; trying again every {POLL:g} s")
            return 0
        if self._store_trouble:
            self._store_trouble = ""
            self.log("store: working again")
        self._summary()
        return started

    def lease(self) -> bool:
        """Whether this deliverer holds the store's lease (taking or renewing it when due)."""
        now = self.clock()
        if self._renew_at and now < self._renew_at:
            return True
        held = self.store.deliverer_lease()  # a read: a deliverer that waits writes nothing
        other = None if held is None or held[0] == self.holder or held[1] < now else held[0]
        dead = other if other is not None and _gone(other) else None
        if other is None or dead is not None:
            other = self.store.take_deliverer_lease(self.holder, now, now + LEASE_MS, dead=dead)
        if other is None:
            self._renew_at = now + LEASE_RENEW_MS
            if self._waiting_for:
                self.log(f"took over the store from {self._waiting_for}")
                self._waiting_for = ""
            return True
        self._renew_at = 0
        if other != self._waiting_for:
            self._waiting_for = other
            self.log(f"another deliverer ({other}) works on this store; waiting to take over")
        return False

    def prune(self) -> bool:
        """One retention step; whether it found a full batch (more may wait)."""
        deliveries, events, webhooks = self.store.prune_deliveries(
            self.clock() - self.retention_ms, PRUNE_BATCH
        )
        if deliveries or events or webhooks:
            self.log(
                f"retention: {deliveries} deliveries, {events} events and {webhooks} removed "
                "webhooks deleted"
            )
        return max(deliveries, events) >= PRUNE_BATCH

    def finish(self, timeout: float | None = None) -> None:
        """Wait for the threads (each POST ends within the client's timeout), write what they
        did."""
        self._pool.shutdown(wait=True)
        deadline = time.monotonic() + (timeout if timeout is not None else 30.0)
        while time.monotonic() < deadline:
            try:
                self._write()
                if self._renew_at:
                    self.store.release_deliverer_lease(self.holder)
                    self._renew_at = 0
                break
            except StoreUnavailable:
                time.sleep(POLL)
        self._summary(force=True)

    def settle(self) -> None:
        """Wait until no chain is under way and every outcome is written (tests, the benchmark)."""
        while True:
            self._write()
            with self._lock:
                if not self._busy:
                    return
            self._wake.wait(0.05)
            self._wake.clear()

    def _write(self) -> None:
        with self._lock:
            self._unwritten += self._finished
            self._finished = []
        if not self._unwritten:
            return
        self.store.record_deliveries([o for _, outcomes in self._unwritten for o in outcomes])
        with self._lock:
            for key, outcomes in self._unwritten:
                webhook_id = self._busy.pop(key)
                self._per_webhook[webhook_id] -= 1
                for o in outcomes:
                    if o.state == DELIVERED:
                        self._counts["delivered"] += 1
                    else:
                        self._counts["failed_attempts"] += 1
                        self._counts["failed"] += o.state == FAILED
                    if self.metrics is not None:
                        self.metrics.attempt("retry" if o.state == PENDING else o.state)
            self._unwritten = []

    def _share(self, active: int) -> int:
        """How many chains one webhook may have under way while ``active`` webhooks have work."""
        return max(1, min(self.per_webhook, self.concurrency // max(1, active)))

    def _start(self) -> int:
        with self._lock:
            busy = len(self._busy)
            under_way = {w: n for w, n in self._per_webhook.items() if n}
        free = self.concurrency * 2 - busy
        if free <= 0 or self.stopping.is_set():
            return 0
        started = 0
        # A webhook's chains under way are among its first due (still pending): read past them, no
        # further. One at its share already (more webhooks with work make the share smaller, never
        # larger) is not read.
        full = {w for w, n in under_way.items() if n >= self._share(len(under_way))}
        page = self.store.due_deliveries(
            self.clock(), self.per_webhook, min(PAGE, free + busy), full
        )
        share = self._share(len(under_way.keys() | {item.webhook_id for item in page}))
        for item in page:
            key = (
                item.webhook_id,
                item.user_id if item.user_id is not None else ("event", item.id),
            )
            with self._lock:
                if key in self._busy or self._per_webhook.get(item.webhook_id, 0) >= share:
                    continue
                self._busy[key] = item.webhook_id
                self._per_webhook[item.webhook_id] = self._per_webhook.get(item.webhook_id, 0) + 1
            self._pool.submit(self._chain, key, item)
            started += 1
            if started >= free:
                break
        return started

    def _chain(self, key: tuple, head: Due) -> None:
        outcomes: list[Outcome] = []
        try:
            outcome = self.attempt(head)
            if outcome is not None:
                outcomes.append(outcome)
            if (
                outcome is not None
                and outcome.state == DELIVERED
                and head.more
                and not self.stopping.is_set()
            ):
                for item in self.store.deliveries_after(head, self.clock(), CHAIN):
                    outcome = self.attempt(item)
                    if outcome is None:
                        break
                    outcomes.append(outcome)
                    if outcome.state != DELIVERED or self.stopping.is_set():
                        break
        except StoreUnavailable:
            pass  # the chain's next ones wait for the next page
        except (
            Exception
        ) as e:  # a bug must not stop the loop's bookkeeping: the chain is handed back
            self.log(f"internal error delivering to webhook {head.webhook_id}: {type(e).__name__}")
        finally:
            with self._lock:
                self._finished.append((key, outcomes))
            self._wake.set()

    def attempt(self, item: Due) -> Outcome | None:
        """One signed POST of the event's data as it is now, and what follows from its answer; None
        if there is nothing to send (done meanwhile, or its webhook removed)."""
        data = self.store.event_data(item.id)  # after any deletion committed so far: no erased name
        if data is None:
            return None
        now = self.clock()
        payload = body(item, data)
        msg_id = sign.message_id(item.id)
        headers = sign.headers(sign.secret_key(item.secret), msg_id, now // 1000, payload)
        started = time.monotonic()
        answer = self.client.post(item.url, payload, headers)
        duration = int((time.monotonic() - started) * 1000)
        if (
            answer.error is not None
        ):  # the log's detail; the delivery keeps the fixed text (webhooks/connect.py)
            self._last_error = f"webhook {item.webhook_id}: {answer.detail or answer.error}"
        if answer.error is None:
            return Outcome(item, now, answer.status, None, duration, DELIVERED, item.next_at)
        expires = item.created_at + EXPIRY_MS
        if now >= expires:
            return Outcome(item, now, answer.status, answer.error, duration, FAILED, item.next_at)
        next_at = min(now + backoff_ms(item.attempts + 1), expires)
        return Outcome(item, now, answer.status, answer.error, duration, PENDING, next_at)

    def _summary(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._summary_at < SUMMARY:
            return
        self._summary_at = time.monotonic()
        counts, self._counts = self._counts, {"delivered": 0, "failed_attempts": 0, "failed": 0}
        if any(counts.values()):
            self.log(
                f"delivered {counts['delivered']}, {counts['failed_attempts']} attempts failed, "
                f"{counts['failed']} given up"
                + (f" (last: {self._last_error})" if counts["failed_attempts"] else "")
            )
