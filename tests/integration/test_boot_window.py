"""An outage that begins between the start-up check and the read of the token secrets'
fingerprints just after it (authsvc/web/app.py, make_app): a worker that builds the app itself
(``tolerate_outage=True``) starts and answers 503 as if the check had found the store unreachable;
a master at start-up still fails (docs/stores.md, "Outages").

The window is made real with a loopback TCP forwarder in front of PostgreSQL: it forwards the
first connection, the check's own, and closes each later one at once, so the next connection, the
fingerprints' read, finds the store gone; then it forwards again.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import urllib.parse

import pytest
import webtest

from authsvc.errors import StoreUnreachable
from authsvc.settings import Settings
from authsvc.web.app import make_app
from tests.support import provision_postgres

pytestmark = pytest.mark.engine("postgresql")
AUTH = "/api/authenticate.json"
UNAVAILABLE = (
    b'{"success":false,"error":503,'
    b'"error_description":"Service temporarily unavailable, try again"}'
)
CAROL = {"success": True, "user_id": 77, "username": "carol"}
PASSWORD = "boot-window-password"  # in the URL only: the server trusts loopback and never asks


class Forwarder:
    """127.0.0.1:``port`` to the server: forwards the first connection; closes each later one on
    accept until ``resume()``."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0  # connections accepted, forwarded or closed
        self.refusing = False
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def resume(self) -> None:
        self.refusing = False

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # closed
                return
            self.accepted += 1
            if self.refusing:
                client.close()
                continue
            self.refusing = self.accepted == 1  # the first one is the check's
            upstream = socket.create_connection(self.target)
            self.sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(a, selectors.EVENT_READ, (a, b))
            sel.register(b, selectors.EVENT_READ, (b, a))
            try:
                while True:
                    for key, _ in sel.select():
                        source, sink = key.data
                        data = source.recv(65536)
                        if not data:
                            return
                        sink.sendall(data)
            except OSError:
                return
            finally:
                a.close()
                b.close()

    def close(self) -> None:
        self.listener.close()
        for s in self.sockets:
            s.close()


@pytest.fixture
def window(pg_databases, secret_file):
    """(settings naming the store through a new forwarder, valid request parameters,
    forwarder)."""
    url = pg_databases.create(migrate=False)
    _, params, env = provision_postgres(url, secret_file)
    parts = urllib.parse.urlsplit(url)
    forwarder = Forwarder(parts.hostname or "127.0.0.1", parts.port or 5432)
    through = parts._replace(
        netloc=f"{parts.username}:{PASSWORD}@127.0.0.1:{forwarder.port}"
    ).geturl()
    try:
        yield Settings.from_env({**env, "AUTHSVC_STORE": through}), params, forwarder
    finally:
        forwarder.close()


def test_a_worker_starts_through_an_outage_after_the_check(window, secret_file, caplog):
    settings, params, forwarder = window
    with caplog.at_level(logging.WARNING, logger="authsvc"):
        app = webtest.TestApp(make_app(settings, tolerate_outage=True), lint=True)
    assert forwarder.accepted == 2  # the check's connection, then the fingerprints' (closed)
    starting = [r for r in caplog.records if "starting anyway" in r.getMessage()]
    assert len(starting) == 1 and starting[0].levelno == logging.WARNING, caplog.text
    line = starting[0].getMessage()
    assert "\n" not in line and line.startswith("postgresql store postgresql://postgres:"), line
    assert PASSWORD not in caplog.text and secret_file.read_text().strip() not in caplog.text
    try:
        for _ in range(2):
            assert app.get(AUTH, params=params, status=503).body == UNAVAILABLE
        forwarder.resume()
        assert app.get(AUTH, params=params).json == CAROL  # no restart of the app
    finally:
        app.app.store.close()


def test_the_same_window_stays_fatal_without_tolerate_outage(window):
    """A master at start-up (create_app() with ``--preload``) does not start on it, and calls it an
    outage: StoreUnreachable, the exit status 75 that systemd retries (authsvc/web/wsgi.py)."""
    settings, _, forwarder = window
    with pytest.raises(StoreUnreachable) as raised:
        make_app(settings)
    assert str(raised.value).startswith("postgresql store postgresql://postgres:"), raised.value
    assert PASSWORD not in str(raised.value)
    assert forwarder.accepted == 2
