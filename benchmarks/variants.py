"""Apps that differ from the bare app or authsvc in one thing, for scripts/bench's gap section.

Each row of that section changes one thing, so the difference of two rows is what
that thing costs: the bare app with authsvc's response headers (what gunicorn does
with three more headers), authsvc without its metrics, authsvc with an internal
replaced by the public API it stands in for (BENCHMARKS.md, "Internals").
"""

import hashlib
import hmac
import logging

from authsvc.web.http import BASE_HEADERS
from benchmarks.bare import BODY

# authsvc's headers for a success (authsvc/web/http.py respond, authsvc/web/app.py).
AUTHSVC_HEADERS = [*BASE_HEADERS, ("Content-Length", str(len(BODY))), ("X-Authsvc-Result", "200")]


def bare_with_authsvc_headers(environ, start_response):
    start_response("200 OK", AUTHSVC_HEADERS)
    return [BODY]


class PublicTokenVerifier:
    """TokenVerifier.matches through hmac.digest (OpenSSL's one-shot HMAC), the key pads hashed on each call."""

    def __init__(self, token_secrets):
        self.secrets = tuple(token_secrets)

    def matches(self, game_id, user_id, epoch, token):
        message = f"{game_id}:{user_id}:{epoch}".encode("ascii")
        given = token if token.isascii() else "?"
        ok = False
        for secret in self.secrets:
            ok |= hmac.compare_digest(hmac.digest(secret, message, hashlib.sha256).hex(), given)
        return ok


class PublicLineRecords:
    """LineRecords.make through Logger.makeRecord, a record built for each line."""

    def __init__(self, records):
        self.logger, self.level, self.pathname = records.logger, records.level, records.pathname

    def make(self, msg):
        return self.logger.makeRecord(self.logger.name, self.level, self.pathname, 0, msg, (), None)


def _app():
    from authsvc.settings import Settings
    from authsvc.web.app import make_app

    return make_app(Settings.from_env())


def __getattr__(name: str):
    """authsvc.wsgi's app, built when gunicorn asks for it, with one thing changed:
    ``authsvc_without_metrics``, ``authsvc_public_hmac``, ``authsvc_public_metrics``, ``authsvc_public_records``."""
    if name == "authsvc_without_metrics":
        app = _app()
        app.metrics = None
        return app
    if name == "authsvc_public_hmac":
        from authsvc.settings import Settings

        app = _app()
        app.authenticator.tokens = PublicTokenVerifier(Settings.from_env().token_secrets)
        return app
    if name == "authsvc_public_metrics":
        from authsvc.web import metrics

        metrics.Writer.of = classmethod(lambda cls, value_class, sample: None)  # the fallback: the public API
        logging.getLogger("authsvc").setLevel(logging.ERROR)  # not its warning
        app = _app()
        logging.getLogger("authsvc").setLevel(logging.NOTSET)
        assert app.metrics is not None and app.metrics.writer is None
        return app
    if name == "authsvc_public_records":
        app = _app()
        app.auth_records = PublicLineRecords(app.auth_records)
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
