"""Functional tests of /api/authenticate.json through WebTest (WSGI lint on).

One test per row of the table in docs/api.md's "Answers" and per rule of its "Parameters" and
"The rules, in order".
"""

from __future__ import annotations

import json
import time

import pytest
import webtest

from authsvc.tokens import api_key_digest, mint_token, new_api_key
from tests import factories
from tests.support import ERROR_KEYS, INVALID, MISSING, PATH, assert_contract_headers, make_testapp

SUCCESS_KEYS = {"success", "user_id", "username"}


def ok(world, username=None):
    return {"success": True, "user_id": world.user_id, "username": username or world.username}


# -- docs/api.md, "Answers": the table of answers ------------------------------------------


def test_valid_credentials_return_the_player_and_no_error_fields(app, world):
    r = app.get(PATH, world.params())
    assert r.status_int == 200
    assert r.json == ok(world)
    assert set(r.json) == SUCCESS_KEYS
    assert r.body == b'{"success":true,"user_id":4242,"username":"alice"}'
    assert_contract_headers(r)


@pytest.mark.parametrize("field", ["user_id", "game_auth_token", "api_key"])
def test_each_parameter_wrong_is_invalid_credentials(app, world, field):
    wrong = {"user_id": "4243", "game_auth_token": "0" * 64, "api_key": new_api_key()}[field]
    r = app.get(PATH, world.params(**{field: wrong}))
    assert r.status_int == 200
    assert r.json == INVALID
    assert set(r.json) == ERROR_KEYS
    assert_contract_headers(r)


@pytest.mark.parametrize("field", ["user_id", "game_auth_token", "api_key"])
def test_each_parameter_missing_is_400(app, world, field):
    params = world.params()
    del params[field]
    r = app.get(PATH, params)
    assert r.status_int == 200
    assert r.json == MISSING
    assert_contract_headers(r)


def test_no_parameters_at_all_is_400(app):
    assert app.get(PATH).json == MISSING


def test_missing_wins_over_incorrect(app, world):
    """Rule 1 before rule 2 (docs/api.md): a missing parameter is reported even if another one is
    wrong."""
    assert app.get(PATH, {"user_id": "07", "api_key": "nope"}).json == MISSING


# -- docs/api.md, "Parameters" and "The rules, in order": input rules ------------------------


@pytest.mark.parametrize("field", ["user_id", "game_auth_token", "api_key"])
def test_empty_value_counts_as_missing(app, world, field):
    assert app.get(PATH, world.params(**{field: ""})).json == MISSING


def test_name_without_equals_sign_counts_as_missing(app, world):
    p = world.params()
    query = f"user_id&game_auth_token={p['game_auth_token']}&api_key={p['api_key']}"
    assert app.get(f"{PATH}?{query}").json == MISSING


@pytest.mark.parametrize(
    "user_id",
    [
        "04242",
        "+4242",
        " 4242",
        "4242 ",
        "4242.0",
        "4.242e3",
        "-4242",
        "0x1092",
        "４２４２",
        "٤٢٤٢",
        "4242\x00",
        "9223372036854775808",
        "99999999999999999999",
        "1_000",
    ],
)
def test_non_canonical_user_id_is_invalid_credentials(app, world, user_id):
    assert app.get(PATH, world.params(user_id=user_id)).json == INVALID


def test_largest_user_id_is_accepted(app, world):
    biggest = 2**63 - 1
    factories.add_player(world.store, biggest, "max")
    r = app.get(
        PATH, world.params(user_id=str(biggest), game_auth_token=world.token(user_id=biggest))
    )
    assert r.json == {"success": True, "user_id": biggest, "username": "max"}


def test_guest_user_id_zero_is_never_valid(app, world):
    guest_token = mint_token(world.settings.token_secrets[0], world.game_id, 0, 0)
    assert app.get(PATH, world.params(user_id="0", game_auth_token=guest_token)).json == INVALID


def test_duplicate_parameters_last_one_wins(app, world):
    p = world.params()
    base = f"game_auth_token={p['game_auth_token']}&api_key={p['api_key']}"
    assert app.get(f"{PATH}?user_id=1&{base}&user_id=4242").json == ok(world)
    assert app.get(f"{PATH}?user_id=4242&{base}&user_id=1").json == INVALID
    assert app.get(f"{PATH}?{base}&api_key=").json == MISSING


