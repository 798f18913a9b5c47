"""Keep request data out of gunicorn's error log (deploy/gunicorn.conf.py attaches this).

gunicorn writes parts of a request into its error log in two places: a request
it cannot parse ("Invalid request from ip=...: Invalid HTTP request line: '<the
line>'", workers/base.py ``handle_error``) and an exception outside the app
("Error handling request GET /path?query", with a traceback). The query string
holds api_key and game_auth_token, and a hostile request line can hold any
quote or byte, so no pattern can find where the data ends: these messages are
replaced whole by a fixed text that names only the kind of error. Tracebacks
keep their frame lines (file, line, function, source) and lose the exception
messages, which may quote the request.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import traceback

REDACTED = "<redacted>"
WITHHELD = "(text withheld)"
INVALID_REQUEST = "Invalid request from ip="
ERROR_HANDLING = "Error handling request"
# The start of each gunicorn 27 parse error (gunicorn/http/errors.py) -> the kind logged.
_KINDS = (
    ("Invalid HTTP request line", "invalid request line"),
    ("Invalid HTTP method", "invalid method"),
    ("Invalid HTTP Version", "invalid HTTP version"),
    ("Invalid HTTP Header", "invalid header"),
    ("Invalid HTTP header name", "invalid header name"),
    ("Obsolete line folding", "obsolete header line folding"),
    ("Unable to comply with expectation", "unsupported Expect header"),
    ("Unsupported transfer coding", "unsupported transfer coding"),
    ("Invalid chunk size", "invalid chunk size"),
    ("Invalid chunk terminator", "invalid chunk terminator"),
    ("Invalid chunk extension", "invalid chunk extension"),
    ("Request Line is too large", "request line too large"),
    ("limit request", "request headers too large"),
    ("max buffer headers", "request headers too large"),
    ("Invalid PROXY", "invalid PROXY protocol line"),
    ("Proxy request from", "proxy request not allowed"),
    ("Contradictory scheme headers", "contradictory scheme headers"),
    ("Expected HTTP/2 connection preface", "invalid HTTP/2 preface"),
    ("Configuration problem", "configuration problem"),
    ("", "request error"),  # any other
)
_QUERY = re.compile(r"\?[^\s'\"]*")
_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")
_FRAME = re.compile(r'\s*File "[^"\n]*", line \d+')
_METHOD = re.compile(r"[A-Z]{1,16}")


def invalid_request(message: str) -> str:
    """gunicorn's "Invalid request from ip=IP: ERROR" as the address and the kind of error only."""
    ip, _, error = message[len(INVALID_REQUEST) :].partition(": ")
    try:
        ip = str(ipaddress.ip_address(ip)) if ip else ""
    except ValueError:
        ip = REDACTED
    # Already rewritten (dictConfig adds the filter again on each HUP): kept as it is.
    kind = next((kind for _, kind in _KINDS if error == f"{kind} {WITHHELD}"), None)
    if kind is None:
        kind = next(kind for prefix, kind in _KINDS if error.startswith(prefix))
    return f"{INVALID_REQUEST}{ip}: {kind} {WITHHELD}"


def error_handling(message: str, routes: frozenset[str]) -> str:
    """gunicorn's "Error handling request METHOD URI" with a known route name or "<other>"."""
    words = message[len(ERROR_HANDLING) :].removesuffix(" " + WITHHELD).split()
    method = words[0] if len(words) == 2 and _METHOD.fullmatch(words[0]) else ""
    path = words[-1].partition("?")[0] if words else ""
    route = path if path in routes else "<other>"
    return " ".join(filter(None, (ERROR_HANDLING, method, route, WITHHELD)))


def _scrub_line(line: str) -> str:
    if _FRAME.match(line):  # a traceback frame: file name and line number stay readable
        return line
    line = _QUOTED.sub(lambda m: m.group(0)[0] + REDACTED + m.group(0)[0], line)
    return _QUERY.sub("?" + REDACTED, line)


def redact(text: str, routes: frozenset[str] = frozenset()) -> str:
    """One error-log message without request data: gunicorn's request messages replaced
    whole; in any other message, quoted values and query strings cut as a last resort
    (gunicorn logs no request data there today), traceback frame lines kept."""
    if text.startswith(INVALID_REQUEST):
        return invalid_request(text)
    if text.startswith(ERROR_HANDLING):
        return error_handling(text, routes)
    return "\n".join(_scrub_line(line) for line in text.split("\n"))


def frames_only(exc: BaseException) -> str:
    """A traceback (chained exceptions too) with its frames and the exception types,
    never the exception messages."""
    # The exceptions themselves, not traceback.TracebackException's view of them: its exc_type is
    # deprecated since Python 3.13, and the type is all this needs.
    parts: list[str] = []
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(chain) < 20:
        chain.append(current)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    for i, error in enumerate(reversed(chain)):
        if i:
            parts.append(
                "\nDuring handling of, or caused by, the above exception, another occurred:\n\n"
            )
        parts.append("Traceback (most recent call last):\n")
        parts.extend(traceback.extract_tb(error.__traceback__).format())
        exc_type = type(error)
        name = exc_type.__qualname__
        if exc_type.__module__ not in ("builtins", "__main__"):
            name = f"{exc_type.__module__}.{name}"
        parts.append(f"{name}: {WITHHELD}\n")
    return "".join(parts).rstrip("\n")


class RedactFilter(logging.Filter):
    """A logger filter: rewrites each record's message through ``redact`` and its traceback
    through ``frames_only``."""

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        from authsvc.web.app import ROUTE_PATHS  # the app's routes, named in the log

        self.routes = frozenset(ROUTE_PATHS)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format: keep only the template
            message = str(record.msg)
        record.msg, record.args = redact(message, self.routes), ()
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = frames_only(record.exc_info[1])
        return True
