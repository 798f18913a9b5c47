"""The Store contract (authsvc/store/base.py), run unchanged on SQLite and on PostgreSQL.

``admin_store`` comes from conftest: a migrated store, parametrized over both
engines through ``store_url``. Every method of Store is exercised here.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3

import pytest

from authsvc.errors import ConfigError, StoreFull, StoreLocked, StoreUnavailable
from authsvc.store import open_store
from authsvc.store.audit import Audit
from authsvc.store.base import ApiKey, Conflict, Credentials, Game, NotEmpty, Player
from authsvc.tokens import api_key_digest
from tests import factories
from tests.support import free_port, hold_write_lock, skip_or_fail

NOW = 1_700_000_000


def digest(n: int) -> str:
    return api_key_digest(f"key-{n}")


def at(ms: int) -> Audit:
    """A write's Audit stamped ``ms`` (unix milliseconds): the time a player's updated_at takes."""
    return Audit("cli:test", None, ms)


def unstamped(player: Player | None) -> Player | None:
    """The player without its updated_at, for tests about the other fields (writes stamped with the
    clock)."""
    return None if player is None else dataclasses.replace(player, updated_at_ms=None)


@pytest.fixture
def empty_url(store_url, request, tmp_path):
    """A store of the same engine that exists but was never migrated."""
    if store_url.startswith("sqlite://"):
        return "sqlite://" + str(tmp_path / "fresh.db")
    return request.getfixturevalue("pg_databases").create(migrate=False)


@pytest.fixture
def reader(admin_store, settings):
    """The same store opened read-only, as the web process opens it."""
    store = open_store(settings.store, readonly=True, settings=settings)
    yield store
    store.close()


# -- migrations and check ------------------------------------------------------------------


def test_migrate_from_scratch_then_rerun_is_a_no_op(empty_url, settings):
    store = open_store(empty_url, readonly=False, settings=settings)
    try:
        before, after = store.migrate()
        assert before == 0 and after >= 1
        assert store.migrate() == (after, after)
        factories.add_player(store, 1, "a")
        assert store.migrate() == (after, after)
        assert unstamped(store.get_player(1)) == Player(1, "a", 0, True)  # rerun kept the data
    finally:
        store.close()


def test_a_store_migrated_to_the_fan_out_mark_sends_no_event_twice(
    empty_url, settings, monkeypatch
):
    """A store of the release that wrote deliveries with their events (SQLite 7, PostgreSQL 8):
    after the migration that gives each webhook its fan-out mark, the events it already has
    deliveries of are not fanned out again; the next event is."""
    import importlib

    from tests.support import store_sql

    engine = importlib.import_module(
        "authsvc.store.sqlite.store"
        if empty_url.startswith("sqlite://")
        else "authsvc.store.postgres.store"
    )
    current = engine.MIGRATIONS
    before = 7 if empty_url.startswith("sqlite://") else 8  # the release before the fan-out mark
    monkeypatch.setattr(engine, "MIGRATIONS", current[:before])
    store = open_store(empty_url, readonly=False, settings=settings)
    try:
        assert store.migrate() == (0, before)
        store_sql(
            empty_url,
            "INSERT INTO webhooks (url, events, secret, created_at) "
            "VALUES ('https://a.example.com/h', '[\"player.revoked\"]', 's', 1)",
        )
        for _ in range(2):
            store_sql(
                empty_url,
                "INSERT INTO events (type, user_id, at_ms, data) VALUES ('player.revoked', 5, 2, "
                "'{}')",
            )
        store_sql(
            empty_url,
            "INSERT INTO deliveries (webhook_id, event_id, user_id, state, next_at, created_at) "
            "SELECT 1, id, 5, 'pending', 2, 2 FROM events",
        )
        monkeypatch.setattr(engine, "MIGRATIONS", current)
        assert store.migrate() == (before, len(current))
        assert store.fan_out_events(3, 100) == (0, False)
        store_sql(
            empty_url,
            "INSERT INTO events (type, user_id, at_ms, data) VALUES ('player.revoked', 5, 4, '{}')",
        )
        assert store.fan_out_events(5, 100) == (1, False)
        assert store_sql(empty_url, "SELECT event_id FROM deliveries ORDER BY id") == [
            (1,),
            (2,),
            (3,),
        ]
    finally:
        store.close()


def test_check_refuses_an_unmigrated_store_and_accepts_a_migrated_one(empty_url, settings):
    admin = open_store(empty_url, readonly=False, settings=settings)
    try:
        if empty_url.startswith("sqlite://"):  # the file does not exist yet
            with pytest.raises(ConfigError, match="does not exist"):
                admin.check()
            admin._conn()  # opening read-write creates an empty file
        with pytest.raises(ConfigError, match="authsvc init"):
            admin.check()
        admin.migrate()
        admin.check()
        reader = open_store(empty_url, readonly=True, settings=settings)
        reader.check()  # the last migration is the version this release reads (SCHEMA_VERSION)
        reader.close()
    finally:
        admin.close()


def test_migrating_a_store_of_the_previous_version_keeps_every_row_and_adds_updated_at(
    empty_url, settings, monkeypatch
):
    """The migrations from the one that adds updated_at (SQLite 3 -> 4, PostgreSQL 4 -> 5) on, on a
    store a release before them made and filled: every player comes through as it was, with
    updated_at null (when it last changed is not known), the web process's reader accepts the store,
    and the next change stamps the row."""
    import importlib

    sqlite = empty_url.startswith("sqlite://")
    engine = importlib.import_module(
        "authsvc.store.sqlite.store" if sqlite else "authsvc.store.postgres.store"
    )
    current = engine.MIGRATIONS
    before = 3 if sqlite else 4  # the version before updated_at
    monkeypatch.setattr(engine, "MIGRATIONS", current[:before])  # that release's migrate()
    store = open_store(empty_url, readonly=False, settings=settings)
    try:
        assert store.migrate() == (0, before)
        rows = [(i, f"user{i}", i % 3, i % 5 != 0) for i in range(1, 3_001)]
        sql = "INSERT INTO players (user_id, username, epoch, enabled) VALUES (?, ?, ?, ?)"
        if empty_url.startswith("sqlite://"):
            with sqlite3.connect(empty_url.removeprefix("sqlite://"), isolation_level=None) as conn:
                conn.executemany(sql, [(u, n, e, int(f)) for u, n, e, f in rows])
        else:
            import psycopg

            with psycopg.connect(empty_url, autocommit=True) as conn:
                conn.cursor().executemany(sql.replace("?", "%s"), rows)
        with pytest.raises(ConfigError, match=f"schema version {before}, this release needs"):
            store.check()
        monkeypatch.setattr(engine, "MIGRATIONS", current)
        assert store.migrate() == (before, len(current))
        store.check()
        players = [p for p in store.dump() if isinstance(p, Player)]
        assert players == [Player(*row, updated_at_ms=None) for row in rows]
        reader = open_store(empty_url, readonly=True, settings=settings)
        try:
            reader.check()
        finally:
            reader.close()
        assert factories.revoke_player(store, 10, audit=at(1_800_000_000_123)) == 2
        assert store.get_player(10) == Player(10, "user10", 2, False, 1_800_000_000_123)
        assert store.get_player(11).updated_at_ms is None  # untouched rows stay unknown
    finally:
        store.close()


# -- games and keys ------------------------------------------------------------------------


def test_add_game_gives_increasing_ids_and_one_live_key(admin_store):
    g1 = factories.add_game(admin_store, "Chess", digest(1), NOW)
    g2 = factories.add_game(admin_store, "Go", digest(2), NOW + 1)
    assert g1 == Game(g1.id, "Chess", True, NOW, (ApiKey(digest(1), NOW, None),))
    assert g2.id > g1.id
    assert admin_store.get_game(g1.id) == g1
    assert admin_store.get_game(g2.id) == g2
    assert admin_store.get_game(g2.id + 100) is None


def test_add_game_refuses_a_taken_name_or_key_and_writes_nothing(admin_store):
    g1 = factories.add_game(admin_store, "Chess", digest(1), NOW)
    with pytest.raises(Conflict, match="Chess"):
        factories.add_game(admin_store, "Chess", digest(2), NOW)
    with pytest.raises(Conflict):
        factories.add_game(admin_store, "Go", digest(1), NOW)  # the key digest is taken
    assert admin_store.list_games() == [g1]  # no half-made "Go"


def test_game_ids_are_never_handed_out_twice(admin_store):
    assert admin_store.game_id_high_water() == 0
    g1 = factories.add_game(admin_store, "Chess", digest(1), NOW)
    with pytest.raises(Conflict):
        factories.add_game(admin_store, "Chess", digest(2), NOW)
    high = admin_store.game_id_high_water()
    assert high >= g1.id
    g2 = factories.add_game(admin_store, "Go", digest(3), NOW)
    assert g2.id > high
    assert admin_store.game_id_high_water() == g2.id


def test_list_games_in_id_order_with_their_keys(admin_store):
    assert admin_store.list_games() == []
    games = [
        factories.add_game(admin_store, name, digest(i), NOW)
        for i, name in enumerate(["b", "a", "c"])
    ]
    factories.add_api_key(admin_store, games[1].id, digest(9), NOW + 5, None)
    listed = admin_store.list_games()
    assert [g.id for g in listed] == sorted(g.id for g in games)
    assert [g.name for g in listed] == ["b", "a", "c"]
    assert listed[1].keys == (ApiKey(digest(1), NOW, None), ApiKey(digest(9), NOW + 5, None))


def test_set_game_enabled(admin_store):
    g = factories.add_game(admin_store, "Chess", digest(1), NOW)
    assert factories.set_game_enabled(admin_store, g.id, False) is True
    assert admin_store.get_game(g.id).enabled is False
    assert factories.set_game_enabled(admin_store, g.id, True) is True
    assert admin_store.get_game(g.id).enabled is True
    assert factories.set_game_enabled(admin_store, g.id + 1, False) is False


def test_add_api_key_expires_older_keys(admin_store):
    g = factories.add_game(admin_store, "Chess", digest(1), NOW)
    other = factories.add_game(admin_store, "Go", digest(7), NOW)
    assert factories.add_api_key(admin_store, g.id, digest(2), NOW + 10, NOW + 100) is True
    # key 1 had no expiry: now NOW+100; the new key has none
    assert admin_store.get_game(g.id).keys == (
        ApiKey(digest(1), NOW, NOW + 100),
        ApiKey(digest(2), NOW + 10, None),
    )
    # a later rotation with a later expiry leaves the earlier expiry alone
    assert factories.add_api_key(admin_store, g.id, digest(3), NOW + 20, NOW + 500) is True
    assert [k.expires_at for k in admin_store.get_game(g.id).keys] == [NOW + 100, NOW + 500, None]
    # an earlier expiry pulls every later one in
    assert factories.add_api_key(admin_store, g.id, digest(4), NOW + 30, NOW + 50) is True
    assert [k.expires_at for k in admin_store.get_game(g.id).keys] == [
        NOW + 50,
        NOW + 50,
        NOW + 50,
        None,
    ]
    # None adds a key and leaves the others as they are
    assert factories.add_api_key(admin_store, g.id, digest(5), NOW + 40, None) is True
    assert [k.expires_at for k in admin_store.get_game(g.id).keys] == [
        NOW + 50,
        NOW + 50,
        NOW + 50,
        None,
        None,
    ]
    assert admin_store.get_game(other.id).keys == (ApiKey(digest(7), NOW, None),)  # untouched


def test_a_key_expiry_is_read_to_the_millisecond_and_the_previous_releases_whole_seconds_hold(
    admin_store, store_url, settings
):
    """The expiry is kept in ms (expires_at_ms) beside the whole second at or after it (expires_at,
    which the previous release reads and writes); a reader takes the earlier: a key expired by the
    previous release's rotation during a rolling upgrade stays expired, and a row written before the
    column reads its seconds."""
    from tests.support import store_sql

    g = factories.add_game(admin_store, "Chess", digest(1), NOW)
    reader = open_store(
        store_url, readonly=True, settings=dataclasses.replace(settings, max_staleness=0.0)
    )
    try:
        assert factories.add_api_key(admin_store, g.id, digest(2), NOW, NOW + 8.123) is True
        assert store_sql(
            store_url, "SELECT expires_at, expires_at_ms FROM api_keys WHERE expires_at IS NOT NULL"
        ) == [(NOW + 9, (NOW + 8) * 1000 + 123)]
        assert reader.credentials(digest(1), 42).key_expires_at == NOW + 8.123
        listed = {k.digest: k.expires_at for k in admin_store.get_game(g.id).keys}
        assert listed == {digest(1): NOW + 9, digest(2): None}  # listed: rounded up
        # a later expiry leaves it alone, to the millisecond
        assert factories.add_api_key(admin_store, g.id, digest(3), NOW, NOW + 8.5) is True
        assert reader.credentials(digest(1), 42).key_expires_at == NOW + 8.123
        store_sql(
            store_url, f"UPDATE api_keys SET expires_at = {NOW + 3} WHERE expires_at = {NOW + 9}"
        )  # the previous release
        assert reader.credentials(digest(1), 42).key_expires_at == NOW + 3
        # a later rotation does not bring it back
        assert factories.add_api_key(admin_store, g.id, digest(4), NOW, NOW + 60) is True
        assert reader.credentials(digest(1), 42).key_expires_at == NOW + 3
        store_sql(
            store_url, "UPDATE api_keys SET expires_at_ms = NULL"
        )  # rows from before the column
        assert reader.credentials(digest(1), 42).key_expires_at == NOW + 3
    finally:
        reader.close()


def test_add_api_key_to_a_missing_game_or_with_a_taken_digest(admin_store):
    g = factories.add_game(admin_store, "Chess", digest(1), NOW)
    assert factories.add_api_key(admin_store, g.id + 1, digest(2), NOW, NOW) is False
    with pytest.raises(Conflict):
        factories.add_api_key(admin_store, g.id, digest(1), NOW + 1, NOW + 5)
    assert admin_store.get_game(g.id).keys == (
        ApiKey(digest(1), NOW, None),
    )  # expiry not half-applied


# -- players -------------------------------------------------------------------------------


def test_players_add_get_rename_enable_revoke(admin_store):
    assert admin_store.get_player(5) is None
    assert unstamped(factories.add_player(admin_store, 5, "alice")) == Player(5, "alice", 0, True)
    with pytest.raises(Conflict):
        factories.add_player(admin_store, 5, "mallory")
    assert factories.rename_player(admin_store, 5, "Alice ✓") is True
    assert factories.rename_player(admin_store, 6, "nobody") is False
    assert factories.set_player_enabled(admin_store, 5, False) is True
    assert factories.set_player_enabled(admin_store, 6, False) is False
    assert factories.revoke_player(admin_store, 5) == 1
    assert factories.revoke_player(admin_store, 5) == 2
    assert factories.revoke_player(admin_store, 6) is None
    assert unstamped(admin_store.get_player(5)) == Player(5, "Alice ✓", 2, False)
    assert factories.set_player_enabled(admin_store, 5, True) is True
    assert unstamped(admin_store.get_player(5)) == Player(5, "Alice ✓", 2, True)


def test_updated_at_is_the_time_of_the_write_that_last_changed_the_row(admin_store):
    """Every write that changes a player's row stamps it with its audit record's time; one that
    leaves the row as it was (the same name, the same flag) does not."""
    t = 1_800_000_000_000
    added = factories.add_player(admin_store, 5, "alice", audit=at(t))
    assert added == Player(5, "alice", 0, True, t) == admin_store.get_player(5)
    steps = [
        (lambda ms: factories.rename_player(admin_store, 5, "bob", audit=at(ms)), True),
        (
            lambda ms: factories.rename_player(admin_store, 5, "bob", audit=at(ms)),
            False,
        ),  # the same name
        (
            lambda ms: factories.set_player_enabled(admin_store, 5, True, audit=at(ms)),
            False,
        ),  # already enabled
        (lambda ms: factories.set_player_enabled(admin_store, 5, False, audit=at(ms)), True),
        (lambda ms: factories.set_player_enabled(admin_store, 5, True, audit=at(ms)), True),
        (lambda ms: factories.revoke_player(admin_store, 5, audit=at(ms)), True),
        (
            lambda ms: factories.import_players(
                admin_store, [(5, "bob"), (6, "carol")], audit=at(ms)
            ),
            False,
        ),
        (lambda ms: factories.import_players(admin_store, [(5, "bobby")], audit=at(ms)), True),
    ]
    expected = t
    for n, (step, changes) in enumerate(steps, start=1):
        step(t + n)
        expected = t + n if changes else expected
        assert admin_store.get_player(5).updated_at_ms == expected, n
    assert admin_store.get_player(5) == Player(5, "bobby", 1, True, t + len(steps))
    assert admin_store.get_player(6) == Player(6, "carol", 0, True, t + 7)  # inserted by the upsert


def test_player_ids_up_to_2_63_minus_1(admin_store):
    big = 2**63 - 1
    factories.add_player(admin_store, big, "max")
    assert unstamped(admin_store.get_player(big)) == Player(big, "max", 0, True)


def test_import_players_inserts_renames_and_keeps_epochs(admin_store):
    factories.add_player(admin_store, 1, "one")
    factories.revoke_player(admin_store, 1)
    factories.set_player_enabled(admin_store, 1, False)
    seen = []
    rows = [(i, f"user{i}") for i in range(1, 25_001)] + [(7, "seven-again")]
    assert factories.import_players(admin_store, rows, progress=seen.append) == 25_001
    assert seen and seen[-1] == 25_001 and seen == sorted(seen)
    assert unstamped(admin_store.get_player(1)) == Player(
        1, "user1", 1, False
    )  # renamed; epoch and flag kept
    assert admin_store.get_player(7).username == "seven-again"  # the last row of an id wins
    assert unstamped(admin_store.get_player(25_000)) == Player(25_000, "user25000", 0, True)


def test_import_players_is_all_or_nothing(admin_store):
    factories.add_player(admin_store, 1, "one")

    def rows():
        yield from ((i, f"user{i}") for i in range(1, 15_001))
        raise ValueError("line 15001: broken")

    with pytest.raises(ValueError, match="broken"):
        factories.import_players(admin_store, rows())
    assert admin_store.get_player(1).username == "one"
    assert admin_store.get_player(2) is None
    assert admin_store.get_player(15_000) is None
    assert (
        factories.import_players(admin_store, [(2, "two")]) == 1
    )  # the store is usable afterwards


# -- failures: locked, missing, unreadable, full (the "Errors" section of store/base.py) ------


@pytest.fixture
def short_lock_wait(monkeypatch):
    """Admin writes wait 0.3 s for another writer's lock instead of the default 30 s."""
    from authsvc.store import base

    monkeypatch.setattr(base, "ADMIN_LOCK_WAIT", 0.3, raising=False)


