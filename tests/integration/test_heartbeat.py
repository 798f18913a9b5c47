"""``authsvc heartbeat`` and the schema it needs (docs/stores.md, "Hot standby"); what it proves on
a standby is tested in tests/system/test_standby.py."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from authsvc.cli.command import main
from authsvc.errors import ConfigError, StoreUnreachable
from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.store.postgres.store import MIGRATIONS, VERSION_TABLE_SQL
from authsvc.web.app import make_app
from tests.pgserver import Heartbeat, primary_with_standby
from tests.support import free_port, kept_stopped

GUNICORN_CONF = Path(__file__).resolve().parents[2] / "deploy" / "gunicorn.conf.py"


def test_the_heartbeat_refuses_a_sqlite_store(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AUTHSVC_STORE", f"sqlite://{tmp_path}/authsvc.db")
    monkeypatch.setenv("AUTHSVC_TOKEN_SECRET_FILE", str(tmp_path / "secret"))
    assert main(["init"]) == 0
    capsys.readouterr()
    assert main(["heartbeat"]) == 1
    assert "for a PostgreSQL primary read through hot standbys" in capsys.readouterr().err


@pytest.mark.parametrize("interval", ["0", "0.01", "0.6", "5"])
def test_the_heartbeat_interval_stays_well_under_the_bound(tmp_path, monkeypatch, capsys, interval):
    monkeypatch.setenv("AUTHSVC_STORE", f"sqlite://{tmp_path}/authsvc.db")
    assert main(["heartbeat", "--interval", interval]) == 1
    assert "--interval must be from 0.05 to 0.5 seconds" in capsys.readouterr().err


def test_init_upgrades_a_version_1_store_and_the_web_role_reads_the_heartbeat(
    pg_databases, superuser_conn
):
    import psycopg

    url = pg_databases.create(migrate=False)
    with psycopg.connect(
        url, autocommit=True
    ) as conn:  # the schema as the previous release left it
        conn.execute(VERSION_TABLE_SQL)
        conn.execute(MIGRATIONS[0])
        conn.execute("INSERT INTO authsvc_schema (version) VALUES (1)")
    web = "authsvc_t_" + secrets.token_hex(5)
    superuser_conn.execute(f"CREATE ROLE {web} LOGIN IN ROLE authsvc_reader")
    try:
        parts = urllib.parse.urlsplit(url)
        web_url = urllib.parse.urlunsplit(
            parts._replace(netloc=f"{web}@{parts.netloc.rpartition('@')[2]}")
        )
        reader = open_store(web_url, readonly=True)
        with pytest.raises(
            ConfigError,
            match=f"schema version 1, this release needs {len(MIGRATIONS)} .run 'authsvc init'.",
        ):
            reader.check()
        admin = open_store(url, readonly=False)
        assert admin.migrate() == (1, len(MIGRATIONS))
        admin.write_heartbeat()
        admin.close()
        reader.check()
        reader.close()
        with psycopg.connect(web_url, autocommit=True) as conn:
            assert conn.execute(
                "SELECT count(*), max(at) <= now() FROM authsvc_heartbeat"
            ).fetchone() == (1, True)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SET default_transaction_read_only = off")
                conn.execute("UPDATE authsvc_heartbeat SET at = now()")
    finally:
        superuser_conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (web,)
        )
        superuser_conn.execute(f"DROP ROLE {web}")


@pytest.fixture
def superuser_conn(pg_server_url):
    import psycopg

    conn = psycopg.connect(pg_server_url, autocommit=True)
    yield conn
    conn.close()


# -- a web process on a hot standby needs a bound the heartbeat can meet (docs/stores.md, "Hot
# standby") --


@pytest.fixture(scope="module")
def primary_and_standby():
    """A migrated throwaway primary and its ``pg_basebackup -R`` hot standby (the schema comes with
    it)."""
    with primary_with_standby(migrate=True) as servers:
        yield servers


def _web_settings(url: str, secret_file, max_staleness: str) -> Settings:
    return Settings.from_env(
        {
            "AUTHSVC_STORE": url,
            "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
            "AUTHSVC_MAX_STALENESS": max_staleness,
        }
    )


@pytest.mark.parametrize("max_staleness", ["0", "0.2", "0.45"])
def test_a_bound_the_heartbeat_cannot_meet_is_refused_on_a_standby_at_start_up(
    primary_and_standby, secret_file, max_staleness
):
    """Below 0.5 s a standby would answer 503 to (nearly) every authentication: its heartbeat is up
    to
    0.2 s old plus the replication delay. Before, nothing refused it; now one line names the
    setting."""
    primary, standby = primary_and_standby
    with pytest.raises(ConfigError) as refused:
        make_app(_web_settings(standby.url, secret_file, max_staleness))
    line = str(refused.value)
    assert "\n" not in line and "hot standby" in line, line
    assert (
        f"AUTHSVC_MAX_STALENESS is {float(max_staleness):g} s" in line and "at least 0.5 s" in line
    ), line
    assert not isinstance(
        refused.value, StoreUnreachable
    )  # a misconfiguration: the service stays stopped
    # The same bound on the primary reads the latest commit: accepted.
    make_app(_web_settings(primary.url, secret_file, max_staleness)).store.close()


@pytest.mark.parametrize("max_staleness", ["0.5", "1"])
def test_a_bound_the_heartbeat_can_meet_starts_on_a_standby(
    primary_and_standby, secret_file, max_staleness
):
    _, standby = primary_and_standby
    make_app(_web_settings(standby.url, secret_file, max_staleness)).store.close()


def test_explain_on_a_standby_keeps_the_settings_bound(
    primary_and_standby, secret_file, tmp_path, monkeypatch, capsys
):
    """`authsvc explain` reads SQLite without a snapshot (bound 0); on PostgreSQL the server's
    latest is already that, so the settings' own bound stays: on a standby a 0 would be refused at
    start-up and blame a setting the operator never set."""
    primary, standby = primary_and_standby
    heartbeat = Heartbeat(primary.url, tmp_path / "heartbeat.log")
    heartbeat.start()
    try:
        for name, value in {
            "AUTHSVC_STORE": standby.url,
            "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
            "AUTHSVC_MAX_STALENESS": "1",
        }.items():
            monkeypatch.setenv(name, value)
        request = tmp_path / "request"
        request.write_text(
            "user_id=1001&game_auth_token=" + "0" * 64 + "&api_key=not-a-key-of-this-store\n"
        )
        deadline = time.monotonic() + 30
        while True:  # until the standby has replayed a recent heartbeat
            code = main(["explain", str(request), "--json"])
            out, err = capsys.readouterr()
            if code == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert "AUTHSVC_MAX_STALENESS" not in err, err
        assert code == 0, err
        assert "unknown_key" in out or "key" in out, out
    finally:
        heartbeat.stop()


def test_gunicorn_on_a_standby_with_max_staleness_0_stops_with_one_line_and_status_4(
    primary_and_standby, secret_file, tmp_path
):
    """The shipped config (deploy/gunicorn.conf.py, preloaded): the misconfiguration's exit status,
    which the service unit's RestartPreventExitStatus keeps stopped
    (deploy/systemd/authsvc.service)."""
    _, standby = primary_and_standby
    env = {
        "AUTHSVC_STORE": standby.url,
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
        "AUTHSVC_MAX_STALENESS": "0",
        "AUTHSVC_BIND": f"127.0.0.1:{free_port()}",
        "AUTHSVC_WORKERS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "gunicorn", "--config", str(GUNICORN_CONF)],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 4 and done.returncode in kept_stopped(), done.stderr[-3000:]
    # (Before it, a warning: the test's superuser role could write.)
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("authsvc: error: ")]
    assert "hot standby" in line and "AUTHSVC_MAX_STALENESS is 0 s" in line, line
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


# -- the heartbeat's exit statuses: an outage is waited for, a misconfiguration exits 1
# (docs/admin.md) --


def _heartbeat(store_url: str, secret_file) -> subprocess.CompletedProcess:
    """``authsvc heartbeat`` as its unit runs it, expected to stop by itself (60 s at most)."""
    env = {
        "PATH": os.environ["PATH"],
        "AUTHSVC_STORE": store_url,
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
        "AUTHSVC_PG_CONNECT_TIMEOUT": "2",
    }
    try:
        return subprocess.run(
            [sys.executable, "-m", "authsvc.cli.command", "heartbeat"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(
            "authsvc heartbeat still running after 60 s: a misconfiguration was waited for like an "
            "outage"
        )


def test_a_misconfigured_store_stops_the_heartbeat_with_exit_1(
    pg_databases, pg_server_url, secret_file
):
    """Not migrated, or a database the server refuses: one line, exit 1 (systemd starts it again
    after RestartSec, deploy/systemd/authsvc-heartbeat.service)."""
    done = _heartbeat(pg_databases.create(migrate=False), secret_file)
    assert (done.returncode, done.stdout) == (1, ""), done
    assert done.stderr.startswith("authsvc: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "run 'authsvc init'" in done.stderr
    done = _heartbeat(pg_server_url.rsplit("/", 1)[0] + "/authsvc_no_such_database", secret_file)
    assert (done.returncode, done.stdout) == (1, ""), done
    assert done.stderr.startswith("authsvc: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert (
        'database "authsvc_no_such_database" does not exist' in done.stderr
        and "unreachable" not in done.stderr
    )


def test_the_heartbeat_waits_out_a_primary_that_is_down_at_start(own_pg, tmp_path):
    """Started while its primary is down, it does not exit: it says why it cannot write, and writes
    once the server is back (the unit's Restart= plays no part)."""
    admin = open_store(own_pg.url, readonly=False)
    admin.migrate()
    admin.close()
    own_pg.stop()
    heartbeat = Heartbeat(own_pg.url, tmp_path / "heartbeat.log")
    heartbeat.start()
    try:
        _until_logged(heartbeat, "cannot write")
        assert heartbeat.process.poll() is None, heartbeat.log()
        assert "Connection refused" in heartbeat.log()
        own_pg.start()
        _until_logged(heartbeat, "writing again, after")
        assert heartbeat.process.poll() is None, heartbeat.log()
        with _connect(own_pg.url) as conn:
            assert conn.execute("SELECT count(*) FROM authsvc_heartbeat").fetchone() == (1,)
    finally:
        heartbeat.stop()
    assert "Traceback" not in heartbeat.log()


def _until_logged(heartbeat: Heartbeat, text: str) -> None:
    deadline = time.monotonic() + 60
    while text not in heartbeat.log():
        assert heartbeat.process.poll() is None, (
            f"the heartbeat exited ({heartbeat.process.returncode}):\n{heartbeat.log()}"
        )
        assert time.monotonic() < deadline, f"no {text!r} in 60 s:\n{heartbeat.log()}"
        time.sleep(0.1)


def _connect(url: str):
    import psycopg

    return psycopg.connect(url, autocommit=True)
