"""The admin API's HTTP edges through WebTest, on both engines (docs/admin-api.md): conditional PUTs
as RFC 9110 has them (If-Match compares strongly, If-None-Match: * for a create-only signup),
the shape of a body (how deep, how many values), and whose request id the audit trail records.

Each test reproduces a finding made from outside against the release before: a weak ETag
accepted by If-Match, If-None-Match ignored (a signup on a taken id renamed that player), a
body nested ~945 deep answered 500, a dry-run batch of a million tiny values cost a worker a
second, a client's X-Request-Id recorded as the request's id (two writes by different tokens
shared one).
"""

from __future__ import annotations

import json
import re

import pytest

from authsvc.operations import players as players_ops
from authsvc.operations.context import Context, admin_store
from tests.support import problem, store_sql


@pytest.fixture
def admin(admin):
    """tests/conftest.py's, with no rate limit (a sweep sends hundreds)."""
    admin.api.rate_limit.rate = 0
    return admin


def records(store_url: str, user_id: int) -> list[tuple]:
    """(actor, request_id, action, changes) of the player's audit records, oldest first."""
    rows = store_sql(
        store_url,
        "SELECT actor, request_id, action, changes FROM audit WHERE user_id = ? ORDER BY id",
        (user_id,),
    )
    return [(actor, rid, action, json.loads(changes)) for actor, rid, action, changes in rows]


# -- If-Match: the strong comparison --------------------------------------------------------------


def test_if_match_compares_strongly_a_weak_tag_never_matches(admin, world, store_url):
    app, make_token = admin.app, admin.headers
    headers = make_token("web")
    tag = app.get("/v1/players/4242", headers=headers).headers["ETag"]
    for sent in ("W/" + tag, f'"0", W/{tag}'):
        r = app.put_json(
            "/v1/players/4242",
            {"username": "mallory"},
            headers=headers | {"If-Match": sent},
            expect_errors=True,
        )
        assert problem(r, 412, "precondition-failed")["detail"] == (
            "player 4242 is not at the version If-Match names"
        ), sent
    r = app.put_json(
        "/v1/players/4242",
        {"username": "mallory"},
        headers=headers | {"If-Match": tag.strip('"')},
        expect_errors=True,
    )  # the ETag without its quotes
    assert problem(r, 412, "precondition-failed")["detail"] == (
        'If-Match is neither * nor a list of quoted entity tags ("...", W/"...")'
    )
    assert app.get("/v1/players/4242", headers=headers).json["username"] == "alice"
    r = app.put_json(
        "/v1/players/4242", {"username": "alicia"}, headers=headers | {"If-Match": f'"0", {tag}'}
    )
    assert r.status_int == 200 and r.json["username"] == "alicia"
    assert [action for _, _, action, _ in records(store_url, 4242)] == [
        "player.add",
        "player.rename",
    ]  # the world's, ours


def test_conditions_are_read_as_rfc_9110_writes_them():
    from authsvc.operations.conditions import Condition, condition

    assert condition("If-Match", None) is None
    assert condition("If-Match", " * ") == Condition("If-Match", (), any=True)
    assert condition("If-Match", '"a", W/"b" ,"c"') == Condition(
        "If-Match", ('"a"', 'W/"b"', '"c"')
    )
    assert condition("If-Match", ', "a,b",,').tags == (
        '"a,b"',
    )  # empty list elements are ignored (RFC 9110 5.6.1)
    for bad in ("abc", '"a" "b"', '*, "a"', "", ",", 'W/ "a"', 'w/"a"', '"a"b', '"a b"'):
        assert condition("If-None-Match", bad) == Condition("If-None-Match", None), (
            bad
        )  # unreadable: 412


# -- If-None-Match: * (the create-only signup) --------------------------------------------------


