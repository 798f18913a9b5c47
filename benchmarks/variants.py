"""Apps that differ from the bare app or authsvc in one thing, for scripts/bench's gap section.

Each row of that section changes one thing, so the difference of two rows is what
that thing costs: the bare app with authsvc's response headers (what gunicorn does
with three more headers), authsvc without its metrics.
"""

from authsvc.web.http import BASE_HEADERS
from benchmarks.bare import BODY

# authsvc's headers for a success (authsvc/web/http.py respond, authsvc/web/app.py).
AUTHSVC_HEADERS = [*BASE_HEADERS, ("Content-Length", str(len(BODY))), ("X-Authsvc-Result", "200")]


def bare_with_authsvc_headers(environ, start_response):
    start_response("200 OK", AUTHSVC_HEADERS)
    return [BODY]


def __getattr__(name: str):
    """``authsvc_without_metrics``: authsvc.wsgi's app, built when gunicorn asks for it, with
    metrics off."""
    if name == "authsvc_without_metrics":
        from authsvc.settings import Settings
        from authsvc.web.app import make_app

        app = make_app(Settings.from_env())
        app.metrics = None
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
