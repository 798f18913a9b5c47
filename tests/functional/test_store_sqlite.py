"""What only the embedded store promises: WAL, a read-only web connection, per-process
connections."""

from __future__ import annotations

import os
import sqlite3

import pytest
import webtest

from authsvc.store.sqlite.store import SQLiteStore, path_from_url
from authsvc.tokens import api_key_digest, new_api_key
from authsvc.web.app import make_app
from tests import factories

pytestmark = pytest.mark.engine("sqlite")


def test_path_from_url():
    assert path_from_url("sqlite:///var/lib/authsvc/authsvc.db") == "/var/lib/authsvc/authsvc.db"
    assert path_from_url("sqlite://var/authsvc.db") == "var/authsvc.db"


def test_init_puts_the_file_in_wal_mode(admin_store, settings):
    conn = sqlite3.connect(path_from_url(settings.store))
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()


def test_migrate_twice_is_a_no_op(admin_store):
    version = admin_store.migrate()[1]
    assert admin_store.migrate() == (version, version)


def test_the_web_connection_cannot_write(world, settings):
    reader = SQLiteStore(settings.store, readonly=True)
    conn = reader._conn()
    with pytest.raises(sqlite3.OperationalError, match="readonly|read-only|query_only"):
        conn.execute("UPDATE players SET username = 'mallory'")
    reader.close()
    assert world.store.get_player(world.user_id).username == "alice"


def test_the_web_connection_maps_the_file(world, settings):
    reader = SQLiteStore(settings.store, readonly=True)
    assert reader._conn().execute("PRAGMA mmap_size").fetchone()[0] == 1 << 30
    reader.close()


def test_each_process_opens_its_own_connection(world, settings):
    reader = SQLiteStore(settings.store, readonly=True)
    parent_conn = reader._conn()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must not reuse the parent's connection
        try:
            child_conn = reader._conn()
            ok = child_conn is not parent_conn and reader.credentials("x", 1) is None
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    assert reader._conn() is parent_conn  # the parent keeps its own
    reader.close()


def test_one_query_per_authentication(world):
    store = SQLiteStore(world.settings.store, readonly=True)
    statements = []
    store._conn().set_trace_callback(statements.append)
    app = webtest.TestApp(make_app(world.settings, store=store))
    assert app.get("/api/authenticate.json", world.params()).json["success"] is True
    assert app.get("/api/authenticate.json", world.params(api_key="nope")).json["error"] == 403
    assert len(statements) == 2 and all(s.lstrip().startswith("SELECT") for s in statements)
    store.close()


def test_with_a_snapshot_one_query_per_authentication_and_one_per_snapshot(world):
    clock = [0.0]
    store = SQLiteStore(
        world.settings.store, readonly=True, max_staleness=1.0, clock=lambda: clock[0]
    )
    statements = []
    store._conn().set_trace_callback(statements.append)
    app = webtest.TestApp(make_app(world.settings, store=store))
    for _ in range(3):
        assert app.get("/api/authenticate.json", world.params()).json["success"] is True
    # The journal mode (once per connection: WAL, the -shm mapped), BEGIN, the key table, then one
    # player lookup per authentication.
    assert [s.split()[0] for s in statements] == [
        "PRAGMA",
        "BEGIN",
        "SELECT",
        "SELECT",
        "SELECT",
        "SELECT",
    ]
    del statements[0]
    assert app.get("/api/authenticate.json", world.params(api_key="nope")).json["error"] == 403
    # An unknown key, nothing committed since the snapshot: the player looked up all the same
    # (tests/functional/test_equal_work.py), nothing else.
    assert [s.split()[0] for s in statements[5:]] == ["SELECT"]
    factories.add_player(world.store, 4343, "bob")
    # After a commit: a new transaction, the key looked up (not there), then the player.
    assert app.get("/api/authenticate.json", world.params(api_key="nope")).json["error"] == 403
    assert [s.split()[0] for s in statements[6:]] == ["COMMIT", "BEGIN", "SELECT", "SELECT"]
    assert app.get("/api/authenticate.json", world.params(api_key="nope")).json["error"] == 403
    assert len(statements) == 11 and statements[10].split()[0] == "SELECT"
    clock[0] = 1.0
    assert app.get("/api/authenticate.json", world.params()).json["success"] is True
    assert [s.split()[0] for s in statements[11:]] == ["COMMIT", "BEGIN", "SELECT", "SELECT"]
    store.close()


def test_not_in_wal_mode_a_key_the_snapshot_lacks_is_refused_without_a_lookup(world):
    """A store in rollback-journal mode (a restored copy, before 'authsvc init'): a snapshot's
    shared lock keeps every commit out until it ends, so an unknown key needs no test and gets no
    lookup; a key added once the snapshot has ended works."""
    world.store.close()
    path = path_from_url(world.settings.store)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode = DELETE").fetchone() == ("delete",)
    conn.close()
    clock = [0.0]
    store = SQLiteStore(
        world.settings.store, readonly=True, max_staleness=1.0, clock=lambda: clock[0]
    )
    app = webtest.TestApp(make_app(world.settings, store=store))
    assert app.get("/api/authenticate.json", world.params()).json["success"] is True
    statements: list[str] = []
    store._conn().set_trace_callback(statements.append)
    for _ in range(3):
        assert app.get("/api/authenticate.json", world.params(api_key="nope")).json["error"] == 403
    assert [s.split()[0] for s in statements] == ["SELECT"] * 3
    store.close()  # the snapshot ends (as the bound or the reaper ends it): now a key can be added
    new_key = new_api_key()
    factories.add_api_key(world.store, world.game_id, api_key_digest(new_key), 0, None)
    assert app.get("/api/authenticate.json", world.params(api_key=new_key)).json["success"] is True
    store.close()


def test_the_snapshot_path_answers_exactly_as_the_one_query_path(admin_store, settings):
    """Every (key, player) pair of a varied store: the snapshot reader gives the fresh reader's
    Credentials."""
    keys = {}
    for n, (enabled, expires_at) in enumerate(
        [(True, None), (False, None), (True, 1_000), (True, 2**40)]
    ):
        game = factories.add_game(admin_store, f"game{n}", f"{n:064x}", 0)
        keys[f"{n:064x}"] = game.id
        if expires_at is not None:
            factories.add_api_key(
                admin_store, game.id, f"{n + 100:064x}", 0, expires_at
            )  # the first key gets the expiry
            keys[f"{n + 100:064x}"] = game.id
        if not enabled:
            factories.set_game_enabled(admin_store, game.id, False)
    for user_id, enabled, revokes in [
        (1, True, 0),
        (2, False, 0),
        (3, True, 2),
        (2**63 - 1, True, 1),
    ]:
        factories.add_player(admin_store, user_id, f"p{user_id}")
        factories.set_player_enabled(admin_store, user_id, enabled)
        for _ in range(revokes):
            factories.revoke_player(admin_store, user_id)
    fresh = SQLiteStore(settings.store, readonly=True)
    ticks = iter(range(10_000))
    snapshot = SQLiteStore(
        settings.store, readonly=True, max_staleness=1.0, clock=lambda: float(next(ticks))
    )
    seen = 0
    for digest in [*keys, "f" * 64]:
        for user_id in (1, 2, 3, 4, 2**63 - 1):
            expected = fresh.credentials(digest, user_id)
            assert snapshot.credentials(digest, user_id) == expected
            assert type(snapshot.credentials(digest, user_id)) is type(expected)
            seen += expected is not None
    assert seen == 6 * 5  # every key was found, with and without a player
    fresh.close()
    snapshot.close()
