"""The nginx admin site holds off slow clients: the admin API behind it keeps answering
(docs/admin-api.md, "Slow clients").

The finding, against the admin API served on its socket with no nginx in front: 24 connections,
no token, each sending a request head over 64 KiB and then a byte every 2 s, made 10 of 10
authorised requests time out (20 s). Here the same 24 connections go to the shipped admin site
(deploy/nginx/sites/authsvc-admin.conf, rendered and run by tests/deploy_support.py) in front of
the shipped admin service, and 10 authorised requests that follow must all be answered. nginx
reads a request's head whole before gunicorn sees it, and refuses one past its buffers with the
admin API's problem+json (431); the other refusals of the site are problem+json too.

Everything is bounded: the drip stops once the authorised requests are done (DRIP_SECONDS at
most), every socket has a timeout, the connections close when the test ends. The figures are printed
(pytest -s).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable

import pytest

from tests.deploy_support import ADMIN_HOST, Stack, start_stack, stop

pytestmark = pytest.mark.engine("sqlite")  # how the admin API is served, not the store

CONNECTIONS = 24
HEAD_BYTES = 64 * 1024 + 1024  # more than 64 KiB of request head
DRIP_EVERY = 2.0  # seconds between the bytes each slow connection sends afterwards
DRIP_SECONDS = 150.0  # at most: the drip stops once the authorised requests are done
ASKED = 10
ANSWER_WITHIN = (
    10.0  # the client's timeout for each authorised request (the finding: 20 s, none answered)
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = start_stack(tmp_path_factory.mktemp("admin-slow-clients"), workers=1, admin=True)
    yield s
    stop(s.nginx)
    stop(s.gunicorn)
    stop(s.admin_gunicorn)
    for name, text in s.log_texts().items():
        if "admin" in name:
            assert "Traceback" not in text, (name, text[-3000:])
            assert s.admin_token not in text, name


def slow_head() -> bytes:
    """A request head over 64 KiB, not yet ended: a request line, Host, then 1 KiB header lines."""
    lines = [b"GET /v1/players/4242 HTTP/1.1", b"Host: " + ADMIN_HOST.encode()]
    lines += [b"X-Pad-%03d: " % i + b"a" * 1000 for i in range(HEAD_BYTES // 1012 + 1)]
    return b"\r\n".join(lines) + b"\r\n"


def hold(
    open_socket: Callable[[], socket.socket], done: threading.Event, answers: list[bytes]
) -> None:
    """One slow client: the head, then a byte every DRIP_EVERY seconds until ``done`` (at most
    DRIP_SECONDS); what the server answered, if anything, goes to ``answers``."""
    until = time.monotonic() + DRIP_SECONDS
    got = b""
    try:
        with open_socket() as sock:
            head = slow_head()
            with contextlib.suppress(OSError):
                for start in range(0, len(head), 4096):
                    sock.sendall(head[start : start + 4096])
            while not done.is_set() and time.monotonic() < until:
                try:
                    sock.sendall(b"X")
                except OSError:
                    break
                sock.settimeout(DRIP_EVERY)
                try:
                    data = sock.recv(65536)
                    if not data:
                        break
                    got += data
                except (TimeoutError, ssl.SSLWantReadError):
                    pass
                except OSError:
                    break
    except OSError:
        pass
    answers.append(got)


def under_attack(
    open_socket: Callable[[], socket.socket], ask: Callable[[], int | str]
) -> tuple[list[tuple[float, int | str]], list[bytes]]:
    """CONNECTIONS slow clients held open, then ASKED authorised requests one after another:
    (seconds, status) of each, and what the slow clients were answered."""
    answers: list[bytes] = []
    done = threading.Event()
    threads = [
        threading.Thread(target=hold, args=(open_socket, done, answers), daemon=True)
        for _ in range(CONNECTIONS)
    ]
    for thread in threads:
        thread.start()
    time.sleep(3.0)  # every head sent, the first byte dripped
    results: list[tuple[float, int | str]] = []
    for _ in range(ASKED):
        started = time.monotonic()
        status = ask()
        results.append((time.monotonic() - started, status))
    done.set()
    for thread in threads:
        thread.join(DRIP_EVERY + 30)
    return results, answers


def through_nginx(stack: Stack) -> tuple[Callable[[], socket.socket], Callable[[], int | str]]:
    """How a client reaches the admin site: a TLS socket, and one authorised GET on a new
    connection."""
    context = stack.client_context()

    def open_socket() -> socket.socket:
        raw = socket.create_connection(("127.0.0.1", stack.admin_port), timeout=10)
        return context.wrap_socket(raw, server_hostname=ADMIN_HOST)

    def ask() -> int | str:
        try:
            conn = http.client.HTTPConnection(ADMIN_HOST, stack.admin_port, timeout=ANSWER_WITHIN)
            raw = socket.create_connection(("127.0.0.1", stack.admin_port), timeout=ANSWER_WITHIN)
            conn.sock = context.wrap_socket(raw, server_hostname=ADMIN_HOST)
            conn.request(
                "GET", "/v1/players/4242", headers={"Authorization": f"Bearer {stack.admin_token}"}
            )
            response = conn.getresponse()
            response.read()
            conn.close()
            return response.status
        except OSError as e:
            return type(e).__name__

    return open_socket, ask


def test_slow_heads_through_the_admin_site_hold_no_authorised_request(stack):
    open_socket, ask = through_nginx(stack)
    assert ask() == 200
    results, answers = under_attack(open_socket, ask)
    print(
        f"\n{CONNECTIONS} slow heads through nginx: authorised GETs (s, status): "
        + ", ".join(f"{seconds:.3f} {status}" for seconds, status in results)
    )
    assert [status for _, status in results] == [200] * ASKED, results
    # nginx refused each head past its buffers itself, in the admin API's shape, quoting none of it.
    assert len(answers) == CONNECTIONS
    for answer in answers:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 431"), answer[:300]
        assert b"Content-Type: application/problem+json" in head, head
        assert json.loads(body)["type"] == "urn:authsvc:problem:header-too-large", body
        assert b"aaaa" not in answer


def raw_exchange(stack: Stack, data: bytes) -> bytes:
    """``data`` sent to the admin site as is, over TLS; all it answers until it closes."""
    context = stack.client_context()
    raw = socket.create_connection(("127.0.0.1", stack.admin_port), timeout=15)
    with context.wrap_socket(raw, server_hostname=ADMIN_HOST) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
        got = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                got += chunk
    return got


HOST = b"Host: " + ADMIN_HOST.encode() + b"\r\n"


@pytest.mark.parametrize(
    ("sent", "status", "kind"),
    [
        (b"NOT A REQUEST\r\n\r\n", 400, "bad-request"),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n" + HOST + b"\r\n", 414, "uri-too-long"),
        (
            b"GET /v1/players/4242 HTTP/1.1\r\n" + HOST + b"X-Long: " + b"a" * 9000 + b"\r\n\r\n",
            431,
            "header-too-large",
        ),
        (
            b"PUT /v1/players/4242 HTTP/1.1\r\n"
            + HOST
            + b"Content-Type: application/json\r\nContent-Length: 9000000\r\n"
            b"Connection: close\r\n\r\n",
            413,
            "too-large",
        ),
    ],
    ids=["400", "414", "431", "413"],
)
def test_what_the_admin_site_refuses_is_problem_json(stack, sent, status, kind):
    answer = raw_exchange(stack, sent)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d" % status), answer[:300]
    assert b"Content-Type: application/problem+json" in head, head
    problem = json.loads(body)
    assert (problem["status"], problem["type"]) == (status, "urn:authsvc:problem:" + kind), problem
    assert b"aaaa" not in answer