def test_a_write_lock_held_elsewhere_raises_store_locked_and_writes_nothing(
    admin_store, settings, short_lock_wait
):
    factories.add_player(admin_store, 42, "alice")
    release = hold_write_lock(settings.store, 42)
    try:
        with pytest.raises(StoreLocked) as caught:
            factories.revoke_player(admin_store, 42)
        assert "\n" not in str(caught.value) and "lock" in str(caught.value)
    finally:
        release()
    assert admin_store.get_player(42).epoch == 0
    assert factories.revoke_player(admin_store, 42) == 1  # usable once the lock is gone


def test_a_missing_store_fails_check_with_config_error_and_other_calls_with_store_unavailable(
    store_url, settings, tmp_path
):
    if store_url.startswith("sqlite://"):
        url = "sqlite://" + str(tmp_path / "absent.db")
    else:
        url = f"postgresql://postgres@127.0.0.1:{free_port()}/absent"
    for readonly in (True, False):
        store = open_store(url, readonly=readonly, settings=settings)
        try:
            with pytest.raises(ConfigError):
                store.check()
            if readonly:  # the admin command opens SQLite read-write, which creates the file
                with pytest.raises(StoreUnavailable):
                    store.get_player(1)
        finally:
            store.close()


def test_an_unreadable_store_raises_store_unavailable(admin_store, settings, tmp_path):
    factories.add_player(admin_store, 1, "one")
    admin_store.close()
    if settings.store.startswith("sqlite://"):
        path = settings.store.removeprefix("sqlite://")
        for suffix in ("-wal", "-shm"):
            tmp_path.joinpath(os.path.basename(path) + suffix).unlink(missing_ok=True)
        with open(path, "wb") as f:
            f.write(b"this is not a database" * 500)
        store = admin_store
    else:  # a server that went away
        store = open_store(
            f"postgresql://postgres@127.0.0.1:{free_port()}/x", readonly=False, settings=settings
        )
    for call in (
        lambda: store.get_player(1),
        lambda: factories.revoke_player(store, 1),
        lambda: store.list_games(),
    ):
        with pytest.raises(StoreUnavailable) as caught:
            call()
        assert type(caught.value) is StoreUnavailable and "\n" not in str(caught.value)
    store.close()


