"""The SQLite reader's snapshot connection is never used by two threads at once
(authsvc/store/sqlite/reader.py, ``_Snapshot``).

Each request thread has its own connection, but the reaper thread of each worker
ends an idle snapshot with a COMMIT on that connection. The schema check of
``/readyz`` (``check``) and the key-expiry gauges of ``/metrics`` (``list_games``)
read on the same connection, so they hold the snapshot's lock as an authentication
does. In process: they wait while the lock is held. Under a real gthread gunicorn:
probes and scrapes beside authentications all answer correctly, with nothing in the
error log.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import threading
import time
import urllib.parse

import pytest

from authsvc.store.sqlite.store import SQLiteStore
from authsvc.tokens import api_key_digest, mint_token, new_api_key
from tests import factories
from tests.support import PATH, free_port, get_text, skip_or_fail, start_gunicorn, wait_for_port

pytestmark = pytest.mark.engine("sqlite")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READY = '{"success":true,"status":"ready"}'
INFO_LINE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} \[\d+\] \[INFO\] (gunicorn\.error|authsvc\.auth): "
)
INVALID = '{"success":false,"error":403,"error_description":"Invalid credentials"}'


@pytest.mark.parametrize("call", ["check", "list_games"])
def test_reads_beside_an_authentication_wait_while_the_reaper_holds_the_snapshot(world, call):
    """The reaper ends a snapshot while holding its lock: a schema check or a game listing
    on the same connection must wait for it, not run beside its COMMIT."""
    store = SQLiteStore(world.settings.store, readonly=True, max_staleness=1.0)
    request_thread_ready, go, done = threading.Event(), threading.Event(), threading.Event()
    snapshots = []
    errors: list[BaseException] = []

    def request_thread():
        try:
            store.credentials(
                api_key_digest(world.api_key), world.user_id
            )  # opens this thread's snapshot
            snapshots.append(store._local.snapshot)
            request_thread_ready.set()
            go.wait(10)
            getattr(store, call)()
        except BaseException as e:  # reported by the main thread
            errors.append(e)
        finally:
            request_thread_ready.set()
            done.set()

    thread = threading.Thread(target=request_thread)
    thread.start()
    try:
        assert request_thread_ready.wait(10) and not errors, errors
        snapshot = snapshots[0]
        assert snapshot.keys is not None and snapshot.conn.in_transaction
        with snapshot.lock:  # as _reap holds it while it ends the snapshot
            go.set()
            assert not done.wait(0.5), (
                f"{call}() used the snapshot's connection while the reaper held it"
            )
        assert done.wait(10) and not errors, errors
    finally:
        go.set()
        thread.join(10)
        store.close()


def _answer(port: int, path: str) -> tuple[str, int, str]:
    status, body = get_text(port, path)
    return path, status, body


def test_under_gthread_probes_and_scrapes_beside_authentications(env, world, tmp_path):
    """Two gthread workers of 4 threads, a reaper ending snapshots every 50 ms, and a bounded mix of
    authentications, /readyz and /metrics sent 8 at a time: every answer is the right one, every
    scrape lists every game's key gauge (a failed listing leaves them out), and the error log
    has no traceback, no 500 and no sqlite3 error."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        skip_or_fail("prometheus_client is not installed (pip install -e '.[metrics]')")
    games = [world.game_id] + [world.add_game(f"game-{n}")[0] for n in range(40)]
    other_user = 4243
    factories.add_player(world.store, other_user, "bob")
    secret = world.settings.token_secrets[0]
    good = urllib.parse.urlencode(world.params())
    bob = urllib.parse.urlencode(
        world.params(
            user_id=str(other_user),
            game_auth_token=mint_token(secret, world.game_id, other_user, 0),
        )
    )
    wrong = urllib.parse.urlencode(world.params(game_auth_token="0" * 64))
    unknown_key = urllib.parse.urlencode(world.params(api_key=new_api_key()))
    expected = {
        f"{PATH}?{good}": (200, f'{{"success":true,"user_id":{world.user_id},"username":"alice"}}'),
        f"{PATH}?{bob}": (200, f'{{"success":true,"user_id":{other_user},"username":"bob"}}'),
        f"{PATH}?{wrong}": (200, INVALID),
        f"{PATH}?{unknown_key}": (200, INVALID),
        "/readyz": (200, READY),
    }
    requests = [*expected, "/metrics"] * 150  # 900 requests, a third of them probes and scrapes

    env = {
        **env,
        "AUTHSVC_MAX_STALENESS": "0.05",
        "AUTHSVC_THREADS": "4",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "metrics"),
    }
    port = free_port()
    error_log = (
        tmp_path / "error.log"
    )  # files, not pipes: 900 log lines would fill a pipe nobody reads yet
    with error_log.open("wb") as err_file, (tmp_path / "access.log").open("wb") as out_file:
        proc = start_gunicorn(
            env,
            "--graceful-timeout",
            "5",
            port=port,
            workers=2,
            stdout=out_file,
            stderr=err_file,
            config=os.path.join(REPO, "deploy", "gunicorn.conf.py"),
        )
    try:
        wait_for_port(port)
        deadline = time.monotonic() + 120
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda path: _answer(port, path), requests))
        assert time.monotonic() < deadline, "the mix took over two minutes"
        final = get_text(port, "/metrics")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    err = error_log.read_text()
    for path, status, body in answers:
        if path == "/metrics":
            assert status == 200, body
            for game_id in games:
                assert (
                    f'authsvc_api_key_expiry_timestamp_seconds{{game="{game_id}"}} +Inf' in body
                ), body
        else:
            assert (status, body) == expected[path], (path.split("?")[0], status, body)
    assert final[0] == 200 and "authsvc_server_errors_total{" not in final[1], final[1]
    assert "authsvc_store_unavailable_total 0.0" in final[1]
    # Only INFO lines of gunicorn and of the authentications: no warning, error or traceback line.
    odd = [line for line in err.splitlines() if not INFO_LINE.match(line)]
    assert not odd and "ProgrammingError" not in err and "recursive" not in err, odd
