"""What only the PostgreSQL store has: roles, the hot path's shape, timeouts, start-up errors."""

from __future__ import annotations

import dataclasses
import os
import secrets
import tempfile
import time
import urllib.parse

import pytest

from authsvc.cli.command import main
from authsvc.errors import ConfigError, StoreLocked, StoreUnavailable
from authsvc.store import open_store
from authsvc.tokens import api_key_digest
from authsvc.web.app import make_app
from tests import factories
from tests.support import free_port, make_testapp


def with_user(url: str, user: str, password: str | None = None) -> str:
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(
        parts._replace(netloc=f"{user}{':' + password if password else ''}@{host}")
    )


@pytest.fixture
def superuser(pg_server_url):
    import psycopg

    conn = psycopg.connect(pg_server_url, autocommit=True)
    yield conn
    conn.close()


@pytest.fixture
def login_role(superuser):
    """Makes LOGIN roles (trust auth on loopback, so no password) and drops them afterwards."""
    made = []

    def make(options: str) -> str:
        name = "authsvc_t_" + secrets.token_hex(5)
        superuser.execute(f"CREATE ROLE {name} LOGIN {options}")
        made.append(name)
        return name

    yield make
    for name in made:
        superuser.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
        )
        owned = superuser.execute(
            "SELECT datname FROM pg_database WHERE datdba = (SELECT oid FROM pg_roles WHERE "
            "rolname = %s)",
            (name,),
        ).fetchall()
        for (database,) in owned:
            superuser.execute(f"DROP DATABASE {database} WITH (FORCE)")
        superuser.execute(f"DROP OWNED BY {name}")
        superuser.execute(f"DROP ROLE {name}")


# -- least privilege ---------------------------------------------------------------------


@pytest.mark.engine("postgresql")
def test_the_web_role_can_read_but_not_write(world, store_url, login_role):
    import psycopg

    web = login_role("IN ROLE authsvc_reader")
    web_url = with_user(store_url, web)
    app = make_testapp(dataclasses.replace(world.settings, store=web_url))
    assert app.get("/api/authenticate.json", params=world.params()).json["success"] is True

    # The web process's own connection cannot write, even if it lifts the read-only default.
    conn = app.app.store._conn()
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        conn.execute("UPDATE players SET username = 'mallory'")
    conn.execute("SET default_transaction_read_only = off")
    for sql in (
        "UPDATE players SET username = 'mallory'",
        "INSERT INTO players (user_id, username) VALUES (7, 'mallory')",
        "DELETE FROM api_keys",
        "CREATE TABLE evil (x int)",
    ):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql)
    app.app.store.close()
    assert world.store.get_player(world.user_id).username == "alice"
    assert world.store.get_player(7) is None


@pytest.mark.engine("postgresql")
def test_the_web_role_reads_only_the_players_columns_authentication_needs(
    world, store_url, login_role
):
    """The web path never reads a player's updated_at: its role is granted the four columns the
    authentication query reads, so a query that names another fails instead of slowing the hot
    path."""
    import psycopg

    web = login_role("IN ROLE authsvc_reader")
    app = make_testapp(dataclasses.replace(world.settings, store=with_user(store_url, web)))
    assert app.get("/api/authenticate.json", params=world.params()).json["success"] is True
    conn = app.app.store._conn()
    assert conn.execute("SELECT count(*) FROM players").fetchone()[0] >= 1
    for sql in ("SELECT updated_at_ms FROM players", "SELECT * FROM players"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql)
    app.app.store.close()


