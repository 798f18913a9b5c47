"""``authsvc.wsgi:application`` for gunicorn.

The app is built when gunicorn asks for ``application`` (PEP 562 module
``__getattr__``), not when the module is imported: settings are read and the
store and secret checked then, so a bad configuration stops the server at boot.
It stops with one line on stderr (the journal), not a traceback, and gunicorn's
"app failed to load" exit status, 4: in the master with ``preload_app`` (the
shipped deploy/gunicorn.conf.py), or in a worker, whose 4 makes the master halt.

One exception (docs/stores.md, "Outages"): a store that is merely unreachable
when a worker boots (gunicorn without ``--preload``, the store down while a
worker is replaced) is a warning, and the worker answers 503 until the store is
back; in the master, at start-up, it stays fatal, with exit status 75 (EX_TEMPFAIL)
rather than 4, so that systemd starts the service again while a misconfiguration
stays stopped (deploy/systemd/authsvc.service).
"""

import inspect
import sys

from authsvc.errors import ConfigError, StoreUnreachable
from authsvc.settings import Settings
from authsvc.web.app import make_app

APP_LOAD_ERROR = 4  # gunicorn.arbiter.Arbiter.APP_LOAD_ERROR
# The store did not answer the master's start-up check: sysexits.h's EX_TEMPFAIL, which the
# service unit does not list in RestartPreventExitStatus, so systemd tries again.
STORE_UNREACHABLE = 75


def _in_gunicorn_worker() -> bool:
    """Whether a gunicorn worker is loading the app (Worker.load_wsgi is on the stack), not its
    master (preload_app) or another program. gunicorn tells a worker by no setting of its own. Once per
    app load, never per request: the stack through inspect's public API."""
    base = sys.modules.get("gunicorn.workers.base")
    worker_class = getattr(base, "Worker", None)
    if worker_class is None:
        return False
    frame = inspect.currentframe()
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), worker_class):
            return True
        frame = frame.f_back
    return False


def __getattr__(name: str):
    if name == "application":
        try:
            return make_app(Settings.from_env(), tolerate_outage=_in_gunicorn_worker())
        except ConfigError as e:
            print(f"authsvc: error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(STORE_UNREACHABLE if isinstance(e, StoreUnreachable) else APP_LOAD_ERROR) from None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
