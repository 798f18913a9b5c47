"""One write, one transaction (docs/admin-api.md, "Retries and Idempotency-Key"): each admin write
at its edges.

Each test here reproduces a finding made from outside against the release before, where the
Idempotency-Key record, the change and its audit record were separate transactions: a retried
write applied twice, a mint racing a revoke, audit time running backwards, two signups of one
new player answering 500 on PostgreSQL, and a read waiting behind the write lock. The whole
history under kill -9 is tests/system/test_write_history.py.
"""

from __future__ import annotations

import threading
import time

import pytest
import webtest

from authsvc.api import idempotency
from authsvc.api.app import AdminApp
from authsvc.operations import players as players_ops
from authsvc.operations import tokens
from authsvc.operations.context import Context, admin_store
from authsvc.store import base
from tests.support import hold_write_lock, problem, store_sql


def actions(store_url: str, user_id: int) -> list[str]:
    return [
        row[0]
        for row in store_sql(
            store_url, "SELECT action FROM audit WHERE user_id = ? ORDER BY id", (user_id,)
        )
    ]


def test_a_write_that_dies_before_its_answer_is_kept_leaves_nothing_and_its_retry_runs_once(
    admin, world, store_url, monkeypatch
):
    """The process dies after the change but before the answer is kept (here: keeping it raises):
    the change goes with it, and the retry with the same key runs, once; a later retry replays that
    answer."""
    app, headers = admin.app, admin.headers("web")
    keyed = headers | {"Idempotency-Key": "revoke-1"}
    path = f"/v1/players/{world.user_id}/revoke"
    real = idempotency._kept

    def dies(response):
        raise RuntimeError("the worker died here")

    monkeypatch.setattr(idempotency, "_kept", dies)
    problem(app.post(path, headers=keyed, expect_errors=True), 500, "internal")
    assert world.store.get_player(world.user_id).epoch == 0 and actions(
        store_url, world.user_id
    ) == ["player.add"]
    monkeypatch.setattr(idempotency, "_kept", real)
    first = app.post(path, headers=keyed)
    assert first.status_int == 200 and first.json["epoch"] == 1
    again = app.post(path, headers=keyed)
    assert again.headers["Idempotent-Replayed"] == "true" and again.json == first.json
    assert world.store.get_player(world.user_id).epoch == 1
    assert actions(store_url, world.user_id) == ["player.add", "player.revoke"]


def test_a_retry_sent_while_the_first_runs_waits_for_it_and_replays_its_answer(
    admin, world, store_url, monkeypatch
):
    """No "still running" 409 to wait out: the second request with the key waits for the first's
    commit."""
    app, headers = admin.app, admin.headers("web")
    keyed = headers | {"Idempotency-Key": "revoke-2"}
    path = f"/v1/players/{world.user_id}/revoke"
    entered, go = threading.Event(), threading.Event()
    real = players_ops.revoke_player

    def slow(store, ctx, user_id):
        epoch = real(store, ctx, user_id)
        entered.set()
        go.wait(10)
        return epoch

    monkeypatch.setattr(players_ops, "revoke_player", slow)
    answers: list = []
    first = threading.Thread(
        target=lambda: answers.append(
            webtest.TestApp(AdminApp(app.app.settings)).post(path, headers=keyed)
        )
    )
    first.start()
    assert entered.wait(10)
    monkeypatch.setattr(players_ops, "revoke_player", real)
    threading.Timer(
        0.3, go.set
    ).start()  # the first commits while the second waits for the writer lock
    second = app.post(path, headers=keyed)
    first.join(10)
    assert answers[0].status_int == 200 and second.status_int == 200
    assert second.headers["Idempotent-Replayed"] == "true" and second.json == answers[0].json
    assert actions(store_url, world.user_id) == ["player.add", "player.revoke"]