@pytest.mark.engine("sqlite")
def test_a_full_store_raises_store_full_and_writes_nothing(admin_store):
    """A real SQLITE_FULL: the file may not grow past its current size (PRAGMA max_page_count).

    On a full disk SQLite answers the same SQLITE_FULL; tests/functional/test_cli.py fills a real
    tmpfs.
    """
    factories.add_player(admin_store, 1, "one")
    conn = admin_store._conn()
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages:d}")
    with pytest.raises(StoreFull) as caught:
        factories.import_players(admin_store, ((i, "x" * 200) for i in range(2, 20_002)))
    assert type(caught.value) is StoreFull and "full" in str(caught.value)
    assert admin_store.get_player(2) is None and admin_store.get_player(1).username == "one"


# -- the read path ---------------------------------------------------------------------------


def test_credentials_in_one_call(admin_store, reader):
    g = factories.add_game(admin_store, "Chess", digest(1), NOW)
    factories.add_player(admin_store, 42, "alice")
    assert reader.credentials(digest(99), 42) is None  # no such key
    assert reader.credentials(digest(1), 42) == Credentials(g.id, True, None, "alice", 0, True)
    nobody = reader.credentials(digest(1), 43)
    assert nobody is not None and nobody.game_id == g.id and nobody.username is None
    factories.revoke_player(admin_store, 42)
    factories.set_player_enabled(admin_store, 42, False)
    factories.set_game_enabled(admin_store, g.id, False)
    factories.add_api_key(admin_store, g.id, digest(2), NOW, NOW + 60)
    assert reader.credentials(digest(1), 42) == Credentials(
        g.id, False, NOW + 60, "alice", 1, False
    )
    assert reader.credentials(digest(2), 42) == Credentials(g.id, False, None, "alice", 1, False)


