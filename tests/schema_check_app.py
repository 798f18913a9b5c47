"""The shipped app (authsvc.wsgi:application) with the schema check of /readyz every
AUTHSVC_TEST_SCHEMA_CHECK_INTERVAL seconds instead of once a minute, so a test sees many checks
in a few seconds (tests/integration/test_upgrade.py). Loaded by gunicorn with the repository on
PYTHONPATH."""

import os

from authsvc.web import app as web_app

web_app.SCHEMA_CHECK_INTERVAL = float(os.environ.get("AUTHSVC_TEST_SCHEMA_CHECK_INTERVAL", "0.2"))

from authsvc.wsgi import application  # noqa: E402  (after the interval is set)

__all__ = ["application"]
