"""The admin API's service under real gunicorn with the shipped config (deploy/gunicorn.conf.py, as
authsvc-admin.service runs it): its access line names the admin route's template, never the path or
query a client sent (docs/logs.md, "The admin API's access line"); what gunicorn itself refuses (a
request line or header it cannot read, a limit passed) is answered in the admin API's RFC 9457
problem+json (docs/admin-api.md, "Errors"), on both worker classes, while the game-facing service
under the same config keeps its own JSON (docs/api.md).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from authsvc.api import routes
from authsvc.operations import api_tokens
from authsvc.operations.context import Context
from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.tokens import api_key_digest, new_api_key
from tests import factories
from tests.support import admin_request, free_port, raw_request, serve_gunicorn

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "deploy" / "gunicorn.conf.py"
DOCUMENT = REPO / "authsvc" / "openapi" / "admin.json"
ALL_SCOPES = [
    "players:read",
    "players:write",
    "tokens:mint",
    "games:read",
    "games:write",
    "audit:read",
    "webhooks:read",
    "webhooks:write",
]
USER_ID = 7731  # a value no template holds: it must never show in an access line
MARK = "qsmark"  # sent in query strings, encoded paths and headers: never logged, never answered
PROBLEM_TYPE = "application/problem+json"
GAME_JSON_TYPE = "application/json; charset=utf-8"
ACCESS = re.compile(r'^\S+ "(?P<method>[A-Z]+) (?P<route>\S+) HTTP/1\.[01]" (?P<status>\d{3}) ')

pytestmark = pytest.mark.engine("sqlite")


class Service:
    """One gunicorn (the shipped config) on TCP loopback: its port and the file its output goes
    to."""

    def __init__(self, proc, port: int, log: Path):
        self.proc = proc
        self.port = port
        self.log = log

    def access_lines(
        self, count: int, route: str | None = None, timeout: float = 15
    ) -> list[re.Match]:
        """The access lines (of ``route``), once there are ``count`` (gunicorn writes each after its
        answer)."""
        deadline = time.monotonic() + timeout
        while True:
            lines = [
                m
                for line in self.log.read_text(errors="replace").splitlines()
                if (m := ACCESS.match(line)) and route in (None, m["route"])
            ]
            if len(lines) >= count or time.monotonic() > deadline:
                return lines

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=20)
        return self.log.read_text(errors="replace")


def _serve(env: dict, root: Path, app: str, worker_class: str) -> Service:
    port = free_port()
    log_path = root / f"gunicorn-{app.split(':')[0]}-{worker_class}.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AUTHSVC_")}
    run_env = {
        **clean,
        **env,
        "AUTHSVC_WORKERS": "1",
        "AUTHSVC_WORKER_CLASS": worker_class,
        "AUTHSVC_THREADS": "2" if worker_class == "gthread" else "1",
    }
    proc = serve_gunicorn(
        run_env,
        "--graceful-timeout",
        "5",
        port=port,
        log_path=log_path,
        app=app,
        workers=None,
        config=CONF,
        inherit_env=False,
        cwd=root,
    )
    return Service(proc, port, log_path)


class World:
    def __init__(self, env: dict, root: Path, token: str, game_id: int):
        self.env = env
        self.root = root
        self.token = token
        self.game_id = game_id


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    """A migrated SQLite store with a game, the player USER_ID and an API token with every scope."""
    root = tmp_path_factory.mktemp("admin-serving")
    secret = root / "token-secret"
    secret.write_text(os.urandom(32).hex() + "\n")
    secret.chmod(0o600)
    env = {
        "AUTHSVC_STORE": "sqlite://" + str(root / "authsvc.db"),
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret),
        "AUTHSVC_ADMIN_RATE": "0",
        "AUTHSVC_MAX_STALENESS": "0",
    }
    settings = Settings.from_env(env)
    store = open_store(settings.store, readonly=False, settings=settings)
    store.migrate()
    game = factories.add_game(store, "Chess", api_key_digest(new_api_key()), int(time.time()))
    factories.add_player(store, USER_ID, "logged_player")
    _, token = api_tokens.add_api_token(
        store, Context(actor="cli:test"), "serving", ALL_SCOPES, None
    )
    store.close()
    return World(env, root, token, game.id)


@pytest.fixture(scope="module", params=["sync", "gthread"])
def admin(request, world):
    service = _serve(world.env, world.root, "authsvc.api.wsgi:application", request.param)
    yield service
    output = service.stop()
    assert "Traceback" not in output, output
    assert world.token not in output


# -- the access line -----------------------------------------------------------------------------


def _requests(world: World) -> list[tuple[str, str, dict | None, str]]:
    """(method, path as sent, JSON body, the route the access line must name), every admin route."""
    game, user = world.game_id, USER_ID
    return [
        ("GET", f"/v1/players/{user}?{MARK}=1", None, "/v1/players/{user_id}"),
        ("HEAD", f"/v1/players/{user}", None, "/v1/players/{user_id}"),
        ("PUT", f"/v1/players/{user}?{MARK}", {"username": "renamed"}, "/v1/players/{user_id}"),
        ("POST", f"/v1/players/{user}/revoke?{MARK}", None, "/v1/players/{user_id}/revoke"),
        (
            "POST",
            "/v1/players/batch",
            {"players": [{"user_id": user + 1, "username": "other"}]},
            "/v1/players/batch",
        ),
        ("POST", f"/v1/tokens?{MARK}", {"game_id": game, "user_id": user}, "/v1/tokens"),
        ("POST", "/v1/games", {"name": "Go"}, "/v1/games"),
        ("GET", f"/v1/games/{game}", None, "/v1/games/{game_id}"),
        ("PATCH", f"/v1/games/{game}", {"enabled": True}, "/v1/games/{game_id}"),
        ("POST", f"/v1/games/{game}/keys", {"old_key_ttl": 0}, "/v1/games/{game_id}/keys"),
        ("GET", f"/v1/audit?actor={MARK}&player={user}", None, "/v1/audit"),
        ("GET", f"/openapi.json?{MARK}", None, "/openapi.json"),
        (
            "DELETE",
            f"/v1/players/{user + 1}?{MARK}",
            None,
            "/v1/players/{user_id}",
        ),  # the batch's player
        (
            "POST",
            f"/v1/players/{user}",
            None,
            "/v1/players/{user_id}",
        ),  # 405: the route, another method
        (
            "GET",
            f"/v1/players/{user}%3F{MARK}=1",
            None,
            "<other>",
        ),  # the "?" encoded: 404, never the path
        ("GET", f"/v1/players/{user}/{MARK}", None, "<other>"),
        ("GET", f"/{MARK}", None, "<other>"),
    ]


def test_the_access_line_names_the_admin_route_template_never_the_path_or_query(admin, world):
    sent = _requests(world)
    for method, path, body, _ in sent:
        conn = http.client.HTTPConnection("127.0.0.1", admin.port, timeout=10)
        response = admin_request(
            conn,
            method,
            path,
            world.token,
            body,
            {"User-Agent": MARK, "X-Request-Id": f"rid-{MARK}"},
        )
        response.read()
        assert response.status < 500, (method, path, response.status)
        conn.close()
    lines = admin.access_lines(len(sent))
    # In any order: a gthread worker may write a line after the next request's line
    assert sorted((m["method"], m["route"]) for m in lines) == sorted(
        (method, route) for method, _, _, route in sent
    )
    for m in lines:
        line = re.sub(
            r" rid=[0-9a-f]{32} ", " ", m.string
        )  # the service's own id: random hex, which may hold 7731
        assert str(USER_ID) not in line, line
        assert MARK not in line, line


def test_the_access_line_holds_the_request_id_the_answer_and_the_audit_trail_hold(admin, world):
    """The admin app makes its own id for every request, whatever X-Request-Id the client sent
    (none, one not in the logged shape, one in it); the access line holds that one, as the answer's
    header and the audit record do, never the client's nor "-"."""
    route = "/v1/players/{user_id}/revoke"
    before = len(admin.access_lines(0, route))
    ids = []
    for sent in (None, "bad id with spaces", "web-tier.42"):
        conn = http.client.HTTPConnection("127.0.0.1", admin.port, timeout=10)
        response = admin_request(
            conn,
            "POST",
            f"/v1/players/{USER_ID}/revoke",
            world.token,
            headers={"X-Request-Id": sent} if sent else {},
        )
        response.read()
        assert response.status == 200
        ids.append(response.getheader("X-Request-Id"))
        conn.close()
    assert all(re.fullmatch(r"[0-9a-f]{32}", rid) for rid in ids) and len(set(ids)) == 3, ids
    logged = [
        m.string.rpartition("rid=")[2].split()[0]
        for m in admin.access_lines(before + 3, route)[before:]
    ]
    assert sorted(logged) == sorted(ids)  # a gthread worker may write them out of order


