"""Outages: a store that is down, restarting or unreadable gives HTTP 503, then recovers by itself.

PostgreSQL: a throwaway server of our own on a free loopback port is stopped
and started while the app serves, in-process (WebTest) and under a real
gunicorn with two workers. SQLite: the database file goes missing or is
damaged, then comes back.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from tests.support import (
    free_port,
    make_testapp,
    provision_postgres,
    start_gunicorn,
    until_both_workers_counted,
    wait_for_port,
)

AUTH = "/api/authenticate.json"


def assert_503(res_json: dict) -> None:
    assert res_json["success"] is False and res_json["error"] == 503
    assert (
        set(res_json) == {"success", "error", "error_description"} and res_json["error_description"]
    )


def test_postgres_outage_in_process(own_pg, secret_file):
    settings, params, _ = provision_postgres(own_pg.url, secret_file)
    app = make_testapp(settings)
    assert app.get(AUTH, params=params).json["success"] is True

    own_pg.stop()
    for path in (AUTH, AUTH, "/readyz"):
        started = time.monotonic()
        res = app.get(path, params=params, status=503)
        assert time.monotonic() - started < 5  # connect timeout (2 s) plus slack, never a hang
        assert_503(res.json)

    assert app.get("/healthz").json == {
        "success": True,
        "status": "ok",
    }  # liveness: never the store

    own_pg.start()
    assert app.get(AUTH, params=params).json["success"] is True  # no restart of the app
    assert app.get("/readyz").json == {"success": True, "status": "ready"}

    # A restart between two requests: the idle connection is stale, the next request still succeeds.
    own_pg.stop()
    own_pg.start()
    assert app.get(AUTH, params=params).json == {
        "success": True,
        "user_id": 77,
        "username": "carol",
    }
    app.app.store.close()


def get(port: int, path: str, timeout: float = 10) -> tuple[int, dict, float]:
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        res = conn.getresponse()
        return res.status, json.loads(res.read()), time.monotonic() - started
    finally:
        conn.close()


def worker_pids(master: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    if f"PPid:\t{master}\n" in f.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def test_postgres_outage_under_gunicorn(own_pg, secret_file, tmp_path):
    """gunicorn with --preload (docs/stores.md): the store is checked once, in the master, at
    start-up; a worker that is replaced during an outage boots without touching the store."""
    import psycopg

    _, params, env = provision_postgres(own_pg.url, secret_file)
    query = AUTH + "?" + "&".join(f"{k}={v}" for k, v in params.items())
    metrics_dir = tmp_path / "metrics"  # where each worker counts its answers: tells them apart
    metrics_dir.mkdir()
    env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    port = free_port()
    server = start_gunicorn(
        env,
        "--graceful-timeout",
        "2",
        port=port,
        preload=True,
        inherit_env=False,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "gunicorn.log", "wb"),
    )
    try:
        wait_for_port(port)
        for _ in range(30):
            status, body, _ = get(port, query)
            assert (status, body["success"]) == (200, True)
        with psycopg.connect(
            own_pg.url
        ) as admin:  # persistent: one connection per worker, not per request
            web = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'authsvc-web'"
            ).fetchone()[0]
        assert 1 <= web <= 2

        own_pg.stop()
        for _ in range(6):
            status, body, seconds = get(port, query)
            assert status == 503 and seconds < 5
            assert_503(body)
        workers = worker_pids(server.pid)
        assert len(workers) == 2
        os.kill(workers[0], signal.SIGKILL)  # a worker dies mid-outage; gunicorn starts another
        deadline = time.monotonic() + 20
        while sorted(worker_pids(server.pid)) in ([], [workers[1]]) and time.monotonic() < deadline:
            time.sleep(0.1)
        for _ in range(6):
            status, body, seconds = get(port, query)
            assert status == 503 and seconds < 5
        # Both live workers, the new one and the other, answer 503.
        until_both_workers_counted(
            port, params, metrics_dir, status=503, result="store_unavailable"
        )

        own_pg.start()
        # Both workers recover by themselves, on their first request.
        until_both_workers_counted(
            port,
            params,
            metrics_dir,
            result="success",
            answer={"success": True, "user_id": 77, "username": "carol"},
        )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=15)
    log = (tmp_path / "gunicorn.log").read_text()
    assert params["api_key"] not in log and params["game_auth_token"] not in log


@pytest.mark.engine("sqlite")
def test_sqlite_missing_file_gives_503_then_recovers(world, settings, tmp_path):
    path = settings.store.removeprefix("sqlite://")
    params = world.params()
    world.store.close()
    app = make_testapp(settings)  # start-up checks the file, then each worker opens it on first use
    os.rename(path, tmp_path / "moved.db")
    for url in (AUTH, "/readyz"):
        assert_503(app.get(url, params=params, status=503).json)
    assert app.get("/healthz").json == {"success": True, "status": "ok"}
    assert not os.path.exists(path)  # the reader never creates the file
    os.rename(tmp_path / "moved.db", path)
    assert app.get(AUTH, params=params).json["success"] is True
    app.app.store.close()


@pytest.mark.engine("sqlite")
def test_sqlite_unreadable_file_gives_503_then_recovers(world, settings, tmp_path):
    """A file that is not a database (a bad restore, a truncated copy) when a worker opens it."""
    path = settings.store.removeprefix("sqlite://")
    params = world.params()
    world.store.close()
    app = make_testapp(settings)
    shutil.copy(path, tmp_path / "good.db")
    for name in (path + "-wal", path + "-shm"):
        if os.path.exists(name):
            os.unlink(name)
    with open(path, "wb") as f:
        f.write(b"this is not a database" * 200)
    for url in (AUTH, AUTH, "/readyz"):
        assert_503(app.get(url, params=params, status=503).json)
    assert app.get("/healthz").json == {"success": True, "status": "ok"}
    shutil.copy(tmp_path / "good.db", path)
    assert app.get(AUTH, params=params).json["success"] is True
    app.app.store.close()
