"""Timing: an authentication does the same work whether the api key exists, and whether the player
does.

Otherwise the answer time tells an attacker which api keys are real, and a key
holder which user ids are (docs/stores.md, "The hot path"). Timings are noisy,
so these tests compare what is done instead, for four requests with a wrong
token: a known or unknown key, an existing or missing player. On both engines:
every Python and C function call of the whole authentication (sys.setprofile),
every Python bytecode instruction it executes for an existing or missing player
(sys.settrace), and the type of every value each query returns but the one that
says whether the player exists (a username is decoded either way). On SQLite
also: the SQL statements run, the rows each query returns and its SQLite
bytecode steps. On PostgreSQL: the statements production prepares
(CREDENTIALS_SQL_PQ, STANDBY_SQL_PQ), checked in pg_prepared_statements, and
their executed plans (EXPLAIN ANALYZE EXECUTE), which must visit the same nodes
as often in the four cases. Last, a timing comparison in process: each 403
reason's median time against the others', interleaved, with a generous bound.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import random
import re
import statistics
import time
import urllib.parse

import pytest

from authsvc.errors import InvalidCredentials
from authsvc.store import open_store
from authsvc.store.sqlite import store as sqlite
from authsvc.tokens import api_key_digest, new_api_key
from authsvc.web.app import make_app
from authsvc.web.authenticate import (
    EXPIRED_KEY,
    GAME_DISABLED,
    PLAYER_DISABLED,
    UNKNOWN_KEY,
    UNKNOWN_PLAYER,
    Authenticator,
)
from authsvc.web.authenticate import WRONG_TOKEN as WRONG_TOKEN_REASON
from tests import factories
from tests.support import INVALID, PATH, FakeClock, instructions, profile

WRONG_TOKEN = "0" * 64
MISSING_USER = 4243
DISABLED_USER = 4244
BATCH, ROUNDS = 200, 60  # the timing comparison: 60 rounds of 200 calls per reason
SAME_TIME = (
    1.5  # its bound: each reason's median ratio to the round's median reason within a factor 1.5
)


def cases(world) -> dict[str, dict]:
    """Request parameters: {known, unknown} key x {existing, missing} player, all with a wrong
    token."""
    unknown_key = "4f0c6a4e-0000-4000-8000-000000000000"  # the shape of a real key
    return {
        f"{key_name} key, {user_name} player": {
            "user_id": str(user_id),
            "game_auth_token": WRONG_TOKEN,
            "api_key": key,
        }
        for key_name, key in (("known", world.api_key), ("unknown", unknown_key))
        for user_name, user_id in (("existing", world.user_id), ("missing", MISSING_USER))
    }


@pytest.mark.engine("sqlite")
@pytest.mark.parametrize("max_staleness", [1.0, 0.0])
def test_sqlite_the_same_statements_and_calls_for_any_key_and_player(world, max_staleness):
    store = sqlite.SQLiteStore(
        world.settings.store, readonly=True, max_staleness=max_staleness, clock=FakeClock()
    )
    authenticate = Authenticator(store, world.settings.token_secrets)
    requests = cases(world)
    for params in requests.values():  # warm up: a snapshot, prepared statements, the player's pages
        for _ in range(3):
            assert authenticate(params)[0] is InvalidCredentials
    statements: list[str] = []
    store._conn().set_trace_callback(statements.append)
    seen = {}
    for name, params in requests.items():
        statements.clear()
        calls = profile(lambda params=params: authenticate(params))
        # The trace gives each statement with its values filled in: compare the statements without
        # them.
        seen[name] = ([re.sub(r"'[^']*'|\b\d+\b", "?", sql) for sql in statements], calls)
    store.close()
    (first_name, first), *others = seen.items()
    assert first[0], "the trace saw no statement"
    for name, work in others:
        assert work[0] == first[0], f"SQL: {name} ran {work[0]}, {first_name} ran {first[0]}"
        assert work[1] == first[1], f"calls: {name} differs from {first_name}"


def assert_same_work(requests: dict[str, dict], authenticate) -> None:
    """After a warm-up: the same Python and C calls for each request, and for an existing or missing
    player with the same key, the same bytecode instructions too (an unknown key returns sooner than
    a known one, by a branch or two: that tells a caller about the key it sent, not about a
    player)."""
    for (
        params
    ) in requests.values():  # warm up: a connection, prepared statements, the player's pages
        for _ in range(3):
            assert authenticate(params)[0] is InvalidCredentials
    seen = {
        name: (
            profile(lambda params=params: authenticate(params)),
            instructions(lambda params=params: authenticate(params)),
        )
        for name, params in requests.items()
    }
    (first_name, (first_calls, _)), *others = seen.items()
    for name, (calls, _) in others:
        assert calls == first_calls, f"calls: {name} differs from {first_name}"
    for key_name in ("known", "unknown"):
        existing, missing = (
            seen[f"{key_name} key, existing player"][1],
            seen[f"{key_name} key, missing player"][1],
        )
        assert existing, "the trace saw no instruction"
        shorter = min(len(existing), len(missing))
        diverged = next((i for i in range(shorter) if existing[i] != missing[i]), shorter)
        assert missing == existing, (
            f"instructions ({key_name} key): a missing player ran {len(missing)}, an "
            f"existing one {len(existing)}; first difference at {diverged}: "
            f"{missing[diverged : diverged + 3]} against {existing[diverged : diverged + 3]}"
        )


@pytest.mark.engine("sqlite")
@pytest.mark.parametrize("max_staleness", [1.0, 0.0])
def test_sqlite_the_same_calls_and_instructions_for_any_player(world, max_staleness):
    """No branch taken only when the player exists: in the store, or in the decision."""
    store = sqlite.SQLiteStore(
        world.settings.store, readonly=True, max_staleness=max_staleness, clock=FakeClock()
    )
    try:
        assert_same_work(cases(world), Authenticator(store, world.settings.token_secrets))
    finally:
        store.close()


@pytest.mark.engine("sqlite")
def test_a_keys_digest_is_taken_once_per_key_text_known_or_not(world, monkeypatch):
    """The api key's SHA-256 is kept per key text sent (a game server sends its one key on every
    request): taken on a key's first request only, the same for a key the store has and one it
    lacks."""
    import authsvc.web.authenticate as authenticate_module

    taken: list[str] = []

    def counted(api_key: str) -> str:
        taken.append(api_key)
        return api_key_digest(api_key)

    monkeypatch.setattr(authenticate_module, "api_key_digest", counted)
    store = sqlite.SQLiteStore(
        world.settings.store, readonly=True, max_staleness=1.0, clock=FakeClock()
    )
    try:
        authenticate = Authenticator(store, world.settings.token_secrets)
        for params in [*cases(world).values()] * 3:
            assert authenticate(params)[0] is InvalidCredentials
    finally:
        store.close()
    assert sorted(taken) == sorted({world.api_key, "4f0c6a4e-0000-4000-8000-000000000000"})


@pytest.mark.engine("sqlite")
def test_sqlite_each_query_returns_the_same_types_for_an_existing_or_missing_player(world):
    """sqlite3 builds a str for a username it reads: a placeholder one when the player is missing.
    The last column (``enabled``) is the one that tells: NULL for a missing player only."""
    store = sqlite.SQLiteStore(world.settings.store, readonly=True)
    conn = store._conn()
    try:
        for digest in (api_key_digest(world.api_key), api_key_digest("no such key")):
            for sql, args in (
                (sqlite.PLAYER_SQL, lambda user_id: (user_id,)),
                (sqlite.CREDENTIALS_SQL, lambda user_id, digest=digest: (user_id, digest)),
            ):
                rows = {
                    user_id: conn.execute(sql, args(user_id)).fetchone()
                    for user_id in (world.user_id, MISSING_USER)
                }
                types = {
                    user_id: [type(value) for value in row[:-1]] for user_id, row in rows.items()
                }
                assert types[world.user_id] == types[MISSING_USER], rows
                assert (rows[world.user_id][-1], rows[MISSING_USER][-1]) == (1, None), rows
    finally:
        store.close()


@pytest.mark.engine("sqlite")
@pytest.mark.parametrize("max_staleness", [1.0, 0.0])
def test_sqlite_the_query_steps_about_the_same_for_any_key_and_player(world, max_staleness):
    """SQLite bytecode steps, counted with a progress handler. A lookup that finds no row takes a
    few steps more than one that does (SQLite 3.40, one query: 44 to 57 steps); a skipped lookup is
    the difference between 11 and 27 to 32 steps (an unknown key, before the query always looked
    the player up). Nothing is committed meanwhile, so a key the snapshot lacks makes no lookup
    (only the first one after a commit does: docs/design.md "Freshness";
    tests/functional/test_staleness.py)."""
    store = sqlite.SQLiteStore(
        world.settings.store, readonly=True, max_staleness=max_staleness, clock=FakeClock()
    )
    digests = {"known": api_key_digest(world.api_key), "unknown": api_key_digest("no such key")}
    for _ in range(2):  # warm up: schema, snapshot
        store.credentials(digests["known"], world.user_id)
        store.credentials(digests["unknown"], world.user_id)
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


def production_statements() -> dict[str, bytes]:
    """The statements the web process prepares: on a primary, and on a standby or behind a
    pooler."""
    from authsvc.store.postgres.reader import (
        CREDENTIALS_SQL_PQ,
        STANDBY_SQL_PQ,
    )  # psycopg: only here

    return {"credentials": CREDENTIALS_SQL_PQ, "standby": STANDBY_SQL_PQ}


def prepared_connection(settings):
    """A connection with both production statements prepared through libpq, as the web process
    prepares them."""
    import psycopg
    from psycopg.pq import ExecStatus

    conn = psycopg.connect(settings.store, autocommit=True)
    conn.execute("ANALYZE games, api_keys, players")
    for name, sql in production_statements().items():
        assert conn.pgconn.prepare(name.encode(), sql).status == ExecStatus.COMMAND_OK
    return conn


def executed_plan(conn, statement: str, digest: str, user_id: int) -> list[str]:
    """The plan PostgreSQL executed for a prepared statement, without row counts: node, table, loops
    (or 'never executed'). Only ints and hex digits are written into the EXECUTE."""
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    sql = (
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) EXECUTE "
        f"{statement}({user_id:d}, '{digest}')"
    )
    lines = [row[0] for row in conn.execute(sql)]
    return [re.sub(r"rows=\d+ ", "", line) for line in lines if "->" in line or "(actual" in line]


@pytest.mark.engine("postgresql")
@pytest.mark.parametrize("statement", ["credentials", "standby"])
def test_postgresql_the_same_executed_plan_for_any_key_and_player(world, settings, statement):
    """Every node of the plan production prepares runs, as often, for a known or unknown key and an
    existing or missing player (a player that exists is read; a placeholder is not a node)."""
    conn = prepared_connection(settings)
    try:
        plans = {
            (key_name, user_id): executed_plan(conn, statement, digest, user_id)
            for key_name, digest in (
                ("known", api_key_digest(world.api_key)),
                ("unknown", "f" * 64),
            )
            for user_id in (world.user_id, MISSING_USER)
        }
    finally:
        conn.close()
    (first_case, first), *others = plans.items()
    assert any("players" in line for line in first), first
    for case, plan in others:
        # The standby statement's heartbeat lookup runs only in recovery: this server is a primary.
        assert not any(
            "never executed" in line and "authsvc_heartbeat" not in line for line in plan
        ), (case, plan)
        assert plan == first, (case, plan, first_case, first)


@pytest.mark.engine("postgresql")
@pytest.mark.parametrize("statement", ["credentials", "standby"])
def test_postgresql_each_statement_returns_the_same_shape_for_an_existing_or_missing_player(
    world, settings, statement
):
    """One row, the same columns, and the same NULLs either way but in ``p.enabled`` (column 5, NULL
    for a missing player only, how the reader tells), so the web process decodes the same values: a
    placeholder username when the player is missing."""
    from psycopg.pq import ExecStatus

    conn = prepared_connection(settings)
    try:
        for digest in (api_key_digest(world.api_key), "f" * 64):
            shapes = {}
            for user_id in (world.user_id, MISSING_USER):
                result = conn.pgconn.exec_prepared(
                    statement.encode(), [b"%d" % user_id, digest.encode()]
                )
                assert result.status == ExecStatus.TUPLES_OK, result.error_message
                values = [result.get_value(0, column) for column in range(result.nfields)]
                shapes[user_id] = (
                    result.ntuples,
                    [value is None for value in values[:5] + values[6:]],
                )
                assert (values[5] is None) == (user_id == MISSING_USER), values
            assert shapes[world.user_id] == shapes[MISSING_USER], (digest == "f" * 64, shapes)
    finally:
        conn.close()


@pytest.mark.engine("postgresql")
@pytest.mark.parametrize("mode", ["primary", "standby", "pooled"])
def test_postgresql_the_same_calls_and_instructions_for_any_player(world, settings, mode):
    """The reader as production runs it, on each of its paths: the credentials statement prepared on
    a primary, the standby statement prepared (a standby), or sent unnamed (behind a pooler). The
    server is a primary, so the standby statement's freshness column is 0 and every path answers.
    The statement that ran is checked by name and text in pg_prepared_statements (none is prepared
    behind a pooler)."""
    from authsvc.store.postgres.reader import CREDENTIALS_STATEMENT, STANDBY_STATEMENT

    reader = open_store(settings.store, readonly=True, settings=settings)
    try:
        reader._conn()  # the connection, and the flags production reads off the server ...
        reader._local.standby = mode == "standby"  # ... set to the path under test
        reader._local.pooled = mode == "pooled"
        assert_same_work(cases(world), Authenticator(reader, world.settings.token_secrets))
        prepared = dict(
            reader._local.conn.execute(
                "SELECT name, statement FROM pg_prepared_statements"
            ).fetchall()
        )
    finally:
        reader.close()
    expected = {
        "primary": {
            CREDENTIALS_STATEMENT.decode(): production_statements()["credentials"].decode()
        },
        "standby": {STANDBY_STATEMENT.decode(): production_statements()["standby"].decode()},
        "pooled": {},
    }
    assert prepared == expected[mode]


def test_the_whole_app_does_the_same_for_an_existing_or_missing_player(world, caplog):
    """The WSGI callable itself, the auth log line and its ``ms=`` included: the same calls and the
    same instructions for an existing or missing player, with a known key or an unknown one (both
    engines). With the metrics extra installed, the request-duration histogram looks for the bucket
    of the time it is given, a loop as long as that time is: a consequence of time, not of the
    player, left out."""
    caplog.set_level(logging.INFO, logger="authsvc.auth")
    app = make_app(world.settings)

    def steps(call) -> list[str]:
        return [step for step in instructions(call) if not step.startswith("Histogram.observe@")]

    def answer(params: dict) -> bytes:
        environ = {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": PATH,
            "QUERY_STRING": urllib.parse.urlencode(params),
            "SERVER_NAME": "localhost",
            "SERVER_PORT": "80",
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(),
            "HTTP_X_REQUEST_ID": "0" * 32,
        }
        return b"".join(app(environ, lambda status, headers, exc_info=None: None))

    try:
        for params in cases(world).values():  # warm up, and each is the same 403 on the wire
            for _ in range(3):
                assert json.loads(answer(params)) == INVALID
        for key_name in ("known", "unknown"):
            existing, missing = (
                cases(world)[f"{key_name} key, {player} player"]
                for player in ("existing", "missing")
            )
            assert profile(lambda p=existing: answer(p)) == profile(lambda p=missing: answer(p)), (
                key_name
            )
            assert steps(lambda p=existing: answer(p)) == steps(lambda p=missing: answer(p)), (
                key_name
            )
    finally:
        app.store.close()


def reason_cases(world) -> dict[str, dict]:
    """One request per 403 reason decided after the store was asked (docs/logs.md), all with a wrong
    token."""
    now = int(time.time())
    expired_key, disabled_key = new_api_key(), new_api_key()
    expired_game = factories.add_game(
        world.store, "Expired", api_key_digest(expired_key), now - 100
    )
    factories.add_api_key(
        world.store, expired_game.id, api_key_digest(new_api_key()), now - 100, now - 10
    )  # rotated
    disabled_game = factories.add_game(world.store, "Disabled", api_key_digest(disabled_key), now)
    factories.set_game_enabled(world.store, disabled_game.id, False)
    factories.add_player(world.store, DISABLED_USER, "bob")
    factories.set_player_enabled(world.store, DISABLED_USER, False)
    key, user = world.api_key, world.user_id
    return {
        reason: {"user_id": str(user_id), "game_auth_token": WRONG_TOKEN, "api_key": api_key}
        for reason, api_key, user_id in (
            (UNKNOWN_KEY, "4f0c6a4e-0000-4000-8000-000000000000", user),
            (EXPIRED_KEY, expired_key, user),
            (GAME_DISABLED, disabled_key, user),
            (UNKNOWN_PLAYER, key, MISSING_USER),
            (PLAYER_DISABLED, key, DISABLED_USER),
            (WRONG_TOKEN_REASON, key, user),
        )
    }


def median_ratios(authenticate, requests: dict[str, dict]) -> dict[str, float]:
    """Per reason, the median over ROUNDS of (its batch's time / the round's median batch time).

    Each round times a batch of BATCH calls per reason, the reasons in a new random order: a load
    that comes and goes on the machine slows a whole round, and cancels out of its ratios.
    """
    ratios: dict[str, list[float]] = {reason: [] for reason in requests}
    order = list(requests)
    for _ in range(ROUNDS):
        random.shuffle(order)
        batch = {}
        for reason in order:
            params = requests[reason]
            started = time.perf_counter_ns()
            for _ in range(BATCH):
                authenticate(params)
            batch[reason] = time.perf_counter_ns() - started
        middle = statistics.median(batch.values())
        for reason, spent in batch.items():
            ratios[reason].append(spent / middle)
    return {reason: round(statistics.median(values), 3) for reason, values in ratios.items()}


def test_each_reason_takes_about_the_same_time_in_process(world, settings):
    """Time, measured: Authenticator alone on the store as production opens it (a snapshot on
    SQLite), one request per 403 reason (median_ratios). Each reason's median ratio must stay within
    a factor SAME_TIME of 1: the work is the same, so only noise and data remain (a row read or not,
    the clock read for a key with an expiry), a few per cent here. A player lookup skipped for an
    unknown key took 45 % less (docs/stores.md): a ratio near 0.5, far outside. Not an assertion of
    speed but of sameness, and generous: a loaded machine gets three tries, the test fails only if
    all three do."""
    requests = reason_cases(world)
    store = open_store(
        settings.store, readonly=True, settings=dataclasses.replace(settings, max_staleness=1.0)
    )
    authenticate = Authenticator(store, settings.token_secrets)
    tries = []
    try:
        for reason, params in requests.items():
            for _ in range(
                BATCH
            ):  # warm up, and check each request fails for the reason it stands for
                assert authenticate(params)[2] == reason
        for _ in range(3):
            tries.append(median_ratios(authenticate, requests))
            if all(1 / SAME_TIME <= ratio <= SAME_TIME for ratio in tries[-1].values()):
                return
    finally:
        store.close()
    raise AssertionError(
        f"a reason's time differs from the others' by more than a factor {SAME_TIME}: {tries}"
    )


def test_credentials_answers_are_unchanged(world, settings):
    """The contract still holds: None for an unknown key, placeholders for a missing player."""
    reader = open_store(settings.store, readonly=True, settings=settings)
    try:
        digest = api_key_digest(world.api_key)
        assert reader.credentials(api_key_digest("no such key"), world.user_id) is None
        assert reader.credentials(api_key_digest("no such key"), MISSING_USER) is None
        missing = reader.credentials(digest, MISSING_USER)
        assert (missing.game_id, missing.username, missing.epoch, bool(missing.player_enabled)) == (
            world.game_id,
            None,
            0,
            False,
        )
        assert reader.credentials(digest, world.user_id).username == "alice"
    finally:
        reader.close()
