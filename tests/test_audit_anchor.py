"""The audit chain's head logged outside the store (docs/logs.md, "The audit head line").

Each committed write that appended records logs the chain's new head, one line:
the admin command to the journal (stderr here, where no journal socket is), the
admin API to gunicorn's error log. A read, a refused or rolled-back write logs none.
"""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
from pathlib import Path

import pytest

from authsvc.admin import operations as ops
from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.store.audit import COLUMNS, Record
from tests.support import admin_request, free_port, serve_gunicorn, store_sql

sql = store_sql
HEAD = re.compile(r"authsvc\.audit: head id=(\d+) hash=([0-9a-f]{64})$")
CONF = Path(__file__).resolve().parent.parent / "deploy" / "gunicorn.conf.py"


@pytest.fixture
def heads(tmp_path) -> Path:
    return tmp_path / "heads.log"


@pytest.fixture
def run(command_as_alice, monkeypatch, tmp_path, heads):
    """The admin command, with no journal socket: its head lines go to stderr, kept in ``heads``
    (as `journalctl -o cat` would give them)."""
    monkeypatch.setattr("authsvc.admin.audit.JOURNAL_SOCKET", str(tmp_path / "no-journal"), raising=False)

    def run(*argv):
        code, out, err = command_as_alice(*argv)
        with heads.open("a") as f:
            f.write(err)
        return code, out, err

    return run


@pytest.fixture
def world(run):
    """Records 1 (game 1, Chess) and 2 (player 42, carol), 3 and 4 (carol revoked twice), each logged."""
    for argv in (["init"], ["game", "add", "Chess"], ["player", "add", "42", "carol"],
                 ["player", "revoke", "42"], ["player", "revoke", "42"]):
        code, _, err = run(*argv)
        assert code == 0, err
    return run


def records(store_url: str) -> list[Record]:
    return [Record(*row) for row in sql(store_url, f"SELECT {', '.join(COLUMNS)} FROM audit ORDER BY id")]


def logged(path: Path) -> list[tuple[int, str]]:
    return [(int(m[1]), m[2]) for line in path.read_text().splitlines() if (m := HEAD.search(line))]


# -- the head line -------------------------------------------------------------------------------


def test_each_committed_write_logs_its_new_head_once_and_nothing_else_does(world, store_url, heads, tmp_path):
    assert logged(heads) == [(r.id, r.hash) for r in records(store_url)] and len(logged(heads)) == 4
    heads.write_text("")
    for argv in (["audit", "verify"], ["player", "show", "42"], ["audit"], ["game", "list"]):  # reads
        assert world(*argv)[0] == 0
    assert world("game", "add", "Chess")[0] == 1  # refused before any record
    if store_url.startswith("sqlite://"):  # a record that cannot be written: the write rolls back
        sql(store_url, "CREATE TRIGGER no_audit BEFORE INSERT ON audit BEGIN SELECT RAISE(ABORT, 'no audit'); END")
    else:
        sql(store_url, "CREATE FUNCTION no_audit() RETURNS trigger LANGUAGE plpgsql AS "
                       "$$ BEGIN RAISE EXCEPTION 'no audit' USING ERRCODE = 'insufficient_privilege'; END $$")
        sql(store_url, "CREATE TRIGGER no_audit BEFORE INSERT ON audit FOR EACH ROW EXECUTE FUNCTION no_audit()")
    assert world("player", "rename", "42", "mallory")[0] == 1
    sql(store_url, "DROP TRIGGER no_audit" + ("" if store_url.startswith("sqlite://") else " ON audit"))
    assert logged(heads) == []
    data = tmp_path / "players.csv"
    data.write_text("user_id,username\n7,grace\n8,heidi\n")
    code, out, err = world("player", "import", str(data))  # many rows, one record, one line
    assert code == 0
    (record,) = records(store_url)[4:]
    assert [line for line in err.splitlines() if "authsvc.audit" in line] == [
        f"authsvc.audit: head id=5 hash={record.hash}"]
    assert record.hash not in out


def test_the_command_sends_its_head_line_to_the_journal_where_there_is_one(world, store_url, monkeypatch, tmp_path):
    """Through syslog's socket (/dev/log, which journald reads), as `authsvc`: not on stderr then."""
    path = str(tmp_path / "dev-log")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as journal:
        journal.bind(path)
        journal.settimeout(5)
        monkeypatch.setattr("authsvc.admin.audit.JOURNAL_SOCKET", path)
        code, _, err = world("player", "revoke", "42")
        assert code == 0 and err == ""
        (record,) = records(store_url)[4:]
        assert journal.recv(4096) == f"<14>authsvc: authsvc.audit: head id=5 hash={record.hash}".encode()


# -- the admin API under gunicorn, as authsvc-admin.service runs it ----------------------------------------


@pytest.mark.engine("sqlite")
def test_the_admin_api_logs_each_head_to_its_journal_even_at_warning(store_url, tmp_path, secret_file, run):
    """gunicorn with the shipped config: its error log (stderr, the journal) holds the head lines, also with
    AUTHSVC_LOG_LEVEL=WARNING."""
    env = {"AUTHSVC_STORE": store_url, "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file), "AUTHSVC_ADMIN_RATE": "0",
           "AUTHSVC_MAX_STALENESS": "0"}
    settings = Settings.from_env(env)
    store = open_store(settings.store, readonly=False, settings=settings)
    store.migrate()
    _, token = ops.add_api_token(store, ops.Context(actor="cli:test"), "web-tier", ["players:read", "players:write"], None)
    store.close()
    port, log = free_port(), tmp_path / "gunicorn.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AUTHSVC_")}
    proc = serve_gunicorn({**clean, **env, "AUTHSVC_WORKERS": "1", "AUTHSVC_LOG_LEVEL": "WARNING"},
                          "--graceful-timeout", "5", port=port, log_path=log, app="authsvc.admin.wsgi:application",
                          workers=None, config=CONF, inherit_env=False, cwd=tmp_path)
    try:
        for method, path, body in (("PUT", "/v1/players/777", {"username": "newbie"}),
                                   ("POST", "/v1/players/777/revoke", None), ("GET", "/v1/players/777", None)):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            assert admin_request(conn, method, path, token, body).status in (200, 201)
            conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    written = records(store_url)  # 1: the API token (added here, not through a front door), 2: PUT, 3: revoke
    assert [r.action for r in written] == ["api_token.add", "player.add", "player.revoke"]
    assert logged(log) == [(r.id, r.hash) for r in written[1:]]
    assert "[INFO] authsvc.audit: head id=3 hash=" in log.read_text()
