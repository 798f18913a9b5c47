"""Unix times as text: the one formatter behind the admin API's, the command's and the webhooks'
stamps.

RFC 3339 in UTC (``2026-11-01T12:00:00.250Z``); the command's readable forms are the same text
with a space for the ``T`` (which RFC 3339 allows) or `` UTC`` for the ``Z``. The stamps the tests
and docs show are these bytes: one function, so no copy rounds or pads its own way.
"""

from __future__ import annotations

import time


def utc(ms: int, *, millis: bool = True, sep: str = "T", zone: str = "Z") -> str:
    """Unix milliseconds as UTC text: ``2026-11-01T12:00:00.250Z``; without ``millis``, the whole
    second (truncated: ``2026-11-01T12:00:00Z``)."""
    seconds, rest = divmod(int(ms), 1000)
    text = time.strftime(f"%Y-%m-%d{sep}%H:%M:%S", time.gmtime(seconds))
    return f"{text}.{rest:03d}{zone}" if millis else text + zone
