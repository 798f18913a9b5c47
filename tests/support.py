"""Test helpers that are not fixtures, shared by the test modules.

A test module (test_*.py) never imports another test module (tests/unit/test_suite_rules.py
checks it): what two modules share lives here, in tests/deploy_support.py (the real
nginx + gunicorn stack), tests/pgserver.py, or harness/ (shared with benchmarks/).

Tests that need a server nobody started (PostgreSQL, nginx, ...) call
``skip_or_fail(reason)``: a skip on a laptop, a failure when
``AUTHSVC_TEST_STRICT=1`` (set by .ci/run), so CI never counts a skip as a pass.
"""

from __future__ import annotations

import dataclasses
import gc
import http.client
import json
import os
import shutil
import socket
import sqlite3
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
import webtest

from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.tokens import api_key_digest, mint_token, new_api_key
from authsvc.web.app import make_app
from harness.processes import free_port, start_gunicorn, wait_for_port
from tests import factories

__all__ = [
    "ADMIN_WINGS",
    "ALL_SCOPES",
    "ERROR_KEYS",
    "INVALID",
    "MISSING",
    "NODE_MODULES",
    "PATH",
    "STRICT",
    "AdminClient",
    "FakeClock",
    "admin_request",
    "assert_contract_headers",
    "free_port",
    "get",
    "get_text",
    "hold_write_lock",
    "kept_stopped",
    "make_testapp",
    "node_tool",
    "raw_exchange",
    "raw_request",
    "schemathesis_check",
    "serve_gunicorn",
    "skip_or_fail",
    "start_gunicorn",
    "until_both_workers_counted",
    "wait_for_port",
    "WRITER_MODULES",
    "workers_that_authenticated",
    "apply_roles",
    "init_as_owner",
]

STRICT = os.environ.get("AUTHSVC_TEST_STRICT") == "1"
# The package's admin side (cli/, api/, operations/) and the store modules that write: the web path
# reaches neither (tests/unit/test_layout.py reads the imports;
# tests/integration/test_web_process.py loads the app).
ADMIN_WINGS = {"cli", "api", "operations"}
WRITER_MODULES = {
    "authsvc.store.sqlite.store",
    "authsvc.store.postgres.store",
    "authsvc.store.writes",
}
DEPLOY_PG = Path(__file__).resolve().parent.parent / "deploy" / "postgres"
NODE_MODULES = Path(__file__).resolve().parent.parent / "node_modules"


def skip_or_fail(reason: str):
    """Skip (laptop) or fail (CI, AUTHSVC_TEST_STRICT=1) a test whose server is missing."""
    if STRICT:
        pytest.fail(f"required in CI (AUTHSVC_TEST_STRICT=1): {reason}", pytrace=False)
    pytest.skip(reason)


def node_tool(name: str) -> tuple[str, Path]:
    """(node, the path of ``name`` under node_modules/): a package of package.json, pinned in
    package-lock.json and installed by scripts/test (npm ci), or skip_or_fail saying what is
    missing."""
    node = shutil.which("node")
    if node is None:
        skip_or_fail("node is not installed (.ci/run installs nodejs and npm)")
    path = NODE_MODULES / name
    if not path.exists():
        skip_or_fail(
            f"node_modules/{name} is missing: scripts/test installs package-lock.json's packages "
            "(npm ci)"
        )
    return node, path


def schemathesis_check(name: str):
    """A built-in schemathesis check, by the name its reports use (to exclude it from one call)."""
    from schemathesis.checks import CHECKS, load_all_checks

    load_all_checks()
    (check,) = CHECKS.get_by_names([name])
    return check