def test_percent_encoded_parameters_are_decoded(app, world):
    p = world.params()
    key = "".join(f"%{b:02X}" for b in p["api_key"].encode())
    query = f"user_%69d=%34%32%34%32&game_auth_token={p['game_auth_token']}&api_key={key}"
    assert app.get(f"{PATH}?{query}").json == ok(world)


@pytest.mark.parametrize("field", ["user_id", "game_auth_token", "api_key"])
@pytest.mark.parametrize("raw", ["%ff%fe", "%C3%28", "%zz", "abc%4", "%"])
def test_invalid_utf8_or_percent_encoding_is_invalid_credentials(app, world, field, raw):
    p = world.params()
    p[field] = raw
    query = "&".join(f"{k}={v}" for k, v in p.items())
    r = app.get(f"{PATH}?{query}")
    assert r.json == INVALID
    assert_contract_headers(r)


def test_raw_non_utf8_bytes_in_query_string_are_invalid_credentials(app, world):
    """Bytes above 0x7f sent unencoded reach WSGI as latin-1 text; not UTF-8 -> 403."""
    p = world.params()
    request = webtest.TestRequest.blank(PATH)
    request.environ["QUERY_STRING"] = (
        f"user_id=4242&game_auth_token=\xff\xfe&api_key={p['api_key']}"
    )
    assert app.do_request(request).json == INVALID


def test_unknown_parameters_are_ignored(app, world):
    assert app.get(PATH, world.params(callback="evil", format="xml")).json == ok(world)


# -- credentials: games, players, keys -------------------------------------------------------


def test_token_of_another_game_is_invalid(app, world):
    other_game, other_key = world.add_game("Go")
    other_token = world.token(game_id=other_game)
    assert app.get(PATH, world.params(game_auth_token=other_token)).json == INVALID
    assert app.get(PATH, world.params(api_key=other_key)).json == INVALID
    both = world.params(api_key=other_key, game_auth_token=other_token)
    assert app.get(PATH, both).json == ok(world)


def test_token_minted_with_another_secret_is_invalid(app, world):
    forged = mint_token(b"not-the-service-secret-0123456789", world.game_id, world.user_id, 0)
    assert app.get(PATH, world.params(game_auth_token=forged)).json == INVALID


def test_token_of_another_player_is_invalid(app, world):
    factories.add_player(world.store, 7, "bob")
    assert app.get(PATH, world.params(user_id="7")).json == INVALID
    assert (
        app.get(PATH, world.params(user_id="7", game_auth_token=world.token(user_id=7))).json[
            "username"
        ]
        == "bob"
    )


def test_unknown_player_with_a_well_formed_token_is_invalid(app, world):
    token = mint_token(world.settings.token_secrets[0], world.game_id, 999, 0)
    assert app.get(PATH, world.params(user_id="999", game_auth_token=token)).json == INVALID


def test_token_in_upper_case_is_invalid(app, world):
    assert app.get(PATH, world.params(game_auth_token=world.token().upper())).json == INVALID


def test_revoked_player_old_token_stops_working_new_one_works(app, world):
    old = world.token()
    assert factories.revoke_player(world.store, world.user_id) == 1
    assert app.get(PATH, world.params(game_auth_token=old)).json == INVALID
    assert app.get(PATH, world.params(game_auth_token=world.token())).json == ok(world)


def test_disabled_player_is_invalid_until_enabled(app, world):
    factories.set_player_enabled(world.store, world.user_id, False)
    assert app.get(PATH, world.params()).json == INVALID
    factories.set_player_enabled(world.store, world.user_id, True)
    assert app.get(PATH, world.params()).json == ok(world)


def test_disabled_game_is_invalid_until_enabled(app, world):
    factories.set_game_enabled(world.store, world.game_id, False)
    assert app.get(PATH, world.params()).json == INVALID
    factories.set_game_enabled(world.store, world.game_id, True)
    assert app.get(PATH, world.params()).json == ok(world)


def test_rename_is_seen_at_once(app, world):
    assert app.get(PATH, world.params()).json == ok(world)
    factories.rename_player(world.store, world.user_id, "alice2")
    assert app.get(PATH, world.params()).json == ok(world, "alice2")


