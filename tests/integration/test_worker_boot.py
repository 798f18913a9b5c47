"""A gunicorn worker that boots during a store outage starts and answers 503 (docs/stores.md,
"Outages").

Real gunicorn as many operators run it: no ``--preload``, no shipped config, two
workers, each building the app itself with the app factory docs/stores.md names for that
(``authsvc.wsgi:create_app(tolerate_outage=True)``). A throwaway PostgreSQL server of the
test's own is stopped before gunicorn starts: the server must keep running,
answer the 503 JSON, then 200 once PostgreSQL is back, with no restart. In the
master (``--preload``) an unreachable store at start-up stays fatal (exit 75).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import time
import urllib.parse

import pytest

from tests.support import (
    free_port,
    kept_stopped,
    provision_postgres,
    start_gunicorn,
    until_both_workers_counted,
    wait_for_port,
)

pytestmark = pytest.mark.engine("postgresql")
AUTH = "/api/authenticate.json"
CAROL = {"success": True, "user_id": 77, "username": "carol"}
WORKERS_BUILD = "authsvc.wsgi:create_app(tolerate_outage=True)"  # every worker builds the app


def with_metrics_dir(env: dict, tmp_path):
    """Where each worker counts its answers (PROMETHEUS_MULTIPROC_DIR, set in ``env``): tells them
    apart."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    return metrics_dir


def get(port: int, path: str) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        res = conn.getresponse()
        return res.status, json.loads(res.read())
    finally:
        conn.close()


def test_workers_boot_during_an_outage_and_recover(own_pg, secret_file, tmp_path):
    _, params, env = provision_postgres(own_pg.url, secret_file)
    query = f"{AUTH}?{urllib.parse.urlencode(params)}"
    metrics_dir = with_metrics_dir(env, tmp_path)
    own_pg.stop()
    port = free_port()
    log = tmp_path / "gunicorn.log"
    server = start_gunicorn(
        env,
        "--graceful-timeout",
        "2",
        port=port,
        workers=2,
        preload=False,
        app=WORKERS_BUILD,
        inherit_env=False,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    try:
        wait_for_port(port)
        for _ in range(4):
            status, body = get(port, query)
            assert server.poll() is None, log.read_text()[-3000:]
            assert (status, body["success"], body["error"]) == (503, False, 503), body
            assert set(body) == {"success", "error", "error_description"}
        until_both_workers_counted(
            port, params, metrics_dir, status=503, result="store_unavailable"
        )  # both booted
        assert get(port, "/readyz")[0] == 503 and get(port, "/healthz")[0] == 200
        own_pg.start()
        until_both_workers_counted(
            port, params, metrics_dir, result="success", answer=CAROL
        )  # both recovered
        assert server.poll() is None
        text = log.read_text()
        assert "unreachable" in text and "starting anyway" in text, text[-3000:]
        assert "Worker failed to boot" not in text
    finally:
        server.terminate()
        server.wait(30)


def test_an_unreachable_store_stays_fatal_in_the_master(own_pg, secret_file, tmp_path):
    """With --preload the master builds the app: the outage is found at start-up and gunicorn stops
    with 75, which the service unit restarts (a misconfiguration is 4, which it does not)."""
    _, _, env = provision_postgres(own_pg.url, secret_file)
    own_pg.stop()
    server = start_gunicorn(
        env,
        port=free_port(),
        workers=2,
        preload=True,
        inherit_env=False,
        app="authsvc.wsgi:create_app()",
    )
    try:
        _, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
    assert server.returncode == 75, err[
        -3000:
    ]  # EX_TEMPFAIL: systemd tries again (a misconfiguration is 4)
    assert 75 not in kept_stopped()
    assert "authsvc: error: postgresql store" in err and "is unreachable" in err, err[-3000:]


def worker_pids(master: int) -> set[int]:
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    if f"PPid:\t{master}\n" in f.read():
                        pids.add(int(entry))
            except OSError:
                continue
    return pids


def test_a_worker_replaced_during_an_outage_boots_and_serves(own_pg, secret_file, tmp_path):
    """Started with the store up; during the outage a worker is killed and gunicorn boots another
    one."""
    _, params, env = provision_postgres(own_pg.url, secret_file)
    query = f"{AUTH}?{urllib.parse.urlencode(params)}"
    metrics_dir = with_metrics_dir(env, tmp_path)
    port = free_port()
    log = tmp_path / "gunicorn.log"
    server = start_gunicorn(
        env,
        "--graceful-timeout",
        "2",
        port=port,
        workers=2,
        preload=False,
        app=WORKERS_BUILD,
        inherit_env=False,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    try:
        wait_for_port(port)
        # Both workers booted with the store up before the outage starts: one answering while the
        # other still boots (a busy machine) would put that one's boot, not a replacement's, in
        # the outage.
        until_both_workers_counted(port, params, metrics_dir, result="success", answer=CAROL)
        before = worker_pids(server.pid)
        assert len(before) == 2, before
        own_pg.stop()
        os.kill(min(before), signal.SIGKILL)
        # Until the new worker has built the app (or, before, failed to and halted the master).
        deadline = time.monotonic() + 60
        while (
            "starting anyway" not in log.read_text()
            and server.poll() is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        text = log.read_text()
        assert server.poll() is None and "starting anyway" in text, text[-3000:]
        for _ in range(4):
            try:
                status, body = get(port, query)
            except OSError as e:  # a process holding the connection went away: the log says which
                pytest.fail(f"{e!r}; gunicorn's log: {log.read_text()[-3000:]}")
            assert (status, body["error"]) == (503, 503), body
        # The new worker and the other both answer 503, then both recover.
        until_both_workers_counted(
            port, params, metrics_dir, status=503, result="store_unavailable"
        )
        own_pg.start()
        until_both_workers_counted(port, params, metrics_dir, result="success", answer=CAROL)
        assert "Worker failed to boot" not in log.read_text()
    finally:
        server.terminate()
        server.wait(30)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_misconfigured_store_stays_fatal_in_a_worker(own_pg, secret_file, tmp_path, workers):
    """A database the server refuses (it does not exist) is the settings' fault, not an outage: the
    worker exits 4 ("app failed to load") and gunicorn halts with 4, with the store up. With several
    workers failing at once gunicorn's master may instead exit 1 with a traceback of its own (it
    meets
    the second worker's 4 while halting for the first's; docs/operations.md, "Exit statuses"): an
    exit status the service unit keeps stopped too, never one it restarts."""
    _, _, env = provision_postgres(own_pg.url, secret_file)
    env["AUTHSVC_STORE"] = own_pg.url.rsplit("/", 1)[0] + "/no_such_database"
    server = start_gunicorn(
        env, port=free_port(), workers=workers, preload=False, inherit_env=False, app=WORKERS_BUILD
    )
    try:
        _, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(10)
    assert server.returncode == 4 if workers == 1 else server.returncode in (1, 4), (
        server.returncode,
        err[-3000:],
    )
    assert server.returncode in kept_stopped()
    assert 'database "no_such_database" does not exist' in err and "starting anyway" not in err, (
        err[-3000:]
    )
    assert "is unreachable" not in err and "refuses the connection" in err, err[-3000:]
