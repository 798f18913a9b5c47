"""The deliverer's HTTP client: it reaches only public addresses, and never waits or reads without
bound.

A webhook's URL is the subscriber's to choose, so a POST to it must not become a way into the
platform's own network. Each new connection resolves the host once (getaddrinfo) and is refused
unless every address the name gives is public (webhooks/target.py's ``public``: no loopback,
private, link-local, CGNAT, multicast, reserved or unspecified address, nor one of those inside an
IPv4-mapped, 6to4 or NAT64 address, nor an IPv6 form refused outright); it then connects to the
address it checked, never to the name, so a second DNS answer cannot swap in another (DNS
rebinding). A host[:port] on AUTHSVC_WEBHOOK_ALLOW_HOSTS skips the address rule (a receiver on the
platform's own network, the demo's on loopback).

https verifies the certificate against the URL's host name (SNI). A 3xx is an answer like any
non-2xx: redirects are not followed. Resolving and connecting take at most ``connect_timeout``
(the name is resolved in a thread of its own, so a slow resolver cannot hold the attempt), the
whole attempt at most ``timeout``. At most READ_LIMIT bytes of an answer are read, whatever its
framing says: a head (interim answers included) over MAX_HEAD or a chunk size that is not 1 to 16
hex digits fails the attempt; a body over MAX_BODY is not read on, its status counts. A connection
whose answer was read whole is kept for the next POST to the same host (keep-alive), a few per host.

An attempt's recorded error (``Answer.error``, listed with the webhook's deliveries) is one of a
few fixed texts: it tells a subscriber neither what an internal name resolves to nor a closed
port from a filtered one. ``Answer.detail`` says more for the operator's log: host and port,
never the URL's path or query (which may hold a token).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection
from dataclasses import dataclass

from authsvc.errors import Error
from authsvc.webhooks.target import public

MAX_BODY = 64 * 1024  # an answer's body, read and dropped; a longer one closes its connection
MAX_HEAD = 16 * 1024  # status line and headers, interim answers' included
READ_LIMIT = (
    MAX_HEAD + MAX_BODY + 16 * 1024
)  # an answer's bytes read in all, chunks' framing included
RESOLVING = (
    64  # names resolved at once by one client; past that a resolution waits (within its bound)
)
IDLE_PER_HOST = 32  # kept-alive connections per host
IDLE_FOR = 20.0  # seconds an idle connection is kept (servers close theirs after 5 to 75 s)
USER_AGENT = "authsvc-webhooks"


# An attempt's recorded errors (module docstring); a status is recorded as "answered 503".
NOT_PUBLIC = "not a public address"
NO_CONNECTION = "could not connect"
TIMED_OUT = "timed out"
NOT_HTTP = "the answer is not valid HTTP"


class Refused(Error):
    """The URL may not be reached: a non-public address (``text`` NOT_PUBLIC), or a URL the client
    cannot POST to."""

    def __init__(self, detail: str, text: str | None = None) -> None:
        super().__init__(detail)
        self.text = text or f"refused: {detail}"


def allowed(host: str, port: int, allow_hosts: Collection[str]) -> bool:
    """Whether ``host``:``port`` is on the allow list (settings.host_list's items: host, or
    host:port)."""
    name = f"[{host.lower()}]" if ":" in host else host.lower().rstrip(".")
    return name in allow_hosts or f"{name}:{port}" in allow_hosts


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str  # path and query, as sent

    @property
    def where(self) -> str:
        """host:port for messages: never the path or query."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.scheme, self.host.lower(), self.port)


def parse(url: str) -> Target:
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise Refused("the URL cannot be read") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise Refused("the URL is not an http or https URL with a host")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(scheme, parts.hostname, port or (443 if scheme == "https" else 80), path)


@dataclass
class Answer:
    """One attempt's outcome: the HTTP status if one came, else None; ``error`` (a fixed text) if
    not a 2xx, and ``detail``, what the operator's log may say of it."""

    status: int | None
    error: str | None
    detail: str | None = None


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.idle_since = time.monotonic()
        self.left = READ_LIMIT  # what the answer under way may still read

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _Failed(Error):
    """An attempt that got no full answer: its detail, and ``text``, the error recorded."""

    def __init__(self, detail: str, text: str = NO_CONNECTION) -> None:
        super().__init__(detail)
        self.text = text


class _Spent(Error):
    """The answer's bytes reached READ_LIMIT."""


