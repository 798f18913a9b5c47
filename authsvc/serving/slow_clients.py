"""Slow and idle clients on a gthread worker: no thread waits for a request that has not arrived.

gunicorn's gthread worker hands a connection to a pool thread as soon as it is accepted (or a
kept-alive one turns readable), and the thread then blocks reading the request; after an
answer with ``Connection: close`` the main thread itself lingers up to 2 s for the client's
FIN. So 200 connections that send nothing, or a header byte every 2 s (slowloris), or read
no answer, left an authorised request unanswered for 10 s and more, with no token needed.
The admin API is served straight to its callers, without nginx in front to absorb them
(docs/admin-api.md, "Slow clients"). authsvc/serving/workers.py's ThreadWorker uses this:

- A request is gathered on the worker's main thread, from its poller, never blocking: the
  connection goes to a thread only once the request's head is whole (its blank line) and, with a
  ``Content-Length`` that fits, its body too, ``HEAD_CAP`` bytes in all (every admin request but
  a large batch); a client that sent ``Expect: 100-continue`` is told to go on from here. A
  request not in hand ``HEAD_TIMEOUT`` seconds after the connection came (kept alive: after
  its first byte) is dropped, unanswered.
- In the thread, what is still to come (a head past ``HEAD_CAP``, a larger or chunked body)
  must arrive within ``READ_TIMEOUT`` seconds; a read past it ends as a client gone (the app
  answers a body it could not read 400, authsvc/api/body.py). A body the app did not read
  (it refused the request first) is dropped with the connection unless it is in hand
  already, where gunicorn waited up to 5 s in the thread for it.
- A connection closed after its answer waits for the client's FIN (RFC 9112 9.6) on the
  poller, at most ``CLOSE_LINGER`` seconds, not in a blocking call on the main thread.

It relies on gunicorn's gthread internals (TConn's parser, init, close; the worker's poller):
pyproject.toml bounds gunicorn's version. A TLS or HTTP/2 connection keeps gunicorn's.
"""

from __future__ import annotations

import functools
import re
import selectors
import socket
import time

from gunicorn import util
from gunicorn.http.errors import NoMoreData
from gunicorn.http2 import negotiation

HEAD_TIMEOUT = 10.0  # seconds for a request in hand (nginx's admin server: client_header_timeout 10s)
HEAD_CAP = 64 * 1024  # bytes gathered at most; a head this long goes to a thread whole or not (gunicorn refuses it)
READ_TIMEOUT = 30.0  # seconds for the rest of a request once a thread has it (nginx's: client_body_timeout 30s)
CLOSE_LINGER = 2.0  # seconds to wait for the client's FIN after a last answer (gunicorn's own)
CLOSE_DRAIN = 64 * 1024  # bytes read and dropped meanwhile, at most (gunicorn's own)
_BLANK_LINE = b"\r\n\r\n"
# In a head (after its request line every field line follows a CRLF); gunicorn itself checks them again.
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*([0-9]{1,9})[ \t]*(?=\r\n)", re.IGNORECASE)
_TRANSFER_ENCODING = re.compile(rb"\r\ntransfer-encoding:", re.IGNORECASE)
_EXPECT_CONTINUE = re.compile(rb"\r\nexpect:[ \t]*100-continue[ \t]*(?=\r\n)", re.IGNORECASE)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def in_hand(data: bytes) -> bool | None:
    """Whether the request that ``data`` starts is in hand for a thread: True (its head, and a Content-Length
    body that fits HEAD_CAP, or a head that cannot fit), False (more is to come here), None (its head is
    whole and its body is to come here, after ``Expect: 100-continue``'s go-ahead)."""
    end = data.find(_BLANK_LINE)
    if end < 0:
        return len(data) >= HEAD_CAP
    head = data[:end + 2]
    lengths = _CONTENT_LENGTH.findall(head)
    if len(lengths) != 1 or _TRANSFER_ENCODING.search(head):
        return True  # no body, or one the thread reads (chunked), or framing gunicorn refuses
    whole = end + 4 + int(lengths[0])
    if whole > HEAD_CAP or len(data) >= whole:
        return True
    return None if _EXPECT_CONTINUE.search(head) else False


