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
import json
import os
import re
import signal
import threading
import time

import pytest

from authsvc.deployment import REQUESTS_PER_WORKER
from tests.deploy_support import LEGACY_HOST, start_stack, stop

pytestmark = pytest.mark.slow

SHED = {
    "success": False,
    "error": 503,
    "error_description": "Service temporarily unavailable, try again",
}
# Clients spread over loopback addresses, each within the per-address limits
# (RATE_BURST, CONN_LIMIT): a storm from many clients, not one client's flood.
SOURCES = [f"127.0.0.{n}" for n in range(2, 14)]
WAIT = 20.0  # seconds any step may take before the test gives up: never reached when it passes


@pytest.fixture
def stack(tmp_path):
    # UPSTREAM_TIMEOUT well above the time the worker is kept stopped, so the admitted
    # requests wait for it instead of getting nginx's 504; nginx's connection table
    # sized for the storm (docs/operations.md), so it is not what refuses clients.
    # UPSTREAM_MAX_CONNS, nginx's last-resort cap, small so that the storm passes it; the
    # app's shed on the queue's wait off, so the admitted requests are served however
    # long the worker was stopped (that shed: test_a_request_stuck_in_the_queue_is_shed_...).
    values = {"UPSTREAM_TIMEOUT": "30s", "UPSTREAM_MAX_CONNS": "8"}
    s = start_stack(
        tmp_path,
        workers=1,
        values=values,
        worker_connections=1024,
        app_env={"AUTHSVC_MAX_QUEUE_WAIT": "0"},
    )
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
            shed_all = arrived.wait_for(
                lambda: len(answers) + len(failures) >= storm - max_conns, WAIT
            )
            shed = list(answers)
        assert not failures, failures
        assert shed_all, (
            f"only {len(shed)} of {storm - max_conns} excess requests answered: they queued"
        )
        time.sleep(0.5)  # nothing else may come while the worker is stopped
        with arrived:
            assert len(answers) == storm - max_conns, (
                "an admitted request was answered by a stopped worker?"
            )
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
    served = answers[len(shed) :]
    assert len(served) == max_conns
    for answer in served:
        assert answer.status == 200 and answer.json()["success"] is True, answer.body

    for source in SOURCES[:3]:  # and right after, normal requests are served
        answer = stack.request("https", stack.api_query(), source=source)
        assert answer.status == 200 and answer.json()["success"] is True, answer.body

    # What the operator sees: status 503, no app host tried (addr= the upstream's name), one
    # such answer in 100 logged (test_shed_answers_are_logged_one_in_100_each_still_the_json_503);
    # the served ones each logged.
    access = (stack.logs / "authsvc-access.log").read_text()
    shed_lines = [
        line for line in access.splitlines() if " 503 " in line and 'addr="authsvc_app"' in line
    ]
    assert len(shed_lines) < storm - max_conns, access[-2000:]
    assert all(line.endswith(" sampled=1/100") for line in shed_lines), shed_lines
    served_lines = [
        line for line in access.splitlines() if " 200 " in line and "upstream=200" in line
    ]
    assert len(served_lines) >= len(served), access[-2000:]


