"""``authsvc.admin.wsgi:application``: the admin API (docs/admin-api.md) for gunicorn, as its own service.

Built when gunicorn asks for ``application`` (PEP 562), from the settings of the
admin service's environment: its ``AUTHSVC_STORE`` names the admin store settings
(on PostgreSQL the admin role, which may write), never the game-facing service's
read-only role. The store must exist at this release's schema version and the
token secret must be readable (``POST /v1/tokens`` mints with it): otherwise one
line on stderr and gunicorn's "app failed to load" exit status, 4.
"""

import sys

from authsvc.admin.api import AdminApp
from authsvc.errors import ConfigError
from authsvc.settings import Settings

APP_LOAD_ERROR = 4  # gunicorn.arbiter.Arbiter.APP_LOAD_ERROR


def __getattr__(name: str):
    if name == "application":
        try:
            app = AdminApp(Settings.from_env())
            app.store.check()
            return app
        except ConfigError as e:
            print(f"authsvc-admin: error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(APP_LOAD_ERROR) from None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
