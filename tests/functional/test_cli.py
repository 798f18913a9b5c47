"""The admin command, every subcommand, through main(argv) as a sysadmin runs it."""

from __future__ import annotations

import datetime
import json
import os
import re
import stat
import subprocess
import time

import pytest

from authsvc.cli import command as cli
from authsvc.store import open_store
from authsvc.store.base import Player
from authsvc.tokens import mint_token
from tests import factories
from tests.support import free_port, hold_write_lock, skip_or_fail


@pytest.fixture
def run(monkeypatch, env, capsys):
    """run(*argv) -> (exit code, stdout, stderr), with the throwaway store and secret."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AUTHSVC_CONFIG", raising=False)

    def run(*argv):
        try:
            code = cli.main(list(argv))
        except SystemExit as e:  # argparse
            code = e.code
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def initialised(run):
    assert run("init")[0] == 0
    return run


def run_json(run, *argv):
    code, out, err = run(*argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_init_creates_store_and_keeps_an_existing_secret(run, env, secret_file):
    before = secret_file.read_bytes()
    first = run_json(run, "init")
    assert first["schema_version"] >= 1
    assert first["token_secret_created"] is False
    again = run_json(run, "init")
    assert again["schema_version_before"] == again["schema_version"] == first["schema_version"]
    assert secret_file.read_bytes() == before


def test_init_creates_a_0600_secret_if_none_exists(run, monkeypatch, tmp_path):
    path = tmp_path / "etc" / "token-secret"
    monkeypatch.setenv("AUTHSVC_TOKEN_SECRET_FILE", str(path))
    result = run_json(run, "init")
    assert result["token_secret_created"] is True
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    secret = path.read_text().strip()
    assert len(secret) == 64
    code, out, err = run("init")
    assert secret not in out + err and "exists, kept" in out


@pytest.mark.engine("sqlite")
def test_game_add_shows_key_once_and_stores_only_its_digest(initialised, env):
    result = run_json(initialised, "game", "add", "Chess")
    assert result["game_id"] == 1 and result["name"] == "Chess"
    with open(env["AUTHSVC_STORE"].removeprefix("sqlite://"), "rb") as f:
        assert result["api_key"].encode() not in f.read()
    listing = run_json(initialised, "game", "list")
    assert result["api_key"] not in json.dumps(listing)
    assert listing["games"][0]["name"] == "Chess" and len(listing["games"][0]["keys"]) == 1


def test_game_add_human_output_and_duplicate_name(initialised):
    code, out, _ = initialised("game", "add", "Chess")
    assert code == 0 and "shown only this once" in out
    code, out, err = initialised("game", "add", "Chess")
    assert code == 1 and out == "" and err == "authsvc: error: a game named 'Chess' exists\n"


def test_game_list_table(initialised):
    initialised("game", "add", "Go")
    initialised("game", "disable", "1")
    code, out, _ = initialised("game", "list")
    assert code == 0 and out.splitlines()[1].split() == ["1", "no", "1", "Go"]


def test_game_enable_disable(initialised, settings):
    initialised("game", "add", "Chess")
    assert run_json(initialised, "game", "disable", "1") == {"game_id": 1, "enabled": False}
    assert run_json(initialised, "game", "list")["games"][0]["enabled"] is False
    assert run_json(initialised, "game", "enable", "1") == {"game_id": 1, "enabled": True}
    code, _, err = initialised("game", "enable", "7")
    assert code == 1 and "no game 7" in err


def test_game_rotate_key_expires_older_keys(initialised):
    initialised("game", "add", "Chess")
    result = run_json(initialised, "game", "rotate-key", "1", "--old-key-ttl", "60")
    keys = run_json(initialised, "game", "list")["games"][0]["keys"]
    assert len(keys) == 2
    assert sorted(k["expires_at"] is None for k in keys) == [False, True]
    assert [k["expires_at"] for k in keys if k["expires_at"]] == [result["old_keys_expire_at"]]
    assert initialised("game", "rotate-key", "9")[0] == 1


def test_player_lifecycle(initialised):
    added = run_json(initialised, "player", "add", "42", "alice")
    assert added == {
        "user_id": 42,
        "username": "alice",
        "epoch": 0,
        "enabled": True,
        "updated_at": added["updated_at"],
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", added["updated_at"])
    assert run_json(initialised, "player", "rename", "42", "alicia")["username"] == "alicia"
    assert run_json(initialised, "player", "disable", "42")["enabled"] is False
    assert (
        run_json(initialised, "player", "show", "42")["enabled"] is False
    )  # stored, not only echoed
    assert run_json(initialised, "player", "enable", "42")["enabled"] is True
    assert run_json(initialised, "player", "show", "42")["enabled"] is True
    assert run_json(initialised, "player", "revoke", "42")["epoch"] == 1
    shown = run_json(initialised, "player", "show", "42")
    assert shown == {
        "user_id": 42,
        "username": "alicia",
        "epoch": 1,
        "enabled": True,
        "updated_at": shown["updated_at"],
    }
    assert shown["updated_at"] >= added["updated_at"]  # the revoke's time (RFC 3339 sorts as time)
    code, out, _ = initialised("player", "show", "42")
    assert code == 0 and f", last changed {shown['updated_at']}" in out


def _records(run, *argv):
    code, out, err = run("audit", "--limit", "1000", "--json", *argv)
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def test_player_deleted_lists_the_ids_deleted_since_a_time(initialised, monkeypatch):
    """What a roll back to 0.1.0 deletes again (docs/operations.md section 9): read from the audit
    trail, page by page, each id once, and nothing written."""
    from authsvc.operations import players as players_ops

    monkeypatch.setattr(players_ops, "DELETED_PAGE", 2)  # several pages
    for user, name in ((1, "anna"), (2, "bert"), (3, "cleo"), (4, "dora")):
        run_json(initialised, "player", "add", str(user), name)
    run_json(initialised, "player", "delete", "2")
    first = _records(initialised, "--action", "player.delete")[0]["at_ms"]
    time.sleep(0.01)  # the next record's millisecond is later
    cut = datetime.datetime.fromtimestamp((first + 1) / 1000, datetime.UTC)
    for argv in (("delete", "4"), ("delete", "3"), ("add", "3", "cleo"), ("delete", "3")):
        initialised("player", *argv)
    records = len(_records(initialised))
    assert initialised("player", "deleted", "--since", cut.isoformat()) == (0, "3\n4\n", "")
    assert initialised("player", "deleted", "--since", "1d") == (0, "2\n3\n4\n", "")
    assert run_json(initialised, "player", "deleted", "--since", "2999-01-01") == {
        "since": "2999-01-01T00:00:00.000Z",
        "user_ids": [],
    }
    assert initialised("player", "deleted", "--since", "2999-01-01")[1] == "\n"
    assert len(_records(initialised)) == records
    code, _, err = initialised("player", "deleted")
    assert code == 2 and "--since" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (("player", "add", "42", "bob"), "player 42 exists"),
        (("player", "rename", "7", "x"), "no player 7"),
        (("player", "revoke", "7"), "no player 7"),
        (("player", "disable", "7"), "no player 7"),
        (("player", "show", "7"), "no player 7"),
        (("player", "add", "8", " padded"), "white space"),
        (("player", "add", "8", "a\x07b"), "U+0007 at position 2"),
        (("player", "add", "8", "x" * 256), "at most 255"),
    ],
)
def test_player_errors_are_one_line(initialised, argv, message):
    initialised("player", "add", "42", "alice")
    code, out, err = initialised(*argv)
    assert code == 1 and out == "" and message in err and err.count("\n") == 1


@pytest.mark.parametrize("user_id", ["0", "-1", "07", "x", "9223372036854775808"])
def test_bad_user_id_is_a_usage_error(initialised, user_id):
    code, _, err = initialised("player", "add", user_id, "x")
    assert code == 2 and "user id must be a whole number" in err and err.count("\n") == 1


def test_json_errors_are_one_object_on_stdout(initialised):
    code, out, err = initialised("player", "show", "7", "--json")
    assert code == 1 and json.loads(out) == {"error": "no player 7"} and "no player 7" in err


@pytest.mark.engine("sqlite")
def test_commands_before_init_say_so(run):
    code, _, err = run("game", "list")
    assert code == 1 and "authsvc init" in err and err.count("\n") == 1


def test_token_issue_mints_the_current_token(initialised, settings):
    initialised("game", "add", "Chess")
    initialised("player", "add", "42", "alice")
    token = run_json(initialised, "token", "issue", "--game", "1", "--user", "42")[
        "game_auth_token"
    ]
    assert token == mint_token(settings.token_secrets[0], 1, 42, 0)
    initialised("player", "revoke", "42")
    code, out, _ = initialised("token", "issue", "--game", "1", "--user", "42")
    assert code == 0 and out.strip() == mint_token(settings.token_secrets[0], 1, 42, 1)
    assert initialised("token", "issue", "--game", "2", "--user", "42")[0] == 1
    assert initialised("token", "issue", "--game", "1", "--user", "43")[0] == 1


def test_token_issue_refuses_what_the_admin_api_refuses(initialised):
    """One rule for both front doors (the operations layer's mint): a disabled player or game gets
    no token."""
    initialised("game", "add", "Chess")
    initialised("player", "add", "42", "alice")
    initialised("player", "disable", "42")
    code, out, err = initialised("token", "issue", "--game", "1", "--user", "42")
    assert (code, out) == (1, "") and err == "authsvc: error: no enabled player 42\n"
    initialised("player", "enable", "42")
    initialised("game", "disable", "1")
    code, out, err = initialised("token", "issue", "--game", "1", "--user", "42")
    assert (code, out) == (1, "") and err == "authsvc: error: no enabled game 1\n"


def test_token_issue_without_a_secret_says_so(initialised, monkeypatch, tmp_path):
    monkeypatch.setenv("AUTHSVC_TOKEN_SECRET_FILE", str(tmp_path / "absent"))
    code, _, err = initialised("token", "issue", "--game", "1", "--user", "42")
    assert code == 1 and "no token secret" in err


def players(settings):
    store = open_store(settings.store, readonly=True)
    try:
        return {
            p.user_id: p for p in store.dump() if isinstance(p, Player)
        }  # one read, not one per id
    finally:
        store.close()


def test_player_import_csv_with_header_is_an_idempotent_upsert(initialised, tmp_path, settings):
    initialised("player", "add", "2", "old-name")
    initialised("player", "revoke", "2")
    path = tmp_path / "players.csv"
    rows = "".join(f"{i},player{i}\n" for i in range(1, 25_001))  # more than one batch
    path.write_text("user_id,username\n" + rows + '3,"quoted, name"\n')
    assert run_json(initialised, "player", "import", str(path))["rows"] == 25_001
    assert run_json(initialised, "player", "import", str(path))["rows"] == 25_001
    found = players(settings)
    assert len(found) == 25_000
    assert found[2].username == "player2" and found[2].epoch == 1  # renamed, epoch kept
    assert found[3].username == "quoted, name"


def test_player_import_json_lines(initialised, tmp_path, settings):
    path = tmp_path / "players.jsonl"
    path.write_text('{"user_id": 5, "username": "e"}\n\n{"user_id": "6", "username": "f"}\n')
    assert run_json(initialised, "player", "import", str(path))["rows"] == 2
    assert players(settings)[6].username == "f"


@pytest.mark.parametrize(
    "content, line, reason",
    [
        ("1,a\n2,b\n0,c\n", 3, "user_id"),
        ("1,a\n2\n", 2, "expected 2 fields"),
        ("1,a\n2,b,c\n", 2, "expected 2 fields"),
        ("1,a\n2, b\n", 2, "white space"),
        ('{"user_id": 1, "username": "a"}\n{"user_id": 2}\n', 2, "needs the fields"),
        ('{"user_id": 1, "username": "a"}\n{broken\n', 2, "not a JSON object"),
        ('{"user_id": true, "username": "a"}\n', 1, "user_id"),
    ],
)
def test_player_import_bad_row_names_its_line_and_writes_nothing(
    initialised, tmp_path, settings, content, line, reason
):
    path = tmp_path / "bad"
    path.write_text(content)
    code, out, err = initialised("player", "import", str(path))
    assert code == 1 and f"line {line}" in err and reason in err and err.count("\n") == 1
    assert players(settings) == {}


def test_player_import_missing_or_non_utf8_file(initialised, tmp_path):
    assert "cannot read" in initialised("player", "import", str(tmp_path / "absent"))[2]
    path = tmp_path / "latin1.csv"
    path.write_bytes(b"1,Zo\xeb\n")
    code, _, err = initialised("player", "import", str(path))
    assert code == 1 and "not UTF-8" in err


def test_progress_bar_draws_on_stderr(capsys):
    bar = cli.ProgressBar(200)
    bar(100)
    bar.done(199)
    err = capsys.readouterr().err
    assert "50% 100/200" in err and err.endswith("100% 199/199\n")


def test_store_url_password_is_redacted():
    assert (
        cli.redact_url("postgresql://owner:s3cret@db/authsvc")
        == "postgresql://owner:***@db/authsvc"
    )
    assert (
        cli.redact_url("sqlite:///var/lib/authsvc/authsvc.db")
        == "sqlite:///var/lib/authsvc/authsvc.db"
    )


COMMANDS = {
    (): [
        "init",
        "game",
        "player",
        "export",
        "import",
        "backup",
        "restore",
        "token",
        "audit",
        "api-token",
        "webhook",
        "secret",
        "setup",
        "check",
        "explain",
        "heartbeat",
        "deliver",
    ],
    ("api-token",): ["add", "list", "revoke"],
    ("secret",): ["rotate", "retire", "list"],
    ("webhook",): ["add", "list", "remove", "deliveries", "retry"],
    ("game",): ["add", "list", "enable", "disable", "rotate-key"],
    ("player",): [
        "add",
        "show",
        "rename",
        "enable",
        "disable",
        "revoke",
        "delete",
        "deleted",
        "import",
    ],
    ("token",): ["issue"],
    ("audit",): ["verify", "prune"],
}


def listed_subcommands(help_text: str) -> list[str]:
    """The names argparse lists under COMMAND or ACTION (four spaces in, then the name)."""
    section = help_text.split("positional arguments:", 1)[1].split("options:", 1)[0]
    return [
        line.split()[0]
        for line in section.splitlines()
        if line.startswith("    ") and not line.startswith("     ")
    ]


@pytest.mark.engine("sqlite")  # help needs no store
@pytest.mark.parametrize(
    "parents", list(COMMANDS), ids=lambda parents: " ".join(parents) or "authsvc"
)
def test_help_lists_every_command_in_order(run, parents):
    code, out, _ = run(*parents, "--help")
    assert code == 0
    assert listed_subcommands(out) == COMMANDS[parents]


@pytest.mark.engine("sqlite")
@pytest.mark.parametrize(
    "argv",
    [(name,) for name in COMMANDS[()] if (name,) not in COMMANDS]
    + [
        (group, action)
        for group in ("game", "player", "token", "api-token", "secret")
        for action in COMMANDS[(group,)]
    ],
)
def test_every_command_has_its_own_help(run, argv):
    """`authsvc export --help`, `authsvc import --help`, `authsvc check --help`, ...: usage and the
    options they take."""
    code, out, err = run(*argv, "--help")
    assert code == 0 and err == ""
    assert out.startswith(f"usage: authsvc {' '.join(argv)} ")
    assert "--json" in out  # every command can answer in JSON
    if argv in (("export",), ("import",), ("backup",), ("restore",)):
        assert "positional arguments:\n  file" in out
    if argv == ("check",):
        for option in (
            "--base-url",
            "--game-id",
            "--user-id",
            "--api-key-file",
            "--token-file",
            "--resolve",
        ):
            assert option in out


# -- names that would lie on screen (docs/admin.md) ------------------------------------------

HIDDEN = ["\u202e", "\u200b", "\u2028", "\u2029", "\ufeff", "\u2066", "\u00ad", "\x1b", "\x07"]


def refused_in_one_line(code, out, err, char):
    code_point = f"U+{ord(char):04X}"
    assert code == 1 and out == "" and err.count("\n") == 1, err
    assert code_point in err and "position" in err
    assert char not in err  # the message never echoes the raw character


@pytest.mark.parametrize("char", HIDDEN)
def test_new_names_with_invisible_or_control_characters_are_refused(initialised, char):
    initialised("player", "add", "42", "alice")
    for argv in (
        ("player", "add", "43", f"bob{char}by"),
        ("player", "rename", "42", f"ali{char}ce"),
        ("game", "add", f"Ch{char}ess"),
        ("game", "add", char),
        ("game", "add", f"Chess{char}"),
    ):
        refused_in_one_line(*initialised(*argv), char)
    code, out, err = initialised("game", "add", char, "--json")
    assert code == 1 and "U+" in json.loads(out)["error"]
    assert run_json(initialised, "game", "list")["games"] == []
    assert run_json(initialised, "player", "show", "42")["username"] == "alice"


def test_a_name_of_only_a_zero_width_space_names_its_position(initialised):
    code, out, err = initialised("game", "add", "\u200b")
    assert code == 1 and "U+200B at position 1" in err


@pytest.mark.parametrize("char", ["\u202e", "\u2028", "\ufeff"])
@pytest.mark.parametrize(
    "template",
    ["1,a\n2,b{c}c\n", '{{"user_id": 1, "username": "a"}}\n{{"user_id": 2, "username": "b{c}"}}\n'],
)
def test_player_import_refuses_invisible_characters_with_the_line(
    initialised, tmp_path, settings, template, char
):
    path = tmp_path / "players"
    path.write_text(template.format(c=char), encoding="utf-8")
    code, out, err = initialised("player", "import", str(path))
    assert "line 2" in err
    refused_in_one_line(code, out, err, char)
    assert players(settings) == {}


def test_names_stored_before_are_escaped_in_text_output_and_exact_in_json(initialised, settings):
    store = open_store(settings.store, readonly=False, settings=settings)
    try:
        factories.add_game(store, "\u200b", "0" * 64, 1)
        factories.add_game(store, "Chess\u202eevil", "1" * 64, 1)
        factories.add_player(store, 42, "admin\u2066\u2028\ufeff")
    finally:
        store.close()
    code, out, _ = initialised("game", "list")
    assert code == 0 and "\\u200b" in out and "Chess\\u202eevil" in out
    code, out, _ = initialised("player", "show", "42")
    assert code == 0 and "admin\\u2066\\u2028\\ufeff," in out
    for char in "\u200b\u202e\u2066\u2028\ufeff":
        assert char not in initialised("game", "list")[1] + initialised("player", "show", "42")[1]
    assert run_json(initialised, "player", "show", "42")["username"] == "admin\u2066\u2028\ufeff"
    assert [g["name"] for g in run_json(initialised, "game", "list")["games"]] == [
        "\u200b",
        "Chess\u202eevil",
    ]


def test_ordinary_names_print_as_typed(initialised):
    for name in ("Zoë", "名前", "O'Brien & co", "😀 smile", "tab-less name"):
        code, out, err = initialised("player", "add", str(len(name) + 100), name)
        assert code == 0 and name in out, err


# -- failures the admin meets: one line, exit 1, {"error": ...} with --json (docs/admin.md) ----


def fails_in_one_line(run, *argv, expect: str) -> str:
    """The command fails with one line on stderr and exit 1, with and without --json; returns the
    message."""
    code, out, err = run(*argv)
    assert (
        code == 1 and out == "" and err.startswith("authsvc: error: ") and err.count("\n") == 1
    ), (code, out, err)
    assert expect in err and "Traceback" not in err
    code, out, err = run(*argv, "--json")
    assert code == 1 and err.count("\n") == 1, (code, out, err)
    assert json.loads(out) == {"error": err.removeprefix("authsvc: error: ").rstrip("\n")}
    return err


def test_revoke_while_another_session_holds_the_write_lock(initialised, settings, monkeypatch):
    """A revoke during a long import: it waits (30 s by default, shortened here), then says so and
    writes nothing."""
    from authsvc.store import base

    monkeypatch.setattr(base, "ADMIN_LOCK_WAIT", 0.3, raising=False)
    initialised("player", "add", "42", "alice")
    release = hold_write_lock(settings.store, 42)
    try:
        err = fails_in_one_line(initialised, "player", "revoke", "42", expect="lock")
        assert "try again" in err
    finally:
        release()
    assert run_json(initialised, "player", "show", "42")["epoch"] == 0
    assert run_json(initialised, "player", "revoke", "42")["epoch"] == 1


@pytest.fixture
def tiny_disk(tmp_path):
    """A 512 KiB tmpfs, so SQLite meets a really full disk (needs root, as in the CI container):
    room for a new store (its file, -wal and -shm: about 260 KiB) and one player, not for an import
    of 1 MB."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        skip_or_fail(f"cannot mount a tmpfs (root needed): {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.mark.engine("sqlite")
def test_a_full_disk_is_one_line_and_writes_nothing(
    run, monkeypatch, tiny_disk, tmp_path, settings
):
    monkeypatch.setenv("AUTHSVC_STORE", "sqlite://" + str(tiny_disk / "authsvc.db"))
    assert run("init")[0] == 0
    assert run("player", "add", "1", "one")[0] == 0
    path = tmp_path / "players.csv"
    path.write_text("".join(f"{i},{'x' * 200}{i}\n" for i in range(2, 5_002)))  # about 1 MB of rows
    fails_in_one_line(run, "player", "import", str(path), expect="full")
    assert run_json(run, "player", "show", "1")["username"] == "one"
    fails_in_one_line(run, "player", "show", "2", expect="no player 2")


@pytest.mark.parametrize("ttl", ["99999999999999999999", "9223372036854775807", "315360001"])
def test_rotate_key_with_an_old_key_ttl_out_of_range(initialised, ttl):
    initialised("game", "add", "Chess")
    fails_in_one_line(
        initialised, "game", "rotate-key", "1", "--old-key-ttl", ttl, expect="--old-key-ttl"
    )
    assert len(run_json(initialised, "game", "list")["games"][0]["keys"]) == 1


@pytest.mark.parametrize(
    "content, expect",
    [
        ("1,a\n2," + "b" * 140_000 + "\n", "line 2: "),  # over csv.field_size_limit() (131,072)
        ('{"user_id": 1, "username": "a"}\n' + "[" * 100_000 + "\n", "line 2: not a JSON object"),
        (
            '{"user_id": 1, "username": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
            "line 1: not a JSON object",
        ),
    ],
    ids=["csv-field-over-131072", "deeply-nested-json", "deeply-nested-json-value"],
)
def test_player_import_of_a_huge_field_or_deep_json_is_one_line(
    initialised, tmp_path, settings, content, expect
):
    path = tmp_path / "players"
    path.write_text(content)
    fails_in_one_line(initialised, "player", "import", str(path), expect=expect)
    assert players(settings) == {}


@pytest.mark.engine("sqlite")
def test_check_with_a_missing_sqlite_file_says_run_init(run, tmp_path):
    key = tmp_path / "key"
    key.write_text("x" * 40)
    argv = (
        "check",
        "--base-url",
        "http://127.0.0.1:9",
        "--game-id",
        "1",
        "--user-id",
        "42",
        "--api-key-file",
        str(key),
    )
    fails_in_one_line(run, *argv, expect="authsvc init")


@pytest.mark.engine("sqlite")
def test_check_returns_exit_status_1_with_its_whole_report(
    monkeypatch, env, world, tmp_path, capsys
):
    """`authsvc check` returns its status to main() like every command (no SystemExit), report
    printed."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AUTHSVC_CONFIG", raising=False)
    key = tmp_path / "key"
    key.write_text(world.api_key + "\n")
    argv = [
        "check",
        "--base-url",
        "http://127.0.0.1:9",
        "--game-id",
        str(world.game_id),
        "--user-id",
        str(world.user_id),
        "--api-key-file",
        str(key),
        "--timeout",
        "5",
    ]
    assert cli.main([*argv, "--json"]) == 1  # nothing listens on port 9: every case fails
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and [r["ok"] for r in report["results"]] == [False] * 4
    assert cli.main(argv) == 1
    assert "4 of 4 checks FAILED" in capsys.readouterr().out
    argv[argv.index("--user-id") + 1] = (
        "99"  # the token is minted from the store: the same helper as token issue
    )
    assert cli.main(argv) == 1
    assert capsys.readouterr().err == "authsvc: error: no player 99\n"


# -- the store down, or refusing: exit 1 either way, and the line says which (docs/admin.md)
# --------


@pytest.fixture
def run_on(monkeypatch, capsys, secret_file):
    """run_on(store_url) -> run(*argv) as the ``run`` fixture, on that store."""

    def run_on(store_url: str):
        monkeypatch.setenv("AUTHSVC_STORE", store_url)
        monkeypatch.setenv("AUTHSVC_TOKEN_SECRET_FILE", str(secret_file))
        monkeypatch.setenv("AUTHSVC_PG_CONNECT_TIMEOUT", "2")
        monkeypatch.delenv("AUTHSVC_CONFIG", raising=False)

        def run(*argv):
            code = cli.main(list(argv))
            out, err = capsys.readouterr()
            return code, out, err

        return run

    return run_on


STORE_COMMANDS = [
    ("init",),
    ("game", "list"),
    ("game", "add", "Chess"),
    ("player", "show", "42"),
    ("player", "add", "42", "alice"),
    ("player", "revoke", "42"),
    ("player", "delete", "42"),
    ("token", "issue", "--game", "1", "--user", "42"),
]


@pytest.mark.parametrize("argv", STORE_COMMANDS, ids=" ".join)
def test_a_store_that_is_down_is_one_line_and_exit_1(run_on, argv, tmp_path):
    """Nothing listens on the port: an outage, said as one (never "run 'authsvc init'"), exit 1."""
    run = run_on(f"postgresql://owner:Sup3rS3cret@127.0.0.1:{free_port()}/authsvc")
    err = fails_in_one_line(run, *argv, expect="Connection refused")
    assert err.startswith("authsvc: error: postgresql store postgresql://owner:***@127.0.0.1:"), err
    assert "Sup3rS3cret" not in err and "authsvc init" not in err and "refuses" not in err
    if argv != ("init",):  # init migrates without the start-up check first
        assert "is unreachable" in err, err


@pytest.mark.parametrize("argv", STORE_COMMANDS, ids=" ".join)
def test_a_store_that_refuses_the_connection_is_not_called_unreachable(run_on, argv, pg_server_url):
    """The server answers and refuses the database: the settings' fault, exit 1, and the line says
    so."""
    run = run_on(pg_server_url.rsplit("/", 1)[0] + "/authsvc_no_such_database")
    err = fails_in_one_line(run, *argv, expect='database "authsvc_no_such_database" does not exist')
    assert "unreachable" not in err, err


def test_export_with_the_store_down_writes_no_file(run_on, tmp_path):
    run = run_on(f"postgresql://owner@127.0.0.1:{free_port()}/authsvc")
    fails_in_one_line(run, "export", str(tmp_path / "export.jsonl"), expect="is unreachable")
    assert not (tmp_path / "export.jsonl").exists()