def test_shed_answers_are_logged_one_in_100_each_still_the_json_503(tmp_path):
    """A login storm is thousands of nginx's 503s a second: each one logged cost nginx a
    write and most of its CPU per shed answer past the answer itself (BENCHMARKS.md section
    9). 1,000 answers shed while the only worker is stopped (SIGSTOP) and the host's
    max_conns is held: every one the service's JSON 503 with Retry-After, about 10 of them
    in the access log (one in 100, at random), each line saying it stands for 100; the
    requests the host served are each logged."""
    max_conns = 2
    values = {
        "UPSTREAM_TIMEOUT": "30s",
        "UPSTREAM_MAX_CONNS": str(max_conns),
        "RATE": "100000r/s",
        "RATE_BURST": "10000",
        "CONN_LIMIT": "1000",
    }
    s = start_stack(
        tmp_path,
        workers=1,
        values=values,
        worker_connections=1024,
        app_env={"AUTHSVC_MAX_QUEUE_WAIT": "0"},
    )
    try:
        (worker,) = s.gunicorn_worker_pids()
        held: list = []
        holders: list = []
        os.kill(worker, signal.SIGSTOP)
        try:
            # Requests one at a time until one is shed: those before it are held (admitted, the
            # worker stopped); the check after SIGCONT is that exactly max_conns were served.
            while len(holders) <= max_conns + 3:
                done = threading.Event()

                def hold(done=done) -> None:
                    try:
                        held.append(s.request("http", s.api_query(), source="127.0.10.99"))
                    finally:
                        done.set()

                holders.append(threading.Thread(target=hold, daemon=True))
                holders[-1].start()
                if done.wait(1.0) and held[-1].status == 503:
                    break
            answers: list = []
            lock = threading.Lock()

            def client(source: str, n: int) -> None:
                conn = http.client.HTTPConnection(
                    "127.0.0.1", s.http_port, timeout=WAIT, source_address=(source, 0)
                )
                try:
                    for _ in range(n):
                        conn.request(
                            "GET",
                            s.api_query(),
                            headers={"Host": LEGACY_HOST, "User-Agent": "storm"},
                        )
                        response = conn.getresponse()
                        got = (
                            response.status,
                            response.read(),
                            response.getheader("Retry-After"),
                            response.getheader("Content-Type"),
                        )
                        with lock:
                            answers.append(got)
                finally:
                    conn.close()

            clients = [
                threading.Thread(target=client, args=(f"127.0.10.{k}", 250), daemon=True)
                for k in range(1, 5)
            ]
            for t in clients:
                t.start()
            for t in clients:
                t.join(WAIT * 5)
        finally:
            os.kill(worker, signal.SIGCONT)
        for t in holders:
            t.join(WAIT)
        shed = len(answers)
        assert shed == 1000, shed
        for status, body, retry_after, content_type in answers:
            assert status == 503 and json.loads(body) == SHED, (status, body)
            assert retry_after == "1" and content_type == "application/json; charset=utf-8"
        assert sorted(a.status for a in held) == [200] * max_conns + [503] * (
            len(held) - max_conns
        ), held

        # nginx writes a line once the answer is sent: wait for the served ones' lines, the last.
        deadline = time.monotonic() + WAIT
        while True:
            lines = (s.logs / "authsvc-access.log").read_text().splitlines()
            served = [line for line in lines if " 200 " in line and "upstream=200" in line]
            if len(served) >= max_conns or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        logged = [line for line in lines if '"storm"' in line]
        # One in 100 at random: 10 expected; none at all has a chance of 4e-5, 100 or more none.
        assert 0 < len(logged) < shed / 10, (len(logged), shed)
        for line in logged:
            assert (
                " 503 " in line
                and 'addr="authsvc_app"' in line
                and line.endswith('"storm" sampled=1/100')
            ), line
        assert len(served) == max_conns, lines[-20:]
        assert not any("sampled=" in line for line in served), served
    finally:
        stop(s.nginx)
        stop(s.gunicorn)


# -- load below capacity is never shed ------------------------------------------------


def closed_loop(
    stack, sources: list[str], requests_each: int
) -> tuple[dict[int, int], list[float], list]:
    """One client per source, each sending its next authentication when the last is answered
    (keep-alive, the legacy host); returns the statuses, the latencies and any failures."""
    statuses: dict[int, int] = {}
    latencies: list[float] = []
    failures: list = []
    lock = threading.Lock()

    def client(source: str) -> None:
        conn = http.client.HTTPConnection(
            "127.0.0.1", stack.http_port, timeout=WAIT, source_address=(source, 0)
        )
        try:
            for _ in range(requests_each):
                started = time.monotonic()
                conn.request("GET", stack.api_query(), headers={"Host": LEGACY_HOST})
                response = conn.getresponse()
                body = response.read()
                with lock:
                    latencies.append(time.monotonic() - started)
                    status = (
                        response.status
                        if response.status != 200 or b'"success":true' in body
                        else -1
                    )
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


def burst(stack, sources: list[str]) -> tuple[dict[int, int], list[float], list]:
    """One authentication per source, all sent at the same instant on connections opened
    beforehand: the statuses, the latencies and any failures."""
    statuses: dict[int, int] = {}
    latencies: list[float] = []
    failures: list = []
    lock = threading.Lock()
    go = threading.Barrier(len(sources))

    def client(source: str) -> None:
        conn = http.client.HTTPConnection(
            "127.0.0.1", stack.http_port, timeout=WAIT, source_address=(source, 0)
        )
        try:
            conn.connect()
            go.wait(WAIT)
            started = time.monotonic()
            conn.request("GET", stack.api_query(), headers={"Host": LEGACY_HOST})
            response = conn.getresponse()
            body = response.read()
            with lock:
                latencies.append(time.monotonic() - started)
                status = (
                    response.status if response.status != 200 or b'"success":true' in body else -1
                )
                statuses[status] = statuses.get(status, 0) + 1
        except (OSError, threading.BrokenBarrierError) as e:
            with lock:
                failures.append(e)
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(source,), daemon=True) for source in sources]
    for t in threads:
        t.start()
    for t in threads:
        t.join(2 * WAIT)
    return statuses, latencies, failures


def p99_ms(latencies: list[float]) -> float:
    ordered = sorted(latencies)
    return ordered[int(0.99 * (len(ordered) - 1))] * 1000 if ordered else float("nan")


