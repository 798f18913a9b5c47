"""Request parsing (query string, form, multipart and JSON bodies) and JSON responses.

Parsing works on plain strings and bytes so it can be tested without a server;
only ``read_body`` touches WSGI's input stream. A value that cannot be decoded
(bad percent-escape, invalid UTF-8, a lone surrogate, a JSON value that is
neither string nor integer) becomes ``INVALID``: present, but never equal to a
real credential.

All of it runs before any credential is checked, so every parser's work is
linear in its input and capped (parameters, parts, lengths): the costliest body
of 16 KiB costs a few times a plain form (docs/api.md; BENCHMARKS.md section 6).
"""

from __future__ import annotations

import binascii
import json
import re
from json.encoder import encode_basestring_ascii  # what json.dumps uses for a str with ensure_ascii

from authsvc.errors import BadRequest, PayloadTooLarge


class _Invalid:
    __slots__ = ()

    def __repr__(self) -> str:
        return "INVALID"


INVALID = _Invalid()
# A parameter's value as parsed: its text, or INVALID when present but undecodable.
Param = str | _Invalid

_UTF8_BOM = b"\xef\xbb\xbf"
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
# The longest name and value that can still be a parameter of the endpoint with
# every character percent-encoded: "game_auth_token" (15 x 3) and a token (64 x 3).
# Longer ones are not decoded at all (docs/api.md), which bounds the decoding work.
MAX_ENCODED_NAME = 48
MAX_ENCODED_VALUE = 200


def _decode(text: str, longest: int) -> str | _Invalid:
    """Percent-decode one name or value; ``text`` is latin-1 text of raw bytes, as WSGI gives it.

    Text that needs decoding and is longer than ``longest`` is INVALID: it cannot be
    any of the endpoint's parameters, so decoding it would be work for nothing.
    """
    if "%" not in text and "+" not in text and text.isascii():
        return text
    if len(text) > longest or _BAD_ESCAPE.search(text):
        return INVALID
    try:
        return unquote_to_bytes(text.replace("+", " ").encode("latin-1")).decode("utf-8")
    except (UnicodeDecodeError, UnicodeEncodeError):
        return INVALID


def unquote_to_bytes(raw: bytes) -> bytes:
    """urllib.parse.unquote_to_bytes for bytes whose every '%' starts a valid escape, in C.

    urllib's loops in Python over each '%' (16 KiB of escapes: ~0.7 ms in
    `scripts/bench --only bodies` of 2026-11-23; this: BENCHMARKS.md section 6).
    Quoted-printable writes a byte as "=XX" where we have "%XX", so with
    each '=' first written as "=3D", binascii's decoder does the same work in C;
    every '=' is then followed by two hex digits, so none is a soft line break.
    tests/unit/test_http.py checks it against urllib's for arbitrary input.
    """
    return binascii.a2b_qp(raw.replace(b"=", b"=3D").replace(b"%", b"="))


def parse_urlencoded(text: str) -> dict[str, str | _Invalid]:
    """``a=1&b=2`` -> dict; the last of duplicate names wins; undecodable names are dropped.

    Names over MAX_ENCODED_NAME and values over MAX_ENCODED_VALUE characters that
    need decoding count as undecodable.
    """
    params: dict[str, str | _Invalid] = {}
    if text.isascii() and "%" not in text and "+" not in text:
        # Nothing to decode (what game servers send): skip _decode for each name and value.
        for pair in text.split("&"):
            if pair:
                name, _, value = pair.partition("=")
                params[name] = value
        return params
    for pair in text.split("&"):
        if pair:
            name, _, value = pair.partition("=")
            decoded = _decode(name, MAX_ENCODED_NAME)
            if not isinstance(decoded, _Invalid):
                params[decoded] = _decode(value, MAX_ENCODED_VALUE)
    return params


# The endpoint reads three parameters. More than MAX_PARAMS in the query string or
# in a form or JSON body is a 400 before any is decoded: a 16 KiB body of 8,000
# parameters cost ~60 times a plain form without the cap (`scripts/bench --only bodies`,
# 2026-11-23; with it: BENCHMARKS.md section 6; docs/api.md).
MAX_PARAMS = 16
_TOO_MANY_PARAMS = f"Request has more than {MAX_PARAMS} parameters"
MAX_JSON_CONTAINERS = 16  # arrays and objects in a JSON body, '[' and '{' counted
_NOT_JSON_OBJECT = "Request body is not a valid JSON object"


