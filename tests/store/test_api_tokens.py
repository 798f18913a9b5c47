"""The admin API's bearer tokens (docs/admin.md, "Admin API tokens"), on both engines, through the
command.

A token is shown once and stored as its digest; list never shows it; revoke and
expiry stop it; each add and revoke writes one audit record that holds neither
the token nor its digest; on PostgreSQL the admin role may add and revoke, the
web role may not read the table.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import webtest

from authsvc.api.app import AdminApp
from authsvc.cli import command as cli
from authsvc.errors import Conflict, Invalid, NotFound
from authsvc.operations import api_tokens
from authsvc.operations import api_tokens as api_tokens_ops
from authsvc.operations.context import Context, admin_store, command_context
from authsvc.settings import Settings
from tests.support import init_as_owner, store_sql

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "postgres"


@pytest.fixture
def run(command_as_alice):
    """The command on a migrated store."""
    assert command_as_alice("init")[0] == 0
    return command_as_alice


sql = store_sql


def test_add_shows_the_token_once_and_stores_its_digest(run, store_url):
    code, out, err = run(
        "api-token",
        "add",
        "web-tier",
        "--scope",
        "players:write",
        "--scope",
        "tokens:mint",
        "--scope",
        "players:write",
        "--json",
    )
    assert code == 0, err
    obj = json.loads(out)
    token = obj["token"]
    assert api_tokens.well_formed(token) and token.startswith("asv_")
    assert obj["scopes"] == ["players:write", "tokens:mint"] and obj["expires_at"] is None
    rows = sql(store_url, "SELECT name, digest, scopes FROM api_tokens")
    assert rows == [("web-tier", api_tokens.digest(token), "players:write tokens:mint")]
    code, out, _ = run("api-token", "list", "--json")
    assert code == 0 and token not in out and api_tokens.digest(token) not in out
    assert [t["name"] for t in json.loads(out)["api_tokens"]] == ["web-tier"]
    code, out, _ = run("api-token", "list")
    assert "web-tier" in out and "players:write tokens:mint" in out and token not in out


def test_names_are_never_reused_and_bad_input_is_refused(run, store_url):
    assert run("api-token", "add", "a", "--scope", "games:read")[0] == 0
    code, _, err = run("api-token", "add", "a", "--scope", "games:read")
    assert code == 1 and "an api token named 'a' exists" in err
    assert run("api-token", "revoke", "a")[0] == 0
    assert run("api-token", "add", "a", "--scope", "games:read")[0] == 1  # not even once revoked
    assert run("api-token", "add", "b", "--scope", "root")[0] == 2  # argparse: not a scope
    code, _, err = run("api-token", "add", "b")
    assert code == 1 and "--scope must be given once or more, from: players:read" in err
    code, _, err = run("api-token", "add", "b c", "--scope", "games:read")
    assert code == 1 and "a token name is 1 to 64" in err
    code, _, err = run("api-token", "add", "b", "--scope", "games:read", "--expires-in", "0")
    assert code == 1 and "--expires-in must be from 1" in err
    code, _, err = run("api-token", "revoke", "nobody")
    assert code == 1 and "no api token 'nobody'" in err
    assert [r[0] for r in sql(store_url, "SELECT name FROM api_tokens")] == ["a"]


def test_revoked_expired_unknown_and_malformed_tokens_stand_for_nothing(run, settings):
    _, out, _ = run(
        "api-token", "add", "live", "--scope", "players:read", "--expires-in", "60", "--json"
    )
    live = json.loads(out)["token"]
    _, out, _ = run("api-token", "add", "gone", "--scope", "players:read", "--json")
    gone = json.loads(out)["token"]
    with admin_store(settings) as store:
        now = command_context().now()
        assert api_tokens_ops.api_token_for(store, live, now).name == "live"
        assert api_tokens_ops.api_token_for(store, live, now + 60) is None  # expired
        assert api_tokens_ops.api_token_for(store, gone, now).name == "gone"
        assert api_tokens_ops.api_token_for(store, api_tokens.new_token(), now) is None  # unknown
        assert api_tokens_ops.api_token_for(store, live + "x", now) is None  # malformed
        assert (
            api_tokens_ops.api_token_for(store, api_tokens.digest(live), now) is None
        )  # the digest is no token
    assert run("api-token", "revoke", "gone")[0] == 0
    assert run("api-token", "revoke", "gone")[0] == 0  # once more: no change
    with admin_store(settings) as store:
        assert api_tokens_ops.api_token_for(store, gone, command_context().now()) is None


def test_add_and_revoke_are_audited_without_the_token_or_its_digest(run, store_url):
    _, out, _ = run("api-token", "add", "web", "--scope", "tokens:mint", "--json")
    token = json.loads(out)["token"]
    assert run("api-token", "revoke", "web")[0] == 0
    assert run("api-token", "revoke", "web")[0] == 0  # nothing to change: no second record
    rows = sql(store_url, "SELECT actor, action, changes FROM audit ORDER BY id")
    assert [(actor, action) for actor, action, _ in rows] == [
        ("cli:alice", "api_token.add"),
        ("cli:alice", "api_token.revoke"),
    ]
    assert json.loads(rows[0][2])["after"] == {
        "name": "web",
        "scopes": ["tokens:mint"],
        "expires_at": None,
    }
    everything = repr(sql(store_url, "SELECT * FROM audit"))
    assert (
        token not in everything
        and token[4:] not in everything
        and api_tokens.digest(token) not in everything
    )
    assert run("audit", "verify")[0] == 0


def test_operations_raise_typed_errors(run, settings):
    ctx = Context(actor="api:test")
    with admin_store(settings) as store:
        api_tokens_ops.add_api_token(store, ctx, "x", ["audit:read"])
        with pytest.raises(Conflict):
            api_tokens_ops.add_api_token(store, ctx, "x", ["audit:read"])
        with pytest.raises(Invalid):
            api_tokens_ops.add_api_token(store, ctx, "y", ["audit:write"])
        with pytest.raises(NotFound):
            api_tokens_ops.revoke_api_token(store, ctx, "y")


@pytest.mark.engine("postgresql")
def test_the_admin_role_manages_tokens_and_the_web_role_cannot_read_them(
    own_pg, secret_file, monkeypatch, capsys
):
    import psycopg

    url = init_as_owner(own_pg, secret_file, monkeypatch)
    for argv in (
        ["api-token", "add", "web", "--scope", "players:write"],
        ["api-token", "list"],
        ["api-token", "revoke", "web"],
        ["game", "add", "Chess"],
    ):
        assert cli.main(argv) == 0, capsys.readouterr().err
    # the admin API, run as the admin role, reaches every table it needs (idempotency keys included)
    settings = Settings.from_env()
    app = AdminApp(settings)
    try:
        _, token = api_tokens_ops.add_api_token(
            app.store, Context(actor="cli:test"), "api", list(api_tokens.SCOPES)
        )
        client = webtest.TestApp(app, lint=True)
        headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "k1"}
        assert (
            client.put_json("/v1/players/5", {"username": "bob"}, headers=headers).status_int == 201
        )
        assert client.post("/v1/players/5/revoke", headers=headers).json["epoch"] == 1
        assert client.post("/v1/players/5/revoke", headers=headers).json["epoch"] == 1  # replayed
        assert (
            client.post_json(
                "/v1/tokens",
                {"game_id": 1, "user_id": 5},
                headers=headers | {"Idempotency-Key": "k2"},
            ).json["epoch"]
            == 1
        )
        assert (
            client.get("/v1/audit?limit=2", headers=headers).json["records"][0]["action"]
            == "token.mint"
        )
    finally:
        app.store.close()
    with psycopg.connect(url("authsvc_web"), autocommit=True) as conn:
        for table in ("api_tokens", "idempotency_keys"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT * FROM {table}")
