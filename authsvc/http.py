"""Request parsing (query string, form, multipart and JSON bodies) and JSON responses.

Parsing works on plain strings and bytes so it can be tested without a server;
only ``read_body`` touches WSGI's input stream. A value that cannot be decoded
(bad percent-escape, invalid UTF-8, a JSON value that is neither string nor
integer) becomes ``INVALID``: present, but never equal to a real credential.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import re
import urllib.parse
from json.encoder import encode_basestring_ascii  # what json.dumps uses for a str with ensure_ascii

from authsvc.errors import BadRequest, PayloadTooLarge


class _Invalid:
    __slots__ = ()

    def __repr__(self) -> str:
        return "INVALID"


INVALID = _Invalid()

_UTF8_BOM = b"\xef\xbb\xbf"
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _decode(text: str) -> str | _Invalid:
    """Percent-decode one name or value; ``text`` is latin-1 text of raw bytes, as WSGI gives it."""
    if "%" not in text and "+" not in text and text.isascii():
        return text
    if _BAD_ESCAPE.search(text):
        return INVALID
    try:
        return urllib.parse.unquote_to_bytes(text.replace("+", " ").encode("latin-1")).decode("utf-8")
    except (UnicodeDecodeError, UnicodeEncodeError):
        return INVALID


def parse_urlencoded(text: str) -> dict[str, str | _Invalid]:
    """``a=1&b=2`` -> dict; the last of duplicate names wins; undecodable names are dropped."""
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
            name = _decode(name)
            if name is not INVALID:
                params[name] = _decode(value)
    return params


def _json_value(value: object) -> str | _Invalid:
    if value is None:
        return ""  # null counts as missing, like an empty string
    if type(value) is str:
        return value
    if type(value) is int:  # bool is a subclass of int, hence the exact type test
        return str(value)
    return INVALID


def parse_json_object(body: bytes) -> dict[str, str | _Invalid]:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise BadRequest("Request body is not a valid JSON object") from None
    if not isinstance(data, dict):
        raise BadRequest("Request body is not a valid JSON object")
    return {name: _json_value(value) for name, value in data.items()}


def parse_multipart(body: bytes, content_type: str) -> dict[str, str | _Invalid]:
    """multipart/form-data (PHP curl with an array of fields sends this); plain fields only."""
    head = b"Content-Type: " + content_type.encode("latin-1", "replace") + b"\r\n\r\n"
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise BadRequest("Request body is not valid multipart/form-data")
    params: dict[str, str | _Invalid] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not name or part.get_filename():
            continue
        payload = part.get_payload(decode=True) or b""
        try:
            params[name] = payload.decode("utf-8")
        except UnicodeDecodeError:
            params[name] = INVALID
    return params


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
        return parse_urlencoded(body.decode("latin-1").strip())
    return {}


def read_body(environ: dict, limit: int) -> bytes:
    """The request body, at most ``limit`` bytes (413 beyond), by Content-Length or until chunked input ends.

    Without Content-Length and Transfer-Encoding a request has no body (RFC 9112
    §6.3), so wsgi.input is not touched: a GET costs no read through the server.
    """
    length = environ.get("CONTENT_LENGTH")
    if length:
        if not length.isdigit():
            raise BadRequest("Invalid Content-Length")
        size = int(length)
        if size > limit:
            raise PayloadTooLarge()
        return environ["wsgi.input"].read(size) if size else b""
    encoding = environ.get("HTTP_TRANSFER_ENCODING")
    if encoding and (environ.get("wsgi.input_terminated") or encoding.lower() == "chunked"):
        body = environ["wsgi.input"].read(limit + 1)
        if len(body) > limit:
            raise PayloadTooLarge()
        return body
    return b""


def request_params(environ: dict, limit: int) -> dict[str, str | _Invalid]:
    """Query-string parameters, overridden by body parameters."""
    params = parse_urlencoded(environ.get("QUERY_STRING", ""))
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
    and an encoder per request (tests/test_http.py compares the two)."""
    return b'{"success":true,"user_id":%d,"username":%s}' % (user_id, encode_basestring_ascii(username).encode("ascii"))


def error_object(code: int, description: str) -> dict:
    return {"success": False, "error": code, "error_description": description}


def respond(start_response, status: int, body: bytes, *, head: bool, extra_headers=()) -> list[bytes]:
    """Send a complete response: always Content-Length, never chunked; HEAD gets headers only."""
    headers = [*BASE_HEADERS, ("Content-Length", str(len(body))), *extra_headers]
    start_response(_REASONS.get(status, f"{status} Error"), headers)
    return [] if head else [body]
