"""``authsvc.api.wsgi:create_app()``: the admin API (docs/admin-api.md) for gunicorn, as its own
service.

gunicorn's app factory (``authsvc.api.wsgi:application``, PEP 562, is the same app), from the
settings of the admin service's environment: its ``AUTHSVC_STORE`` names the admin store settings
(on PostgreSQL the admin role, which may write), never the game-facing service's
read-only role. The store must exist at this release's schema version and the
token secret must be readable (``POST /v1/tokens`` mints with it): otherwise one
line on stderr and gunicorn's "app failed to load" exit status, 4.

Its workers hand the GIL over every 0.5 ms instead of Python's 5 ms: a worker's threads share one
GIL, and a thread parsing a caller's 4 MiB batch otherwise holds a small call of another caller's up
to 5 ms at each step it waits for the GIL (docs/admin-api.md, "Rate limit"). ``scripts/bench --only
admin-cost``, two runs each on 2026-11-27: another token's GET p99 beside the costliest bodies went
from 1.81 and 1.73 x its p99 alone (5 ms) to 1.06 and 0.83 x (0.5 ms).
"""

import sys

from authsvc.api.app import AdminApp
from authsvc.errors import ConfigError
from authsvc.settings import Settings
from authsvc.tokens import check_known

APP_LOAD_ERROR = 4  # gunicorn.arbiter.Arbiter.APP_LOAD_ERROR
SWITCH_INTERVAL = 0.0005  # seconds: the GIL's hand-over interval in the admin service (above)


def create_app():
    """gunicorn's app factory: the admin API from the environment's settings, or exit 4 (above)."""
    try:
        app = AdminApp(Settings.from_env())
        app.store.check()
        # A secret file the store was never used with would mint tokens no one accepts: refused.
        check_known(
            app.settings.token_secrets, app.store.token_secrets(), app.settings.token_secret_file
        )
        sys.setswitchinterval(SWITCH_INTERVAL)
        return app
    except ConfigError as e:
        print(f"authsvc-admin: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(APP_LOAD_ERROR) from None


def __getattr__(name: str):
    if name == "application":
        return create_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