def hold_write_lock(url: str, user_id: int | None):
    """Another session that holds a write lock on the store (as a long import does); returns
    release().
    On PostgreSQL the player's row, or with no user id the writer lock (the audit chain's row,
    authsvc/store/writes.py); on SQLite the file's write lock either way."""
    if url.startswith("sqlite://"):
        conn = sqlite3.connect(
            url.removeprefix("sqlite://"), isolation_level=None, check_same_thread=False
        )
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE players SET username = username WHERE user_id = ?", (user_id or 0,))
    else:
        import psycopg

        conn = psycopg.connect(url)
        if user_id is None:
            conn.execute("SELECT 1 FROM audit_chain FOR UPDATE")
        else:
            conn.execute("SELECT 1 FROM players WHERE user_id = %s FOR UPDATE", (user_id,))
    # Bounded even if the waiting side never gives up (before the lock wait existed, PostgreSQL
    # waited forever).
    timer = threading.Timer(10, conn.rollback)
    timer.start()

    def release():
        timer.cancel()
        conn.rollback()
        conn.close()

    return release


PATH = "/api/authenticate.json"
ERROR_KEYS = {"success", "error", "error_description"}
# The wire's two texts, written here once as the tests expect them (never the code's own constants).
INVALID_TEXT = "Invalid credentials"
MISSING_TEXT = "user_id, game_auth_token, and api_key are required parameters"
INVALID = {"success": False, "error": 403, "error_description": INVALID_TEXT}
MISSING = {"success": False, "error": 400, "error_description": MISSING_TEXT}


def make_testapp(settings: Settings, **overrides) -> webtest.TestApp:
    """The WSGI app on ``settings`` (some replaced), through WebTest with its WSGI lint on."""
    if overrides:
        settings = dataclasses.replace(settings, **overrides)
    return webtest.TestApp(make_app(settings), lint=True)


def assert_contract_headers(response):
    """Headers every answer carries (docs/api.md), and a body clients can parse line by line."""
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert not [h for h in response.headers if h.lower().startswith("access-control-")]
    assert "Transfer-Encoding" not in response.headers
    if response.request.method != "HEAD":
        assert int(response.headers["Content-Length"]) == len(response.body)
        assert response.body.isascii() and b"\n" not in response.body


