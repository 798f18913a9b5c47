"""What only the embedded store promises: WAL, a read-only web connection, per-process connections."""

from __future__ import annotations

import os
import sqlite3

import pytest
import webtest

from authsvc.app import make_app
from authsvc.store.sqlite import SQLiteStore, path_from_url


@pytest.fixture
def store_url(tmp_path):
    return "sqlite://" + str(tmp_path / "authsvc.db")


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
