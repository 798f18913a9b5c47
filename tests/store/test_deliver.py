"""The delivery loop (authsvc/webhooks/deliver.py) on each engine, against a real receiver on
loopback.

The deliverer runs in this process with a clock the tests move (a retry's wait, the 24 h expiry),
stepped a round at a time: ``step`` starts the due chains, ``settle`` waits for them and writes.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import jsonschema
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from authsvc.tokens import api_key_digest
from authsvc.webhooks.connect import Client
from authsvc.webhooks.deliver import Deliverer
from tests import factories
from tests.support import Receiver, add_webhook, fan_out, store_sql

SECRET = "whsec_" + base64.b64encode(b"a webhook's secret, 24b!").decode()
EVENTS = ["player.created", "player.renamed"]
HOUR_MS = 3600 * 1000
REPO = Path(__file__).resolve().parents[2]


class Clock:
    """Unix milliseconds: the wall clock's, plus what a test added."""

    def __init__(self):
        self.ahead = 0

    def __call__(self) -> int:
        return int(time.time() * 1000) + self.ahead


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def deliverer(admin_store, receiver, clock):
    lines: list[str] = []
    d = Deliverer(
        admin_store,
        Client({f"127.0.0.1:{receiver.port}"}, timeout=5),
        concurrency=4,
        clock=clock,
        log=lines.append,
    )
    d.lines = lines
    yield d
    d.stopping.set()
    d.finish()
    d.client.close()


def rounds(d: Deliverer, n: int = 1) -> None:
    for _ in range(n):
        d.step()
        d.settle()


def deliveries(store_url: str) -> list[tuple]:
    return store_sql(
        store_url,
        "SELECT id, user_id, state, attempts, last_status, next_at, created_at, done_at "
        "FROM deliveries ORDER BY id",
    )


def attempts(store_url: str, delivery_id: int) -> list[tuple]:
    return store_sql(
        store_url,
        "SELECT n, at, status, error FROM delivery_attempts WHERE delivery_id = ? ORDER BY n",
        (delivery_id,),
    )


