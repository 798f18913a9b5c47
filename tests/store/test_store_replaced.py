"""A SQLite store file replaced or removed while the service reads it (docs/stores.md, "Outages").

A reader holds the file open, so after ``mv`` or ``rm`` of the path it would
keep reading the old file through its descriptor for ever: a revocation made
in a new file at the same path would never be seen. The reader compares the
file the path names (device and inode) with the one it opened, at each
snapshot (at most AUTHSVC_MAX_STALENESS, default 1 s) and with
AUTHSVC_MAX_STALENESS=0 before every query: a new file is reopened, a missing
path is HTTP 503 (and /readyz fails with it, while /healthz stays 200).
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time

import pytest

from authsvc.errors import StoreUnavailable
from authsvc.store.sqlite.store import SQLiteStore
from authsvc.tokens import api_key_digest
from tests import factories
from tests.support import INVALID, FakeClock, free_port, get, start_gunicorn, wait_for_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


pytestmark = pytest.mark.engine("sqlite")


def _path(world) -> str:
    return world.settings.store.removeprefix("sqlite://")


def _move_away(path: str, how: str, tmp_path) -> None:
    """What an operator does to the file: rename it (only the main file: -wal and -shm stay) or
    delete it."""
    if how == "rename":
        os.rename(path, tmp_path / "old.db")
    else:
        os.unlink(path)


def _init_new_store(world, path: str, games, players) -> None:
    """``authsvc init`` a new file at the same path, ``authsvc import`` the old content, revoke
    there."""
    new = SQLiteStore("sqlite://" + path, readonly=False)
    new.migrate()
    factories.load_store(new, games, players, 0)
    assert factories.revoke_player(new, world.user_id) == 1
    new.close()


def _reader(world, max_staleness: float, clock) -> SQLiteStore:
    return SQLiteStore(
        world.settings.store, readonly=True, max_staleness=max_staleness, clock=clock
    )


@pytest.mark.parametrize("max_staleness", [1.0, 0.0])
@pytest.mark.parametrize("how", ["rename", "delete"])
def test_a_new_file_at_the_path_is_read_within_the_bound(world, tmp_path, how, max_staleness):
    clock = FakeClock()
    reader = _reader(world, max_staleness, clock)
    digest = api_key_digest(world.api_key)
    assert reader.credentials(digest, world.user_id).epoch == 0
    games, players = list(world.store.list_games()), [world.store.get_player(world.user_id)]
    world.store.close()  # the admin command has exited
    path = _path(world)
    _move_away(path, how, tmp_path)
    _init_new_store(world, path, games, players)
    clock.now += max_staleness  # the bound: at once without a snapshot, 1 s with the default
    assert reader.credentials(digest, world.user_id).epoch == 1  # the new file's revocation
    assert reader.credentials(api_key_digest("no such key"), world.user_id) is None
    reader.close()


@pytest.mark.parametrize("max_staleness", [1.0, 0.0])
def test_a_snapshot_is_kept_until_the_bound_then_the_new_file_is_read(
    world, tmp_path, max_staleness
):
    """Both sides of the bound: the old file may answer until then (with a snapshot), never
    after."""
    clock = FakeClock()
    reader = _reader(world, max_staleness, clock)
    digest = api_key_digest(world.api_key)
    assert reader.credentials(digest, world.user_id).epoch == 0
    games, players = list(world.store.list_games()), [world.store.get_player(world.user_id)]
    world.store.close()
    path = _path(world)
    _move_away(path, "rename", tmp_path)
    _init_new_store(world, path, games, players)
    if max_staleness:
        clock.now += 0.999
        assert reader.credentials(digest, world.user_id).epoch == 0  # the snapshot is kept
        clock.now += 0.001
    assert reader.credentials(digest, world.user_id).epoch == 1
    reader.close()


@pytest.mark.parametrize("max_staleness", [1.0, 0.0])
@pytest.mark.parametrize("how", ["rename", "delete"])
def test_a_missing_path_is_store_unavailable_then_recovers(world, tmp_path, how, max_staleness):
    clock = FakeClock()
    reader = _reader(world, max_staleness, clock)
    digest = api_key_digest(world.api_key)
    assert reader.credentials(digest, world.user_id) is not None
    games, players = list(world.store.list_games()), [world.store.get_player(world.user_id)]
    world.store.close()
    path = _path(world)
    _move_away(path, how, tmp_path)
    clock.now += max_staleness
    for key in (digest, ""):  # "" is what /readyz asks
        with pytest.raises(StoreUnavailable):
            reader.credentials(key, world.user_id)
    assert not os.path.exists(path)  # the reader never creates the file
    _init_new_store(world, path, games, players)
    assert reader.credentials(digest, world.user_id).epoch == 1
    reader.close()


@pytest.mark.parametrize("max_staleness", [1.0, 0.0])
@pytest.mark.parametrize("gap", [False, True])
def test_a_file_moved_over_the_store_without_its_wal_is_refused_until_they_are_removed(
    world, tmp_path, max_staleness, gap
):
    """The -wal and -shm beside the path are still the old file's: reading them with the new file
    would give the old pages; StoreUnavailable instead, until they are removed. In one step (``mv
    new.db authsvc.db``) or two, with the path missing in between."""
    clock = FakeClock()
    reader = _reader(world, max_staleness, clock)
    digest = api_key_digest(world.api_key)
    assert reader.credentials(digest, world.user_id).epoch == 0
    games, players = list(world.store.list_games()), [world.store.get_player(world.user_id)]
    world.store.close()
    path = _path(world)
    _init_new_store(world, str(tmp_path / "new.db"), games, players)
    if gap:
        _move_away(path, "rename", tmp_path)
        clock.now += max_staleness
        with pytest.raises(StoreUnavailable):
            reader.credentials(digest, world.user_id)
    os.replace(tmp_path / "new.db", path)
    clock.now += max_staleness
    for _ in range(2):
        with pytest.raises(StoreUnavailable):
            reader.credentials(digest, world.user_id)
    os.unlink(path + "-wal")
    os.unlink(path + "-shm")
    assert reader.credentials(digest, world.user_id).epoch == 1
    reader.close()


def test_a_file_swapped_while_connecting_is_not_trusted(world, tmp_path, monkeypatch):
    """The identity is taken before the file is opened and checked after: a swap in between
    reopens."""
    reader = _reader(world, 1.0, FakeClock())
    digest = api_key_digest(world.api_key)
    games, players = list(world.store.list_games()), [world.store.get_player(world.user_id)]
    world.store.close()
    path = _path(world)
    real_connect = SQLiteStore._open
    swapped = []

    def open_then_swap(self):
        conn = real_connect(self)
        if not swapped:  # the first open: the path names another file from now on
            swapped.append(True)
            _move_away(path, "rename", tmp_path)
            _init_new_store(world, path, games, players)
        return conn

    monkeypatch.setattr(SQLiteStore, "_open", open_then_swap)
    assert reader.credentials(digest, world.user_id).epoch == 1
    reader.close()


def _cli(env: dict, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "authsvc.cli.command", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _answers_until(port: int, params: dict, deadline: float) -> list:
    """Requests about every 20 ms until ``deadline`` (monotonic): bounded in time and count."""
    answers = []
    while time.monotonic() < deadline and len(answers) < 200:
        r = get(port, params)
        answers.append((r.status, json.loads(r.body)))
        time.sleep(0.02)
    return answers


def _ready(port: int) -> int:
    """/readyz's status; /healthz (liveness, no store) must be 200 whatever it is."""
    assert _status(port, "/healthz") == 200
    return _status(port, "/readyz")