def test_every_route_template_is_a_path_of_the_openapi_document():
    """The access line's names are the document's paths (docs/logs.md), for every route routes.py
    has."""
    paths = set(json.loads(DOCUMENT.read_text(encoding="utf-8"))["paths"])
    templates = {routes.template(pattern) for pattern, _ in routes._ROUTES}
    assert templates and templates <= paths
    assert routes.route_template("/v1/players/12") == "/v1/players/{user_id}"
    assert (
        routes.route_template("/v1/players/12%3Fa")
        == routes.route_template("/v1/players/012")
        == "<other>"
    )


# -- a chunked body --------------------------------------------------------------------------------


def _chunked(
    method: str, path: str, token: str, chunks: list[bytes], end: bytes = b"0\r\n\r\n"
) -> bytes:
    """A request whose JSON body is sent with Transfer-Encoding: chunked, in ``chunks``, then
    ``end``."""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + end


def _keys(world: World) -> list:
    settings = Settings.from_env(world.env)
    store = open_store(settings.store, readonly=True, settings=settings)
    try:
        return list(store.get_game(world.game_id).keys)
    finally:
        store.close()


def test_a_chunked_body_is_read_and_one_that_cannot_be_is_never_written(admin, world):
    """A key rotation sent with Transfer-Encoding: chunked was read as no body: 201 with the default
    day of overlap, the leaked key still working. Its body is read (the old keys expire now), and a
    chunked body over the route's cap, or one whose framing breaks, is refused before anything is
    written."""
    path = f"/v1/games/{world.game_id}/keys"
    status, _, body = raw_request(
        admin.port, _chunked("POST", path, world.token, [b'{"old_key_', b'ttl": 0}'])
    )
    assert status == 201, body
    now = time.time()
    rotated = json.loads(body)
    assert now - 5 <= rotated["old_keys_expire_at"] <= now + 1, rotated["old_keys_expire_at"]
    keys = _keys(world)
    assert len([k for k in keys if k.expires_at is None or k.expires_at > now + 1]) == 1, (
        keys
    )  # the new one
    refused = {
        "over the cap": (
            _chunked(
                "PUT",
                f"/v1/players/{USER_ID}",
                world.token,
                [b'{"username": "' + b"x" * 9000, b"y" * 9000 + b'"}'],
            ),
            413,
            "too-large",
        ),
        "a chunk size that is not hex": (
            _chunked("POST", path, world.token, [], end=b"zz\r\n{}\r\n0\r\n\r\n"),
            400,
            "bad-request",
        ),
    }
    for what, (data, want, slug) in refused.items():
        status, headers, body = raw_request(admin.port, data)
        assert (status, headers.get("content-type")) == (want, PROBLEM_TYPE), (
            what,
            status,
            body[:300],
        )
        assert json.loads(body)["type"] == "urn:authsvc:problem:" + slug, (what, body)
    assert len(_keys(world)) == len(keys)  # no key made by the refused rotation
    conn = http.client.HTTPConnection("127.0.0.1", admin.port, timeout=10)
    assert admin_request(conn, "GET", f"/v1/players/{USER_ID}", world.token).status == 200
    conn.close()


