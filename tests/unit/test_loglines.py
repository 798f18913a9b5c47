"""authsvc/loglines.py: the error log's time text is cheaper and exactly what logging itself would
have made (docs/logs.md holds the format); a logged request id has its documented shape."""

from __future__ import annotations

import io
import logging
import time

from authsvc.loglines import CachedTimeFormatter
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


def test_the_cached_time_text_is_logging_s_own():
    cached, plain = CachedTimeFormatter(FORMAT, DATEFMT), logging.Formatter(FORMAT, DATEFMT)
    logger = logging.getLogger("test.loglines.time")
    start = int(time.time())
    for created in (
        start + 0.1,
        start + 0.9,
        start + 1.0,
        start + 1.5,
        start + 3601.2,
        start + 0.2,
    ):
        record = logger.makeRecord(logger.name, logging.INFO, __file__, 0, "line", (), None)
        record.created = created
        assert cached.format(record) == plain.format(record)
    # Without a datefmt the default time text holds the milliseconds: never cached.
    record.created, record.msecs = start + 0.25, 250.0
    first = CachedTimeFormatter(FORMAT).format(record)
    record.created, record.msecs = start + 0.75, 750.0
    assert (
        first
        != CachedTimeFormatter(FORMAT).format(record)
        == logging.Formatter(FORMAT).format(record)
    )


def test_a_line_in_the_same_second_formats_no_time_again():
    """What CachedTimeFormatter saves: localtime and strftime, once a line's second has been
    formatted."""
    formatter = CachedTimeFormatter(FORMAT, DATEFMT)
    logger = logging.getLogger("test.loglines.cost")
    record = logger.makeRecord(
        logger.name, logging.INFO, __file__, 0, "auth rid=- reason=success", (), None
    )
    formatter.format(record)
    assert {"localtime", "strftime"} <= set(
        profile(lambda: logging.Formatter(FORMAT, DATEFMT).format(record))
    )
    assert not {"localtime", "strftime"} & set(profile(lambda: formatter.format(record)))


def test_a_request_id_is_logged_only_in_its_documented_shape():
    """docs/logs.md: 1 to 64 ASCII letters, digits, '.', '_', '-'; anything else is "-"."""
    from authsvc.loglines import request_id

    for good in ("e403c0fcef6463d39fc7a9b815431506", "a", "client-7.retry_2", "x" * 64):
        assert request_id(good) == good
    for bad in (
        None,
        "",
        "x" * 65,
        "abc result=200",
        "\u00e9t\u00e9",
        "\u0661\u0662",
        "a\n",
        'a"b',
        "a,b",
    ):
        assert request_id(bad) == "-"
