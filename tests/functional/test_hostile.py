"""Hostile input: bodies built to cost the parsers work, and values that once gave a 500.

The bodies are harness/hostile_bodies.py's: the probe's multipart ones (email.parser
spent ~200 ms and ~100 ms on them) and the costliest found since for multipart,
form and JSON. Their work is compared by counting the Python and C function
calls a request makes (deterministic), not by timing it (BENCHMARKS.md section 6
times them). The property test calls
the WSGI callable directly with environs no server would build, so it covers what
any WSGI server might pass through; tests/integration/test_gunicorn.py sends the probe's
bodies and a bad chunk size through a real gunicorn.
"""

from __future__ import annotations

import io
import json
import sys

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings

from authsvc.tokens import api_key_digest
from authsvc.web.app import make_app
from authsvc.web.http import INVALID, parse_body, parse_json_object
from harness.hostile_bodies import curl_form, many_parts, nested_multipart, worst_bodies
from tests.support import INVALID as INVALID_ANSWER
from tests.support import MISSING_TEXT

PATH = "/api/authenticate.json"
ERROR_KEYS = {"success", "error", "error_description"}
MAX_PARTS = 8  # the cap docs/api.md documents


def environ_for(body: bytes, content_type: str, **extra) -> dict:
    environ = {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": PATH,
        "QUERY_STRING": "",
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "CONTENT_LENGTH": str(len(body)),
        "CONTENT_TYPE": content_type,
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
    """How many Python and C functions ``function()`` calls: its work, independent of the machine's
    speed."""
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


# -- the parsers' work is linear and bounded -------------------------------------------


@pytest.mark.engine("sqlite")
def test_probe_multipart_bodies_get_a_400_for_bounded_work(wsgi_app, world):
    """The nested body and the many-parts body are refused with at most 5 times the work of a plain
    form (8 parts against 3)."""
    plain = curl_form(world.params())
    nested = nested_multipart(world.params())
    many = many_parts()
    assert call(wsgi_app, environ_for(*plain)) == (
        "200 OK",
        b'{"success":true,"user_id":4242,"username":"alice"}',
    )
    status, body = call(wsgi_app, environ_for(*nested))
    assert status == "200 OK" and json.loads(body) == {
        "success": False,
        "error": 400,
        "error_description": MISSING_TEXT,
    }
    status, body = call(wsgi_app, environ_for(*many))
    assert status == "200 OK" and json.loads(body) == {
        "success": False,
        "error": 400,
        "error_description": f"Request body has more than {MAX_PARTS} multipart parts",
    }
    reference = calls_made(lambda: call(wsgi_app, environ_for(*plain)))
    for probe in (nested, many):
        work = calls_made(lambda probe=probe: call(wsgi_app, environ_for(*probe)))
        assert work <= 5 * reference, (work, reference)


def test_probe_multipart_bodies_through_webtest(app, world):
    """The same two bodies through WebTest with its WSGI lint on, on both stores."""

    def post(body: bytes, content_type: str) -> dict:
        response = app.request(
            PATH, method="POST", body=body, headers={"Content-Type": content_type}
        )
        assert response.request.content_type == content_type.partition(";")[0]  # sent as built
        return response.json

    assert post(*nested_multipart(world.params())) == {
        "success": False,
        "error": 400,
        "error_description": MISSING_TEXT,
    }
    assert post(*many_parts()) == {
        "success": False,
        "error": 400,
        "error_description": f"Request body has more than {MAX_PARTS} multipart parts",
    }


@pytest.mark.engine("sqlite")
def test_every_costly_body_gets_a_400_for_bounded_work(wsgi_app, world):
    """Each body of harness/hostile_bodies.py (multipart, form, JSON): a 400, and at most 3 times
    the function calls of a form curl -F sends (BENCHMARKS.md section 6 has their timings)."""
    reference = calls_made(lambda: call(wsgi_app, environ_for(*curl_form(world.params()))))
    for label, body, content_type in worst_bodies(world.params()):
        status, answer = call(wsgi_app, environ_for(body, content_type))
        assert status == "200 OK" and json.loads(answer)["error"] == 400, label
        work = calls_made(lambda: call(wsgi_app, environ_for(body, content_type)))  # noqa: B023
        assert work <= 3 * reference, (label, work, reference)


@pytest.mark.engine("sqlite")
def test_more_than_16_parameters_is_a_400_in_the_query_a_form_or_json(app, world):
    too_many = {
        "success": False,
        "error": 400,
        "error_description": "Request has more than 16 parameters",
    }
    params = world.params()
    fields = "&".join(f"{k}={v}" for k, v in params.items())
    extra = {f"x{i}": "1" for i in range(13)}  # 3 + 13 = 16: still read
    assert app.get(PATH, dict(params, **extra)).json["success"] is True
    assert app.post(PATH, dict(params, **extra)).json["success"] is True
    assert app.post_json(PATH, dict(params, **extra)).json["success"] is True
    assert app.get(f"{PATH}?{fields}" + "&" * 14).json == too_many
    assert (
        app.post(PATH, fields + "&x=1" * 14, content_type="application/x-www-form-urlencoded").json
        == too_many
    )
    assert app.post_json(PATH, dict(params, **extra, x13="1")).json == too_many
    assert (
        app.post(PATH, '{"a": "' + "," * 16 + '"}', content_type="application/json").json
        == too_many
    )


def test_json_with_more_than_16_arrays_and_objects_is_not_parsed():
    assert parse_json_object(b'{"a": [[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]}') == {
        "a": INVALID
    }  # 16 containers
    with pytest.raises(Exception, match="not a valid JSON object"):
        parse_json_object(b'{"a": [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]}')  # 17
    with pytest.raises(Exception, match="not a valid JSON object"):
        parse_json_object(
            b'{"a": "' + b"{" * 16 + b'"}'
        )  # inside a string too: counted, not parsed


def test_names_and_values_too_long_to_be_a_parameter_are_not_decoded():
    """Fully percent-encoded, a token is 192 characters and game_auth_token 45: over 200 and 48,
    never one of them."""
    token = "%61" * 64
    params = parse_body(
        f"t={token}&l={token}{'%61' * 3}&{'%61' * 16}=n&{'%61' * 17}=x&plain={'a' * 300}".encode(),
        "",
    )
    assert params == {"t": "a" * 64, "l": INVALID, "a" * 16: "n", "plain": "a" * 300}


def test_nested_multipart_is_never_parsed_and_the_field_counts_as_missing():
    body, content_type = nested_multipart({"user_id": "1"}, sub_parts=3)
    assert parse_body(body, content_type) == {"user_id": "1"}


def test_more_parts_than_the_cap_is_a_400_and_the_cap_itself_is_read():
    body, content_type = many_parts(MAX_PARTS)
    assert parse_body(body, content_type) == {"x": "1"}
    body, content_type = many_parts(MAX_PARTS + 1)
    with pytest.raises(Exception, match="more than 8 multipart parts"):
        parse_body(body, content_type)


@pytest.mark.parametrize(
    "content_type",
    [
        "multipart/form-data",  # no boundary
        "multipart/form-data; boundary=",
        "multipart/form-data; boundary=" + "a" * 71,  # RFC 2046: at most 70
        'multipart/form-data; boundary="b',
    ],
)
def test_a_multipart_type_without_a_usable_boundary_is_400(content_type):
    with pytest.raises(Exception, match="not valid multipart/form-data"):
        parse_body(b"--b\r\n\r\n\r\n--b--\r\n", content_type)


@pytest.mark.parametrize(
    "body",
    [
        b"no delimiter at all",
        b'--b\r\nContent-Disposition: form-data; name="a"\r\n\r\n1',  # no close delimiter
        b'--b\r\nContent-Disposition: form-data; name="a"\r\n',  # headers never end
        b"--bxyz\r\n\r\n\r\n--b--\r\n",  # the boundary is only a prefix of the line
    ],
)
def test_malformed_multipart_is_400(body):
    with pytest.raises(Exception, match="not valid multipart/form-data"):
        parse_body(body, "multipart/form-data; boundary=b")


def test_multipart_details_curl_and_browsers_use():
    """Preamble and epilogue ignored, quoted boundary, LF line ends, header names in any case,
    filename* marks a file, an encoded transfer is not decoded (no HTTP client sends one)."""
    body = (
        b'preamble\r\n--q b\r\ncontent-disposition: form-data; NAME="a"\r\n\r\n1\r\n'
        b"--q b\nContent-Disposition: form-data; name=b\n\n2\n"
        b'--q b\r\nContent-Disposition: form-data; name="f"; '
        b"filename*=UTF-8''x.txt\r\n\r\nfile\r\n"
        b'--q b\r\nContent-Disposition: form-data; name="e"\r\nContent-Transfer-Encoding: '
        b"base64\r\n\r\nMQ==\r\n"
        b'--q b\r\nContent-Disposition: form-data; name="c"\r\nContent-Transfer-Encoding: '
        b"8bit\r\n\r\n3\r\n--q b--\r\nepilogue --q b\r\n"
    )
    assert parse_body(body, 'multipart/form-data; boundary="q b"') == {
        "a": "1",
        "b": "2",
        "e": INVALID,
        "c": "3",
    }


def test_parts_past_the_per_part_caps_are_skipped_unread():
    """A Content-Disposition over 256 bytes or with more than 3 parameters, headers over 512 bytes:
    not a field."""

    def part(disposition: bytes, extra: bytes = b"") -> bytes:
        return b"--b\r\nContent-Disposition: " + disposition + b"\r\n" + extra + b"\r\n1\r\n"

    body = (
        part(b'form-data; name="a' + b"x" * 250 + b'"')
        + part(b"form-data; name=b; x=1; y=2; z=3")
        + part(b"form-data; name=c", b"X: " + b"y" * 500 + b"\r\n")
        + part(b'form-data; name="' + b"d" * 200 + b'"', b"X: " + b"y" * 200 + b"\r\n")
        + b"--b--\r\n"
    )
    assert parse_body(body, "multipart/form-data; boundary=b") == {"d" * 200: "1"}


# -- values that once gave a 500 ------------------------------------------------------


@pytest.mark.parametrize("field", ["api_key", "game_auth_token", "user_id"])
def test_json_value_with_a_lone_surrogate_is_invalid_credentials(app, world, field):
    body = json.dumps(dict(world.params(), **{field: "x\ud800"}))  # json.dumps writes it as \ud800
    r = app.post(PATH, body, content_type="application/json")
    assert r.json == INVALID_ANSWER


def test_json_lone_surrogates_parse_as_invalid_and_the_digest_is_total():
    params = parse_json_object(b'{"a": "x\\ud800", "b": "\\udcff", "c": "\\ud83c\\udfae"}')
    assert params == {"a": INVALID, "b": INVALID, "c": "\U0001f3ae"}
    for key in ("x\ud800", "\udcff", "\ud83c"):
        assert len(api_key_digest(key)) == 64


@pytest.mark.engine("sqlite")
@pytest.mark.parametrize("length", ["²", "٣", "3\u00a0", "1" * 5000, "99999999999999999999999"])
def test_content_length_other_than_ascii_digits_is_400_or_413(wsgi_app, length):
    status, body = call(wsgi_app, environ_for(b"abc", "", CONTENT_LENGTH=length))
    answer = json.loads(body)
    assert set(answer) == ERROR_KEYS
    assert (status, answer["error"]) in (("200 OK", 400), ("413 Payload Too Large", 413))


class FailingInput:
    """A wsgi.input whose read fails as a server's own reader does (gunicorn: InvalidChunkSize)."""

    def __init__(self, error: Exception):
        self.error = error

    def read(self, *args):
        raise self.error


@pytest.mark.engine("sqlite")
@pytest.mark.parametrize("error", [ValueError("bad chunk"), OSError("reset"), RuntimeError("?")])
@pytest.mark.parametrize(
    "framing",
    [{"CONTENT_LENGTH": "10"}, {"CONTENT_LENGTH": "", "HTTP_TRANSFER_ENCODING": "chunked"}],
)
def test_a_body_that_cannot_be_read_is_400(wsgi_app, error, framing):
    status, body = call(
        wsgi_app, environ_for(b"", "", **framing, **{"wsgi.input": FailingInput(error)})
    )
    assert status == "200 OK"
    assert json.loads(body) == {
        "success": False,
        "error": 400,
        "error_description": "Request body could not be read",
    }


# -- property: whatever the environ, never a 500 and always the JSON shape ------------------------

latin1 = st.text(st.characters(max_codepoint=255), max_size=80)
any_text = st.one_of(
    latin1, st.text(max_size=40)
)  # a non-compliant server may pass non-latin-1 text
boundaries = st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=75)


