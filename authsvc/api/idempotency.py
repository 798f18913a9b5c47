"""``Idempotency-Key`` on the admin API's POSTs and DELETEs (docs/admin-api.md, "Retries and
Idempotency-Key").

The first request with a key (per API token) runs and its answer is kept 24 hours
(table idempotency_keys, store/api_tables.py); the same key with the same method,
path and body gets that answer again, with ``Idempotent-Replayed: true``, and
changes nothing and writes no audit record; with another body, 422. An answer
of 500 or 503 is not kept: the retry runs afresh.

Exactly once, as Stripe does it: the lookup of the key, the change, its audit record and
the kept answer are ONE write transaction (store/writes.py). A process killed anywhere in
it leaves no trace, and the retry runs; one that committed left its answer, and the retry
replays it. A retry sent while the first still runs waits for the writer lock, then
replays the first's answer: there is no "still running" state to wait out.

Secrets are never kept. A minted ``game_auth_token`` is kept as its game, player and
epoch, and made again on a replay: it is the same token (docs/tokens.md), as long
as the token secret was not rotated meanwhile. A new api key cannot be made
again, so the answer to ``POST /v1/games`` and ``POST /v1/games/{id}/keys`` is
kept without it, and a replay is 409 naming the game: the key was shown once;
rotate it if the first answer was lost. So is a new webhook's secret (``POST /v1/webhooks``): a
replay is 409 naming the webhook.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from authsvc.api.messages import Response
from authsvc.api.problems import invalid, problem_for
from authsvc.errors import Error, KeyReused, SecretNotKept
from authsvc.store.audit import canonical
from authsvc.tokens import mint_token

if TYPE_CHECKING:
    from authsvc.api.app import AdminApp
    from authsvc.api.messages import Request

WINDOW = 86400  # seconds a key's answer is kept
RUNNING = 0  # the status the release before wrote while a request ran: no answer, the retry runs
PROBLEM = "application/problem+json"


def check_key(key: str) -> str:
    if not (1 <= len(key) <= 255 and key.isascii() and key.isprintable()):
        raise invalid("Idempotency-Key", "must be 1 to 255 printable ASCII characters")
    return key


def request_hash(req: Request) -> str:
    text = canonical([req.method, req.environ.get("PATH_INFO", ""), req.body])
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _kept(response: Response) -> dict:
    """What is kept of an answer: never a token or an api key (the module's docstring says what
    instead)."""
    obj = dict(response.obj)
    kind = "plain"
    if "game_auth_token" in obj:
        del obj["game_auth_token"]
        kind = "mint"
    elif "api_key" in obj:
        del obj["api_key"]
        kind = "key"
    elif "secret" in obj:
        del obj["secret"]
        kind = "webhook"
    return {
        "status": response.status,
        "obj": obj,
        "kind": kind,
        "content_type": response.content_type,
    }


def _replay(app: AdminApp, kept: dict) -> Response:
    obj, replayed = kept["obj"], (("Idempotent-Replayed", "true"),)
    if kept["kind"] == "mint":
        secret = app.secret_file.current()[0]
        obj = obj | {
            "game_auth_token": mint_token(secret, obj["game_id"], obj["user_id"], obj["epoch"])
        }
    elif kept["kind"] == "key":
        raise SecretNotKept(
            f"the first request with this Idempotency-Key already made game {obj['game_id']}'s "
            "key, shown once and not kept; rotate the key if that answer was lost",
            headers=replayed,
            extra={"game_id": obj["game_id"]},
        )
    elif kept["kind"] == "webhook":
        raise SecretNotKept(
            f"the first request with this Idempotency-Key already made webhook {obj['id']}, whose "
            "secret was shown once and not kept; remove it and add another if that answer was lost",
            headers=replayed,
            extra={"webhook_id": obj["id"]},
        )
    return Response(kept["status"], obj, replayed, content_type=kept["content_type"])


def run(app: AdminApp, req: Request, key: str, call: Callable[[], Response]) -> Response:
    """The request once per key: the first answer, kept, or that answer again; one transaction
    either way."""
    check_key(key)
    token, now, digest = req.token_name, req.ctx.now(), request_hash(req)
    refused: Error | None = None
    with app.store.write(req.ctx.audit()) as tx:
        found = tx.kept_answer(token, key, now - WINDOW)
        if found is not None and found[1] != RUNNING:
            if found[0] != digest:
                raise KeyReused(
                    "this Idempotency-Key was used with another request (method, path or body) "
                    "in the last 24 h"
                )
            return _replay(app, json.loads(found[2] or "{}"))
        try:
            with tx.savepoint():  # the call's own writes, undone if it is refused
                response = call()
        except (
            Error
        ) as e:  # a refusal is an answer too: kept, unless a 5xx (anything else: nothing kept)
            if e.status >= 500:
                raise
            p = problem_for(e, req.ctx.request_id or "")
            answer = {"status": p.status, "obj": p.body(), "kind": "plain", "content_type": PROBLEM}
            tx.keep_answer(token, key, digest, now, p.status, canonical(answer))
            refused = e
        else:
            tx.keep_answer(token, key, digest, now, response.status, canonical(_kept(response)))
    if refused is not None:
        raise refused
    return response
