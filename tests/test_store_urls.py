"""AUTHSVC_STORE=sqlite://... : the admin command and the web process accept the same URLs
and find the same file (docs/configuration.md), or both refuse a URL with the same line."""

from __future__ import annotations

import json
import os
import signal
import urllib.parse
import urllib.request

import pytest
import webtest

from authsvc import cli
from authsvc.app import make_app
from authsvc.errors import ConfigError
from authsvc.settings import Settings
from authsvc.store.sqlite import path_from_url
from tests.support import free_port, start_gunicorn, wait_for_port

# (URL as written, with {tmp} for the test's directory; the file it names, relative to it).
# The working directory is {tmp}, so relative forms land there too.
FORMS = [
    ("sqlite://{tmp}/a.db", "a.db"),                      # documented absolute form
    ("sqlite:///{tmp}/a.db", "a.db"),                     # SQLAlchemy's four slashes: absolute too
    ("sqlite://rel/a.db", "rel/a.db"),                    # relative to the working directory
    ("sqlite://a.db", "a.db"),
    ("sqlite://{tmp}/my store/auth svc.db", "my store/auth svc.db"),
    ("sqlite://{tmp}/50%25 off%.db", "50%25 off%.db"),    # taken literally, never %-decoded
    ("sqlite://{tmp}/what?mode=rw.db", "what?mode=rw.db"),  # no query string: part of the name
    ("sqlite://{tmp}/no#1.db", "no#1.db"),                # no fragment either
    ("sqlite:///{tmp}/sp ace #?%.db", "sp ace #?%.db"),
    ("SQLite://{tmp}/a.db", "a.db"),                      # the scheme is case-insensitive
]

REFUSED = [
    "sqlite:",
    "sqlite:a.db",
    "sqlite:/a.db",
    "sqlite://",
    "sqlite:///",
    "sqlite:////",
    "sqlite://{tmp}/dir/",
    "sqlite://.",
    "sqlite://{tmp}/..",
]


@pytest.fixture
def run(monkeypatch, tmp_path, capsys, secret_file):
    """run(url, *argv) -> (exit code, stdout, stderr) of the admin command in tmp_path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AUTHSVC_CONFIG", raising=False)
    monkeypatch.setenv("AUTHSVC_TOKEN_SECRET_FILE", str(secret_file))
    monkeypatch.setenv("AUTHSVC_MAX_STALENESS", "0")

    def run(url, *argv):
        monkeypatch.setenv("AUTHSVC_STORE", url)
        code = cli.main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def provision(run, url) -> dict:
    """init, game add, player add, token issue through the admin command; the request params."""
    for argv in (("init",), ("game", "add", "Chess"), ("player", "add", "4242", "alice")):
        code, _, err = run(url, *argv, "--json")
        assert code == 0, err
    code, out, err = run(url, "game", "list", "--json")
    game_id = json.loads(out)["games"][0]["game_id"]
    code, out, err = run(url, "token", "issue", "--game", str(game_id), "--user", "4242", "--json")
    assert code == 0, err
    token = json.loads(out)["game_auth_token"]
    return {"user_id": "4242", "game_auth_token": token}


def api_key(run, url) -> str:
    code, out, err = run(url, "game", "rotate-key", "1", "--old-key-ttl", "0", "--json")
    assert code == 0, err
    return json.loads(out)["api_key"]


def settings_for(url: str, secret_file) -> Settings:
    return Settings.from_env(
        {"AUTHSVC_STORE": url, "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file), "AUTHSVC_MAX_STALENESS": "0"}
    )


@pytest.mark.parametrize(("form", "file"), FORMS)
def test_admin_command_and_web_app_use_the_same_file(run, tmp_path, secret_file, form, file):
    url = form.format(tmp=tmp_path)
    params = provision(run, url)
    params["api_key"] = api_key(run, url)
    assert (tmp_path / file).is_file()
    # nothing else was created: the web process did not make a file of its own either
    app = webtest.TestApp(make_app(settings_for(url, secret_file)), lint=True)
    try:
        r = app.get("/api/authenticate.json", params)
        assert r.json == {"success": True, "user_id": 4242, "username": "alice"}
    finally:
        app.app.store.close()
    made = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()}
    assert made - {file, file + "-wal", file + "-shm", secret_file.name} == set()


@pytest.mark.parametrize("form", REFUSED)
def test_admin_command_and_web_app_refuse_the_same_urls_with_the_same_line(run, tmp_path, secret_file, form):
    url = form.format(tmp=tmp_path)
    before = set(tmp_path.rglob("*"))
    code, out, err = run(url, "init")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("authsvc: error: AUTHSVC_STORE ")
    with pytest.raises(ConfigError) as web:
        make_app(settings_for(url, secret_file))
    assert err == f"authsvc: error: {web.value}\n"
    assert set(tmp_path.rglob("*")) == before  # neither side created anything


def test_four_slash_url_with_odd_characters_under_real_gunicorn(run, tmp_path, secret_file):
    url = f"sqlite:///{tmp_path}/odd dir/store #1 ?x=50%.db"
    params = provision(run, url)
    params["api_key"] = api_key(run, url)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "AUTHSVC_CONFIG"}
    env.update(AUTHSVC_STORE=url, AUTHSVC_TOKEN_SECRET_FILE=str(secret_file), AUTHSVC_MAX_STALENESS="0")
    proc = start_gunicorn(env, port=port, preload=True, inherit_env=False, cwd=tmp_path)
    try:
        try:
            wait_for_port(port)
        except Exception:
            proc.kill()
            pytest.fail("gunicorn did not start: " + proc.communicate(timeout=20)[1][-2000:])
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/authenticate.json?{query}", timeout=10) as r:
            assert json.loads(r.read()) == {"success": True, "user_id": 4242, "username": "alice"}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)


def test_a_nul_character_is_refused_by_the_one_parser():
    """An environment variable cannot hold NUL, a TOML file can."""
    with pytest.raises(ConfigError, match="NUL"):
        path_from_url("sqlite:///tmp/a\x00.db")