def test_the_updated_at_step_waits_briefly_for_a_long_read_of_players_then_fails_whole(
    pg_databases, monkeypatch
):
    """Migration 5's ALTER TABLE needs the players table to itself; every authentication would queue
    behind it while it waits. A read that holds the table (a pg_dump) makes `authsvc init` give up
    after MIGRATION_LOCK_WAIT with nothing changed, and a second run after the read goes through."""
    import psycopg

    from authsvc.store import base
    from authsvc.store.postgres import store as postgres

    monkeypatch.setattr(
        base, "ADMIN_LOCK_WAIT", 120.0
    )  # the admin command's own wait: not the one that ends it
    url = pg_databases.create(migrate=False)
    current = postgres.MIGRATIONS
    monkeypatch.setattr(postgres, "MIGRATIONS", current[:4])  # the schema before migration 5
    store = open_store(url, readonly=False)
    try:
        assert store.migrate() == (0, 4)
        monkeypatch.setattr(postgres, "MIGRATIONS", current)
        with psycopg.connect(url) as dump:  # a transaction left open, as pg_dump's is
            dump.execute("SELECT count(*) FROM players")
            started = time.monotonic()
            with pytest.raises(
                StoreLocked, match="migration 5: .*nothing was changed, run 'authsvc init' again"
            ):
                store.migrate()
            assert (
                time.monotonic() - started < 60
            )  # MIGRATION_LOCK_WAIT (2 s), far below the admin's 120 s
            dump.rollback()
        assert store.migrate() == (4, len(current))
        factories.add_player(store, 5, "bob")
        assert store.get_player(5).updated_at_ms is not None
    finally:
        store.close()


@pytest.mark.engine("postgresql")
def test_start_up_warns_when_the_web_role_can_write(world, store_url, login_role, caplog):
    web = login_role("IN ROLE authsvc_reader")
    with caplog.at_level("WARNING", logger="authsvc.store"):
        make_app(dataclasses.replace(world.settings, store=with_user(store_url, web)))
    assert not [r for r in caplog.records if "can write" in r.getMessage()]
    with caplog.at_level("WARNING", logger="authsvc.store"):
        make_app(world.settings)  # the tests' superuser URL
    assert [r for r in caplog.records if "can write" in r.getMessage()]


@pytest.mark.engine("postgresql")
def test_a_role_without_the_grant_fails_start_up_clearly(world, store_url, login_role):
    stranger = login_role("")
    with pytest.raises(ConfigError, match="may not read the tables"):
        make_app(dataclasses.replace(world.settings, store=with_user(store_url, stranger)))


def test_an_owner_role_without_superuser_runs_init_and_admin(
    pg_databases, login_role, secret_file, monkeypatch, capsys, superuser
):
    """The documented set-up (docs/stores.md): the DBA makes the roles and the database, the owner
    migrates."""
    superuser.execute(
        "DO $$ BEGIN CREATE ROLE authsvc_reader NOLOGIN; EXCEPTION WHEN duplicate_object THEN "
        "NULL; END $$"
    )
    owner = login_role("NOSUPERUSER NOCREATEDB NOCREATEROLE")
    web = login_role("IN ROLE authsvc_reader")
    url = pg_databases.create(migrate=False, owner=owner)
    monkeypatch.setenv("AUTHSVC_TOKEN_SECRET_FILE", str(secret_file))
    monkeypatch.setenv("AUTHSVC_STORE", with_user(url, owner))
    assert main(["init"]) == 0
    assert main(["init"]) == 0
    assert "up to date" in capsys.readouterr().out
    assert main(["game", "add", "Chess", "--json"]) == 0
    assert main(["player", "add", "5", "bob"]) == 0
    capsys.readouterr()
    monkeypatch.setenv("AUTHSVC_STORE", with_user(url, web))
    assert (
        main(["player", "add", "6", "eve"]) == 1
    )  # the web role cannot write through the admin command either
    assert "permission denied for this role" in capsys.readouterr().err
    reader = open_store(with_user(url, web), readonly=True)
    reader.check()
    reader.close()


# -- the hot path ------------------------------------------------------------------------


@pytest.mark.engine("postgresql")
def test_credentials_is_one_round_trip_on_a_prepared_statement(world, settings):
    from psycopg.pq import Trace

    store = open_store(settings.store, readonly=True, settings=settings)
    digest = api_key_digest(world.api_key)
    assert store.credentials(digest, world.user_id).username == "alice"
    conn = store._conn()
    with tempfile.TemporaryFile() as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
        for _ in range(3):
            assert store.credentials(digest, world.user_id).username == "alice"
        conn.pgconn.untrace()
        trace.seek(0)
        messages = [line.split("\t")[:3:2] for line in trace.read().decode().splitlines()]
    sent = [m[1] for m in messages if m[0] == "F"]
    assert (
        sent.count("Sync") == 3 and [m[1] for m in messages].count("ReadyForQuery") == 3
    )  # one round trip each
    assert "Parse" not in sent and "Query" not in sent  # no re-parsing, no set-up statements
    prepared = conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()
    assert any("LEFT JOIN players" in row[0] for row in prepared)
    store.close()


