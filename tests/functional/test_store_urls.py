"""AUTHSVC_STORE=sqlite://... : the admin command and the web process accept the same URLs
and find the same file (docs/configuration.md), or both refuse a URL with the same line."""

from __future__ import annotations

import json
import os
import secrets
import signal
import time
import urllib.parse
import urllib.request

import pytest
import webtest

from authsvc.cli import command as cli
from authsvc.errors import ConfigError
from authsvc.settings import Settings
from authsvc.store import redact_url
from authsvc.store.sqlite.store import path_from_url
from authsvc.web.app import make_app
from tests.support import free_port, skip_or_fail, start_gunicorn, wait_for_port

# (URL as written, with {tmp} for the test's directory; the file it names, relative to it).
# The working directory is {tmp}, so relative forms land there too.
FORMS = [
    ("sqlite://{tmp}/a.db", "a.db"),  # documented absolute form
    ("sqlite:///{tmp}/a.db", "a.db"),  # SQLAlchemy's four slashes: absolute too
    ("sqlite://rel/a.db", "rel/a.db"),  # relative to the working directory
    ("sqlite://a.db", "a.db"),
    ("sqlite://{tmp}/my store/auth svc.db", "my store/auth svc.db"),
    ("sqlite://{tmp}/50%25 off%.db", "50%25 off%.db"),  # taken literally, never %-decoded
    ("sqlite://{tmp}/what?mode=rw.db", "what?mode=rw.db"),  # no query string: part of the name
    ("sqlite://{tmp}/no#1.db", "no#1.db"),  # no fragment either
    ("sqlite:///{tmp}/sp ace #?%.db", "sp ace #?%.db"),
    ("SQLite://{tmp}/a.db", "a.db"),  # the scheme is case-insensitive
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
        {
            "AUTHSVC_STORE": url,
            "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
            "AUTHSVC_MAX_STALENESS": "0",
        }
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
def test_admin_command_and_web_app_refuse_the_same_urls_with_the_same_line(
    run, tmp_path, secret_file, form
):
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
    env.update(
        AUTHSVC_STORE=url, AUTHSVC_TOKEN_SECRET_FILE=str(secret_file), AUTHSVC_MAX_STALENESS="0"
    )
    proc = start_gunicorn(env, port=port, preload=True, inherit_env=False, cwd=tmp_path)
    try:
        try:
            wait_for_port(port)
        except Exception:
            proc.kill()
            pytest.fail("gunicorn did not start: " + proc.communicate(timeout=20)[1][-2000:])
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(
            f"http://127.0.0.1:{port}/api/authenticate.json?{query}", timeout=10
        ) as r:
            assert json.loads(r.read()) == {"success": True, "user_id": 4242, "username": "alice"}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        # A worker still booting when SIGTERM comes (a busy machine) has not yet set its own
        # handler: gunicorn's master ends it after its graceful timeout, 30 s.
        proc.communicate(timeout=60)


def test_a_nul_character_is_refused_by_the_one_parser():
    """An environment variable cannot hold NUL, a TOML file can."""
    with pytest.raises(ConfigError, match="NUL"):
        path_from_url("sqlite:///tmp/a\x00.db")


# redact_url: every message that names the store URL (errors, gunicorn's start-up failure line,
# the heartbeat's banner) shows it through redact_url, read as libpq reads it.

SECRET_URLS = [
    "postgresql://owner:{s}@db/authsvc",
    "postgresql://owner@db/authsvc?sslpassword={s}",
    "postgresql://owner@db/authsvc?pass%77ord={s}",  # libpq decodes the name: the password
    "postgresql://owner@db/authsvc?%70%61%73%73%77%6F%72%64={s}",
    "postgresql://owner@db/authsvc?sslmode=require&ssl%70assword={s}&application_name=x",
    "postgresql://owner@db/authsvc?oauth_client_secret={s}",
    "postgresql://owner:{s}?x@db/authsvc",  # libpq takes an unescaped "?" into the password
    "postgresql://owner:{s}#x@db/authsvc",
    "postgresql://db/authsvc?password={s}#x",  # no fragment in libpq: part of the value
    "postgresql://db/authsvc?password=a&password={s}",  # the last one wins
    "postgresql://owner:{s}@db1:5432,db2:5433/authsvc?sslpassword={s}",
    "postgres://owner:{s}@[::1]:5432/authsvc",
]


def _libpq_secrets(url: str) -> list[str]:
    """What libpq itself reads from ``url`` as a secret (its own parser, through psycopg)."""
    try:
        from psycopg import conninfo, pq
    except ImportError:
        skip_or_fail("psycopg is not installed (pip install -e '.[postgres]')")
    hidden = {
        o.keyword.decode() for o in pq.Conninfo.get_defaults() if o.dispchar in (b"*", b"D")
    } - {"replication", "sslkeylogfile"}  # "D": debug options; these two are a mode and a file name
    return [str(v) for k, v in conninfo.conninfo_to_dict(url).items() if k in hidden and v]


@pytest.mark.parametrize("template", SECRET_URLS)
def test_redact_url_masks_every_secret_libpq_reads(template):
    url = template.format(s="Sekr3t-" + secrets.token_hex(8))
    found = _libpq_secrets(url)
    assert found, "libpq reads no secret from this URL: the case tests nothing"
    shown = redact_url(url)
    for secret in found:
        assert secret not in shown, shown
    assert "***" in shown


def test_every_parameter_libpq_masks_is_masked():
    """PQconndefaults marks the parameters it never shows with "*": each is masked here too."""
    try:
        from psycopg import pq
    except ImportError:
        skip_or_fail("psycopg is not installed (pip install -e '.[postgres]')")
    masked = [o.keyword.decode() for o in pq.Conninfo.get_defaults() if o.dispchar == b"*"]
    assert {"password", "sslpassword"} <= set(masked)
    for keyword in (*masked, "scram_client_key", "scram_server_key"):
        assert (
            redact_url(f"postgresql://db/a?{keyword}=hidden") == f"postgresql://db/a?{keyword}=***"
        )


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://owner:pw@[::1/authsvc",  # an IPv6 host never closed: urllib raises ValueError
        "postgresql://owner:pw@[zz]:5432/authsvc",
        "postgresql://owner:pw@db:99999999/authsvc",
        "postgresql://\udcff:pw@db/authsvc",
        "host=db password=pw",  # not a URL at all
        "",
    ],
)
def test_redact_url_never_raises_and_never_shows_the_password(url):
    shown = redact_url(url)
    assert isinstance(shown, str) and "pw" not in shown