def test_load_below_capacity_is_never_shed_closed_loop_or_in_one_burst(tmp_path):
    """16 closed-loop clients on a healthy two-worker host were shed 73 % by max_conns: load
    the host serves in milliseconds when queued. With the shipped settings (UPSTREAM_MAX_CONNS
    as scripts/install renders it for two workers, the app's AUTHSVC_MAX_QUEUE_WAIT default),
    8 closed-loop clients per worker, then a burst of 32 per worker sent at the same instant,
    must all be served (the per-address limits raised out of the way, as every client here is
    one process). The p99s are printed, not asserted: this machine is shared; what the shipped
    limits decide is whether anything is shed."""
    workers = 2
    values = {
        "RATE": "100000r/s",
        "RATE_BURST": "1000",
        "CONN_LIMIT": "1000",
        "UPSTREAM_MAX_CONNS": str(REQUESTS_PER_WORKER * workers),
    }
    s = start_stack(tmp_path, workers=workers, values=values, worker_connections=1024)
    try:
        sources = [f"127.0.6.{n}" for n in range(1, 8 * workers + 1)]
        statuses, latencies, failures = closed_loop(s, sources, 60)
        print(f"\nclosed loop, {len(sources)} clients: {statuses}, p99 {p99_ms(latencies):.1f} ms")
        assert not failures, failures
        assert statuses == {200: 60 * len(sources)}, f"{statuses} (p99 {p99_ms(latencies):.1f} ms)"

        sources = [f"127.0.8.{n}" for n in range(1, 32 * workers + 1)]
        statuses, latencies, failures = burst(s, sources)
        print(f"burst of {len(sources)}: {statuses}, p99 {p99_ms(latencies):.1f} ms")
        assert not failures, failures
        assert statuses == {200: len(sources)}, f"{statuses} (p99 {p99_ms(latencies):.1f} ms)"
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


# -- the queue's wait, stamped by nginx --------------------------------------------------


def test_a_request_stuck_in_the_queue_is_shed_and_a_client_cannot_forge_its_stamp(tmp_path):
    """nginx stamps each request with the time it passed it on (X-Request-Start), replacing any
    the client sent; the app answers 503 to one that waited past AUTHSVC_MAX_QUEUE_WAIT. Causal,
    not timed: a request sent while the only worker is stopped (SIGSTOP) for longer than the
    bound has waited at least that long when the worker runs again, whatever its client claimed.
    A forged old stamp must not get a healthy host's request shed; a forged future one must not
    get a stuck request served."""
    max_wait = 0.3
    s = start_stack(
        tmp_path,
        workers=1,
        values={"UPSTREAM_TIMEOUT": "30s"},
        app_env={"AUTHSVC_MAX_QUEUE_WAIT": str(max_wait)},
    )
    try:
        for scheme in ("http", "https"):  # a decades-old forged stamp: replaced, so served
            answer = s.request(scheme, s.api_query(), headers={"X-Request-Start": "t=1000.000"})
            assert answer.status == 200 and answer.json()["success"] is True, answer.body

        (worker,) = s.gunicorn_worker_pids()
        forged = {
            "future stamp": {"X-Request-Start": f"t={time.time() + 3600:.3f}"},
            "future, microseconds": {"X-Request-Start": f"t={int((time.time() + 3600) * 1e6)}"},
            "no stamp": {},
        }
        answers: dict = {}

        def client(name: str) -> None:
            try:
                answers[name] = s.request(
                    "http", s.api_query(), headers=forged[name], source="127.0.9.1"
                )
            except OSError as e:
                answers[name] = e

        os.kill(worker, signal.SIGSTOP)
        try:
            threads = [
                threading.Thread(target=client, args=(name,), daemon=True) for name in forged
            ]
            for t in threads:
                t.start()
            time.sleep(
                3 * max_wait
            )  # the worker gets no CPU: each request waits at least this long
        finally:
            os.kill(worker, signal.SIGCONT)
        for t in threads:
            t.join(WAIT)
        for name, answer in answers.items():
            assert not isinstance(answer, OSError), (name, answer)
            assert answer.status == 503, (name, answer.status, answer.body)
            assert answer.content_type == "application/json; charset=utf-8"
            assert answer.json() == SHED
            assert answer.headers["Retry-After"] == "1"
            assert "X-Authsvc-Result" not in answer.headers  # nginx hides it
        assert len(answers) == len(forged)

        answer = s.request("https", s.api_query())  # and the next one is served
        assert answer.status == 200 and answer.json()["success"] is True, answer.body
        # The app's own 503 (result=503 from the app host), not nginx's shed (addr= the upstream's
        # name).
        access = (s.logs / "authsvc-access.log").read_text()
        assert len([line for line in access.splitlines() if "result=503" in line]) == len(forged), (
            access[-2000:]
        )
        assert 'addr="authsvc_app"' not in access
    finally:
        stop(s.nginx)
        stop(s.gunicorn)
