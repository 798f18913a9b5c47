"""The admin API's batch (``POST /v1/players/batch``) and its per-token rate limit
(docs/admin-api.md), through WebTest on both engines: a result per item, dry runs, invalid items
named by field, the bounds (1,000 items, the body cap), one audit record per batch, Idempotency-Key,
429 with Retry-After.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import time

import pytest
import webtest

from authsvc.api.app import AdminApp
from authsvc.operations import api_tokens
from authsvc.operations import players as players_ops
from authsvc.operations.context import Context
from authsvc.settings import Settings
from authsvc.store.audit import canonical
from tests import factories
from tests.support import audit_rows, problem, store_sql

BATCH = "/v1/players/batch"


def players(store) -> dict[int, tuple[str, bool]]:
    return {p.user_id: (p.username, p.enabled) for p in store.dump() if hasattr(p, "user_id")}


def test_a_batch_answers_a_result_per_item_and_writes_in_one_transaction(
    admin, world, store_url, caplog
):
    app, make_token = admin.app, admin.bearer
    headers, token = make_token("sync", ["players:write"])
    factories.add_player(world.store, 7, "gus")
    body = {
        "players": [
            {"user_id": 1, "username": "ann"},  # new
            {"user_id": 4242, "username": "alice", "enabled": True},  # the world's player as it is
            {"user_id": 7, "username": "gus", "enabled": False},  # a ban
            {"user_id": 4242 * 2, "username": "bo", "enabled": False},  # new, disabled
        ]
    }
    r = app.post_json(BATCH, body, headers=headers | {"X-Request-Id": "sync-1"})
    assert r.status_int == 200
    assert r.json["dry_run"] is False and "effective_by" in r.json
    assert r.json["results"] == [
        {"index": 0, "user_id": 1, "status": "created"},
        {"index": 1, "user_id": 4242, "status": "unchanged"},
        {"index": 2, "user_id": 7, "status": "updated"},
        {"index": 3, "user_id": 8484, "status": "created"},
    ]
    assert r.json["counts"] == {"created": 2, "updated": 1, "unchanged": 1, "error": 0}
    assert players(world.store) == {
        1: ("ann", True),
        4242: ("alice", True),
        7: ("gus", False),
        8484: ("bo", False),
    }
    assert world.store.get_player(7).epoch == 0
    # the same batch again changes nothing, and writes no record
    records = len(audit_rows(store_url))
    r = app.post_json(BATCH, body, headers=headers)
    assert {x["status"] for x in r.json["results"]} == {"unchanged"}
    assert len(audit_rows(store_url)) == records
    assert token not in caplog.text and token not in r.text


def test_one_audit_record_per_batch_with_its_counts_and_the_body_digest(admin, world, store_url):
    app, make_token = admin.app, admin.bearer
    headers, _ = make_token("sync", ["players:write"])
    body = {
        "players": [{"user_id": n, "username": f"p{n}"} for n in range(1, 301)]
        + [{"user_id": 4242, "username": "alice2"}, {"user_id": 0, "username": "zero"}]
    }
    before = len(audit_rows(store_url))
    r = app.post_json(BATCH, body, headers=headers | {"X-Request-Id": "sync-2"})
    rows = audit_rows(store_url)[before:]
    assert len(rows) == 1
    actor, rid, action, user_id, changes = rows[0]
    assert (actor, rid, action, user_id) == (
        "api:sync",
        r.headers["X-Request-Id"],
        "player.batch",
        None,
    )
    # The store's owner, who reads the players' keys, can recompute the digest: the body with each
    # valid item's username sealed (HMAC-SHA256 under its player's key over "username\0NAME") and
    # the invalid one's left out (docs/admin.md, "Erasure").
    keys = dict(store_sql(store_url, "SELECT user_id, key FROM player_keys"))
    sealed = [
        {
            "user_id": p["user_id"],
            "username": {
                "hmac": hmac.new(
                    bytes.fromhex(keys[p["user_id"]]),
                    b"username\0" + p["username"].encode(),
                    hashlib.sha256,
                ).hexdigest()
            },
        }
        for p in body["players"][:-1]
    ] + [{"user_id": 0, "username": {"erased": True}}]
    digest = hashlib.sha256(canonical({"players": sealed}).encode("ascii")).hexdigest()
    assert json.loads(changes)["after"] == {
        "created": 300,
        "updated": 1,
        "unchanged": 0,
        "error": 1,
        "sealed_body_sha256": digest,
        "client_request_id": "sync-2",
    }


def test_a_dictionary_tried_against_the_batch_records_digest_finds_no_name(admin, world):
    """docs/admin.md, "Erasure": with only audit:read, hash each guess as the body could have been
    sent (its canonical JSON, the SHA-256 of it) and compare with every digest the record shows: the
    names are sealed under each player's key before the body is hashed, so no guess matches, before
    the deletion or after."""
    app = admin.app
    writer = admin.headers("sync", ["players:write"])
    reader = admin.headers("auditor", ["audit:read"])
    body = {
        "players": [
            {"user_id": 77, "username": "gwendolyn"},
            {"user_id": 78, "username": "zz top", "enabled": False},
            {"user_id": 0, "username": "invalid-item"},
        ]
    }
    assert app.post_json(BATCH, body, headers=writer).status_int == 200
    guesses = [
        f"{first}{suffix}"
        for first in ("gwen", "gwendolyn", "guinevere", "alice", "bob")
        for suffix in ("", "1", "_")
    ] + ["invalid-item"]

    def shown() -> list[str]:
        (record,) = app.get("/v1/audit", {"action": "player.batch"}, headers=reader).json["records"]
        after = record["changes"]["after"]
        return [v for v in after.values() if isinstance(v, str) and len(v) == 64]

    def tried(digests: list[str]) -> list[str]:
        hits = []
        for guess in guesses:
            for variant in (
                {"players": [{"user_id": 77, "username": guess}] + body["players"][1:]},
                {"players": body["players"][:2] + [{"user_id": 0, "username": guess}]},
            ):
                for text in (canonical(variant), json.dumps(variant)):
                    if hashlib.sha256(text.encode()).hexdigest() in digests:
                        hits.append(guess)
        return hits

    digests = shown()
    assert digests, "the record shows a digest of the body"
    assert tried(digests) == []
    players_ops.delete_player(world.store, Context(actor="cli:test"), 77)
    assert tried(shown()) == []


def test_a_batch_stamps_the_rows_it_writes_with_its_record_time_and_leaves_the_others(
    admin, world, store_url
):
    """updated_at (docs/admin-api.md, "Players"): a created or updated row gets the time of the
    batch's audit record; an unchanged one keeps its own, and a dry run stamps nothing."""
    app, make_token = admin.app, admin.bearer
    headers, _ = make_token("sync", ["players:write"])
    gus = factories.add_player(world.store, 7, "gus").updated_at_ms
    hal = factories.add_player(world.store, 8, "hal").updated_at_ms
    time.sleep(0.01)  # so the batch's stamp differs from the adds'
    body = {
        "players": [
            {"user_id": 1, "username": "ann"},
            {"user_id": 7, "username": "gus", "enabled": False},
            {"user_id": 8, "username": "hal"},
        ]
    }
    app.post_json(BATCH, body | {"dry_run": True}, headers=headers)
    assert world.store.get_player(1) is None and world.store.get_player(7).updated_at_ms == gus
    app.post_json(BATCH, body, headers=headers)
    (record,) = world.store.audit_records(action="player.batch")
    stamped = {n: world.store.get_player(n).updated_at_ms for n in (1, 7, 8)}
    assert stamped == {1: record.at_ms, 7: record.at_ms, 8: hal} and record.at_ms > hal
    got = app.get("/v1/players/7", headers=make_token("reader", ["players:read"])[0]).json
    assert got["updated_at"] == players_ops.updated_at(world.store.get_player(7))


