"""Timing: an authentication does the same work whether the api key exists, and whether the player does.

Otherwise the answer time tells an attacker which api keys are real, and a key
holder which user ids are (docs/stores.md, "The hot path"). Timings are noisy,
so these tests compare what is done instead, for four requests with a wrong
token: a known or unknown key, an existing or missing player. On SQLite: the SQL
statements run, every Python and C function call of the whole authentication
(sys.setprofile), the rows each query returns and its SQLite bytecode steps. On PostgreSQL: the
executed plan of the credentials query (EXPLAIN ANALYZE), which must visit the
same nodes as often in the four cases.
"""

from __future__ import annotations

import re

import pytest

from authsvc.authenticate import Authenticator
from authsvc.store import open_store, sqlite
from authsvc.tokens import api_key_digest
from tests.support import FakeClock, profile

WRONG_TOKEN = "0" * 64
MISSING_USER = 4243


def cases(world) -> dict[str, dict]:
    """Request parameters: {known, unknown} key x {existing, missing} player, all with a wrong token."""
    unknown_key = "4f0c6a4e-0000-4000-8000-000000000000"  # the shape of a real key
    return {
        f"{key_name} key, {user_name} player": {"user_id": str(user_id), "game_auth_token": WRONG_TOKEN,
                                                "api_key": key}
        for key_name, key in (("known", world.api_key), ("unknown", unknown_key))
        for user_name, user_id in (("existing", world.user_id), ("missing", MISSING_USER))
    }


@pytest.mark.engine("sqlite")
@pytest.mark.parametrize("max_staleness", [1.0, 0.0])
def test_sqlite_the_same_statements_and_calls_for_any_key_and_player(world, max_staleness):
    store = sqlite.SQLiteStore(world.settings.store, readonly=True, max_staleness=max_staleness, clock=FakeClock())
    authenticate = Authenticator(store, world.settings.token_secrets)
    requests = cases(world)
    for params in requests.values():  # warm up: a snapshot, prepared statements, the player's pages
        for _ in range(3):
            assert authenticate(params).error == 403
    statements: list[str] = []
    store._conn().set_trace_callback(statements.append)
    seen = {}
    for name, params in requests.items():
        statements.clear()
        calls = profile(lambda params=params: authenticate(params))
        # The trace gives each statement with its values filled in: compare the statements without them.
        seen[name] = ([re.sub(r"'[^']*'|\b\d+\b", "?", sql) for sql in statements], calls)
    store.close()
    (first_name, first), *others = seen.items()
    assert first[0], "the trace saw no statement"
    for name, work in others:
        assert work[0] == first[0], f"SQL: {name} ran {work[0]}, {first_name} ran {first[0]}"
        assert work[1] == first[1], f"calls: {name} differs from {first_name}"


@pytest.mark.engine("sqlite")
@pytest.mark.parametrize("max_staleness", [1.0, 0.0])
def test_sqlite_the_query_steps_about_the_same_for_any_key_and_player(world, max_staleness):
    """SQLite bytecode steps, counted with a progress handler. A lookup that finds no row takes a few
    steps more than one that does (SQLite 3.40, one query: 44 to 57 steps); a skipped lookup is
    the difference between 11 and 27 to 32 steps (an unknown key, before the query always looked
    the player up)."""
    store = sqlite.SQLiteStore(world.settings.store, readonly=True, max_staleness=max_staleness, clock=FakeClock())
    digests = {"known": api_key_digest(world.api_key), "unknown": api_key_digest("no such key")}
    for _ in range(2):  # warm up: schema, snapshot
        store.credentials(digests["known"], world.user_id)
    conn = store._conn()
    steps = {}
    for key_name, digest in digests.items():
        for user_id in (world.user_id, MISSING_USER):
            count = [0]

            def step(count=count):
                count[0] += 1
                return 0

            conn.set_progress_handler(step, 1)
            store.credentials(digest, user_id)
            conn.set_progress_handler(None, 1)
            steps[key_name, user_id] = count[0]
    store.close()
    assert min(steps.values()) > 0
    assert max(steps.values()) <= 1.5 * min(steps.values()), steps


@pytest.mark.engine("sqlite")
def test_sqlite_each_query_returns_one_row_for_any_key_and_player(world):
    """A row, or none, is work too: sqlite3 steps once more and Python builds a tuple for a row that
    exists. Both queries return exactly one row, with NULLs for what is missing."""
    store = sqlite.SQLiteStore(world.settings.store, readonly=True)
    conn = store._conn()
    for user_id in (world.user_id, MISSING_USER):
        assert len(conn.execute(sqlite.PLAYER_SQL, (user_id,)).fetchall()) == 1
        for digest in (api_key_digest(world.api_key), api_key_digest("no such key")):
            assert len(conn.execute(sqlite.CREDENTIALS_SQL, (user_id, digest)).fetchall()) == 1
    store.close()


def executed_plan(conn, digest: str, user_id: int) -> list[str]:
    """The plan PostgreSQL executed, without row counts: node, table, loops (or 'never executed')."""
    from authsvc.store.postgres import CREDENTIALS_SQL  # psycopg: only where PostgreSQL is tested

    sql = "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) " + CREDENTIALS_SQL
    lines = [row[0] for row in conn.execute(sql, (user_id, digest))]
    return [re.sub(r"rows=\d+ ", "", line) for line in lines if "->" in line or "(actual" in line]


@pytest.mark.engine("postgresql")
def test_postgresql_the_same_executed_plan_for_any_key_and_player(world, settings):
    """Every node of the plan runs, as often, for a known or unknown key and an existing or missing player."""
    import psycopg

    conn = psycopg.connect(settings.store, autocommit=True)
    try:
        conn.execute("ANALYZE games, api_keys, players")
        plans = {
            (key_name, user_id): executed_plan(conn, digest, user_id)
            for key_name, digest in (("known", api_key_digest(world.api_key)), ("unknown", "f" * 64))
            for user_id in (world.user_id, MISSING_USER)
        }
    finally:
        conn.close()
    (first_case, first), *others = plans.items()
    assert any("players" in line for line in first), first
    for case, plan in others:
        assert not any("never executed" in line for line in plan), (case, plan)
        assert plan == first, (case, plan, first_case, first)


def test_credentials_answers_are_unchanged(world, settings):
    """The contract still holds: None for an unknown key, placeholders for a missing player."""
    reader = open_store(settings.store, readonly=True, settings=settings)
    try:
        digest = api_key_digest(world.api_key)
        assert reader.credentials(api_key_digest("no such key"), world.user_id) is None
        assert reader.credentials(api_key_digest("no such key"), MISSING_USER) is None
        missing = reader.credentials(digest, MISSING_USER)
        assert (missing.game_id, missing.username, missing.epoch, bool(missing.player_enabled)) == (
            world.game_id, None, 0, False)
        assert reader.credentials(digest, world.user_id).username == "alice"
    finally:
        reader.close()
