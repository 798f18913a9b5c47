"""The admin API (docs/admin-api.md) through WebTest, on both engines: caller authentication and
scopes, the players and tokens resources, RFC 9457 problems with real statuses, one error boundary.

Every answer is checked for the shape the docs promise; no token or key ever
comes back in an error or reaches the log or the audit trail.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time

import pytest
import webtest

from authsvc.api.app import AdminApp
from authsvc.errors import StoreUnavailable
from authsvc.operations import api_tokens
from authsvc.operations.context import Context
from authsvc.tokens import mint_token
from tests import factories
from tests.support import audit_rows, problem, store_sql

# -- who may call --------------------------------------------------------------------------------


def test_missing_unknown_malformed_expired_and_revoked_tokens_get_401(admin, world, caplog):
    app, make_token = admin.app, admin.headers
    live = make_token("live")
    expiring = make_token("expiring", expires_in=1)
    revoked = make_token("revoked")
    api_tokens.revoke_api_token(world.store, Context(actor="cli:test"), "revoked")
    assert app.get("/v1/players/4242", headers=live).status_int == 200
    time.sleep(1.1)  # the expiry is whole seconds: a bound, not a race
    for headers in (
        {},
        {"Authorization": "Bearer asv_" + "A" * 43},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": live["Authorization"] + "x"},
        expiring,
        revoked,
        {"Authorization": live["Authorization"].replace("Bearer ", "")},
    ):
        r = app.get("/v1/players/4242", headers=headers, expect_errors=True)
        problem(r, 401, "unauthorized")
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        for value in headers.values():
            assert value.split()[-1] not in r.text
    for value in (live, expiring, revoked):
        assert value["Authorization"].split()[1] not in caplog.text


def test_a_token_without_the_scope_gets_403(admin):
    app, make_token = admin.app, admin.headers
    reader = make_token("reader", ["players:read"])
    assert app.get("/v1/players/4242", headers=reader).status_int == 200
    body = problem(
        app.put_json("/v1/players/4242", {"username": "x"}, headers=reader, expect_errors=True),
        403,
        "forbidden",
    )
    assert "players:write" in body["detail"]
    problem(
        app.post_json(
            "/v1/tokens", {"game_id": 1, "user_id": 4242}, headers=reader, expect_errors=True
        ),
        403,
        "forbidden",
    )


# -- players -------------------------------------------------------------------------------------


def test_put_creates_then_updates_with_etag_and_if_match(admin, world, store_url):
    app, make_token = admin.app, admin.headers
    headers = make_token("web") | {"X-Request-Id": "signup-1"}
    r = app.put_json("/v1/players/7", {"username": "dora"}, headers=headers)
    assert r.status_int == 201 and r.json == {
        "user_id": 7,
        "username": "dora",
        "enabled": True,
        "epoch": 0,
        "updated_at": r.json["updated_at"],
    }
    first, added_by = r.headers["ETag"], r.headers["X-Request-Id"]
    r = app.put_json(
        "/v1/players/7", {"username": "dora"}, headers=headers
    )  # the same call again: no change
    assert r.status_int == 200 and r.headers["ETag"] == first
    r = app.put_json(
        "/v1/players/7",
        {"username": "dora2", "enabled": False},
        headers=headers | {"If-Match": first},
    )
    assert r.status_int == 200 and r.json["username"] == "dora2" and r.json["enabled"] is False
    second, changed_by = r.headers["ETag"], r.headers["X-Request-Id"]
    assert second != first
    # a second rename that read the first version loses, and says so
    r = app.put_json(
        "/v1/players/7",
        {"username": "eve"},
        headers=headers | {"If-Match": first},
        expect_errors=True,
    )
    problem(r, 412, "precondition-failed")
    r = app.put_json(
        "/v1/players/8", {"username": "x"}, headers=headers | {"If-Match": "*"}, expect_errors=True
    )
    problem(r, 412, "precondition-failed")  # If-Match on no player: nothing to match
    r = app.get("/v1/players/7", headers=headers)
    assert r.json["username"] == "dora2" and r.headers["ETag"] == second
    assert (
        len({added_by, changed_by, r.headers["X-Request-Id"]}) == 3
    )  # the service's id for each request
    rows = [row for row in audit_rows(store_url) if row[3] == 7]
    assert [(actor, rid, action) for actor, rid, action, _, _ in rows] == [
        ("api:web", added_by, "player.add"),
        ("api:web", changed_by, "player.rename"),
        ("api:web", changed_by, "player.disable"),
    ]
    assert {json.loads(changes)["after"]["client_request_id"] for *_, changes in rows} == {
        "signup-1"
    }


def stamps(store_url: str, user_id: int) -> list[tuple[str, str]]:
    """(action, at as RFC 3339 UTC with milliseconds) of the player's audit records, oldest
    first."""
    statement = f"SELECT action, at_ms FROM audit WHERE user_id = {user_id:d} ORDER BY id"
    if store_url.startswith("sqlite://"):
        with sqlite3.connect(store_url.removeprefix("sqlite://")) as conn:
            rows = conn.execute(statement).fetchall()
    else:
        import psycopg

        with psycopg.connect(store_url, autocommit=True) as conn:
            rows = conn.execute(statement).fetchall()
    return [
        (action, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z")
        for action, ms in rows
    ]


def test_updated_at_moves_with_each_change_and_not_with_a_put_that_changes_nothing(
    admin, world, store_url
):
    """updated_at is the time of the write that last changed the player (its audit record's), in
    RFC 3339 UTC; a PUT that changes nothing moves neither it nor the ETag; a revoke moves both; and
    a rename and its undoing give a new ETag, since the answer (its updated_at) is not the first
    one."""
    app, make_token = admin.app, admin.headers
    headers = make_token("web")
    created = app.put_json("/v1/players/7", {"username": "dora"}, headers=headers)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", created.json["updated_at"])
    assert stamps(store_url, 7) == [("player.add", created.json["updated_at"])]
    time.sleep(0.002)  # the next write's millisecond is a later one
    again = app.put_json("/v1/players/7", {"username": "dora"}, headers=headers)
    assert again.json == created.json and again.headers["ETag"] == created.headers["ETag"]
    assert app.get("/v1/players/7", headers=headers).json == created.json
    renamed = app.put_json("/v1/players/7", {"username": "dora2"}, headers=headers)
    assert stamps(store_url, 7)[-1] == ("player.rename", renamed.json["updated_at"])
    assert renamed.json["updated_at"] > created.json["updated_at"]
    time.sleep(0.002)
    app.post("/v1/players/7/revoke", headers=headers)
    revoked = app.get("/v1/players/7", headers=headers)
    assert stamps(store_url, 7)[-1] == ("player.revoke", revoked.json["updated_at"])
    assert revoked.json["updated_at"] > renamed.json["updated_at"]
    assert revoked.headers["ETag"] != renamed.headers["ETag"]
    time.sleep(0.002)
    back = app.put_json(
        "/v1/players/7",
        {"username": "dora"},
        headers=headers | {"If-Match": revoked.headers["ETag"]},
    )
    time.sleep(0.002)
    disabled = app.put_json(
        "/v1/players/7", {"username": "dora", "enabled": False}, headers=headers
    )
    time.sleep(0.002)
    enabled = app.put_json("/v1/players/7", {"username": "dora", "enabled": True}, headers=headers)
    assert stamps(store_url, 7)[-1] == ("player.enable", enabled.json["updated_at"])
    assert (
        (enabled.json | {"updated_at": None})
        == (back.json | {"updated_at": None})
        != (disabled.json | {"updated_at": None})
    )
    assert (
        enabled.json["updated_at"] > back.json["updated_at"]
        and enabled.headers["ETag"] != back.headers["ETag"]
    )


def test_a_player_unchanged_since_the_upgrade_has_updated_at_null_and_its_old_etag(
    admin, world, store_url
):
    """A row the schema step found (written before updated_at existed) answers null, and its ETag is
    the one the previous release gave, so an If-Match a client kept across the upgrade still
    matches."""
    import hashlib

    app, make_token = admin.app, admin.headers
    headers = make_token("web")
    # As the previous release left it: no updated_at.
    store_sql(
        store_url,
        "INSERT INTO players (user_id, username, epoch, enabled) VALUES (7, 'dora', 2, ?)",
        (True,),
    )
    r = app.get("/v1/players/7", headers=headers)
    assert r.json == {
        "user_id": 7,
        "username": "dora",
        "enabled": True,
        "epoch": 2,
        "updated_at": None,
    }
    old_etag = '"' + hashlib.sha256(b"7:dora:1:2").hexdigest()[:32] + '"'
    assert r.headers["ETag"] == old_etag
    r = app.put_json(
        "/v1/players/7", {"username": "dora"}, headers=headers | {"If-Match": old_etag}
    )
    assert r.json["updated_at"] is None and r.headers["ETag"] == old_etag  # nothing changed
    r = app.put_json(
        "/v1/players/7", {"username": "dora2"}, headers=headers | {"If-Match": old_etag}
    )
    assert stamps(store_url, 7) == [("player.rename", r.json["updated_at"])]


def test_get_and_revoke_an_unknown_player_are_404(admin):
    app, make_token = admin.app, admin.headers
    headers = make_token("web")
    problem(app.get("/v1/players/99", headers=headers, expect_errors=True), 404, "not-found")
    problem(
        app.post("/v1/players/99/revoke", headers=headers, expect_errors=True), 404, "not-found"
    )
    problem(app.get("/v1/players/0", headers=headers, expect_errors=True), 404, "not-found")
    problem(
        app.get("/v1/players/9223372036854775808", headers=headers, expect_errors=True),
        404,
        "not-found",
    )


def test_revoke_answers_the_new_epoch_and_when_it_takes_effect(admin, world, settings):
    app, make_token = admin.app, admin.headers
    headers = make_token("web")
    before = time.time()
    r = app.post("/v1/players/4242/revoke", headers=headers)
    assert r.status_int == 200
    assert r.json["user_id"] == 4242 and r.json["epoch"] == 1
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r.json["effective_by"])
    effective_by = (
        time.mktime(time.strptime(r.json["effective_by"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    )
    assert before - 1 <= effective_by - settings.max_staleness <= time.time()
    assert world.store.get_player(4242).epoch == 1


# -- tokens --------------------------------------------------------------------------------------


def test_mint_answers_the_current_token_and_404_for_what_is_not_enabled(
    admin, world, settings, store_url
):
    app, make_token = admin.app, admin.headers
    headers = make_token("web")
    r = app.post_json("/v1/tokens", {"game_id": world.game_id, "user_id": 4242}, headers=headers)
    token = mint_token(settings.token_secrets[0], world.game_id, 4242, 0)
    assert r.json == {
        "game_id": world.game_id,
        "user_id": 4242,
        "game_auth_token": token,
        "epoch": 0,
    }
    app.post("/v1/players/4242/revoke", headers=headers)
    r = app.post_json("/v1/tokens", {"game_id": world.game_id, "user_id": 4242}, headers=headers)
    assert r.json["epoch"] == 1 and r.json["game_auth_token"] == mint_token(
        settings.token_secrets[0], world.game_id, 4242, 1
    )
    for body in ({"game_id": 999, "user_id": 4242}, {"game_id": world.game_id, "user_id": 999}):
        r = app.post_json("/v1/tokens", body, headers=headers, expect_errors=True)
        assert "game_auth_token" not in problem(r, 404, "not-found")
    app.put_json("/v1/players/4242", {"username": "alice", "enabled": False}, headers=headers)
    problem(
        app.post_json(
            "/v1/tokens",
            {"game_id": world.game_id, "user_id": 4242},
            headers=headers,
            expect_errors=True,
        ),
        404,
        "not-found",
    )
    factories.set_game_enabled(world.store, world.game_id, False)
    app.put_json("/v1/players/4242", {"username": "alice"}, headers=headers)
    problem(
        app.post_json(
            "/v1/tokens",
            {"game_id": world.game_id, "user_id": 4242},
            headers=headers,
            expect_errors=True,
        ),
        404,
        "not-found",
    )
    minted = [row for row in audit_rows(store_url) if row[2] == "token.mint"]
    assert [row[0] for row in minted] == ["api:web", "api:web"]
    assert token not in repr(audit_rows(store_url))


# -- what the API refuses to read ------------------------------------------------------------------


def test_bad_requests_get_their_own_statuses(admin, settings):
    app, make_token = admin.app, admin.headers
    headers = make_token("web")
    body = problem(
        app.put_json("/v1/players/7", {"username": 5}, headers=headers, expect_errors=True),
        422,
        "validation",
    )
    assert body["errors"] == [{"field": "/username", "detail": "must be a string"}]
    body = problem(
        app.put_json("/v1/players/7", {}, headers=headers, expect_errors=True), 422, "validation"
    )
    assert body["errors"][0]["field"] == "/username"
    body = problem(
        app.put_json("/v1/players/7", {"username": " x"}, headers=headers, expect_errors=True),
        422,
        "validation",
    )
    assert "white space" in body["detail"]  # the names rule, as the command says it
    problem(
        app.put_json("/v1/players/7", [1], headers=headers, expect_errors=True), 422, "validation"
    )
    problem(
        app.put(
            "/v1/players/7",
            b"{",
            headers=headers | {"Content-Type": "application/json"},
            expect_errors=True,
        ),
        400,
        "bad-request",
    )
    problem(
        app.put(
            "/v1/players/7",
            b"\xff\xfe",
            headers=headers | {"Content-Type": "application/json"},
            expect_errors=True,
        ),
        400,
        "bad-request",
    )
    problem(
        app.put(
            "/v1/players/7",
            b"username=x",
            headers=headers | {"Content-Type": "application/x-www-form-urlencoded"},
            expect_errors=True,
        ),
        415,
        "unsupported-media-type",
    )
    big = {"username": "x" * settings.max_body_bytes}
    problem(
        app.put_json("/v1/players/7", big, headers=headers, expect_errors=True), 413, "too-large"
    )
    r = app.post("/v1/players/7", headers=headers, expect_errors=True)
    problem(r, 405, "method-not-allowed")
    assert r.headers["Allow"] == "DELETE, GET, PUT, HEAD"
    problem(app.get("/v1/nothing", headers=headers, expect_errors=True), 404, "not-found")
    r = app.get("/v1/players/4242", headers=headers | {"X-Request-Id": "not a logged shape"})
    assert re.fullmatch(r"[0-9a-f]{32}", r.headers["X-Request-Id"])
    head = app.head("/v1/players/4242", headers=headers)
    assert head.body == b"" and head.headers["Content-Length"] == r.headers["Content-Length"]
    problem(app.get("/api/authenticate.json", expect_errors=True), 404, "not-found")


def test_problem_titles_and_status_lines_use_the_reason_phrases_of_rfc_9110(admin, settings):
    """Python's http module before 3.13 still names 413 and 422 as RFC 7231 did ("Request Entity Too
    Large", "Unprocessable Entity"); the admin API says what RFC 9110 and docs/admin-api.md say."""
    app, headers = admin.app, admin.headers("web")
    r = app.put_json("/v1/players/7", {"username": 5}, headers=headers, expect_errors=True)
    assert r.status == "422 Unprocessable Content" and r.json["title"] == "Unprocessable Content"
    big = {"username": "x" * settings.max_body_bytes}
    r = app.put_json("/v1/players/7", big, headers=headers, expect_errors=True)
    assert r.status == "413 Content Too Large" and r.json["title"] == "Content Too Large"


class FailingStore:
    """A store whose every call fails as the error boundary's test needs (the real ones are tested
    above)."""

    def __init__(self, error: Exception):
        self.error = error

    def api_token_by_digest(self, token_digest: str):
        raise self.error

    def close(self):
        pass


@pytest.mark.engine("sqlite")
def test_a_store_outage_is_503_with_retry_after_and_anything_else_an_opaque_500(settings, caplog):
    headers = {"Authorization": "Bearer asv_" + "B" * 43, "X-Request-Id": "r-1"}
    app = webtest.TestApp(
        AdminApp(settings, store=FailingStore(StoreUnavailable("down"))), lint=True
    )
    r = app.get("/v1/players/1", headers=headers, expect_errors=True)
    problem(r, 503, "unavailable")
    assert r.headers["Retry-After"] == "2"
    app = webtest.TestApp(
        AdminApp(settings, store=FailingStore(ZeroDivisionError("boom"))), lint=True
    )
    r = app.get("/v1/players/1", headers=headers, expect_errors=True)
    body = problem(r, 500, "internal")
    assert "boom" not in r.text and "ZeroDivision" not in r.text
    assert (
        r.headers["X-Request-Id"] in caplog.text and "ZeroDivisionError" in caplog.text
    )  # what the answer hides
    assert "B" * 43 not in caplog.text
    assert json.dumps(body).isascii()


# -- games and the audit trail -------------------------------------------------------------------


def test_games_add_read_disable_and_rotate_with_the_key_shown_once(admin, world, store_url):
    app, make_token = admin.app, admin.headers
    headers = make_token("ops", ["games:read", "games:write"])
    r = app.post_json("/v1/games", {"name": "Go"}, headers=headers)
    assert r.status_int == 201 and r.json["name"] == "Go" and r.json["enabled"] is True
    game_id, api_key = r.json["game_id"], r.json["api_key"]
    r = app.get(f"/v1/games/{game_id}", headers=headers)
    assert "api_key" not in r.json and api_key not in r.text and len(r.json["keys"]) == 1
    problem(
        app.post_json("/v1/games", {"name": "Go"}, headers=headers, expect_errors=True),
        409,
        "conflict",
    )
    r = app.patch_json(f"/v1/games/{game_id}", {"enabled": False}, headers=headers)
    assert r.json["enabled"] is False
    r = app.post_json(f"/v1/games/{game_id}/keys", {"old_key_ttl": 60}, headers=headers)
    assert r.status_int == 201 and r.json["api_key"] != api_key
    assert r.json["old_keys_expire_at"] is not None
    problem(
        app.post_json(
            f"/v1/games/{game_id}/keys", {"old_key_ttl": -1}, headers=headers, expect_errors=True
        ),
        422,
        "validation",
    )
    problem(app.get("/v1/games/999", headers=headers, expect_errors=True), 404, "not-found")
    problem(
        app.patch_json("/v1/games/999", {"enabled": True}, headers=headers, expect_errors=True),
        404,
        "not-found",
    )
    trail = repr(audit_rows(store_url))
    assert api_key not in trail and r.json["api_key"] not in trail


def test_the_audit_trail_pages_newest_first_with_filters(admin, world):
    app, make_token = admin.app, admin.headers
    writer = make_token("web", ["players:write"])
    for user_id in range(1, 6):
        app.put_json(f"/v1/players/{user_id}", {"username": f"p{user_id}"}, headers=writer)
    reader = make_token("auditor", ["audit:read"])
    problem(app.get("/v1/audit", headers=writer, expect_errors=True), 403, "forbidden")
    r = app.get("/v1/audit?actor=api:web&limit=2", headers=reader)
    assert [rec["user_id"] for rec in r.json["records"]] == [5, 4] and r.json["next"] is not None
    r = app.get(f"/v1/audit?actor=api:web&limit=2&after={r.json['next']}", headers=reader)
    assert [rec["user_id"] for rec in r.json["records"]] == [3, 2]
    r = app.get(f"/v1/audit?actor=api:web&limit=2&after={r.json['next']}", headers=reader)
    assert [rec["user_id"] for rec in r.json["records"]] == [1] and r.json["next"] is None
    r = app.get("/v1/audit?player=3", headers=reader)
    assert [(rec["action"], rec["actor"]) for rec in r.json["records"]] == [
        ("player.add", "api:web")
    ]
    for query in ("limit=0", "limit=1001", "after=x", "colour=red", "player=-1"):
        problem(
            app.get(f"/v1/audit?{query}", headers=reader, expect_errors=True), 422, "validation"
        )


def test_an_audit_limit_out_of_range_names_the_range_limit_has(admin):
    """limit is 1 to 1000 (docs/admin-api.md, the OpenAPI document): its problem says so, whatever
    is wrong with it; the ids (after, player, game) keep their own range."""
    app, make_token = admin.app, admin.headers
    reader = make_token("auditor", ["audit:read"])
    for query in (
        "limit=0",
        "limit=1001",
        "limit=x",
        "limit=-1",
        "limit=01",
        "limit=9223372036854775808",
        "limit=" + "9" * 5000,
    ):
        body = problem(
            app.get(f"/v1/audit?{query}", headers=reader, expect_errors=True), 422, "validation"
        )
        assert body["detail"] == "limit: must be a whole number from 1 to 1000", query
    for name in ("after", "player", "game"):
        for value in (
            "0",
            "9223372036854775808",
            "9" * 5000,
        ):  # 5,000 digits: more than int() reads (it was a 500)
            body = problem(
                app.get(f"/v1/audit?{name}={value}", headers=reader, expect_errors=True),
                422,
                "validation",
            )
            assert body["detail"] == f"{name}: must be a whole number from 1 to 2^63-1", name


# -- Idempotency-Key -----------------------------------------------------------------------------


def test_a_retried_post_replays_the_first_answer_without_a_second_change(admin, world, store_url):
    app, make_token = admin.app, admin.headers
    headers = make_token("web") | {"Idempotency-Key": "revoke-4242-a"}
    first = app.post("/v1/players/4242/revoke", headers=headers)
    records = len(audit_rows(store_url))
    again = app.post("/v1/players/4242/revoke", headers=headers)
    assert again.json == first.json and again.status_int == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert world.store.get_player(4242).epoch == 1 and len(audit_rows(store_url)) == records
    # the same key for another request (path or body) is refused
    problem(
        app.post("/v1/players/7/revoke", headers=headers, expect_errors=True),
        422,
        "idempotency-key-reused",
    )
    problem(
        app.post_json(
            "/v1/tokens",
            {"game_id": world.game_id, "user_id": 4242},
            headers=headers,
            expect_errors=True,
        ),
        422,
        "idempotency-key-reused",
    )
    # another key, or another token's same key, runs afresh
    assert (
        app.post("/v1/players/4242/revoke", headers=headers | {"Idempotency-Key": "b"}).json[
            "epoch"
        ]
        == 2
    )
    other = make_token("other") | {"Idempotency-Key": "revoke-4242-a"}
    assert app.post("/v1/players/4242/revoke", headers=other).json["epoch"] == 3


def test_an_error_answer_is_replayed_too(admin, world, store_url):
    app, make_token = admin.app, admin.headers
    headers = make_token("web") | {"Idempotency-Key": "k"}
    problem(
        app.post("/v1/players/77/revoke", headers=headers, expect_errors=True), 404, "not-found"
    )
    app.put_json("/v1/players/77", {"username": "late"}, headers=make_token("w2"))
    r = app.post("/v1/players/77/revoke", headers=headers, expect_errors=True)
    problem(r, 404, "not-found")
    assert r.headers["Idempotent-Replayed"] == "true"
    problem(
        app.post(
            "/v1/players/7/revoke",
            headers=headers | {"Idempotency-Key": "x" * 256},
            expect_errors=True,
        ),
        422,
        "validation",
    )


def test_no_secret_is_kept_a_token_is_made_again_and_a_key_is_not_replayed(admin, world, store_url):
    app, make_token = admin.app, admin.headers
    headers = make_token("web") | {"Idempotency-Key": "mint-1"}
    minted = app.post_json(
        "/v1/tokens", {"game_id": world.game_id, "user_id": 4242}, headers=headers
    ).json
    app.post("/v1/players/4242/revoke", headers=make_token("w2"))  # the epoch moves on
    again = app.post_json(
        "/v1/tokens", {"game_id": world.game_id, "user_id": 4242}, headers=headers
    )
    assert again.json == minted  # the first answer: the token of the epoch it was minted for
    created = app.post_json(
        "/v1/games", {"name": "Go"}, headers=headers | {"Idempotency-Key": "game-1"}
    ).json
    r = app.post_json(
        "/v1/games",
        {"name": "Go"},
        headers=headers | {"Idempotency-Key": "game-1"},
        expect_errors=True,
    )
    body = problem(r, 409, "idempotency-secret-not-kept")
    assert body["game_id"] == created["game_id"] and created["api_key"] not in r.text
    rotated = app.post_json(
        f"/v1/games/{created['game_id']}/keys", {}, headers=headers | {"Idempotency-Key": "rot"}
    )
    kept = repr(sql_rows(store_url, "SELECT * FROM idempotency_keys"))
    for secret in (minted["game_auth_token"], created["api_key"], rotated.json["api_key"]):
        assert secret not in kept
    assert len([row for row in audit_rows(store_url) if row[2] == "token.mint"]) == 1


def sql_rows(store_url: str, statement: str) -> list[tuple]:
    if store_url.startswith("sqlite://"):
        with sqlite3.connect(store_url.removeprefix("sqlite://")) as conn:
            return conn.execute(statement).fetchall()
    import psycopg

    with psycopg.connect(store_url, autocommit=True) as conn:
        return conn.execute(statement).fetchall()


# -- concurrent writers --------------------------------------------------------------------------


def _together(calls) -> list:
    """Run each call in its own thread, released at once; their results in order."""
    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def run(i, call):
        barrier.wait()
        results[i] = call()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_two_concurrent_renames_from_one_version_one_wins_one_gets_412(admin, world, settings):
    """Each writer its own process-like app and store connection; whichever commits first wins."""
    app, make_token = admin.app, admin.headers
    headers = make_token("web")
    version = app.get("/v1/players/4242", headers=headers).headers["ETag"]
    apps = [AdminApp(settings) for _ in range(2)]
    try:
        for round_ in range(5):
            clients = [webtest.TestApp(a) for a in apps]
            names = (
                f"bob{round_}",
                f"carol{round_}",
            )  # both differ from the current name: both are changes
            statuses = _together(
                [
                    lambda c=c, name=name, h=headers | {"If-Match": version}: (
                        c.put_json(
                            "/v1/players/4242", {"username": name}, headers=h, expect_errors=True
                        ).status_int
                    )
                    for c, name in zip(clients, names, strict=True)
                ]
            )
            assert sorted(statuses) == [200, 412]
            player = app.get("/v1/players/4242", headers=headers)
            assert player.json["username"] in names
            version = player.headers["ETag"]
    finally:
        for a in apps:
            a.store.close()


def test_two_concurrent_posts_with_one_key_change_once(admin, world, settings, store_url):
    make_token = admin.headers
    headers = make_token("web")
    apps = [AdminApp(settings) for _ in range(2)]
    try:
        for round_ in range(5):
            clients = [webtest.TestApp(a) for a in apps]
            key = headers | {"Idempotency-Key": f"pw-change-{round_}"}
            statuses = _together(
                [
                    lambda c=c, h=key: (
                        c.post("/v1/players/4242/revoke", headers=h, expect_errors=True).status_int
                    )
                    for c in clients
                ]
            )
            assert sorted(statuses) in ([200, 200], [200, 409])
            assert world.store.get_player(4242).epoch == round_ + 1
    finally:
        for a in apps:
            a.store.close()
    assert len([row for row in audit_rows(store_url) if row[2] == "player.revoke"]) == 5


# -- hostile input: never a 500 ------------------------------------------------------------------

HOSTILE = [
    (
        "PUT",
        "/v1/players/7",
        b"[" * 20000,
        "application/json",
    ),  # nesting deeper than the parser goes
    ("PUT", "/v1/players/7", b'{"username": "\\ud800"}', "application/json"),  # a lone surrogate
    ("PUT", "/v1/players/7", b'{"username": "a", "enabled": 1}', "application/json"),
    ("PUT", "/v1/players/7", b'{"username": NaN}', "application/json"),
    (
        "PUT",
        "/v1/players/7",
        b'\xef\xbb\xbf{"username": "a"}',
        "application/json",
    ),  # a byte-order mark
    ("POST", "/v1/tokens", b'{"game_id": 1e400, "user_id": 1}', "application/json"),
    (
        "POST",
        "/v1/tokens",
        b'{"game_id": 100000000000000000000000, "user_id": 1}',
        "application/json",
    ),
    ("POST", "/v1/tokens", b'{"game_id": true, "user_id": 1}', "application/json"),
    ("POST", "/v1/games", b'{"name": "\\u202egame"}', "application/json"),
    ("POST", "/v1/games/1/keys", b'{"old_key_ttl": 99999999999999999999}', "application/json"),
    ("PATCH", "/v1/games/1", b'{"enabled": "no"}', "application/json; charset=utf-8"),
    ("GET", "/v1/audit?actor=%ff", b"", ""),
    ("GET", "/v1/players/%31", b"", ""),
    ("GET", "/v1/players/%C3%A9", b"", ""),
    ("GET", "/v1/players/00042", b"", ""),
]


@pytest.mark.parametrize(("method", "path", "body", "content_type"), HOSTILE)
def test_hostile_input_gets_a_problem_never_a_500(admin, method, path, body, content_type):
    app, make_token = admin.app, admin.headers
    headers = make_token("web")
    if content_type:
        headers["Content-Type"] = content_type
    path, _, query = path.partition("?")
    r = app.request(
        path + ("?" + query if query else ""),
        method=method,
        body=body,
        headers=headers,
        expect_errors=True,
    )
    assert 400 <= r.status_int < 500, r.text
    assert r.headers["Content-Type"] == "application/problem+json"
    assert r.json["status"] == r.status_int


def test_a_whole_number_written_with_a_fraction_or_exponent_is_that_number(admin, world, settings):
    """JSON has one number type and JSON Schema (the OpenAPI document) counts 7.0 and 7e0 as the
    integer 7: they are read exactly (9007199254740993.0 is not rounded to a float's ...992), and
    anything that is not a whole number, or is too large, is 422, at once."""
    app, make_token = admin.app, admin.headers
    headers = make_token("web") | {"Content-Type": "application/json"}
    body = f'{{"game_id": {world.game_id}.0, "user_id": 4242e0}}'.encode()
    r = app.post("/v1/tokens", body, headers=headers)
    assert r.json["game_id"] == world.game_id and r.json["user_id"] == 4242
    assert r.json["game_auth_token"] == mint_token(
        settings.token_secrets[0], world.game_id, 4242, 0
    )
    app.put("/v1/players/9007199254740993", b'{"username": "big"}', headers=headers)
    r = app.post(
        "/v1/tokens",
        f'{{"game_id": {world.game_id}, "user_id": 9007199254740993.0}}'.encode(),
        headers=headers,
    )
    assert r.json["user_id"] == 9007199254740993
    r = app.post(f"/v1/games/{world.game_id}/keys", b'{"old_key_ttl": 6.0e1}', headers=headers)
    assert r.status_int == 201
    for number in (
        "1.5",
        "1e999999999",
        "-0.0",
        "9223372036854775808.0",
        "NaN",
        "Infinity",
        "1e-999999999",
    ):
        r = app.post(
            "/v1/tokens",
            f'{{"game_id": {number}, "user_id": 4242}}'.encode(),
            headers=headers,
            expect_errors=True,
        )
        assert problem(r, 422, "validation")["errors"][0]["field"] == "/game_id", number


def test_a_nul_in_an_audit_filter_is_422_on_both_engines(admin):
    """PostgreSQL's text cannot hold a NUL: the filter reached the query and failed there (a 500).
    No actor or action holds one, so it is refused first, alike on both engines."""
    app, make_token = admin.app, admin.headers
    headers = make_token("auditor", ["audit:read"])
    for query, name in (("actor=api%3Aweb%00", "actor"), ("action=%00", "action")):
        body = problem(
            app.get(f"/v1/audit?{query}", headers=headers, expect_errors=True), 422, "validation"
        )
        assert body["errors"] == [{"field": name, "detail": "must not contain a NUL character"}]
