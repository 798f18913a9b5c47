"""``Idempotency-Key`` on the admin API's POSTs (docs/admin-api.md, "Retries and Idempotency-Key").

The first request with a key (per API token) runs and its answer is kept 24 hours
(table idempotency_keys, store/api_tables.py); the same key with the same method,
path and body gets that answer again, with ``Idempotent-Replayed: true``, and
changes nothing and writes no audit record; with another body, 422. While the
first is still running, the same key gets 409 (try again shortly). An answer
of 500 or 503 is not kept: the retry runs afresh.

Secrets are never kept. A minted ``game_auth_token`` is kept as its game, player and
epoch, and made again on a replay: it is the same token (docs/tokens.md), as long
as the token secret was not rotated meanwhile. A new api key cannot be made
again, so the answer to ``POST /v1/games`` and ``POST /v1/games/{id}/keys`` is
kept without it, and a replay is 409 naming the game: the key was shown once;
rotate it if the first answer was lost.

The change and the kept answer are two transactions: a process killed between
them leaves the key "running"; after ABANDONED_AFTER seconds a retry runs again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from authsvc.admin.problems import Problem, Response, invalid
from authsvc.store.audit import canonical
from authsvc.tokens import mint_token

if TYPE_CHECKING:
    from authsvc.admin.api import AdminApp
    from authsvc.admin.problems import Request

WINDOW = 86400  # seconds a key's answer is kept
ABANDONED_AFTER = 60  # seconds after which a key still "running" is taken to have lost its request
RUNNING = 0  # the status column while the first request runs
PROBLEM = "application/problem+json"


def _sql(text: str, pg: bool) -> str:
    return text.replace("?", "%s") if pg else text


def check_key(key: str) -> str:
    if not (1 <= len(key) <= 255 and key.isascii() and key.isprintable()):
        raise invalid("Idempotency-Key", "must be 1 to 255 printable ASCII characters")
    return key


def request_hash(req: Request) -> str:
    text = canonical([req.method, req.environ.get("PATH_INFO", ""), req.body])
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def running() -> Problem:
    return Problem(409, "idempotency-key-running", "the first request with this Idempotency-Key is still running; "
                   "try again shortly", headers=(("Retry-After", "1"),))


def _begin(app: AdminApp, token: str, key: str, digest: str, now: int) -> dict | None:
    """None: run the request (the key is now "running"); else the kept answer."""
    store = app.store
    pg = store.pg
    with store.admin_transaction() as conn:
        conn.execute(_sql("DELETE FROM idempotency_keys WHERE created_at < ?", pg), (now - WINDOW,))
        row = conn.execute(
            _sql("SELECT request_hash, status, body, created_at FROM idempotency_keys WHERE token_name = ? AND key = ?"
                 + (" FOR UPDATE" if pg else ""), pg), (token, key),
        ).fetchone()
        if row is None:
            cur = conn.execute(_sql("INSERT INTO idempotency_keys (token_name, key, request_hash, created_at, status) "
                                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING", pg), (token, key, digest, now, RUNNING))
            if cur.rowcount == 1:
                return None
            raise running()  # the same key, inserted by a request running at the same time (PostgreSQL)
        if row[0] != digest:
            raise Problem(422, "idempotency-key-reused",
                          "this Idempotency-Key was used with another request (method, path or body) in the last 24 h")
        if row[1] == RUNNING:
            if now - row[3] < ABANDONED_AFTER:
                raise running()
            conn.execute(_sql("UPDATE idempotency_keys SET created_at = ? WHERE token_name = ? AND key = ?", pg),
                         (now, token, key))
            return None
        return json.loads(row[2])


def _finish(app: AdminApp, token: str, key: str, kept: dict | None) -> None:
    """Keep the answer, or (None) forget the key: the retry runs afresh."""
    pg = app.store.pg
    with app.store.admin_transaction() as conn:
        if kept is None:
            conn.execute(_sql("DELETE FROM idempotency_keys WHERE token_name = ? AND key = ?", pg), (token, key))
        else:
            conn.execute(_sql("UPDATE idempotency_keys SET status = ?, body = ? WHERE token_name = ? AND key = ?", pg),
                         (kept["status"], canonical(kept), token, key))


def _kept(response: Response) -> dict:
    """What is kept of an answer: never a token or an api key (the module's docstring says what instead)."""
    obj = dict(response.obj)
    kind = "plain"
    if "game_auth_token" in obj:
        del obj["game_auth_token"]
        kind = "mint"
    elif "api_key" in obj:
        del obj["api_key"]
        kind = "key"
    return {"status": response.status, "obj": obj, "kind": kind, "content_type": response.content_type}


def _replay(app: AdminApp, kept: dict) -> Response:
    obj, replayed = kept["obj"], (("Idempotent-Replayed", "true"),)
    if kept["kind"] == "mint":
        secret = app.settings.token_secrets[0]
        obj = obj | {"game_auth_token": mint_token(secret, obj["game_id"], obj["user_id"], obj["epoch"])}
    elif kept["kind"] == "key":
        raise Problem(409, "idempotency-secret-not-kept",
                      f"the first request with this Idempotency-Key already made game {obj['game_id']}'s key, "
                      "shown once and not kept; rotate the key if that answer was lost",
                      headers=replayed, extra={"game_id": obj["game_id"]})
    return Response(kept["status"], obj, replayed, content_type=kept["content_type"])


def run(app: AdminApp, req: Request, key: str, call: Callable[[], Response]) -> Response:
    """The request once per key: the first answer, kept, or that answer again."""
    check_key(key)
    token, now = req.token_name, req.ctx.now()
    kept = _begin(app, token, key, request_hash(req), now)
    if kept is not None:
        return _replay(app, kept)
    try:
        response = call()
    except Exception as e:  # an operation's typed error is an answer too: kept, unless a 5xx
        p = e if isinstance(e, Problem) else app.problem_for(e, req.ctx.request_id or "-")
        answer = {"status": p.status, "obj": p.body(), "kind": "plain", "content_type": PROBLEM}
        try:
            _finish(app, token, key, None if p.status >= 500 else answer)
        except Exception:  # the store is down: the key is freed after ABANDONED_AFTER
            pass
        raise p from None
    _finish(app, token, key, _kept(response))
    return response
