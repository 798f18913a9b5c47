"""``authsvc heartbeat`` and the schema it needs (docs/stores.md, "Hot standby"); what it proves on a
standby is tested in tests/test_standby.py."""

from __future__ import annotations

import secrets
import urllib.parse

import pytest

from authsvc.cli import main
from authsvc.errors import ConfigError
from authsvc.store import open_store
from authsvc.store.postgres import MIGRATIONS, VERSION_TABLE_SQL


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


def test_init_upgrades_a_version_1_store_and_the_web_role_reads_the_heartbeat(pg_databases, superuser_conn):
    import psycopg

    url = pg_databases.create(migrate=False)
    with psycopg.connect(url, autocommit=True) as conn:  # the schema as the previous release left it
        conn.execute(VERSION_TABLE_SQL)
        conn.execute(MIGRATIONS[0])
        conn.execute("INSERT INTO authsvc_schema (version) VALUES (1)")
    web = "authsvc_t_" + secrets.token_hex(5)
    superuser_conn.execute(f"CREATE ROLE {web} LOGIN IN ROLE authsvc_reader")
    try:
        parts = urllib.parse.urlsplit(url)
        web_url = urllib.parse.urlunsplit(parts._replace(netloc=f"{web}@{parts.netloc.rpartition('@')[2]}"))
        reader = open_store(web_url, readonly=True)
        with pytest.raises(ConfigError, match=f"schema version 1, this release needs {len(MIGRATIONS)} .run 'authsvc init'."):
            reader.check()
        admin = open_store(url, readonly=False)
        assert admin.migrate() == (1, len(MIGRATIONS))
        admin.write_heartbeat()
        admin.close()
        reader.check()
        reader.close()
        with psycopg.connect(web_url, autocommit=True) as conn:
            assert conn.execute("SELECT count(*), max(at) <= now() FROM authsvc_heartbeat").fetchone() == (1, True)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SET default_transaction_read_only = off")
                conn.execute("UPDATE authsvc_heartbeat SET at = now()")
    finally:
        superuser_conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (web,))
        superuser_conn.execute(f"DROP ROLE {web}")


@pytest.fixture
def superuser_conn(pg_server_url):
    import psycopg

    conn = psycopg.connect(pg_server_url, autocommit=True)
    yield conn
    conn.close()