def test_a_dry_run_answers_what_would_change_and_writes_nothing(admin, world, store_url):
    app, make_token = admin.app, admin.bearer
    headers, _ = make_token("sync", ["players:write"])
    before = len(audit_rows(store_url))
    body = {
        "players": [
            {"user_id": 1, "username": "ann"},
            {"user_id": 4242, "username": "alice9"},
            {"user_id": 4242 + 1, "username": " bad"},
        ],
        "dry_run": True,
    }
    r = app.post_json(BATCH, body, headers=headers)
    assert r.json["dry_run"] is True and "effective_by" not in r.json
    assert [x["status"] for x in r.json["results"]] == ["created", "updated", "error"]
    assert players(world.store) == {4242: ("alice", True)}
    assert len(audit_rows(store_url)) == before


def test_invalid_items_are_reported_by_field_and_the_valid_ones_written(admin, world):
    app, make_token = admin.app, admin.bearer
    headers, _ = make_token("sync", ["players:write"])
    body = {
        "players": [
            {"user_id": 1, "username": "ann"},
            {"user_id": "2", "username": "x"},
            {"user_id": 3, "username": "a\u202eb"},
            {"user_id": 4, "username": "d", "enabled": 1},
            "five",
            {"user_id": 1, "username": "again"},
            {"username": 6},
            {"user_id": 2**63, "username": "big"},
        ]
    }
    r = app.post_json(BATCH, body, headers=headers)
    assert r.status_int == 200
    results = r.json["results"]
    assert [x["status"] for x in results] == ["created"] + ["error"] * 7
    fields = [[e["field"] for e in x["error"]["errors"]] for x in results[1:]]
    assert fields == [
        ["/players/1/user_id"],
        ["/players/2/username"],
        ["/players/3/enabled"],
        ["/players/4"],
        ["/players/5/user_id"],
        ["/players/6/user_id", "/players/6/username"],
        ["/players/7/user_id"],
    ]
    assert [x["user_id"] for x in results] == [1, None, 3, 4, None, 1, None, None]
    for x in results[1:]:
        error = x["error"]
        assert error["type"] == "urn:authsvc:problem:validation" and error["status"] == 422
    assert "U+202E" in results[2]["error"]["detail"]  # the names rule, as the command words it
    assert "index 0" in results[5]["error"]["detail"]
    assert r.json["counts"] == {"created": 1, "updated": 0, "unchanged": 0, "error": 7}
    assert players(world.store) == {1: ("ann", True), 4242: ("alice", True)}


