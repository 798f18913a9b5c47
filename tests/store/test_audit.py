"""The audit trail (docs/admin.md, "The audit trail"), on both engines, through the admin command.

Each change writes exactly one record, with the actor, the target and the state
before and after, in the change's own transaction: a refused write, a record that
cannot be written, and an import killed half-way leave neither change nor record.
`authsvc audit verify` names a record edited, deleted or inserted; no secret ever
reaches a record; on PostgreSQL the admin role may only read and append it, and
the web role may not read it.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from authsvc.cli import command as cli
from authsvc.settings import admin_actor
from authsvc.store.audit import COLUMNS, GENESIS, Record, record_hash
from tests.support import init_as_owner, store_sql

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "postgres"


@pytest.fixture
def run(command_as_alice):
    return command_as_alice


@pytest.fixture
def world(run):
    """A store with game 1 (Chess) and player 42 (carol)."""
    assert run("init")[0] == 0
    assert run("game", "add", "Chess")[0] == 0
    assert run("player", "add", "42", "carol")[0] == 0
    return run


sql = store_sql


def records(store_url: str) -> list[Record]:
    """The records as stored, each with the clear values kept beside it (a player's are sealed in
    the chain)."""
    names = "(SELECT n.names FROM audit_names AS n WHERE n.record_id = audit.id)"
    return [
        Record(*row)
        for row in sql(store_url, f"SELECT {', '.join(COLUMNS)}, {names} FROM audit ORDER BY id")
    ]


def new_records(store_url: str, since: int) -> list[Record]:
    return [r for r in records(store_url) if r.id > since]


def head(store_url: str) -> int:
    return sql(store_url, "SELECT head_id FROM audit_chain")[0][0]


def changes(record: Record) -> tuple[dict, dict]:
    """Its before and after as the trail shows them: a sealed username as the name kept beside the
    record."""
    c = record.shown_changes()
    return c["before"], c["after"]


# -- one record per change ---------------------------------------------------------------------

CAROL = {"username": "carol", "enabled": True, "epoch": 0}
CHESS = {"name": "Chess", "enabled": True, "keys": 1, "keys_never_expiring": 1}

ACTIONS = [
    (["game", "add", "Go"], "game.add", (2, None), {}, {"name": "Go", "enabled": True, "keys": 1}),
    (["game", "disable", "1"], "game.disable", (1, None), CHESS, CHESS | {"enabled": False}),
    (["game", "enable", "1"], "game.enable", (1, None), CHESS, CHESS),
    (
        ["game", "rotate-key", "1", "--old-key-ttl", "60"],
        "game.rotate_key",
        (1, None),
        CHESS,
        {"keys": 2, "keys_never_expiring": 1},
    ),
    (
        ["player", "add", "43", "dave"],
        "player.add",
        (None, 43),
        {},
        {"username": "dave", "enabled": True, "epoch": 0},
    ),
    (
        ["player", "rename", "42", "erin"],
        "player.rename",
        (None, 42),
        CAROL,
        CAROL | {"username": "erin"},
    ),
    (["player", "disable", "42"], "player.disable", (None, 42), CAROL, CAROL | {"enabled": False}),
    (["player", "enable", "42"], "player.enable", (None, 42), CAROL, CAROL),
    (["player", "revoke", "42"], "player.revoke", (None, 42), CAROL, CAROL | {"epoch": 1}),
    (["token", "issue", "--game", "1", "--user", "42"], "token.mint", (1, 42), {}, {"epoch": 0}),
]


@pytest.mark.parametrize(
    "argv, action, target, before, after", ACTIONS, ids=[a[1] for a in ACTIONS]
)
def test_each_change_writes_one_record_with_actor_target_before_and_after(
    world, store_url, argv, action, target, before, after
):
    start = head(store_url)
    code, out, err = world(*argv)
    assert code == 0, err
    (record,) = new_records(store_url, start)
    assert (record.action, record.actor, record.request_id) == (action, "cli:alice", None)
    assert (record.game_id, record.user_id) == target
    got_before, got_after = changes(record)
    assert got_before == before
    assert got_after.items() >= after.items()
    assert abs(record.at_ms / 1000 - time.time()) < 3600  # milliseconds of this hour, not seconds
    assert head(store_url) == record.id


def test_a_player_import_writes_one_record_for_the_batch(world, store_url, tmp_path):
    data = b"user_id,username\n42,frank\n7,grace\n8,heidi\n"
    path = tmp_path / "players.csv"
    path.write_bytes(data)
    start = head(store_url)
    assert world("player", "import", str(path))[0] == 0
    (record,) = new_records(store_url, start)
    assert (record.action, record.actor, record.game_id, record.user_id) == (
        "player.import",
        "cli:alice",
        None,
        None,
    )
    assert changes(record) == ({}, {"rows": 3, "file_sha256": hashlib.sha256(data).hexdigest()})


def test_a_store_import_writes_one_record(world, store_url, tmp_path, monkeypatch):
    export = tmp_path / "export.jsonl"
    assert world("export", str(export))[0] == 0
    monkeypatch.setenv("AUTHSVC_STORE", "sqlite://" + str(tmp_path / "moved.db"))
    assert world("init")[0] == 0
    assert world("import", str(export))[0] == 0
    moved = "sqlite://" + str(tmp_path / "moved.db")
    (record,) = records(moved)
    assert (record.action, record.actor, record.prev_hash) == ("store.import", "cli:alice", GENESIS)
    assert changes(record) == (
        {},
        {"games": 1, "players": 1, "file_sha256": hashlib.sha256(export.read_bytes()).hexdigest()},
    )


def test_the_actor_is_the_sudo_user_else_the_login_name():
    import pwd

    assert admin_actor({"SUDO_USER": "alice", "USER": "root"}) == "cli:alice"
    assert (
        admin_actor({"USER": "mallory", "LOGNAME": "mallory"})
        == "cli:" + pwd.getpwuid(os.getuid()).pw_name
    )


# -- no change, no record; no record, no change -------------------------------------------------

REFUSED = [
    (["player", "add", "42", "zoe"], "player 42 exists"),
    (["player", "rename", "999", "zoe"], "no player 999"),
    (["player", "revoke", "999"], "no player 999"),
    (["player", "disable", "999"], "no player 999"),
    (["game", "add", "Chess"], "a game named 'Chess' exists"),
    (["game", "disable", "999"], "no game 999"),
    (["game", "rotate-key", "999"], "no game 999"),
    (["game", "rotate-key", "1", "--old-key-ttl", "999999999999"], "--old-key-ttl must be from 0"),
    (["player", "rename", "42", " zoe"], "must not be empty or start or end with white space"),
    (["token", "issue", "--game", "1", "--user", "999"], "no enabled player 999"),
]


@pytest.mark.parametrize(
    "argv, message", REFUSED, ids=[" ".join(a[0][:2]) + f"-{i}" for i, a in enumerate(REFUSED)]
)
def test_a_refused_write_writes_no_record(world, store_url, argv, message):
    before = records(store_url)
    code, out, err = world(*argv)
    assert code == 1 and message in err and err.count("\n") == 1
    assert records(store_url) == before


def test_a_bad_import_row_writes_neither_players_nor_a_record(world, store_url, tmp_path):
    path = tmp_path / "players.csv"
    path.write_text("1,ok\n2,\u202ebad\n")
    before = records(store_url)
    assert world("player", "import", str(path))[0] == 1
    assert records(store_url) == before
    assert sql(store_url, "SELECT count(*) FROM players")[0][0] == 1


def test_a_record_that_cannot_be_written_undoes_the_change(world, store_url):
    """The change and its record are one transaction: make the record's INSERT fail, and the rename
    is gone."""
    if store_url.startswith("sqlite://"):
        sql(
            store_url,
            "CREATE TRIGGER no_audit BEFORE INSERT ON audit BEGIN SELECT RAISE(ABORT, 'no audit'); "
            "END",
        )
    else:
        sql(
            store_url,
            "CREATE FUNCTION no_audit() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'no audit' USING ERRCODE = 'insufficient_privilege'; END $$",
        )
        sql(
            store_url,
            "CREATE TRIGGER no_audit BEFORE INSERT ON audit FOR EACH ROW EXECUTE FUNCTION "
            "no_audit()",
        )
    try:
        code, _, err = world("player", "rename", "42", "mallory")
        assert code == 1 and ("no audit" in err or "permission denied" in err), err
        assert sql(store_url, "SELECT username FROM players WHERE user_id = 42") == [("carol",)]
    finally:
        sql(
            store_url,
            "DROP TRIGGER no_audit" + ("" if store_url.startswith("sqlite://") else " ON audit"),
        )
        if not store_url.startswith("sqlite://"):
            sql(store_url, "DROP FUNCTION no_audit()")


def _rows_written(store_url: str, path: str) -> int:
    """About how many rows the import has written in its open transaction (0: not writing yet):
    SQLite: the -wal file's growth in bytes; PostgreSQL: the rows its COPY has taken."""
    if store_url.startswith("sqlite://"):
        try:
            return os.path.getsize(path + "-wal")
        except FileNotFoundError:
            return 0
    rows = sql(
        store_url,
        "SELECT coalesce(sum(tuples_processed), 0) FROM pg_stat_progress_copy "
        "WHERE datname = current_database()",
    )
    return rows[0][0]


