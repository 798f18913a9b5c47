"""Hostile input: bodies built to cost the parser work, and values that once gave a 500.

The multipart bodies are the ones that made email.parser spend ~200 ms and ~100 ms
per request; the parser's work is compared by counting the Python and C function
calls a request makes (deterministic), not by timing it. The property test calls
the WSGI callable directly with environs no server would build, so it covers what
any WSGI server might pass through; tests/test_gunicorn.py sends the probe's
bodies and a bad chunk size through a real gunicorn.
"""

from __future__ import annotations

import io
import json
import sys

import pytest

from authsvc.app import make_app
from authsvc.authenticate import MISSING_DESCRIPTION
from authsvc.http import INVALID, parse_body
from tests.hostile_bodies import curl_form, many_parts, nested_multipart

PATH = "/api/authenticate.json"
ERROR_KEYS = {"success", "error", "error_description"}
MAX_PARTS = 8  # the cap docs/api.md documents


def environ_for(body: bytes, content_type: str, **extra) -> dict:
    environ = {
        "REQUEST_METHOD": "POST", "PATH_INFO": PATH, "QUERY_STRING": "", "SERVER_NAME": "localhost",
        "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body)), "CONTENT_TYPE": content_type,
    }
    environ.update(extra)
    return environ


def call(app, environ: dict) -> tuple[str, bytes]:
    """Call the WSGI app; its status line and body."""
    seen = []

    def start_response(status, headers, exc_info=None):
        seen.append(status)

    body = b"".join(app(environ, start_response))
    return seen[0], body


def calls_made(function) -> int:
    """How many Python and C functions ``function()`` calls: its work, independent of the machine's speed."""
    count = 0

    def profiler(frame, event, arg):
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profiler)
    try:
        function()
    finally:
        sys.setprofile(None)
    return count


@pytest.fixture
def wsgi_app(world):
    app = make_app(world.settings)
    yield app
    app.store.close()


# -- point: multipart parsing is linear and bounded -------------------------------------------


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_probe_multipart_bodies_get_a_400_for_bounded_work(wsgi_app, world):
    """The nested body and the many-parts body are refused with at most 5 times the work of a plain form (8 parts against 3)."""
    plain = curl_form(world.params())
    nested = nested_multipart(world.params())
    many = many_parts()
    assert call(wsgi_app, environ_for(*plain)) == ("200 OK", b'{"success":true,"user_id":4242,"username":"alice"}')
    status, body = call(wsgi_app, environ_for(*nested))
    assert status == "200 OK" and json.loads(body) == {"success": False, "error": 400,
                                                        "error_description": MISSING_DESCRIPTION}
    status, body = call(wsgi_app, environ_for(*many))
    assert status == "200 OK" and json.loads(body) == {
        "success": False, "error": 400, "error_description": f"Request body has more than {MAX_PARTS} multipart parts"}
    reference = calls_made(lambda: call(wsgi_app, environ_for(*plain)))
    for probe in (nested, many):
        work = calls_made(lambda probe=probe: call(wsgi_app, environ_for(*probe)))
        assert work <= 5 * reference, (work, reference)


def test_nested_multipart_is_never_parsed_and_the_field_counts_as_missing():
    body, content_type = nested_multipart({"user_id": "1"}, sub_parts=3)
    assert parse_body(body, content_type) == {"user_id": "1"}


def test_more_parts_than_the_cap_is_a_400_and_the_cap_itself_is_read():
    body, content_type = many_parts(MAX_PARTS)
    assert parse_body(body, content_type) == {"x": "1"}
    body, content_type = many_parts(MAX_PARTS + 1)
    with pytest.raises(Exception, match="more than 8 multipart parts"):
        parse_body(body, content_type)


@pytest.mark.parametrize("content_type", [
    "multipart/form-data",  # no boundary
    "multipart/form-data; boundary=",
    "multipart/form-data; boundary=" + "a" * 71,  # RFC 2046: at most 70
    'multipart/form-data; boundary="b',
])
def test_a_multipart_type_without_a_usable_boundary_is_400(content_type):
    with pytest.raises(Exception, match="not valid multipart/form-data"):
        parse_body(b"--b\r\n\r\n\r\n--b--\r\n", content_type)


@pytest.mark.parametrize("body", [
    b"no delimiter at all",
    b'--b\r\nContent-Disposition: form-data; name="a"\r\n\r\n1',  # no close delimiter
    b'--b\r\nContent-Disposition: form-data; name="a"\r\n',  # headers never end
    b"--bxyz\r\n\r\n\r\n--b--\r\n",  # the boundary is only a prefix of the line
])
def test_malformed_multipart_is_400(body):
    with pytest.raises(Exception, match="not valid multipart/form-data"):
        parse_body(body, "multipart/form-data; boundary=b")


def test_multipart_details_curl_and_browsers_use():
    """Preamble and epilogue ignored, quoted boundary, LF line ends, header names in any case,
    filename* marks a file, an encoded transfer is not decoded (no HTTP client sends one)."""
    body = (b"preamble\r\n--q b\r\ncontent-disposition: form-data; NAME=\"a\"\r\n\r\n1\r\n"
            b"--q b\nContent-Disposition: form-data; name=b\n\n2\n"
            b"--q b\r\nContent-Disposition: form-data; name=\"f\"; filename*=UTF-8''x.txt\r\n\r\nfile\r\n"
            b"--q b\r\nContent-Disposition: form-data; name=\"e\"\r\nContent-Transfer-Encoding: base64\r\n\r\nMQ==\r\n"
            b"--q b\r\nContent-Disposition: form-data; name=\"c\"\r\nContent-Transfer-Encoding: 8bit\r\n\r\n3\r\n"
            b"--q b--\r\nepilogue --q b\r\n")
    assert parse_body(body, 'multipart/form-data; boundary="q b"') == {"a": "1", "b": "2", "e": INVALID, "c": "3"}


def test_parts_past_the_per_part_caps_are_skipped_unread():
    """A Content-Disposition over 256 bytes or with more than 3 parameters, headers over 512 bytes: not a field."""
    def part(disposition: bytes, extra: bytes = b"") -> bytes:
        return b"--b\r\nContent-Disposition: " + disposition + b"\r\n" + extra + b"\r\n1\r\n"

    body = (part(b'form-data; name="a' + b"x" * 250 + b'"') + part(b"form-data; name=b; x=1; y=2; z=3")
            + part(b"form-data; name=c", b"X: " + b"y" * 500 + b"\r\n")
            + part(b'form-data; name="' + b"d" * 200 + b'"', b"X: " + b"y" * 200 + b"\r\n") + b"--b--\r\n")
    assert parse_body(body, "multipart/form-data; boundary=b") == {"d" * 200: "1"}