@st.composite
def multipart_bodies(draw):
    boundary = draw(boundaries)
    parts = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["user_id", "api_key", "game_auth_token", "x", 'q"', ""]),
                st.sampled_from(
                    [
                        "",
                        "; filename=f",
                        "\r\nContent-Type: multipart/mixed; boundary=" + boundary,
                        "\r\nContent-Transfer-Encoding: base64",
                    ]
                ),
                st.binary(max_size=30),
            ),
            max_size=20,
        )
    )
    delimiter = b"--" + boundary.encode()
    body = b"".join(
        delimiter
        + b'\r\nContent-Disposition: form-data; name="%s"%s\r\n\r\n%s\r\n'
        % (name.encode(), extra.encode(), value)
        for name, extra, value in parts
    )
    body += delimiter + b"--\r\n"
    cut = draw(st.one_of(st.none(), st.integers(0, len(body))))
    quoted = draw(st.booleans())
    content_type = (
        f'multipart/form-data; boundary="{boundary}"'
        if quoted
        else f"multipart/form-data; boundary={boundary}"
    )
    return (body if cut is None else body[:cut]), content_type


bodies = st.one_of(
    st.tuples(st.binary(max_size=300), any_text),
    multipart_bodies(),
    st.tuples(
        st.sampled_from(
            [
                b'{"api_key": "x\\ud800", "user_id": "\\udcff", "game_auth_token": "\\ud800"}',
                b'{"user_id": 1}',
                b"[" * 3000,
                b"user_id=%ff&api_key=\xff",
            ]
        ),
        st.sampled_from(["application/json", "", "text/plain"]),
    ),
)


