"""``authsvc export`` / ``authsvc import``: SQLite -> PostgreSQL -> SQLite with nothing lost.

Checksums are computed straight from each database with its own driver, not
through the Store code under test.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import time

import pytest
import webtest

from authsvc.cli.command import main
from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.tokens import api_key_digest, mint_token, new_api_key
from authsvc.web.app import make_app
from tests import factories

PLAYERS = 100_000


def checksum(url: str) -> tuple[int, int, str]:
    """(games, players, sha256 of every row of every table in a fixed order), read with the raw
    driver."""
    queries = [
        "SELECT id, name, enabled, created_at FROM games ORDER BY id",
        "SELECT digest, game_id, created_at, expires_at FROM api_keys ORDER BY digest",
        "SELECT user_id, username, epoch, enabled, updated_at_ms FROM players ORDER BY user_id",
    ]
    if url.startswith("sqlite://"):
        conn = sqlite3.connect(url.removeprefix("sqlite://"))
    else:
        import psycopg

        conn = psycopg.connect(url)
    try:
        h = hashlib.sha256()
        counts = []
        for sql in queries:
            rows = conn.execute(sql).fetchall()
            counts.append(len(rows))
            for row in rows:  # booleans as 0/1 so both engines hash alike
                h.update(repr(tuple(int(v) if isinstance(v, bool) else v for v in row)).encode())
        return counts[0], counts[2], h.hexdigest()
    finally:
        conn.close()


def run(monkeypatch, capsys, url: str, secret_file, *argv: str) -> tuple[int, dict]:
    """The admin command, in-process, pointed at ``url``; returns (exit code, its JSON answer)."""
    monkeypatch.setenv("AUTHSVC_STORE", url)
    monkeypatch.setenv("AUTHSVC_TOKEN_SECRET_FILE", str(secret_file))
    code = main([*argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out.strip().splitlines()[-1]) if out.strip() else {}


def authenticate(url: str, secret_file, **params) -> dict:
    settings = Settings.from_env(
        {"AUTHSVC_STORE": url, "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file)}
    )
    app = make_app(settings)
    try:
        return webtest.TestApp(app).get("/api/authenticate.json", params=params).json
    finally:
        app.store.close()


@pytest.mark.slow
def test_round_trip_sqlite_postgres_sqlite(
    tmp_path, pg_databases, secret_file, monkeypatch, capsys
):
    source = "sqlite://" + str(tmp_path / "source.db")
    middle = pg_databases.create(migrate=False)
    target = "sqlite://" + str(tmp_path / "target.db")
    secret = Settings.from_env(
        {"AUTHSVC_STORE": source, "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file)}
    ).token_secrets[0]

    # A source store with every kind of state: rotated and expiring keys, a disabled game,
    # a game id gap, revoked and disabled players, non-ASCII names.
    now = int(time.time())
    keys = [new_api_key() for _ in range(4)]
    store = open_store(source, readonly=False)
    store.migrate()
    chess = factories.add_game(store, "Chess", api_key_digest(keys[0]), now)
    factories.add_api_key(
        store, chess.id, api_key_digest(keys[1]), now + 1, now + 3600
    )  # keys[0] expires in an hour
    go = factories.add_game(store, "Go ♟", api_key_digest(keys[2]), now)
    factories.set_game_enabled(store, go.id, False)
    factories.import_players(store, ((i * 3, f"player-{i}-é") for i in range(1, PLAYERS + 1)))
    store.close()
    raw = sqlite3.connect(source.removeprefix("sqlite://"))
    with raw:
        raw.execute(
            "UPDATE players SET epoch = user_id % 7, enabled = (user_id % 13 != 0), "
            "updated_at_ms = CASE WHEN user_id % 11 = 0 THEN NULL ELSE 1800000000000 + user_id END"
        )
        raw.execute(
            "UPDATE sqlite_sequence SET seq = 9 WHERE name = 'games'"
        )  # ids 3..9 were used once
    raw.close()
    before = checksum(source)
    assert before[:2] == (2, PLAYERS)

    # SQLite -> file -> PostgreSQL
    assert run(monkeypatch, capsys, middle, secret_file, "init")[0] == 0
    assert run(monkeypatch, capsys, source, secret_file, "export", str(tmp_path / "a.jsonl")) == (
        0,
        {"file": str(tmp_path / "a.jsonl"), "games": 2, "players": PLAYERS},
    )
    code, answer = run(
        monkeypatch, capsys, middle, secret_file, "import", str(tmp_path / "a.jsonl")
    )
    assert (code, answer["games"], answer["players"]) == (0, 2, PLAYERS)
    assert checksum(middle) == before

    # PostgreSQL -> file -> SQLite
    assert (
        run(monkeypatch, capsys, middle, secret_file, "export", str(tmp_path / "b.jsonl"))[0] == 0
    )
    assert run(monkeypatch, capsys, target, secret_file, "init")[0] == 0
    assert (
        run(monkeypatch, capsys, target, secret_file, "import", str(tmp_path / "b.jsonl"))[0] == 0
    )
    assert checksum(target) == before
    a_lines = (tmp_path / "a.jsonl").read_bytes().splitlines()
    b_lines = (tmp_path / "b.jsonl").read_bytes().splitlines()
    assert a_lines[1:-1] == b_lines[1:-1]  # the same data, line for line (header has the time)

    # Tokens and api keys still work after each move, and the state came along with them.
    user = 3 * 5  # epoch 15 % 7 = 1, enabled
    token = mint_token(secret, chess.id, user, 1)
    for url in (middle, target):
        for key in (keys[0], keys[1]):
            assert authenticate(
                url, secret_file, user_id=user, game_auth_token=token, api_key=key
            ) == {
                "success": True,
                "user_id": user,
                "username": "player-5-é",
            }
        stale = mint_token(
            secret, chess.id, user, 0
        )  # an epoch-0 token was revoked before the move
        assert (
            authenticate(url, secret_file, user_id=user, game_auth_token=stale, api_key=keys[1])[
                "error"
            ]
            == 403
        )
        disabled_game = mint_token(secret, go.id, user, 1)
        assert (
            authenticate(
                url, secret_file, user_id=user, game_auth_token=disabled_game, api_key=keys[2]
            )["error"]
            == 403
        )
        moved = open_store(url, readonly=False)
        assert moved.game_id_high_water() == 9
        assert (
            factories.add_game(moved, "New", api_key_digest(keys[3] + url), now).id == 10
        )  # no id handed out twice
        moved.close()


def _small_export(tmp_path, monkeypatch, capsys, secret_file) -> str:
    source = "sqlite://" + str(tmp_path / "small.db")
    store = open_store(source, readonly=False)
    store.migrate()
    factories.add_game(store, "Chess", api_key_digest(new_api_key()), 1_700_000_000)
    factories.import_players(store, [(1, "one"), (2, "two"), (3, "three")])
    store.close()
    path = tmp_path / "small.jsonl"
    assert run(monkeypatch, capsys, source, secret_file, "export", str(path))[0] == 0
    return path


def test_import_refuses_a_store_that_holds_anything(
    store_url, admin_store, tmp_path, monkeypatch, capsys, secret_file
):
    path = _small_export(tmp_path, monkeypatch, capsys, secret_file)
    factories.add_player(admin_store, 99, "already here")
    code, answer = run(monkeypatch, capsys, store_url, secret_file, "import", str(path))
    assert code == 1 and "already holds" in answer["error"]
    assert admin_store.get_player(1) is None and admin_store.list_games() == []


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda lines: lines[:-1], "without its end line"),
        (lambda lines: lines[:-2] + lines[-1:], "counts on the end line"),
        (
            lambda lines: [lines[0], lines[1], lines[2].replace(b'"one"', b'"0ne"'), *lines[3:]],
            "checksum",
        ),
        (lambda lines: [lines[0], lines[1], b"{not json", *lines[2:]], "line 3: not a JSON object"),
        (
            lambda lines: [lines[0], lines[1], b"[" * 100_000, *lines[2:]],
            "line 3: not a JSON object",
        ),
        (lambda lines: [lines[0], lines[1], lines[3], lines[2], *lines[4:]], "increasing user_id"),
        (
            lambda lines: [lines[0].replace(b'"version":1', b'"version":9'), *lines[1:]],
            "format version 9",
        ),
        (lambda lines: [b"user_id,username", b"1,one"], "not an authsvc export"),
    ],
    ids=[
        "truncated",
        "player-missing",
        "edited",
        "garbage-line",
        "nested-too-deep",
        "out-of-order",
        "newer-format",
        "not-an-export",
    ],
)
def test_import_of_a_damaged_file_writes_nothing(
    store_url, admin_store, tmp_path, monkeypatch, capsys, secret_file, damage, message
):
    path = _small_export(tmp_path, monkeypatch, capsys, secret_file)
    path.write_bytes(b"\n".join(damage(path.read_bytes().splitlines())) + b"\n")
    code, answer = run(monkeypatch, capsys, store_url, secret_file, "import", str(path))
    assert code == 1 and message in answer["error"], answer
    assert admin_store.list_games() == [] and admin_store.get_player(1) is None


def test_export_never_overwrites_and_keeps_the_file_private(
    store_url, admin_store, tmp_path, monkeypatch, capsys, secret_file
):
    factories.add_player(admin_store, 1, "one")
    path = tmp_path / "out.jsonl"
    path.write_text("precious")
    code, answer = run(monkeypatch, capsys, store_url, secret_file, "export", str(path))
    assert code == 1 and "never overwrites" in answer["error"]
    assert path.read_text() == "precious"
    path.unlink()
    assert run(monkeypatch, capsys, store_url, secret_file, "export", str(path))[0] == 0
    assert path.stat().st_mode & 0o777 == 0o600
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert (
        lines[0]["format"] == "authsvc-export"
        and lines[-1]["type"] == "end"
        and lines[-1]["players"] == 1
    )


def test_a_move_keeps_names_stored_before_the_visible_name_rule(
    store_url, admin_store, tmp_path, monkeypatch, capsys, secret_file
):
    """export/import moves a whole store: a name with U+202E or U+2028 stored earlier comes across
    exactly (new names refuse them: docs/admin.md), and the admin command's text output escapes
    it."""
    source = "sqlite://" + str(tmp_path / "old.db")
    store = open_store(source, readonly=False)
    store.migrate()
    factories.add_game(store, "Chess\u202eevil", api_key_digest(new_api_key()), 1_700_000_000)
    factories.import_players(store, [(1, "line\u2028break"), (2, "\u200b")])
    store.close()
    path = tmp_path / "old.jsonl"
    assert run(monkeypatch, capsys, source, secret_file, "export", str(path))[0] == 0
    assert run(monkeypatch, capsys, store_url, secret_file, "import", str(path))[0] == 0
    assert [g.name for g in admin_store.list_games()] == ["Chess\u202eevil"]
    assert admin_store.get_player(1).username == "line\u2028break"
    assert admin_store.get_player(2).username == "\u200b"
    monkeypatch.setenv("AUTHSVC_STORE", store_url)
    assert main(["player", "show", "1"]) == 0
    out = capsys.readouterr().out
    assert "line\\u2028break" in out and "\u2028" not in out


def test_updated_at_comes_across_and_an_older_export_without_it_imports_as_null(
    store_url, admin_store, tmp_path, monkeypatch, capsys, secret_file
):
    """Each player line carries updated_at_ms (unix milliseconds, or null: not known); an export
    made before the field existed has none, and its players import with null, as the schema step
    leaves them."""
    path = _small_export(tmp_path, monkeypatch, capsys, secret_file)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    players = [line for line in lines if line.get("type") == "player"]
    assert [type(p["updated_at_ms"]) for p in players] == [int, int, int]
    assert run(monkeypatch, capsys, store_url, secret_file, "import", str(path))[0] == 0
    assert [admin_store.get_player(p["user_id"]).updated_at_ms for p in players] == [
        p["updated_at_ms"] for p in players
    ]

    # The previous release's file: the same lines without the field, its checksum made anew.
    digest = hashlib.sha256()
    old = []
    for line in lines[:-1]:
        line.pop("updated_at_ms", None)
        text = json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"
        digest.update(text.encode())
        old.append(text)
    old.append(json.dumps(lines[-1] | {"sha256": digest.hexdigest()}, separators=(",", ":")) + "\n")
    (tmp_path / "old.jsonl").write_text("".join(old))
    target = "sqlite://" + str(tmp_path / "target.db")
    assert run(monkeypatch, capsys, target, secret_file, "init")[0] == 0
    assert (
        run(monkeypatch, capsys, target, secret_file, "import", str(tmp_path / "old.jsonl"))[0] == 0
    )
    moved = open_store(target, readonly=False)
    try:
        assert [moved.get_player(p["user_id"]).updated_at_ms for p in players] == [None, None, None]
    finally:
        moved.close()


@pytest.mark.parametrize("value", ['"2026-11-24T08:00:00Z"', "-1", "true", "1.5"])
def test_import_refuses_an_updated_at_that_is_not_milliseconds(
    store_url, admin_store, tmp_path, monkeypatch, capsys, secret_file, value
):
    path = _small_export(tmp_path, monkeypatch, capsys, secret_file)
    lines = path.read_bytes().splitlines()
    lines[2] = re.sub(rb'"updated_at_ms":\d+', b'"updated_at_ms":' + value.encode(), lines[2])
    path.write_bytes(b"\n".join(lines) + b"\n")
    code, answer = run(monkeypatch, capsys, store_url, secret_file, "import", str(path))
    assert code == 1 and "line 3: updated_at_ms must be" in answer["error"], answer
    assert admin_store.get_player(1) is None