@pytest.mark.parametrize("max_staleness", [1.0, 0.0])
def test_fresh_credentials_read_the_latest_commit(admin_store, settings, max_staleness):
    """Whatever the bound (SQLite's snapshot kept up to 1 s), the commit just made, and the reads
    after it agree (SQLite's snapshot renewed)."""
    reader = open_store(
        settings.store,
        readonly=True,
        settings=dataclasses.replace(settings, max_staleness=max_staleness),
    )
    try:
        g = factories.add_game(admin_store, "Chess", digest(1), NOW)
        factories.add_player(admin_store, 42, "alice")
        assert reader.credentials(digest(1), 42) == Credentials(g.id, True, None, "alice", 0, True)
        factories.revoke_player(admin_store, 42)
        factories.add_player(admin_store, 43, "bob")
        assert reader.fresh_credentials(digest(1), 42) == Credentials(
            g.id, True, None, "alice", 1, True
        )
        assert reader.credentials(digest(1), 43) == Credentials(g.id, True, None, "bob", 0, True)
        assert reader.fresh_credentials(digest(99), 42) is None  # no such key
        assert reader.fresh_credentials(digest(1), 44).username is None
    finally:
        reader.close()


def test_the_reader_cannot_write(admin_store, reader):
    factories.add_player(admin_store, 1, "one")
    reader.credentials(digest(1), 1)  # opens its connection
    # SQLite: "attempt to write a readonly database"; PostgreSQL: "this role may not write".
    with pytest.raises(Exception, match="readonly|may not write"):  # noqa: B017 (engine-specific types)
        factories.add_player(reader, 2, "two")
    with pytest.raises(Exception, match="readonly|may not write"):  # noqa: B017
        factories.rename_player(reader, 1, "changed")
    reader.close()
    assert admin_store.get_player(2) is None
    assert admin_store.get_player(1).username == "one"


