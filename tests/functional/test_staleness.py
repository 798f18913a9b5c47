"""The documented bound on stale answers (AUTHSVC_MAX_STALENESS, default 1 s; docs/stores.md).

The SQLite reader keeps one snapshot for up to max_staleness seconds. These tests
show both sides: the snapshot is really kept (an answer can be stale, so the
tests below could fail), and no answer is staler than the bound, for each
change an admin makes: revoke, disable a player, disable a game, rename, and a
key rotation that expires the old key. PostgreSQL keeps no snapshot.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time

import pytest
import webtest

from authsvc.store.sqlite.store import SQLiteStore
from authsvc.tokens import api_key_digest, new_api_key
from authsvc.web.app import App, make_app
from tests import factories
from tests.support import (
    INVALID,
    FakeClock,
    free_port,
    get,
    start_gunicorn,
    until_both_workers_counted,
    wait_for_port,
)


def _rotate(world):
    """A new key for the game; the world's key expired a second ago."""
    now = int(time.time())
    factories.add_api_key(world.store, world.game_id, api_key_digest(new_api_key()), now, now - 1)


CHANGES = {
    "revoke": lambda world: factories.revoke_player(world.store, world.user_id),
    "disable player": lambda world: factories.set_player_enabled(world.store, world.user_id, False),
    "disable game": lambda world: factories.set_game_enabled(world.store, world.game_id, False),
    "old key expired by a rotation": _rotate,
}


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def stale_app(world, clock):
    """The app with the default bound, on a SQLite reader whose clock the test moves."""
    settings = dataclasses.replace(world.settings, max_staleness=1.0)
    store = SQLiteStore(
        settings.store, readonly=True, max_staleness=settings.max_staleness, clock=clock
    )
    app = webtest.TestApp(App(settings, store), lint=True)
    yield app
    store.close()


@pytest.mark.engine("sqlite")
@pytest.mark.parametrize("change", CHANGES)
def test_a_change_is_seen_within_the_bound_and_not_before(stale_app, world, clock, change):
    params = world.params()  # minted before the change (a revoke changes the epoch)
    assert stale_app.get("/api/authenticate.json", params).json["success"] is True
    CHANGES[change](world)
    clock.now += 0.999
    assert (
        stale_app.get("/api/authenticate.json", params).json["success"] is True
    )  # the snapshot is kept
    clock.now += 0.001
    assert (
        stale_app.get("/api/authenticate.json", params).json == INVALID
    )  # 1 s after the snapshot: seen


@pytest.mark.engine("sqlite")
def test_a_rename_is_seen_within_the_bound(stale_app, world, clock):
    assert stale_app.get("/api/authenticate.json", world.params()).json["username"] == "alice"
    factories.rename_player(world.store, world.user_id, "alice2")
    clock.now += 0.5
    assert stale_app.get("/api/authenticate.json", world.params()).json["username"] == "alice"
    clock.now += 0.5
    assert stale_app.get("/api/authenticate.json", world.params()).json["username"] == "alice2"


@pytest.mark.engine("sqlite")
def test_a_stored_expiry_needs_no_new_snapshot(world, clock):
    """An expiry already in the store is checked against the wall clock on every request."""
    settings = dataclasses.replace(world.settings, max_staleness=1.0)
    expires_at = 2_000_000_000
    factories.add_api_key(
        world.store, world.game_id, "0" * 64, 0, expires_at
    )  # the world's key now expires then
    store = SQLiteStore(
        settings.store, readonly=True, max_staleness=1.0, clock=clock
    )  # a snapshot that never ages
    wall = [expires_at - 1.0]
    app = webtest.TestApp(App(settings, store, clock=lambda: wall[0]))
    assert app.get("/api/authenticate.json", world.params()).json["success"] is True
    wall[0] = expires_at
    assert app.get("/api/authenticate.json", world.params()).json == INVALID
    store.close()


