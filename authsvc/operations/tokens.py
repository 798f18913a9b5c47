"""A player's token, minted for a game and recorded as ``token.mint`` (never the token): who could
log in as this player has an answer (docs/admin.md, "The audit trail").
"""

from __future__ import annotations

from authsvc.errors import NotFound
from authsvc.names import check_game_id, check_user_id
from authsvc.operations.context import Context
from authsvc.store.base import Player, Store
from authsvc.tokens import (
    mint_token,
)


def mint(
    store: Store, ctx: Context, secret: bytes, game_id: int, user_id: int
) -> tuple[str, Player]:
    """The token the service accepts now for this enabled game and enabled player, and the player;
    recorded as token.mint. The epoch is read under the writer lock and recorded in the same
    transaction, so no revoke falls between: the token is never of an epoch revoked before the
    answer."""
    check_game_id(game_id)
    check_user_id(user_id)
    with store.write(ctx.audit()) as tx:
        game = tx.game(game_id)
        player = tx.player(user_id)
        if game is None or not game.enabled:
            raise NotFound(f"no enabled game {game_id}")
        if player is None or not player.enabled:
            raise NotFound(f"no enabled player {user_id}")
        tx.record(
            "token.mint", game_id=game.id, user_id=player.user_id, after={"epoch": player.epoch}
        )
    return mint_token(secret, game.id, player.user_id, player.epoch), player