def test_close_then_use_again(admin_store, reader):
    factories.add_player(admin_store, 1, "one")
    reader.close()
    reader.close()  # twice is harmless
    assert reader.credentials(digest(1), 1) is None
    admin_store.close()
    assert admin_store.get_player(1).username == "one"  # reopened on use


# -- moving between stores ------------------------------------------------------------------


def _fill(store) -> list:
    g1 = factories.add_game(store, "Chess", digest(1), NOW)
    factories.add_api_key(store, g1.id, digest(2), NOW + 1, NOW + 3600)
    g2 = factories.add_game(store, "Go", digest(3), NOW + 2)
    factories.set_game_enabled(store, g2.id, False)
    factories.import_players(store, [(i, f"p{i}") for i in (30, 10, 20)])
    factories.revoke_player(store, 20)
    factories.set_player_enabled(store, 30, False)
    return list(store.dump())


def test_dump_gives_games_then_players_in_order(admin_store):
    items = _fill(admin_store)
    games = [x for x in items if isinstance(x, Game)]
    assert items[: len(games)] == games == admin_store.list_games()
    assert [unstamped(p) for p in items[len(games) :]] == [
        Player(10, "p10", 0, True),
        Player(20, "p20", 1, True),
        Player(30, "p30", 0, False),
    ]
    assert all(p.updated_at_ms for p in items[len(games) :])


