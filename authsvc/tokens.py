"""game_auth_token and api_key: minting, verifying, digests.

token = lowercase hex of HMAC-SHA256(secret, "<game id>:<user id>:<credential epoch>")
(docs/tokens.md). Tokens need no storage: bumping a player's epoch revokes them all.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import uuid
from typing import TYPE_CHECKING

from authsvc.errors import NotFound

if TYPE_CHECKING:
    from authsvc.store.base import Player, Store

def mint_token(secret: bytes, game_id: int, user_id: int, epoch: int) -> str:
    message = f"{game_id}:{user_id}:{epoch}".encode("ascii")
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def current_token(store: Store, secret: bytes, game_id: int, user_id: int) -> tuple[str, Player]:
    """The token the service accepts now for this game and player (their current epoch), and the player.

    The one place the admin side mints from the store: ``authsvc token issue`` and
    ``authsvc check``. NotFound (authsvc/errors.py) names a game or player the store lacks.
    """
    game = store.get_game(game_id)
    player = store.get_player(user_id)
    if game is None:
        raise NotFound(f"no game {game_id}")
    if player is None:
        raise NotFound(f"no player {user_id}")
    return mint_token(secret, game.id, player.user_id, player.epoch), player


class TokenVerifier:
    """Checks a token against every token secret (current first), in constant work.

    hmac.digest, OpenSSL's one-shot HMAC. Hashing each secret's key pads once instead
    saved 0.7 to 2.4 % of a request's instructions, too little for a hand-written HMAC
    (BENCHMARKS.md, "Internals").
    """

    __slots__ = ("_secrets",)

    def __init__(self, token_secrets: tuple[bytes, ...]):
        self._secrets = tuple(token_secrets)

    def __repr__(self) -> str:
        return f"<TokenVerifier: {len(self._secrets)} secret(s), masked>"

    def matches(self, game_id: int, user_id: int, epoch: int, token: str) -> bool:
        """True if ``token`` was minted for (game, user, epoch) with any of the secrets.

        Every secret is tried, always, so the work does not depend on which one
        matches; callers pass placeholder ids when the player or game is unknown
        so that the work does not depend on that either.
        """
        message = f"{game_id}:{user_id}:{epoch}".encode("ascii")
        given = token if token.isascii() else "?"  # compare_digest takes ASCII str only
        ok = False
        for secret in self._secrets:
            ok |= hmac.compare_digest(hmac.digest(secret, message, hashlib.sha256).hex(), given)
        return ok


def new_api_key() -> str:
    """A random UUID-shaped key (122 random bits from the OS), shown once."""
    return str(uuid.uuid4())


def new_webhook_secret() -> str:
    """A webhook's signing secret as Standard Webhooks spells it: ``whsec_`` and 32 random bytes in base64."""
    return "whsec_" + base64.b64encode(os.urandom(32)).decode("ascii")


def api_key_digest(api_key: str) -> str:
    """What the store keeps of a key: hex SHA-256 of its UTF-8 bytes.

    Defined for every str: a lone surrogate, which UTF-8 cannot encode, is
    encoded as its three bytes ("surrogatepass"), so no input raises here.
    Keys the service issues are ASCII (UUIDs); their digests are unchanged.
    """
    return hashlib.sha256(api_key.encode("utf-8", "surrogatepass")).hexdigest()


def new_token_secret() -> str:
    """A fresh token secret: 64 hex characters (256 bits)."""
    return secrets.token_hex(32)
