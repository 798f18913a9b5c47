"""The use case: three parameters in, a verified player or an error code out.

Rules (spec §4, DESIGN §2): any parameter missing or empty -> 400; anything
present but wrong -> 403; all three right -> the player. The store is asked once;
the token HMAC is computed whether or not the game and player exist.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

from authsvc.http import INVALID
from authsvc.store.base import Store
from authsvc.tokens import api_key_digest, token_matches

MISSING_DESCRIPTION = "user_id, game_auth_token, and api_key are required parameters"
INVALID_DESCRIPTION = "Invalid credentials"
MAX_USER_ID = 2**63 - 1


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """Either a player (error is None) or an error code of the spec (400, 403)."""

    error: int | None = None
    user_id: int | None = None
    username: str | None = None

    def as_json_object(self) -> dict:
        if self.error is None:
            return {"success": True, "user_id": self.user_id, "username": self.username}
        description = MISSING_DESCRIPTION if self.error == 400 else INVALID_DESCRIPTION
        return {"success": False, "error": self.error, "error_description": description}


MISSING = Result(error=400)
FORBIDDEN = Result(error=403)


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
        self.token_secrets = token_secrets
        self.clock = clock

    def __call__(self, params: Mapping[str, object]) -> Result:
        raw_user_id = params.get("user_id")
        token = params.get("game_auth_token")
        api_key = params.get("api_key")
        if not raw_user_id or not token or not api_key:  # absent, "" or JSON null
            return MISSING
        user_id = parse_user_id(raw_user_id)
        if user_id is None or token is INVALID or api_key is INVALID:
            return FORBIDDEN

        found = self.store.credentials(api_key_digest(api_key), user_id)
        # Placeholder game 0 / epoch 0 keep the HMAC work the same when nothing was found.
        game_id = found.game_id if found else 0
        epoch = found.epoch if found else 0
        token_ok = token_matches(self.token_secrets, game_id, user_id, epoch, token)
        if (
            token_ok
            and found is not None
            and found.game_enabled
            and found.username is not None
            and found.player_enabled
            and (found.key_expires_at is None or found.key_expires_at > self.clock())
        ):
            return Result(user_id=user_id, username=found.username)
        return FORBIDDEN