def test_a_mint_racing_a_revoke_records_the_epoch_it_answers_before_the_revoke(
    world, store_url, settings, monkeypatch
):
    """A revoke lands the moment after the mint read the player: along the chain, the mint's epoch
    is the player's epoch where its record stands (it is never a token of an epoch revoked before
    it)."""
    other = admin_store(settings)
    store = other.__enter__()
    real = tokens.mint_token

    def revoke_meanwhile(*args):
        revoke = threading.Thread(
            target=players_ops.revoke_player,
            args=(store, Context(actor="cli:other"), world.user_id),
        )
        revoke.start()
        revoke.join(
            5
        )  # the release before: the revoke commits here, between the mint's read and its record
        return real(*args)

    monkeypatch.setattr(tokens, "mint_token", revoke_meanwhile)
    try:
        _, player = tokens.mint(
            world.store,
            Context(actor="api:web"),
            settings.token_secrets[0],
            world.game_id,
            world.user_id,
        )
    finally:
        other.__exit__(None, None, None)
    chain = store_sql(
        store_url,
        "SELECT action, changes FROM audit WHERE user_id = ? ORDER BY id",
        (world.user_id,),
    )
    epoch = 0
    for action, changes in chain:
        if action == "player.revoke":
            epoch += 1
        if action == "token.mint":
            assert f'"epoch":{epoch}' in changes, chain
    assert [a for a, _ in chain] == [
        "player.add",
        "token.mint",
        "player.revoke",
    ] and player.epoch == 0


def test_a_write_is_stamped_when_it_holds_the_lock_and_never_before_the_chain_head(
    world, store_url, monkeypatch
):
    """A write that waits for another's lock takes its time after the wait; a clock behind the
    head's (another host's, a step back) gives the head's time: along the chain, time never runs
    backwards."""
    monkeypatch.setattr(base, "ADMIN_LOCK_WAIT", 10.0)
    head = store_sql(store_url, "SELECT max(at_ms) FROM audit")[0][0]
    now = [head / 1000 + 5]
    ctx = Context(actor="cli:test", clock=lambda: now[0])
    release = hold_write_lock(store_url, None)  # the writer lock itself
    done = threading.Thread(
        target=players_ops.rename_player, args=(world.store, ctx, world.user_id, "waited")
    )
    done.start()
    time.sleep(0.5)  # the rename is waiting for the lock
    now[0] += 60  # the time when it gets it
    release()
    done.join(10)
    players_ops.rename_player(
        world.store, Context(actor="cli:test", clock=lambda: head / 1000), world.user_id, "late"
    )
    stamps = [row[0] for row in store_sql(store_url, "SELECT at_ms FROM audit ORDER BY id")]
    assert stamps[-2:] == [head + 65_000, head + 65_000], stamps
    assert stamps == sorted(stamps)


@pytest.mark.engine("postgresql")
def test_two_signups_of_one_new_player_at_once_create_it_once_and_never_fail(
    world, store_url, settings
):
    """Two PUTs of the same new id at the same moment (a double click, a retry with another key):
    one creates the player, the other finds it; 20 such pairs, never a 500 (nor the store's
    error)."""
    stores = [admin_store(settings).__enter__() for _ in range(2)]
    results: list = []
    try:
        for user_id in range(5000, 5020):
            gate = threading.Barrier(2)

            def signup(store, user_id=user_id, gate=gate):
                gate.wait(5)
                try:
                    results.append(
                        players_ops.put_player(
                            store, Context(actor="api:web"), user_id, f"p{user_id}"
                        )[1]
                    )
                except Exception as e:  # the finding: psycopg's UniqueViolation, a 500 at the API
                    results.append(type(e).__name__)

            pair = [threading.Thread(target=signup, args=(s,)) for s in stores]
            for t in pair:
                t.start()
            for t in pair:
                t.join(10)
    finally:
        for store in stores:
            store.close()
    assert sorted(map(str, results)) == ["False"] * 20 + ["True"] * 20
    assert store_sql(
        store_url, "SELECT count(*) FROM audit WHERE action = 'player.add' AND user_id >= 5000"
    ) == [(20,)]


@pytest.mark.engine("sqlite")
def test_the_bearer_token_lookup_does_not_wait_behind_a_writer(
    admin, world, store_url, monkeypatch
):
    """A GET while an import holds the write lock: the token is found by a read, the player too: 200
    at once."""
    monkeypatch.setattr(base, "ADMIN_LOCK_WAIT", 2.0)
    app, headers = admin.app, admin.headers("web")
    release = hold_write_lock(store_url, world.user_id)
    try:
        started = time.monotonic()
        r = app.get(f"/v1/players/{world.user_id}", headers=headers, expect_errors=True)
        waited = time.monotonic() - started
    finally:
        release()
    assert r.status_int == 200 and waited < 1.5, (r.status_int, waited)
