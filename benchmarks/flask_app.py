"""The same endpoint written the ordinary Flask way, for scripts/bench to compare against.

Same rules as authsvc for the cases the benchmark sends (valid, 403, 400), the
same SQLite query on the same store file, the same HMAC check, the 400/403
results with HTTP 200. Dev-only: Flask is not a dependency of the service.

    AUTHSVC_STORE=sqlite:///path.db AUTHSVC_TOKEN_SECRET_FILE=... gunicorn
    benchmarks.flask_app:application
"""

from __future__ import annotations

import hashlib
import hmac
import os
import sqlite3
import time

from flask import Flask, jsonify, request

from authsvc.store.sqlite.store import (
    CREDENTIALS_SQL,
)  # the very query authsvc sends without a snapshot
from benchmarks.common import app_from_env

MISSING = "user_id, game_auth_token, and api_key are required parameters"


def create_app(db_path: str, secret: bytes) -> Flask:
    app = Flask(__name__)
    connections: dict[int, sqlite3.Connection] = {}  # one per process, opened after fork

    def db() -> sqlite3.Connection:
        pid = os.getpid()
        if pid not in connections:
            connections[pid] = sqlite3.connect(
                f"file:{db_path}?mode=ro", uri=True, check_same_thread=False
            )
        return connections[pid]

    def failure(code: int, description: str):
        return jsonify(success=False, error=code, error_description=description)

    @app.route("/api/authenticate.json", methods=["GET", "HEAD", "POST"])
    def authenticate():
        params = dict(request.values)
        if request.is_json:
            params.update({k: str(v) for k, v in (request.get_json(silent=True) or {}).items()})
        user_id, token, api_key = (params.get(k) for k in ("user_id", "game_auth_token", "api_key"))
        if not user_id or not token or not api_key:
            return failure(400, MISSING)
        if not user_id.isdigit() or user_id.startswith("0") or int(user_id) >= 2**63:
            return failure(403, "Invalid credentials")
        uid = int(user_id)
        digest = hashlib.sha256(api_key.encode()).hexdigest()
        row = db().execute(CREDENTIALS_SQL, (uid, digest)).fetchone()
        game_id, game_enabled, expires_at, username, epoch, player_enabled = row or (
            0,
            0,
            None,
            None,
            0,
            0,
        )
        expected = hmac.new(
            secret, f"{game_id}:{uid}:{epoch or 0}".encode(), hashlib.sha256
        ).hexdigest()
        if (
            hmac.compare_digest(expected.encode(), token.encode("ascii", "replace"))
            and row is not None
            and game_enabled
            and username is not None
            and player_enabled
            and (expires_at is None or expires_at > time.time())
        ):
            return jsonify(success=True, user_id=uid, username=username)
        return failure(403, "Invalid credentials")

    return app


def __getattr__(name: str):
    if name == "application":  # built when gunicorn asks for it, as authsvc.wsgi does
        return app_from_env(create_app)
    raise AttributeError(name)
