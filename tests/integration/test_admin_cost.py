"""What one API token's bodies may cost the others (docs/admin-api.md, "Rate limit"): a body counts
one more unit of the rate for each 64 KiB, and a token has one large body (over 64 KiB, or chunked)
in flight at a time, under WebTest and under real gunicorn as the docs run it. What the costliest
bodies of one token cost another token's GETs is measured by ``scripts/bench --only admin-cost``
(BENCHMARKS.md), not here: a latency tail on a shared machine is a benchmark's figure, not a test's.

The finding, against the release before: the rate limit counted requests, so one players:write
token sending 12 dry-run batches of 3.9 MB in 10 s (far under 50 a second) pushed another token's
GET from 2 ms to 3.8 s. The mechanism is tested exactly (a fake clock, a slot held).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
from pathlib import Path

import pytest

from authsvc.api.ratelimit import RateLimit
from authsvc.operations import api_tokens
from authsvc.operations.context import Context
from authsvc.settings import Settings
from authsvc.store import open_store
from harness.hostile_bodies import costliest_batch
from tests import factories
from tests.support import FakeClock, free_port, problem, start_gunicorn, wait_for_port

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "deploy" / "gunicorn.conf.py"
ADMIN_TOML = REPO / "deploy" / "etc" / "admin.toml"
BATCH = "/v1/players/batch"


@pytest.fixture
def limited(admin):
    """(WebTest app, make_token(name) -> headers, the fake clock of its rate limit: 50 a second,
    bursts of 100)."""
    clock = FakeClock()
    admin.api.rate_limit = RateLimit(50, 100, clock=clock)

    def make_token(name: str) -> dict:
        return {**admin.headers(name, ["players:write"]), "Content-Type": "application/json"}

    return admin.app, make_token, clock


@pytest.mark.engine("sqlite")
def test_a_body_counts_one_more_unit_of_the_rate_for_each_64_kib(limited):
    app, make_token, clock = limited
    web = make_token("web")
    body = costliest_batch()
    assert 1 + len(body) // 65536 == 64  # its cost: a bucket of 100 holds one such call, not two
    assert app.post(BATCH, body, headers=web).status_int == 200
    r = app.post(BATCH, body, headers=web, expect_errors=True)
    assert problem(r, 429, "too-many-requests")["detail"] == (
        "this api token is over its rate of 50 requests a second (a body counts one more for each "
        "64 KiB); try again after Retry-After seconds"
    )
    assert r.headers["Retry-After"] == "1"  # (64 - 36) / 50 = 0.56 s, in whole seconds
    for _ in range(36):  # the 36 units left still serve 36 small calls
        assert app.put_json("/v1/players/7", {"username": "small"}, headers=web).status_int in (
            200,
            201,
        )
    assert (
        app.put_json(
            "/v1/players/7", {"username": "small"}, headers=web, expect_errors=True
        ).status_int
        == 429
    )
    clock.now += 1.3  # 64 units at 50 a second: 1.28 s
    assert app.post(BATCH, body, headers=web).status_int == 200
    other = make_token("other")  # a bucket of its own
    assert app.post(BATCH, body, headers=other).status_int == 200


@pytest.mark.engine("sqlite")
def test_a_token_has_one_large_body_in_flight_at_a_time(limited):
    app, make_token, _ = limited
    web, other = make_token("web"), make_token("other")
    body = json.dumps(
        {"players": [{"user_id": n, "username": "p" * 80} for n in range(1, 1001)], "dry_run": True}
    ).encode()
    assert len(body) > 65536  # large
    assert app.app.rate_limit.hold_large(
        "web"
    )  # as a request of web's reading its large body would
    r = app.post(BATCH, body, headers=web, expect_errors=True)
    assert problem(r, 429, "too-many-requests")["detail"] == (
        "this api token has another large body in flight (over 64 KiB, or chunked): send them one "
        "at a time; try again after Retry-After seconds"
    )
    assert r.headers["Retry-After"] == "1"
    assert (
        app.put_json("/v1/players/7", {"username": "small"}, headers=web).status_int == 201
    )  # small: no slot
    assert app.post(BATCH, body, headers=other).status_int == 200  # another token's slot
    app.app.rate_limit.release_large("web")
    assert app.post(BATCH, body, headers=web).status_int == 200
    assert app.post(BATCH, body, headers=web).status_int == 200  # each request gives the slot back


def test_a_chunked_body_pays_for_its_length_once_read():
    clock = FakeClock()
    limit = RateLimit(50, 100, clock=clock)
    assert limit.wait("web", 1) == 0  # a chunked request is let in at one unit
    limit.charge("web", 64)  # its 4 MiB, once read
    assert limit.wait("web", 1) == 0 and limit.wait("web", 35) == pytest.approx(1 / 50)  # 34 left
    limit.charge("web", 1000)  # never more than a full bucket: 34 - 100
    assert limit.wait("web", 1) == pytest.approx(67 / 50)


def test_a_printable_name_is_checked_at_once_and_the_names_rule_is_unchanged():
    """A batch of 1,000 names of 255 characters cost 17 ms of Python per call to check character by
    character; str.isprintable answers first for a name that holds no hidden character. It refuses
    every character of the hidden categories, so the rule is the same: checked here for every code
    point."""
    import unicodedata

    from authsvc.names import HIDDEN_CATEGORIES, hidden_character

    hidden = [c for c in map(chr, range(0x110000)) if unicodedata.category(c) in HIDDEN_CATEGORIES]
    assert hidden and not any(c.isprintable() for c in hidden)
    assert hidden_character("\U0001f600" * 255) is None
    assert (
        hidden_character("a\u00a0b\u202e") == "U+202E at position 4"
    )  # a space that is no hidden one, then one


# -- under gunicorn
# ---------------------------------------------------------------------------------


class Service:
    def __init__(self, proc, port: int, tokens: dict[str, str], log: Path):
        self.proc = proc
        self.port = port
        self.tokens = tokens
        self.log = log


def _serve(root: Path, workers: str | None = None) -> Service:
    """The admin API with the shipped config and admin.toml (2 gthread workers of 4 threads;
    ``workers`` overrides the count), rate limit as shipped, on TCP loopback; two tokens of
    players:read and players:write, ``cost`` and ``other``, and the player 7."""
    secret = root / "token-secret"
    secret.write_text(os.urandom(32).hex() + "\n")
    secret.chmod(0o600)
    env = {
        "AUTHSVC_CONFIG": str(ADMIN_TOML),
        "AUTHSVC_STORE": "sqlite://" + str(root / "authsvc.db"),
        "AUTHSVC_TOKEN_SECRET_FILE": str(secret),
        "STATE_DIRECTORY": str(root),
    }
    if workers:
        env["AUTHSVC_WORKERS"] = workers
    settings = Settings.from_env(env)
    store = open_store(settings.store, readonly=False, settings=settings)
    store.migrate()
    factories.add_player(store, 7, "patient")
    tokens = {
        name: api_tokens.add_api_token(
            store, Context(actor="cli:test"), name, ["players:read", "players:write"]
        )[1]
        for name in ("cost", "other")
    }
    store.close()
    port = free_port()
    log = root / "gunicorn.log"
    with log.open("wb") as out:
        proc = start_gunicorn(
            env,
            "--graceful-timeout",
            "5",
            port=port,
            app="authsvc.api.wsgi:application",
            workers=None,
            config=CONF,
            inherit_env=False,
            cwd=root,
            stdout=out,
            stderr=out,
        )
    wait_for_port(port)
    return Service(proc, port, tokens, log)


def _stop(service: Service) -> str:
    service.proc.terminate()
    service.proc.wait(timeout=30)
    output = service.log.read_text(errors="replace")
    assert "Traceback" not in output, output
    assert not any(token in output for token in service.tokens.values())
    return output


def _call(
    port: int,
    token: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict | None = None,
) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            method,
            path,
            body=body,
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                **(headers or {}),
            },
        )
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


@pytest.mark.engine("sqlite")
def test_under_gunicorn_a_second_large_body_of_one_token_waits_for_the_first(tmp_path):
    """One worker: the token's first large body half sent (its thread reading it), its second large
    one is 429 with Retry-After: 1, also chunked; another token's is served, and so is the token's
    small call."""
    service = _serve(tmp_path, workers="1")
    try:
        body = json.dumps(
            {
                "players": [{"user_id": n, "username": "p" * 80} for n in range(1, 1001)],
                "dry_run": True,
            }
        ).encode()
        first = socket.create_connection(("127.0.0.1", service.port), timeout=30)
        first.sendall(
            f"POST {BATCH} HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer "
            f"{service.tokens['cost']}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body[:70_000]
        )
        time.sleep(0.5)  # its head, and more than 64 KiB: a thread reads the rest
        status, headers, answer = _call(service.port, service.tokens["cost"], "POST", BATCH, body)
        assert (status, headers["Retry-After"]) == (429, "1"), answer
        assert json.loads(answer)["detail"].startswith(
            "this api token has another large body in flight"
        )
        chunked = (
            f"POST {BATCH} HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer "
            f"{service.tokens['cost']}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: "
            "close\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", service.port), timeout=30) as sock:
            sock.sendall(chunked.encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
            assert sock.recv(65536).startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
        assert _call(service.port, service.tokens["other"], "POST", BATCH, body)[0] == 200
        assert _call(service.port, service.tokens["cost"], "GET", "/v1/players/7")[0] == 200
        first.sendall(body[70_000:])
        first.settimeout(30)
        assert first.recv(65536).startswith(b"HTTP/1.1 200 OK\r\n")
        first.close()
        assert _call(service.port, service.tokens["cost"], "POST", BATCH, body)[0] == 200
    finally:
        _stop(service)
