"""The admin API's resources under ``/v1`` (docs/admin-api.md): each a path, its methods, their
scopes.

A handler validates the request's fields (422 naming them), calls one function of
the operations layer and shapes its answer. Nothing here writes SQL or knows the
engine.
"""

from __future__ import annotations

import functools
import math
import re
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from authsvc import times
from authsvc.api import batch
from authsvc.api.messages import Request, Response
from authsvc.api.problems import invalid
from authsvc.errors import BadRequest, MethodNotAllowed, NotFound, ServiceUnavailable
from authsvc.loglines import OTHER_ROUTE
from authsvc.names import MAX_ID
from authsvc.operations import games as games_ops
from authsvc.operations import players as players_ops
from authsvc.operations import tokens as tokens_ops
from authsvc.operations import webhooks as webhooks_ops
from authsvc.operations.conditions import condition, etag
from authsvc.operations.context import at_ms
from authsvc.store.base import Game, Player
from authsvc.store.events import Delivery, Webhook

if TYPE_CHECKING:
    from authsvc.api.app import AdminApp

Handler = Callable[["AdminApp", "Request"], "Response"]
_ID = r"([1-9][0-9]{0,18})"
_ROUTES: list[tuple[re.Pattern, dict[str, tuple[Handler, str]]]] = []


def route(pattern: str, method: str, scope: str):
    def register(handler: Handler) -> Handler:
        compiled = re.compile(pattern)
        for existing, methods in _ROUTES:
            if existing.pattern == pattern:
                methods[method] = (handler, scope)
                return handler
        _ROUTES.append((compiled, {method: (handler, scope)}))
        return handler

    return register


def match(path: str, method: str) -> tuple[Handler, str, dict]:
    """(handler, scope, path parameters); 404 for no such path, 405 (with Allow) for another
    method."""
    for pattern, methods in _ROUTES:
        m = pattern.fullmatch(path)
        if m is None:
            continue
        if method not in methods:
            allowed = sorted(methods) + (["HEAD"] if "GET" in methods else [])
            raise MethodNotAllowed(tuple(allowed), f"{path} answers {', '.join(allowed)}")
        handler, scope = methods[method]
        params = {name: int(value) for name, value in m.groupdict().items()}
        if any(value > MAX_ID for value in params.values()):
            raise NotFound("no such resource: an id is at most 2^63-1")
        return handler, scope, params
    raise NotFound("no such resource (the admin API's paths start with /v1)")


_PARAMETER = re.compile(r"\(\?P<(\w+)>[^)]*\)")


@functools.cache
def template(pattern: re.Pattern) -> str:
    """A route's pattern as the OpenAPI document's path: each named group as ``{name}``."""
    return _PARAMETER.sub(r"{\1}", pattern.pattern)


def route_template(path: str) -> str:
    """What the access line calls ``path`` (docs/logs.md): its route's template
    (``/v1/players/{user_id}``, whatever the method), or "<other>". Never a value of the path: a
    decoded path holds the query string when a client percent-encodes the "?"."""
    for pattern, _ in _ROUTES:
        if pattern.fullmatch(path):
            return template(pattern)
    return OTHER_ROUTE


def utc(seconds: float) -> str:
    """RFC 3339 UTC with milliseconds, rounded up: a promise is never stated earlier than it
    holds."""
    return times.utc(math.ceil(seconds * 1000))


def field(
    body: dict | None, name: str, kind: type, *, required: bool = True, default: Any = None
) -> Any:
    """A body field of one JSON type (bool is not an int here), or 422 naming it."""
    if body is None or name not in body:
        if required:
            raise invalid(f"/{name}", "is required")
        return default
    value = body[name]
    if type(value) is not kind:
        word = {str: "a string", bool: "true or false", int: "a whole number"}[kind]
        raise invalid(f"/{name}", f"must be {word}")
    return value


def player_json(player: Player) -> dict:
    return {
        "user_id": player.user_id,
        "username": player.username,
        "enabled": player.enabled,
        "epoch": player.epoch,
        "updated_at": players_ops.updated_at(player),
    }


def game_json(game: Game) -> dict:
    return {
        "game_id": game.id,
        "name": game.name,
        "enabled": game.enabled,
        "created_at": game.created_at,
        "keys": [{"created_at": k.created_at, "expires_at": k.expires_at} for k in game.keys],
    }