@hsettings(
    max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    body_and_type=bodies,
    content_length=st.one_of(st.none(), st.just("LEN"), any_text, st.integers(-5, 10**6).map(str)),
    transfer_encoding=st.one_of(
        st.none(), st.sampled_from(["chunked", "gzip, chunked", "CHUNKED"]), any_text
    ),
    query=any_text,
    path=st.one_of(st.just(PATH), st.just("/healthz"), any_text),
    method=st.one_of(st.sampled_from(["GET", "POST", "HEAD", "PUT"]), any_text),
    terminated=st.booleans(),
    read_error=st.sampled_from([None, ValueError("bad chunk size"), OSError("reset")]),
)
@pytest.mark.engine("sqlite")
def test_any_environ_gets_a_json_answer_and_never_a_500(
    wsgi_app,
    body_and_type,
    content_length,
    transfer_encoding,
    query,
    path,
    method,
    terminated,
    read_error,
):
    body, content_type = body_and_type
    environ = environ_for(
        body, content_type, QUERY_STRING=query, PATH_INFO=path, REQUEST_METHOD=method
    )
    environ["wsgi.input_terminated"] = terminated
    if content_length is None:
        del environ["CONTENT_LENGTH"]
    elif content_length != "LEN":
        environ["CONTENT_LENGTH"] = content_length
    if transfer_encoding is not None:
        environ["HTTP_TRANSFER_ENCODING"] = transfer_encoding
    if read_error is not None:
        environ["wsgi.input"] = FailingInput(read_error)
    status, answer = call(wsgi_app, environ)
    assert not status.startswith("500")
    if method == "HEAD":
        assert answer == b""
        return
    parsed = json.loads(answer)
    if path == "/healthz" and parsed.get("success") is True:
        return
    assert set(parsed) == ERROR_KEYS and parsed["success"] is False
    assert parsed["error"] in (400, 403, 404, 405, 413)
