"""The admin API's HTTP edges through WebTest, on both engines (docs/admin-api.md): conditional PUTs
as RFC 9110 has them (If-Match compares strongly).

Each test reproduces a finding made from outside against the release before: a weak ETag
accepted by If-Match.
"""

from __future__ import annotations

import json

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
