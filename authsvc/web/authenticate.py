"""The use case: three parameters in, a verified player or an error of the model out.

Rules (docs/api.md): any parameter missing or empty -> 400 (MissingCredentials);
anything present but wrong -> 403 (InvalidCredentials); all three right -> the
player. The store is asked once, and does
the same work whether or not the key and the player exist (docs/stores.md); the
token HMAC is computed either way, so the time of a 403 tells neither
(tests/functional/test_equal_work.py). A refusal also computes the token of the next epoch,
either way; only a token that matches it (minted after a change the store's answer
predates) has the store asked again, for the latest commit (docs/stores.md,
"A token minted after a change").

Every answer also carries an internal reason (SUCCESS, UNKNOWN_KEY, ...) for the
logs and metrics (docs/logs.md), never for the client: it is read off the one
row the store returned, with comparisons only; the player's checks are all made
and their reason is one lookup in a table (``player_reasons``), so no branch
tells whether the player exists.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable, Mapping

from authsvc.errors import Error, InvalidCredentials, MissingCredentials
from authsvc.store.base import Credentials, Reader
from authsvc.tokens import SecretFile, TokenVerifier, api_key_digest
from authsvc.web.http import Param, success_bytes

MAX_USER_ID = 2**63 - 1

# Reasons, in the order they are decided (docs/logs.md). STORE_UNAVAILABLE and WAITED_TOO_LONG are
# the app's (503s).
SUCCESS = "success"
MISSING_PARAMETERS = "missing_parameters"
MALFORMED = "malformed"
UNKNOWN_KEY = "unknown_key"
EXPIRED_KEY = "expired_key"
GAME_DISABLED = "game_disabled"
UNKNOWN_PLAYER = "unknown_player"
PLAYER_DISABLED = "player_disabled"
WRONG_TOKEN = "wrong_token"
STORE_UNAVAILABLE = "store_unavailable"
WAITED_TOO_LONG = "waited_too_long"  # shed before any store work (authsvc/web/queueing.py)
REASONS = (
    SUCCESS,
    MISSING_PARAMETERS,
    MALFORMED,
    UNKNOWN_KEY,
    EXPIRED_KEY,
    GAME_DISABLED,
    UNKNOWN_PLAYER,
    PLAYER_DISABLED,
    WRONG_TOKEN,
    STORE_UNAVAILABLE,
    WAITED_TOO_LONG,
)


# What an authentication returns: (error, body, reason, game_id, user_id). Either a player (error
# None) and the success's JSON body, or the refusal of docs/api.md (MissingCredentials,
# InvalidCredentials), returned rather than raised: the game door's table (authsvc/web/answers.py)
# gives its body. ``reason`` says why, for logs and metrics only; ``game_id`` is the game of the api
# key (None when no game has it) and ``user_id`` the parsed user id (None unless canonical). A plain
# tuple, unpacked at once by the app: a NamedTuple's constructor is a Python call, about 3,000
# instructions of each authentication (docs/design.md, "Performance").
Result = tuple[type[Error] | None, bytes, str, int | None, int | None]


MISSING: Result = (MissingCredentials, b"", MISSING_PARAMETERS, None, None)
MALFORMED_RESULT: Result = (InvalidCredentials, b"", MALFORMED, None, None)
# api keys whose digests an Authenticator keeps: a few per game, and each game's servers send one
KEY_DIGESTS = 64
NOTHING_FOUND = Credentials(
    game_id=0, game_enabled=False, key_expires_at=None, username=None, epoch=0, player_enabled=False
)


def parse_user_id(value: object) -> int | None:
    """A canonical decimal 1..2^63-1 ('7', not '07', '+7', ' 7' or '7.0'); else None."""
    if (
        type(value) is not str
        or not 0 < len(value) < 20
        or not value.isascii()
        or not value.isdigit()
    ):
        return None
    if value[0] == "0":
        return None
    number = int(value)
    return number if number <= MAX_USER_ID else None


def player_reasons() -> dict[tuple[bool, ...], str]:
    """The reason for each combination of the player's checks (no such player, player disabled,
    wrong token; True: failed): the first that failed, in docs/logs.md's order, else SUCCESS.

    A table, so the reason is one lookup whichever failed, instead of a chain of tests that
    stops earlier for a missing player than for one that exists.
    """
    checks = (UNKNOWN_PLAYER, PLAYER_DISABLED, WRONG_TOKEN)
    return {
        failed: next((reason for reason, no in zip(checks, failed, strict=True) if no), SUCCESS)
        for failed in itertools.product((False, True), repeat=3)
    }


class Authenticator:
    def __init__(
        self,
        store: Reader,
        token_secrets: tuple[bytes, ...] | SecretFile,
        clock: Callable[[], float] = time.time,
    ):
        self.store = store
        self.tokens = TokenVerifier(token_secrets)
        # The digests of the last KEY_DIGESTS keys sent: a game server sends its one key on every
        # request, and its SHA-256 was about 6,000 instructions of each (BENCHMARKS.md,
        # "Internals"). The work depends on the text sent, never on whether the store has that key
        # (tests/functional/test_equal_work.py).
        self.key_digest = functools.lru_cache(maxsize=KEY_DIGESTS)(api_key_digest)
        self.clock = clock
        self.player_reasons = player_reasons()

    def __call__(self, params: Mapping[str, Param]) -> Result:
        raw_user_id = params.get("user_id")
        token = params.get("game_auth_token")
        api_key = params.get("api_key")
        if not raw_user_id or not token or not api_key:  # absent, "" or JSON null
            return MISSING
        user_id = parse_user_id(raw_user_id)
        if (
            user_id is None or not isinstance(token, str) or not isinstance(api_key, str)
        ):  # INVALID: undecodable
            return MALFORMED_RESULT

        # Placeholder game 0 / epoch 0 keep the HMAC work the same when no key was found.
        game_id, game_enabled, expires_at, username, epoch, player_enabled = (
            self.store.credentials(self.key_digest(api_key), user_id) or NOTHING_FOUND
        )
        token_ok = self.tokens.matches(game_id, user_id, epoch, token)
        # Comparisons only (no call but the clock, as before, for a key with an expiry),
        # so the work stays the same for any key and player (tests/functional/test_equal_work.py).
        if not game_id:  # ids start at 1: 0 is the placeholder of an unknown key
            reason = UNKNOWN_KEY
        elif expires_at is not None and expires_at <= self.clock():
            reason = EXPIRED_KEY
        elif not game_enabled:
            reason = GAME_DISABLED
        else:
            # The player's three checks are all made, and looked up together: no branch tells
            # whether the player exists (``username is not None`` again only on success, for mypy).
            reason = self.player_reasons[username is None, not player_enabled, not token_ok]
            if reason is SUCCESS and username is not None:
                return None, success_bytes(user_id, username), SUCCESS, game_id, user_id
        # Refused. Was the token minted after a change the store's answer predates (a snapshot up to
        # AUTHSVC_MAX_STALENESS old)? The epoch the next change gives: a revoke's e + 1, a signup's
        # the missing player's placeholder epoch (0, or on a SQLite snapshot a deleted id's epoch +
        # 1). One MAC more on every refusal after the store, whatever the key and player, so its
        # time still tells neither; none on success.
        ahead = epoch + (username is not None)
        if self.tokens.matches(game_id, user_id, ahead, token) and game_id:
            return self.look_again(api_key, user_id, ahead)
        return InvalidCredentials, b"", reason, game_id or None, user_id

    def look_again(self, api_key: str, user_id: int, epoch: int) -> Result:
        """The answer from the latest commit (``fresh_credentials``) for a token of ``epoch``:
        accepted if the player is there, enabled, at that epoch, with the key usable. Only a token
        minted with a secret leads here (one the service's own would accept a moment later, or a
        secret holder's ahead of any change), so bad tokens make no extra store work. The lookahead
        is one epoch: a token of e + 2 (two revokes since the data) waits, as every other change
        does, for the bound."""
        game_id, game_enabled, expires_at, username, now_epoch, player_enabled = (
            self.store.fresh_credentials(self.key_digest(api_key), user_id) or NOTHING_FOUND
        )
        if not game_id:
            reason = UNKNOWN_KEY
        elif expires_at is not None and expires_at <= self.clock():
            reason = EXPIRED_KEY
        elif not game_enabled:
            reason = GAME_DISABLED
        else:
            reason = self.player_reasons[username is None, not player_enabled, now_epoch != epoch]
            if reason is SUCCESS and username is not None:
                return None, success_bytes(user_id, username), SUCCESS, game_id, user_id
        return InvalidCredentials, b"", reason, game_id or None, user_id