def test_redact_url_keeps_what_is_not_secret():
    plain = "postgresql://authsvc_web@db.example.internal:5432/authsvc?sslmode=verify-full&passfile=/etc/authsvc/pgpass-web"
    assert redact_url(plain) == plain
    assert (
        redact_url("sqlite:///var/lib/a:b@c/what?password=x.db")
        == "sqlite:///var/lib/a:b@c/what?password=x.db"
    )
    assert redact_url("postgresql://u:pw@db/a?sslmode=require&sslpassword=x") == (
        "postgresql://u:***@db/a?sslmode=require&sslpassword=***"
    )


def _secret_url(host: str, password: str) -> str:
    return f"postgresql://postgres:{password}a@{host}/authsvc?sslmode=disable&sslpassword={password}b&pass%77ord={password}c&connect_timeout=2"


@pytest.mark.parametrize(
    "host, status",
    [
        ("127.0.0.1:{port}", 75),  # nobody listens there: the store is unreachable
        ("[::1:{port}", 4),  # an IPv6 host never closed: not a valid URL (libpq quotes it whole)
    ],
)
def test_gunicorns_start_up_failure_line_holds_no_password(tmp_path, secret_file, host, status):
    password = secrets.token_hex(12)
    env = {
        "AUTHSVC_STORE": _secret_url(host.format(port=free_port()), password),
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
    }
    proc = start_gunicorn(env, port=free_port(), preload=True, inherit_env=False, cwd=tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == status, err
    [line] = [line for line in err.splitlines() if line.startswith("authsvc: error: ")]
    assert (
        "postgresql://postgres:***@" in line
        and "sslpassword=***" in line
        and "pass%77ord=***" in line
    ), line
    assert password not in out + err and "Traceback" not in err


def test_the_heartbeats_banner_holds_no_password(pg_databases, tmp_path):
    """The real command on a real primary: trust authentication ignores the password,
    sslmode=disable the key's; the banner names the store without either."""
    from harness.pgserver import Heartbeat

    password = secrets.token_hex(12)
    database = urllib.parse.urlsplit(pg_databases.create()).path.lstrip("/")
    server = urllib.parse.urlsplit(pg_databases.server_url)
    url = _secret_url(server.hostname + (f":{server.port}" if server.port else ""), password)
    url = url.replace("/authsvc?", f"/{database}?")
    heartbeat = Heartbeat(url, tmp_path / "heartbeat.log")
    heartbeat.start()
    try:
        deadline = time.monotonic() + 60
        while "writing the primary's time into" not in heartbeat.log():
            assert heartbeat.process.poll() is None and time.monotonic() < deadline, heartbeat.log()
            time.sleep(0.1)
    finally:
        heartbeat.stop()
    log = heartbeat.log()
    assert (
        "postgresql://postgres:***@" in log and "sslpassword=***" in log and "pass%77ord=***" in log
    ), log
    assert password not in log


def test_libpq_error_texts_are_masked_of_every_secret():
    """Should libpq ever quote a secret in an error, the store's message masks it as the URL's."""
    try:
        from authsvc.store.postgres.reader import PostgresReader, _reason
    except ImportError:
        skip_or_fail("psycopg is not installed (pip install -e '.[postgres]')")
    password, key_password = secrets.token_hex(8), secrets.token_hex(8)
    reader = PostgresReader(
        f"postgresql://u:{password}@db/a?ssl%70assword={key_password}", readonly=True
    )
    text = _reason(RuntimeError(f"FATAL: no {password}\n and no {key_password}"), reader._secrets)
    assert text == "FATAL: no *** and no ***"