class Client:
    """POSTs to webhook URLs, safe to share among threads."""

    def __init__(
        self,
        allow_hosts: Collection[str] = frozenset(),
        *,
        connect_timeout: float = 3.0,
        timeout: float = 10.0,
        ssl_context: ssl.SSLContext | None = None,
        resolve: Callable[..., list] = socket.getaddrinfo,
    ) -> None:
        self.allow_hosts = allow_hosts
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self._ssl = ssl_context
        self._resolve = resolve  # the seam a test gives a slow resolver
        self._resolving = threading.BoundedSemaphore(RESOLVING)
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for c in conns:
            c.close()

    def post(self, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        """POST ``body``; never raises for what the target does (the Answer says it)."""
        deadline = time.monotonic() + self.timeout
        try:
            target = parse(url)
        except Refused as e:
            return Answer(None, e.text, str(e))
        head = (
            f"POST {target.path} HTTP/1.1\r\nHost: {_host_header(target)}\r\nUser-Agent: "
            f"{USER_AGENT}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            + "\r\n"
        ).encode("latin-1")
        for _ in range(
            2
        ):  # a kept-alive connection the server closed meanwhile: once more on a new one
            conn = self._take(target.key)
            fresh = conn is None
            try:
                if conn is None:
                    conn = self._connect(target, deadline)
                status, reusable = _exchange(conn, head + body, deadline)
            except Refused as e:
                return Answer(None, e.text, str(e))
            except _Failed as e:
                if conn is not None:
                    conn.close()
                if fresh or time.monotonic() >= deadline:
                    return Answer(None, e.text, f"{target.where}: {e}")
                continue
            if (
                reusable and not conn.buf
            ):  # bytes past the answer: the stream is not understood, not reused
                self._give(target.key, conn)
            else:
                conn.close()
            if 200 <= status < 300:
                return Answer(status, None)
            text = f"answered {status}" + (
                " (redirects are not followed)" if 300 <= status < 400 else ""
            )
            return Answer(status, text, f"{target.where} {text}")
        return Answer(
            None, NO_CONNECTION, f"{target.where}: no answer"
        )  # not reached: the second try is new

    def _take(self, key: tuple[str, str, int]) -> _Conn | None:
        now = time.monotonic()
        with self._lock:
            idle = self._idle.get(key, [])
            while idle:
                conn = idle.pop()
                if now - conn.idle_since < IDLE_FOR:
                    return conn
                conn.close()
        return None

    def _give(self, key: tuple[str, str, int], conn: _Conn) -> None:
        conn.idle_since = time.monotonic()
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if len(idle) < IDLE_PER_HOST:
                idle.append(conn)
                return
        conn.close()

    def _lookup(self, host: str, port: int, deadline: float) -> list:
        """The name's addresses, within ``deadline``: resolved in a daemon thread of its own, which
        a resolver slower than that is left to finish alone (at most RESOLVING at once)."""
        if not self._resolving.acquire(timeout=max(deadline - time.monotonic(), 0)):
            raise _Failed("cannot resolve the host (timed out: too many resolutions under way)")
        found: list = []
        done = threading.Event()

        def run() -> None:
            try:
                found.append(self._resolve(host, port, type=socket.SOCK_STREAM))
            except BaseException as e:  # handed to the attempt, which names it
                found.append(e)
            finally:
                self._resolving.release()
                done.set()

        threading.Thread(target=run, name="resolve", daemon=True).start()
        if not done.wait(max(deadline - time.monotonic(), 0)):
            raise _Failed("cannot resolve the host (timed out)")
        if isinstance(found[0], OSError | UnicodeError):
            raise _Failed(f"cannot resolve the host ({_reason(found[0])})")
        if isinstance(found[0], BaseException):
            raise found[0]
        return found[0]

    def _connect(self, target: Target, deadline: float) -> _Conn:
        """A new connection to the address the name resolved to, checked (module docstring)."""
        infos = self._lookup(
            target.host, target.port, min(deadline, time.monotonic() + self.connect_timeout)
        )
        if not infos:
            raise _Failed("the host resolves to no address")
        if not allowed(target.host, target.port, self.allow_hosts):
            for info in infos:
                ip = ipaddress.ip_address(info[4][0].split("%")[0])
                if not public(ip):
                    raise Refused(
                        f"{target.where} resolves to {ip}, not a public address "
                        "(AUTHSVC_WEBHOOK_ALLOW_HOSTS lists the hosts allowed anyway)",
                        NOT_PUBLIC,
                    )
        failure = ""
        for family, socktype, proto, _, address in infos:  # each address the name gave, in order
            sock = socket.socket(family, socktype, proto)
            try:
                sock.settimeout(max(min(self.connect_timeout, deadline - time.monotonic()), 0.001))
                sock.connect(address)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as e:
                sock.close()
                failure = _reason(e)
                continue
            if target.scheme == "https":
                try:
                    sock.settimeout(max(deadline - time.monotonic(), 0.001))
                    sock = (self._ssl or _default_context()).wrap_socket(
                        sock, server_hostname=target.host
                    )
                except ssl.SSLCertVerificationError as e:
                    sock.close()
                    raise _Failed(
                        f"TLS certificate not valid for the host ({e.verify_message})"
                    ) from None
                except (OSError, ssl.SSLError) as e:
                    sock.close()
                    raise _Failed(
                        f"TLS handshake failed ({_reason(e)})"
                    ) from None  # a timeout too: could not connect
            return _Conn(sock)
        raise _Failed(f"cannot connect ({failure})")


_CONTEXT: list[ssl.SSLContext] = []


def _default_context() -> ssl.SSLContext:
    """The system's CAs, made on first use (not at import)."""
    if not _CONTEXT:
        _CONTEXT.append(ssl.create_default_context())
    return _CONTEXT[0]


def _host_header(target: Target) -> str:
    host = f"[{target.host}]" if ":" in target.host else target.host
    default = 443 if target.scheme == "https" else 80
    return host if target.port == default else f"{host}:{target.port}"


def _reason(e: BaseException) -> str:
    if isinstance(e, TimeoutError | socket.timeout):
        return "timed out"
    return getattr(e, "strerror", None) or type(e).__name__


def _recv(conn: _Conn, deadline: float) -> bytes:
    """The next bytes of the answer (b"": the connection closed); _Spent past READ_LIMIT."""
    if conn.left <= 0:
        raise _Spent()
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise _Failed("no answer (timed out)", TIMED_OUT)
    conn.sock.settimeout(remaining)
    try:
        data = conn.sock.recv(min(65536, conn.left))
    except (OSError, ssl.SSLError) as e:
        reason = _reason(e)
        raise _Failed(
            f"no answer ({reason})", TIMED_OUT if reason == "timed out" else NO_CONNECTION
        ) from None
    conn.left -= len(data)
    return data


def _exchange(conn: _Conn, request: bytes, deadline: float) -> tuple[int, bool]:
    """Send the request, read the answer's head and (bounded) body: (status, whether the connection
    may be reused)."""
    try:
        conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
        conn.sock.sendall(request)
    except (OSError, ssl.SSLError) as e:
        reason = _reason(e)
        raise _Failed(
            f"cannot send ({reason})", TIMED_OUT if reason == "timed out" else NO_CONNECTION
        ) from None
    buf = conn.buf
    conn.left = READ_LIMIT
    status = 100
    heads = 0  # the bytes of the heads read so far (interim ones too)
    while 100 <= status < 200:  # an interim answer (103 Early Hints) comes before the real one
        while b"\r\n\r\n" not in buf:
            if heads + len(buf) > MAX_HEAD:
                raise _Failed("the answer's head is too long", NOT_HTTP)
            try:
                data = _recv(conn, deadline)
            except _Spent:
                raise _Failed("the answer's head is too long", NOT_HTTP) from None
            if not data:
                raise _Failed("the connection closed before an answer")
            buf += data
        head, _, buf = buf.partition(b"\r\n\r\n")
        heads += len(head) + 4
        if heads > MAX_HEAD:
            raise _Failed("the answer's head is too long", NOT_HTTP)
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not (code.isdigit() and len(code) == 3):
            raise _Failed("the answer is not HTTP/1.x", NOT_HTTP)
        status = int(code)
    fields: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    reusable = version == "HTTP/1.1" and "close" not in fields.get("connection", "").lower()
    if status in (204, 304):
        conn.buf = buf
        return status, reusable
    try:
        if "chunked" in fields.get("transfer-encoding", "").lower():
            buf, whole = _chunked(conn, buf, deadline)
        elif "content-length" in fields:
            declared = fields["content-length"]
            if not (declared.isascii() and declared.isdigit()) or int(declared) > MAX_BODY:
                return status, False  # not read: the connection is not kept
            length = int(declared)
            while len(buf) < length:
                data = _recv(conn, deadline)
                if not data:
                    return status, False
                buf += data
            buf, whole = buf[length:], True
        else:  # the body runs to the connection's end: not read, the connection not kept
            return status, False
    except (
        _Spent
    ):  # a body over the bound, framing and all: its status counts, the connection is closed
        return status, False
    conn.buf = buf
    return status, reusable and whole


_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}[ \t]*(?:;[^\r\n]*)?")