# -- what gunicorn itself refuses ------------------------------------------------------------------


def refused_requests() -> dict[str, tuple[bytes, int]]:
    """Requests gunicorn refuses before any app sees them (the shipped config's limits), and its
    status."""
    host = b"Host: admin\r\n"
    get = f"GET /v1/audit?{MARK}=1 HTTP/1.1\r\n".encode()
    line_limit, field_limit, fields_limit = 8190, 16384, 16384  # deploy/gunicorn.conf.py
    return {
        "malformed request line": (
            f"GET /v1/audit?{MARK} HTTP/1.1 x\r\n".encode() + host + b"\r\n",
            400,
        ),
        "NUL in the request line": (
            f"GET /v1/audit?{MARK}\x00 HTTP/1.1\r\n".encode() + host + b"\r\n",
            400,
        ),
        "garbage": (b"\x16\x03\x01hello\r\n\r\n", 400),
        "request line over the limit": (
            f"GET /v1/audit?{MARK}=".encode()
            + b"p" * line_limit
            + b" HTTP/1.1\r\n"
            + host
            + b"\r\n",
            414,
        ),
        "header line over the limit": (
            get + host + f"X-{MARK}: ".encode() + b"p" * field_limit + b"\r\n\r\n",
            431,
        ),
        "too many header lines": (get + host + b"X-A: b\r\n" * (fields_limit + 1) + b"\r\n", 431),
        "invalid header value": (get + host + f"X-A: {MARK}\x01\r\n\r\n".encode(), 400),
        "space in a header name": (get + host + f"X {MARK}: b\r\n\r\n".encode(), 400),
        "folded header line": (get + host + f"X-A: a\r\n  {MARK}\r\n\r\n".encode(), 400),
        "unknown transfer coding": (
            b"POST /v1/games HTTP/1.1\r\n" + host + b"Transfer-Encoding: gzip\r\n\r\n",
            400,
        ),
        "unknown Expect": (get + host + b"Expect: 100-nope\r\n\r\n", 417),
    }


