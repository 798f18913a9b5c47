"""Shared fixtures: throwaway secrets and stores, a provisioned game and player, WebTest apps.

Every test that uses ``store_url`` (and so ``env``, ``settings``, ``admin_store``,
``world``, ``app``) runs twice, on SQLite and on PostgreSQL, in the store, integration
and system tiers; in the functional tier, on SQLite (the tier is the folder: tests/tiers.py). A test
that is about one engine says so in one way only, the ``engine`` marker::

    @pytest.mark.engine("sqlite")          # one test
    pytestmark = pytest.mark.engine("postgresql")  # a whole module

(no ``parametrize("store_url", ...)``, no module overriding the ``store_url``
fixture; tests/unit/test_suite_rules.py checks it). Tests that need a PostgreSQL
server of their own use the ``own_pg`` fixture.

PostgreSQL is ``AUTHSVC_TEST_POSTGRES_URL`` (a superuser URL) if set, else a
throwaway server from the local binaries, else the PostgreSQL tests are skipped
(failed under AUTHSVC_TEST_STRICT=1). One fresh database per test session,
emptied before each test.

Helpers that are not fixtures (skip_or_fail, make_testapp, start_gunicorn, get,
free_port, ...) live in tests/support.py; the throwaway server in
tests/pgserver.py. A test module never imports another test module.

Every test that runs gunicorn starts it with ``start_gunicorn`` (harness/processes.py,
shared with scripts/bench), whose parameters cover what they vary: config file,
workers, preload, environment, bind. No test depends on the order tests run in:
``pytest -p harness.reverse_order`` runs them backwards to show it.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import time
import urllib.parse

import pytest
import webtest

from authsvc.settings import Settings
from authsvc.store import open_store, redact_url
from authsvc.tokens import api_key_digest, mint_token, new_api_key
from tests import factories, pgserver
from tests.support import AdminClient, make_testapp, skip_or_fail
from tests.tiers import BOTH_ENGINES, LANES, ORDER, system_lane, tier_of

ENGINES = ("sqlite", "postgresql")


@pytest.fixture
def secret_file(tmp_path):
    """A throwaway token secret, made fresh for each test."""
    path = tmp_path / "token-secret"
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


def _psycopg():
    try:
        import psycopg
    except ImportError:
        skip_or_fail("psycopg is not installed (pip install -e '.[postgres]')")
    return psycopg


@pytest.fixture(scope="session")
def pg_server_url():
    """A superuser URL of a running PostgreSQL server, for the whole session."""
    psycopg = _psycopg()
    url = os.environ.get("AUTHSVC_TEST_POSTGRES_URL")
    if url:
        try:
            psycopg.connect(url, connect_timeout=5).close()
        except psycopg.Error as e:
            skip_or_fail(
                f"AUTHSVC_TEST_POSTGRES_URL={redact_url(url)} is unreachable: {type(e).__name__}"
            )
        yield url
        return
    bin_dir = pgserver.find_bin_dir()
    if bin_dir is None:
        skip_or_fail(
            "no PostgreSQL: set AUTHSVC_TEST_POSTGRES_URL or install the server binaries (initdb, "
            "pg_ctl)"
        )
    server = pgserver.ThrowawayPostgres(bin_dir)
    try:
        server.start()
        yield server.url
    finally:
        server.destroy()


@pytest.fixture
def own_pg(pg_server_url):
    """A PostgreSQL server of this test's own (stopping it or adding roles disturbs nobody)."""
    bin_dir = pgserver.find_bin_dir()
    if bin_dir is None:
        skip_or_fail(
            "this test needs the PostgreSQL server binaries (initdb, pg_ctl) to run a server of "
            "its own"
        )
    server = pgserver.ThrowawayPostgres(bin_dir)
    try:
        server.start()
        yield server
    finally:
        server.destroy()


class PgDatabases:
    """Creates throwaway databases on the session's server and drops them all at the end."""

    def __init__(self, server_url: str):
        import psycopg

        self.server_url = server_url
        self.conn = psycopg.connect(server_url, autocommit=True)
        self.names: list[str] = []

    def url(self, name: str) -> str:
        """The server URL with another database name (AUTHSVC_TEST_POSTGRES_URL must be a URL)."""
        return urllib.parse.urlunsplit(
            urllib.parse.urlsplit(self.server_url)._replace(path="/" + name)
        )

    def create(self, migrate: bool = True, owner: str | None = None) -> str:
        """A new empty database (migrated unless told not to); returns its URL."""
        from authsvc.store.postgres.store import PostgresStore

        name = "authsvc_test_" + secrets.token_hex(6)
        self.conn.execute(f"CREATE DATABASE {name}" + (f" OWNER {owner}" if owner else ""))
        self.names.append(name)
        url = self.url(name)
        if migrate:
            store = PostgresStore(url, readonly=False)
            store.migrate()
            store.close()
        return url

    def drop_all(self) -> None:
        for name in self.names:
            self.conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        self.conn.close()


@pytest.fixture(scope="session")
def pg_databases(pg_server_url):
    databases = PgDatabases(pg_server_url)
    yield databases
    databases.drop_all()


@pytest.fixture(scope="session")
def pg_session_database(pg_databases):
    """The session's migrated database and a connection to it, for emptying it between tests."""
    import psycopg

    url = pg_databases.create()
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("SET lock_timeout = '10s'")
    yield url, conn
    conn.close()


