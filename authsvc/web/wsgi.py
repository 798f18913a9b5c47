"""The game-facing app for gunicorn: its app factory ``authsvc.wsgi:create_app()``.

gunicorn calls the factory when it loads the app (in the master with ``preload_app``, the
shipped deploy/gunicorn.conf.py; else in each worker): settings are read and the store and
secret checked then, so a bad configuration stops the server at boot. It stops with one line on
stderr (the journal), not a traceback, and gunicorn's "app failed to load" exit status, 4.
``authsvc.wsgi:application`` (PEP 562 module ``__getattr__``) is the same app, for configs that
name it.

A store that is merely unreachable at that moment is fatal too, with exit status 75
(EX_TEMPFAIL) rather than 4, so that systemd starts the service again while a misconfiguration
stays stopped (deploy/systemd/authsvc.service). Where every worker builds the app itself (gunicorn
without ``--preload``) name ``authsvc.wsgi:create_app(tolerate_outage=True)``: a worker booting
while the store is down logs a warning and answers 503 until it is back (docs/stores.md,
"Outages"), instead of exiting and being replaced in a loop.
"""

import sys

from authsvc.errors import ConfigError, StoreUnreachable
from authsvc.settings import Settings
from authsvc.web.app import make_app

APP_LOAD_ERROR = 4  # gunicorn.arbiter.Arbiter.APP_LOAD_ERROR
# The store did not answer the master's start-up check: sysexits.h's EX_TEMPFAIL, which the
# service unit does not list in RestartPreventExitStatus, so systemd tries again.
STORE_UNREACHABLE = 75


def create_app(tolerate_outage: bool = False):
    """gunicorn's app factory: the game-facing app from the environment's settings (above)."""
    try:
        return make_app(Settings.from_env(), tolerate_outage=tolerate_outage)
    except ConfigError as e:
        print(f"authsvc: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(
            STORE_UNREACHABLE if isinstance(e, StoreUnreachable) else APP_LOAD_ERROR
        ) from None


def __getattr__(name: str):
    if name == "application":
        return create_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