def _chunked(conn: _Conn, buf: bytes, deadline: float) -> tuple[bytes, bool]:
    """Read a chunked body up to MAX_BODY bytes: (what follows it, whether it ended within the
    bound). A size line that is not 1 to 16 hex digits (and extensions) is _Failed: a negative or
    unparsable size must not move the count of what was read."""
    total = 0
    while True:
        while b"\r\n" not in buf:
            if len(buf) > 1024:
                raise _Failed("the answer's chunk size line is too long", NOT_HTTP)
            data = _recv(conn, deadline)
            if not data:
                return b"", False
            buf += data
        line, _, buf = buf.partition(b"\r\n")
        if not _CHUNK_SIZE.fullmatch(line):
            raise _Failed("the answer's chunk size is not hex digits", NOT_HTTP)
        size = int(line.split(b";")[0].strip(), 16)
        if size == 0:
            while True:  # trailers, up to the blank line
                while b"\r\n" not in buf:
                    data = _recv(conn, deadline)
                    if not data or len(buf) > MAX_HEAD:
                        return b"", False
                    buf += data
                line, _, buf = buf.partition(b"\r\n")
                if not line:
                    return buf, True
        total += size
        if total > MAX_BODY:
            return b"", False
        while len(buf) < size + 2:
            data = _recv(conn, deadline)
            if not data:
                return b"", False
            buf += data
        buf = buf[size + 2 :]