def test_load_into_an_empty_store_keeps_ids_keys_and_epochs(admin_store, empty_url, settings):
    items = _fill(admin_store)
    games = [x for x in items if isinstance(x, Game)]
    players = [x for x in items if isinstance(x, Player)]
    target = open_store(empty_url, readonly=False, settings=settings)
    try:
        target.migrate()
        counts = []
        assert factories.load_store(target, games, iter(players), 10, progress=counts.append) == (
            2,
            3,
        )
        assert counts[-1] == 3
        assert list(target.dump()) == items
        assert target.game_id_high_water() == 10
        assert (
            factories.add_game(target, "Chess 2", digest(50), NOW).id == 11
        )  # past the high-water mark
        with pytest.raises(NotEmpty):
            factories.load_store(target, [], [Player(99, "x", 0, True)], 0)
        assert target.get_player(99) is None
    finally:
        target.close()


def test_load_is_all_or_nothing(admin_store):
    def players():
        yield Player(1, "one", 3, True)
        raise ValueError("truncated file")

    with pytest.raises(ValueError, match="truncated"):
        factories.load_store(
            admin_store,
            [Game(4, "Chess", True, NOW, (ApiKey(digest(1), NOW, None),))],
            players(),
            4,
        )
    assert admin_store.list_games() == [] and admin_store.get_player(1) is None

    with pytest.raises(Conflict):
        factories.load_store(
            admin_store, [], [Player(1, "one", 0, True), Player(1, "again", 0, True)], 0
        )
    with pytest.raises(Conflict):
        factories.load_store(
            admin_store, [Game(1, "A", True, NOW, ()), Game(2, "A", True, NOW, ())], [], 0
        )
    assert admin_store.list_games() == [] and admin_store.get_player(1) is None
    assert factories.load_store(admin_store, [], [Player(1, "one", 0, True)], 0) == (0, 1)


