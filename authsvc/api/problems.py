"""The admin API's errors: RFC 9457 ``application/problem+json``, one for every error (its requests
and answers are authsvc/api/messages.py's).

Unlike the game-facing endpoint (docs/api.md), whose 200-for-errors serves old game
clients, the admin API answers with real HTTP statuses (docs/admin-api.md,
"Errors"). A Problem is the answer to one error of authsvc/errors.py (``from_error``, the
admin API's one mapping); it carries only text the service wrote, never a request value:
no token, key or body can come back in an error.
"""

from __future__ import annotations

import json
import logging

from authsvc.errors import (
    ConfigError,
    Error,
    Invalid,
    StoreFull,
    StoreUnavailable,
    reason_phrase,
    refused,
)

log = logging.getLogger("authsvc.admin")

TYPE_BASE = "urn:authsvc:problem:"  # each type names a section of docs/admin-api.md, "Errors"
RETRY_AFTER = "2"  # seconds; a store outage or a lock held by an import


class Problem:
    """An error answer: status, a short type slug, a detail for people; ``errors``: the fields at
    fault."""

    def __init__(
        self,
        status: int,
        slug: str,
        detail: str,
        *,
        errors: list[dict] | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        extra: dict | None = None,
    ):
        self.status = status
        self.slug = slug
        self.detail = detail
        self.errors = errors
        self.headers = headers
        self.extra = extra or {}

    def body(self) -> dict:
        obj = {
            "type": TYPE_BASE + self.slug,
            "title": reason_phrase(self.status),
            "status": self.status,
            "detail": self.detail,
        } | self.extra
        if self.errors is not None:
            obj["errors"] = self.errors
        return obj


# What gunicorn itself refuses, before the app sees a request (authsvc.errors.GUNICORN_REFUSALS), in
# the admin API's words (docs/admin-api.md, "Errors"): no request data.
_REFUSAL_DETAILS = {
    400: "the server could not read the request: a malformed request line, header or framing",
    403: "the server refuses requests of this connection",
    414: "the request line is longer than the server reads",
    417: "the only Expect the server knows is 100-continue",
    431: "a header line is longer, or there are more header lines, than the server reads",
    500: "unexpected failure; the service's log has the error",
    501: "the server does not implement what the request asks for",
}


def refusal(status: int) -> Problem:
    """The problem for a request gunicorn refused with ``status`` (authsvc/serving/workers.py)."""
    error = refused(status)
    return from_error(error(_REFUSAL_DETAILS[error.status]))


def problem_for(error: BaseException, rid: str) -> Problem:
    """The admin API's one mapping of errors to problems (authsvc/errors.py), for its error boundary
    (authsvc/api/app.py) and the answers an Idempotency-Key keeps (authsvc/api/idempotency.py): a
    store that cannot answer is a 503 to retry, its reason logged; anything that is not an Error a
    500, its traceback logged under the request id."""
    if isinstance(error, StoreFull):  # no retry helps until someone frees space: the detail says so
        log.error("admin API: store full (request %s): %s", rid, str(error).splitlines()[0])
        return Problem(
            503,
            "unavailable",
            "the store's disk is full; nothing was written",
            headers=(("Retry-After", RETRY_AFTER),),
        )
    if isinstance(error, (StoreUnavailable, ConfigError)):
        log.warning(
            "admin API: store unavailable (request %s): %s", rid, str(error).splitlines()[0]
        )
        return Problem(
            503,
            "unavailable",
            "the store cannot answer right now; try again",
            headers=(("Retry-After", RETRY_AFTER),),
        )
    if isinstance(error, Error):
        return from_error(error)
    log.error("admin API: unexpected %s (request %s)", type(error).__name__, rid, exc_info=error)
    return Problem(
        500, "internal", "unexpected failure; the request id names it in the service's log"
    )


def from_error(error: Error) -> Problem:
    """An error's problem: its status and slug; bad input names its field (``/old_key_ttl: must be
    ...``, and ``errors`` lists it) or, naming none, is listed with field ""."""
    if isinstance(error, Invalid) and error.errors is None:
        field = error.field or ""
        detail = f"{field}: {error.detail}" if field else error.detail
        return Problem(
            error.status,
            error.slug,
            detail,
            errors=[{"field": field, "detail": error.detail}],
            headers=error.headers,
            extra=error.extra,
        )
    return Problem(
        error.status,
        error.slug,
        error.detail,
        errors=error.errors,
        headers=error.headers,
        extra=error.extra,
    )


def invalid(field: str, detail: str) -> Invalid:
    """422 naming one field (a JSON pointer into the body, or a query parameter's or header's
    name)."""
    return Invalid(detail, field=field)


def encode(obj: dict) -> bytes:
    """Compact JSON, ASCII only (``\\u`` escapes), one line."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode("ascii")
