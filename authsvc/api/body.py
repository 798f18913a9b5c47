"""A request's JSON body, read once and bounded before it is parsed (docs/admin-api.md, "Request
bodies").

- Framing: ``Content-Length``, or ``Transfer-Encoding: chunked`` (gunicorn hands the app the body
  dechunked), the game-facing endpoint's rule (authsvc/web/http.py). A body that cannot be read (cut
  short, broken framing, too slow: nginx's admin site times it out first) is 400: a write never runs
  on a body it did not read.
- Size: the route's cap, 413; a chunked body is read to the cap and one byte more, never further.
- Shape, on the raw bytes before parsing: nested at most ``MAX_DEPTH`` deep (400), at most
  ``MAX_VALUES`` JSON values (413). The parser and the body's hashing (Idempotency-Key, a batch's
  sealed_body_sha256) are recursive, and a body of a million tiny values costs a second to parse and
  hash: these bounds make the costliest body a caller may send cost tens of milliseconds.

The shape is counted with bytes methods (C loops, no Python step per byte): strings removed
first, then commas and brackets counted; it costs a few milliseconds for 4 MiB.
"""

from __future__ import annotations

import decimal
import itertools
import json
import operator
import re

from authsvc.errors import BadRequest, Invalid, PayloadTooLarge, UnsupportedMediaType
from authsvc.web import http

MAX_DEPTH = 32  # a batch is 3 deep
MAX_VALUES = 20_000  # a batch of 1,000 players with up to 19 fields each
NOT_JSON = "the body is not valid UTF-8 JSON"
_JSON_TYPE = re.compile(r"application/json *(;.*)?", re.IGNORECASE)
_STRING = re.compile(rb'"[^"]*"')  # once escaped backslashes and quotes are gone
_BRACKETS = bytes.maketrans(b"[]{}", b"\x02\x00\x02\x00")  # an opening bracket 2, a closing one 0
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def declared(environ: dict) -> int | None:
    """The body's length as the request states it (0 for none, or for a length that is not one:
    reading refuses it), None for a chunked body, whose length is known only once read."""
    length = environ.get("CONTENT_LENGTH") or ""
    if length:
        return int(length) if length.isascii() and length.isdigit() and len(length) <= 18 else 0
    return None if environ.get("HTTP_TRANSFER_ENCODING") else 0


def read_raw(environ: dict, cap: int) -> bytes:
    """The body's bytes by the game-facing endpoint's framing rule (authsvc/web/http.py, one for
    both front doors), its refusals in the admin API's words: 413 over ``cap``, 400 unreadable."""
    try:
        return http.read_body(environ, cap)
    except PayloadTooLarge:
        raise PayloadTooLarge(f"a body here is at most {cap} bytes") from None
    except BadRequest as e:
        if "Content-Length" in e.detail:
            raise BadRequest("Content-Length must be a whole number") from None
        raise BadRequest(
            "the body could not be read: cut short, too slow, or its chunked framing is broken"
        ) from None


def parse(raw: bytes, environ: dict) -> dict | None:
    """The JSON object ``raw`` holds, None for no body; 415 not JSON, 413 over MAX_VALUES, 400
    nested deeper than MAX_DEPTH or not JSON, 422 not an object."""
    if not raw:
        return None
    if not _JSON_TYPE.fullmatch(environ.get("CONTENT_TYPE", "")):
        raise UnsupportedMediaType(
            "a body must be JSON: Content-Type: application/json",
            headers=(("Accept", "application/json"),),
        )
    check_shape(raw)
    try:
        obj = json.loads(raw.decode("utf-8"), parse_float=json_number)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise BadRequest(NOT_JSON) from None
    if not isinstance(obj, dict):
        raise Invalid(
            "the body must be a JSON object",
            errors=[{"field": "", "detail": "must be a JSON object"}],
        )
    return obj


def check_shape(raw: bytes) -> None:
    """413 for more than MAX_VALUES values, 400 for nesting deeper than MAX_DEPTH, or brackets that
    do not pair (no JSON); any other body that is not JSON passes, for the parser to refuse. Each
    step is a bytes method, and the bracket walk is at most 2 x MAX_VALUES long."""
    bare = raw
    if b'"' in bare:  # commas and brackets inside strings do not count: strings go first
        if b"\\" in bare:
            bare = bare.replace(b"\\\\", b"").replace(
                b'\\"', b""
            )  # no quote is left inside a string
        if (
            bare.count(b'"') > 4 * MAX_VALUES
        ):  # keys and values: more strings than that many values hold
            raise _too_many()
        bare = _STRING.sub(b"", bare)
    if _values(bare) > MAX_VALUES:
        raise _too_many()
    if bare.count(b"]") + bare.count(b"}") != bare.count(b"[") + bare.count(b"{"):
        raise BadRequest(NOT_JSON)
    # The depth after each bracket: 2 for each opening one so far (0 for a closing one), minus their
    # count.
    steps = bare.translate(_BRACKETS, _NOT_BRACKETS)
    if (
        max(map(operator.sub, itertools.accumulate(steps), itertools.count(1)), default=0)
        > MAX_DEPTH
    ):
        raise BadRequest(f"the body is nested deeper than {MAX_DEPTH}")


def _values(text: bytes) -> int:
    """At least the JSON values ``text`` holds, if it is JSON: one, then one more after each comma
    and in each array or object."""
    return text.count(b",") + text.count(b"[") + text.count(b"{") + 1


def _too_many() -> PayloadTooLarge:
    return PayloadTooLarge(f"a body here holds at most {MAX_VALUES:,} JSON values")


def json_number(text: str) -> int | float:
    """A JSON number written with a fraction or exponent (``7.0``, ``7e0``): the whole number it
    names, read exactly, when it is one (JSON has one number type, and JSON Schema, the OpenAPI
    document's, calls it an integer); else a float. The exponent is bounded first, so
    ``1e999999999`` costs nothing."""
    number = decimal.Decimal(text)
    if abs(number.adjusted()) <= 20 and number == number.to_integral_value():
        return int(number)
    return float(text)
