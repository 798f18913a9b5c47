"""The same endpoint in plain standard-library Python with no tuning: the second reference
(BENCHMARKS.md).

parse_qs, one SQLite query per request in its own transaction, hmac.new, json.dumps:
what a first version looks like. scripts/bench measures it beside authsvc so the
gain of authsvc's tuning is a ratio taken in the same run. Dev-only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sqlite3
import time
import urllib.parse

from authsvc.store.sqlite.store import (
    CREDENTIALS_SQL,
)  # the very query authsvc sends without a snapshot
from benchmarks.common import app_from_env

MISSING = "user_id, game_auth_token, and api_key are required parameters"
HEADERS = [
    ("Content-Type", "application/json; charset=utf-8"),
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
]


def create_app(db_path: str, secret: bytes):
    connections: dict[int, sqlite3.Connection] = {}

    def answer(start_response, obj):
        body = json.dumps(obj, separators=(",", ":")).encode()
        start_response("200 OK", [*HEADERS, ("Content-Length", str(len(body)))])
        return [body]

    def application(environ, start_response):
        params = {
            k: v[-1] for k, v in urllib.parse.parse_qs(environ.get("QUERY_STRING", "")).items()
        }
        user_id, token, api_key = (params.get(k) for k in ("user_id", "game_auth_token", "api_key"))
        if not user_id or not token or not api_key:
            return answer(
                start_response, {"success": False, "error": 400, "error_description": MISSING}
            )
        invalid = {"success": False, "error": 403, "error_description": "Invalid credentials"}
        if not user_id.isdigit() or user_id.startswith("0") or int(user_id) >= 2**63:
            return answer(start_response, invalid)
        if os.getpid() not in connections:
            connections[os.getpid()] = sqlite3.connect(
                f"file:{db_path}?mode=ro", uri=True, isolation_level=None
            )
        digest = hashlib.sha256(api_key.encode()).hexdigest()
        row = connections[os.getpid()].execute(CREDENTIALS_SQL, (int(user_id), digest)).fetchone()
        game_id, game_enabled, expires_at, username, epoch, player_enabled = row or (
            0,
            0,
            None,
            None,
            0,
            0,
        )
        expected = hmac.new(
            secret, f"{game_id}:{user_id}:{epoch or 0}".encode(), hashlib.sha256
        ).hexdigest()
        if (
            hmac.compare_digest(expected.encode(), token.encode("ascii", "replace"))
            and row
            and game_enabled
            and username is not None
            and player_enabled
            and (expires_at is None or expires_at > time.time())
        ):
            return answer(
                start_response, {"success": True, "user_id": int(user_id), "username": username}
            )
        return answer(start_response, invalid)

    return application


def __getattr__(name: str):
    if name == "application":  # built when gunicorn asks for it, as authsvc.wsgi does
        return app_from_env(create_app)
    raise AttributeError(name)
