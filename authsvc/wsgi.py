"""``authsvc.wsgi:application`` for gunicorn.

The app is built when gunicorn asks for ``application`` (PEP 562 module
``__getattr__``), not when the module is imported: settings are read and the
store and secret checked then, so a bad configuration stops the server at boot.
It stops with one line on stderr (the journal), not a traceback, and gunicorn's
"app failed to load" exit status, 4: in the master with ``preload_app`` (the
shipped deploy/gunicorn.conf.py), or in a worker, whose 4 makes the master halt.
"""

import sys

from authsvc.app import make_app
from authsvc.errors import ConfigError
from authsvc.settings import Settings

APP_LOAD_ERROR = 4  # gunicorn.arbiter.Arbiter.APP_LOAD_ERROR


def __getattr__(name: str):
    if name == "application":
        try:
            return make_app(Settings.from_env())
        except ConfigError as e:
            print(f"authsvc: error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(APP_LOAD_ERROR) from None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