def get(port: int, params: dict, method: str = "GET") -> http.client.HTTPResponse:
    """One request to the API path on 127.0.0.1:port; the body is read into ``response.body``.
    30 s: a first request may wait for a worker that a loaded machine boots slowly."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, PATH + "?" + urllib.parse.urlencode(params))
    response = conn.getresponse()
    response.body = response.read()  # type: ignore[attr-defined]
    conn.close()
    return response


def serve_gunicorn(env: dict, *args: str, port: int, log_path: Path, **options) -> subprocess.Popen:
    """gunicorn (harness.processes.start_gunicorn: ``env``, ``args`` and ``options``) on
    127.0.0.1:``port``,
    once it listens. Its output goes to ``log_path``, not a pipe: every request writes log lines,
    and a
    pipe nobody reads until the end fills up and blocks the workers. If nothing listens in time, it
    is
    killed and the test fails with that output."""
    with log_path.open("wb") as log:
        proc = start_gunicorn(env, *args, port=port, stdout=log, stderr=log, **options)
    try:
        wait_for_port(port)
    except TimeoutError:
        proc.kill()
        proc.wait(timeout=20)
        raise AssertionError(
            "gunicorn did not start:\n" + log_path.read_text(errors="replace")
        ) from None
    return proc


# Every scope an API token may hold (docs/admin-api.md, "Tokens and scopes").
ALL_SCOPES = [
    "players:read",
    "players:write",
    "tokens:mint",
    "games:read",
    "games:write",
    "audit:read",
]


class AdminClient:
    """The admin API (an AdminApp on ``settings``) through WebTest with its WSGI lint on, and API
    tokens for
    it added to ``store`` as the command adds them (actor ``cli:test``). tests/conftest.py's
    ``admin``."""

    def __init__(self, settings: Settings, store):
        from authsvc.api.app import AdminApp

        self.api = AdminApp(settings)
        self.app = webtest.TestApp(self.api, lint=True)
        self.store = store

    def bearer(
        self, name: str, scopes=ALL_SCOPES, expires_in: int | None = None
    ) -> tuple[dict, str]:
        """(the Authorization header of a new token, the token)."""
        from authsvc.operations import api_tokens
        from authsvc.operations.context import Context

        _, token = api_tokens.add_api_token(
            self.store, Context(actor="cli:test"), name, scopes, expires_in
        )
        return {"Authorization": f"Bearer {token}"}, token

    def headers(self, name: str, scopes=ALL_SCOPES, expires_in: int | None = None) -> dict:
        """The Authorization header of a new token."""
        return self.bearer(name, scopes, expires_in)[0]

    def close(self) -> None:
        self.api.store.close()


def apply_roles(pg):
    """deploy/postgres/roles.sql run by psql as the DBA on the throwaway server ``pg``
    (tests/pgserver.py);
    returns url(role): the authsvc database as ``role``, over TCP."""
    subprocess.run(
        [
            os.path.join(pg.bin_dir, "psql"),
            pg.url,
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-f",
            str(DEPLOY_PG / "roles.sql"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return lambda role: f"postgresql://{role}@127.0.0.1:{pg.port}/authsvc"


def init_as_owner(pg, secret_file, monkeypatch):
    """apply_roles, then ``authsvc init`` as the owner (the environment: ``secret_file``, no
    settings file);
    the environment then names the store as the admin role, as the everyday admin command has it.
    Returns url(role)."""
    from authsvc.cli import command as cli

    url = apply_roles(pg)
    monkeypatch.setenv("AUTHSVC_TOKEN_SECRET_FILE", str(secret_file))
    monkeypatch.delenv("AUTHSVC_CONFIG", raising=False)
    monkeypatch.setenv("AUTHSVC_STORE", url("authsvc_owner"))
    assert cli.main(["init"]) == 0
    monkeypatch.setenv("AUTHSVC_STORE", url("authsvc_admin"))
    return url


def admin_request(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    token: str,
    body: dict | None = None,
    headers: dict | None = None,
) -> http.client.HTTPResponse:
    """One admin API request on ``conn``: the bearer ``token``, ``headers``, ``body`` as JSON; its
    response
    (not yet read)."""
    headers = {"Authorization": f"Bearer {token}", **(headers or {})}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    return conn.getresponse()


def raw_exchange(sock: socket.socket, data: bytes, timeout: float = 10) -> tuple[int, dict, bytes]:
    """Send ``data``, read one answer (head, then Content-Length bytes or until close): its status,
    headers (lower-case names) and body."""
    sock.settimeout(timeout)
    sock.sendall(data)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1."), f"no HTTP answer: {buf[:200]!r}"
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", -1))
    while length < 0 or len(body) < length:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        body += chunk
    return status, headers, body


def raw_request(
    port: int, data: bytes, *, tls_host: str | None = None, ca_file=None, source: str = "127.0.0.1"
) -> tuple[int, dict, bytes]:
    """``data`` sent to 127.0.0.1:``port`` on a new connection (TLS with ``tls_host``, from
    ``source``):
    raw_exchange's answer."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    try:
        if tls_host:
            ctx = ssl.create_default_context(cafile=str(ca_file))
            sock = ctx.wrap_socket(sock, server_hostname=tls_host)
        return raw_exchange(sock, data)
    finally:
        sock.close()