def check_param_count(separators: int) -> None:
    """``separators`` '&' (or JSON commas) mean up to one parameter more: refuse more than
    MAX_PARAMS."""
    if separators >= MAX_PARAMS:
        raise BadRequest(_TOO_MANY_PARAMS)


def _json_value(value: object) -> str | _Invalid:
    if value is None:
        return ""  # null counts as missing, like an empty string
    if type(value) is str:
        if not value.isascii():
            try:
                value.encode("utf-8")
            except (
                UnicodeEncodeError
            ):  # a lone surrogate ("\ud800"): JSON allows it, UTF-8 does not
                return INVALID
        return value
    if type(value) is int:  # bool is a subclass of int, hence the exact type test
        return str(value)
    return INVALID


def parse_json_object(body: bytes) -> dict[str, str | _Invalid]:
    # Counted in C before json.loads starts, these bound its work: each member past
    # the first needs a comma, each level of nesting a '[' or '{' (16 KiB of '['
    # cost ~10 x a plain form in json's recursion). Those inside strings count too;
    # the three fields need two commas and one '{'.
    check_param_count(body.count(b","))
    if body.count(b"[") + body.count(b"{") > MAX_JSON_CONTAINERS:
        raise BadRequest(_NOT_JSON_OBJECT)
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise BadRequest(_NOT_JSON_OBJECT) from None
    if not isinstance(data, dict):
        raise BadRequest(_NOT_JSON_OBJECT)
    return {name: _json_value(value) for name, value in data.items()}


# -- multipart/form-data ----------------------------------------------------------------
# Read by hand, not by email.parser: its work grows with the number of parts and
# of nested multiparts (a 13 KB body of 1,900 nested empty parts cost ~200 ms).
# Here every step is a bytes.find or a regex that moves forward, the parts are
# capped, and a part is never parsed beyond its headers (docs/api.md).

MAX_PARTS = (
    8  # the endpoint reads three fields; the cost of the worst body grows with it (BENCHMARKS.md)
)
_NOT_MULTIPART = "Request body is not valid multipart/form-data"
_TOO_MANY_PARTS = f"Request body has more than {MAX_PARTS} multipart parts"
# RFC 2046 §5.1.1: 1 to 70 characters, not ending in a space. Any printable ASCII
# is accepted, not only the RFC's bchars: WebTest, for one, puts "$" in its boundaries.
_BOUNDARY_PARAM = re.compile(r';[ \t]*boundary[ \t]*=[ \t]*(?:"([^"]*)"|([^;]*))', re.I)
_BOUNDARY = re.compile(r"[ -~]{0,69}[!-~]")
# Searched in the lower-cased Content-Disposition, so without re.I. A quoted name
# ends at the next '"': browsers write a '"' in a name as %22 (WHATWG's
# multipart/form-data encoding), so there is no backslash escape to undo.
_NAME_PARAM = re.compile(rb';[ \t]*name[ \t]*=[ \t]*(?:"([^"]*)"|([^;]*))')
_FILENAME_PARAM = re.compile(rb";[ \t]*filename\*?[ \t]*=")
# A field's Content-Disposition is short: 'form-data; name="..."' (a file adds
# filename and filename*, and is skipped anyway). A longer one, or one with more
# parameters, is skipped unread, which bounds the regex work per part.
MAX_DISPOSITION = 256  # bytes
MAX_DISPOSITION_PARAMS = 3
MAX_PART_HEADERS = 512  # bytes: a field's headers are Content-Disposition and perhaps Content-Type
_PLAIN_ENCODINGS = (b"", b"7bit", b"8bit", b"binary")


def _multipart_boundary(content_type: str) -> bytes:
    match = _BOUNDARY_PARAM.search(content_type)
    if match is None:
        raise BadRequest(_NOT_MULTIPART)
    boundary = match.group(1) if match.group(1) is not None else match.group(2).strip()
    if not _BOUNDARY.fullmatch(boundary):
        raise BadRequest(_NOT_MULTIPART)
    return boundary.encode("ascii")


