"""Webhook subscriptions through the admin API (WebTest) and the `authsvc webhook` command
(docs/admin-api.md and docs/admin.md, "Webhooks"): the secret shown once and never again, the
scopes, the URL and event rules as problems naming the field, Idempotency-Key, deliveries and their
re-drive, and the command's parity with the API.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import sqlite3

import pytest
import webtest

from authsvc.api.app import AdminApp
from authsvc.operations import api_tokens
from authsvc.operations.context import Context
from tests import factories
from tests.support import fan_out, problem, store_sql

EVERY = [
    "players:read",
    "players:write",
    "tokens:mint",
    "games:read",
    "games:write",
    "audit:read",
    "webhooks:read",
    "webhooks:write",
]
SECRET = re.compile(r"whsec_[A-Za-z0-9+/]{43}=")
HOOK = {
    "url": "https://game.example.com/authsvc-events",
    "events": ["player.renamed", "player.deleted"],
}


@pytest.fixture
def admin(world, settings):
    """(WebTest app, make_token(name, scopes) -> headers); the allow list names 127.0.0.1:9000."""
    app = AdminApp(dataclasses.replace(settings, webhook_allow_hosts="127.0.0.1:9000"))

    def make_token(name, scopes=EVERY):
        _, token = api_tokens.add_api_token(world.store, Context(actor="cli:test"), name, scopes)
        return {"Authorization": f"Bearer {token}"}

    yield webtest.TestApp(app, lint=True), make_token
    app.store.close()


def test_a_webhook_is_made_with_its_secret_shown_once_then_read_and_removed(
    admin, world, store_url
):
    app, make_token = admin
    headers = make_token("web")
    r = app.post_json("/v1/webhooks", HOOK | {"game_id": world.game_id}, headers=headers)
    assert r.status_int == 201
    made = r.json
    assert set(made) == {"id", "url", "events", "game_id", "created_at", "secret"}
    assert (made["url"], made["events"], made["game_id"]) == (
        HOOK["url"],
        ["player.deleted", "player.renamed"],
        world.game_id,
    )
    assert SECRET.fullmatch(made["secret"]) and re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", made["created_at"]
    )
    shown = {k: v for k, v in made.items() if k != "secret"}
    assert app.get("/v1/webhooks", headers=headers).json == {"webhooks": [shown]}
    assert app.get(f"/v1/webhooks/{made['id']}", headers=headers).json == shown
    # Never again: not in any answer, nor in the audit trail.
    audit = app.get("/v1/audit", headers=headers).text
    assert made["secret"] not in audit and made["secret"][6:] not in audit
    assert made["secret"] not in repr(store_sql(store_url, "SELECT * FROM audit"))
    assert [r["action"] for r in app.get("/v1/audit", headers=headers).json["records"]][
        0
    ] == "webhook.add"
    # A change goes out to it: one pending delivery, its event named.
    app.put_json("/v1/players/4242", {"username": "alicia"}, headers=headers)
    assert (
        app.get(f"/v1/webhooks/{made['id']}/deliveries", headers=headers).json["deliveries"] == []
    )
    fan_out(world.store)  # the deliverer's step: listed from then on
    page = app.get(f"/v1/webhooks/{made['id']}/deliveries", headers=headers).json
    assert page["next"] is None and [d["event_type"] for d in page["deliveries"]] == [
        "player.renamed"
    ]
    delivery = page["deliveries"][0]
    assert (delivery["state"], delivery["attempts"], delivery["done_at"]) == ("pending", [], None)
    assert (
        delivery["created_at"] <= delivery["next_at"]
    )  # its 24 hours from the event; due from the fan-out on
    problem(
        app.post(
            f"/v1/webhooks/{made['id']}/deliveries/{delivery['id']}/retry",
            headers=headers,
            expect_errors=True,
        ),
        409,
        "conflict",
    )
    store_sql(
        store_url,
        "UPDATE deliveries SET state = 'failed', done_at = 1 WHERE id = ?",
        (delivery["id"],),
    )
    retried = app.post(
        f"/v1/webhooks/{made['id']}/deliveries/{delivery['id']}/retry", headers=headers
    )
    assert (
        retried.status_int == 200
        and retried.json["state"] == "pending"
        and retried.json["done_at"] is None
    )
    gone = app.delete(f"/v1/webhooks/{made['id']}", headers=headers)
    assert gone.status_int == 200 and gone.json == {"id": made["id"], "deleted": True}
    problem(
        app.get(f"/v1/webhooks/{made['id']}", headers=headers, expect_errors=True), 404, "not-found"
    )
    # Its deliveries stay listable until retention removes them, each with its player's id.
    (kept,) = app.get(f"/v1/webhooks/{made['id']}/deliveries", headers=headers).json["deliveries"]
    assert (kept["id"], kept["user_id"], kept["state"], kept["last_error"]) == (
        delivery["id"],
        4242,
        "failed",
        "webhook removed",
    )
    problem(
        app.get("/v1/webhooks/999/deliveries", headers=headers, expect_errors=True),
        404,
        "not-found",
    )
    problem(
        app.delete(f"/v1/webhooks/{made['id']}", headers=headers, expect_errors=True),
        404,
        "not-found",
    )
    assert app.get("/v1/webhooks", headers=headers).json == {"webhooks": []}
    assert store_sql(store_url, "SELECT state, last_error FROM deliveries") == [
        ("failed", "webhook removed")
    ]


def test_each_operation_needs_its_scope(admin, world):
    app, make_token = admin
    players = make_token("players", ["players:read", "players:write"])
    reader = make_token("reader", ["webhooks:read"])
    made = app.post_json(
        "/v1/webhooks", HOOK, headers=make_token("writer", ["webhooks:write"])
    ).json
    calls = [
        ("GET", "/v1/webhooks", "webhooks:read"),
        ("GET", f"/v1/webhooks/{made['id']}", "webhooks:read"),
        ("GET", f"/v1/webhooks/{made['id']}/deliveries", "webhooks:read"),
        ("POST", "/v1/webhooks", "webhooks:write"),
        ("DELETE", f"/v1/webhooks/{made['id']}", "webhooks:write"),
        ("POST", f"/v1/webhooks/{made['id']}/deliveries/1/retry", "webhooks:write"),
    ]
    for method, path, scope in calls:
        for headers in (players, reader) if scope == "webhooks:write" else (players,):
            r = app.request(
                path,
                method=method,
                headers=headers,
                expect_errors=True,
                **({"json": HOOK} if method == "POST" and path == "/v1/webhooks" else {}),
            )
            assert scope in problem(r, 403, "forbidden")["detail"], (method, path)
    assert app.get("/v1/webhooks", headers=reader).json["webhooks"][0]["id"] == made["id"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"url": "http://game.example.com/h"}, "/url"),
        ({"url": "https://10.0.0.1/h"}, "/url"),
        ({"url": "https://127.0.0.1:9001/h"}, "/url"),  # the allow list names port 9000 only
        ({"url": "https://[::1]/h"}, "/url"),
        ({"url": "https://user:s3cr3t@game.example.com/h"}, "/url"),
        ({"url": "https://game.example.com/h#frag"}, "/url"),
        ({"url": "https://game.example.com/" + "x" * 2048}, "/url"),
        ({"url": "game.example.com/h"}, "/url"),
        (
            {"url": "hTtp://lxk1=F$Lc[?"},
            "/url",
        ),  # urlsplit raises on an unclosed "[": a 422, not a 500
        ({"url": "https://[not-v6]/h"}, "/url"),
        ({"url": 7}, "/url"),
        ({"events": []}, "/events"),
        ({"events": ["player.created", "player.exploded"]}, "/events"),
        ({"events": "player.created"}, "/events"),
        ({"events": ["*"]}, "/events"),
        ({"game_id": 999}, "/game_id"),
        ({"game_id": 0}, "/game_id"),
        ({"game_id": "1"}, "/game_id"),
    ],
)
def test_a_bad_subscription_is_a_problem_naming_its_field(admin, body, field):
    app, make_token = admin
    r = app.post_json("/v1/webhooks", HOOK | body, headers=make_token("web"), expect_errors=True)
    assert problem(r, 422, "validation")["errors"][0]["field"] == field
    assert "s3cr3t" not in r.text  # a URL's password is never echoed


def test_an_allow_listed_host_may_be_plain_http_and_private(admin):
    app, make_token = admin
    for url in ("http://127.0.0.1:9000/hook", "https://127.0.0.1:9000/hook"):
        assert (
            app.post_json(
                "/v1/webhooks", HOOK | {"url": url}, headers=make_token(f"t{len(url)}")
            ).status_int
            == 201
        )


def test_idempotency_a_replayed_subscription_keeps_no_secret_and_a_replayed_change_emits_once(
    admin, store_url
):
    app, make_token = admin
    headers = make_token("web") | {"Idempotency-Key": "hook-1"}
    first = app.post_json("/v1/webhooks", HOOK, headers=headers)
    again = problem(
        app.post_json("/v1/webhooks", HOOK, headers=headers, expect_errors=True),
        409,
        "idempotency-secret-not-kept",
    )
    assert again["webhook_id"] == first.json["id"] and first.json["secret"] not in json.dumps(again)
    assert first.json["secret"] not in repr(store_sql(store_url, "SELECT * FROM idempotency_keys"))
    revoke = make_token("web2") | {"Idempotency-Key": "revoke-1"}
    for _ in range(2):
        assert app.post("/v1/players/4242/revoke", headers=revoke).status_int == 200
    assert store_sql(store_url, "SELECT count(*) FROM events WHERE type = 'player.revoked'") == [
        (1,)
    ]


def test_deliveries_pages_and_their_query_rules(admin, world):
    app, make_token = admin
    headers = make_token("web")
    hook = app.post_json(
        "/v1/webhooks", HOOK | {"events": ["player.revoked"]}, headers=headers
    ).json
    for _ in range(3):
        app.post("/v1/players/4242/revoke", headers=headers)
    fan_out(world.store)  # the deliverer's step
    path = f"/v1/webhooks/{hook['id']}/deliveries"
    page = app.get(path, {"limit": "2"}, headers=headers).json
    assert len(page["deliveries"]) == 2 and page["next"] == str(page["deliveries"][-1]["id"])
    rest = app.get(path, {"after": page["next"], "state": "pending"}, headers=headers).json
    assert len(rest["deliveries"]) == 1 and rest["next"] is None
    assert app.get(path, {"state": "failed"}, headers=headers).json["deliveries"] == []
    for query, name in [
        ({"state": "lost"}, "state"),
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"after": "-1"}, "after"),
        ({"colour": "red"}, "colour"),
    ]:
        r = app.get(path, query, headers=headers, expect_errors=True)
        assert problem(r, 422, "validation")["errors"][0]["field"] == name


def test_the_command_follows_the_same_rules_and_shows_the_secret_once(
    command_as_alice, store_url, monkeypatch
):
    run = command_as_alice
    assert run("init")[0] == 0
    code, out, err = run(
        "webhook",
        "add",
        "https://game.example.com/h",
        "--event",
        "player.created",
        "--event",
        "player.deleted",
    )
    assert code == 0, err
    (secret,) = SECRET.findall(out)
    assert "shown only this once" in out
    code, out, _ = run("webhook", "list", "--json")
    listed = json.loads(out)["webhooks"]
    assert code == 0 and [(h["url"], h["events"]) for h in listed] == [
        ("https://game.example.com/h", ["player.created", "player.deleted"])
    ]
    assert secret not in run("webhook", "list")[1] and secret not in run("audit", "--json")[1]
    for argv, message in [
        (["http://game.example.com/h", "--event", "player.created"], "URL must be https://"),
        (
            ["https://10.0.0.1/h", "--event", "player.created"],
            "URL names an address outside the public internet",
        ),
        (
            ["https://game.example.com/h", "--event", "player.created", "--game", "999"],
            "--game no game 999",
        ),
    ]:
        code, _, err = run("webhook", "add", *argv)
        assert code == 1 and err.startswith(f"authsvc: error: {message}"), err
    code, _, err = run("webhook", "add", "https://game.example.com/h", "--event", "player.exploded")
    assert code == 2 and "invalid choice" in err
    monkeypatch.setenv("AUTHSVC_WEBHOOK_ALLOW_HOSTS", "10.0.0.1")
    assert run("webhook", "add", "http://10.0.0.1/h", "--event", "player.created")[0] == 0
    code, out, _ = run("webhook", "remove", str(listed[0]["id"]))
    assert code == 0 and out.startswith(f"webhook {listed[0]['id']} removed")
    code, _, err = run("webhook", "remove", str(listed[0]["id"]))
    assert code == 1 and err.startswith(f"authsvc: error: no webhook {listed[0]['id']}")
    actions = [
        r[0] for r in store_sql(store_url, "SELECT actor || ' ' || action FROM audit ORDER BY id")
    ]
    assert [a for a in actions if "webhook" in a] == [
        "cli:alice webhook.add",
        "cli:alice webhook.add",
        "cli:alice webhook.remove",
    ]


def test_the_command_lists_deliveries_and_sends_a_failed_one_again(
    command_as_alice, admin_store, store_url
):
    run = command_as_alice
    assert run("init")[0] == 0
    hook = json.loads(
        run("webhook", "add", "https://game.example.com/h", "--event", "player.created", "--json")[
            1
        ]
    )
    for user_id in (5, 6, 7):
        assert run("player", "add", str(user_id), f"p{user_id}")[0] == 0
    fan_out(admin_store)  # the deliverer's step
    first = store_sql(store_url, "SELECT min(id) FROM deliveries")[0][0]
    store_sql(
        store_url,
        "UPDATE deliveries SET state = 'failed', attempts = 1, done_at = 5, last_error = "
        "'HTTP 503 from game.example.com:443' WHERE id = ?",
        (first,),
    )
    code, out, _ = run("webhook", "deliveries", str(hook["id"]), "--limit", "2")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 4 and lines[-1] == f"more: --after {first + 1}", out
    assert lines[0].split() == [
        "ID",
        "EVENT",
        "USER",
        "STATE",
        "TRIES",
        "NEXT",
        "(PENDING)",
        "OR",
        "DONE",
        "LAST",
        "ANSWER",
    ]
    assert lines[1].split()[:5] == [str(first), "player.created", "5", "failed", "1"], out
    assert lines[1].endswith("HTTP 503 from game.example.com:443") and lines[2].split()[2:4] == [
        "6",
        "pending",
    ], out
    code, out, _ = run(
        "webhook", "deliveries", str(hook["id"]), "--after", str(first + 1), "--json"
    )
    page = json.loads(out)
    assert (
        code == 0 and [d["id"] for d in page["deliveries"]] == [first + 2] and page["next"] is None
    )
    assert set(page["deliveries"][0]) == {
        "id",
        "event_id",
        "event_type",
        "user_id",
        "state",
        "created_at",
        "next_at",
        "done_at",
        "last_status",
        "last_error",
        "attempts",
    }
    assert page["deliveries"][0]["user_id"] == 7
    code, out, _ = run("webhook", "deliveries", str(hook["id"]), "--state", "failed", "--json")
    assert [d["id"] for d in json.loads(out)["deliveries"]] == [first]
    code, _, err = run("webhook", "deliveries", str(hook["id"]), "--limit", "501")
    assert code == 2 and "must be a whole number from 1 to 500" in err
    code, out, _ = run("webhook", "retry", str(hook["id"]), str(first))
    assert (
        code == 0
        and out.strip() == f"delivery {first} of webhook {hook['id']} is pending again, due now"
    )
    assert store_sql(store_url, "SELECT state FROM deliveries WHERE id = ?", (first,)) == [
        ("pending",)
    ]
    code, _, err = run("webhook", "retry", str(hook["id"]), str(first))
    assert code == 1 and err.startswith(
        f"authsvc: error: delivery {first} is pending: only a failed one"
    ), err
    code, _, err = run("webhook", "retry", str(hook["id"]), "999")
    assert code == 1 and err.startswith(
        f"authsvc: error: no delivery 999 of webhook {hook['id']}"
    ), err
    actions = [
        r[0] for r in store_sql(store_url, "SELECT actor || ' ' || action FROM audit ORDER BY id")
    ]
    assert actions[-1] == "cli:alice webhook.retry"
    # A removed webhook's deliveries stay listable; an id that never was is still "no webhook".
    assert run("webhook", "remove", str(hook["id"]))[0] == 0
    code, out, _ = run("webhook", "deliveries", str(hook["id"]))
    assert code == 0 and [line.split()[:4] for line in out.splitlines()[1:]] == [
        [str(first + n), "player.created", str(5 + n), "failed"] for n in range(3)
    ], out
    code, _, err = run("webhook", "deliveries", "999")
    assert code == 1 and err.startswith("authsvc: error: no webhook 999"), err


def test_a_backup_holds_no_webhook_secret_and_its_webhooks_are_removed(
    command_as_alice, admin_store, tmp_path
):
    run = command_as_alice
    assert run("init")[0] == 0
    code, out, _ = run(
        "webhook", "add", "https://game.example.com/h", "--event", "player.created", "--json"
    )
    secret = json.loads(out)["secret"]
    assert run("player", "add", "5", "eve")[0] == 0
    assert fan_out(admin_store) == (1, False)  # a pending delivery
    copy = tmp_path / "copy.db"
    assert run("backup", str(copy))[0] == 0
    files = b"".join(p.read_bytes() for p in tmp_path.glob("copy.db*"))
    assert secret.encode() not in files and secret[6:].encode() not in files
    with sqlite3.connect(copy) as conn:
        assert conn.execute("SELECT secret, deleted_at IS NOT NULL FROM webhooks").fetchall() == [
            ("", 1)
        ]
        assert conn.execute("SELECT state FROM deliveries").fetchall() == [("failed",)]
    assert (
        run("webhook", "list", "--json")[1].count("game.example.com") == 1
    )  # the store itself is as it was


@pytest.mark.engine("sqlite", "postgresql")  # counted under each engine's writer lock
def test_the_51st_live_webhook_is_refused_and_a_removed_one_frees_its_place(admin, world):
    """One webhooks:write token once added 1,000 webhooks in 8 s, each a delivery of every event
    after."""
    app, make_token = admin
    headers = make_token("web")
    ids = [
        app.post_json(
            "/v1/webhooks", HOOK | {"url": f"https://game{n}.example.com/h"}, headers=headers
        ).json["id"]
        for n in range(50)
    ]
    r = app.post_json(
        "/v1/webhooks",
        HOOK | {"url": "https://one-more.example.com/h"},
        headers=headers,
        expect_errors=True,
    )
    assert problem(r, 409, "conflict")["detail"] == (
        "the store has 50 webhooks, its limit (AUTHSVC_MAX_WEBHOOKS): remove one first"
    )
    assert "one-more" not in app.get("/v1/webhooks", headers=headers).text
    app.delete(f"/v1/webhooks/{ids[0]}", headers=headers)  # a removed one is not counted
    assert (
        app.post_json(
            "/v1/webhooks", HOOK | {"url": "https://one-more.example.com/h"}, headers=headers
        ).status_int
        == 201
    )
    problem(
        app.post_json("/v1/webhooks", HOOK, headers=headers, expect_errors=True), 409, "conflict"
    )


def test_the_command_refuses_a_webhook_past_the_limit_with_one_line(command_as_alice, monkeypatch):
    run = command_as_alice
    assert run("init")[0] == 0
    monkeypatch.setenv("AUTHSVC_MAX_WEBHOOKS", "2")
    for n in range(2):
        assert (
            run("webhook", "add", f"https://game{n}.example.com/h", "--event", "player.created")[0]
            == 0
        )
    code, out, err = run(
        "webhook", "add", "https://game2.example.com/h", "--event", "player.created"
    )
    assert (code, out, err) == (
        1,
        "",
        "authsvc: error: the store has 2 webhooks, its limit (AUTHSVC_MAX_WEBHOOKS): "
        "remove one first\n",
    )
    monkeypatch.setenv("AUTHSVC_MAX_WEBHOOKS", "0")
    code, _, err = run("webhook", "list")
    assert code == 1 and "AUTHSVC_MAX_WEBHOOKS" in err and "from 1 to 10000" in err, err


def test_the_deliveries_listing_names_no_resolved_address_and_no_port_state(
    admin, world, store_url, command_as_alice
):
    """Delivery errors once said what an internal name resolves to, and told a closed port
    ("Connection refused") from a filtered one ("timed out"). Real sockets on loopback: a name that
    resolves to it, a port nobody listens on, and one whose accept queue is full (its SYNs dropped,
    as a firewall's)."""
    from authsvc.webhooks.connect import Client
    from authsvc.webhooks.deliver import Deliverer
    from tests.support import add_webhook

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]  # bound, never listening: refused
    full = socket.socket()
    full.bind(("127.0.0.1", 0))
    full.listen(0)
    queued = socket.create_connection(
        full.getsockname()
    )  # fills the queue: the next connection hangs
    KEY = "whsec_" + "A" * 32  # noqa: N806
    hooks = {
        "internal name": add_webhook(
            store_url, f"http://localhost:{closed_port}/hook", ["player.created"], KEY
        ),
        "closed port": add_webhook(
            store_url, f"http://127.0.0.1:{closed_port}/hook", ["player.created"], KEY
        ),
        "filtered port": add_webhook(
            store_url, f"http://127.0.0.1:{full.getsockname()[1]}/hook", ["player.created"], KEY
        ),
    }
    lines: list[str] = []
    deliverer = Deliverer(
        world.store,
        Client({"127.0.0.1"}, connect_timeout=1.0, timeout=2.0),
        concurrency=4,
        log=lines.append,
    )
    try:
        factories.add_player(world.store, 7, "bob")
        for _ in range(2):  # the fan-out, then the attempts
            deliverer.step()
            deliverer.settle()
    finally:
        deliverer.stopping.set()
        deliverer.finish()
        deliverer.client.close()
        queued.close()
        full.close()
        closed.close()
    app, make_token = admin
    headers = make_token("reader", ["webhooks:read"])
    expected = {
        "internal name": "not a public address",
        "closed port": "could not connect",
        "filtered port": "could not connect",
    }
    for what, hook_id in hooks.items():
        (listed,) = app.get(f"/v1/webhooks/{hook_id}/deliveries", headers=headers).json[
            "deliveries"
        ]
        assert (what, listed["last_error"], [a["error"] for a in listed["attempts"]]) == (
            what,
            expected[what],
            [expected[what]],
        )
        code, out, _ = command_as_alice("webhook", "deliveries", str(hook_id))
        assert code == 0 and out.splitlines()[1].endswith(f"  {expected[what]}"), out
        code, out, _ = command_as_alice("webhook", "deliveries", str(hook_id), "--json")
        assert json.loads(out)["deliveries"][0]["last_error"] == expected[what]
    # The operator's log keeps a detail (host and port, the socket's reason), never the listing's
    # only.
    (summary,) = [line for line in lines if line.startswith("delivered 0, 3 attempts failed")]
    assert re.search(r"\(last: webhook [123]: (localhost|127\.0\.0\.1):[0-9]+", summary), summary