class FakeClock:
    """A clock that moves only when a test sets ``now``."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def get_text(port: int, path: str) -> tuple[int, str]:
    """One GET of ``path`` on 127.0.0.1:port, on a new connection: (status, body as text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        res = conn.getresponse()
        return res.status, res.read().decode()
    finally:
        conn.close()


def authentications_by_worker(metrics_dir, result: str | None = None) -> dict[str, float]:
    """Each worker file's (prometheus_client's counter_<pid>.db, one per process) authentication
    count,
    of one ``result`` (the reason label: "success", "store_unavailable", ...) or of all."""
    try:
        from prometheus_client.mmap_dict import MmapedDict
    except ImportError:
        skip_or_fail(
            "prometheus_client is not installed (pip install -e '.[metrics]'): it tells the "
            "workers apart"
        )

    def counted(key: str) -> bool:  # key: prometheus_client's JSON [metric, sample, labels, help]
        metric, _, labels, *_ = json.loads(key)
        return metric == "authsvc_authentications" and result in (None, labels.get("result"))

    def count(path) -> float:
        try:
            return sum(
                value
                for key, value, *_ in MmapedDict.read_all_values_from_file(str(path))
                if counted(key)
            )
        except struct.error:  # a worker that is booting has made its file but not yet sized it
            return 0

    return {f.name: count(f) for f in metrics_dir.glob("counter_*.db")}


def workers_that_authenticated(metrics_dir) -> int:
    """Worker files (prometheus_client's, one per process) holding a non-zero authentication
    count."""
    return sum(bool(count) for count in authentications_by_worker(metrics_dir).values())


def until_both_workers_counted(
    port: int,
    params: dict,
    metrics_dir,
    limit: int = 2000,
    status: int = 200,
    result: str | None = None,
    answer: dict | None = None,
) -> int:
    """Authentications, each on a new connection, until two gunicorn workers have each counted more
    of them (of ``result``, if given) than when called: the kernel may hand one worker every
    connection for a while. Each must be answered ``status`` (and ``answer``, if given). The
    workers count in PROMETHEUS_MULTIPROC_DIR=``metrics_dir`` (tests/functional/test_metrics.py,
    tests/integration/test_prometheus.py, the "both workers" tests). Returns how many were sent; at
    most ``limit``."""
    before = authentications_by_worker(metrics_dir, result)
    sent = 0
    query = PATH + "?" + urllib.parse.urlencode(params)
    while (
        sum(n > before.get(f, 0) for f, n in authentications_by_worker(metrics_dir, result).items())
        < 2
    ):
        assert sent < limit, (
            f"one worker answered every request: {authentications_by_worker(metrics_dir, result)}"
        )
        got_status, body = get_text(port, query)
        assert got_status == status, (got_status, body)
        if answer is not None:
            assert json.loads(body) == answer, body
        sent += 1
    return sent


def provision_postgres(url: str, secret_file) -> tuple[Settings, dict, dict]:
    """A migrated store at ``url`` with one game and player 77: (settings, valid request parameters,
    the app's environment with short PostgreSQL timeouts) for the outage and worker-boot tests."""
    env = {
        "AUTHSVC_STORE": url,
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
        "AUTHSVC_PG_CONNECT_TIMEOUT": "2",
        "AUTHSVC_PG_STATEMENT_TIMEOUT": "1",
    }
    settings = Settings.from_env(env)
    api_key = new_api_key()
    store = open_store(url, readonly=False, settings=settings)
    try:
        store.migrate()
        game = factories.add_game(store, "Chess", api_key_digest(api_key), int(time.time()))
        factories.add_player(store, 77, "carol")
    finally:
        store.close()
    token = mint_token(settings.token_secrets[0], game.id, 77, 0)
    return settings, {"user_id": "77", "game_auth_token": token, "api_key": api_key}, env


def profile(call) -> list[str]:
    """Every Python and C function called by ``call()``, in order."""
    calls: list[str] = []

    def record(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_qualname)
        elif event == "c_call":
            calls.append(getattr(arg, "__qualname__", repr(arg)))

    # No garbage collection meanwhile: an earlier test's leftover (a psycopg connection's __del__)
    # would show up among the calls of whichever case the collector happened to run in.
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    sys.setprofile(record)
    try:
        call()
    finally:
        sys.setprofile(None)
        if enabled:
            gc.enable()
    return calls[:-1]  # the last one is sys.setprofile itself


def kept_stopped() -> set[int]:
    """The exit statuses after which systemd does not start the service again: the
    RestartPreventExitStatus
    of deploy/systemd/authsvc.service (docs/operations.md, "Exit statuses")."""
    unit = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        "deploy",
        "systemd",
        "authsvc.service",
    )
    with open(unit) as f:
        (line,) = [
            line for line in f.read().splitlines() if line.startswith("RestartPreventExitStatus=")
        ]
    return {int(word) for word in line.partition("=")[2].split()}


