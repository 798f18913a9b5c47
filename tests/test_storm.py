"""A login storm against the shipped nginx + gunicorn stack: the excess is shed at once, in JSON.

One gunicorn worker, stopped (SIGSTOP: a worker that gets no CPU, as in a storm)
while far more authentications arrive than an app host may hold
(``UPSTREAM_MAX_CONNS``, deploy/nginx/sites/authsvc.conf). Not a timed test: what
is checked is causal. The requests nginx admitted cannot be answered while the
worker is stopped, so every answer that arrives meanwhile was given without
queueing; each of those must be the service's JSON 503 with Retry-After. Once the
worker runs again the admitted ones are served, and so are new ones.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import threading
import time

import pytest

from authsvc.admin.deploy import REQUESTS_PER_WORKER
from tests.deploy_support import LEGACY_HOST, start_stack, stop

pytestmark = pytest.mark.slow

SHED = {"success": False, "error": 503, "error_description": "Service temporarily unavailable, try again"}
# Clients spread over loopback addresses, each within the per-address limits
# (RATE_BURST, CONN_LIMIT): a storm from many clients, not one client's flood.
SOURCES = [f"127.0.0.{n}" for n in range(2, 14)]
WAIT = 20.0  # seconds any step may take before the test gives up: never reached when it passes


@pytest.fixture
def stack(tmp_path):
    # UPSTREAM_TIMEOUT well above the time the worker is kept stopped, so the admitted
    # requests wait for it instead of getting nginx's 504; nginx's connection table
    # sized for the storm (docs/operations.md), so it is not what refuses clients.
    # UPSTREAM_MAX_CONNS as scripts/install renders it for a settings file of one worker.
    values = {"UPSTREAM_TIMEOUT": "30s", "UPSTREAM_MAX_CONNS": str(REQUESTS_PER_WORKER * 1)}
    s = start_stack(tmp_path, workers=1, values=values, worker_connections=1024)
    yield s
    stop(s.nginx)
    stop(s.gunicorn)


def test_a_storm_past_the_queue_is_answered_503_at_once_and_served_after(stack):
    site = (stack.root / "deploy" / "nginx" / "sites" / "authsvc.conf").read_text()
    (max_conns,) = {int(n) for n in re.findall(r"max_conns=(\d+)", site)}
    storm = max(6 * max_conns, 60)
    (worker,) = stack.gunicorn_worker_pids()
    answers: list = []
    failures: list = []
    arrived = threading.Condition()

    def client(n: int) -> None:
        try:
            answer = stack.request("http", stack.api_query(), source=SOURCES[n % len(SOURCES)])
        except OSError as e:  # a reset or a timeout: what must never happen
            answer = e
        with arrived:
            (failures if isinstance(answer, OSError) else answers).append(answer)
            arrived.notify_all()

    os.kill(worker, signal.SIGSTOP)
    try:
        threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(storm)]
        for t in threads:
            t.start()
        with arrived:
            # Everything beyond what nginx may hold on the stopped worker is answered without it.
            shed_all = arrived.wait_for(lambda: len(answers) + len(failures) >= storm - max_conns, WAIT)
            shed = list(answers)
        assert not failures, failures
        assert shed_all, f"only {len(shed)} of {storm - max_conns} excess requests answered: they queued"
        time.sleep(0.5)  # nothing else may come while the worker is stopped
        with arrived:
            assert len(answers) == storm - max_conns, "an admitted request was answered by a stopped worker?"
    finally:
        os.kill(worker, signal.SIGCONT)
    for answer in shed:
        assert not answer.body.lstrip().startswith(b"<"), answer.body  # never nginx's HTML
        assert answer.status == 503, (answer.status, answer.body)
        assert answer.content_type == "application/json; charset=utf-8"
        assert answer.json() == SHED
        assert answer.headers["Retry-After"] == "1"
        assert answer.headers["Cache-Control"] == "no-store"

    for t in threads:  # the admitted requests: served once the worker runs
        t.join(WAIT)
    assert not failures, failures
    served = answers[len(shed):]
    assert len(served) == max_conns
    for answer in served:
        assert answer.status == 200 and answer.json()["success"] is True, answer.body

    for source in SOURCES[:3]:  # and right after, normal requests are served
        answer = stack.request("https", stack.api_query(), source=source)
        assert answer.status == 200 and answer.json()["success"] is True, answer.body

    # What the operator sees: status 503, no app host tried (addr= the upstream's name).
    access = (stack.logs / "authsvc-access.log").read_text()
    shed_lines = [line for line in access.splitlines() if ' 503 ' in line and 'addr="authsvc_app"' in line]
    assert len(shed_lines) == storm - max_conns, access[-2000:]


# -- load below capacity is never shed ------------------------------------------------


def closed_loop(stack, sources: list[str], requests_each: int) -> tuple[dict[int, int], list[float], list]:
    """One client per source, each sending its next authentication when the last is answered
    (keep-alive, the legacy host); returns the statuses, the latencies and any failures."""
    statuses: dict[int, int] = {}
    latencies: list[float] = []
    failures: list = []
    lock = threading.Lock()

    def client(source: str) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", stack.http_port, timeout=WAIT, source_address=(source, 0))
        try:
            for _ in range(requests_each):
                started = time.monotonic()
                conn.request("GET", stack.api_query(), headers={"Host": LEGACY_HOST})
                response = conn.getresponse()
                body = response.read()
                with lock:
                    latencies.append(time.monotonic() - started)
                    status = response.status if response.status != 200 or b'"success":true' in body else -1
                    statuses[status] = statuses.get(status, 0) + 1
        except OSError as e:
            with lock:
                failures.append(e)
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(source,), daemon=True) for source in sources]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT * requests_each)
    return statuses, latencies, failures


def test_closed_loop_clients_up_to_eight_per_worker_are_never_shed(tmp_path):
    """16 closed-loop clients on a healthy two-worker host were shed 73 %: load the host serves
    in milliseconds when queued. Up to 8 clients per worker, each waiting for its answer
    before the next request, must all be served (the per-address limits raised out of the
    way, as every client here is one process). The p99 is reported, not asserted: this
    machine is shared, and the count of 503s is what the shipped limit decides."""
    workers = 2
    values = {"RATE": "100000r/s", "RATE_BURST": "1000", "CONN_LIMIT": "1000"}
    s = start_stack(tmp_path, workers=workers, values=values, worker_connections=1024)
    try:
        sources = [f"127.0.6.{n}" for n in range(1, 8 * workers + 1)]
        statuses, latencies, failures = closed_loop(s, sources, 60)
        latencies.sort()
        p99 = latencies[int(0.99 * (len(latencies) - 1))] * 1000 if latencies else float("nan")
        assert not failures, failures
        assert statuses == {200: 60 * len(sources)}, f"{statuses} (p99 {p99:.1f} ms)"
    finally:
        stop(s.nginx)
        stop(s.gunicorn)


def test_a_burst_from_one_address_within_its_limit_is_served_not_shed(tmp_path):
    """RATE_BURST requests at once from one address are within its rate limit; with nodelay
    they all reached the app host together and most were shed (the burst, 40, is past the
    host's max_conns). nginx lets a few go at once and spaces the rest at RATE (delay=)."""
    s = start_stack(tmp_path, workers=2, worker_connections=1024)
    try:
        proxy = (s.root / "deploy" / "nginx" / "snippets" / "authsvc-proxy.conf").read_text()
        burst = int(re.search(r"burst=(\d+)", proxy).group(1))
        answers: list = []
        lock = threading.Lock()
        go = threading.Barrier(burst)

        def client() -> None:
            go.wait(WAIT)
            try:
                answer = s.request("http", s.api_query(), source="127.0.7.1")
                result = (answer.status, answer.json().get("success", answer.json().get("error")))
            except OSError as e:
                result = (0, repr(e))
            with lock:
                answers.append(result)

        threads = [threading.Thread(target=client, daemon=True) for _ in range(burst)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert sorted(answers) == [(200, True)] * burst, sorted(answers)
    finally:
        stop(s.nginx)
        stop(s.gunicorn)
