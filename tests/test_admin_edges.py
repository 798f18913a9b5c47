"""The admin API's HTTP edges through WebTest, on both engines (docs/admin-api.md): conditional PUTs
as RFC 9110 has them (If-Match compares strongly, If-None-Match: * for a create-only signup),
and whose request id the audit trail records.

Each test reproduces a finding made from outside against the release before: a weak ETag
accepted by If-Match, If-None-Match ignored (a signup on a taken id renamed that player), a
client's X-Request-Id recorded as the request's id (two writes by different tokens shared one).
"""

from __future__ import annotations

import json
import re

import pytest
import webtest

from authsvc.admin import operations as ops
from authsvc.admin.api import AdminApp
from tests.support import problem, store_sql

ALL = ["players:read", "players:write", "tokens:mint", "games:read", "games:write", "audit:read"]


@pytest.fixture
def admin(world, settings):
    """(WebTest app, make_token(name) -> headers) on the world's store; no rate limit (a sweep sends hundreds)."""
    app = AdminApp(settings)
    app.rate_limit.rate = 0

    def make_token(name: str) -> dict:
        _, token = ops.add_api_token(world.store, ops.Context(actor="cli:test"), name, ALL)
        return {"Authorization": f"Bearer {token}"}

    yield webtest.TestApp(app, lint=True), make_token
    app.store.close()


def records(store_url: str, user_id: int) -> list[tuple]:
    """(actor, request_id, action, changes) of the player's audit records, oldest first."""
    rows = store_sql(store_url, "SELECT actor, request_id, action, changes FROM audit WHERE user_id = ? ORDER BY id",
                     (user_id,))
    return [(actor, rid, action, json.loads(changes)) for actor, rid, action, changes in rows]


# -- If-Match: the strong comparison --------------------------------------------------------------


def test_if_match_compares_strongly_a_weak_tag_never_matches(admin, world, store_url):
    app, make_token = admin
    headers = make_token("web")
    tag = app.get("/v1/players/4242", headers=headers).headers["ETag"]
    for sent in ("W/" + tag, f'"0", W/{tag}'):
        r = app.put_json("/v1/players/4242", {"username": "mallory"}, headers=headers | {"If-Match": sent},
                         expect_errors=True)
        assert problem(r, 412, "precondition-failed")["detail"] == (
            "player 4242 is not at the version If-Match names"), sent
    r = app.put_json("/v1/players/4242", {"username": "mallory"}, headers=headers | {"If-Match": tag.strip('"')},
                     expect_errors=True)  # the ETag without its quotes
    assert problem(r, 412, "precondition-failed")["detail"] == (
        'If-Match is neither * nor a list of quoted entity tags ("...", W/"...")')
    assert app.get("/v1/players/4242", headers=headers).json["username"] == "alice"
    r = app.put_json("/v1/players/4242", {"username": "alicia"}, headers=headers | {"If-Match": f'"0", {tag}'})
    assert r.status_int == 200 and r.json["username"] == "alicia"
    assert [action for _, _, action, _ in records(store_url, 4242)] == ["player.add", "player.rename"]  # the world's, ours


def test_conditions_are_read_as_rfc_9110_writes_them():
    from authsvc.admin.put_player import Condition, condition

    assert condition("If-Match", None) is None
    assert condition("If-Match", " * ") == Condition("If-Match", (), any=True)
    assert condition("If-Match", '"a", W/"b" ,"c"') == Condition("If-Match", ('"a"', 'W/"b"', '"c"'))
    assert condition("If-Match", ', "a,b",,').tags == ('"a,b"',)  # empty list elements are ignored (RFC 9110 5.6.1)
    for bad in ("abc", '"a" "b"', '*, "a"', "", ",", 'W/ "a"', 'w/"a"', '"a"b', '"a b"'):
        assert condition("If-None-Match", bad) == Condition("If-None-Match", None), bad  # unreadable: 412


# -- If-None-Match: * (the create-only signup) --------------------------------------------------


