"""Typed errors, mapped to JSON answers in one place (app.py).

Each HTTP error knows its status and the text a client sees; nothing here ever
carries a request value, so no secret can leak through an error message.
"""


class ConfigError(Exception):
    """Settings, secret or store unusable at start-up: the process must not serve."""


class StoreUnreachable(ConfigError):
    """The store did not answer the start-up check (down, restarting): fatal in the master at
    start-up, tolerated in a gunicorn worker that boots during an outage (docs/stores.md, "Outages")."""


class StoreUnavailable(Exception):
    """The store cannot answer right now (down, missing, unreadable): HTTP 503, one line for the admin."""


class StoreLocked(StoreUnavailable):
    """Another session held the write lock longer than an admin write waits (store/base.py)."""


class StoreFull(StoreUnavailable):
    """The disk (or the database's quota) is full: the write was rolled back."""


class CommandError(Exception):
    """Bad input or a failed precondition in the admin command: one line on stderr, exit 1."""


class OperationError(CommandError):
    """A write or read of the operations layer (authsvc/admin/operations.py) refused, in one line.

    The command prints it and exits 1; the admin API will answer each subclass with
    its own HTTP status. A store that is locked or down raises StoreLocked or
    StoreUnavailable (above), which both front doors map as well.
    """


class OperationNotFound(OperationError):
    """No such game or player (API: 404)."""


class OperationConflict(OperationError):
    """The write would break a uniqueness rule, or the store is not empty (API: 409)."""


class OperationPreconditionFailed(OperationError):
    """A conditional write (the admin API's If-Match) found the target changed meanwhile (API: 412)."""


class OperationInvalid(OperationError):
    """Input that breaks a rule: a name, a user id, a TTL, a file's rows (API: 422)."""


class HTTPError(Exception):
    status = 500
    description = "Internal server error"
    headers: tuple[tuple[str, str], ...] = ()

    def __init__(self, description: str | None = None):
        super().__init__(description or self.description)
        if description:
            self.description = description


class NotFound(HTTPError):
    status = 404
    description = "Not found"


class MethodNotAllowed(HTTPError):
    status = 405
    description = "Method not allowed"

    def __init__(self, allowed: tuple[str, ...]):
        super().__init__()
        self.headers = (("Allow", ", ".join(allowed)),)


class BadRequest(HTTPError):
    """A request the service cannot read at all (broken body); error 400."""

    status = 400
    description = "Bad request"


class PayloadTooLarge(HTTPError):
    status = 413
    description = "Request body too large"


class ServiceUnavailable(HTTPError):
    status = 503
    description = "Service temporarily unavailable, try again"
