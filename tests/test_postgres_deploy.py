"""The shipped PostgreSQL set-up (deploy/postgres/) works as documented in docs/stores.md.

On a server of the test's own: roles.sql as the DBA, `authsvc init` and the admin
commands as authsvc_owner, the web process as authsvc_web, which cannot write.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.parse
from pathlib import Path

import pytest

from authsvc.cli import main
from authsvc.settings import Settings
from tests.support import make_testapp

DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "postgres"


def local(url: str, port: int) -> str:
    """The shipped URL pointed at the test's server (same role and database, no TLS or passfile)."""
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}", query=""))


def test_shipped_roles_and_settings(own_pg, secret_file, monkeypatch, capsys):
    import psycopg

    web = Settings.from_env({"AUTHSVC_CONFIG": str(DEPLOY / "web.toml")}, require_secret=False)
    admin = Settings.from_env({"AUTHSVC_CONFIG": str(DEPLOY / "admin.toml")}, require_secret=False)
    assert urllib.parse.urlsplit(web.store).username == "authsvc_web"
    assert urllib.parse.urlsplit(admin.store).username == "authsvc_owner"

    subprocess.run(
        [os.path.join(own_pg.bin_dir, "psql"), own_pg.url, "-q", "-v", "ON_ERROR_STOP=1", "-f", str(DEPLOY / "roles.sql")],
        check=True, capture_output=True, timeout=60,
    )
    monkeypatch.setenv("AUTHSVC_TOKEN_SECRET_FILE", str(secret_file))
    monkeypatch.setenv("AUTHSVC_STORE", local(admin.store, own_pg.port))
    assert main(["init"]) == 0
    assert main(["game", "add", "Chess", "--json"]) == 0
    api_key = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["api_key"]
    assert main(["player", "add", "5", "bob"]) == 0
    assert main(["token", "issue", "--game", "1", "--user", "5"]) == 0
    token = capsys.readouterr().out.strip().splitlines()[-1]

    web_settings = Settings.from_env(
        {"AUTHSVC_STORE": local(web.store, own_pg.port), "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file)}
    )
    app = make_testapp(web_settings)  # start-up check passes as the web role
    res = app.get("/api/authenticate.json", params={"user_id": "5", "game_auth_token": token, "api_key": api_key})
    assert res.json == {"success": True, "user_id": 5, "username": "bob"}
    app.app.store.close()

    # The web role cannot write: read-only by default (roles.sql), and without privileges when that is lifted.
    with psycopg.connect(local(web.store, own_pg.port), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("UPDATE players SET username = 'x'")
        conn.execute("SET default_transaction_read_only = off")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE players SET username = 'x'")
    # ... and neither can the admin command run with the web role's settings.
    monkeypatch.setenv("AUTHSVC_STORE", local(web.store, own_pg.port))
    assert main(["player", "rename", "5", "mallory"]) == 1
    assert "may not write" in capsys.readouterr().err