def test_if_none_match_star_creates_the_player_or_answers_412_and_changes_nothing(admin, world, store_url):
    app, make_token = admin
    headers = make_token("web") | {"If-None-Match": "*"}
    r = app.put_json("/v1/players/7", {"username": "dora"}, headers=headers)
    assert r.status_int == 201 and r.json["username"] == "dora"
    tag = r.headers["ETag"]
    for user_id, name in ((7, "mallory"), (4242, "mallory")):  # just made, and one made long ago
        r = app.put_json(f"/v1/players/{user_id}", {"username": name}, headers=headers, expect_errors=True)
        assert problem(r, 412, "precondition-failed")["detail"] == f"player {user_id} exists (If-None-Match: *)"
    assert app.get("/v1/players/7", headers=headers).json["username"] == "dora"
    assert app.get("/v1/players/4242", headers=headers).json["username"] == "alice"
    assert [action for _, _, action, _ in records(store_url, 7)] == ["player.add"]
    assert [action for _, _, action, _ in records(store_url, 4242)] == ["player.add"]  # the world's own
    # A list of tags: 412 if one names the current version (the weak comparison, as RFC 9110 has it here)
    for sent in (tag, "W/" + tag, f'"0", {tag}'):
        r = app.put_json("/v1/players/7", {"username": "eve"}, headers=headers | {"If-None-Match": sent},
                         expect_errors=True)
        assert problem(r, 412, "precondition-failed")["detail"] == "player 7 is at a version If-None-Match names"
    r = app.put_json("/v1/players/7", {"username": "eve"}, headers=headers | {"If-None-Match": '"0"'})
    assert r.status_int == 200 and r.json["username"] == "eve"
    r = app.put_json("/v1/players/8", {"username": "x"}, headers=headers | {"If-None-Match": "nope"},
                     expect_errors=True)
    assert problem(r, 412, "precondition-failed")["detail"] == (
        'If-None-Match is neither * nor a list of quoted entity tags ("...", W/"...")')
    assert app.get("/v1/players/8", headers=headers, expect_errors=True).status_int == 404


@pytest.mark.engine("postgresql")
def test_two_create_only_signups_of_one_id_at_once_one_201_one_412(world, settings):
    """The check and the insert are one transaction: of two signups of one new id with If-None-Match: *
    at the same moment (two platform accounts given one id), one creates it, the other gets 412 and
    never renames it; 20 such pairs."""
    import threading

    from authsvc.admin.put_player import condition
    from authsvc.errors import PreconditionFailed

    stores = [ops.admin_store(settings).__enter__() for _ in range(2)]
    results: list = []
    try:
        for user_id in range(5000, 5020):
            gate = threading.Barrier(2)

            def signup(store, name, user_id=user_id, gate=gate):
                gate.wait(5)
                try:
                    ops.put_player(store, ops.Context(actor="api:web"), user_id, name,
                                   if_none_match=condition("If-None-Match", "*"))
                    results.append("created")
                except PreconditionFailed:
                    results.append("412")

            pair = [threading.Thread(target=signup, args=(s, f"p{i}")) for i, s in enumerate(stores)]
            for t in pair:
                t.start()
            for t in pair:
                t.join(10)
        names = {stores[0].get_player(user_id).username for user_id in range(5000, 5020)}
    finally:
        for store in stores:
            store.close()
    assert sorted(results) == ["412"] * 20 + ["created"] * 20
    assert names <= {"p0", "p1"}


# -- the audit trail's request id ---------------------------------------------------------------


def test_the_audit_record_holds_the_servers_request_id_and_the_clients_beside_it(admin, world, store_url):
    """Two writes by two tokens, both sent with X-Request-Id: shared-1: each record holds the id the
    server made for its request (the answer's X-Request-Id), never the client's; the client's, in the
    logged shape only, is kept as changes.after.client_request_id."""
    app, make_token = admin
    web, other = make_token("web"), make_token("other")
    answers = [app.put_json(f"/v1/players/{user_id}", {"username": f"p{user_id}"},
                            headers=headers | {"X-Request-Id": "shared-1"})
               for user_id, headers in ((9, web), (10, other))]
    ids = [r.headers["X-Request-Id"] for r in answers]
    assert all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in ids) and ids[0] != ids[1], ids
    for user_id, rid, actor in ((9, ids[0], "api:web"), (10, ids[1], "api:other")):
        [(got_actor, got_rid, action, changes)] = records(store_url, user_id)
        assert (got_actor, got_rid, action) == (actor, rid, "player.add")
        assert changes["after"]["client_request_id"] == "shared-1"
    r = app.put_json("/v1/players/11", {"username": "p11"}, headers=web | {"X-Request-Id": "not the logged shape"})
    [(_, rid, _, changes)] = records(store_url, 11)
    assert rid == r.headers["X-Request-Id"] and "client_request_id" not in changes["after"]
    r = app.put_json("/v1/players/12", {"username": "p12"}, headers=web)
    [(_, rid, _, changes)] = records(store_url, 12)
    assert rid == r.headers["X-Request-Id"] and "client_request_id" not in changes["after"]