def test_an_event_arrives_signed_so_that_standard_webhooks_verifies_it(
    admin_store, store_url, receiver, deliverer
):
    add_webhook(store_url, receiver.url(), EVENTS, SECRET)
    factories.add_player(admin_store, 7, "bob")
    rounds(deliverer)
    ((headers, body),) = receiver.requests
    payload = Webhook(SECRET).verify(body, headers)
    assert payload["type"] == "player.created" and payload["data"] == {
        "user_id": 7,
        "username": "bob",
        "epoch": 0,
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", payload["timestamp"])
    assert headers["webhook-id"] == "msg_1" and headers["content-type"] == "application/json"
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body.replace(b"bob", b"eve"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(
            body, {**headers, "webhook-timestamp": str(int(headers["webhook-timestamp"]) - 1)}
        )
    ((_, _, state, tries, status, _, _, done_at),) = deliveries(store_url)
    assert (state, tries, status) == ("delivered", 1, 200) and done_at is not None


def test_every_event_as_sent_is_what_both_openapi_documents_describe(
    admin_store, store_url, receiver, deliverer
):
    """Each type's body and headers, as the deliverer sends them, validate against the document's
    ``webhooks`` entry of that type (the game-facing and the admin document say the same)."""
    documents = [
        json.loads((REPO / "authsvc" / "openapi" / name).read_text())
        for name in ("authenticate.json", "admin.json")
    ]
    types = [
        "player.created",
        "player.renamed",
        "player.disabled",
        "player.enabled",
        "player.revoked",
        "player.deleted",
        "game.key_rotated",
    ]
    assert all(sorted(doc["webhooks"]) == sorted(types) for doc in documents)
    add_webhook(store_url, receiver.url(), types, SECRET)
    game = factories.add_game(admin_store, "Chess", api_key_digest("k1"), 1_700_000_000)
    for change in (
        lambda: factories.add_player(admin_store, 7, "bob"),
        lambda: factories.rename_player(admin_store, 7, "robert"),
        lambda: factories.set_player_enabled(admin_store, 7, False),
        lambda: factories.set_player_enabled(admin_store, 7, True),
        lambda: factories.revoke_player(admin_store, 7),
        lambda: factories.add_api_key(
            admin_store, game.id, api_key_digest("k2"), 1_700_000_001, 1_700_003_600
        ),
        lambda: factories.add_api_key(
            admin_store, game.id, api_key_digest("k3"), 1_700_000_002, None
        ),
        lambda: factories.delete_player(admin_store, 7),
        # sent after: no name
        lambda: (
            factories.add_player(admin_store, 8, "eve"),
            factories.delete_player(admin_store, 8),
        ),
    ):
        change()
        rounds(deliverer)
    sent = [(headers, json.loads(body)) for headers, body in receiver.requests]
    assert [b["type"] for _, b in sent] == types[:5] + ["game.key_rotated"] * 2 + [
        "player.deleted"
    ] * 1 + ["player.created", "player.deleted"]
    assert "username" not in sent[-2][1]["data"]
    for doc in documents:
        for headers, body in sent:
            operation = doc["webhooks"][body["type"]]["post"]
            schema = operation["requestBody"]["content"]["application/json"]["schema"] | {
                "components": doc["components"]
            }
            jsonschema.Draft202012Validator(
                schema, format_checker=jsonschema.FormatChecker()
            ).validate(body)
            for ref in operation["parameters"]:
                parameter = doc["components"]["parameters"][ref["$ref"].rsplit("/", 1)[1]]
                jsonschema.validate(headers[parameter["name"]], parameter["schema"])
    for key in ("webhooks",):
        assert documents[0][key] == documents[1][key]
    used = {
        "PlayerEvent",
        "PlayerEventData",
        "PlayerDeletedEvent",
        "PlayerDeletedData",
        "KeyRotatedEvent",
        "KeyRotatedData",
    }
    assert {k: documents[0]["components"]["schemas"][k] for k in used} == {
        k: documents[1]["components"]["schemas"][k] for k in used
    }


def test_a_player_s_events_wait_for_the_one_before_it_through_its_retries(
    admin_store, store_url, receiver, deliverer, clock
):
    """The receiver fails its first POST: that player's next event waits for the retry (5 s on, with
    jitter), another player's does not; once the receiver recovers, the chain goes in order."""
    seen = []

    def answer(headers, body):  # the first POST of player 7's first event fails
        seen.append(headers["webhook-id"])
        return 500 if seen.count("msg_1") == 1 and headers["webhook-id"] == "msg_1" else 204

    receiver.answer = answer
    add_webhook(store_url, receiver.url(), EVENTS, SECRET)
    factories.add_player(admin_store, 7, "bob")
    factories.rename_player(admin_store, 7, "bobby")
    factories.add_player(admin_store, 8, "carol")
    rounds(deliverer)
    assert sorted((b["type"], b["data"]["user_id"]) for b in receiver.bodies()) == [
        ("player.created", 7),
        ("player.created", 8),
    ]
    first = deliveries(store_url)[0]
    assert first[2:5] == ("pending", 1, 500)
    ((n, at, status, error),) = attempts(store_url, first[0])
    assert (n, status) == (1, 500) and error == "answered 500"
    assert 5000 <= first[5] - at <= 5500  # the first wait: 5 s and up to 10 % jitter
    factories.rename_player(
        admin_store, 7, "robert"
    )  # due at once, but behind the one waiting for its retry
    clock.ahead = 4000
    rounds(deliverer, 2)
    assert len(receiver.requests) == 2
    clock.ahead = 6000
    rounds(deliverer)
    assert [(b["type"], b["data"]["username"]) for b in receiver.bodies()][2:] == [
        ("player.created", "bob"),
        ("player.renamed", "bobby"),
        ("player.renamed", "robert"),
    ]
    assert [h["webhook-id"] for h, _ in receiver.requests][2:] == ["msg_1", "msg_2", "msg_4"]
    assert [row[2:5] for row in deliveries(store_url)] == [
        ("delivered", 2, 204),
        ("delivered", 1, 204),
        ("delivered", 1, 204),
        ("delivered", 1, 204),
    ]
    assert [(n, status) for n, _, status, _ in attempts(store_url, first[0])] == [
        (1, 500),
        (2, 204),
    ]


def test_a_delivery_not_taken_within_24_hours_is_failed_and_the_next_one_goes(
    admin_store, store_url, receiver, deliverer, clock
):
    receiver.answer = lambda headers, body: 503
    add_webhook(store_url, receiver.url(), EVENTS, SECRET)
    factories.add_player(admin_store, 7, "bob")
    factories.rename_player(admin_store, 7, "bobby")
    rounds(deliverer)
    (head, follower) = deliveries(store_url)
    clock.ahead = 23 * HOUR_MS
    rounds(deliverer)
    assert deliveries(store_url)[0][2:4] == ("pending", 2)
    assert (
        deliveries(store_url)[0][5] <= head[6] + 24 * HOUR_MS
    )  # the last try at the 24 h mark at the latest
    clock.ahead = 24 * HOUR_MS + 1
    rounds(deliverer)
    (head, follower) = deliveries(store_url)
    assert head[2:5] == ("failed", 3, 503) and head[7] is not None
    rounds(deliverer)
    assert [b["type"] for b in receiver.bodies()] == ["player.created"] * 3 + ["player.renamed"]
    assert deliveries(store_url)[1][2:4] == ("failed", 1)  # as old: one try, then given up


def test_a_deleted_webhook_s_pending_deliveries_are_failed_not_sent(
    admin_store, store_url, receiver, deliverer
):
    """A webhook marked deleted by other means than the API (which fails them itself): a restored
    backup."""
    webhook = add_webhook(store_url, receiver.url(), EVENTS, SECRET)
    factories.add_player(admin_store, 7, "bob")
    assert fan_out(admin_store) == (1, False)
    store_sql(
        store_url,
        "UPDATE webhooks SET deleted_at = ? WHERE id = ?",
        (int(time.time() * 1000), webhook),
    )
    rounds(deliverer)
    assert receiver.requests == []
    assert [row[2] for row in deliveries(store_url)] == ["failed"]
    assert store_sql(store_url, "SELECT last_error FROM deliveries") == [
        ("the webhook was deleted",)
    ]


def test_one_deliverer_works_on_a_store_and_another_takes_over_when_it_stops(
    admin_store, store_url, receiver, deliverer, clock
):
    """A second one waits (saying once who holds the store) and sends nothing; it takes over when
    the first lets the lease go, or once the lease has run out, or at once if its holder was a
    process of this host that is gone."""
    add_webhook(store_url, receiver.url(), EVENTS, SECRET)
    made: list[Deliverer] = []

    def another() -> Deliverer:
        lines: list[str] = []
        d = Deliverer(
            admin_store,
            Client({f"127.0.0.1:{receiver.port}"}, timeout=5),
            concurrency=4,
            clock=clock,
            log=lines.append,
        )
        d.lines = lines
        made.append(d)
        return d

    def names() -> list[str]:
        return [b["data"]["username"] for b in receiver.bodies()]

    try:
        factories.add_player(admin_store, 7, "bob")
        rounds(deliverer)
        standby = another()
        factories.rename_player(admin_store, 7, "bobby")
        rounds(standby)
        if store_url.startswith(
            "sqlite://"
        ):  # a waiting deliverer only reads: it never asks for the write lock
            with contextlib.closing(
                sqlite3.connect(store_url.removeprefix("sqlite://"), isolation_level=None)
            ) as conn:
                conn.execute("BEGIN IMMEDIATE")
                rounds(standby, 3)
                conn.execute("ROLLBACK")
            assert not [line for line in standby.lines if line.startswith("store:")], standby.lines
        assert names() == ["bob"]  # the standby sent nothing
        assert standby.lines == [
            f"another deliverer ({deliverer.holder}) works on this store; waiting to take over"
        ]
        deliverer.stopping.set()
        deliverer.finish()  # lets the lease go
        rounds(standby)
        assert (
            names() == ["bob", "bobby"]
            and standby.lines[-1] == f"took over the store from {deliverer.holder}"
        )

        third = another()
        factories.rename_player(admin_store, 7, "robert")
        clock.ahead = 20_000  # the standby's lease, taken at 0, holds until 30 s
        rounds(third)
        assert names() == ["bob", "bobby"]
        clock.ahead = 36_000  # the standby has not renewed it: run out
        rounds(third)
        assert names() == ["bob", "bobby", "robert"]

        gone = subprocess.Popen(["true"])
        gone.wait()
        store_sql(
            store_url,
            "UPDATE deliverer_lease SET holder = ?, until_ms = ?",
            (f"{socket.gethostname()}:{gone.pid}:abcdef", clock() + 3_600_000),
        )
        factories.rename_player(admin_store, 7, "rob")
        rounds(another())
        assert names()[-1] == "rob"  # at once: its holder is gone
    finally:
        for d in made:
            d.stopping.set()
            d.finish()
            d.client.close()


def test_retention_deletes_old_finished_deliveries_and_unneeded_events_and_keeps_the_rest(
    admin_store, store_url, receiver, deliverer, clock
):
    """With the clock moved past AUTHSVC_WEBHOOK_RETENTION (7 days): a delivered delivery and its
    attempts go, then its event; a failed one stays (re-drivable) until 7 days after it failed; a
    pending one and its event stay; events no delivery needs (no subscriber, a type not subscribed)
    go once 7 days old, unless a webhook has yet to fan them out. A deleted player's username is in
    none of what stays."""
    factories.add_player(admin_store, 1, "nobody")  # before any webhook: an event with no delivery
    add_webhook(store_url, receiver.url(), EVENTS, SECRET)
    receiver.answer = lambda headers, body: 204 if b'"bob"' in body else 503
    factories.add_player(admin_store, 7, "bob")
    factories.set_player_enabled(admin_store, 7, False)  # not subscribed: no delivery
    factories.add_player(admin_store, 9, "dave")
    rounds(deliverer)  # bob's delivered, dave's waits for its retry
    clock.ahead = 24 * HOUR_MS + 1
    rounds(deliverer)  # dave's is failed, 24 h on
    factories.delete_player(admin_store, 9)  # player.deleted: not subscribed
    clock.ahead = 0
    factories.rename_player(
        admin_store, 7, "bobby"
    )  # pending: its first try fails, its retry waits
    rounds(deliverer)

    def kept() -> tuple[list, list, list]:
        return (
            store_sql(store_url, "SELECT user_id, state FROM deliveries ORDER BY id"),
            store_sql(store_url, "SELECT type, user_id FROM events ORDER BY id"),
            store_sql(
                store_url, "SELECT delivery_id, n FROM delivery_attempts ORDER BY delivery_id, n"
            ),
        )

    everything = kept()
    assert (
        everything[0] == [(7, "delivered"), (9, "failed"), (7, "pending")]
        and len(everything[1]) == 6
    )
    assert not deliverer.prune() and kept() == everything  # nothing is 7 days old yet

    clock.ahead = 7 * 24 * HOUR_MS + 12 * HOUR_MS
    assert not deliverer.prune()
    deliveries_left, events_left, attempts_left = kept()
    assert deliveries_left == [(9, "failed"), (7, "pending")]
    assert events_left == [("player.created", 9), ("player.renamed", 7)]
    assert attempts_left == [(2, 1), (2, 2), (3, 1)]  # dave's two, bobby's one; bob's one went
    assert not any("dave" in data for (data,) in store_sql(store_url, "SELECT data FROM events"))

    clock.ahead = 7 * 24 * HOUR_MS + 25 * HOUR_MS  # 7 days after dave's failed
    deliverer.prune()
    assert kept() == ([(7, "pending")], [("player.renamed", 7)], [(3, 1)])
    factories.rename_player(
        admin_store, 7, "bobbie"
    )  # not fanned out yet: no delivery needs it, but the webhook does
    deliverer.prune()
    assert kept()[1] == [("player.renamed", 7), ("player.renamed", 7)]


def test_retention_deletes_a_removed_webhook_s_row_once_none_of_its_deliveries_is_left(
    admin_store, store_url, receiver, deliverer, clock
):
    from authsvc.operations import webhooks as webhooks_ops
    from authsvc.operations.context import Context

    hook = add_webhook(store_url, receiver.url(), EVENTS, SECRET)
    kept = add_webhook(store_url, receiver.url("/other"), EVENTS, SECRET)
    factories.add_player(admin_store, 7, "bob")
    rounds(deliverer)
    webhooks_ops.remove_webhook(admin_store, Context(actor="cli:test"), hook)
    clock.ahead = 3 * 24 * HOUR_MS
    deliverer.prune()
    assert [row[0] for row in store_sql(store_url, "SELECT id FROM webhooks ORDER BY id")] == [
        hook,
        kept,
    ]
    clock.ahead = (
        8 * 24 * HOUR_MS
    )  # the deliveries, done 8 days ago, go, and their event; then the row
    deliverer.prune()
    assert store_sql(store_url, "SELECT id FROM webhooks") == [(kept,)]
    assert deliverer.lines[-1] == "retention: 2 deliveries, 1 events and 1 removed webhooks deleted"


@pytest.mark.engine(
    "postgresql"
)  # SQLite has one write lock for the whole file: its transactions are short instead
def test_the_bookkeeping_takes_no_writer_lock(admin_store, store_url, receiver, deliverer):
    """An admin write holding the writer lock (the audit chain's row) does not stop outcomes being
    written."""
    import psycopg

    add_webhook(store_url, receiver.url(), EVENTS, SECRET)
    factories.add_player(admin_store, 7, "bob")

    with psycopg.connect(store_url) as other:
        other.execute("SELECT head_id FROM audit_chain WHERE id = 1 FOR UPDATE")
        rounds(deliverer)
        assert deliveries(store_url)[0][2] == "delivered"


@pytest.mark.engine("sqlite")
def test_the_reference_game_server_verifies_and_applies_renames_and_deletions(
    admin_store, store_url, tmp_path
):
    """examples/game's webhook: a platform-made account takes the new name; a deleted player's
    account goes, a linked game account loses only its link; a POST with a bad signature is
    refused."""
    import http.client
    import threading
    from wsgiref.simple_server import make_server

    from examples.game.server import Game, ThreadingServer, add_account

    db = str(tmp_path / "game.db")
    game = Game(db, "http://127.0.0.1:1", "unused", "http://127.0.0.1:1/", webhook_secret=SECRET)
    game.login(7, "bob", {})
    game.login(9, "dave", {})
    add_account(db, "oldtimer", "pw")
    game.db.execute("UPDATE accounts SET platform_user_id = 8 WHERE name = 'oldtimer'")
    server = make_server("127.0.0.1", 0, game, server_class=ThreadingServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    d = Deliverer(
        admin_store, Client({f"127.0.0.1:{port}"}, timeout=5), concurrency=4, log=lambda text: None
    )
    try:
        add_webhook(
            store_url,
            f"http://127.0.0.1:{port}/webhooks/authsvc",
            ["player.deleted", "player.renamed"],
            SECRET,
        )
        for user_id, name in ((7, "bob"), (8, "carol"), (9, "dave")):
            factories.add_player(admin_store, user_id, name)
        factories.rename_player(admin_store, 7, "bobby")
        factories.delete_player(admin_store, 8)
        factories.delete_player(admin_store, 9)
        rounds(d)
        assert [row[2:5] for row in deliveries(store_url)] == [("delivered", 1, 204)] * 3
        rows = game.db.execute(
            "SELECT name, platform_user_id FROM accounts ORDER BY name"
        ).fetchall()
        assert rows == [("bobby", 7), ("oldtimer", None)]
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request(
            "POST",
            "/webhooks/authsvc",
            body=b'{"type":"player.deleted","data":{"user_id":7}}',
            headers={
                "webhook-id": "msg_x",
                "webhook-timestamp": str(int(time.time())),
                "webhook-signature": "v1," + base64.b64encode(b"x" * 32).decode(),
            },
        )
        assert conn.getresponse().status == 401
        assert game.account(7) == {"name": "bobby", "coins": 0}
    finally:
        d.stopping.set()
        d.finish()
        server.shutdown()
        server.server_close()


@pytest.mark.engine("sqlite")
def test_a_write_that_waited_for_the_store_s_lock_says_how_long_it_was_held_and_guesses_no_cause(
    admin_store, store_url, deliverer
):
    """Another connection holds SQLite's write lock (a deletion's checkpoint, any admin write) past
    the bookkeeping's 2 s: the log names the lock and the time waited, not "an import"."""
    path = store_url.removeprefix("sqlite://")
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        assert deliverer.step() == 0
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert deliverer.lines == [
        f"store: sqlite store {path}: another connection held the store's write lock for 2 s, the "
        "longest this write waits; nothing was written, try again; trying again every 0.1 s"
    ]


@pytest.mark.parametrize("door", ["api", "command"])
def test_after_an_outage_a_webhook_s_pending_and_failed_deliveries_are_sent_now(
    admin_store, store_url, receiver, deliverer, settings, command_as_alice, door
):
    """The receiver was down: one player's delivery waits for its retry, another's failed. Made due
    now (the admin API's POST .../deliveries/retry, or `authsvc webhook retry ID --all`), the next
    round sends both, though the wait has not run out; audited as the single retry."""
    import webtest

    from authsvc.api.app import AdminApp
    from authsvc.operations import api_tokens
    from authsvc.operations.context import Context

    receiver.answer = lambda headers, body: 503
    webhook = add_webhook(store_url, receiver.url(), EVENTS, SECRET)
    factories.add_player(admin_store, 7, "bob")
    factories.add_player(admin_store, 8, "carol")
    rounds(deliverer)
    assert [row[2:4] for row in deliveries(store_url)] == [("pending", 1), ("pending", 1)]
    store_sql(store_url, "UPDATE deliveries SET state = 'failed', done_at = 1 WHERE user_id = 8")
    receiver.answer = lambda headers, body: 204
    rounds(deliverer)
    assert (
        len(receiver.requests) == 2
    )  # nothing due: the retry's wait, and a failed one is not sent
    if door == "api":
        _, token = api_tokens.add_api_token(
            admin_store, Context(actor="cli:test"), "ops", ["webhooks:write"]
        )
        app = AdminApp(settings)
        try:
            client = webtest.TestApp(app, lint=True)
            answer = client.post(
                f"/v1/webhooks/{webhook}/deliveries/retry",
                headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "outage-1"},
            )
            assert answer.status_int == 200 and answer.json == {"webhook_id": webhook, "due_now": 2}
            again = client.post(
                f"/v1/webhooks/{webhook}/deliveries/retry",
                headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "outage-1"},
            )
            assert (
                again.json == {"webhook_id": webhook, "due_now": 2}
                and again.headers["Idempotent-Replayed"] == "true"
            )
            bad = client.post(
                f"/v1/webhooks/{webhook}/deliveries/retry?state=delivered",
                headers={"Authorization": f"Bearer {token}"},
                expect_errors=True,
            )
            assert bad.status_int == 422 and bad.content_type == "application/problem+json"
            assert bad.json["errors"] == [
                {"field": "state", "detail": "must be one of: pending, failed"}
            ], bad.json
            gone = client.post(
                "/v1/webhooks/999/deliveries/retry",
                headers={"Authorization": f"Bearer {token}"},
                expect_errors=True,
            )
            assert (gone.status_int, gone.json["detail"]) == (404, "no webhook 999")
        finally:
            app.store.close()
        actor = "api:ops"
    else:
        code, out, _ = command_as_alice("webhook", "retry", str(webhook), "--all")
        assert (code, out.strip()) == (
            0,
            f"webhook {webhook}: 2 pending and failed deliveries due now",
        )
        code, _, err = command_as_alice("webhook", "retry", str(webhook))
        assert code == 1 and "give a DELIVERY_ID, or --all" in err, err
        actor = "cli:alice"
    rounds(deliverer)
    assert sorted((b["type"], b["data"]["user_id"]) for b in receiver.bodies()[2:]) == [
        ("player.created", 7),
        ("player.created", 8),
    ]
    assert [row[2] for row in deliveries(store_url)] == ["delivered", "delivered"]
    ((who, changes),) = store_sql(
        store_url, "SELECT actor, changes FROM audit WHERE action = 'webhook.retry'"
    )
    assert (who, json.loads(changes)) == (
        actor,
        {
            "before": {},
            "after": {"webhook_id": webhook, "states": ["pending", "failed"], "deliveries": 2},
        },
    )


def test_the_deliverer_s_metrics_count_attempts_and_read_the_backlog_at_each_scrape(
    admin_store, store_url, receiver, clock
):
    """Served over HTTP as Prometheus scrapes them: a receiver answering 503 leaves two players'
    deliveries pending (attempts: retry), one given up after 24 h (failed); the backlog read from
    the store."""
    import urllib.request

    from authsvc.webhooks.metrics import DeliveryMetrics
    from tests.support import free_port

    metrics = DeliveryMetrics(admin_store, clock)
    port = free_port()
    server, _ = metrics.serve("127.0.0.1", port)
    d = Deliverer(
        admin_store,
        Client({f"127.0.0.1:{receiver.port}"}, timeout=5),
        concurrency=4,
        clock=clock,
        log=lambda line: None,
        metrics=metrics,
    )
    try:
        receiver.answer = lambda headers, body: 503
        webhook = add_webhook(store_url, receiver.url(), EVENTS, SECRET)
        factories.add_player(admin_store, 7, "bob")
        factories.add_player(admin_store, 8, "carol")
        rounds(d)
        store_sql(
            store_url,
            "UPDATE deliveries SET created_at = created_at - ? WHERE user_id = 8",
            (24 * HOUR_MS,),
        )  # its 24 hours ran out: the next attempt gives up
        clock.ahead = 10_000  # both retries due, player 7's event 10 s old
        rounds(d)

        def scrape() -> list[str]:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
                return [
                    line
                    for line in answer.read().decode().splitlines()
                    if line.startswith("authsvc_webhook_")
                    and not line.startswith("authsvc_webhook_delivery_attempts_created")
                ]

        lines = scrape()
        assert [line for line in lines if "oldest" not in line] == [
            'authsvc_webhook_delivery_attempts_total{outcome="delivered"} 0.0',
            'authsvc_webhook_delivery_attempts_total{outcome="retry"} 3.0',
            'authsvc_webhook_delivery_attempts_total{outcome="failed"} 1.0',
            f'authsvc_webhook_deliveries{{state="pending",webhook="{webhook}"}} 1.0',
            f'authsvc_webhook_deliveries{{state="failed",webhook="{webhook}"}} 1.0',
        ], lines
        (oldest,) = [line for line in lines if "oldest" in line]
        name, value = oldest.rsplit(" ", 1)
        assert (
            name == f'authsvc_webhook_oldest_pending_seconds{{webhook="{webhook}"}}'
            and 10 <= float(value) < 60
        )
        receiver.answer = lambda headers, body: 204
        clock.ahead = 60_000
        rounds(d)
        assert f'authsvc_webhook_deliveries{{state="pending",webhook="{webhook}"}} 0.0' in scrape()
        assert f'authsvc_webhook_oldest_pending_seconds{{webhook="{webhook}"}} 0.0' in scrape()
        assert 'authsvc_webhook_delivery_attempts_total{outcome="delivered"} 1.0' in scrape()
    finally:
        d.stopping.set()
        d.finish()
        d.client.close()
        server.shutdown()
        server.server_close()
