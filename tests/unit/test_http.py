"""Request parsing and responses, without a server; and a property: no input gives a 500."""

import io
import json
import re
import urllib.parse

import hypothesis.strategies as st
import pytest
import webtest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings

from authsvc.errors import BadRequest, PayloadTooLarge
from authsvc.web.http import (
    INVALID,
    json_bytes,
    parse_body,
    parse_urlencoded,
    read_body,
    success_bytes,
    unquote_to_bytes,
)


def test_urlencoded_last_duplicate_wins_and_plus_is_space():
    assert parse_urlencoded("a=1&b=x+y&a=2&&c") == {"a": "2", "b": "x y", "c": ""}


def test_urlencoded_decodes_utf8_and_marks_bad_values_invalid():
    params = parse_urlencoded("n=%C3%A9&bad=%C3&esc=%G1&raw=\xc3\xa9&rawbad=\xff&%ff=dropped")
    assert params["n"] == "é" and params["raw"] == "é"
    assert params["bad"] is INVALID and params["esc"] is INVALID and params["rawbad"] is INVALID
    assert "\ufffd" not in params and len(params) == 5


@pytest.mark.parametrize(
    "content_type, body, expected",
    [
        ("application/json", b'{"a": "1", "b": 2}', {"a": "1", "b": "2"}),
        ("application/json; charset=utf-8", b'{"a": null}', {"a": ""}),
        ("application/vnd.game+json", b'{"a": "1"}', {"a": "1"}),
        ("", b'  {"a": "1"}', {"a": "1"}),
        ("", b"a=1&b=2\r\n", {"a": "1", "b": "2"}),
        ("text/plain", b'{"a": "1"}', {"a": "1"}),
        ("application/x-www-form-urlencoded", b"a=%31", {"a": "1"}),
        ("application/x-www-form-urlencoded", b'{"a": "1"}', {"a": "1"}),
        ("application/octet-stream", b"a=1", {}),
    ],
)
def test_body_parsing_by_content_type(content_type, body, expected):
    assert parse_body(body, content_type) == expected


def test_json_values_of_other_types_are_invalid():
    params = parse_body(b'{"t": true, "f": 1.5, "l": [], "o": {}}', "application/json")
    assert all(v is INVALID for v in params.values())


def test_multipart_fields_are_read_and_files_ignored():
    body = (
        b'--XyZ\r\nContent-Disposition: form-data; name="a"\r\n\r\n1\r\n'
        b'--XyZ\r\nContent-Disposition: form-data; name="f"; filename="x.txt"\r\n\r\nfile\r\n'
        b'--XyZ\r\nContent-Disposition: form-data; name="b"\r\n\r\n\xff\r\n--XyZ--\r\n'
    )
    params = parse_body(body, "multipart/form-data; boundary=XyZ")
    assert params == {"a": "1", "b": INVALID}


def test_read_body_limits():
    def environ(body, **extra):
        return {"wsgi.input": io.BytesIO(body), **extra}

    assert read_body(environ(b"abc", CONTENT_LENGTH="3"), 3) == b"abc"
    assert read_body(environ(b"abc"), 3) == b""  # no length, not chunked: no body
    chunked = {"wsgi.input_terminated": True, "HTTP_TRANSFER_ENCODING": "chunked"}
    assert read_body(environ(b"abc", **chunked), 3) == b"abc"
    # Neither Content-Length nor Transfer-Encoding: no body, whatever the stream holds (RFC 9112
    # §6.3).
    assert read_body(environ(b"abc", **{"wsgi.input_terminated": True}), 3) == b""
    with pytest.raises(PayloadTooLarge):
        read_body(environ(b"abcd", CONTENT_LENGTH="4"), 3)
    with pytest.raises(PayloadTooLarge):
        read_body(environ(b"abcd", HTTP_TRANSFER_ENCODING="chunked"), 3)
    with pytest.raises(BadRequest):
        read_body(environ(b"", CONTENT_LENGTH="-1"), 3)


@given(st.dictionaries(st.text(), st.one_of(st.text(), st.integers(), st.booleans(), st.none())))
def test_json_bytes_is_compact_ascii_single_line_json(obj):
    data = json_bytes(obj)
    assert data.isascii() and b"\n" not in data
    assert data == json.dumps(obj, separators=(",", ":")).encode()  # compact: no space after , or :
    assert json.loads(data) == obj


@given(st.integers(1, 2**63 - 1), st.text())
def test_success_bytes_is_json_bytes_of_the_success_object(user_id, username):
    """The hand-formatted success answer equals the generic encoder's, for any username."""
    assert success_bytes(user_id, username) == json_bytes(
        {"success": True, "user_id": user_id, "username": username}
    )


@given(st.text(alphabet="ab019=&-._~*", max_size=60))
def test_plain_query_fast_path_agrees_with_the_decoding_path(text):
    """A query with nothing to decode takes a fast path; adding one escape forces the decoding
    path."""
    slow = parse_urlencoded(text + "&%2C=x")  # "," is not in the alphabet: no clash
    assert slow.pop(",") == "x"
    assert parse_urlencoded(text) == slow


@hsettings(max_examples=500)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=4),
            st.sampled_from(
                [
                    b"%",
                    b"=",
                    b"%3D",
                    b"%c3%A9",
                    b"=3D",
                    b"\r\n",
                    b" \n",
                    b"\t",
                    b"_",
                    b"%0a",
                    b"%00",
                ]
            ),
        ),
        max_size=20,
    )
)
def test_unquote_to_bytes_agrees_with_urllib(pieces):
    """The C path (binascii's quoted-printable decoder) decodes exactly as urllib does."""
    raw = b"".join(pieces)
    if re.search(rb"%(?![0-9A-Fa-f]{2})", raw):  # _decode never passes a broken escape
        raw = raw.replace(b"%", b"%25")
    assert unquote_to_bytes(raw) == urllib.parse.unquote_to_bytes(raw)


# -- no input makes the app fail ----------------------------------------------------------------

query_bytes = st.binary(max_size=300).map(lambda b: b.decode("latin-1"))
field_names = st.sampled_from(["user_id", "game_auth_token", "api_key", "x"])
query_text = st.lists(st.tuples(field_names, st.text(max_size=70)), max_size=6).map(
    lambda pairs: "&".join(f"{k}={v}" for k, v in pairs)
)


@hsettings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    query=st.one_of(query_bytes, query_text),
    body=st.binary(max_size=200),
    content_type=st.sampled_from(
        [
            "",
            "application/json",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=b",
            "multipart/form-data",
            "text/plain",
        ]
    ),
    method=st.sampled_from(["GET", "POST", "HEAD"]),
)
def test_any_request_gets_a_documented_json_answer(app, query, body, content_type, method):
    request = webtest.TestRequest.blank("/api/authenticate.json", method=method)
    request.environ["QUERY_STRING"] = query
    request.body = body
    if content_type:
        request.environ["CONTENT_TYPE"] = content_type
    response = app.do_request(request, expect_errors=True)
    assert response.status_int == 200
    if method != "HEAD":
        answer = response.json
        assert answer["success"] is False and answer["error"] in (400, 403)
        assert set(answer) == {"success", "error", "error_description"}