# -- players ------------------------------------------------------------------------------------

PLAYER = rf"/v1/players/(?P<user_id>{_ID[1:-1]})"


@route(PLAYER, "GET", "players:read")
def get_player(app: AdminApp, req: Request) -> Response:
    player = players_ops.get_player(app.store, req.params["user_id"])
    return Response(200, player_json(player), (("ETag", etag(player)),))


@route(PLAYER, "PUT", "players:write")
def put_player(app: AdminApp, req: Request) -> Response:
    username = field(req.body, "username", str)
    enabled = field(req.body, "enabled", bool, required=False, default=True)
    player, created = players_ops.put_player(
        app.store,
        req.ctx,
        req.params["user_id"],
        username,
        enabled,
        condition("If-Match", req.header("If-Match")),
        condition("If-None-Match", req.header("If-None-Match")),
    )
    return Response(201 if created else 200, player_json(player), (("ETag", etag(player)),))


@route(PLAYER + "/revoke", "POST", "players:write")
def revoke_player(app: AdminApp, req: Request) -> Response:
    """effective_by: the commit's time plus the staleness bound, by when no web process accepts an
    older token."""
    epoch = players_ops.revoke_player(app.store, req.ctx, req.params["user_id"])
    effective_by = utc(req.ctx.clock() + app.settings.max_staleness)
    return Response(
        200, {"user_id": req.params["user_id"], "epoch": epoch, "effective_by": effective_by}
    )


@route(PLAYER, "DELETE", "players:write")
def delete_player(app: AdminApp, req: Request) -> Response:
    """The player and its names go (docs/admin-api.md, "Deleting a player"); effective_by as a
    revoke's."""
    players_ops.delete_player(
        app.store, req.ctx, req.params["user_id"], condition("If-Match", req.header("If-Match"))
    )
    effective_by = utc(req.ctx.clock() + app.settings.max_staleness)
    return Response(
        200, {"user_id": req.params["user_id"], "deleted": True, "effective_by": effective_by}
    )


@route(r"/v1/players/batch", "POST", "players:write")
def batch_players(app: AdminApp, req: Request) -> Response:
    """Up to 1,000 players, a result each; the valid ones written in one transaction
    (authsvc/api/batch.py)."""
    items, errors, dry_run = batch.parse(req.body)
    status = (
        players_ops.batch_players(app.store, req.ctx, items, dry_run, len(errors), req.body or {})
        if items
        else {}
    )
    results, counts = batch.results(items, errors, status)
    answer: dict[str, Any] = {"dry_run": dry_run, "counts": counts, "results": results}
    if not dry_run:
        answer["effective_by"] = utc(req.ctx.clock() + app.settings.max_staleness)
    return Response(200, answer)


batch_players.max_body_bytes = batch.MAX_BYTES  # the route's own body cap


# -- tokens -------------------------------------------------------------------------------------


@route(r"/v1/tokens", "POST", "tokens:mint")
def mint(app: AdminApp, req: Request) -> Response:
    game_id = field(req.body, "game_id", int)
    user_id = field(req.body, "user_id", int)
    if not 1 <= game_id <= MAX_ID:
        raise invalid("/game_id", "must be a whole number from 1 to 2^63-1")
    if not 1 <= user_id <= MAX_ID:
        raise invalid("/user_id", "must be a whole number from 1 to 2^63-1")
    secrets = app.secret_file.current()  # re-read after a rotation: no restart (docs/tokens.md)
    if not secrets:
        raise ServiceUnavailable(
            "this admin service has no token secret to mint with", headers=(("Retry-After", "60"),)
        )
    token, player = tokens_ops.mint(app.store, req.ctx, secrets[0], game_id, user_id)
    return Response(
        200,
        {"game_id": game_id, "user_id": user_id, "game_auth_token": token, "epoch": player.epoch},
    )


# -- games ---------------------------------------------------------------------------------------

GAME = rf"/v1/games/(?P<game_id>{_ID[1:-1]})"


@route(r"/v1/games", "POST", "games:write")
def add_game(app: AdminApp, req: Request) -> Response:
    """The api key is in this answer only (docs/admin-api.md, "Games")."""
    game, api_key = games_ops.add_game(app.store, req.ctx, field(req.body, "name", str))
    return Response(201, game_json(game) | {"api_key": api_key})


