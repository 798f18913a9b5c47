"""Log lines: the time of day formatted once a second (CachedTimeFormatter); the one shape of a
logged request id; and a throttle for the lines an outage would write on every request
(LogThrottle).

``logging.Formatter`` formats the time (``localtime`` and ``strftime``) for each line; with a
``datefmt`` (whole seconds) ``CachedTimeFormatter`` keeps the text of the current second.
deploy/gunicorn.conf.py uses it for the error log.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

# A request id as both log lines hold it (docs/logs.md): 1 to 64 ASCII letters, digits, '.', '_'
# or '-' (nginx's $request_id is 32 hex digits). Anything else, from a client that reaches
# gunicorn directly, is "-": no space, quote or other text can end up in a line.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")

# What gunicorn's access line calls a request (authsvc/serving/access_log.py, docs/logs.md): an app
# may name its route in the request's environ under ROUTE_KEY, a template of its own routes
# (the admin API: "/v1/players/{user_id}"), never a value of the path; without it, the game-facing
# app's route names. No request header can set it (headers are HTTP_* keys).
ROUTE_KEY = "authsvc.route"
OTHER_ROUTE = "<other>"  # a path that is no route of the app
# The request id an app answered with and recorded (the admin API makes its own for every request):
# the access line's rid= is that one, else the X-Request-Id header's.
REQUEST_ID_KEY = "authsvc.request_id"


def request_id(value: str | None) -> str:
    """``X-Request-Id`` as logged: itself in the documented shape, else "-"."""
    return value if value is not None and _REQUEST_ID.fullmatch(value) else "-"


class CachedTimeFormatter(logging.Formatter):
    """logging.Formatter; with a ``datefmt``, the time text is made once per second, not per
    line."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stamp: tuple[int, str, str] | None = (
            None  # (second, datefmt, text): one tuple, for threads
        )

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is None:  # logging's default format holds the milliseconds
            return super().formatTime(record, datefmt)
        second = int(record.created)
        stamp = self._stamp
        if stamp is None or stamp[0] != second or stamp[1] != datefmt:
            stamp = self._stamp = (second, datefmt, super().formatTime(record, datefmt))
        return stamp[2]


class LogThrottle:
    """At most one line per ``interval`` seconds; counts the lines held back meanwhile.

    A store outage fails every request: one line each would flood the journal.
    """

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self.clock = clock
        self.next_at = float("-inf")
        self.held = 0
        self.lock = threading.Lock()  # gthread workers serve requests from several threads

    def allow(self) -> int | None:
        """The number of lines held back since the last one if a line may be written now, else
        None."""
        with self.lock:
            now = self.clock()
            if now < self.next_at:
                self.held += 1
                return None
            held, self.held, self.next_at = self.held, 0, now + self.interval
            return held
