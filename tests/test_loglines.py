"""authsvc/loglines.py: the auth line's records and the error log's time text are cheaper,
and exactly what logging itself would have made (docs/logs.md holds the format)."""

from __future__ import annotations

import io
import logging
import os
import threading
import time
from collections import Counter

from authsvc.loglines import CachedTimeFormatter, LineRecords
from tests.support import profile

# The error log's format in deploy/gunicorn.conf.py.
FORMAT = "%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s"
DATEFMT = "%Y-%m-%d %H:%M:%S %z"
TIMES = ("created", "msecs", "relativeCreated")


def _logger(name: str, formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    logger = logging.getLogger(f"test.loglines.{name}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.handlers.clear()
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    logger.addHandler(handler)
    return logger, out


def test_a_record_has_what_make_record_gives():
    logger, _ = _logger("attributes", logging.Formatter(FORMAT, DATEFMT))
    records = LineRecords(logger, logging.INFO, __file__)
    records.make("first")  # the second line is a copy
    before = time.time()
    made = records.make("auth rid=- reason=success")
    expected = logger.makeRecord(logger.name, logging.INFO, __file__, 0, "auth rid=- reason=success", (), None)
    after = time.time()
    assert type(made) is logging.LogRecord
    mine, theirs = vars(made), vars(expected)
    assert {k: v for k, v in mine.items() if k not in TIMES} == {k: v for k, v in theirs.items() if k not in TIMES}
    assert before <= made.created <= after
    assert made.msecs == int((made.created - int(made.created)) * 1000)
    assert abs(made.relativeCreated - expected.relativeCreated) <= (after - before) * 1000 + 1


def test_a_record_names_the_thread_that_wrote_it():
    logger, _ = _logger("threads", logging.Formatter(FORMAT, DATEFMT))
    records = LineRecords(logger, logging.INFO, __file__)
    records.make("in the main thread")
    made = []
    thread = threading.Thread(target=lambda: made.append(records.make("in another")), name="gthread-7")
    thread.start()
    thread.join()
    assert (made[0].thread, made[0].threadName) == (thread.ident, "gthread-7")
    assert records.make("back").threadName == threading.current_thread().name


def test_a_forked_child_names_its_own_process():
    """A preloaded app is built in gunicorn's master: its workers must not log the master's pid."""
    logger, _ = _logger("fork", logging.Formatter(FORMAT, DATEFMT))
    records = LineRecords(logger, logging.INFO, __file__)
    assert records.make("in the parent").process == os.getpid()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and leave without running pytest's exit handlers
        try:
            os.write(write, f"{records.make('in the child').process} {os.getpid()}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        logged, actual = f.read().split()
    os.waitpid(pid, 0)
    assert logged == actual != str(os.getpid())


def test_the_cached_time_text_is_logging_s_own():
    cached, plain = CachedTimeFormatter(FORMAT, DATEFMT), logging.Formatter(FORMAT, DATEFMT)
    logger = logging.getLogger("test.loglines.time")
    start = int(time.time())
    for created in (start + 0.1, start + 0.9, start + 1.0, start + 1.5, start + 3601.2, start + 0.2):
        record = logger.makeRecord(logger.name, logging.INFO, __file__, 0, "line", (), None)
        record.created = created
        assert cached.format(record) == plain.format(record)
    # Without a datefmt the default time text holds the milliseconds: never cached.
    record.created, record.msecs = start + 0.25, 250.0
    first = CachedTimeFormatter(FORMAT).format(record)
    record.created, record.msecs = start + 0.75, 750.0
    assert first != CachedTimeFormatter(FORMAT).format(record) == logging.Formatter(FORMAT).format(record)


def test_an_auth_line_makes_fewer_calls_than_logging_s_own_path():
    """A count, not a time, against logging's own path (makeRecord, a Formatter: 54 calls a line on
    3.11) measured here, in this interpreter: what both share (Logger.handle, the
    handler, the stream) is CPython's and may grow in any release. Ours adds its few calls and drops
    the record's and the time's: two os.path calls, getpid, localtime and strftime."""
    logger, out = _logger("cost", CachedTimeFormatter(FORMAT, DATEFMT))
    records = LineRecords(logger, logging.INFO, __file__)
    logger.handle(records.make("auth warm-up"))
    for _ in range(20):  # the cached time is made anew once a second: a line that crosses into a new
        # second calls localtime and strftime once, as it should; the next line cannot cross again
        ours = profile(lambda: logger.handle(records.make("auth rid=- reason=success")))
        if not {"localtime", "strftime"} & set(ours):
            break
    plain, _ = _logger("cost-plain", logging.Formatter(FORMAT, DATEFMT))
    plain.handle(plain.makeRecord(plain.name, logging.INFO, __file__, 0, "warm-up", (), None))
    theirs = profile(lambda: plain.handle(plain.makeRecord(plain.name, logging.INFO, __file__, 0, "auth", (), None)))
    added, dropped = Counter(ours) - Counter(theirs), Counter(theirs) - Counter(ours)
    # LineRecords.make, its dict copy, LogRecord.__new__, the clock, CachedTimeFormatter.formatTime.
    assert sum(added.values()) <= 5, added
    removed = {"Logger.makeRecord", "basename", "splitext", "getpid", "localtime", "strftime"}
    assert removed <= set(dropped) and not removed & set(ours), (ours, theirs)
    assert len(ours) < len(theirs), (ours, theirs)
    assert out.getvalue().splitlines()[-1].endswith(f"[{os.getpid()}] [INFO] {logger.name}: auth rid=- reason=success")


def test_a_request_id_is_logged_only_in_its_documented_shape():
    """docs/logs.md: 1 to 64 ASCII letters, digits, '.', '_', '-'; anything else is "-"."""
    from authsvc.loglines import request_id

    for good in ("e403c0fcef6463d39fc7a9b815431506", "a", "client-7.retry_2", "x" * 64):
        assert request_id(good) == good
    for bad in (None, "", "x" * 65, "abc result=200", "\u00e9t\u00e9", "\u0661\u0662", "a\n", "a\"b", "a,b"):
        assert request_id(bad) == "-"
