"""The time an authentication waited before a worker took it, from nginx's stamp
(docs/operations.md, "Login storms").

nginx stamps every request it passes on with the time it sent it on
(``X-Request-Start: t=<unix seconds>.<ms>``, deploy/nginx/snippets/authsvc-proxy.conf;
a client's own header of that name is replaced, never passed). A request that waited
in gunicorn's queue longer than ``AUTHSVC_MAX_QUEUE_WAIT`` is answered 503 with
``Retry-After`` before any store work: its client has waited long enough, and the
worker's time goes to the requests behind it. A burst the host serves within that wait
is served whole, however many arrive at once. A request held by a restart (the socket's backlog
until the new app is built: an upgrade) counts its wait from the app's start. A missing or malformed
stamp (gunicorn reached directly, with no nginx in front) is not checked.
"""

from __future__ import annotations

import re

from authsvc.errors import ServiceUnavailable

# nginx's $msec: unix seconds with milliseconds. Nothing else is a stamp (float() would take
# "nan", "inf", "1e9" or "1_0").
_STAMP = re.compile(r"t=([0-9]{1,12}(?:\.[0-9]{1,6})?)")


class WaitedTooLong(ServiceUnavailable):
    """The request waited in the queue past AUTHSVC_MAX_QUEUE_WAIT: the JSON 503, retry in a
    second."""

    headers = (("Retry-After", "1"),)


def waited_too_long(stamp: str | None, now: float, max_wait: float, since: float = 0.0) -> bool:
    """True when nginx's ``stamp`` (the X-Request-Start header), or ``since`` if later (when the app
    began to serve: a restart's wait is not the queue's), is more than ``max_wait`` seconds before
    ``now``. False for no stamp, a malformed one, or max_wait 0 (off)."""
    if not stamp or max_wait <= 0:
        return False
    match = _STAMP.fullmatch(stamp)
    return match is not None and now - max(float(match.group(1)), since) > max_wait
