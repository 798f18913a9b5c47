"""Keep request data out of gunicorn's error log (deploy/gunicorn.conf.py attaches this).

gunicorn writes parts of a request into its error log in a few places: a request
it cannot parse ("Invalid request from ip=...: Invalid HTTP request line: '<the
line>'"), an exception outside the app ("Error handling request GET /path?query").
The query string holds api_key and game_auth_token, so this filter replaces every
query string and every quoted value in those messages (and their tracebacks).
"""

from __future__ import annotations

import logging
import re

_QUERY = re.compile(r"\?[^\s'\"]*")
_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")
REDACTED = "<redacted>"


def redact(text: str) -> str:
    """``text`` with query strings and quoted values replaced by ``<redacted>``."""
    text = _QUOTED.sub(lambda m: m.group(0)[0] + REDACTED + m.group(0)[0], text)
    return _QUERY.sub("?" + REDACTED, text)


class RedactFilter(logging.Filter):
    """A logger filter: rewrites each record's message (and traceback text) through ``redact``."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format: keep only the template
            message = str(record.msg)
        record.msg, record.args = redact(message), ()
        if record.exc_info:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True