def _header(head: bytes, lowered: bytes, name: bytes) -> bytes | None:
    """The value of the first header ``name`` (lower case, colon included) in a part's header block.

    ``head`` starts with a line break, so every header line starts after one;
    ``lowered`` is ``head.lower()``, searched because header names ignore case.
    """
    start = lowered.find(b"\n" + name)
    if start < 0:
        return None
    start += 1 + len(name)
    end = head.find(b"\n", start)
    return head[start : end if end >= 0 else len(head)].strip()


def _read_part(part: bytes, params: dict[str, str | _Invalid]) -> None:
    """One part: a name from Content-Disposition and a UTF-8 value; files and nested multipart
    skipped."""
    if part[:1] == b"\n" or part[:2] == b"\r\n":
        return  # no headers, so no name
    cut = part.find(b"\n\r\n", 0, MAX_PART_HEADERS)
    bare = part.find(
        b"\n\n", 0, MAX_PART_HEADERS if cut < 0 else cut
    )  # a bare LF blank line before it
    cut = bare if bare >= 0 else cut
    if cut < 0:
        return  # headers longer than a field's (or never ended): skipped unread
    head = b"\n" + part[:cut]
    lowered = head.lower()
    disposition = _header(head, lowered, b"content-disposition:")
    if (
        disposition is None
        or len(disposition) > MAX_DISPOSITION
        or disposition.count(b";") > MAX_DISPOSITION_PARAMS
    ):
        return
    folded = disposition.lower()  # the same length: offsets found in it hold in disposition
    match = _NAME_PARAM.search(folded)
    if match is None or _FILENAME_PARAM.search(folded):
        return
    group = 1 if match.start(1) >= 0 else 2
    try:
        name = disposition[match.start(group) : match.end(group)].strip().decode("utf-8")
    except UnicodeDecodeError:
        return  # an undecodable name is dropped, as in a query string
    content_type = _header(head, lowered, b"content-type:")
    if not name or (content_type is not None and content_type.lower().startswith(b"multipart/")):
        return  # nested multipart: never parsed
    encoding = _header(head, lowered, b"content-transfer-encoding:")
    if encoding is not None and encoding.lower() not in _PLAIN_ENCODINGS:
        params[name] = (
            INVALID  # base64, quoted-printable: no HTTP client sends them (RFC 7578 §4.7)
        )
        return
    content = part[cut + (3 if part[cut + 1 : cut + 2] == b"\r" else 2) :]
    try:
        params[name] = content.decode("utf-8")
    except UnicodeDecodeError:
        params[name] = INVALID


def parse_multipart(body: bytes, content_type: str) -> dict[str, str | _Invalid]:
    """multipart/form-data (curl -F, PHP curl with an array of fields): plain fields only, at most
    MAX_PARTS parts.

    Each delimiter line ("--" boundary, optional blanks, a line break) starts a
    part, which runs to the line break before the next delimiter; "--" boundary
    "--" ends the body (RFC 2046 §5.1.1). The preamble and epilogue are ignored.
    """
    delimiter = b"--" + _multipart_boundary(content_type)
    separator = b"\n" + delimiter
    if body.startswith(delimiter):
        start = len(delimiter)
    else:
        start = body.find(separator)
        if start < 0:
            raise BadRequest(_NOT_MULTIPART)
        start += len(separator)
    params: dict[str, str | _Invalid] = {}
    for _ in range(MAX_PARTS):
        if body.startswith(b"--", start):
            return params  # the close delimiter
        line_end = body.find(b"\n", start)
        if line_end < 0 or body[start:line_end].strip(b" \t\r"):
            raise BadRequest(
                _NOT_MULTIPART
            )  # truncated, or the boundary is only a prefix of the line
        end = body.find(separator, line_end)
        if end < 0:
            raise BadRequest(_NOT_MULTIPART)  # no close delimiter
        _read_part(
            body[line_end + 1 : end - 1 if body[end - 1] == 13 else end], params
        )  # 13: the CR of CRLF
        start = end + len(separator)
    if body.startswith(b"--", start):
        return params
    raise BadRequest(_TOO_MANY_PARTS)


