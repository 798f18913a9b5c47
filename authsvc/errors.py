"""The one error model: every refusal and failure the service names, as one hierarchy.

Each class is one meaning, with the HTTP status it stands for and a short ``slug``; an error
carries a ``detail`` worded for no front door in particular, and, for bad input, the ``field``
at fault. Each front door maps them once:

- the game-facing endpoint (authsvc/web/answers.py): ``{"success": false, "error": status,
  "error_description": detail}``; the web path's own errors keep their wire texts as the
  classes' default details ("Not found", "Bad request", "Invalid credentials", ...);
- the admin API (authsvc/api/app.py, ``problem_for``): an RFC 9457 problem of that status
  and slug, ``field`` as the body's JSON pointer (``/old_key_ttl``);
- the admin command (authsvc/cli/command.py): one line on stderr and exit 1, ``field`` as
  its option (``--old-key-ttl``).

Nothing here carries a request value unless the code that raises it put it there, and no
code puts a secret into one.
"""

from __future__ import annotations

from http import HTTPStatus


class Error(Exception):
    """The base of every error the service names; ``status`` and ``slug`` say which meaning it
    is."""

    status = 500
    slug = "internal"
    detail = "Internal server error"
    headers: tuple[tuple[str, str], ...] = ()  # a class may set its own (a shed 503's Retry-After)

    def __init__(
        self,
        detail: str | None = None,
        *,
        field: str | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        extra: dict | None = None,
        errors: list[dict] | None = None,
    ):
        super().__init__(detail or self.detail)
        if detail:
            self.detail = detail
        self.field = (
            field  # the input at fault: a body field's JSON pointer, a query or header name
        )
        if headers:
            self.headers = headers
        self.extra = extra or {}
        self.errors = errors  # several fields at fault, as the admin API lists them


# -- the store and the settings: the service cannot answer (503) -------------------------------


class ConfigError(Error):
    """Settings, secret or store unusable at start-up: the process must not serve."""

    status, slug = 503, "unavailable"


class StoreUnreachable(ConfigError):
    """The store did not answer the start-up check (down, restarting): fatal in the master at
    start-up, tolerated in a gunicorn worker that boots during an outage (docs/stores.md,
    "Outages")."""


class StoreUnavailable(Error):
    """The store cannot answer right now (down, missing, unreadable): HTTP 503, one line for the
    admin."""

    status, slug = 503, "unavailable"


class StoreLocked(StoreUnavailable):
    """Another session held the write lock longer than an admin write waits (store/base.py)."""


class StoreFull(StoreUnavailable):
    """The disk (or the database's quota) is full: the write was rolled back."""


class ServiceUnavailable(Error):
    """Not now (shed, not ready); the game-facing wire text is the default detail."""

    status, slug = 503, "unavailable"
    detail = "Service temporarily unavailable, try again"


# -- the request or the command's input: refused (4xx) -----------------------------------------


class BadRequest(Error):
    """A request that cannot be read at all (broken body, framing)."""

    status, slug, detail = 400, "bad-request", "Bad request"


class CommandError(BadRequest):
    """The admin command's own input (a file it cannot read, an option out of range): one line, exit
    1."""


class Unauthorized(Error):
    status, slug = 401, "unauthorized"


class Forbidden(Error):
    status, slug, detail = 403, "forbidden", "Forbidden"


class MissingCredentials(BadRequest):
    """An authentication without all three of its parameters (docs/api.md): the game door's 400."""

    detail = "user_id, game_auth_token, and api_key are required parameters"


class InvalidCredentials(Forbidden):
    """An authentication refused, whatever was wrong (docs/api.md): the game door's 403, one answer
    for every reason, so it tells no one which keys or players exist."""

    detail = "Invalid credentials"


class NotFound(Error):
    """No such game, player, token or path."""

    status, slug, detail = 404, "not-found", "Not found"


class MethodNotAllowed(Error):
    status, slug, detail = 405, "method-not-allowed", "Method not allowed"

    def __init__(self, allowed: tuple[str, ...], detail: str | None = None):
        super().__init__(detail, headers=(("Allow", ", ".join(allowed)),))


class Conflict(Error):
    """The write would break a uniqueness rule, or the store is not empty."""

    status, slug = 409, "conflict"


class SecretNotKept(Conflict):
    """A replayed request whose answer held a secret shown once (authsvc/api/idempotency.py)."""

    slug = "idempotency-secret-not-kept"


class PreconditionFailed(Error):
    """A conditional write (If-Match) found the target changed meanwhile."""

    status, slug = 412, "precondition-failed"


class PayloadTooLarge(Error):
    status, slug, detail = 413, "too-large", "Request body too large"


class UnsupportedMediaType(Error):
    status, slug = 415, "unsupported-media-type"


class Invalid(Error):
    """Input that breaks a rule: a name, an id, a TTL, a file's rows; ``field`` names it if one
    does."""

    status, slug = 422, "validation"


class KeyReused(Error):
    """An Idempotency-Key sent again with another request."""

    status, slug = 422, "idempotency-key-reused"


class TooManyRequests(Error):
    status, slug = 429, "too-many-requests"


# -- what gunicorn refuses before an app sees the request -------------------------------------


class UriTooLong(Error):
    status, slug, detail = 414, "uri-too-long", "Request URI too long"


class ExpectationFailed(Error):
    status, slug, detail = 417, "expectation-failed", "Expectation failed"


class HeaderTooLarge(Error):
    status, slug, detail = 431, "header-too-large", "Request header too large"


class NotImplementedByServer(Error):
    status, slug, detail = 501, "not-implemented", "Not implemented"


# The one table of gunicorn's refusals (authsvc/serving/workers.py answers them, each door in its
# own words): the status gunicorn chose, the error it stands for. The default details are the
# game-facing wire texts, the words nginx's JSON errors use
# (deploy/nginx/snippets/authsvc-json-errors.conf).
GUNICORN_REFUSALS: dict[int, type[Error]] = {
    400: BadRequest,
    403: Forbidden,
    414: UriTooLong,
    417: ExpectationFailed,
    431: HeaderTooLarge,
    500: Error,
    501: NotImplementedByServer,
}


def refused(status: int) -> type[Error]:
    """The error of a request gunicorn refused with ``status``: another status is 400, or 500 from
    500 up."""
    return GUNICORN_REFUSALS.get(status) or (Error if status >= 500 else BadRequest)


# RFC 9110's names where Python's http module before 3.13 keeps RFC 7231's ("Unprocessable Entity"):
# the status line is the same on every interpreter, and as the docs show it.
RFC_9110_PHRASES = {
    413: "Content Too Large",
    414: "URI Too Long",
    416: "Range Not Satisfiable",
    422: "Unprocessable Content",
}


def reason_phrase(status: int) -> str:
    """The status's reason phrase as RFC 9110 names it."""
    return RFC_9110_PHRASES.get(status) or HTTPStatus(status).phrase