@route(GAME, "GET", "games:read")
def get_game(app: AdminApp, req: Request) -> Response:
    game = app.store.get_game(req.params["game_id"])
    if game is None:
        raise NotFound(f"no game {req.params['game_id']}")
    return Response(200, game_json(game))


@route(GAME, "PATCH", "games:write")
def patch_game(app: AdminApp, req: Request) -> Response:
    enabled = field(req.body, "enabled", bool)
    games_ops.set_game_enabled(app.store, req.ctx, req.params["game_id"], enabled)
    return get_game(app, req)


@route(GAME + "/keys", "POST", "games:write")
def rotate_key(app: AdminApp, req: Request) -> Response:
    """A new key, once; the game's older keys expire ``old_key_ttl`` seconds from now (default one
    day)."""
    ttl = field(req.body, "old_key_ttl", int, required=False, default=86400)
    api_key, expires_at = games_ops.rotate_game_key(app.store, req.ctx, req.params["game_id"], ttl)
    return Response(
        201,
        {"game_id": req.params["game_id"], "api_key": api_key, "old_keys_expire_at": expires_at},
    )


# -- the audit trail -----------------------------------------------------------------------------

AUDIT_FILTERS = {"player": "user_id", "game": "game_id", "action": "action", "actor": "actor"}
MAX_AUDIT_PAGE = 1000


@route(r"/v1/audit", "GET", "audit:read")
def audit(app: AdminApp, req: Request) -> Response:
    """Newest first, ``limit`` a page (default 100); ``next`` is the ``after`` of the next page,
    null at the end."""
    try:
        query = dict(urllib.parse.parse_qsl(req.query, keep_blank_values=True, errors="strict"))
    except UnicodeDecodeError:
        raise BadRequest("the query string is not valid UTF-8") from None
    filters: dict[str, Any] = {}
    for name, value in query.items():
        if name in ("after", "limit", "player", "game"):
            top, top_text = (
                (MAX_AUDIT_PAGE, str(MAX_AUDIT_PAGE)) if name == "limit" else (MAX_ID, "2^63-1")
            )
            # The length first: int() refuses a string of more than 4,300 digits (a 500, not this
            # 422).
            if not (
                value.isascii()
                and value.isdigit()
                and value[0] != "0"
                and len(value) <= len(str(top))
                and int(value) <= top
            ):
                raise invalid(name, f"must be a whole number from 1 to {top_text}")
            number = int(value)
            filters[
                {"after": "before_id", "limit": "limit", "player": "user_id", "game": "game_id"}[
                    name
                ]
            ] = number
        elif name in AUDIT_FILTERS:
            if "\x00" in value:  # no actor or action holds one, and PostgreSQL's text cannot
                raise invalid(name, "must not contain a NUL character")
            filters[AUDIT_FILTERS[name]] = value
        else:
            raise invalid(
                name, "is not a parameter of /v1/audit (after, limit, player, game, action, actor)"
            )
    limit = filters.setdefault("limit", 100)
    records = app.store.audit_records(**filters)
    next_cursor = str(records[-1].id) if len(records) == limit else None
    return Response(200, {"records": [r.as_json() for r in records], "next": next_cursor})


# -- webhook subscriptions (docs/admin-api.md, "Webhooks")
# ------------------------------------------

WEBHOOK = rf"/v1/webhooks/(?P<webhook_id>{_ID[1:-1]})"


def webhook_json(hook: Webhook) -> dict:
    return {
        "id": hook.id,
        "url": hook.url,
        "events": list(hook.events),
        "game_id": hook.game_id,
        "created_at": at_ms(hook.created_at),
    }


def delivery_json(d: Delivery) -> dict:
    return {
        "id": d.id,
        "event_id": d.event_id,
        "event_type": d.event_type,
        "user_id": d.user_id,
        "state": d.state,
        "created_at": at_ms(d.created_at),
        "next_at": at_ms(d.next_at) if d.state == "pending" else None,
        "done_at": at_ms(d.done_at),
        "last_status": d.last_status,
        "last_error": d.last_error,
        "attempts": [
            {
                "n": a.n,
                "at": at_ms(a.at),
                "status": a.status,
                "error": a.error,
                "duration_ms": a.duration_ms,
            }
            for a in d.tries
        ],
    }


