"""The events outbox (authsvc/store/events.py), on both engines: each change to a player and each
key rotation writes exactly its event in the change's own transaction, and no delivery; the fan-out
(the deliverer's step, store/deliveries.py) gives each subscribed webhook one delivery per event,
once, from its creation on; a refused or rolled-back write leaves no event; a deleted player's
name leaves its events.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from authsvc.api import batch
from authsvc.errors import Conflict, Invalid, NotFound, PreconditionFailed
from authsvc.operations import games
from authsvc.operations import players as players_ops
from authsvc.operations import webhooks as webhooks_ops
from authsvc.operations.conditions import condition, etag
from authsvc.operations.context import Context
from authsvc.store.base import Player
from tests import factories
from tests.support import fan_out, store_sql

CTX = Context(actor="cli:test")
EVERY = [
    "game.key_rotated",
    "player.created",
    "player.deleted",
    "player.disabled",
    "player.enabled",
    "player.renamed",
    "player.revoked",
]
ALLOW = ""  # AUTHSVC_WEBHOOK_ALLOW_HOSTS: https URLs of public names need none


def events(store_url: str) -> list[tuple]:
    """(type, user_id, game_id, data) of every event, in order."""
    rows = store_sql(store_url, "SELECT type, user_id, game_id, data FROM events ORDER BY id")
    return [(t, u, g, json.loads(d)) for t, u, g, d in rows]


def deliveries(store_url: str) -> list[tuple]:
    """(webhook id, event type, user_id, state) of every delivery, in order."""
    return store_sql(
        store_url,
        "SELECT d.webhook_id, e.type, d.user_id, d.state FROM deliveries AS d "
        "JOIN events AS e ON e.id = d.event_id ORDER BY d.id",
    )


def counts(store_url: str) -> tuple[int, int]:
    return (
        store_sql(store_url, "SELECT count(*) FROM events")[0][0],
        store_sql(store_url, "SELECT count(*) FROM deliveries")[0][0],
    )


def test_each_change_writes_exactly_its_event_with_its_data(world, store_url):
    store = world.store
    before = len(events(store_url))
    players_ops.add_player(store, CTX, 7, "alice")
    players_ops.rename_player(store, CTX, 7, "bob")
    players_ops.rename_player(store, CTX, 7, "bob")  # no change: no event
    players_ops.set_player_enabled(store, CTX, 7, False)
    players_ops.set_player_enabled(store, CTX, 7, False)  # no change: no event
    players_ops.set_player_enabled(store, CTX, 7, True)
    players_ops.revoke_player(store, CTX, 7)
    _, expires_at = games.rotate_game_key(store, CTX, world.game_id, 60)
    players_ops.delete_player(store, CTX, 7)
    assert events(store_url)[before:] == [
        ("player.created", 7, None, {"user_id": 7, "epoch": 0}),  # the names: gone with the player
        ("player.renamed", 7, None, {"user_id": 7, "epoch": 0}),
        ("player.disabled", 7, None, {"user_id": 7, "epoch": 0}),
        ("player.enabled", 7, None, {"user_id": 7, "epoch": 0}),
        ("player.revoked", 7, None, {"user_id": 7, "epoch": 1}),
        (
            "game.key_rotated",
            None,
            world.game_id,
            {"game_id": world.game_id, "old_keys_expire_at": expires_at},
        ),
        ("player.deleted", 7, None, {"user_id": 7, "epoch": 1}),
    ]
    players_ops.add_player(
        store, CTX, 7, "carol"
    )  # the id again: its epoch continues, its name is in its event
    players_ops.put_player(store, CTX, 8, "dave", enabled=False)  # created disabled: both facts
    assert events(store_url)[before + 7 :] == [
        ("player.created", 7, None, {"user_id": 7, "username": "carol", "epoch": 2}),
        ("player.created", 8, None, {"user_id": 8, "username": "dave", "epoch": 0}),
        ("player.disabled", 8, None, {"user_id": 8, "username": "dave", "epoch": 0}),
    ]


def test_a_refused_or_rolled_back_write_leaves_no_event_and_no_delivery(world, store_url):
    store = world.store
    webhooks_ops.add_webhook(store, CTX, "https://game.example.com/hook", EVERY, None, ALLOW)
    already = counts(store_url)
    with (
        pytest.raises(RuntimeError),
        store.write() as tx,
    ):  # an exception after the change, inside the Tx
        tx.rename_player(world.user_id, "mallory")
        tx.revoke_player(world.user_id)
        raise RuntimeError("after the change")
    stale = players_ops.put_player(store, CTX, world.user_id, "alice")[0]
    players_ops.revoke_player(store, CTX, world.user_id)
    assert counts(store_url)[0] == already[0] + 1
    already = counts(store_url)
    with pytest.raises(PreconditionFailed):  # If-Match names the version before the revoke
        players_ops.put_player(
            store, CTX, world.user_id, "mallory", if_match=condition("If-Match", etag(stale))
        )
    with pytest.raises(Conflict):
        players_ops.add_player(store, CTX, world.user_id, "mallory")
    with pytest.raises(NotFound):
        players_ops.revoke_player(store, CTX, 999)
    assert counts(store_url) == already
    assert store.get_player(world.user_id).username == "alice"


def test_a_keyed_retry_through_the_admin_api_replays_its_answer_and_writes_no_second_event(
    admin, world, store_url
):
    """An Idempotency-Key replay is the same change answered again, not a new one: one event, one
    delivery."""
    webhooks_ops.add_webhook(world.store, CTX, "https://game.example.com/hook", EVERY, None, ALLOW)
    keyed = admin.headers("web") | {"Idempotency-Key": "revoke-1"}
    before = len(events(store_url))
    first = admin.app.post(f"/v1/players/{world.user_id}/revoke", headers=keyed)
    again = admin.app.post(f"/v1/players/{world.user_id}/revoke", headers=keyed)
    assert (first.status_int, again.status_int, again.json) == (200, 200, first.json)
    assert [(t, u) for t, u, _, _ in events(store_url)[before:]] == [
        ("player.revoked", world.user_id)
    ]
    fan_out(world.store)
    assert [(t, s) for _, t, _, s in deliveries(store_url)] == [("player.revoked", "pending")]


def test_a_batch_writes_one_event_per_change_and_a_dry_run_none(world, store_url):
    store = world.store
    players_ops.add_player(store, CTX, 10, "ten")
    players_ops.add_player(store, CTX, 11, "eleven")
    body = {
        "players": [
            {"user_id": 10, "username": "ten"},  # unchanged
            {"user_id": 11, "username": "elf", "enabled": False},  # renamed and disabled
            {"user_id": 12, "username": "twelve"},  # created
            {"user_id": 13, "username": "thirteen", "enabled": False},
        ]
    }  # created disabled
    items, errors, _ = batch.parse(body)
    already = counts(store_url)
    players_ops.batch_players(store, CTX, items, True, len(errors), body)
    assert counts(store_url) == already
    players_ops.batch_players(store, CTX, items, False, len(errors), body)
    assert [(t, u, d.get("username")) for t, u, _, d in events(store_url)[already[0] :]] == [
        ("player.renamed", 11, "elf"),
        ("player.disabled", 11, "elf"),
        ("player.created", 12, "twelve"),
        ("player.created", 13, "thirteen"),
        ("player.disabled", 13, "thirteen"),
    ]
    players_ops.batch_players(store, CTX, items, False, len(errors), body)  # all unchanged now
    assert counts(store_url)[0] == already[0] + 5


def test_an_import_writes_created_and_renamed_and_nothing_for_an_unchanged_row(world, store_url):
    store = world.store
    already = counts(store_url)[0]
    players_ops.import_players(store, CTX, b"4242,alice\n20,twenty\n4242,alicia\n21,x\n21,y\n")
    got = sorted((t, u, d["username"], d["epoch"]) for t, u, _, d in events(store_url)[already:])
    assert got == [
        ("player.created", 20, "twenty", 0),
        ("player.created", 21, "y", 0),
        ("player.renamed", 4242, "alicia", 0),
    ]
    players_ops.import_players(store, CTX, b"20,twenty\n")
    assert counts(store_url)[0] == already + 3


def test_deliveries_fan_out_by_type_and_game_and_stop_for_a_removed_webhook(world, store_url):
    store = world.store
    other, _ = world.add_game("Go")
    players, _ = webhooks_ops.add_webhook(
        store, CTX, "https://a.example.com/h", ["player.renamed", "player.revoked"], None, ALLOW
    )
    chess, _ = webhooks_ops.add_webhook(
        store,
        CTX,
        "https://b.example.com/h",
        ["game.key_rotated", "player.renamed"],
        world.game_id,
        ALLOW,
    )
    keys, _ = webhooks_ops.add_webhook(
        store, CTX, "https://c.example.com/h", ["game.key_rotated"], None, ALLOW
    )
    players_ops.rename_player(
        store, CTX, world.user_id, "alicia"
    )  # players and chess (player events go to every game's)
    players_ops.revoke_player(store, CTX, world.user_id)  # players only
    games.rotate_game_key(store, CTX, world.game_id, 0)  # chess and keys
    games.rotate_game_key(store, CTX, other, 0)  # keys only
    players_ops.add_player(store, CTX, 30, "thirty")  # nobody subscribed
    assert deliveries(store_url) == []  # a change writes its event only
    now = int(time.time() * 1000)
    assert store.fan_out_events(now, 10_000) == (6, False)
    assert deliveries(store_url) == [  # a webhook's in the events' order
        (players.id, "player.renamed", world.user_id, "pending"),
        (players.id, "player.revoked", world.user_id, "pending"),
        (chess.id, "player.renamed", world.user_id, "pending"),
        (chess.id, "game.key_rotated", None, "pending"),
        (keys.id, "game.key_rotated", None, "pending"),
        (keys.id, "game.key_rotated", None, "pending"),
    ]
    assert store.fan_out_events(now, 10_000) == (0, False)  # each event once per webhook
    ((at_ms, next_at, created_at),) = store_sql(
        store_url,
        "SELECT e.at_ms, d.next_at, d.created_at FROM deliveries AS d JOIN events AS e ON e.id = "
        "d.event_id ORDER BY d.id DESC LIMIT 1",
    )
    assert (next_at, created_at) == (now, at_ms)  # due at once; its 24 hours from the event
    webhooks_ops.remove_webhook(store, CTX, players.id)
    assert [s for w, _, _, s in deliveries(store_url) if w == players.id] == ["failed", "failed"]
    secrets = dict(store_sql(store_url, "SELECT id, secret FROM webhooks"))
    assert secrets[players.id] == "" and secrets[chess.id].startswith(
        "whsec_"
    )  # a removed one's secret is gone
    players_ops.revoke_player(store, CTX, world.user_id)
    fan_out(store)
    assert [w for w, *_ in deliveries(store_url)].count(players.id) == 2  # nothing new for it
    assert [h.id for h in webhooks_ops.list_webhooks(store)] == [chess.id, keys.id]
    with pytest.raises(NotFound):
        webhooks_ops.remove_webhook(store, CTX, players.id)


def test_a_webhook_gets_the_events_after_its_creation_a_bounded_batch_at_a_time(world, store_url):
    store = world.store
    players_ops.revoke_player(store, CTX, world.user_id)  # before any webhook: fanned out to none
    early, _ = webhooks_ops.add_webhook(
        store, CTX, "https://a.example.com/h", ["player.renamed"], None, ALLOW
    )
    for n in range(5):
        players_ops.rename_player(store, CTX, world.user_id, f"name-{n}")
    late, _ = webhooks_ops.add_webhook(
        store, CTX, "https://b.example.com/h", ["player.renamed"], None, ALLOW
    )
    players_ops.rename_player(store, CTX, world.user_id, "name-last")
    assert [fan_out(store, limit=2) for _ in range(4)] == [
        (3, True),
        (2, True),
        (2, False),
        (0, False),
    ]
    got = [
        (w, d["username"])
        for w, d in (
            (w, json.loads(d))
            for w, d in store_sql(
                store_url,
                "SELECT d.webhook_id, e.data FROM deliveries AS d "
                "JOIN events AS e ON e.id = d.event_id ORDER BY d.id",
            )
        )
    ]
    assert [u for w, u in got if w == early.id] == [
        "name-0",
        "name-1",
        "name-2",
        "name-3",
        "name-4",
        "name-last",
    ]
    assert [u for w, u in got if w == late.id] == ["name-last"]


def test_a_fan_out_running_beside_the_writes_takes_each_event_once_and_misses_none(
    world, settings, store_url
):
    """Writers on their own connections and a fan-out looping on another: every event reaches the
    webhook exactly once, in order (the events' ids follow their commits: what the fan-out sees is a
    prefix)."""
    from authsvc.store import open_store

    hook, _ = webhooks_ops.add_webhook(
        world.store, CTX, "https://a.example.com/h", ["player.renamed"], None, ALLOW
    )
    stop = threading.Event()
    fanned: list[int] = []

    def fan_out_loop() -> None:
        store = open_store(settings.store, readonly=False, settings=settings)
        try:
            while not stop.is_set():
                fanned.append(fan_out(store, limit=7)[0])
        finally:
            store.close()

    def writer(user_id: int) -> None:
        store = open_store(settings.store, readonly=False, settings=settings)
        try:
            factories.add_player(store, user_id, f"w{user_id}")
            for n in range(40):
                factories.rename_player(store, user_id, f"w{user_id}-{n}")
        finally:
            store.close()

    loop = threading.Thread(target=fan_out_loop)
    loop.start()
    writers = [threading.Thread(target=writer, args=(user_id,)) for user_id in (51, 52, 53)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    stop.set()
    loop.join()
    while fan_out(world.store)[0]:
        pass
    renamed = [
        i
        for (i,) in store_sql(
            store_url, "SELECT id FROM events WHERE type = 'player.renamed' ORDER BY id"
        )
    ]
    sent = [
        i
        for (i,) in store_sql(
            store_url,
            "SELECT event_id FROM deliveries WHERE webhook_id = ? ORDER BY id",
            (hook.id,),
        )
    ]
    assert len(renamed) == 120 and sent == renamed
    assert sum(fanned) > 0  # the loop took some up while the writes went on


def test_a_failed_delivery_is_sent_again_and_the_rest_are_refused(world, store_url):
    store = world.store
    hook, _ = webhooks_ops.add_webhook(
        store, CTX, "https://a.example.com/h", ["player.revoked"], None, ALLOW
    )
    players_ops.revoke_player(store, CTX, world.user_id)
    players_ops.revoke_player(store, CTX, world.user_id)
    fan_out(store)
    first, second = webhooks_ops.webhook_deliveries(store, hook.id)
    store_sql(
        store_url,
        "UPDATE deliveries SET state = 'failed', attempts = 1, done_at = 5, last_status = 500 "
        "WHERE id = ?",
        (first.id,),
    )
    store_sql(
        store_url,
        "INSERT INTO delivery_attempts (delivery_id, n, at, status, error, duration_ms) "
        "VALUES (?, 1, 4, 500, NULL, 12)",
        (first.id,),
    )
    (failed,) = webhooks_ops.webhook_deliveries(store, hook.id, state="failed")
    assert (failed.state, failed.event_type, failed.last_status, failed.tries[0].status) == (
        "failed",
        "player.revoked",
        500,
        500,
    )
    retried = webhooks_ops.retry_delivery(store, CTX, hook.id, first.id)
    assert (retried.state, retried.done_at, retried.attempts) == ("pending", None, 1)
    assert retried.next_at == retried.created_at > first.created_at - 1
    with pytest.raises(Conflict):
        webhooks_ops.retry_delivery(store, CTX, hook.id, second.id)  # pending: nothing to re-drive
    with pytest.raises(NotFound):
        webhooks_ops.retry_delivery(store, CTX, hook.id, second.id + 1)
    actions = [r[0] for r in store_sql(store_url, "SELECT action FROM audit ORDER BY id")]
    assert [a for a in actions if a.startswith("webhook.")] == ["webhook.add", "webhook.retry"]
    assert (
        webhooks_ops.webhook_deliveries(store, hook.id, after=first.id, limit=1)[0].id == second.id
    )
    with pytest.raises(Invalid):
        webhooks_ops.webhook_deliveries(store, hook.id, state="lost")


def test_a_deleted_players_name_leaves_every_event_and_no_secret_is_recorded(world, store_url):
    store = world.store
    _, secret = webhooks_ops.add_webhook(store, CTX, "https://a.example.com/h", EVERY, None, ALLOW)
    players_ops.add_player(store, CTX, 40, "forty-name")
    players_ops.rename_player(store, CTX, 40, "forty-other")
    players_ops.import_players(store, CTX, b"40,forty-third\n")
    players_ops.add_player(store, CTX, 41, "kept-name")
    text = repr(store_sql(store_url, "SELECT data FROM events"))
    assert "forty-name" in text and "forty-other" in text and "forty-third" in text
    players_ops.delete_player(store, CTX, 40)
    text = repr(store_sql(store_url, "SELECT data FROM events"))
    assert "forty" not in text and "kept-name" in text
    assert [d for t, u, _, d in events(store_url) if u == 40][-1] == {"user_id": 40, "epoch": 0}
    assert secret.startswith("whsec_") and secret not in repr(
        store_sql(store_url, "SELECT * FROM audit")
    )


def test_a_webhooks_rules(world):
    store = world.store
    for url, events_, game_id, field in [
        ("http://a.example.com/h", EVERY, None, "/url"),
        ("https://10.0.0.1/h", EVERY, None, "/url"),
        ("https://a.example.com/h", [], None, "/events"),
        ("https://a.example.com/h", ["player.*"], None, "/events"),
        ("https://a.example.com/h", EVERY, 999, "/game_id"),
        ("https://a.example.com/h", EVERY, 0, "/game_id"),
    ]:
        with pytest.raises(Invalid) as e:
            webhooks_ops.add_webhook(store, CTX, url, events_, game_id, ALLOW)
        assert e.value.field == field, url
    hook, _ = webhooks_ops.add_webhook(
        store,
        CTX,
        "http://10.0.0.1:8080/h",
        ["player.renamed", "player.created", "player.created"],
        None,
        "10.0.0.1:8080",
    )
    assert hook.events == ("player.created", "player.renamed")
    assert webhooks_ops.get_webhook(store, hook.id) == hook
    assert isinstance(store.get_player(world.user_id), Player)