def test_load_refuses_a_store_that_holds_anything(admin_store):
    factories.add_game(admin_store, "Chess", digest(1), NOW)
    with pytest.raises(NotEmpty):
        factories.load_store(admin_store, [], [Player(1, "one", 0, True)], 0)
    assert admin_store.get_player(1) is None


def test_the_sqlite_service_imports_no_psycopg(tmp_path):
    """The core stays standard-library only: psycopg is imported by postgres/store.py alone, when
    chosen."""
    import subprocess
    import sys

    code = (
        "import sys, authsvc.web.app, authsvc.cli.command, authsvc.operations.transfer, "
        "authsvc.wsgi\nfrom authsvc.store import open_store\n"
        f"s = open_store('sqlite://{tmp_path}/x.db', readonly=False); s.migrate(); s.close()\n"
        "assert not [m for m in sys.modules if m.startswith('psycopg')], 'psycopg imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.engine("postgresql")
def test_a_full_postgresql_disk_raises_store_full_and_writes_nothing(
    store_url, pg_databases, settings
):
    """A real disk_full: the players table moved to a tablespace on a 512 KiB tmpfs (root and a
    local server)."""
    import pwd
    import subprocess
    import tempfile

    import psycopg

    url = pg_databases.create()
    disk = tempfile.mkdtemp(prefix="authsvc-tiny-", dir="/tmp")
    os.chmod(disk, 0o755)
    try:
        owner = pwd.getpwnam("postgres")
    except KeyError:
        skip_or_fail("no local postgres user to own a tablespace")
    done = subprocess.run(
        [
            "mount",
            "-t",
            "tmpfs",
            "-o",
            f"size=512k,mode=0700,uid={owner.pw_uid},gid={owner.pw_gid}",
            "tmpfs",
            disk,
        ],
        capture_output=True,
    )
    if done.returncode != 0:
        os.rmdir(disk)
        skip_or_fail(f"cannot mount a tmpfs (root needed): {done.stderr.decode().strip()}")
    space = "authsvc_tiny_" + os.path.basename(disk).replace("-", "_").lower()
    su = psycopg.connect(url, autocommit=True)
    store = open_store(url, readonly=False, settings=settings)
    try:
        try:
            su.execute(f"CREATE TABLESPACE {space} LOCATION '{disk}'")
        except psycopg.Error as e:
            skip_or_fail(f"the PostgreSQL server cannot use {disk} (not on this machine?): {e}")
        su.execute(f"ALTER TABLE players SET TABLESPACE {space}")
        factories.add_player(store, 1, "one")
        with pytest.raises(StoreFull) as caught:
            factories.import_players(store, ((i, "x" * 200) for i in range(2, 20_002)))
        assert (
            type(caught.value) is StoreFull
            and "full" in str(caught.value)
            and "\n" not in str(caught.value)
        )
        assert store.get_player(2) is None and store.get_player(1).username == "one"
    finally:
        store.close()
        su.execute("ALTER TABLE players SET TABLESPACE pg_default")
        su.execute(f"DROP TABLESPACE IF EXISTS {space}")
        su.close()
        subprocess.run(["umount", "-l", disk], check=True)
        os.rmdir(disk)
