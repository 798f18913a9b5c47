"""The game door's one mapping of the error model (authsvc/errors.py) to its answers (docs/api.md,
"Answers").

An error's answer is ``{"success":false,"error":STATUS,"error_description":DETAIL}``, the error's
status and detail; the 400 and 403 results travel as HTTP 200 unless AUTHSVC_ERROR_STATUS=http
(docs/design.md, "The wire"). Nothing else in the package writes that shape
(tests/unit/test_error_model.py): the app's boundary (authsvc/web/app.py) and the workers' answers
to what gunicorn refuses (authsvc/serving/workers.py) take their bodies from here.
"""

from __future__ import annotations

from authsvc.errors import Error, InvalidCredentials, MissingCredentials
from authsvc.web.http import json_bytes

# The results sent with HTTP 200 unless AUTHSVC_ERROR_STATUS=http: old clients never read a 4xx's
# body.
IN_BODY_ONLY = (400, 403)


def body_of(error: Error | type[Error]) -> bytes:
    """The JSON of an error: a raised one (with its own detail), or a class (with its default
    detail)."""
    return json_bytes({"success": False, "error": error.status, "error_description": error.detail})


# The refusals an authentication returns in its Result (authsvc/web/authenticate.py) instead of
# raising them, written once: a refusal costs one lookup, the same for every reason, and no
# exception's cost.
REFUSALS: dict[type[Error], bytes] = {
    error: body_of(error) for error in (MissingCredentials, InvalidCredentials)
}


def http_statuses(errors_as_http_status: bool) -> dict[int, int]:
    """The HTTP status of each result that travels as another (``.get(result, result)``): 400 and
    403 as 200, or none with AUTHSVC_ERROR_STATUS=http. A dict lookup costs a success no more than
    the test it replaces."""
    return {} if errors_as_http_status else dict.fromkeys(IN_BODY_ONLY, 200)
