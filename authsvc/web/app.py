"""make_app(settings) -> the WSGI callable: the route table and the one error boundary.

Every answer, including 404, 405, 413, 503 and 500, is the same JSON shape.
The 400/403 results of docs/api.md come back with HTTP 200 unless
``AUTHSVC_ERROR_STATUS=http`` (docs/api.md, "Answers": real clients break on 4xx). Every
answer also carries that result code in ``X-Authsvc-Result`` for the access
logs (nginx hides it from clients; docs/logs.md). Every authentication is recorded
once (docs/logs.md, "Which line holds what"): with ``access_record = "app"`` the app
writes an ``auth ... reason=...`` line; with ``"edge"`` a request that came through
nginx (a peer of ``forwarded_allow_ips``, or the unix socket) gets its reason, game
and user appended to ``X-Authsvc-Result`` (``403 reason=wrong_token game=7 user=1001``)
for nginx's access line, which nginx strips from the answer, and no line of the app's;
a client that reaches the app directly still gets the auth line and only the code.

``/healthz`` is liveness (the process answers, no store), ``/readyz`` readiness
(the store answers the authentication query and this release can read its schema: the one it
reads, or a newer one its queries still run on; docs/api.md).
``/openapi.json`` is the API's OpenAPI document (authsvc/openapi/, read once when the app is built).
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import re
import time
import traceback
from collections.abc import Callable
from importlib import resources
from typing import TYPE_CHECKING

from authsvc import release
from authsvc.errors import (
    ConfigError,
    Error,
    MethodNotAllowed,
    NotFound,
    ServiceUnavailable,
    StoreUnavailable,
    StoreUnreachable,
)
from authsvc.loglines import OTHER_ROUTE, LogThrottle, request_id
from authsvc.settings import Settings
from authsvc.store.base import Reader
from authsvc.store.readers import open_reader
from authsvc.store.sqlite.reader import SQLiteReader
from authsvc.tokens import SecretFile, check_known
from authsvc.web.answers import REFUSALS, body_of, http_statuses
from authsvc.web.authenticate import MALFORMED, STORE_UNAVAILABLE, WAITED_TOO_LONG, Authenticator
from authsvc.web.http import request_params, respond
from authsvc.web.queueing import WaitedTooLong, waited_too_long

if TYPE_CHECKING:
    from authsvc.web.metrics import Metrics

log = logging.getLogger("authsvc")
auth_log = logging.getLogger("authsvc.auth")

ALLOWED_METHODS = ("GET", "HEAD", "POST")
AUTHENTICATE_PATH = "/api/authenticate.json"
HEALTH_PATH = "/healthz"
READY_PATH = "/readyz"
METRICS_PATH = "/metrics"
OPENAPI_PATH = "/openapi.json"
RESULT_HEADER = "X-Authsvc-Result"
ROUTE_PATHS = (AUTHENTICATE_PATH, HEALTH_PATH, READY_PATH, METRICS_PATH, OPENAPI_PATH)
PROBE_PATHS = (HEALTH_PATH, READY_PATH)
# Where observe() leaves an authentication's record for __call__ to append to RESULT_HEADER
# (access_record = "edge"). Not an HTTP_ key: no request header can set it.
RECORD_KEY = "authsvc.record"
STORE_WARNING_INTERVAL = 10.0  # seconds between two "store unavailable" lines of one worker
# /readyz checks the schema version (Store.check: a new connection on PostgreSQL) at most
# this often per worker; the authentication query runs on every probe.
SCHEMA_CHECK_INTERVAL = 60.0

_SLASH_RUNS = re.compile("//+")


def canonical_path(path: str) -> str:
    """The path as the original service's router (Rails) took it: runs of "/" squeezed and
    one trailing "/" dropped, so "//api/authenticate.json" (a base URL ending in "/") and
    "/api/authenticate.json/" are the API path (docs/api.md). No redirect: clients do not follow
    them."""
    path = _SLASH_RUNS.sub("/", path)
    return path[:-1] if len(path) > 1 and path.endswith("/") else path


def route_name(path: str | None) -> str:
    """What a log calls a request path: a route of the app, or "<other>". A client's
    own path is never logged: with a percent-encoded "?" it holds the query string."""
    if path in ROUTE_PATHS:
        return path
    if path and canonical_path(path) in ROUTE_PATHS:
        return canonical_path(path)
    return OTHER_ROUTE


@functools.lru_cache(maxsize=64)
def from_proxy(remote_addr: str, allowed: str) -> bool:
    """Whether a peer is nginx as gunicorn decides it (forwarded_allow_ips, which settings.py has
    checked: IP addresses or networks, never "*"): an address in ``allowed``, or not an IP address
    at all (the unix socket, which only nginx's group may open). Cached: the peers are a few."""
    try:
        peer = ipaddress.ip_address(remote_addr.partition("%")[0])
    except ValueError:
        return True
    peer = getattr(peer, "ipv4_mapped", None) or peer  # an IPv4 peer of a dual-stack socket
    return any(peer in ipaddress.ip_network(item.strip()) for item in allowed.split(","))


class App:
    def __init__(
        self,
        settings: Settings,
        store: Reader,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        metrics: Metrics | None = None,
    ):
        self.settings = settings
        self.metrics = metrics
        self.store = store
        # The secret file is looked at again at most every AUTHSVC_MAX_STALENESS: a rotation needs
        # no restart.
        self.secret_file = SecretFile(
            settings.token_secret_file,
            settings.token_secrets,
            lambda: store.token_secrets(),
            settings.max_staleness,
            monotonic,
        )
        self.authenticator = Authenticator(store, self.secret_file, clock)
        self.openapi_document = openapi_document()
        self.http_statuses = http_statuses(settings.errors_as_http_status)
        self.routes = {
            AUTHENTICATE_PATH: self.authenticate,
            HEALTH_PATH: self.health,
            READY_PATH: self.ready,
            OPENAPI_PATH: self.openapi,
        }
        self.clock = clock
        # When this app began to serve: a request held in the socket's backlog by a restart (an
        # upgrade's) waited for the restart, not for a worker; its queue wait counts from here
        # (authsvc/web/queueing.py).
        self.serving_since = clock()
        self.store_warnings = LogThrottle(STORE_WARNING_INTERVAL, monotonic)
        self.queue_warnings = LogThrottle(STORE_WARNING_INTERVAL, monotonic)
        self.observation_warnings = LogThrottle(STORE_WARNING_INTERVAL, monotonic)
        self.schema_warnings = LogThrottle(STORE_WARNING_INTERVAL, monotonic)
        self.monotonic = monotonic
        self.schema_checked_at = float("-inf")

    def __call__(self, environ: dict, start_response) -> list[bytes]:
        """The one error boundary: whatever fails inside (the store, the metrics, the logger), the
        answer is one start_response call with the JSON shape of docs/api.md, under any WSGI server.
        Metrics and log lines only observe an answer: when they fail it goes out unchanged
        (observation_failed)."""
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "")
        extra_headers: tuple = ()
        metrics = self.metrics
        start = time.perf_counter() if metrics is not None else 0.0
        content_type = None  # JSON; /metrics answers in Prometheus's text format
        shed = False  # a 503 for the queue's wait: a shed like nginx's, not a server error
        try:
            handler = self.routes.get(path)
            if handler is None:
                # Off the hot path: only a path that is not a route as sent is normalised.
                handler = self.routes.get(canonical_path(path))
            if handler is not None:
                if method not in ALLOWED_METHODS:
                    raise MethodNotAllowed(ALLOWED_METHODS)
                result, body = handler(environ)
            elif (
                metrics is not None
                and canonical_path(path) == METRICS_PATH
                and method in ALLOWED_METHODS
            ):
                body, content_type = metrics.exposition()
                result = 200
            else:
                raise NotFound()
        except StoreUnavailable:
            self.store_unavailable(path)
            result, body = ServiceUnavailable.status, body_of(ServiceUnavailable)
        except Error as error:  # this door's answers: authsvc/web/answers.py
            body, extra_headers = body_of(error), error.headers
            result = error.status
            shed = isinstance(error, WaitedTooLong)
        except Exception as e:
            self.unhandled(e, method, path)
            result, body = Error.status, body_of(Error)
        if metrics is not None:
            try:
                if result >= 500 and not shed:
                    metrics.server_error(route_name(path), result)
                metrics.request(
                    path if path in ROUTE_PATHS else route_name(path), time.perf_counter() - start
                )
            except Exception as e:
                self.observation_failed(e)
        if content_type is not None:
            return self.serve_metrics(start_response, method == "HEAD", body, content_type)
        record = environ.get(
            RECORD_KEY
        )  # access_record = "edge": nginx logs it, and strips the header
        extra_headers = (
            *extra_headers,
            (RESULT_HEADER, str(result) if record is None else f"{result} {record}"),
        )
        # The 400 and 403 results (docs/api.md) travel as HTTP 200 unless AUTHSVC_ERROR_STATUS=http.
        status = self.http_statuses.get(result, result)
        return respond(
            start_response, status, body, head=method == "HEAD", extra_headers=extra_headers
        )

    def store_unavailable(self, path: str) -> None:
        """Count a 503 for lack of the store, and say so in the log at most once per
        STORE_WARNING_INTERVAL."""
        if self.metrics is not None:
            try:
                self.metrics.store_unavailable()
            except Exception as e:
                self.observation_failed(e)
        try:
            held = self.store_warnings.allow()
            if held is not None:
                since = f" ({held} more since the last such line)" if held else ""
                log.warning("store unavailable on %s%s", route_name(path), since)
        except Exception:
            pass  # the logger itself fails: nothing is left to tell it with

    def not_ready(self, error: ConfigError) -> None:
        """Why the schema check failed (an older store, or a newer one this release cannot read), in
        the log at most once per STORE_WARNING_INTERVAL: the probe's answer is the plain 503."""
        try:
            held = self.schema_warnings.allow()
            if held is not None:
                since = f" ({held} more since the last such line)" if held else ""
                log.warning("not ready: %s%s", str(error).splitlines()[0], since)
        except Exception:
            pass  # the logger itself fails: the answer is the 503 all the same

    @staticmethod
    def unhandled(error: Exception, method: str, path: str) -> None:
        """A bug: its frames and exception type in the log; no message, query string or body,
        so no credential can reach the log."""
        try:
            frames = "".join(traceback.format_tb(error.__traceback__))
            log.error(
                "unhandled %s on %s %s\n%s", type(error).__name__, method, route_name(path), frames
            )
        except Exception:
            pass  # the logger itself fails: the answer is the 500 all the same

    def observation_failed(self, error: Exception) -> None:
        """Metrics or a log line failed (a bug, a full disk under the metrics files): the answer
        goes out unchanged, and the log says so at most once per STORE_WARNING_INTERVAL, with the
        exception type and frames only (docs/operations.md, "Monitoring")."""
        try:
            held = self.observation_warnings.allow()
            if held is not None:
                since = f" ({held} more since the last such line)" if held else ""
                frames = "".join(traceback.format_tb(error.__traceback__))
                log.error(
                    "metrics or logging failed: %s%s\n%s", type(error).__name__, since, frames
                )
        except Exception:
            pass  # the logger is what fails

    def authenticate(self, environ: dict) -> tuple[int, bytes]:
        """(the result code of docs/api.md, the body); __call__ picks the HTTP status."""
        start = time.perf_counter()
        stamp = environ.get("HTTP_X_REQUEST_START")  # none: not through nginx, no clock read
        if stamp is not None and waited_too_long(
            stamp, self.clock(), self.settings.max_queue_wait, self.serving_since
        ):
            self.waited_too_long(environ, start)
            raise WaitedTooLong()
        try:
            error, body, reason, game_id, user_id = self.authenticator(
                request_params(environ, self.settings.max_body_bytes)
            )
        except StoreUnavailable:
            self.observe(environ, start, STORE_UNAVAILABLE, None, None)
            raise
        except Error:  # a body that cannot be read, too large, or too many parameters
            self.observe(environ, start, MALFORMED, None, None)
            raise
        self.observe(environ, start, reason, game_id, user_id)
        if error is None:
            return 200, body
        return error.status, REFUSALS[error]

    def waited_too_long(self, environ: dict, start: float) -> None:
        """Count and log an authentication shed for its time in the queue (authsvc/web/queueing.py):
        its auth line and count (reason=waited_too_long), and a warning at most once per
        STORE_WARNING_INTERVAL."""
        self.observe(environ, start, WAITED_TOO_LONG, None, None)
        try:
            held = self.queue_warnings.allow()
            if held is not None:
                since = f" ({held} more since the last such line)" if held else ""
                log.warning(
                    "authentication waited over AUTHSVC_MAX_QUEUE_WAIT (%gs) in the queue: 503%s",
                    self.settings.max_queue_wait,
                    since,
                )
        except Exception:
            pass  # the logger itself fails: the answer is the 503 all the same

    def observe(
        self, environ: dict, start: float, reason: str, game_id: int | None, user_id: int | None
    ) -> None:
        """Count it (authsvc_authentications_total) and record it once (docs/logs.md): for nginx's
        access line (access_record = "edge", a request through nginx), else in one logfmt line of
        the app's. Only a reason word and validated ids: never a key, a token, the query string or a
        client's text. Neither failing changes the answer."""
        if self.metrics is not None:
            try:
                self.metrics.authentication(game_id, reason)
            except Exception as e:
                self.observation_failed(e)
        if self.settings.access_record == "edge" and from_proxy(
            environ.get("REMOTE_ADDR") or "", self.settings.forwarded_allow_ips
        ):
            environ[RECORD_KEY] = (
                f"reason={reason} game={'none' if game_id is None else game_id} "
                f"user={'-' if user_id is None else user_id}"
            )
            return
        if auth_log.isEnabledFor(logging.INFO):
            rid = request_id(environ.get("HTTP_X_REQUEST_ID"))
            host = "https" if environ.get("wsgi.url_scheme") == "https" else "legacy"
            game = "none" if game_id is None else game_id
            user = "-" if user_id is None else user_id
            ms = (time.perf_counter() - start) * 1000
            line = f"auth rid={rid} host={host} game={game} user={user} reason={reason} ms={ms:.3f}"
            # One formatted string, no caller lookup (logging's findCaller walks the stack).
            try:
                auth_log.handle(
                    auth_log.makeRecord(auth_log.name, logging.INFO, __file__, 0, line, (), None)
                )
            except Exception as e:
                self.observation_failed(e)

    @staticmethod
    def serve_metrics(start_response, head: bool, body: bytes, content_type: str) -> list[bytes]:
        """The Prometheus text format of all workers, not JSON (authsvc/web/metrics.py); only with
        the metrics extra. Called by __call__ once everything that can fail is done: start_response
        is the last step."""
        start_response(
            "200 OK",
            [
                ("Content-Type", content_type),
                ("Cache-Control", "no-store"),
                ("Content-Length", str(len(body))),
                (RESULT_HEADER, "200"),
            ],
        )
        return [] if head else [body]

    def openapi(self, environ: dict) -> tuple[int, bytes]:
        """The OpenAPI document of this API (docs/api.md, "The OpenAPI document"), read when the app
        was built."""
        return 200, self.openapi_document

    def health(self, environ: dict) -> tuple[int, bytes]:
        """Liveness: the process serves. Never touches the store, so an outage does not get it
        restarted."""
        return 200, b'{"success":true,"status":"ok"}'

    def ready(self, environ: dict) -> tuple[int, bytes]:
        """Readiness: the store answers the authentication query itself and this release reads its
        schema (its own version, or a newer one its queries run on: store/common.py,
        check_schema)."""
        self.store.credentials("", 1)
        now = self.monotonic()
        if now - self.schema_checked_at >= SCHEMA_CHECK_INTERVAL:
            try:
                self.store.check()
            except ConfigError as e:
                self.not_ready(e)
                raise ServiceUnavailable() from None
            self.schema_checked_at = now
        return 200, b'{"success":true,"status":"ready"}'


