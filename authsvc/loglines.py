"""Cheaper log lines, the same text: the auth line's records, and the time of day once a second;
the one shape of a logged request id; and a throttle for the lines an outage would write on every
request (LogThrottle).

An auth line (docs/logs.md) costs a worker 54,069 instructions a request
(BENCHMARKS.md, "The shipped path against plain", rows 3 - 4), in two places that
repeat the same work for every line:

- ``Logger.makeRecord`` recomputes what is the same for every line a process
  writes from one place: the level name, the file and module names (two
  ``os.path`` calls), the process id (a ``getpid`` system call), the process name.
  ``LineRecords`` copies one record made by ``makeRecord`` in this process (a
  forked worker makes its own) and sets this line's message, times and thread:
  every attribute is there, with the value ``makeRecord`` would have given it.
- ``logging.Formatter`` formats the time (``localtime`` and ``strftime``) for each
  line; with a ``datefmt`` (whole seconds) ``CachedTimeFormatter`` keeps the text
  of the current second. deploy/gunicorn.conf.py uses it for the error log.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import weakref
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
# The request id an app answered with and recorded (the admin API makes its own for every request): the
# access line's rid= is that one, else the X-Request-Id header's.
REQUEST_ID_KEY = "authsvc.request_id"


def request_id(value: str | None) -> str:
    """``X-Request-Id`` as logged: itself in the documented shape, else "-"."""
    return value if value is not None and _REQUEST_ID.fullmatch(value) else "-"


class LineRecords:
    """Records of one logger, level and source file, for messages without arguments."""

    def __init__(self, logger: logging.Logger, level: int, pathname: str):
        self.logger = logger
        self.level = level
        self.pathname = pathname
        self._template: dict | None = None
        records = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: _forget(records))

    def make(self, msg: str) -> logging.LogRecord:
        template = self._template
        if template is None:
            template = self._template = self.logger.makeRecord(
                self.logger.name, self.level, self.pathname, 0, "", (), None
            ).__dict__
        now = time.time()
        record = logging.LogRecord.__new__(logging.LogRecord)
        record.__dict__ = template.copy()
        record.msg = msg
        record.created = now
        record.msecs = int((now - int(now)) * 1000) + 0.0
        record.relativeCreated = template["relativeCreated"] + (now - template["created"]) * 1000
        if template["thread"] is not None:  # logging.logThreads
            thread = threading.get_ident()
            if thread != template["thread"]:  # another thread of a gthread worker
                record.thread, record.threadName = thread, threading.current_thread().name
        return record


def _forget(records: weakref.ref) -> None:
    """In a forked child: the parent's process id is not this process's."""
    if (r := records()) is not None:
        r._template = None


class CachedTimeFormatter(logging.Formatter):
    """logging.Formatter; with a ``datefmt``, the time text is made once per second, not per line."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stamp: tuple[int, str, str] | None = None  # (second, datefmt, text): one tuple, for threads

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
        """The number of lines held back since the last one if a line may be written now, else None."""
        with self.lock:
            now = self.clock()
            if now < self.next_at:
                self.held += 1
                return None
            held, self.held, self.next_at = self.held, 0, now + self.interval
            return held