@route(r"/v1/webhooks", "POST", "webhooks:write")
def add_webhook(app: AdminApp, req: Request) -> Response:
    """The secret is in this answer only."""
    url = field(req.body, "url", str)
    events = req.body.get("events") if req.body else None
    if not isinstance(events, list):
        raise invalid("/events", "must be a list of event types")
    game_id = req.body.get("game_id") if req.body else None
    if game_id is not None and type(game_id) is not int:
        raise invalid("/game_id", "must be a whole number or null")
    hook, secret = webhooks_ops.add_webhook(
        app.store,
        req.ctx,
        url,
        events,
        game_id,
        app.settings.webhook_allow_hosts,
        app.settings.max_webhooks,
    )
    return Response(201, webhook_json(hook) | {"secret": secret})


@route(r"/v1/webhooks", "GET", "webhooks:read")
def list_webhooks(app: AdminApp, req: Request) -> Response:
    return Response(
        200, {"webhooks": [webhook_json(h) for h in webhooks_ops.list_webhooks(app.store)]}
    )


@route(WEBHOOK, "GET", "webhooks:read")
def get_webhook(app: AdminApp, req: Request) -> Response:
    return Response(
        200, webhook_json(webhooks_ops.get_webhook(app.store, req.params["webhook_id"]))
    )


@route(WEBHOOK, "DELETE", "webhooks:write")
def remove_webhook(app: AdminApp, req: Request) -> Response:
    """No new deliveries; the pending ones fail."""
    webhooks_ops.remove_webhook(app.store, req.ctx, req.params["webhook_id"])
    return Response(200, {"id": req.params["webhook_id"], "deleted": True})


@route(WEBHOOK + "/deliveries", "GET", "webhooks:read")
def deliveries(app: AdminApp, req: Request) -> Response:
    """Oldest first, ``limit`` a page (default 100); ``next`` is the ``after`` of the next page,
    null at the end."""
    try:
        query = dict(urllib.parse.parse_qsl(req.query, keep_blank_values=True, errors="strict"))
    except UnicodeDecodeError:
        raise BadRequest("the query string is not valid UTF-8") from None
    numbers = {"after": 0, "limit": 100}
    for name, value in query.items():
        if name in numbers:
            page = webhooks_ops.MAX_DELIVERY_PAGE
            top, top_text = (page, str(page)) if name == "limit" else (MAX_ID, "2^63-1")
            if not (
                value.isascii()
                and value.isdigit()
                and value[0] != "0"
                and len(value) <= len(str(top))
                and int(value) <= top
            ):
                raise invalid(name, f"must be a whole number from 1 to {top_text}")
            numbers[name] = int(value)
        elif name != "state":
            raise invalid(name, "is not a parameter of this path (state, limit, after)")
    found = webhooks_ops.webhook_deliveries(
        app.store, req.params["webhook_id"], query.get("state"), numbers["limit"], numbers["after"]
    )
    next_cursor = str(found[-1].id) if len(found) == numbers["limit"] else None
    return Response(200, {"deliveries": [delivery_json(d) for d in found], "next": next_cursor})


@route(WEBHOOK + "/deliveries/retry", "POST", "webhooks:write")
def retry_deliveries(app: AdminApp, req: Request) -> Response:
    """After a receiver's outage: the webhook's pending and failed deliveries (``state``: only
    those) due now."""
    try:
        query = dict(urllib.parse.parse_qsl(req.query, keep_blank_values=True, errors="strict"))
    except UnicodeDecodeError:
        raise BadRequest("the query string is not valid UTF-8") from None
    for name in query:
        if name != "state":
            raise invalid(name, "is not a parameter of this path (state)")
    count = webhooks_ops.retry_deliveries(
        app.store, req.ctx, req.params["webhook_id"], query.get("state")
    )
    return Response(200, {"webhook_id": req.params["webhook_id"], "due_now": count})


@route(WEBHOOK + rf"/deliveries/(?P<delivery_id>{_ID[1:-1]})/retry", "POST", "webhooks:write")
def retry_delivery(app: AdminApp, req: Request) -> Response:
    """A failed delivery pending again, due now."""
    return Response(
        200,
        delivery_json(
            webhooks_ops.retry_delivery(
                app.store, req.ctx, req.params["webhook_id"], req.params["delivery_id"]
            )
        ),
    )
