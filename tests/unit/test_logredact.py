"""gunicorn's error log without request data (authsvc/serving/redact.py): gunicorn's request
messages replaced whole by the kind of error, tracebacks with their frames and without
their messages. Through real gunicorn: tests/integration/test_deploy.py.
"""

from __future__ import annotations

import logging

import pytest

from authsvc.serving.redact import RedactFilter, frames_only, redact

KEY = "9e258f6c-a232-442b-8d2d-f22da9c19d49"
TOKEN = "4e6b97f60d73ff18a6226e2a55cf9e94116209e5efce0a85496cf819c4f0c11d"
PROBE = (
    "GET /api/authenticate.json?q=\"x'&user_id=4242&api_key="
    + KEY
    + "&game_auth_token="
    + TOKEN
    + "&z=\xff HTTP/1.1"
)


def _logged(*calls) -> list[str]:
    """Each call (level, message, args, exc) through RedactFilter and the shipped error format."""
    logger = logging.getLogger("test.logs.redact")
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(self.format(record))

    handler = Keep()
    handler.setFormatter(logging.Formatter("[%(levelname)s] %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.addFilter(RedactFilter())
    logger.propagate = False
    try:
        for level, message, args, exc in calls:
            logger.log(level, message, *args, exc_info=exc)
    finally:
        logger.removeHandler(handler)
        logger.filters.clear()
    return lines


def test_the_probe_request_line_is_withheld_whole():
    """' and " before the secrets used to end the quoted-value pattern early."""
    message = f"Invalid request from ip=127.0.0.1: Invalid HTTP request line: {PROBE!r}"
    [line] = _logged((logging.WARNING, message, (), None))
    assert (
        line
        == "[WARNING] test.logs.redact: Invalid request from ip=127.0.0.1: invalid request line "
        "(text withheld)"
    )


@pytest.mark.parametrize(
    "error, kind",
    [
        (f"Invalid HTTP method: {PROBE!r}", "invalid method"),
        (f"Invalid HTTP Version: {'HTTP/9?api_key=' + KEY!r}", "invalid HTTP version"),
        (f"Invalid HTTP Header: {'X: ' + KEY!r}", "invalid header"),
        (f"Invalid HTTP header name: {KEY!r}", "invalid header name"),
        (f"Invalid chunk size: {KEY.encode()!r}", "invalid chunk size"),
        ("Request Line is too large (9000 > 8190)", "request line too large"),
        ("limit request headers fields size", "request headers too large"),
        (f"Unsupported transfer coding: {KEY!r}", "unsupported transfer coding"),
        ("something gunicorn says one day: " + KEY, "request error"),
    ],
)
def test_every_request_parsing_error_names_only_its_kind(error, kind):
    text = redact(f"Invalid request from ip=: {error}")
    assert text == f"Invalid request from ip=: {kind} (text withheld)"


def test_redact_twice_is_redact_once():
    """dictConfig adds the filter to the logger again on each HUP: two filters in a row."""
    routes = frozenset({"/api/authenticate.json"})
    for message in (
        f"Invalid request from ip=127.0.0.1: Invalid HTTP request line: {PROBE!r}",
        f"Invalid request from ip=: something new: {KEY}",
        f"Error handling request GET /api/authenticate.json?api_key={KEY}",
        f"Error handling request /x?api_key={KEY}",
        "Worker exiting (pid: 42)",
    ):
        once = redact(message, routes)
        assert redact(once, routes) == once and KEY not in once


def test_an_address_that_is_not_one_is_withheld():
    assert redact(f"Invalid request from ip={KEY}: Invalid HTTP method: 'x'").startswith(
        "Invalid request from ip=<redacted>: invalid method"
    )
    assert redact("Invalid request from ip=::1: Invalid HTTP method: 'x'").startswith(
        "Invalid request from ip=::1: "
    )


def test_error_handling_request_names_the_route_only():
    routes = frozenset({"/api/authenticate.json"})
    for uri, route in (
        (f"/api/authenticate.json?api_key={KEY}", "/api/authenticate.json"),
        (f"/api/authenticate.json%3Fapi_key={KEY}", "<other>"),
        (f"/x'\"?api_key={KEY}", "<other>"),
    ):
        assert (
            redact(f"Error handling request GET {uri}", routes)
            == f"Error handling request GET {route} (text withheld)"
        )
    assert (
        redact(f"Error handling request {KEY}?a", routes)
        == "Error handling request <other> (text withheld)"
    )
    assert (
        redact("Error handling request (no URI read)", routes)
        == "Error handling request <other> (text withheld)"
    )


def _raise_chained():
    try:
        raise KeyError(f"api_key={KEY}")
    except KeyError as e:
        raise ValueError(f"bad request line {PROBE!r}") from e


def test_tracebacks_keep_their_frames_and_lose_the_messages():
    try:
        _raise_chained()
    except ValueError as e:
        exc = e
    [line] = _logged(
        (logging.ERROR, "Error handling request GET /api/authenticate.json?api_key=" + KEY, (), exc)
    )
    assert KEY not in line and TOKEN not in line, line
    assert f'File "{__file__}", line ' in line and "in _raise_chained" in line, line
    assert "<redacted>" not in line
    assert "KeyError: (text withheld)" in line and "ValueError: (text withheld)" in line
    assert line.index("KeyError") < line.index("ValueError")  # the cause first, as Python prints it


def test_a_traceback_inside_a_message_keeps_its_file_paths():
    """gunicorn logs traceback.format_exc() as a message when an access log line fails."""
    text = (
        'Traceback (most recent call last):\n  File "/opt/authsvc/venv/x.py", line 3, in '
        f"f\nKeyError: '{KEY}'\n"
    )
    out = redact(text)
    assert '  File "/opt/authsvc/venv/x.py", line 3, in f' in out and KEY not in out


def test_frames_only_of_an_exception_without_a_traceback():
    assert (
        frames_only(ValueError(KEY))
        == "Traceback (most recent call last):\nValueError: (text withheld)"
    )