@pytest.mark.engine("postgresql")
def test_one_persistent_connection_per_process_opened_after_fork(world, settings):
    store = open_store(settings.store, readonly=True, settings=settings)
    digest = api_key_digest(world.api_key)
    pids = set()
    for _ in range(20):
        store.credentials(digest, world.user_id)
        pids.add(store._conn().info.backend_pid)
    assert len(pids) == 1  # the same connection for every call

    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the child, like a gunicorn worker: its own connection, the parent's left alone
        try:
            ok = store.credentials(digest, world.user_id).username == "alice"
            os.write(write_end, f"{int(ok)} {store._conn().info.backend_pid}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    answer = os.read(read_end, 100).decode().split()
    os.close(read_end)
    os.waitpid(child, 0)
    assert answer[0] == "1" and int(answer[1]) not in pids
    assert store.credentials(digest, world.user_id).username == "alice"
    assert store._conn().info.backend_pid in pids  # the parent's connection survived the child
    store.close()


# -- slow server, unreachable server ---------------------------------------------------


@pytest.mark.engine("postgresql")
def test_a_slow_server_gives_503_within_the_statement_timeout(world, superuser, store_url):
    import psycopg

    app = make_testapp(world.settings, pg_statement_timeout=0.5)
    assert app.get("/api/authenticate.json", params=world.params()).json["success"] is True
    locker = psycopg.connect(store_url)  # holds a lock the reader has to wait for: a "slow" server
    try:
        locker.execute("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE")
        for _ in range(2):
            started = time.monotonic()
            res = app.get("/api/authenticate.json", params=world.params(), status=503)
            assert time.monotonic() - started < 2.0
            assert res.json == {
                "success": False,
                "error": 503,
                "error_description": res.json["error_description"],
            }
            assert res.json["error_description"]
    finally:
        locker.rollback()
        locker.close()
    assert app.get("/api/authenticate.json", params=world.params()).json["success"] is True
    app.app.store.close()


@pytest.mark.engine("postgresql")
def test_start_up_with_an_unreachable_server_names_it_without_the_password(settings):
    url = (
        f"postgresql://authsvc_web:Sup3rS3cret@127.0.0.1:{free_port()}/authsvc?password=Sup3rS3cret"
    )
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        make_app(dataclasses.replace(settings, store=url))
    message = str(caught.value)
    assert time.monotonic() - started < 10
    assert "unreachable" in message and "127.0.0.1" in message and "***" in message
    assert "Sup3rS3cret" not in message and "\n" not in message


def test_admin_command_with_an_unreachable_server_says_so_in_one_line(
    secret_file, monkeypatch, capsys
):
    monkeypatch.setenv(
        "AUTHSVC_STORE", f"postgresql://owner:Sup3rS3cret@127.0.0.1:{free_port()}/authsvc"
    )
    monkeypatch.setenv("AUTHSVC_TOKEN_SECRET_FILE", str(secret_file))
    assert main(["game", "list"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("authsvc: error: postgresql store") and err.count("\n") == 1
    assert "Sup3rS3cret" not in err and "Traceback" not in err


@pytest.mark.engine("postgresql")
def test_a_reader_whose_server_vanishes_raises_store_unavailable(settings, world):
    store = open_store(settings.store, readonly=True, settings=settings)
    digest = api_key_digest(world.api_key)
    assert store.credentials(digest, world.user_id) is not None
    store._conn().close()  # as if the server had dropped it
    assert store.credentials(digest, world.user_id) is not None  # reconnected by itself
    broken = open_store(
        f"postgresql://postgres@127.0.0.1:{free_port()}/x", readonly=True, settings=settings
    )
    with pytest.raises(StoreUnavailable):
        broken.credentials(digest, world.user_id)
    store.close()