# The reason phrases of RFC 9110, as docs/admin-api.md shows them (Python's http module says
# "Request-URI Too Long" before 3.13).
TITLES = {
    400: "Bad Request",
    414: "URI Too Long",
    417: "Expectation Failed",
    431: "Request Header Fields Too Large",
}


def test_what_gunicorn_refuses_is_an_admin_problem_json(admin):
    failures = {}
    for what, (data, status) in refused_requests().items():
        try:
            got, headers, body = raw_request(admin.port, data)
            assert (got, headers.get("content-type")) == (status, PROBLEM_TYPE), (
                got,
                headers,
                body[:300],
            )
            problem = json.loads(body)
            assert set(problem) == {"type", "title", "status", "detail"}, problem
            assert problem["status"] == status and problem["type"].startswith(
                "urn:authsvc:problem:"
            ), problem
            assert problem["title"] == TITLES[status], problem
            assert headers["connection"] == "close" and headers["cache-control"] == "no-store", (
                headers
            )
            assert headers["content-length"] == str(len(body)), headers
            assert MARK.encode() not in body, body
        except (AssertionError, OSError, ValueError) as e:
            failures[what] = str(e)[:400]
    assert not failures, json.dumps(failures, indent=1)
    # The service still answers after them.
    conn = http.client.HTTPConnection("127.0.0.1", admin.port, timeout=10)
    conn.request("GET", "/openapi.json")
    assert conn.getresponse().status == 200
    conn.close()


@pytest.mark.parametrize("worker_class", ["sync", "gthread"])
def test_the_game_facing_service_still_refuses_in_its_own_json(world, worker_class):
    """The same config serving the game-facing app: the same refusals, in docs/api.md's JSON."""
    service = _serve(world.env, world.root, "authsvc.wsgi:application", worker_class)
    try:
        for what, (data, status) in refused_requests().items():
            got, headers, body = raw_request(service.port, data)
            assert (got, headers.get("content-type")) == (status, GAME_JSON_TYPE), (
                what,
                got,
                headers,
                body[:300],
            )
            assert set(json.loads(body)) == {"success", "error", "error_description"}, (what, body)
    finally:
        output = service.stop()
    assert "Traceback" not in output, output


def test_a_refusal_that_fails_falls_back_to_the_game_facing_json():
    """An app's gunicorn_refusal that raises must not leave the client without an answer."""
    from authsvc.serving.workers import app_refusal, json_error_response

    def broken(status: int):
        raise RuntimeError("broken")

    for refusal in (
        broken,
        lambda status: ((("X-Bad", "\u00e9"),), b"{}"),
    ):  # raises; or a header not ASCII
        answer = json_error_response(431, refusal)
        assert answer.startswith(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\nConnection: close\r\n"
        )
        assert answer.endswith(
            b'{"success":false,"error":431,"error_description":"Request header too large"}'
        )
    assert app_refusal(object()) is None and app_refusal(None) is None
