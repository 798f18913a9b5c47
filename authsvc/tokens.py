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

_BLOCK = 64  # SHA-256 block size, bytes


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

    HMAC-SHA256 as RFC 2104 defines it and the stdlib's pure-Python ``hmac`` path
    computes it (copy the inner and outer hash states, feed the message), with
    each secret's two padded key blocks hashed once, here, instead of on every
    call as hmac.new/hmac.digest do; that was more than half of the token check
    (BENCHMARKS.md). tests/test_tokens.py checks it against hmac.new for secrets
    shorter than, equal to and longer than a block.
    """

    __slots__ = ("_pads",)

    def __init__(self, token_secrets: tuple[bytes, ...]):
        pads = []
        for secret in token_secrets:
            if len(secret) > _BLOCK:
                secret = hashlib.sha256(secret).digest()
            secret = secret.ljust(_BLOCK, b"\0")
            # RFC 2104's ipad and opad, computed here: hmac's own tables (trans_36) are not its public API.
            pads.append((hashlib.sha256(bytes(b ^ 0x36 for b in secret)), hashlib.sha256(bytes(b ^ 0x5C for b in secret))))
        self._pads = tuple(pads)

    def __repr__(self) -> str:
        return f"<TokenVerifier: {len(self._pads)} secret(s), masked>"

    def matches(self, game_id: int, user_id: int, epoch: int, token: str) -> bool:
        """True if ``token`` was minted for (game, user, epoch) with any of the secrets.

        Every secret is tried, always, so the work does not depend on which one
        matches; callers pass placeholder ids when the player or game is unknown
        so that the work does not depend on that either.
        """
        message = f"{game_id}:{user_id}:{epoch}".encode("ascii")
        given = token if token.isascii() else "?"  # compare_digest takes ASCII str only
        ok = False
        for inner_pad, outer_pad in self._pads:
            inner = inner_pad.copy()
            inner.update(message)
            outer = outer_pad.copy()
            outer.update(inner.digest())
            ok |= hmac.compare_digest(outer.hexdigest(), given)
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
