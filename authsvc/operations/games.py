"""Games and their api keys: add, list, enable or disable, rotate the key (docs/admin.md;
docs/tokens.md).
"""

from __future__ import annotations

import math

from authsvc.errors import Invalid, NotFound
from authsvc.names import check_game_id, check_game_name
from authsvc.operations.context import MAX_OLD_KEY_TTL, Context
from authsvc.store.base import Game, Store
from authsvc.tokens import (
    api_key_digest,
    new_api_key,
)


def add_game(store: Store, ctx: Context, name: str) -> tuple[Game, str]:
    """A new game and its first api key: (game, api key). The key is shown once, stored as its
    digest."""
    name = check_game_name(name)
    api_key = new_api_key()
    with store.write(ctx.audit()) as tx:
        game = tx.add_game(name, api_key_digest(api_key), ctx.now())
    return game, api_key


def list_games(store: Store) -> list[Game]:
    return store.list_games()


def set_game_enabled(store: Store, ctx: Context, game_id: int, enabled: bool) -> None:
    with store.write(ctx.audit()) as tx:
        found = tx.set_game_enabled(check_game_id(game_id), enabled)
    if not found:
        raise NotFound(f"no game {game_id}")


def check_old_key_ttl(old_key_ttl: int) -> None:
    if type(old_key_ttl) is not int or not 0 <= old_key_ttl <= MAX_OLD_KEY_TTL:
        raise Invalid(
            f"must be from 0 to {MAX_OLD_KEY_TTL} seconds (ten years)", field="/old_key_ttl"
        )


def rotate_game_key(store: Store, ctx: Context, game_id: int, old_key_ttl: int) -> tuple[str, int]:
    """A new api key for the game; its older keys expire ``old_key_ttl`` seconds from now, to the
    millisecond (docs/tokens.md): (key, that time rounded up to the whole second, as shown)."""
    check_game_id(game_id)
    check_old_key_ttl(old_key_ttl)
    api_key = new_api_key()
    at = round(ctx.clock(), 3)
    expires_at = at + old_key_ttl
    with store.write(ctx.audit()) as tx:
        added = tx.add_api_key(game_id, api_key_digest(api_key), int(at), expires_at)
    if not added:
        raise NotFound(f"no game {game_id}")
    return api_key, math.ceil(expires_at)