def test_the_bounds_over_1000_items_is_422_over_the_cap_413(admin, world, settings):
    app, make_token = admin.app, admin.bearer
    headers, _ = make_token("sync", ["players:write"])
    many = {"players": [{"user_id": n, "username": f"p{n}"} for n in range(1, 1002)]}
    body = problem(
        app.post_json(BATCH, many, headers=headers, expect_errors=True), 422, "validation"
    )
    assert body["errors"][0]["field"] == "/players"
    assert players(world.store) == {4242: ("alice", True)}
    for bad in (
        {"players": []},
        {},
        {"players": {"user_id": 1}},
        {"players": [{"user_id": 1, "username": "a"}], "dry_run": "yes"},
    ):
        problem(app.post_json(BATCH, bad, headers=headers, expect_errors=True), 422, "validation")
    # 1,000 players of the longest names are over the 16 KiB of other routes, and fit here
    full = {"players": [{"user_id": n, "username": f"{n:0>255}"} for n in range(1, 1001)]}
    assert len(json.dumps(full)) > settings.max_body_bytes
    assert app.post_json(BATCH, full, headers=headers).json["counts"]["created"] == 1000
    huge = {"players": [{"user_id": 1, "username": "x" * (5 << 20)}]}
    problem(app.post_json(BATCH, huge, headers=headers, expect_errors=True), 413, "too-large")
    problem(
        app.post_json(
            BATCH, many, headers=make_token("reader", ["players:read"])[0], expect_errors=True
        ),
        403,
        "forbidden",
    )


def test_a_retried_batch_replays_its_answer_without_a_second_change(admin, world, store_url):
    app, make_token = admin.app, admin.bearer
    headers, _ = make_token("sync", ["players:write"])
    keyed = headers | {"Idempotency-Key": "sync-0001"}
    body = {"players": [{"user_id": 1, "username": "ann"}, {"user_id": 2, "username": "ben"}]}
    first = app.post_json(BATCH, body, headers=keyed)
    records = len(audit_rows(store_url))
    app.post_json(
        BATCH, {"players": [{"user_id": 1, "username": "ann2"}]}, headers=headers
    )  # another writer
    again = app.post_json(BATCH, body, headers=keyed)
    assert again.headers["Idempotent-Replayed"] == "true" and again.json == first.json
    assert [x["status"] for x in again.json["results"]] == ["created", "created"]
    assert players(world.store)[1] == ("ann2", True)  # the replay wrote nothing
    assert len(audit_rows(store_url)) == records + 1
    other = {"players": [{"user_id": 3, "username": "cy"}]}
    problem(
        app.post_json(BATCH, other, headers=keyed, expect_errors=True),
        422,
        "idempotency-key-reused",
    )


# -- the rate limit ------------------------------------------------------------------------------


def test_over_its_rate_a_token_gets_429_with_retry_after_and_other_tokens_do_not(
    world, settings, caplog
):
    # One request per 1,000 s after a burst of 2: the third request is over, however slow the
    # machine.
    app = webtest.TestApp(
        AdminApp(dataclasses.replace(settings, admin_rate=0.001, admin_burst=2)), lint=True
    )
    try:
        _, token = api_tokens.add_api_token(
            world.store, Context(actor="cli:test"), "busy", ["players:read"]
        )
        _, calm = api_tokens.add_api_token(
            world.store, Context(actor="cli:test"), "calm", ["players:read"]
        )
        busy = {"Authorization": f"Bearer {token}"}
        assert app.get("/v1/players/4242", headers=busy).status_int == 200
        assert app.get("/v1/players/4242", headers=busy).status_int == 200
        r = app.get("/v1/players/4242", headers=busy, expect_errors=True)
        body = problem(r, 429, "too-many-requests")
        assert 1 <= int(r.headers["Retry-After"]) <= 1000
        assert "0.001" in body["detail"] and token not in r.text
        assert (
            app.get("/v1/players/4242", headers={"Authorization": f"Bearer {calm}"}).status_int
            == 200
        )
        assert token not in caplog.text and calm not in caplog.text
    finally:
        app.app.store.close()


def test_the_rate_setting_is_read_and_checked(env):
    settings = Settings.from_env(env | {"AUTHSVC_ADMIN_RATE": "2.5", "AUTHSVC_ADMIN_BURST": "7"})
    assert (settings.admin_rate, settings.admin_burst) == (2.5, 7)
    assert Settings.from_env(env).admin_rate > 0  # on by default
    from authsvc.errors import ConfigError

    for bad in ({"AUTHSVC_ADMIN_RATE": "-1"}, {"AUTHSVC_ADMIN_BURST": "0"}):
        with pytest.raises(ConfigError):
            Settings.from_env(env | bad)