@pytest.mark.engine("postgresql")
def test_postgresql_keeps_no_snapshot(world):
    """With the default bound, PostgreSQL still sees every change at the next request."""
    settings = dataclasses.replace(world.settings, max_staleness=1.0)
    app = webtest.TestApp(make_app(settings))
    params = world.params()
    assert app.get("/api/authenticate.json", params).json["success"] is True
    factories.revoke_player(world.store, world.user_id)
    assert app.get("/api/authenticate.json", params).json == INVALID
    app.app.store.close()


@pytest.mark.engine("sqlite")
def test_under_gunicorn_every_request_a_second_after_a_revoke_is_refused(env, world, tmp_path):
    """Real workers, the default bound, the real admin command: no worker answers from a snapshot
    older than 1 s."""
    metrics_dir = tmp_path / "metrics"  # where each worker counts its answers: tells them apart
    metrics_dir.mkdir()
    env = {k: v for k, v in env.items() if k != "AUTHSVC_MAX_STALENESS"}  # the default
    env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    port = free_port()
    proc = start_gunicorn(env, port=port)
    try:
        wait_for_port(port)
        params = world.params()
        until_both_workers_counted(
            port, params, metrics_dir, result="success"
        )  # both hold a snapshot
        done = subprocess.run(
            [sys.executable, "-m", "authsvc.cli.command", "player", "revoke", str(world.user_id)],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        revoked_at = time.monotonic()
        time.sleep(1.0)
        answers = []
        while time.monotonic() < revoked_at + 2.0:  # bounded: about a second of requests
            answers.append(json.loads(get(port, params).body))
            time.sleep(0.02)
        assert answers and all(a == INVALID for a in answers)
        until_both_workers_counted(
            port, params, metrics_dir, result="wrong_token", answer=INVALID
        )  # each refuses
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


@pytest.mark.engine("sqlite")
def test_a_new_key_works_at_once_and_unknown_keys_look_again_only_after_a_commit(world, clock):
    """A key the snapshot lacks is looked up in a new transaction if something was committed since
    the snapshot began (found: the snapshot is renewed), so a rotated or new game's key works at
    once, the reader's clock standing still; a stream of unknown keys makes no lookup while nothing
    is committed, and one per commit (counted: the reads of the key table), and a known key never
    does (docs/design.md, "Freshness")."""
    settings = dataclasses.replace(world.settings, max_staleness=1.0)
    store = SQLiteStore(settings.store, readonly=True, max_staleness=1.0, clock=clock)
    app = webtest.TestApp(App(settings, store), lint=True)
    assert app.get("/api/authenticate.json", world.params()).json["success"] is True  # the snapshot
    statements: list[str] = []
    store._conn().set_trace_callback(statements.append)

    def key_reads() -> tuple[int, int]:
        """(lookups of one key, reads of the whole key table) since the last call."""
        reads = (
            sum("WHERE digest" in sql for sql in statements),
            sum("FROM api_keys AS k" in sql for sql in statements),
        )
        statements.clear()
        return reads

    for _ in range(20):  # nothing committed since the snapshot: no lookup
        assert (
            app.get("/api/authenticate.json", world.params(api_key=new_api_key())).json["error"]
            == 403
        )
    assert key_reads() == (0, 0)
    new_key = new_api_key()
    factories.add_api_key(
        world.store, world.game_id, api_key_digest(new_key), int(time.time()), time.time() + 60
    )
    assert app.get("/api/authenticate.json", world.params(api_key=new_key)).json["success"] is True
    assert (
        app.get("/api/authenticate.json", world.params()).json["success"] is True
    )  # the old key still works
    assert key_reads() == (1, 1)  # looked up, found: the snapshot renewed
    factories.add_player(world.store, 4343, "bob")  # a commit that adds no key
    for _ in range(20):
        assert (
            app.get("/api/authenticate.json", world.params(api_key=new_api_key())).json["error"]
            == 403
        )
    assert key_reads() == (
        1,
        0,
    )  # the first unknown key after the commit looks, not found: no renewal
    assert app.get("/api/authenticate.json", world.params(api_key=new_key)).json["success"] is True
    assert key_reads() == (0, 0)
    store.close()