def test_an_import_killed_half_way_leaves_neither_players_nor_a_record(
    world, store_url, env, tmp_path
):
    big = tmp_path / "players.csv"
    with open(big, "w") as f:
        f.writelines(f"{n},player{n}\n" for n in range(1000, 1_501_000))
    before = records(store_url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "authsvc.cli.command", "player", "import", str(big)],
        env={**os.environ, **env, "SUDO_USER": "alice"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    path = store_url.removeprefix("sqlite://")
    enough = (
        (2 << 20) + _rows_written(store_url, path) if store_url.startswith("sqlite://") else 200_000
    )
    try:
        deadline = time.monotonic() + 120
        while (
            _rows_written(store_url, path) < enough
        ):  # several batches of rows written, none committed
            assert proc.poll() is None, "the import ended before it was seen writing"
            assert time.monotonic() < deadline, "the import never started writing"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    if not store_url.startswith("sqlite://"):  # the server ends the dead client's transaction
        deadline = time.monotonic() + 30
        while (
            sql(
                store_url,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name = 'authsvc-admin'",
            )[0][0]
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
    assert sql(store_url, "SELECT count(*) FROM players")[0][0] == 1
    assert records(store_url) == before
    assert world("audit", "verify")[0] == 0


# -- the chain ----------------------------------------------------------------------------------


def test_verify_passes_an_intact_chain(world, store_url):
    world("player", "revoke", "42")
    world("game", "disable", "1")
    code, out, _ = world("audit", "verify")
    assert (code, out) == (0, "4 records, chain intact from id 1\n")
    verdict = json.loads(world("audit", "verify", "--json")[1])
    last = records(store_url)[-1]
    assert verdict == {
        "records": 4,
        "first_id": 1,
        "head_id": 4,
        "head_hash": last.hash,
        "problem": None,
        "record_id": None,
        "intact": True,
    }


def _forge(store_url: str, **fields) -> None:
    """A record inserted with SQL, its hash computed as authsvc would."""
    fields["hash"] = record_hash({k: fields[k] for k in COLUMNS if k != "hash"})
    sql(
        store_url,
        f"INSERT INTO audit ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
        tuple(fields[k] for k in COLUMNS),
    )


def _rehash(store_url: str, record_id: int) -> None:
    (r,) = [r for r in records(store_url) if r.id == record_id]
    sql(store_url, "UPDATE audit SET hash = ? WHERE id = ?", (r.computed_hash(), record_id))


TAMPERING = {
    "edited": (
        lambda url: sql(url, "UPDATE audit SET actor = 'cli:bob' WHERE id = 2"),
        "record 2 was altered",
    ),
    "edited-and-rehashed": (
        lambda url: (sql(url, "UPDATE audit SET changes = '{}' WHERE id = 2"), _rehash(url, 2)),
        "record 3 does not follow record 2",
    ),
    "deleted": (lambda url: sql(url, "DELETE FROM audit WHERE id = 2"), "record 2 was removed"),
    "deleted-last": (
        lambda url: sql(url, "DELETE FROM audit WHERE id = 4"),
        "record 4 was removed",
    ),
    "inserted": (
        lambda url: _forge(
            url,
            id=5,
            at_ms=0,
            actor="cli:alice",
            request_id=None,
            action="player.revoke",
            game_id=None,
            user_id=42,
            changes="{}",
            prev_hash=records(url)[-1].hash,
        ),
        "record 5 was inserted",
    ),
    "inserted-out-of-order": (
        lambda url: (
            sql(url, "DELETE FROM audit WHERE id = 3"),
            _forge(
                url,
                id=3,
                at_ms=0,
                actor="cli:alice",
                request_id=None,
                action="player.enable",
                game_id=None,
                user_id=42,
                changes="{}",
                prev_hash=GENESIS,
            ),
        ),
        "record 3 does not follow record 2",
    ),
}


@pytest.mark.parametrize("how", list(TAMPERING))
def test_verify_names_the_record_edited_deleted_or_inserted(world, store_url, how):
    world("player", "revoke", "42")
    world("game", "disable", "1")  # records 1 to 4
    tamper, message = TAMPERING[how]
    tamper(store_url)
    code, out, err = world("audit", "verify")
    assert code == 1, out
    assert message in out, out
    assert out.count("\n") == 1
    verdict = json.loads(world("audit", "verify", "--json")[1])
    assert verdict["intact"] is False and message in verdict["problem"]
    assert str(verdict["record_id"]) in message


def test_prune_keeps_the_chain_verifiable_from_its_new_start(world, store_url, monkeypatch):
    world("player", "revoke", "42")
    world("game", "disable", "1")  # records 1 to 4
    code, out, err = world("audit", "prune")
    assert code == 1 and "give --before TIME, or set AUTHSVC_AUDIT_RETENTION_DAYS" in err
    monkeypatch.setenv("AUTHSVC_AUDIT_RETENTION_DAYS", "30")
    assert "pruned 0 audit records" in world("audit", "prune")[1]  # every record is younger
    assert world("audit", "prune", "--before", "0m")[0] == 0
    assert [r.id for r in records(store_url)] == [6] and records(store_url)[
        0
    ].action == "audit.prune"
    world("player", "revoke", "42")
    assert world("audit", "verify")[1] == "2 records, chain intact from id 6\n"
    assert world("audit", "prune", "--before", "2999-01-01")[0] == 1  # not in the future
    # A start moved by hand (records deleted and the anchor set to match) is named by no prune
    # record.
    (r6,) = [r for r in records(store_url) if r.id == 6]
    sql(store_url, "DELETE FROM audit WHERE id = 6")
    sql(store_url, "UPDATE audit_chain SET anchor_id = 6, anchor_hash = ?", (r6.hash,))
    code, out, _ = world("audit", "verify")
    assert code == 1 and "no prune record names that start" in out


# -- reading ------------------------------------------------------------------------------------


def test_audit_lists_newest_first_with_filters_and_json_lines(world, store_url):
    world("player", "rename", "42", "d\u202eave")  # stored before the name rule? refused now
    sql(
        store_url, "UPDATE players SET username = 'd' || ? || 'ave' WHERE user_id = 42", ("\u202e",)
    )
    world("player", "rename", "42", "erin")
    world("game", "disable", "1")
    code, out, _ = world("audit")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 4
    assert [line.split()[0] for line in lines] == ["4", "3", "2", "1"]
    assert "cli:alice  game.disable  game 1  enabled: true -> false" in lines[0]
    assert (
        "player.rename  player 42  username: d\\u202eave -> erin" in lines[1]
    )  # escaped, as admin.md shows names
    assert "\u202e" not in out
    world("game", "rotate-key", "1", "--old-key-ttl", "0")
    line = world("audit", "--limit", "1")[1]
    assert "game.rotate_key  game 1  keys: 1 -> 2, old_keys_expire_at=20" in line and line.endswith(
        "Z\n"
    )
    out = world("audit", "--player", "42", "--json")[1]
    objs = [json.loads(line) for line in out.splitlines()]
    assert [o["action"] for o in objs] == ["player.rename", "player.add"]
    assert objs[0]["changes"]["after"]["username"] == "erin"
    assert world("audit", "--action", "game.add", "--json")[1].count("\n") == 1
    assert world("audit", "--actor", "cli:bob")[1] == "no audit records match\n"
    assert world("audit", "--since", "2999-01-01")[1] == "no audit records match\n"
    assert len(world("audit", "--since", "1h", "--limit", "2")[1].splitlines()) == 2
    code, _, err = world("audit", "--since", "yesterday")
    assert code == 1 and "a time must be a date" in err


# -- no secrets ---------------------------------------------------------------------------------


def test_no_secret_reaches_any_record(world, store_url, tmp_path, secret_file, monkeypatch):
    secrets = [secret_file.read_text().strip()]
    out = json.loads(world("game", "add", "Go", "--json")[1])
    secrets.append(out["api_key"])
    out = json.loads(world("game", "rotate-key", "1", "--json")[1])
    secrets.append(out["api_key"])
    secrets.append(world("token", "issue", "--game", "1", "--user", "42")[1].strip())
    secrets.append(world("token", "issue", "--game", "2", "--user", "42")[1].strip())
    path = tmp_path / "p.csv"
    path.write_text("7,grace\n")
    for argv in (
        ["player", "import", str(path)],
        ["player", "rename", "42", "x"],
        ["player", "revoke", "42"],
        ["player", "disable", "42"],
        ["game", "disable", "2"],
        ["audit", "prune", "--before", "1h"],
    ):
        assert world(*argv)[0] == 0
    digests = [row[0] for row in sql(store_url, "SELECT digest FROM api_keys")]
    assert len(digests) == 3
    everything = json.dumps(sql(store_url, "SELECT * FROM audit")) + json.dumps(
        sql(store_url, "SELECT * FROM audit_chain")
    )
    assert len(records(store_url)) == 12  # one per change above, a prune and three mints included
    for secret in secrets + digests:
        assert secret and secret not in everything
        assert hashlib.sha256(secret.encode()).hexdigest() not in everything


# -- PostgreSQL roles ---------------------------------------------------------------------------


def test_the_admin_role_may_only_read_and_append_and_the_web_role_not_read(
    own_pg, secret_file, monkeypatch, capsys
):
    import psycopg

    monkeypatch.setenv("SUDO_USER", "alice")
    url = init_as_owner(
        own_pg, secret_file, monkeypatch
    )  # then every change of the everyday admin command
    for argv in (
        ["game", "add", "Chess"],
        ["player", "add", "5", "bob"],
        ["player", "revoke", "5"],
        ["game", "rotate-key", "1"],
        ["token", "issue", "--game", "1", "--user", "5"],
    ):
        assert cli.main(argv) == 0, capsys.readouterr().err
    assert cli.main(["audit", "verify"]) == 0
    assert capsys.readouterr().out.endswith("5 records, chain intact from id 1\n")
    assert cli.main(["audit", "prune", "--before", "0m"]) == 1
    assert "permission denied" in capsys.readouterr().err
    with psycopg.connect(url("authsvc_admin"), autocommit=True) as conn:
        for statement in (
            "UPDATE audit SET actor = 'x'",
            "DELETE FROM audit",
            "TRUNCATE audit",
            "UPDATE audit_chain SET anchor_id = 0",
            "DELETE FROM audit_chain",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    with psycopg.connect(url("authsvc_web"), autocommit=True) as conn:
        for table in ("audit", "audit_chain"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT * FROM {table}")
    monkeypatch.setenv("AUTHSVC_STORE", url("authsvc_owner"))  # pruning is the owner's
    assert cli.main(["audit", "prune", "--before", "0m"]) == 0
    assert cli.main(["audit", "verify"]) == 0
    assert capsys.readouterr().out.endswith("1 records, chain intact from id 6\n")


# -- the operations layer: typed errors for every front door -------------------------------------


def test_operations_raise_typed_errors_and_record_the_context(world, store_url, settings):
    from authsvc.errors import Conflict, Error, Invalid, NotFound
    from authsvc.operations import games as games_ops
    from authsvc.operations import players as players_ops
    from authsvc.operations.context import Context, admin_store

    ctx = Context(actor="api:provisioning", request_id="req-7", clock=lambda: 1_800_000_000.25)
    with admin_store(settings) as store:
        for call, error in [
            (lambda: players_ops.revoke_player(store, ctx, 999), NotFound),
            (lambda: games_ops.set_game_enabled(store, ctx, 999, False), NotFound),
            (lambda: players_ops.add_player(store, ctx, 42, "x"), Conflict),
            (lambda: games_ops.add_game(store, ctx, "Chess"), Conflict),
            (lambda: players_ops.add_player(store, ctx, 0, "x"), Invalid),
            (lambda: players_ops.add_player(store, ctx, 2**63, "x"), Invalid),
            (lambda: players_ops.rename_player(store, ctx, 42, "a\u200bb"), Invalid),
            (lambda: games_ops.rotate_game_key(store, ctx, 1, -1), Invalid),
            (lambda: players_ops.import_players(store, ctx, b"1,ok\nx,bad\n"), Invalid),
        ]:
            with pytest.raises(error) as raised:
                call()
            assert isinstance(raised.value, Error)  # the command prints it in one line, exit 1
        start = head(store_url)
        assert players_ops.revoke_player(store, ctx, 42) == 1
    (record,) = new_records(store_url, start)
    assert (record.actor, record.request_id, record.at_ms) == (
        "api:provisioning",
        "req-7",
        1_800_000_000_250,
    )
    with pytest.raises(Invalid):
        Context(actor="api:x\n")
    with pytest.raises(Invalid):
        Context(actor="api:x", request_id="r" * 201)


@pytest.mark.engine("sqlite")
def test_init_adds_the_trail_to_a_version_1_sqlite_store_and_keeps_its_data(run, store_url):
    from authsvc.store.sqlite.store import MIGRATIONS

    path = store_url.removeprefix("sqlite://")
    with sqlite3.connect(
        path, isolation_level=None
    ) as conn:  # the schema as the previous release left it
        conn.executescript(MIGRATIONS[0])
        conn.execute("INSERT INTO players (user_id, username) VALUES (42, 'carol')")
        conn.execute("PRAGMA user_version = 1")
    code, out, _ = run("init")
    assert code == 0 and f"schema version {len(MIGRATIONS)} (migrated from 1)" in out
    assert run("player", "revoke", "42")[0] == 0
    (record,) = records(store_url)
    assert (record.id, record.prev_hash, record.action) == (1, GENESIS, "player.revoke")
    assert run("audit", "verify")[1] == "1 records, chain intact from id 1\n"


def test_concurrent_writers_append_one_unbroken_chain(world, store_url, settings):
    """Appends are serialized (SQLite's write lock, PostgreSQL's row lock on audit_chain): two
    sessions changing players at once leave contiguous ids, each record linked to the one before."""
    import threading

    from authsvc.operations import players as players_ops
    from authsvc.operations.context import Context, admin_store

    world("player", "add", "43", "dave")
    errors = []

    def writer(user_id: int, actor: str) -> None:
        try:
            ctx = Context(actor=actor)
            with admin_store(settings) as store:
                for _ in range(25):
                    players_ops.revoke_player(store, ctx, user_id)
        except Exception as e:  # noqa: BLE001 - reported below with its type
            errors.append(repr(e))

    threads = [
        threading.Thread(target=writer, args=(42, "cli:one")),
        threading.Thread(target=writer, args=(43, "cli:two")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    rows = records(store_url)
    assert [r.id for r in rows] == list(range(1, 54))
    assert all(r.prev_hash == p.hash for p, r in zip(rows, rows[1:], strict=False))
    assert sql(store_url, "SELECT epoch FROM players ORDER BY user_id") == [(25,), (25,)]
    assert world("audit", "verify")[1] == "53 records, chain intact from id 1\n"
