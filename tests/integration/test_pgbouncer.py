"""The PostgreSQL store through a real pgbouncer in transaction pooling mode (docs/stores.md,
"pgbouncer").

A throwaway pgbouncer from the local binary listens on a free loopback port in
front of the session's test database, with one server connection per pool
(``default_pool_size = 1``): two app stores (two client connections) take turns
on it, so each one's transactions land on the server connection the other one
used. The web process connects as a login role of the read-only ``authsvc_reader``
role, its statement timeout and read-only default set on the role (pgbouncer 1.18
refuses the startup ``options`` the web process sends, so the test's pgbouncer
ignores them, as docs/stores.md tells operators to do).
"""

from __future__ import annotations

import os
import pwd
import secrets
import tempfile
import urllib.parse

import pytest

from authsvc.tokens import api_key_digest
from tests import factories
from tests.pgserver import ThrowawayPgbouncer, find_pgbouncer
from tests.support import INVALID, MISSING_TEXT, PATH, make_testapp, skip_or_fail, wait_for_port

pytestmark = pytest.mark.engine("postgresql")

MISSING = {"success": False, "error": 400, "error_description": MISSING_TEXT}


@pytest.fixture
def web_role(pg_server_url):
    """A login role in authsvc_reader, with the settings the web process cannot send through
    pgbouncer."""
    import psycopg

    name = "authsvc_t_" + secrets.token_hex(5)
    with psycopg.connect(pg_server_url, autocommit=True) as superuser:
        superuser.execute(f"CREATE ROLE {name} LOGIN IN ROLE authsvc_reader")
        superuser.execute(f"ALTER ROLE {name} SET default_transaction_read_only = on")
        superuser.execute(f"ALTER ROLE {name} SET statement_timeout = '2s'")
    yield name
    with psycopg.connect(pg_server_url, autocommit=True) as superuser:
        superuser.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,)
        )
        superuser.execute(f"DROP ROLE {name}")


@pytest.fixture
def pgbouncer(store_url, web_role):
    """pgbouncer 127.0.0.1:<free port>, pool_mode=transaction, one server connection, trust auth;
    yields the web role's URL through it and its log. Under root it runs as 'postgres' (or
    'nobody')."""
    binary = find_pgbouncer()
    if binary is None:
        skip_or_fail("pgbouncer is not installed (apt-get install pgbouncer)")
    target = urllib.parse.urlsplit(store_url)
    user = (
        next((n for n in ("postgres", "nobody") if _user_exists(n)), None)
        if os.geteuid() == 0
        else None
    )
    bouncer = ThrowawayPgbouncer(
        binary,
        web_role,
        target.port or 5432,
        user,
        dbname=target.path.lstrip("/"),
        host=target.hostname or "127.0.0.1",
        pool_size=1,
    )
    try:
        wait_for_port(bouncer.port)
        yield bouncer.url, bouncer.logfile
    finally:
        bouncer.destroy()


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def test_core_cases_through_pgbouncer_in_transaction_mode(
    world, pgbouncer, pg_server_url, web_role
):
    import psycopg
    from psycopg.pq import Trace

    url, log = pgbouncer
    apps = [
        make_testapp(world.settings, store=url) for _ in range(2)
    ]  # two client connections, one server one
    ok = {"success": True, "user_id": world.user_id, "username": world.username}
    try:
        params = world.params()
        old_token = params["game_auth_token"]
        for _ in range(3):  # the two apps take turns: each one's query lands where the other's ran
            for app in apps:
                assert app.get(PATH, params).json == ok, open(log).read()[-2000:]
                assert app.get(PATH, world.params(game_auth_token="0" * 64)).json == INVALID
                assert app.get(PATH, world.params(api_key="k" * 43)).json == INVALID
                assert app.get(PATH, world.params(user_id="4243")).json == INVALID
                assert app.get(PATH, world.params(api_key=None)).json == MISSING
                assert app.get("/readyz").json["success"] is True
        assert (
            factories.revoke_player(world.store, world.user_id) == 1
        )  # the admin side, straight to PostgreSQL
        for app in apps:
            assert app.get(PATH, world.params(game_auth_token=old_token)).json == INVALID
            assert app.get(PATH, world.params()).json == ok
        # Still one round trip per authentication: one Sync, one ReadyForQuery, no set-up
        # statements.
        store = apps[0].app.store
        digest = api_key_digest(world.api_key)
        conn = store._conn()
        with tempfile.TemporaryFile() as trace:
            conn.pgconn.trace(trace.fileno())
            conn.pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
            for _ in range(3):
                assert store.credentials(digest, world.user_id).username == world.username
            conn.pgconn.untrace()
            trace.seek(0)
            lines = trace.read().decode().splitlines()  # Parse's query text spans several lines
            messages = [
                line.split("\t")[:3:2]
                for line in lines
                if line[:1] in ("F", "B") and line.count("\t") >= 2
            ]
        sent = [m[1] for m in messages if m[0] == "F"]
        assert sent.count("Sync") == 3 and [m[1] for m in messages].count("ReadyForQuery") == 3, (
            messages
        )
        assert "Query" not in sent
        with psycopg.connect(pg_server_url, autocommit=True) as superuser:
            servers = superuser.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = %s", (web_role,)
            ).fetchone()[0]
        assert servers == 1  # both apps were served by one server connection
        with psycopg.connect(
            url, autocommit=True
        ) as web:  # the read-only fence holds through pgbouncer
            assert web.execute("SHOW default_transaction_read_only").fetchone()[0] == "on"
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                web.execute("CREATE TEMP TABLE t (x int)")
    finally:
        for app in apps:
            app.app.store.close()
