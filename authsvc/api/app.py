"""The admin API: a WSGI app of its own, for the platform's web tier (docs/admin-api.md).

Run by gunicorn as its own service (authsvc/api/wsgi.py) with the admin store
settings: it writes, so the game-facing process, which never writes, never serves
it. Every request gets an id of the service's own. Then: route (404, 405), find the
bearer token (401), the token's limits (429, authsvc/api/ratelimit.py: a rate where
a body counts by its size, one large body at a time) and its scope (403), read the body
(authsvc/api/body.py: 413, 415, 400), then one operation of the operations layer
(authsvc/operations/) with the actor ``api:<token name>``. One
error boundary (``__call__``) turns every failure into an RFC 9457 problem
(authsvc/api/problems.py): a store that cannot answer is a 503 with
Retry-After, anything unexpected a 500 with an opaque body, its traceback in the
log (no request value: no token can reach the log). ``/openapi.json`` is the API's
OpenAPI document (authsvc/openapi/admin.json), read once when the app is built and
answered without a token: it holds nothing the repository does not.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from collections.abc import Callable
from importlib import resources

from authsvc import release
from authsvc.api import body as bodies
from authsvc.api import idempotency, problems, routes
from authsvc.api.messages import Request, Response
from authsvc.api.problems import encode
from authsvc.api.ratelimit import BODY_UNIT, RateLimit, body_cost
from authsvc.errors import (
    Forbidden,
    MethodNotAllowed,
    TooManyRequests,
    Unauthorized,
    reason_phrase,
)
from authsvc.loglines import REQUEST_ID_KEY, ROUTE_KEY
from authsvc.loglines import request_id as logged_request_id
from authsvc.operations import api_tokens
from authsvc.operations.context import Context
from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.store.base import Store
from authsvc.tokens import SecretFile

log = logging.getLogger("authsvc.admin")

_BEARER = re.compile(r"Bearer +(\S+) *", re.IGNORECASE)
OPENAPI_PATH = "/openapi.json"


class AdminApp:
    """The admin API's WSGI callable; the store opened read-write, once per process."""

    def __init__(
        self, settings: Settings, store: Store | None = None, clock: Callable[[], float] = time.time
    ):
        self.settings = settings
        self.store = (
            store
            if store is not None
            else open_store(settings.store, readonly=False, settings=settings)
        )
        self.clock = clock
        self.rate_limit = RateLimit(settings.admin_rate, settings.admin_burst)
        # Minted with: the file's first secret, re-read at most every AUTHSVC_MAX_STALENESS
        # (docs/tokens.md).
        self.secret_file = SecretFile(
            settings.token_secret_file,
            settings.token_secrets,
            lambda: self.store.token_secrets(),
            settings.max_staleness,
        )
        self.openapi_document = openapi_document()

    def __call__(self, environ: dict, start_response):
        # The request's id is the service's own, for every request: the answer's X-Request-Id, the
        # access line's rid= (authsvc/serving/access_log.py) and every audit record it writes. A
        # client's X-Request-Id names nothing here (two callers may send one); it is kept beside it
        # (handle).
        rid = uuid.uuid4().hex
        environ[REQUEST_ID_KEY] = rid
        try:
            response = self.handle(environ, rid)
        except Exception as e:  # the one error boundary
            p = problems.problem_for(e, rid)
            response = Response(
                p.status, p.body(), p.headers, content_type="application/problem+json"
            )
        body = encode(response.obj)
        headers = [
            ("Content-Type", response.content_type),
            ("Content-Length", str(len(body))),  # a HEAD's too: the GET's length
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
            ("X-Request-Id", rid),
            *response.headers,
        ]
        start_response(f"{response.status} {reason_phrase(response.status)}", headers)
        return [body if environ["REQUEST_METHOD"] != "HEAD" else b""]

    def gunicorn_refusal(self, status: int) -> tuple[tuple[tuple[str, str], ...], bytes]:
        """The answer to a request gunicorn refused before this app saw it (a request line or header
        it cannot read, a limit passed): a problem+json like every admin error, for the worker to
        send (authsvc/serving/workers.py). No request id: there is no request to name."""
        body = encode(problems.refusal(status).body())
        return (
            ("Content-Type", "application/problem+json"),
            ("Cache-Control", "no-store"),
            ("X-Content-Type-Options", "nosniff"),
        ), body

    def handle(self, environ: dict, rid: str) -> Response:
        method = environ["REQUEST_METHOD"]
        path = environ.get("PATH_INFO", "")
        # The access line's name of the request (authsvc/serving/access_log.py): a template, never
        # the path.
        environ[ROUTE_KEY] = OPENAPI_PATH if path == OPENAPI_PATH else routes.route_template(path)
        if path == OPENAPI_PATH:
            if method not in ("GET", "HEAD"):
                raise MethodNotAllowed(("GET", "HEAD"), f"{OPENAPI_PATH} answers GET, HEAD")
            return Response(200, self.openapi_document)
        handler, scope, params = routes.match(path, "GET" if method == "HEAD" else method)
        token = self.authenticate(environ)
        size = bodies.declared(environ)  # None: chunked, known once read
        wait = self.rate_limit.wait(token.name, 1 + body_cost(size or 0))
        if wait:
            raise TooManyRequests(
                f"this api token is over its rate of {self.settings.admin_rate:g} "
                "requests a second (a body counts one more for each 64 KiB); try again after "
                "Retry-After seconds",
                headers=(("Retry-After", str(max(1, math.ceil(wait)))),),
            )
        if scope not in token.scopes:
            raise Forbidden(f"this api token lacks the scope {scope}")
        large = size is None or size > BODY_UNIT
        if large and not self.rate_limit.hold_large(token.name):
            raise TooManyRequests(
                "this api token has another large body in flight (over 64 KiB, or chunked): "
                "send them one at a time; try again after Retry-After seconds",
                headers=(("Retry-After", "1"),),
            )
        try:
            raw = bodies.read_raw(
                environ, getattr(handler, "max_body_bytes", self.settings.max_body_bytes)
            )
            if size is None:
                self.rate_limit.charge(token.name, body_cost(len(raw)))
            body = bodies.parse(raw, environ)
            client_rid = logged_request_id(
                environ.get("HTTP_X_REQUEST_ID")
            )  # in the logged shape, else "-"
            ctx = Context(
                actor=f"api:{token.name}",
                request_id=rid,
                clock=self.clock,
                client_request_id=None if client_rid == "-" else client_rid,
            )
            request = Request(environ, params, body, ctx, token.name)
            key = environ.get("HTTP_IDEMPOTENCY_KEY")
            if method in ("POST", "DELETE") and key is not None:
                return idempotency.run(self, request, key, lambda: handler(self, request))
            return handler(self, request)
        finally:
            if large:
                self.rate_limit.release_large(token.name)

    def authenticate(self, environ: dict):
        unauthorized = Unauthorized(
            "give a live admin api token: Authorization: Bearer <token>",
            headers=(("WWW-Authenticate", 'Bearer realm="authsvc-admin"'),),
        )
        m = _BEARER.fullmatch(environ.get("HTTP_AUTHORIZATION", ""))
        if m is None:
            raise unauthorized
        token = api_tokens.api_token_for(self.store, m[1], int(self.clock()))
        if token is None:
            raise unauthorized
        return token


def openapi_document() -> dict:
    """authsvc/openapi/admin.json (package data): read when the app is built, so a broken document
    fails start-up, not a request."""
    document = json.loads(
        resources.files("authsvc").joinpath("openapi", "admin.json").read_text(encoding="utf-8")
    )
    document["info"]["version"] = release()  # one source: pyproject.toml
    return document
