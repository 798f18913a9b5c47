"""gunicorn's sync and gthread workers, answering the requests gunicorn itself refuses
(a request line or header it cannot parse, a limit passed) in the service's JSON shape
instead of gunicorn's HTML page: every answer of the game-facing service is
``{"success":false,"error":N,...}`` (docs/api.md), through nginx or straight from
gunicorn (scripts/serve).

deploy/gunicorn.conf.py names these classes for ``worker_class`` "sync" and "gthread",
for both services: the one config serves the app named on gunicorn's command line.
An app with its own error shape says so with a ``gunicorn_refusal(status)`` method,
which gives the headers and body of its answer (the admin API: RFC 9457
problem+json, authsvc/api/app.py); the worker asks the app it loaded, so the
answer is the served API's, whichever it is. Only the error page changes: gunicorn
still decides the status and logs the error. The answer never holds request data
(gunicorn's page quotes the bad line or header).

They also send an answer's head and body in one write (gunicorn writes them
apart): an app host that dies between the two would leave nginx with a status
line and headers it has already passed on, an answer it can neither complete nor
retry on another host (docs/scaling.md). With one write nginx gets the whole
answer or nothing, and retries on nothing.

They override two of gunicorn's worker methods, handle_request and handle_error, and nothing
else: how a worker reads, queues and times out connections is stock gunicorn. Slow and idle
clients are nginx's to absorb: it reads a request's whole head and body before gunicorn sees it
(deploy/nginx, docs/admin-api.md "Slow clients"). pyproject.toml bounds gunicorn's version to
the releases the suite has passed with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gunicorn.workers.gthread import ThreadWorker as _ThreadWorker
from gunicorn.workers.sync import SyncWorker as _SyncWorker

from authsvc.errors import reason_phrase, refused
from authsvc.web.answers import body_of
from authsvc.web.http import BASE_HEADERS

# An app's own answer to a refused request: its headers (Content-Type first) and body, for a status
# of authsvc.errors.GUNICORN_REFUSALS (the one table of what gunicorn refuses).
Refusal = Callable[[int], tuple[Sequence[tuple[str, str]], bytes]]


def json_error_response(status: int, refusal: Refusal | None = None) -> bytes:
    """A complete HTTP/1.1 error answer that closes the connection, like gunicorn's own: the
    game-facing JSON, or ``refusal``'s answer (an app's own shape). A ``refusal`` that fails
    gives the game-facing JSON rather than no answer."""
    error = refused(status)
    status, reason = error.status, reason_phrase(error.status)
    if refusal is not None:
        try:
            headers, body = refusal(status)
            return _answer(status, reason, headers, body)
        except Exception:
            pass
    return _answer(status, reason, BASE_HEADERS, body_of(error))


def _answer(status: int, reason: str, headers: Sequence[tuple[str, str]], body: bytes) -> bytes:
    head = [f"HTTP/1.1 {status} {reason}", "Connection: close"]
    head += [f"{name}: {value}" for name, value in headers]
    head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + bytes(body)


def app_refusal(app) -> Refusal | None:
    """The served app's own answer to what gunicorn refuses (its ``gunicorn_refusal``), if it has
    one."""
    refusal = getattr(app, "gunicorn_refusal", None)
    return refusal if callable(refusal) else None


class _JsonErrorSocket:
    """The client socket as ``Worker.handle_error`` sees it. Its one write is
    gunicorn's HTML error page (gunicorn.util.write_error); that is sent as the JSON
    answer of the same status instead (the app's own, with ``refusal``). Everything
    else goes to the real socket."""

    def __init__(self, sock, refusal: Refusal | None = None):
        self._sock = sock
        self._refusal = refusal

    def __getattr__(self, name):
        return getattr(self._sock, name)

    def sendall(self, data: bytes) -> None:
        try:
            status = int(bytes(data[:32]).split(b" ", 2)[1])
        except (IndexError, ValueError):
            status = 500
        self._sock.sendall(json_error_response(status, self._refusal))


class _OneWriteSocket:
    """The client socket as gunicorn's Response sees it: the head of the answer
    (gunicorn's first ``sendall``, ending in a blank line) is held and sent with the
    first body bytes. Any other use of the socket, and the end of the request,
    send a held head first (an answer without a body, a HEAD, an error path)."""

    __slots__ = ("_sock", "_head")

    def __init__(self, sock):
        self._sock = sock
        self._head = None  # None: nothing written yet; then the head held, or b"" once sent

    def sendall(self, data) -> None:
        head = self._head
        if head is None:
            data = bytes(data)
            if data.startswith(b"HTTP/") and data.endswith(b"\r\n\r\n"):
                self._head = data
                return
            self._head = b""
        elif head:
            self._head = b""
            data = head + data
        self._sock.sendall(data)

    def flush(self) -> None:
        head = self._head
        if head:
            self._head = b""
            self._sock.sendall(head)

    def __getattr__(self, name):
        self.flush()
        return getattr(self._sock, name)


class SyncWorker(_SyncWorker):
    """gunicorn's sync worker; its error answers in JSON, its answers in one write."""

    def handle_request(self, listener, req, client, addr):
        sock = _OneWriteSocket(client)
        try:
            return super().handle_request(listener, req, sock, addr)
        finally:
            sock.flush()

    def handle_error(self, req, client, addr, exc):
        super().handle_error(
            req, _JsonErrorSocket(client, app_refusal(getattr(self, "wsgi", None))), addr, exc
        )


class ThreadWorker(_ThreadWorker):
    """gunicorn's gthread worker; its error answers in JSON, its answers in one write."""

    def handle_request(self, req, conn):
        client = conn.sock
        conn.sock = sock = _OneWriteSocket(client)
        try:
            return super().handle_request(req, conn)
        finally:
            conn.sock = client
            sock.flush()

    def handle_error(self, req, client, addr, exc):
        super().handle_error(
            req, _JsonErrorSocket(client, app_refusal(getattr(self, "wsgi", None))), addr, exc
        )
