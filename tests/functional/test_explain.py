"""``authsvc explain`` names the right reason for each case (docs/admin.md), on both engines,
through the real command (cli.main), and never prints a key, a token or a secret.

Each verdict with an api key is also the service's own: the same request through the
app logs the same reason (tests/functional/test_reasons.py checks that line).
"""

from __future__ import annotations

import io
import json
import logging
import re
import secrets
import time
import urllib.parse

import pytest

from authsvc.cli import command as cli
from authsvc.tokens import api_key_digest, mint_token, new_api_key
from tests import factories
from tests.support import make_testapp


@pytest.fixture
def explain(monkeypatch, env, capsys, world):
    """explain(*argv, stdin=None) -> (exit code, the JSON verdict, the line); also checks no secret
    is printed."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AUTHSVC_CONFIG", raising=False)
    secret_texts = [s.decode() for s in world.settings.token_secrets]

    def explain(*argv, stdin=None, secrets_to_hide=()):
        lines = []
        for as_json in (True, False):
            monkeypatch.setattr("sys.stdin", io.StringIO(stdin or ""))
            code = cli.main(["explain", *argv, *(["--json"] if as_json else [])])
            out, err = capsys.readouterr()
            assert code == 0, err
            for hidden in (*secrets_to_hide, *secret_texts, *argv, stdin):
                if hidden and len(hidden) >= 32:  # keys, tokens, secrets, pasted URLs
                    assert hidden not in out + err
            lines.append(out.strip())
        verdict = json.loads(lines[0])
        # The two runs may straddle a second: compare relative times ("(3 s ago)") by shape.
        assert _without_spans(lines[1]) == _without_spans(
            f"{verdict['reason']}: {verdict['detail']}"
        )
        return verdict

    return explain


def _without_spans(text: str) -> str:
    return re.sub(r"\((in )?\d+ \w+( ago)?\)", "(<span>)", text)


def url(world, **overrides) -> str:
    return "https://api.example.com/api/authenticate.json?" + urllib.parse.urlencode(
        world.params(**overrides)
    )


def service_reason(world, params) -> str:
    """The reason the app itself logs for these parameters."""
    app = make_testapp(world.settings, max_staleness=0.0)
    logger = logging.getLogger("authsvc.auth")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        app.get("/api/authenticate.json", params=params)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        app.app.store.close()
    return records[0].getMessage().split("reason=")[1].split()[0]


def check(world, explain, expected_reason, overrides=None, *, in_detail=(), **kw):
    """The pasted URL on stdin gives ``expected_reason``, and so does the service."""
    params = world.params(**(overrides or {}))
    verdict = explain("-", stdin=url(world, **(overrides or {})), **kw)
    assert verdict["reason"] == expected_reason, verdict
    for text in in_detail:
        assert text in verdict["detail"], verdict
    assert service_reason(world, params) == expected_reason
    return verdict


def test_success(world, explain):
    verdict = check(world, explain, "success", in_detail=("succeeds as alice",))
    assert (verdict["game_id"], verdict["user_id"]) == (world.game_id, world.user_id)


def test_missing_and_malformed(world, explain):
    check(world, explain, "missing_parameters", {"api_key": None}, in_detail=("api_key missing",))
    check(world, explain, "malformed", {"user_id": "07"}, in_detail=("canonical",))


def test_unknown_key(world, explain):
    check(
        world,
        explain,
        "unknown_key",
        {"api_key": new_api_key()},
        in_detail=("no game has this api key",),
    )


def test_expired_key_says_since_when(world, explain):
    now = int(time.time())
    factories.add_api_key(
        world.store, world.game_id, api_key_digest(new_api_key()), now - 7200, now - 3600
    )
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now - 3600))
    check(world, explain, "expired_key", in_detail=(f"expired at {stamp} (1 h ago)",))


def test_disabled_game(world, explain):
    factories.set_game_enabled(world.store, world.game_id, False)
    check(world, explain, "game_disabled", in_detail=(f"game {world.game_id} (Chess) is disabled",))


def test_unknown_and_disabled_player(world, explain):
    token = mint_token(world.settings.token_secrets[0], world.game_id, 4243, 0)
    check(
        world,
        explain,
        "unknown_player",
        {"user_id": "4243", "game_auth_token": token},
        in_detail=("no such player",),
    )
    factories.set_player_enabled(world.store, world.user_id, False)
    check(world, explain, "player_disabled", in_detail=("the player is disabled",))


def test_a_token_of_this_player_for_another_game(world, explain):
    other_id, _ = world.add_game("Go")
    token = world.token(game_id=other_id)
    check(
        world,
        explain,
        "wrong_token",
        {"game_auth_token": token},
        in_detail=(f"a token of this player for game {other_id} (Go), not for this game",),
    )


def test_a_token_of_an_earlier_epoch_is_revoked(world, explain):
    old = world.token()
    factories.revoke_player(world.store, world.user_id)
    factories.revoke_player(world.store, world.user_id)
    check(
        world,
        explain,
        "wrong_token",
        {"game_auth_token": old},
        in_detail=("a token of credential epoch 0, revoked: the player is at epoch 2",),
    )


def test_a_token_made_with_a_secret_no_longer_in_the_file(world, explain, tmp_path):
    retired = secrets.token_hex(32)
    path = tmp_path / "old-token-secret"
    path.write_text(retired + "\n")
    path.chmod(0o600)
    token = mint_token(retired.encode(), world.game_id, world.user_id, 0)
    check(world, explain, "wrong_token", {"game_auth_token": token}, in_detail=("simply wrong",))
    verdict = explain(
        "-",
        "--retired-secret-file",
        str(path),
        stdin=url(world, game_auth_token=token),
        secrets_to_hide=(retired,),
    )
    assert verdict["reason"] == "wrong_token"
    assert "a token made with a token secret no longer in the secret file" in verdict["detail"]


def test_simply_wrong_and_not_a_token(world, explain):
    check(world, explain, "wrong_token", {"game_auth_token": "0" * 64}, in_detail=("simply wrong",))
    check(
        world,
        explain,
        "wrong_token",
        {"game_auth_token": "not-a-token"},
        in_detail=("not a token at all", "11 characters"),
    )


def test_by_game_id_and_arguments_instead_of_a_url(world, explain, tmp_path):
    """Support staff with no api key: the game id, the user id and the token (on stdin, or in a
    file)."""
    verdict = explain(
        "--game-id",
        str(world.game_id),
        "--user-id",
        str(world.user_id),
        "--token-file",
        "-",
        stdin=world.token(),
    )
    assert verdict["reason"] == "success"
    old = world.token()
    factories.revoke_player(world.store, world.user_id)
    token_file = tmp_path / "token.txt"
    token_file.write_text(old + "\n")
    verdict = explain(
        "--game-id",
        str(world.game_id),
        "--user-id",
        str(world.user_id),
        "--token-file",
        str(token_file),
    )
    assert verdict["reason"] == "wrong_token" and "revoked" in verdict["detail"]
    verdict = explain(
        "--game-id", "999", "--user-id", str(world.user_id), "--token-file", "-", stdin=old
    )
    assert verdict == {
        "reason": "unknown_key",
        "detail": "no game 999 (error 403)",
        "game_id": None,
        "user_id": world.user_id,
    }


def test_the_request_and_the_api_key_from_files(world, explain, tmp_path):
    request = tmp_path / "request.txt"
    request.write_text(url(world, api_key=None) + "\n")
    key = tmp_path / "key.txt"
    key.write_text(world.api_key + "\n")
    assert explain(str(request), "--api-key-file", str(key))["reason"] == "success"
    assert explain(str(request), "--api-key-file", "-", stdin=world.api_key)["reason"] == "success"


def _refused(capsys, monkeypatch, argv, *, hidden):
    """The command line is refused (exit 2) in one line that does not repeat the secret."""
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    with pytest.raises(SystemExit) as info:
        cli.main(["explain", *argv])
    out, err = capsys.readouterr()
    assert info.value.code == 2, err
    assert hidden not in out + err and "ps" in err and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.engine("sqlite")
def test_secrets_on_the_command_line_are_refused(world, explain, capsys, monkeypatch):
    """Any local user sees a process's arguments (ps, /proc/PID/cmdline): no secret may come that
    way."""
    token, query = world.token(), urllib.parse.urlencode(world.params())
    err = _refused(
        capsys,
        monkeypatch,
        ["--game-id", str(world.game_id), "--user-id", "1", "--token", token],
        hidden=token,
    )
    assert "--token-file" in err
    err = _refused(capsys, monkeypatch, ["-", "--api-key", world.api_key], hidden=world.api_key)
    assert "--api-key-file" in err
    for request in (query, url(world), "?" + query):
        err = _refused(capsys, monkeypatch, [request], hidden=world.token())
        assert "authsvc explain -" in err
    monkeypatch.setattr("sys.stdin", io.StringIO(url(world)))
    assert cli.main(["explain", "-", "--token-file", "-"]) == 1  # one stdin, not two
    assert (
        "only one of REQUEST_FILE, --token-file and --api-key-file can be '-'"
        in capsys.readouterr().err
    )


def test_a_non_ascii_token_is_not_a_token(world, explain):
    """As the service answers it (tokens.py): never a traceback."""
    check(
        world,
        explain,
        "wrong_token",
        {"game_auth_token": "\u00e9" * 20},
        in_detail=("not a token at all", "20 characters"),
    )
    verdict = explain(
        "--game-id",
        str(world.game_id),
        "--user-id",
        str(world.user_id),
        "--token-file",
        "-",
        stdin="t\u00f6ken",
    )
    assert verdict["reason"] == "wrong_token" and "not a token at all" in verdict["detail"]