def instructions(call) -> list[str]:
    """Every Python bytecode instruction ``call()`` executes, in order: 'function@offset'.

    Finer than ``profile``: two calls of the same functions that take another branch inside
    one (an ``if`` that stops early for one input) differ here. C code is not seen.
    """
    executed: list[str] = []

    def trace(frame, event, arg):
        if event == "call":
            frame.f_trace_opcodes = True
        elif event == "opcode":
            executed.append(f"{frame.f_code.co_qualname}@{frame.f_lasti}")
        return trace

    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
    return executed


def store_sql(store_url: str, statement: str, params: tuple = ()) -> list[tuple]:
    """One statement on the store as its owner (the SQLite file, or PostgreSQL's session database);
    ``?`` placeholders on both engines."""
    import sqlite3

    if store_url.startswith("sqlite://"):
        with sqlite3.connect(store_url.removeprefix("sqlite://"), isolation_level=None) as conn:
            return conn.execute(statement, params).fetchall()
    import psycopg

    with psycopg.connect(store_url, autocommit=True) as conn:
        cur = conn.execute(statement.replace("?", "%s"), params)
        return cur.fetchall() if cur.description else []


def problem(response, status: int, slug: str) -> dict:
    """A WebTest answer of the admin API: the RFC 9457 problem of that status and type, no
    traceback."""
    assert response.status_int == status
    assert response.headers["Content-Type"] == "application/problem+json"
    body = response.json
    assert body["type"] == f"urn:authsvc:problem:{slug}" and body["status"] == status
    assert isinstance(body["title"], str) and isinstance(body["detail"], str)
    assert "Traceback" not in response.text
    return body


def audit_rows(store_url: str) -> list[tuple]:
    """The audit trail's rows, oldest first, read straight from either engine's store."""
    statement = "SELECT actor, request_id, action, user_id, changes FROM audit ORDER BY id"
    if store_url.startswith("sqlite://"):
        with sqlite3.connect(store_url.removeprefix("sqlite://")) as conn:
            return conn.execute(statement).fetchall()
    import psycopg

    with psycopg.connect(store_url, autocommit=True) as conn:
        return conn.execute(statement).fetchall()


class Receiver:
    """A webhook receiver on 127.0.0.1 (HTTP/1.1, keep-alive): keeps each POST as (headers, body) in
    ``requests``; ``answer(headers, body)`` gives the status (and optional headers) of each
    answer."""

    def __init__(self, answer=None, tls: ssl.SSLContext | None = None, port: int = 0):
        import http.server

        receiver = self
        self.scheme = "https" if tls else "http"
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.answer = answer or (lambda headers, body: 200)
        self.lock = threading.Lock()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver.lock:
                    receiver.requests.append((headers, body))
                answer = receiver.answer(headers, body)
                status, extra = answer if isinstance(answer, tuple) else (answer, {})
                self.send_response(status)
                for name, value in extra.items():
                    self.send_header(name, value)
                body = b"" if status in (204, 304) else b"ok"
                if status not in (204, 304):
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def url(self, path: str = "/hook", host: str = "127.0.0.1") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"

    def bodies(self) -> list[dict]:
        with self.lock:
            return [json.loads(body) for _, body in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def fan_out(store, limit: int = 10_000) -> tuple[int, bool]:
    """The deliverer's fan-out step (store/deliveries.py) at the wall clock: (deliveries written,
    events left)."""
    return store.fan_out_events(int(time.time() * 1000), limit)


def add_webhook(
    store_url: str, url: str, events: list[str], secret: str, game_id: int | None = None
) -> int:
    """A webhook row as a subscription writes it (its events from the next one on); its id."""
    now = int(time.time() * 1000)
    store_sql(
        store_url,
        "INSERT INTO webhooks (url, events, game_id, secret, created_at, fanned_out) "
        "VALUES (?, ?, ?, ?, ?, (SELECT coalesce(max(id), 0) FROM events))",
        (url, json.dumps(events), game_id, secret, now),
    )
    return store_sql(store_url, "SELECT max(id) FROM webhooks")[0][0]