def openapi_document() -> bytes:
    """authsvc/openapi/authenticate.json (package data), re-encoded as the API answers: compact,
    ASCII-only JSON, with this release's version as ``info.version`` (one source: pyproject.toml).
    Read when the app is built, so a broken document fails start-up, not a request."""
    text = (
        resources.files("authsvc")
        .joinpath("openapi", "authenticate.json")
        .read_text(encoding="utf-8")
    )
    document = json.loads(text)
    document["info"]["version"] = release()
    return json.dumps(document, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def make_app(
    settings: Settings, store: Reader | None = None, *, tolerate_outage: bool = False
) -> App:
    """Build the app; the store is checked now, so a bad store fails start-up, not a request.
    ``tolerate_outage``: a store that is merely unreachable (StoreUnreachable at the check, or
    StoreUnavailable reading the secrets' fingerprints just after it) is logged and the app built
    anyway, without the known-secret check, answering 503 until the store is back (a gunicorn
    worker: docs/stores.md, "Outages"); without it, either is raised as StoreUnreachable."""
    if store is None:
        store = open_reader(
            settings.store, settings
        )  # read-only, and no method that writes (store/base.py)
        try:
            store.check()
            known = store.token_secrets()  # its own connection: the outage may begin in between
        except (StoreUnreachable, StoreUnavailable) as e:
            if not tolerate_outage:
                # An outage either way: the master exits 75 for it and systemd tries again
                # (authsvc/web/wsgi.py).
                raise StoreUnreachable(str(e)) from None
            log.warning("%s; starting anyway, answering 503 until it answers", e)
        else:
            # A secret file the store was never used with would refuse every token: refused at
            # start-up.
            check_known(settings.token_secrets, known, settings.token_secret_file)
        if isinstance(store, SQLiteReader) and (warning := store.journal_mode_warning()):
            log.warning("%s", warning)
        store.close()  # each worker opens its own connection after fork
    from authsvc.web import metrics  # stdlib only; prometheus_client is imported only if installed

    return App(settings, store, metrics=metrics.create(store))