class Deadline:
    """The client socket as the request's parser reads it: no read waits past ``deadline`` (monotonic).
    A read past it raises NoMoreData, as if the client had gone: gunicorn closes the connection
    quietly, and the app's read of the body fails (a 400)."""

    __slots__ = ("_sock", "deadline")

    def __init__(self, sock, deadline: float):
        self._sock = sock
        self.deadline = deadline

    def recv(self, size: int) -> bytes:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise NoMoreData()
        prior = self._sock.gettimeout()  # gunicorn's own, when it bounds a read (draining a body)
        self._sock.settimeout(left if prior is None else min(prior, left))
        try:
            return self._sock.recv(size)
        except TimeoutError:
            raise NoMoreData() from None
        finally:
            self._sock.settimeout(prior)

    def __getattr__(self, name):
        return getattr(self._sock, name)


class SlowClients:
    """A gthread worker's connections while their heads come in, and while they close (see the module)."""

    def __init__(self, worker, enqueue):
        self.worker = worker
        self.enqueue = enqueue  # gunicorn's: the connection to a pool thread
        # connection -> deadline, oldest first (one timeout for all: the order they came in); a connection
        # leaves at once when done, so nothing stays held here for the rest of its timeout
        self.gathering: dict = {}
        self.closing: dict = {}

    def plain(self, conn) -> bool:
        """HTTP/1 in the clear: TLS and HTTP/2 connections keep gunicorn's own handling."""
        return not self.worker.cfg.is_ssl and not negotiation.prior_knowledge_allowed(self.worker.cfg, conn.client)

    def take(self, conn) -> bool:
        """True if ``conn`` now waits for its head here; False if it goes to a thread (its head is in hand)."""
        if not self.plain(conn):
            return False
        if conn.parser is None:  # a new connection: its parser made here, its close made ours
            conn.init()
            conn.close = functools.partial(self.close, conn)
        if in_hand(conn.parser.unreader.buf.getvalue()):  # pipelined: the next request already came
            conn.data_ready = True
            return False
        conn.sock.setblocking(False)
        self.worker.poller.register(conn.sock, selectors.EVENT_READ, functools.partial(self._read, conn))
        self.gathering[conn] = time.monotonic() + HEAD_TIMEOUT
        return True

    def _read(self, conn, _sock) -> None:
        try:
            data = conn.sock.recv(HEAD_CAP)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        buf = conn.parser.unreader.buf
        buf.seek(0, 2)
        buf.write(data)
        ready = in_hand(buf.getvalue())
        if ready is None and not getattr(conn, "authsvc_continued", False):
            conn.authsvc_continued = True  # the app's server says it again when it reads the head: a client skips 1xx
            try:
                conn.sock.send(_CONTINUE)
            except OSError:
                pass
        if ready:
            self.worker.poller.unregister(conn.sock)
            del self.gathering[conn]
            conn.authsvc_continued = False
            conn.data_ready = True
            self.enqueue(conn)

    def _drop(self, conn) -> None:
        """A connection whose request did not come: closed, no answer (there is no request to answer)."""
        self.gathering.pop(conn, None)
        try:
            self.worker.poller.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass
        self.worker.nr_conns -= 1
        util.close(conn.sock)

    def close(self, conn, graceful: bool = False) -> None:
        """TConn.close for the connections taken here: a graceful close lingers on the poller."""
        if not graceful:
            util.close(conn.sock)
            return
        try:
            conn.sock.shutdown(socket.SHUT_WR)
            conn.sock.setblocking(False)
            conn.authsvc_drained = 0
            self.worker.poller.register(conn.sock, selectors.EVENT_READ, functools.partial(self._drain, conn))
        except (OSError, ValueError, KeyError):
            util.close(conn.sock)
            return
        self.closing[conn] = time.monotonic() + CLOSE_LINGER

    def _drain(self, conn, _sock) -> None:
        try:
            data = conn.sock.recv(CLOSE_DRAIN)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        conn.authsvc_drained += len(data)
        if not data or conn.authsvc_drained >= CLOSE_DRAIN:
            self._closed(conn)

    def _closed(self, conn) -> None:
        self.closing.pop(conn, None)
        try:
            self.worker.poller.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass
        util.close(conn.sock)

    def sweep(self) -> None:
        """Drop the heads past their deadline and end the lingering closes past theirs (all of them
        once the worker stops: no request has begun on a connection still gathering)."""
        now = time.monotonic() if self.worker.alive else float("inf")
        for waiting, end in ((self.gathering, self._drop), (self.closing, self._closed)):
            while waiting:
                conn, deadline = next(iter(waiting.items()))
                if deadline > now:
                    break
                end(conn)

    def reading(self, conn) -> Deadline | None:
        """In the thread: the parser's socket bounded by READ_TIMEOUT, for the request it starts; None for a
        connection this class did not take."""
        if conn.parser is None or not self.plain(conn):
            return None
        return Deadline(conn.parser.unreader.sock, time.monotonic() + READ_TIMEOUT)