def test_if_none_match_star_creates_the_player_or_answers_412_and_changes_nothing(
    admin, world, store_url
):
    app, make_token = admin.app, admin.headers
    headers = make_token("web") | {"If-None-Match": "*"}
    r = app.put_json("/v1/players/7", {"username": "dora"}, headers=headers)
    assert r.status_int == 201 and r.json["username"] == "dora"
    tag = r.headers["ETag"]
    for user_id, name in ((7, "mallory"), (4242, "mallory")):  # just made, and one made long ago
        r = app.put_json(
            f"/v1/players/{user_id}", {"username": name}, headers=headers, expect_errors=True
        )
        assert (
            problem(r, 412, "precondition-failed")["detail"]
            == f"player {user_id} exists (If-None-Match: *)"
        )
    assert app.get("/v1/players/7", headers=headers).json["username"] == "dora"
    assert app.get("/v1/players/4242", headers=headers).json["username"] == "alice"
    assert [action for _, _, action, _ in records(store_url, 7)] == ["player.add"]
    assert [action for _, _, action, _ in records(store_url, 4242)] == [
        "player.add"
    ]  # the world's own
    # A list of tags: 412 if one names the current version (the weak comparison, as RFC 9110 has it
    # here)
    for sent in (tag, "W/" + tag, f'"0", {tag}'):
        r = app.put_json(
            "/v1/players/7",
            {"username": "eve"},
            headers=headers | {"If-None-Match": sent},
            expect_errors=True,
        )
        assert (
            problem(r, 412, "precondition-failed")["detail"]
            == "player 7 is at a version If-None-Match names"
        )
    r = app.put_json(
        "/v1/players/7", {"username": "eve"}, headers=headers | {"If-None-Match": '"0"'}
    )
    assert r.status_int == 200 and r.json["username"] == "eve"
    r = app.put_json(
        "/v1/players/8",
        {"username": "x"},
        headers=headers | {"If-None-Match": "nope"},
        expect_errors=True,
    )
    assert problem(r, 412, "precondition-failed")["detail"] == (
        'If-None-Match is neither * nor a list of quoted entity tags ("...", W/"...")'
    )
    assert app.get("/v1/players/8", headers=headers, expect_errors=True).status_int == 404


@pytest.mark.engine("postgresql")
def test_two_create_only_signups_of_one_id_at_once_one_201_one_412(world, settings):
    """The check and the insert are one transaction: of two signups of one new id with
    If-None-Match: * at the same moment (two platform accounts given one id), one creates it, the
    other gets 412 and never renames it; 20 such pairs."""
    import threading

    from authsvc.errors import PreconditionFailed
    from authsvc.operations.conditions import condition

    stores = [admin_store(settings).__enter__() for _ in range(2)]
    results: list = []
    try:
        for user_id in range(5000, 5020):
            gate = threading.Barrier(2)

            def signup(store, name, user_id=user_id, gate=gate):
                gate.wait(5)
                try:
                    players_ops.put_player(
                        store,
                        Context(actor="api:web"),
                        user_id,
                        name,
                        if_none_match=condition("If-None-Match", "*"),
                    )
                    results.append("created")
                except PreconditionFailed:
                    results.append("412")

            pair = [
                threading.Thread(target=signup, args=(s, f"p{i}")) for i, s in enumerate(stores)
            ]
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


# -- a body nested too deep ----------------------------------------------------------------------


def test_a_body_nested_too_deep_is_400_never_500(admin):
    """The body is hashed (Idempotency-Key, a batch's sealed_body_sha256) by a recursive encoder:
    nested a little less deep than the interpreter's recursion limit (~985 under gunicorn), it was
    read and then failed there, a 500. The reader refuses any body nested deeper than 32, whatever
    the route; the depths swept cover that window wherever the caller's stack stands."""
    app, make_token = admin.app, admin.headers
    headers = make_token("web") | {"Content-Type": "application/json"}
    failures = {}
    for depth in (33, 100, *range(900, 1000)):
        junk = "[" * depth + "]" * depth
        bodies = {
            "/v1/players/batch": (
                f'{{"players": [{{"user_id": 8, "username": "x"}}], "junk": {junk}}}'
            ),
            "/v1/tokens": f'{{"game_id": 1, "user_id": 4242, "junk": {junk}}}',
        }
        for path, body in bodies.items():
            if len(body) > 16384 and path == "/v1/tokens":
                continue  # over the route's body cap: 413 first
            for key in ({"Idempotency-Key": f"deep-{depth}-{path}"}, {}):
                r = app.post(path, body.encode(), headers=headers | key, expect_errors=True)
                detail = r.json.get("detail") if r.status_int >= 400 else None
                if (r.status_int, detail) != (400, "the body is nested deeper than 32"):
                    failures.setdefault(f"{r.status_int} {detail}", []).append(
                        f"{path} {depth}{' key' * bool(key)}"
                    )
    assert not failures, "; ".join(
        f"{len(where)} x {answer[:60]} ({', '.join(where[:2])})"
        for answer, where in failures.items()
    )


