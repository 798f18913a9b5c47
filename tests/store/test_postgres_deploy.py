"""The shipped PostgreSQL set-up (deploy/postgres/) works as documented in docs/stores.md.

On a server of the test's own: roles.sql as the DBA, `authsvc init` and the admin
commands as authsvc_owner, the web process as authsvc_web, which cannot write, and
`authsvc heartbeat` as authsvc_heartbeat_writer, which can write its row and nothing
else; then what each role may do, one right per test.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest

from authsvc.cli.command import main
from authsvc.errors import ConfigError
from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.store.postgres.store import MIGRATION_LOCK, MIGRATIONS
from authsvc.tokens import api_key_digest
from tests import factories
from tests.pgserver import Heartbeat, ThrowawayPostgres, find_bin_dir
from tests.support import apply_roles, make_testapp, skip_or_fail

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "postgres"


def local(url: str, port: int) -> str:
    """The shipped URL pointed at the test's server (same role and database, no TLS or passfile)."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(
        parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}", query="")
    )


def test_shipped_roles_and_settings(own_pg, secret_file, monkeypatch, capsys):
    import psycopg

    web = Settings.from_env({"AUTHSVC_CONFIG": str(DEPLOY / "web.toml")}, require_secret=False)
    admin = Settings.from_env({"AUTHSVC_CONFIG": str(DEPLOY / "admin.toml")}, require_secret=False)
    owner = Settings.from_env({"AUTHSVC_CONFIG": str(DEPLOY / "owner.toml")}, require_secret=False)
    assert urllib.parse.urlsplit(web.store).username == "authsvc_web"
    assert urllib.parse.urlsplit(admin.store).username == "authsvc_admin"
    assert urllib.parse.urlsplit(owner.store).username == "authsvc_owner"

    apply_roles(own_pg)
    monkeypatch.setenv("AUTHSVC_TOKEN_SECRET_FILE", str(secret_file))
    monkeypatch.setenv("AUTHSVC_STORE", local(owner.store, own_pg.port))
    assert main(["init"]) == 0
    monkeypatch.setenv("AUTHSVC_STORE", local(admin.store, own_pg.port))
    assert main(["game", "add", "Chess", "--json"]) == 0
    api_key = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["api_key"]
    assert main(["player", "add", "5", "bob"]) == 0
    assert main(["token", "issue", "--game", "1", "--user", "5"]) == 0
    token = capsys.readouterr().out.strip().splitlines()[-1]

    web_settings = Settings.from_env(
        {
            "AUTHSVC_STORE": local(web.store, own_pg.port),
            "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
        }
    )
    app = make_testapp(web_settings)  # start-up check passes as the web role
    res = app.get(
        "/api/authenticate.json",
        params={"user_id": "5", "game_auth_token": token, "api_key": api_key},
    )
    assert res.json == {"success": True, "user_id": 5, "username": "bob"}
    app.app.store.close()

    # The web role cannot write: read-only by default (roles.sql), and without privileges when that
    # is lifted.
    with psycopg.connect(local(web.store, own_pg.port), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("UPDATE players SET username = 'x'")
        conn.execute("SET default_transaction_read_only = off")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE players SET username = 'x'")
    # ... and neither can the admin command run with the web role's settings.
    monkeypatch.setenv("AUTHSVC_STORE", local(web.store, own_pg.port))
    assert main(["player", "rename", "5", "mallory"]) == 1
    assert "may not write" in capsys.readouterr().err


# -- what each role may do, one right per test, on a server set up as docs/stores.md says ----------

HEARTBEAT_ROLE = "authsvc_heartbeat_writer"
SERVICE_ROLES = ("authsvc_owner", "authsvc_admin", "authsvc_web", HEARTBEAT_ROLE)


@pytest.fixture(scope="module")
def deployed(pg_server_url):
    """A server of this module's own: roles.sql as the DBA, `authsvc init` as the owner, one game
    and player."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        skip_or_fail(
            "this test needs the PostgreSQL server binaries (initdb, pg_ctl) to run a server of "
            "its own"
        )
    server = ThrowawayPostgres(bin_dir)
    try:
        server.start()
        apply_roles(server)
        owner = open_store(role_url(server, "authsvc_owner"), readonly=False)
        owner.migrate()
        factories.add_game(owner, "Chess", api_key_digest("k" * 40), 0)
        factories.add_player(owner, 5, "bob")
        owner.close()
        yield server
    finally:
        server.destroy()


def role_url(server, role: str) -> str:
    """The authsvc database as ``role``, over TCP (the server-side keepalives apply to TCP only)."""
    return f"postgresql://{role}@127.0.0.1:{server.port}/authsvc"


def superuser(server):
    import psycopg

    return psycopg.connect(role_url(server, "postgres"), autocommit=True)


def test_no_service_role_may_call_a_large_object_function(deployed):
    """Large objects live outside the tables' grants and read-only transactions: no role of ours
    needs them."""
    with superuser(deployed) as conn:
        callable_by = conn.execute(
            "SELECT r, p.oid::regprocedure::text FROM pg_proc AS p, unnest(%s::text[]) AS r "
            "WHERE p.pronamespace = 'pg_catalog'::regnamespace "
            "AND (p.proname LIKE 'lo\\_%%' OR p.proname IN ('loread', 'lowrite')) "
            "AND has_function_privilege(r, p.oid, 'EXECUTE') ORDER BY 1, 2",
            (list(SERVICE_ROLES),),
        ).fetchall()
    assert callable_by == []


def test_the_web_role_cannot_write_a_large_object(deployed):
    """lo_from_bytea wrote large objects as authsvc_web inside its read-only transaction."""
    import psycopg

    with psycopg.connect(role_url(deployed, "authsvc_web"), autocommit=True) as conn:
        assert conn.execute("SHOW default_transaction_read_only").fetchone() == ("on",)
        for call in ("lo_from_bytea(0, '\\x00')", "lo_create(0)", "lo_creat(-1)"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT {call}")
    with superuser(deployed) as conn:
        assert conn.execute("SELECT count(*) FROM pg_largeobject_metadata").fetchone() == (0,)


def test_only_the_owner_may_take_an_advisory_lock(deployed):
    """Advisory locks are not grantable per key: whoever may call pg_advisory_lock may take the
    migration's."""
    with superuser(deployed) as conn:
        callable_by = conn.execute(
            "SELECT r, p.oid::regprocedure::text FROM pg_proc AS p, unnest(%s::text[]) AS r "
            "WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname LIKE '%%advisory%%' "
            "AND has_function_privilege(r, p.oid, 'EXECUTE') ORDER BY 1, 2",
            (list(SERVICE_ROLES),),
        ).fetchall()
    assert callable_by == [("authsvc_owner", "pg_advisory_xact_lock(bigint)")]


def test_the_web_role_cannot_block_a_migration(deployed):
    """A web session that tries to take the migration's lock and holds what it can read: `authsvc
    init` still runs."""
    import psycopg

    with psycopg.connect(role_url(deployed, "authsvc_web"), autocommit=True) as web:
        for take in ("pg_advisory_lock", "pg_try_advisory_lock", "pg_advisory_lock_shared"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                web.execute(f"SELECT {take}(%s)", (MIGRATION_LOCK,))
        web.execute("BEGIN")
        web.execute(
            "SELECT 1 FROM authsvc_schema, games, api_keys, players, authsvc_heartbeat"
        )  # its read locks
        owner = open_store(role_url(deployed, "authsvc_owner"), readonly=False)
        try:
            # a lock held by the web role: StoreLocked after ADMIN_LOCK_WAIT
            assert owner.migrate() == (len(MIGRATIONS), len(MIGRATIONS))
        finally:
            owner.close()
            web.execute("ROLLBACK")


def test_the_heartbeat_runs_as_its_own_role(deployed):
    """The heartbeat writer's role writes the heartbeat row, and puts it back when it was
    deleted."""
    with superuser(deployed) as conn:
        conn.execute("UPDATE authsvc_heartbeat SET at = '2000-01-01T00:00:00Z'")
        store = open_store(role_url(deployed, HEARTBEAT_ROLE), readonly=False)
        try:
            store.check()
            store.heartbeat_connections()
            store.write_heartbeat()
            assert conn.execute(
                "SELECT at > now() - interval '1 day' FROM authsvc_heartbeat"
            ).fetchone() == (True,)
            conn.execute("DELETE FROM authsvc_heartbeat")
            store.write_heartbeat()
            assert conn.execute("SELECT count(*) FROM authsvc_heartbeat").fetchone() == (1,)
        finally:
            store.close()


def test_the_admin_role_may_run_the_webhooks_retention(deployed):
    """`authsvc deliver` runs as the admin role (authsvc-deliver.service): its retention deletes a
    delivery done long ago, its attempt and its event, an event no webhook took, and the webhook,
    removed long ago."""
    with superuser(deployed) as conn:
        conn.execute(
            "INSERT INTO events (type, user_id, at_ms, data) VALUES ('player.revoked', 5, 1, '{}')"
        )
        hook = conn.execute(
            "INSERT INTO webhooks (url, events, secret, created_at, deleted_at) "
            "VALUES ('https://a.example.com/h', '[]', '', 1, 2) RETURNING id"
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO deliveries (webhook_id, event_id, user_id, state, next_at, created_at, "
            "done_at) SELECT %s, max(id), 5, 'delivered', 1, 1, 2 FROM events",
            (hook,),
        )
        conn.execute(
            "INSERT INTO delivery_attempts (delivery_id, n, at, duration_ms) SELECT max(id), 1, 2, "
            "1 FROM deliveries"
        )
        store = open_store(role_url(deployed, "authsvc_admin"), readonly=False)
        try:
            assert store.prune_deliveries(int(time.time() * 1000), 10) == (
                1,
                2,
                1,
            )  # and bob's player.created
        finally:
            store.close()
        assert conn.execute(
            "SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM deliveries) "
            "+ (SELECT count(*) FROM delivery_attempts) + (SELECT count(*) FROM webhooks)"
        ).fetchone() == (0,)


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT digest FROM api_keys",
        "SELECT username FROM players",
        "SELECT name FROM games",
        "UPDATE players SET username = 'mallory'",
        "INSERT INTO games (name, created_at) VALUES ('Forged', 0)",
        "DELETE FROM api_keys",
        "UPDATE authsvc_schema SET version = 1",
        "DELETE FROM authsvc_heartbeat",
        "TRUNCATE authsvc_heartbeat",
        "CREATE TABLE forged (x int)",
        "CREATE TEMP TABLE forged (x int)",
        "ALTER TABLE authsvc_heartbeat ADD COLUMN forged int",
        "DROP TABLE authsvc_heartbeat",
        "SELECT lo_from_bytea(0, '\\x00')",
        f"SELECT pg_advisory_lock({MIGRATION_LOCK})",
    ],
)
def test_the_heartbeat_role_can_do_nothing_else(deployed, statement):
    import psycopg

    with psycopg.connect(role_url(deployed, HEARTBEAT_ROLE), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)


def test_init_grants_the_heartbeat_role_again(deployed):
    """A store migrated before the role existed (an earlier release): the next `authsvc init` grants
    it."""
    with superuser(deployed) as conn:
        conn.execute(f"REVOKE ALL ON authsvc_heartbeat, authsvc_schema FROM {HEARTBEAT_ROLE}")
        store = open_store(role_url(deployed, HEARTBEAT_ROLE), readonly=False)
        owner = open_store(role_url(deployed, "authsvc_owner"), readonly=False)
        try:
            with pytest.raises(ConfigError):
                store.write_heartbeat()
            # ... and `authsvc heartbeat` says what grants it, not to make it a reader (of the api
            # keys).
            with pytest.raises(
                ConfigError, match="may not read the tables .*'authsvc init'"
            ) as refused:
                store.check()
            assert "authsvc_reader" not in str(refused.value)
            assert owner.migrate() == (len(MIGRATIONS), len(MIGRATIONS))
            store.check()
            store.write_heartbeat()
        finally:
            owner.close()
            store.close()


def test_authsvc_heartbeat_runs_with_its_shipped_settings(deployed, tmp_path):
    """The command the unit runs: heartbeat.toml (no token secret), its store pointed at the test's
    server."""
    writer = Heartbeat(role_url(deployed, HEARTBEAT_ROLE), tmp_path / "heartbeat.log")
    del writer.env["AUTHSVC_TOKEN_SECRET_FILE"]
    writer.env["AUTHSVC_CONFIG"] = str(DEPLOY / "heartbeat.toml")
    with superuser(deployed) as conn:
        conn.execute("UPDATE authsvc_heartbeat SET at = '2000-01-01T00:00:00Z'")
        writer.start()
        try:
            deadline = time.monotonic() + 60
            while conn.execute(
                "SELECT at < now() - interval '1 day' FROM authsvc_heartbeat"
            ).fetchone() == (True,):
                assert writer.process is not None and writer.process.poll() is None, writer.log()
                assert time.monotonic() < deadline, writer.log()
                time.sleep(0.1)
            sessions = conn.execute(
                "SELECT DISTINCT usename, application_name FROM pg_stat_activity WHERE "
                "application_name = 'authsvc-heartbeat'"
            ).fetchall()
        finally:
            writer.stop()
    assert sessions == [(HEARTBEAT_ROLE, "authsvc-heartbeat")]
    assert f"writing the primary's time into postgresql://{HEARTBEAT_ROLE}@" in writer.log()
    assert "cannot write" not in writer.log()


def test_the_shipped_heartbeat_settings_and_unit_use_its_role():
    heartbeat = Settings.from_env(
        {"AUTHSVC_CONFIG": str(DEPLOY / "heartbeat.toml")}, require_secret=False
    )
    assert urllib.parse.urlsplit(heartbeat.store).username == HEARTBEAT_ROLE
    unit = (DEPLOY.parent / "systemd" / "authsvc-heartbeat.service").read_text()
    assert "\nEnvironment=AUTHSVC_CONFIG=@CONF_DIR@/heartbeat.toml\n" in unit


KEEPALIVES = {
    "tcp_keepalives_idle": "5",
    "tcp_keepalives_interval": "2",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": "10000",
}


@pytest.mark.parametrize(
    "role, expected",
    [
        # The web role's pooled connections are idle for as long as no one logs in: no
        # idle_session_timeout.
        (
            "authsvc_web",
            {
                "idle_in_transaction_session_timeout": "10s",
                "idle_session_timeout": "0",
                **KEEPALIVES,
            },
        ),
        # The heartbeat writes five times a second: a session idle for 30 s has no writer any more.
        (
            HEARTBEAT_ROLE,
            {
                "idle_in_transaction_session_timeout": "5s",
                "idle_session_timeout": "30s",
                **KEEPALIVES,
            },
        ),
        # The admin command's sessions may wait for a person (a prompt) or a file: keepalives only.
        (
            "authsvc_owner",
            {"idle_in_transaction_session_timeout": "0", "idle_session_timeout": "0", **KEEPALIVES},
        ),
        (
            "authsvc_admin",
            {"idle_in_transaction_session_timeout": "0", "idle_session_timeout": "0", **KEEPALIVES},
        ),
    ],
)
def test_the_roles_sessions_end_when_their_client_is_gone(deployed, role, expected):
    import psycopg

    with psycopg.connect(role_url(deployed, role), autocommit=True) as conn:
        assert {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in expected} == expected


def test_privileges_sql_can_be_run_again(deployed):
    """An existing cluster is brought up to date by running privileges.sql again
    (docs/stores.md)."""

    def state():
        with superuser(deployed) as conn:
            return conn.execute(
                "SELECT (SELECT array_agg(setconfig::text ORDER BY setrole) FROM "
                "pg_db_role_setting), (SELECT array_agg(proacl::text ORDER BY oid) FROM pg_proc), "
                "(SELECT datacl FROM pg_database WHERE datname = 'authsvc')::text"
            ).fetchone()

    before = state()
    subprocess.run(
        [
            os.path.join(deployed.bin_dir, "psql"),
            role_url(deployed, "postgres"),
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-f",
            str(DEPLOY / "privileges.sql"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    assert state() == before


def test_init_on_an_up_to_date_store_needs_no_right_to_migrate(deployed):
    """`authsvc init` with the admin role's or the web role's settings (an upgrade's installer
    without owner.toml) on an up-to-date store: done, nothing changed; on an older one it names the
    owner."""
    for role in ("authsvc_admin", "authsvc_web"):
        store = open_store(role_url(deployed, role), readonly=False)
        try:
            assert store.migrate() == (len(MIGRATIONS), len(MIGRATIONS)), role
        finally:
            store.close()
    with superuser(deployed) as conn:
        conn.execute("UPDATE authsvc_schema SET version = version - 1")
        store = open_store(role_url(deployed, "authsvc_admin"), readonly=False)
        try:
            with pytest.raises(
                ConfigError,
                match="permission denied for this role .*init and audit prune as the owner",
            ):
                store.migrate()
        finally:
            store.close()
            conn.execute(f"UPDATE authsvc_schema SET version = {len(MIGRATIONS):d}")