def parse_body(body: bytes, content_type: str) -> dict[str, str | _Invalid]:
    """Parameters from a body.

    JSON by Content-Type; multipart by Content-Type; otherwise a body that starts
    with '{' is JSON whatever form type it claims (``curl -d '{...}'`` and PHP
    curl label JSON as a form), and a form, text/plain or untyped body is
    urlencoded. Other types carry no parameters. A UTF-8 byte-order mark before
    the '{' (Windows tools write one) does not hide it; json.loads skips it.
    """
    media_type = content_type.partition(";")[0].strip().lower()
    if media_type == "application/json" or media_type.endswith("+json"):
        return parse_json_object(body)
    if media_type == "multipart/form-data":
        return parse_multipart(body, content_type)
    if media_type in ("", "text/plain", "application/x-www-form-urlencoded"):
        if body.removeprefix(_UTF8_BOM).lstrip()[:1] == b"{":
            return parse_json_object(body)
        check_param_count(body.count(b"&"))
        return parse_urlencoded(body.decode("latin-1").strip())
    return {}


def read_body(environ: dict, limit: int) -> bytes:
    """The request body, at most ``limit`` bytes (413 beyond), by Content-Length or until chunked
    input ends.

    Without Content-Length and Transfer-Encoding a request has no body (RFC 9112
    §6.3), so wsgi.input is not touched: a GET costs no read through the server.
    """
    length = environ.get("CONTENT_LENGTH")
    if length:
        if not (
            length.isascii() and length.isdigit()
        ):  # "²".isdigit() is True, and int() refuses it
            raise BadRequest("Invalid Content-Length")
        if len(length) > 18:  # more than any limit; and int() refuses more than 4,300 digits
            raise PayloadTooLarge()
        size = int(length)
        if size > limit:
            raise PayloadTooLarge()
        return _read(environ, size) if size else b""
    encoding = environ.get("HTTP_TRANSFER_ENCODING")
    if encoding and (environ.get("wsgi.input_terminated") or encoding.lower() == "chunked"):
        body = _read(environ, limit + 1)
        if len(body) > limit:
            raise PayloadTooLarge()
        return body
    return b""


def _read(environ: dict, size: int) -> bytes:
    """Read the body from the server; any failure is the client's broken body, a 400.

    The broad except is deliberate and limited to this one call: each server's
    reader raises its own types (gunicorn: InvalidChunkSize, ChunkMissingTerminator,
    NoMoreData; others OSError or ValueError), none of them a bug of ours, and a
    500 with a traceback per request would let any client fill the log.
    """
    try:
        return environ["wsgi.input"].read(size)
    except Exception:
        raise BadRequest("Request body could not be read") from None


def request_params(environ: dict, limit: int) -> dict[str, str | _Invalid]:
    """Query-string parameters, overridden by body parameters."""
    query = environ.get("QUERY_STRING", "")
    check_param_count(query.count("&"))
    params = parse_urlencoded(query)
    body = read_body(environ, limit)
    if body:
        params.update(parse_body(body, environ.get("CONTENT_TYPE", "")))
    return params


# -- responses ------------------------------------------------------------------------

BASE_HEADERS = (
    ("Content-Type", "application/json; charset=utf-8"),
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
)

_REASONS = {
    200: "200 OK",
    400: "400 Bad Request",
    403: "403 Forbidden",
    404: "404 Not Found",
    405: "405 Method Not Allowed",
    413: "413 Payload Too Large",
    500: "500 Internal Server Error",
    503: "503 Service Unavailable",
}


def json_bytes(obj: dict) -> bytes:
    """Compact, single-line, ASCII-only JSON (non-ASCII as \\u escapes)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def success_bytes(user_id: int, username: str) -> bytes:
    """The success answer, byte for byte what ``json_bytes`` makes of it, without building a dict
    and an encoder per request (tests/unit/test_http.py compares the two)."""
    return b'{"success":true,"user_id":%d,"username":%s}' % (
        user_id,
        encode_basestring_ascii(username).encode("ascii"),
    )


def respond(
    start_response, status: int, body: bytes, *, head: bool, extra_headers=()
) -> list[bytes]:
    """Send a complete response: always Content-Length, never chunked; HEAD gets headers only."""
    headers = [*BASE_HEADERS, ("Content-Length", str(len(body))), *extra_headers]
    start_response(_REASONS.get(status, f"{status} Error"), headers)
    return [] if head else [body]
