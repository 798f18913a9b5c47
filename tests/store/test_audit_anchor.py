"""The audit chain's head anchored outside the store (docs/admin.md, "Anchoring the head in the
journal").

Each committed write that appended records logs the chain's new head, one line
(docs/logs.md, "The audit head line"): the admin command to the journal (stderr
here, where no journal socket is), the admin API to gunicorn's error log.
`authsvc audit verify --anchor FILE` checks the chain against those lines, so a
tail cut with the head row moved to match, which the chain alone cannot show, is
named; a prune leaves the older heads unneeded; a line that is not a head line as
authsvc writes it is refused, never a traceback.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import re
import signal
import socket
from pathlib import Path

import pytest

from authsvc.errors import Invalid
from authsvc.operations import api_tokens
from authsvc.operations.context import Context
from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.store.audit import COLUMNS, Record, canonical, record_hash
from tests import factories
from tests.support import admin_request, free_port, serve_gunicorn, store_sql

sql = store_sql
HEAD = re.compile(r"authsvc\.audit: head id=(\d+) hash=([0-9a-f]{64})$")
CONF = Path(__file__).resolve().parents[2] / "deploy" / "gunicorn.conf.py"


@pytest.fixture
def heads(tmp_path) -> Path:
    return tmp_path / "heads.log"


@pytest.fixture
def run(command_as_alice, monkeypatch, tmp_path, heads):
    """The admin command, with no journal socket: its head lines go to stderr, kept in ``heads``
    (as `journalctl -o cat` would give them)."""
    monkeypatch.setattr(
        "authsvc.cli.audit_cmd.JOURNAL_SOCKET", str(tmp_path / "no-journal"), raising=False
    )

    def run(*argv):
        code, out, err = command_as_alice(*argv)
        with heads.open("a") as f:
            f.write(err)
        return code, out, err

    return run


@pytest.fixture
def world(run):
    """Records 1 (game 1, Chess) and 2 (player 42, carol), 3 and 4 (carol revoked twice), each
    logged."""
    for argv in (
        ["init"],
        ["game", "add", "Chess"],
        ["player", "add", "42", "carol"],
        ["player", "revoke", "42"],
        ["player", "revoke", "42"],
    ):
        code, _, err = run(*argv)
        assert code == 0, err
    return run


def records(store_url: str) -> list[Record]:
    return [
        Record(*row)
        for row in sql(store_url, f"SELECT {', '.join(COLUMNS)} FROM audit ORDER BY id")
    ]


def logged(path: Path) -> list[tuple[int, str]]:
    return [(int(m[1]), m[2]) for line in path.read_text().splitlines() if (m := HEAD.search(line))]


def cut_tail(store_url: str, keep: int) -> None:
    """What the chain alone cannot show: the records after ``keep`` deleted (and the names kept
    beside them), the head row moved to ``keep``."""
    (last,) = [r for r in records(store_url) if r.id == keep]
    sql(store_url, "DELETE FROM audit WHERE id > ?", (keep,))
    sql(store_url, "DELETE FROM audit_names WHERE record_id > ?", (keep,))
    sql(store_url, "UPDATE audit_chain SET head_id = ?, head_hash = ?", (keep, last.hash))


def forge(store_url: str, **fields) -> Record:
    """A record written with SQL, hashed as authsvc would, made the head."""
    fields["hash"] = record_hash({k: fields[k] for k in COLUMNS if k != "hash"})
    record = Record(**fields)
    sql(
        store_url,
        f"INSERT INTO audit ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
        tuple(fields[k] for k in COLUMNS),
    )
    sql(store_url, "UPDATE audit_chain SET head_id = ?, head_hash = ?", (record.id, record.hash))
    return record


# -- the head line -------------------------------------------------------------------------------


def test_each_committed_write_logs_its_new_head_once_and_nothing_else_does(
    world, store_url, heads, tmp_path
):
    assert logged(heads) == [(r.id, r.hash) for r in records(store_url)] and len(logged(heads)) == 4
    heads.write_text("")
    for argv in (
        ["audit", "verify"],
        ["player", "show", "42"],
        ["audit"],
        ["game", "list"],
    ):  # reads
        assert world(*argv)[0] == 0
    assert world("game", "add", "Chess")[0] == 1  # refused before any record
    if store_url.startswith("sqlite://"):  # a record that cannot be written: the write rolls back
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
    assert world("player", "rename", "42", "mallory")[0] == 1
    sql(
        store_url,
        "DROP TRIGGER no_audit" + ("" if store_url.startswith("sqlite://") else " ON audit"),
    )
    assert logged(heads) == []
    data = tmp_path / "players.csv"
    data.write_text("user_id,username\n7,grace\n8,heidi\n")
    code, out, err = world("player", "import", str(data))  # many rows, one record, one line
    assert code == 0
    (record,) = records(store_url)[4:]
    assert [line for line in err.splitlines() if "authsvc.audit" in line] == [
        f"authsvc.audit: head id=5 hash={record.hash}"
    ]
    assert record.hash not in out


def test_a_record_a_savepoint_undid_logs_no_head_and_a_joined_write_logs_once(admin_store, caplog):
    """The head is read as the transaction commits it: a record undone by a savepoint (the admin
    API's refused call under an Idempotency-Key) is no head; writes joined in one transaction are
    one line."""
    caplog.set_level(logging.INFO, logger="authsvc.audit")
    factories.add_player(admin_store, 42, "carol")  # record 1
    caplog.clear()
    with admin_store.write() as tx:
        try:
            with tx.savepoint():
                tx.rename_player(42, "mallory")  # record 2, undone
                raise Invalid("refused")
        except Invalid:
            pass
    assert caplog.messages == []
    with admin_store.write() as tx:
        tx.revoke_player(42)
        factories.set_player_enabled(admin_store, 42, False)  # joins the open write
    (head,) = records_of(admin_store)[-1:]
    assert caplog.messages == [f"head id=3 hash={head.hash}"] and head.id == 3


def records_of(store) -> list[Record]:
    return list(reversed(store.audit_records(limit=10)))


def test_the_command_sends_its_head_line_to_the_journal_where_there_is_one(
    world, store_url, monkeypatch, tmp_path
):
    """Through syslog's socket (/dev/log, which journald reads), as `authsvc`: not on stderr
    then."""
    path = str(tmp_path / "dev-log")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as journal:
        journal.bind(path)
        journal.settimeout(5)
        monkeypatch.setattr("authsvc.cli.audit_cmd.JOURNAL_SOCKET", path)
        code, _, err = world("player", "revoke", "42")
        assert code == 0 and err == ""
        (record,) = records(store_url)[4:]
        assert (
            journal.recv(4096)
            == f"<14>authsvc: authsvc.audit: head id=5 hash={record.hash}".encode()
        )


# -- verify --anchor
# ---------------------------------------------------------------------------------


def test_verify_anchor_passes_an_untouched_store_with_the_log_of_its_writes(
    world, store_url, heads
):
    code, out, err = world("audit", "verify", "--anchor", str(heads))
    assert (code, err) == (0, "")
    assert (
        out
        == "4 records, chain intact from id 1; it holds the 4 heads the log anchors (the newest: "
        "record 4)\n"
    )
    verdict = json.loads(world("audit", "verify", "--anchor", str(heads), "--json")[1])
    assert verdict["intact"] is True and verdict["anchor"] == {
        "heads": 4,
        "newest_id": 4,
        "after_newest": 0,
    }
    world("player", "revoke", "42")  # a write the file does not hold yet: the window, said
    heads.write_text("\n".join(heads.read_text().splitlines()[:4]) + "\n")
    code, out, _ = world("audit", "verify", "--anchor", str(heads))
    assert code == 0 and "1 record after it is newer than the log" in out


TAMPERING = {
    "cut-two": (
        lambda url: cut_tail(url, 2),
        3,
        "records 3 to 4 were cut from the end of the chain",
    ),
    "cut-one": (lambda url: cut_tail(url, 3), 4, "record 4 was cut from the end of the chain"),
    "cut-and-written-again": (
        lambda url: (
            cut_tail(url, 2),
            forge(
                url,
                id=3,
                at_ms=records(url)[-1].at_ms,
                actor="cli:alice",
                request_id=None,
                action="player.enable",
                game_id=None,
                user_id=42,
                changes="{}",
                prev_hash=records(url)[-1].hash,
            ),
        ),
        3,
        "record 3 is not the record the log anchored",
    ),
}


@pytest.mark.parametrize("how", list(TAMPERING))
def test_verify_anchor_names_a_tail_cut_with_the_head_moved_to_match(world, store_url, heads, how):
    tamper, record_id, message = TAMPERING[how]
    tamper(store_url)
    code, out, _ = world("audit", "verify")
    assert code == 0, (
        out
    )  # the chain alone is consistent: why the head is anchored outside the store
    code, out, err = world("audit", "verify", "--anchor", str(heads))
    assert code == 1 and err == "", err
    assert out.startswith("audit chain broken: ") and message in out and out.count("\n") == 1, out
    verdict = json.loads(world("audit", "verify", "--anchor", str(heads), "--json")[1])
    assert (
        verdict["intact"] is False
        and message in verdict["problem"]
        and verdict["record_id"] == record_id
    )


def test_a_prune_leaves_the_older_heads_unneeded_but_not_the_newest(world, store_url, heads):
    code, out, err = world(
        "audit", "prune", "--before", "0m"
    )  # records 1 to 4 go; the prune is record 5
    assert code == 0, err
    world("player", "revoke", "42")  # record 6
    assert [r.id for r in records(store_url)] == [5, 6]
    code, out, _ = world("audit", "verify", "--anchor", str(heads))
    assert (code, out) == (
        0,
        "2 records, chain intact from id 5; it holds the 2 heads the log anchors after "
        "its start (4 before it were pruned; the newest: record 6)\n",
    )
    # A log that ends before the chain's start proves nothing about its end: refused, and said why.
    old = heads.parent / "before-the-prune.log"
    old.write_text("".join(line + "\n" for line in heads.read_text().splitlines()[:4]))
    code, out, _ = world("audit", "verify", "--anchor", str(old))
    assert (
        code == 1
        and "the log's newest head, record 4, is not in the chain: it starts after record 4" in out
    )
    # The same rule stops a forged prune: every record deleted, the start moved to the head, a prune
    # record forged to name it. The chain alone is consistent; the log's newest head is gone.
    h6 = records(store_url)[-1].hash
    sql(store_url, "DELETE FROM audit")
    after = {"anchor_id": 6, "anchor_hash": h6, "pruned": 6, "before_ms": 0}
    sql(store_url, "UPDATE audit_chain SET anchor_id = 6, anchor_hash = ?", (h6,))
    forge(
        store_url,
        id=7,
        at_ms=0,
        actor="cli:alice",
        request_id=None,
        action="audit.prune",
        game_id=None,
        user_id=None,
        changes=canonical({"before": {}, "after": after}),
        prev_hash=h6,
    )
    assert world("audit", "verify")[0] == 0
    code, out, _ = world("audit", "verify", "--anchor", str(heads))
    assert (
        code == 1
        and "the log's newest head, record 6, is not in the chain: it starts after record 6" in out
    )


BAD_LINES = {
    "short hash": "authsvc.audit: head id=3 hash=deadbeef",
    "upper-case hash": "authsvc.audit: head id=3 hash=" + "A" * 64,
    "id 0": "authsvc.audit: head id=0 hash=" + "a" * 64,
    "leading zero": "authsvc.audit: head id=03 hash=" + "a" * 64,
    "id past 2^63-1": "authsvc.audit: head id=9223372036854775808 hash=" + "a" * 64,
    "more after": "authsvc.audit: head id=3 hash=" + "a" * 64 + " ok=1",
    "another message": "authsvc.audit: all good",
}


@pytest.mark.engine("sqlite")
@pytest.mark.parametrize("line", list(BAD_LINES.values()), ids=list(BAD_LINES))
def test_a_line_that_is_not_a_head_line_as_written_is_refused_clearly(world, heads, line):
    text = heads.read_text().splitlines()
    heads.write_text("\n".join([text[0], line, *text[1:]]) + "\n")
    code, out, err = world("audit", "verify", "--anchor", str(heads))
    assert (code, out) == (1, "")
    assert (
        err.startswith(f"authsvc: error: {heads} line 2: not a head line as authsvc writes it")
        and err.count("\n") == 1
        and "Traceback" not in err
    ), err


@pytest.mark.engine("sqlite")
def test_an_anchor_file_without_head_lines_or_missing_is_refused(world, heads, tmp_path):
    empty = tmp_path / "other.log"
    empty.write_text(
        "2026-11-23 10:45:03 +0000 [4711] [INFO] gunicorn.error: Booting worker with pid: 4711\n"
    )
    code, out, err = world("audit", "verify", "--anchor", str(empty))
    assert (code, out) == (1, "") and "holds no head line" in err and err.count("\n") == 1
    code, out, err = world("audit", "verify", "--anchor", str(tmp_path / "missing.log"))
    assert (code, out) == (1, "") and "cannot read" in err and err.count("\n") == 1


# -- the admin API under gunicorn, as authsvc-admin.service runs it
# ----------------------------------------


@pytest.mark.engine("sqlite")
def test_the_admin_api_logs_each_head_to_its_journal_even_at_warning(
    store_url, tmp_path, secret_file, run
):
    """gunicorn with the shipped config: its error log (stderr, the journal) holds the head lines,
    also with AUTHSVC_LOG_LEVEL=WARNING; that log, as the anchor, names a tail cut."""
    env = {
        "AUTHSVC_STORE": store_url,
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
        "AUTHSVC_ADMIN_RATE": "0",
        "AUTHSVC_MAX_STALENESS": "0",
    }
    settings = Settings.from_env(env)
    store = open_store(settings.store, readonly=False, settings=settings)
    store.migrate()
    _, token = api_tokens.add_api_token(
        store, Context(actor="cli:test"), "web-tier", ["players:read", "players:write"], None
    )
    store.close()
    port, log = free_port(), tmp_path / "gunicorn.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AUTHSVC_")}
    proc = serve_gunicorn(
        {**clean, **env, "AUTHSVC_WORKERS": "1", "AUTHSVC_LOG_LEVEL": "WARNING"},
        "--graceful-timeout",
        "5",
        port=port,
        log_path=log,
        app="authsvc.api.wsgi:application",
        workers=None,
        config=CONF,
        inherit_env=False,
        cwd=tmp_path,
    )
    try:
        for method, path, body in (
            ("PUT", "/v1/players/777", {"username": "newbie"}),
            ("POST", "/v1/players/777/revoke", None),
            ("GET", "/v1/players/777", None),
        ):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            assert admin_request(conn, method, path, token, body).status in (200, 201)
            conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    written = records(
        store_url
    )  # 1: the API token (added here, not through a front door), 2: PUT, 3: revoke
    assert [r.action for r in written] == ["api_token.add", "player.add", "player.revoke"]
    assert logged(log) == [(r.id, r.hash) for r in written[1:]]
    assert "[INFO] authsvc.audit: head id=3 hash=" in log.read_text()
    assert run("audit", "verify", "--anchor", str(log))[0] == 0
    cut_tail(store_url, 2)
    code, out, _ = run("audit", "verify", "--anchor", str(log))
    assert code == 1 and "record 3 was cut from the end of the chain" in out
