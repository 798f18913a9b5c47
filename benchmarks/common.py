"""What the comparison apps share: they read the store and the secret as authsvc does (no
Settings)."""

from __future__ import annotations

import os


def app_from_env(create_app):
    """``create_app(db_path, secret)`` on AUTHSVC_STORE (sqlite://) and the first line of
    AUTHSVC_TOKEN_SECRET_FILE."""
    with open(os.environ["AUTHSVC_TOKEN_SECRET_FILE"], "rb") as f:
        secret = f.read().split()[0]
    return create_app(os.environ["AUTHSVC_STORE"].removeprefix("sqlite://"), secret)
