"""authsvc/cli/check.py, the `authsvc check` post-install checker, piece by piece.

The whole command against the real nginx + gunicorn stack is in
tests/integration/test_deploy.py; here each part is checked on its own, against the real
app (or a server that answers wrongly) served over loopback HTTP.
"""

from __future__ import annotations

import io
import json
import threading
import wsgiref.simple_server

import pytest

from authsvc.cli import check
from authsvc.errors import NotFound
from authsvc.web.app import make_app

pytestmark = pytest.mark.engine(
    "sqlite"
)  # the checker is engine-blind; the store only feeds player_token


class QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, *args):  # the request line holds the api key and the token
        pass


@pytest.fixture
def serve():
    """serve(wsgi_app) -> base URL of the app on 127.0.0.1, stopped after the test."""
    servers = []

    def serve(app) -> str:
        server = wsgiref.simple_server.make_server("127.0.0.1", 0, app, handler_class=QuietHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def answering(status: str, body: bytes, headers=(("Content-Type", "application/json"),)):
    """A WSGI app that gives every request the same answer."""

    def app(environ, start_response):
        start_response(status, [*headers, ("Content-Length", str(len(body)))])
        return [body]

    return app


def run(world, base_url: str, token: str | None = None, username: str | None = None):
    target = check.Target.parse(base_url, {})
    return check.run_checks(
        [target],
        world.user_id,
        world.api_key,
        token or world.token(),
        username,
        check.ssl_context(None),
        timeout=5,
    )


# -- Target.parse and --resolve ------------------------------------------------------------


def test_base_url_parts():
    t = check.Target.parse("https://API.example.com:8443/prefix/", {})
    assert (t.scheme, t.host, t.port, t.prefix, t.address) == (
        "https",
        "api.example.com",
        8443,
        "/prefix",
        "api.example.com",
    )
    assert t.base_url == "https://API.example.com:8443/prefix"
    assert check.Target.parse("http://legacy.example.com", {}).port == 80
    assert check.Target.parse("https://api.example.com", {}).port == 443


def test_resolve_picks_the_address_to_dial_for_host_and_port():
    resolve = check._parse_resolve(["api.example.com:443:127.0.0.1", "API.example.com:80:[::1]"])
    assert resolve == {("api.example.com", 443): "127.0.0.1", ("api.example.com", 80): "::1"}
    assert check.Target.parse("https://api.example.com", resolve).address == "127.0.0.1"
    assert check.Target.parse("http://Api.Example.com", resolve).address == "::1"
    assert check.Target.parse("https://api.example.com:8443", resolve).address == "api.example.com"


@pytest.mark.parametrize(
    "url",
    [
        "ftp://api.example.com",
        "api.example.com",
        "https://",
        "https://h/?q=1",
        "https://h/#x",
        "https://user@h/",
    ],
)
def test_base_urls_that_are_refused(url):
    with pytest.raises(check.CheckError, match="--base-url"):
        check.Target.parse(url, {})


@pytest.mark.parametrize(
    "item", ["api.example.com", "api.example.com:443", "h:port:1.2.3.4", ":443:1.2.3.4", "h:443:"]
)
def test_resolve_items_that_are_refused(item):
    with pytest.raises(check.CheckError, match="HOST:PORT:ADDRESS"):
        check._parse_resolve([item])


# -- secret files --------------------------------------------------------------------------


def test_secret_file_first_line_stripped(tmp_path):
    path = tmp_path / "key"
    path.write_text("  abc123  \nsecond line\n")
    assert check._read_secret_file(str(path), "api key") == "abc123"


def test_secret_from_stdin(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("from-stdin\n"))
    assert check._read_secret_file("-", "token") == "from-stdin"


@pytest.mark.parametrize(
    "content, message",
    [(None, "cannot read the api key file"), (b"\n", "is empty"), (b"\xff\xfe", "not UTF-8")],
)
def test_unreadable_or_empty_secret_files_are_one_clear_error(tmp_path, content, message):
    path = tmp_path / "key"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(check.CheckError, match=message) as info:
        check._read_secret_file(str(path), "api key")
    assert "\n" not in str(info.value)


# -- the four cases against real servers -------------------------------------------------


def test_the_real_app_passes_all_four_cases(world, serve):
    results = run(world, serve(make_app(world.settings)))
    assert [(r.case, r.ok, r.status) for r in results] == [
        ("success", True, 200),
        ("bad token", True, 200),
        ("bad api key", True, 200),
        ("missing parameter", True, 200),
    ]
    assert all(r.detail == "as expected" for r in results)


def test_a_wrong_username_is_a_failure(world, serve):
    [success, *_] = run(world, serve(make_app(world.settings)), username="mallory")
    assert not success.ok and "expected username 'mallory'" in success.detail


def test_a_server_that_always_says_yes_fails_the_error_cases(world, serve):
    body = json.dumps(
        {"success": True, "user_id": world.user_id, "username": world.username}
    ).encode()
    results = run(world, serve(answering("200 OK", body)))
    assert [r.ok for r in results] == [True, False, False, False]
    assert "expected" in results[1].detail and "Invalid credentials" in results[1].detail


def test_extra_fields_in_a_success_are_a_failure(world, serve):
    body = json.dumps(
        {"success": True, "user_id": world.user_id, "username": world.username, "x": 1}
    ).encode()
    assert "unexpected fields" in run(world, serve(answering("200 OK", body)))[0].detail


def test_an_error_with_the_wrong_http_status_is_a_failure(world, serve):
    body = json.dumps(
        {"success": False, "error": 403, "error_description": "Invalid credentials"}
    ).encode()
    results = run(world, serve(answering("500 Internal Server Error", body)))
    assert (
        not results[1].ok
        and results[1].detail == "expected HTTP 200 or 403"
        and results[1].status == 500
    )


@pytest.mark.parametrize(
    "app, detail",
    [
        (
            answering("302 Found", b"", (("Location", "https://elsewhere/"),)),
            "redirected elsewhere",
        ),
        (
            answering("200 OK", b"<html>", (("Content-Type", "text/html"),)),
            "Content-Type is text/html",
        ),
        (answering("200 OK", b"not json"), "the body is not JSON"),
        (answering("200 OK", b"[1, 2]"), "the body is not a JSON object"),
    ],
)
def test_answers_a_game_server_cannot_use_are_failures(world, serve, app, detail):
    results = run(world, serve(app))
    assert [r.ok for r in results] == [False] * 4
    assert all(detail in r.detail for r in results), [r.detail for r in results]


def test_an_unreachable_url_is_a_failure_not_a_crash(world):
    import socket

    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        results = run(world, f"http://127.0.0.1:{s.getsockname()[1]}")
    assert [(r.ok, r.status) for r in results] == [(False, None)] * 4
    assert all(r.detail.startswith("cannot connect or read") for r in results)
    assert (
        results[0].line().startswith("FAIL  http://127.0.0.1:") and "no answer" in results[0].line()
    )


def test_the_prefix_of_a_base_url_is_kept(world, serve):
    seen = []

    def app(environ, start_response):
        seen.append(environ["PATH_INFO"])
        return make_app(world.settings)(environ, start_response)

    run(world, serve(app) + "/auth")
    assert seen and set(seen) == {"/auth/api/authenticate.json"}


def test_the_checker_never_prints_the_key_or_token(world, serve):
    results = run(world, serve(answering("200 OK", b"not json")))
    text = "\n".join(r.line() for r in results) + json.dumps([r.__dict__ for r in results])
    assert world.api_key not in text and world.token() not in text


# -- the token from the store --------------------------------------------------------------


def test_player_token_is_the_one_the_app_accepts(world, serve):
    token, username = check.player_token(world.settings, world.game_id, world.user_id)
    assert username == world.username and token == world.token()
    assert all(r.ok for r in run(world, serve(make_app(world.settings)), token=token))


def test_player_token_for_an_unknown_game_or_player(world):
    # The one minting helper (authsvc.tokens.current_token) says so as a NotFound: one line, exit 1.
    with pytest.raises(NotFound, match="no game 999"):
        check.player_token(world.settings, 999, world.user_id)
    with pytest.raises(NotFound, match="no player 4243"):
        check.player_token(world.settings, world.game_id, 4243)


def test_a_changed_token_and_key_keep_their_shape():
    assert check._bad_token("abc0") == "abc1" and check._bad_token("abc9") == "abc0"
    assert len(check._bad_key("k" * 40)) == 40 and check._bad_key("k" * 40) != "k" * 40


@pytest.mark.parametrize("option", ["--api-key", "--token", "--api-k", "--stray"])
def test_a_secret_on_the_command_line_is_refused_and_never_repeated(capsys, tmp_path, option):
    """`--api-key SECRET` would otherwise be read as `--api-key-file SECRET` (an abbreviation),
    and the "cannot read file" error would print the secret."""
    from authsvc.cli.command import build_parser

    secret = "0f6c2b9e-5d4a-4e7f-9c3b-1a2d3e4f5a6b"
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(
            [
                "check",
                "--base-url",
                "http://127.0.0.1:9",
                "--game-id",
                "1",
                "--user-id",
                "1",
                "--api-key-file",
                str(tmp_path / "key"),
                option,
                secret,
            ]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert secret not in err
    assert "command line" in err or "unrecognized arguments" in err


def test_the_command_names_its_release_after_the_verdict(
    world, serve, env, tmp_path, monkeypatch, capsys
):
    """What a sysadmin pastes into a ticket says which release of the command checked
    (CHANGELOG.md)."""
    import tomllib
    from pathlib import Path

    from authsvc.cli.command import main

    version = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())[
        "project"
    ]["version"]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    key = tmp_path / "key.txt"
    key.write_text(world.api_key + "\n")
    code = main(
        [
            "check",
            "--game-id",
            str(world.game_id),
            "--user-id",
            str(world.user_id),
            "--api-key-file",
            str(key),
            "--base-url",
            serve(make_app(world.settings)),
        ]
    )
    assert code == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"all 4 checks passed (authsvc {version})"
    assert (
        main(
            [
                "check",
                "--game-id",
                str(world.game_id),
                "--user-id",
                str(world.user_id),
                "--api-key-file",
                str(key),
                "--base-url",
                serve(make_app(world.settings)),
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["version"] == version
