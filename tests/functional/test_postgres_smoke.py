"""Each front door once on PostgreSQL: the game-facing endpoint, the admin API and the command.

The functional tier runs on SQLite (tests/tiers.py): the front doors hold no SQL, and what runs
engine-specific SQL (the write path, the audit chain, the batch, export/import, API tokens, the
store contract) runs on both engines in the store tier. These smoke tests prove the doors are
wired to a PostgreSQL store end to end: a player signed up, its token minted and accepted, revoked
and refused, a batch written, the trail read and verified.
"""

from __future__ import annotations

import json

import pytest
import webtest

from authsvc.api.app import AdminApp
from authsvc.operations import api_tokens
from authsvc.operations.context import Context
from tests.support import INVALID

pytestmark = pytest.mark.engine("postgresql")


def test_the_game_facing_endpoint_on_postgresql(app, world):
    ok = app.get("/api/authenticate.json", world.params())
    assert ok.json == {"success": True, "user_id": 4242, "username": "alice"}
    refused = app.get("/api/authenticate.json", world.params(game_auth_token="0" * 64))
    assert refused.status_int == 200 and refused.json == INVALID


def test_the_admin_api_on_postgresql(app, world, settings):
    admin = webtest.TestApp(AdminApp(settings), lint=True)
    _, token = api_tokens.add_api_token(
        world.store,
        Context(actor="cli:test"),
        "web",
        ["players:read", "players:write", "tokens:mint", "audit:read"],
    )
    headers = {"Authorization": f"Bearer {token}"}
    try:
        assert (
            admin.put_json("/v1/players/7", {"username": "bob"}, headers=headers).status_int == 201
        )
        minted = admin.post_json(
            "/v1/tokens",
            {"game_id": world.game_id, "user_id": 7},
            headers=headers | {"Idempotency-Key": "m-1"},
        ).json
        params = {
            "user_id": "7",
            "game_auth_token": minted["game_auth_token"],
            "api_key": world.api_key,
        }
        assert app.get("/api/authenticate.json", params).json == {
            "success": True,
            "user_id": 7,
            "username": "bob",
        }
        revoked = admin.post("/v1/players/7/revoke", headers=headers).json
        assert revoked["epoch"] == 1 and app.get("/api/authenticate.json", params).json == INVALID
        batch = admin.post_json(
            "/v1/players/batch",
            {"players": [{"user_id": 7, "username": "bob"}, {"user_id": 8, "username": "cy"}]},
            headers=headers,
        )
        assert batch.json["counts"] == {"created": 1, "updated": 0, "unchanged": 1, "error": 0}
        actions = [
            r["action"] for r in admin.get("/v1/audit?player=7", headers=headers).json["records"]
        ]
        assert actions == ["player.revoke", "token.mint", "player.add"]
    finally:
        admin.app.store.close()


def test_the_command_on_postgresql(command_as_alice, world):
    assert command_as_alice("player", "add", "9", "dana")[0] == 0
    code, out, _ = command_as_alice(
        "token", "issue", "--game", str(world.game_id), "--user", "9", "--json"
    )
    assert code == 0 and len(json.loads(out)["game_auth_token"]) == 64
    assert command_as_alice("player", "revoke", "9")[0] == 0
    code, out, _ = command_as_alice("audit", "verify")
    assert code == 0 and "chain intact" in out
