"""game_auth_token and api_key: minting, verifying, digests.

token = lowercase hex of HMAC-SHA256(secret, "<game id>:<user id>:<credential epoch>")
(docs/tokens.md). Tokens need no storage: bumping a player's epoch revokes them all.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid

TOKEN_LENGTH = 64


def mint_token(secret: bytes, game_id: int, user_id: int, epoch: int) -> str:
    message = f"{game_id}:{user_id}:{epoch}".encode("ascii")
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def token_matches(token_secrets: tuple[bytes, ...], game_id: int, user_id: int, epoch: int, token: str) -> bool:
    """True if ``token`` was minted with any of ``token_secrets``.

    Every secret is tried, always, so the work does not depend on which one
    matches; callers pass placeholder ids when the player or game is unknown so
    that the work does not depend on that either.
    """
    message = f"{game_id}:{user_id}:{epoch}".encode("ascii")
    given = token.encode("ascii", "replace")
    ok = False
    for secret in token_secrets:
        expected = hmac.new(secret, message, hashlib.sha256).hexdigest().encode("ascii")
        ok |= hmac.compare_digest(expected, given)
    return ok


def new_api_key() -> str:
    """A random UUID-shaped key (122 random bits from the OS), shown once."""
    return str(uuid.uuid4())


def api_key_digest(api_key: str) -> str:
    """What the store keeps of a key: hex SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(api_key.encode("utf-8", "surrogateescape")).hexdigest()


def new_token_secret() -> str:
    """A fresh token secret: 64 hex characters (256 bits)."""
    return secrets.token_hex(32)
