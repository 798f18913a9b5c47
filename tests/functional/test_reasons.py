"""Why an authentication failed: the internal reason in the log line, never on the wire
(docs/logs.md).

Each reason of docs/logs.md once, through the app (WebTest, WSGI lint on), on both
engines: the client gets exactly the 400/403 of docs/api.md and no header but the
result code, while the ``authsvc.auth`` line names the reason, the game and the
user, and never the api key, the token or the query string.
"""

from __future__ import annotations

import logging
import os
import re
import time

import pytest

from authsvc.tokens import api_key_digest, mint_token, new_api_key
from authsvc.web.authenticate import REASONS
from tests import factories
from tests.support import INVALID as FORBIDDEN
from tests.support import MISSING, PATH, make_testapp

LINE = re.compile(
    r"^auth rid=(?P<rid>\S+) host=(?P<host>https|legacy) game=(?P<game>\d+|none) "
    r"user=(?P<user>\d+|-) reason=(?P<reason>[a-z_]+) ms=\d+\.\d{3}$"
)


def _expire_key(world):
    """A rotation whose old key expired ten seconds ago."""
    now = int(time.time())
    factories.add_api_key(
        world.store, world.game_id, api_key_digest(new_api_key()), now - 100, now - 10
    )


def _other_player(world):
    factories.add_player(world.store, 4243, "bob")
    factories.set_player_enabled(world.store, 4243, False)
    return {"user_id": "4243", "game_auth_token": world.token(user_id=4243)}


CASES = {
    # name: (change to the store, params overrides, expected body, game label is the world's?)
    "success": (None, {}, None, True),
    "missing_parameters": (None, {"api_key": None}, MISSING, False),
    "malformed": (None, {"user_id": "07"}, FORBIDDEN, False),
    "unknown_key": (None, {"api_key": new_api_key()}, FORBIDDEN, False),
    "expired_key": (_expire_key, {}, FORBIDDEN, True),
    "game_disabled": (
        lambda w: factories.set_game_enabled(w.store, w.game_id, False),
        {},
        FORBIDDEN,
        True,
    ),
    "unknown_player": (None, "unknown_player", FORBIDDEN, True),
    "player_disabled": (_other_player, {}, FORBIDDEN, True),
    "wrong_token": (None, {"game_auth_token": "0" * 64}, FORBIDDEN, True),
}


@pytest.mark.parametrize("reason", list(CASES))
def test_each_reason_is_logged_and_never_sent(world, caplog, reason):
    change, overrides, body, has_game = CASES[reason]
    extra = change(world) if change else None
    extra = extra if isinstance(extra, dict) else {}  # a change may give the params it needs
    if overrides == "unknown_player":
        overrides = {
            "user_id": "4243",
            "game_auth_token": mint_token(world.settings.token_secrets[0], world.game_id, 4243, 0),
        }
    params = world.params(**{**extra, **overrides})
    app = make_testapp(world.settings, max_staleness=0.0)
    with caplog.at_level(logging.INFO, logger="authsvc.auth"):
        res = app.get(
            PATH,
            params=params,
            headers={"X-Request-Id": "e403c0fcef6463d39fc7a9b815431506"},
            extra_environ={"wsgi.url_scheme": "https"},
        )
    app.app.store.close()
    if body is None:
        assert res.json["success"] is True
    else:
        assert res.json == body
    # Nothing but the result code tells the client anything: no reason in any header or the body.
    if body is not None:
        assert not [v for v in res.headers.values() if reason in v]
        assert reason.encode() not in res.body
    lines = [r.getMessage() for r in caplog.records if r.name == "authsvc.auth"]
    assert len(lines) == 1, lines
    match = LINE.match(lines[0])
    assert match, lines[0]
    assert match["reason"] == reason
    assert match["rid"] == "e403c0fcef6463d39fc7a9b815431506"
    assert match["host"] == "https"
    assert match["game"] == (str(world.game_id) if has_game else "none")
    assert match["user"] == (
        "-" if reason in ("missing_parameters", "malformed") else params["user_id"]
    )
    for secret in (params.get("api_key"), params.get("game_auth_token")):
        if secret:
            assert secret not in caplog.text


def test_every_reason_is_covered():
    assert set(CASES) | {"store_unavailable", "waited_too_long"} == set(REASONS)


@pytest.mark.engine("sqlite")
def test_store_unavailable_and_unreadable_bodies_are_logged(world, caplog, tmp_path):
    """A 503 is ``store_unavailable`` with no game; a body that cannot be read is ``malformed``;
    a request id that is not nginx's (letters and digits) is logged as "-"; plain HTTP is the legacy
    host."""
    app = make_testapp(world.settings)
    params = world.params()
    with caplog.at_level(logging.INFO, logger="authsvc.auth"):
        app.post(
            PATH, "{not json", content_type="application/json", headers={"X-Request-Id": "a b"}
        )
        path = world.settings.store.removeprefix("sqlite://")
        world.store.close()
        os.rename(path, tmp_path / "moved.db")
        app.get(PATH, params=params, status=503)
    app.app.store.close()
    lines = [LINE.match(r.getMessage()) for r in caplog.records if r.name == "authsvc.auth"]
    assert [(m["reason"], m["game"], m["user"], m["rid"], m["host"]) for m in lines] == [
        ("malformed", "none", "-", "-", "legacy"),
        ("store_unavailable", "none", "-", "-", "legacy"),
    ]
    assert params["api_key"] not in caplog.text and params["game_auth_token"] not in caplog.text


def test_probes_and_other_routes_write_no_auth_line(app, caplog):
    with caplog.at_level(logging.INFO, logger="authsvc"):
        app.get("/healthz")
        app.get("/readyz")
        app.get("/nope", status=404)
    assert not [r for r in caplog.records if r.name in ("authsvc", "authsvc.auth")]
