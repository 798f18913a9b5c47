"""The use case: three parameters in, a verified player or an error code out.

Rules (docs/api.md): any parameter missing or empty -> 400; anything present but
wrong -> 403; all three right -> the player. The store is asked once, and does
the same work whether or not the key and the player exist (docs/stores.md); the
token HMAC is computed either way, so the time of a 403 tells neither
(tests/test_equal_work.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import NamedTuple

from authsvc.http import Param, error_object, json_bytes, success_bytes
from authsvc.store.base import Credentials, Store
from authsvc.tokens import TokenVerifier, api_key_digest

MISSING_DESCRIPTION = "user_id, game_auth_token, and api_key are required parameters"
INVALID_DESCRIPTION = "Invalid credentials"
MAX_USER_ID = 2**63 - 1


class Result(NamedTuple):
    """Either a player (error is None) or an error code of docs/api.md (400, 403), and its JSON body."""

    error: int | None
    body: bytes


MISSING = Result(400, json_bytes(error_object(400, MISSING_DESCRIPTION)))
FORBIDDEN = Result(403, json_bytes(error_object(403, INVALID_DESCRIPTION)))
NOTHING_FOUND = Credentials(game_id=0, game_enabled=False, key_expires_at=None, username=None, epoch=0,
                            player_enabled=False)


def parse_user_id(value: object) -> int | None:
    """A canonical decimal 1..2^63-1 ('7', not '07', '+7', ' 7' or '7.0'); else None."""
    if type(value) is not str or not 0 < len(value) < 20 or not value.isascii() or not value.isdigit():
        return None
    if value[0] == "0":
        return None
    number = int(value)
    return number if number <= MAX_USER_ID else None


class Authenticator:
    def __init__(self, store: Store, token_secrets: tuple[bytes, ...], clock: Callable[[], float] = time.time):
        self.store = store
        self.tokens = TokenVerifier(token_secrets)
        self.clock = clock

    def __call__(self, params: Mapping[str, Param]) -> Result:
        raw_user_id = params.get("user_id")
        token = params.get("game_auth_token")
        api_key = params.get("api_key")
        if not raw_user_id or not token or not api_key:  # absent, "" or JSON null
            return MISSING
        user_id = parse_user_id(raw_user_id)
        if user_id is None or not isinstance(token, str) or not isinstance(api_key, str):  # INVALID: undecodable
            return FORBIDDEN

        # Placeholder game 0 / epoch 0 keep the HMAC work the same when no key was found.
        game_id, game_enabled, expires_at, username, epoch, player_enabled = (
            self.store.credentials(api_key_digest(api_key), user_id) or NOTHING_FOUND
        )
        if (
            self.tokens.matches(game_id, user_id, epoch, token)
            and game_enabled
            and username is not None
            and player_enabled
            and (expires_at is None or expires_at > self.clock())
        ):
            return Result(None, success_bytes(user_id, username))
        return FORBIDDEN