def test_rotated_key_both_work_until_the_old_one_expires(app, world):
    new_key = new_api_key()
    now = int(time.time())
    factories.add_api_key(world.store, world.game_id, api_key_digest(new_key), now, now + 3600)
    assert app.get(PATH, world.params()).json == ok(world)
    assert app.get(PATH, world.params(api_key=new_key)).json == ok(world)
    factories.add_api_key(
        world.store, world.game_id, api_key_digest(new_api_key()), now, now - 1
    )  # expire both
    assert app.get(PATH, world.params()).json == INVALID
    assert app.get(PATH, world.params(api_key=new_key)).json == INVALID


def test_non_ascii_username_is_escaped_to_ascii(app, world):
    factories.rename_player(world.store, world.user_id, "Zoë 🎮")
    r = app.get(PATH, world.params())
    assert r.body == b'{"success":true,"user_id":4242,"username":"Zo\\u00eb \\ud83c\\udfae"}'
    assert r.json["username"] == "Zoë 🎮"


# -- methods and bodies ----------------------------------------------------------------------


def test_post_json_body(app, world):
    r = app.post_json(PATH, world.params())
    assert r.json == ok(world)


def test_post_json_with_integer_user_id(app, world):
    body = dict(world.params(), user_id=world.user_id)
    assert app.post_json(PATH, body).json == ok(world)


@pytest.mark.parametrize("value", [True, 4242.0, [4242], {"id": 4242}])
def test_json_user_id_of_another_type_is_invalid(app, world, value):
    assert app.post_json(PATH, dict(world.params(), user_id=value)).json == INVALID


def test_json_null_counts_as_missing(app, world):
    assert app.post_json(PATH, dict(world.params(), api_key=None)).json == MISSING


@pytest.mark.parametrize(
    "body", [b"[1, 2]", b"{not json", b'"text"', b'{"user_id": \xff}', b"[" * 5000]
)
def test_json_body_that_is_not_an_object_is_400(app, body):
    r = app.post(PATH, body, content_type="application/json")
    assert (
        r.status_int == 200
    )  # a 400 result (docs/api.md): HTTP 200 unless AUTHSVC_ERROR_STATUS=http
    assert r.json == {
        "success": False,
        "error": 400,
        "error_description": "Request body is not a valid JSON object",
    }
    assert_contract_headers(r)


def test_post_form_body(app, world):
    assert app.post(PATH, world.params()).json == ok(world)


def test_post_multipart_form_body(app, world):
    fields = list(world.params().items())
    assert app.post(PATH, fields, content_type="multipart/form-data").json == ok(world)


def test_get_with_json_body_and_no_content_type(app, world):
    body = json.dumps(world.params()).encode()
    r = app.request(PATH, method="GET", body=body, headers={"Content-Length": str(len(body))})
    assert "Content-Type" not in r.request.headers
    assert r.json == ok(world)


def test_json_body_labelled_as_a_form_is_read_as_json(app, world):
    """curl -d '{...}' and PHP curl send JSON as application/x-www-form-urlencoded."""
    r = app.post(PATH, json.dumps(world.params()), content_type="application/x-www-form-urlencoded")
    assert r.json == ok(world)


def test_body_overrides_query(app, world):
    good = world.params()
    query = "user_id=1&game_auth_token=bad&api_key=bad"
    assert app.post_json(f"{PATH}?{query}", good).json == ok(world)
    assert (
        app.post_json(
            f"{PATH}?{'&'.join(f'{k}={v}' for k, v in good.items())}", {"user_id": "1"}
        ).json
        == INVALID
    )


def test_body_and_query_combine(app, world):
    p = world.params()
    r = app.post(
        f"{PATH}?user_id={world.user_id}",
        {"game_auth_token": p["game_auth_token"], "api_key": p["api_key"]},
    )
    assert r.json == ok(world)


def test_body_of_an_unknown_type_carries_no_parameters(app, world):
    r = app.post(PATH, "<xml/>", content_type="application/xml")
    assert r.json == MISSING


BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize(
    "content_type", ["application/json", "text/plain", "application/x-www-form-urlencoded", None]
)
def test_json_body_with_a_byte_order_mark_is_read_as_json(app, world, content_type):
    """Windows tools (PowerShell's UTF8 encoding, Notepad) start a UTF-8 file with EF BB BF."""
    body = BOM + json.dumps(world.params()).encode()
    headers = {"Content-Length": str(len(body))}
    if content_type:
        headers["Content-Type"] = content_type
    r = app.request(PATH, method="POST", body=body, headers=headers)
    assert r.request.headers.get("Content-Type") == content_type
    assert r.json == ok(world)
    broken = BOM + b'{"user_id": '
    r = app.request(
        PATH, method="POST", body=broken, headers={**headers, "Content-Length": str(len(broken))}
    )
    assert r.json == {
        "success": False,
        "error": 400,
        "error_description": "Request body is not a valid JSON object",
    }


def test_head_has_the_get_headers_and_no_body(app, world):
    get = app.get(PATH, world.params())
    head = app.head(PATH, world.params())
    assert head.status_int == 200
    assert head.body == b""
    assert head.headers["Content-Length"] == get.headers["Content-Length"]
    assert_contract_headers(head)


# -- paths as the original's router took them (docs/api.md) -----------------------------------

# Rails squeezes runs of "/" and drops a trailing one; a base URL ending in "/" joined
# with "/api/..." makes the first form.
PATH_VARIANTS = [
    "//api/authenticate.json",
    "/api//authenticate.json",
    "/api/authenticate.json/",
    "/api///authenticate.json//",
]


@pytest.mark.parametrize("path", PATH_VARIANTS)
def test_path_with_repeated_or_trailing_slashes_answers_like_the_api_path(app, world, path):
    r = app.get(path, world.params())
    assert r.request.path_info == path
    assert r.status_int == 200 and r.json == ok(world)
    assert_contract_headers(r)
    assert app.post(path, world.params()).json == ok(world)
    assert app.post_json(path, dict(world.params(), api_key="wrong")).json == INVALID
    assert app.head(path, world.params()).headers["Content-Length"] == r.headers["Content-Length"]
    assert app.request(path, method="DELETE", status=405).json["error"] == 405


# -- other results: same JSON shape, real HTTP status -----------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/api/authenticate",
        "/API/AUTHENTICATE.JSON",
        "/api/authenticate.xml",
        "/api/authenticate.json/x",
        "/api/authenticate.json/./",
    ],
)
def test_unknown_path_is_404_json(app, path):
    r = app.get(path, status=404)
    assert r.json == {"success": False, "error": 404, "error_description": "Not found"}
    assert_contract_headers(r)


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS"])
def test_other_methods_are_405_with_allow(app, world, method):
    r = app.request(PATH + "?user_id=1", method=method, status=405)
    assert r.headers["Allow"] == "GET, HEAD, POST"
    assert r.json == {"success": False, "error": 405, "error_description": "Method not allowed"}
    assert_contract_headers(r)


def test_body_over_16_kib_is_413(app, world):
    body = json.dumps(dict(world.params(), padding="x" * 16384))
    r = app.post(PATH, body, content_type="application/json", status=413)
    assert r.json == {"success": False, "error": 413, "error_description": "Request body too large"}
    assert_contract_headers(r)


def test_body_of_exactly_16_kib_is_read(app, world):
    body = json.dumps(world.params())
    body = body[:-1] + ', "padding": "' + "x" * (16384 - len(body) - 15) + '"}'
    assert len(body) == 16384
    assert app.post(PATH, body, content_type="application/json").json == ok(world)


# -- error-status modes ------------------------------------------------------------------------


def test_http_error_status_mode_uses_real_400_and_403(world):
    app = make_testapp(world.settings, error_status="http")
    assert app.get(PATH, world.params(api_key="nope"), status=403).json == INVALID
    assert app.get(PATH, world.params(api_key=""), status=400).json == MISSING
    assert app.get(PATH, world.params(), status=200).json == ok(world)
    assert app.head(PATH, world.params(api_key="nope"), status=403).body == b""
    assert (
        app.post(PATH, b"{broken", content_type="application/json", status=400).json["error"] == 400
    )


def test_default_error_status_mode_answers_200(app, world):
    assert app.get(PATH, world.params(api_key="nope")).status_int == 200
    assert app.get(PATH, world.params(api_key="")).status_int == 200