def test_a_body_32_deep_is_read(admin):
    app, make_token = admin.app, admin.headers
    headers = make_token("web") | {"Content-Type": "application/json"}
    junk = "[" * 31 + "]" * 31  # in the body's object: 32 deep
    r = app.put(
        "/v1/players/7", f'{{"username": "dora", "junk": {junk}}}'.encode(), headers=headers
    )
    assert r.status_int == 201


def test_a_body_of_more_values_than_the_reader_takes_is_413(admin, world):
    """A dry-run batch padded with a million tiny values (within the 4 MiB cap) cost a worker about
    a second to parse and hash; the reader counts the values first, on the raw bytes: 413 above
    20,000."""
    app, make_token = admin.app, admin.headers
    headers = make_token("web") | {"Content-Type": "application/json"}
    players = [{"user_id": 10 + n, "username": f"p{n}"} for n in range(1000)]
    padded = {
        "floats": ",".join(["1.5"] * 900_000),
        "empty arrays": ",".join(["[]"] * 1_000_000),
        "strings": ",".join(['""'] * 1_000_000),
    }
    for what, junk in padded.items():
        body = json.dumps({"players": players, "dry_run": True})[:-1] + f', "junk": [{junk}]}}'
        assert len(body) <= 4 << 20
        r = app.post("/v1/players/batch", body.encode(), headers=headers, expect_errors=True)
        assert (
            problem(r, 413, "too-large")["detail"] == "a body here holds at most 20,000 JSON values"
        ), what
    # 1,000 players of 19 fields each is 20,000 values, read; commas and brackets inside strings do
    # not count
    wide = [p | {f"f{k}": 0 for k in range(16)} for p in players]
    wide[0]["username"] = 'a,[{"\\' * 30
    body = json.dumps({"players": wide, "dry_run": True})
    r = app.post("/v1/players/batch", body.encode(), headers=headers)
    assert r.json["counts"] == {"created": 1000, "updated": 0, "unchanged": 0, "error": 0}


def test_the_shape_is_counted_without_what_strings_hold():
    from authsvc.api.body import check_shape
    from authsvc.errors import BadRequest, PayloadTooLarge

    check_shape(
        b'{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", "b": "\\\\", '
        b'"c": "\\"["}'
    )
    check_shape(b'["' + b"," * 100_000 + b'"]')  # one string of commas: two values
    with pytest.raises(BadRequest, match="^the body is nested deeper than 32$"):
        check_shape(
            b'{"a": "\\\\"' + b"[" * 32 + b"]" * 32 + b"}"
        )  # the string ends before the brackets
    with pytest.raises(BadRequest, match="^the body is not valid UTF-8 JSON$"):
        check_shape(b"[" + b"]" * 100_000)  # no JSON, and no walk over all of it
    with pytest.raises(PayloadTooLarge):
        check_shape(b"[" + b'"",' * 40_001 + b'""]')


# -- the audit trail's request id ---------------------------------------------------------------


def test_the_audit_record_holds_the_servers_request_id_and_the_clients_beside_it(
    admin, world, store_url
):
    """Two writes by two tokens, both sent with X-Request-Id: shared-1: each record holds the id the
    server made for its request (the answer's X-Request-Id), never the client's; the client's, in
    the logged shape only, is kept as changes.after.client_request_id."""
    app, make_token = admin.app, admin.headers
    web, other = make_token("web"), make_token("other")
    answers = [
        app.put_json(
            f"/v1/players/{user_id}",
            {"username": f"p{user_id}"},
            headers=headers | {"X-Request-Id": "shared-1"},
        )
        for user_id, headers in ((9, web), (10, other))
    ]
    ids = [r.headers["X-Request-Id"] for r in answers]
    assert all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in ids) and ids[0] != ids[1], ids
    for user_id, rid, actor in ((9, ids[0], "api:web"), (10, ids[1], "api:other")):
        [(got_actor, got_rid, action, changes)] = records(store_url, user_id)
        assert (got_actor, got_rid, action) == (actor, rid, "player.add")
        assert changes["after"]["client_request_id"] == "shared-1"
    r = app.put_json(
        "/v1/players/11",
        {"username": "p11"},
        headers=web | {"X-Request-Id": "not the logged shape"},
    )
    [(_, rid, _, changes)] = records(store_url, 11)
    assert rid == r.headers["X-Request-Id"] and "client_request_id" not in changes["after"]
    r = app.put_json("/v1/players/12", {"username": "p12"}, headers=web)
    [(_, rid, _, changes)] = records(store_url, 12)
    assert rid == r.headers["X-Request-Id"] and "client_request_id" not in changes["after"]
