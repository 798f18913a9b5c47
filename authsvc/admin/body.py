"""A request's JSON body, read once (docs/admin-api.md, "Errors").

- Framing: ``Content-Length``, or ``Transfer-Encoding: chunked`` (gunicorn hands the app the body
  dechunked), the game-facing endpoint's rule (authsvc/web/http.py). A body that cannot be read (cut
  short, broken framing, too slow) is 400: a write never runs on a body it did not read.
- Size: the route's cap, 413; a chunked body is read to the cap and one byte more, never further.
"""

from __future__ import annotations

import decimal
import json
import re

from authsvc.errors import BadRequest, Invalid, PayloadTooLarge, UnsupportedMediaType
from authsvc.web import http

NOT_JSON = "the body is not valid UTF-8 JSON"
_JSON_TYPE = re.compile(r"application/json *(;.*)?", re.IGNORECASE)


def read(environ: dict, cap: int) -> dict | None:
    """The JSON object body, None without one; 413 over ``cap``, 415 not JSON, 400 unreadable or not JSON."""
    raw = _raw(environ, cap)
    if not raw:
        return None
    if not _JSON_TYPE.fullmatch(environ.get("CONTENT_TYPE", "")):
        raise UnsupportedMediaType("a body must be JSON: Content-Type: application/json",
                                   headers=(("Accept", "application/json"),))
    try:
        obj = json.loads(raw.decode("utf-8"), parse_float=json_number)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadRequest(NOT_JSON) from None
    if not isinstance(obj, dict):
        raise Invalid("the body must be a JSON object", errors=[{"field": "", "detail": "must be a JSON object"}])
    return obj


def _raw(environ: dict, cap: int) -> bytes:
    """The body's bytes by the game-facing endpoint's framing rule (authsvc/web/http.py, one for both front
    doors), its refusals in the admin API's words."""
    try:
        return http.read_body(environ, cap)
    except PayloadTooLarge:
        raise PayloadTooLarge(f"a body here is at most {cap} bytes") from None
    except BadRequest as e:
        if "Content-Length" in e.detail:
            raise BadRequest("Content-Length must be a whole number") from None
        raise BadRequest("the body could not be read: cut short, or its chunked framing is broken") from None


def json_number(text: str) -> int | float:
    """A JSON number written with a fraction or exponent (``7.0``, ``7e0``): the whole number it names, read
    exactly, when it is one (JSON has one number type, and JSON Schema, the OpenAPI document's, calls
    it an integer); else a float. The exponent is bounded first, so ``1e999999999`` costs nothing."""
    number = decimal.Decimal(text)
    if abs(number.adjusted()) <= 20 and number == number.to_integral_value():
        return int(number)
    return float(text)