def _status(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        res = conn.getresponse()
        res.read()
        return res.status
    finally:
        conn.close()


@pytest.mark.parametrize("how", ["rename", "delete"])
def test_under_gunicorn_a_replaced_file_is_read_within_a_second(env, world, tmp_path, how):
    """The shipped gunicorn settings (preloaded, two sync workers), the default bound, the real
    admin command: the file is moved away (503 and a failing /readyz meanwhile, /healthz 200),
    `authsvc init` and `authsvc import` make a new one, `authsvc player revoke` there is seen by
    every worker within 1 s."""
    env = {k: v for k, v in env.items() if k != "AUTHSVC_MAX_STALENESS"}  # the default, 1 s
    params = world.params()  # minted for epoch 0
    export = tmp_path / "export.jsonl"
    _cli(env, "export", str(export))
    world.store.close()
    port = free_port()
    proc = start_gunicorn(env, port=port, config=os.path.join(REPO, "deploy", "gunicorn.conf.py"))
    try:
        wait_for_port(port)
        for _ in range(20):  # a worker (likely both) holds the file open, and a snapshot
            assert get(port, params).status == 200
        _cli(
            env, "player", "add", "9999", "bob"
        )  # a write the old file's -wal holds (its readers are open)
        path = _path(world)
        _move_away(path, how, tmp_path)
        gone_at = time.monotonic()
        time.sleep(1.0)
        answers = _answers_until(port, params, gone_at + 2.0)
        assert answers and all(status == 503 and body["error"] == 503 for status, body in answers)
        assert _ready(port) == 503
        _cli(env, "init")
        _cli(env, "import", str(export))
        assert get(port, params).status == 200  # the same content: the old token works again
        _cli(env, "player", "revoke", str(world.user_id))
        revoked_at = time.monotonic()
        time.sleep(1.0)
        answers = _answers_until(port, params, revoked_at + 2.0)
        assert answers and all(body == INVALID for _, body in answers)
        assert _ready(port) == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert params["api_key"] not in err and params["game_auth_token"] not in err


def test_under_gunicorn_a_file_renamed_over_the_store_without_its_wal_is_refused(
    env, world, tmp_path
):
    """A new file made elsewhere (`authsvc init`, `import`, `player revoke` there) and renamed over
    the store, while the old file's -wal holds recent writes. The -wal and -shm beside it are still
    the old file's, and SQLite would read the old pages from them (the revoked player accepted): a
    worker that had the old file open answers 503 within 1 s instead, /readyz too, until they are
    removed; then the revocation holds. One worker, so that it is the one that had the file open (a
    worker that opens the store for the first time after such a move cannot tell:
    docs/stores.md)."""
    env = {k: v for k, v in env.items() if k != "AUTHSVC_MAX_STALENESS"}  # the default, 1 s
    params = world.params()  # minted for epoch 0
    export = tmp_path / "export.jsonl"
    _cli(env, "export", str(export))
    world.store.close()
    new_env = {**env, "AUTHSVC_STORE": "sqlite://" + str(tmp_path / "new.db")}
    for args in (("init",), ("import", str(export)), ("player", "revoke", str(world.user_id))):
        _cli(new_env, *args)
    path = _path(world)
    port = free_port()
    proc = start_gunicorn(
        env, port=port, config=os.path.join(REPO, "deploy", "gunicorn.conf.py"), workers=1
    )
    try:
        wait_for_port(port)
        assert get(port, params).status == 200  # the worker holds the file open, and a snapshot
        _cli(
            env, "player", "add", "9999", "bob"
        )  # a write the old file's -wal holds (its reader is open)
        os.replace(tmp_path / "new.db", path)
        replaced_at = time.monotonic()
        time.sleep(1.0)
        answers = _answers_until(port, params, replaced_at + 2.0)
        assert answers and all(
            status == 503 and body["error"] == 503 for status, body in answers
        ), answers
        assert _ready(port) == 503
        os.unlink(path + "-wal")
        os.unlink(path + "-shm")
        removed_at = time.monotonic()
        time.sleep(1.0)
        answers = _answers_until(port, params, removed_at + 2.0)
        assert answers and all(body == INVALID for _, body in answers), answers
        assert _ready(port) == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert params["api_key"] not in err and params["game_auth_token"] not in err
    assert err.count("was replaced, but") == 1  # once, not per request