def _empty_pg(conn) -> None:
    """Close every other session on the database (a leftover app's connection), then empty it."""
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    conn.execute(
        "TRUNCATE games, api_keys, players, deleted_players, audit, audit_names, player_keys, "
        "api_tokens, idempotency_keys, webhooks, events, deliveries, delivery_attempts, "
        "deliverer_lease, restore_generation, token_secret_fingerprints RESTART IDENTITY"
    )
    conn.execute(
        "UPDATE audit_chain SET anchor_id = 0, anchor_hash = %s, head_id = 0, head_hash = %s",
        ("0" * 64,) * 2,
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "engine(name): run this test on one store engine only ('sqlite' or 'postgresql')"
    )
    for tier in ORDER:
        config.addinivalue_line("markers", f"{tier}: the {tier} tier (tests/tiers.py)")
    for lane in LANES:
        config.addinivalue_line(
            "markers", f"lane_{lane}: the system tier's {lane} lane (tests/tiers.py)"
        )


def pytest_collection_modifyitems(items):
    """Mark each test with its module's tier, the folder it sits in (tests/unit/, ...:
    tests/tiers.py), so ``-m unit`` and friends select tiers, and a system-tier test with its
    lane."""
    for item in items:
        tier = tier_of(item.path)
        if tier is not None:
            item.add_marker(tier)
        if tier == "system":
            item.add_marker(f"lane_{system_lane(item.path.stem)}")


def pytest_generate_tests(metafunc):
    """Run each test that uses ``store_url`` on the engine its ``engine`` marker names, else on both
    in the tiers about engines (tests/tiers.py) and on SQLite in the functional tier, whose front
    doors are engine-blind."""
    if "store_url" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("engine")
    if marker is not None:
        engines = marker.args
    else:
        engines = ENGINES if tier_of(metafunc.definition.path) in BOTH_ENGINES else ("sqlite",)
    unknown = set(engines) - set(ENGINES)
    if unknown:
        raise pytest.UsageError(
            f"{metafunc.definition.nodeid}: unknown engine {sorted(unknown)}; known: {ENGINES}"
        )
    metafunc.parametrize("store_url", engines, indirect=True)


@pytest.fixture
def store_url(request, tmp_path):
    """The store under test: a fresh SQLite file, or the session's PostgreSQL database emptied."""
    if request.param == "sqlite":
        return "sqlite://" + str(tmp_path / "authsvc.db")
    url, conn = request.getfixturevalue("pg_session_database")
    _empty_pg(conn)
    return url


@pytest.fixture
def env(store_url, secret_file):
    """Environment variables that point the service and the admin command at the throwaway store.

    AUTHSVC_MAX_STALENESS=0: these suites check that each change is seen by the
    very next request. The default (the SQLite reader keeps a snapshot for up to
    1 s) has tests of its own in tests/functional/test_staleness.py.
    """
    return {
        "AUTHSVC_STORE": store_url,
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
        "AUTHSVC_MAX_STALENESS": "0",
    }


@pytest.fixture
def command_as_alice(monkeypatch, env, capsys):
    """run(*argv) -> (exit code, stdout, stderr): the real `authsvc` command (its main) on the store
    under test, as the sudo user alice (the audit trail's actor ``cli:alice``)."""
    from authsvc.cli import command

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AUTHSVC_CONFIG", raising=False)
    monkeypatch.setenv("SUDO_USER", "alice")

    def run(*argv):
        try:
            code = command.main(list(argv))
        except SystemExit as e:
            code = e.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def settings(env):
    return Settings.from_env(env)


@pytest.fixture
def admin_store(settings):
    """A migrated store opened read-write, as the admin command opens it."""
    store = open_store(settings.store, readonly=False, settings=settings)
    store.migrate()
    yield store
    store.close()


@dataclasses.dataclass
class World:
    """One game with its api key and one player, plus helpers to make valid requests."""

    settings: Settings
    store: object
    game_id: int
    api_key: str
    user_id: int
    username: str

    def token(self, game_id=None, user_id=None, epoch=None) -> str:
        player = self.store.get_player(user_id or self.user_id)
        return mint_token(
            self.settings.token_secrets[0],
            game_id or self.game_id,
            user_id or self.user_id,
            player.epoch if epoch is None else epoch,
        )

    def params(self, **overrides) -> dict:
        params = {
            "user_id": str(self.user_id),
            "game_auth_token": self.token(),
            "api_key": self.api_key,
        }
        params.update(overrides)
        return {k: v for k, v in params.items() if v is not None}

    def add_game(self, name: str) -> tuple[int, str]:
        key = new_api_key()
        game = factories.add_game(self.store, name, api_key_digest(key), int(time.time()))
        return game.id, key


@pytest.fixture
def world(settings, admin_store) -> World:
    api_key = new_api_key()
    game = factories.add_game(admin_store, "Chess", api_key_digest(api_key), int(time.time()))
    factories.add_player(admin_store, 4242, "alice")
    return World(settings, admin_store, game.id, api_key, 4242, "alice")


@pytest.fixture
def app(world) -> webtest.TestApp:
    """The WSGI app on the world's store, through WebTest with its WSGI lint on."""
    testapp = make_testapp(world.settings)
    yield testapp
    testapp.app.store.close()


@pytest.fixture
def admin(world, settings) -> AdminClient:
    """The admin API on the world's store through WebTest (``.app``), and its tokens
    (``.headers(name, scopes)``)."""
    client = AdminClient(settings, world.store)
    yield client
    client.close()
