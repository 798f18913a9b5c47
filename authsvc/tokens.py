"""game_auth_token and api_key: minting, verifying, digests.

token = lowercase hex of HMAC-SHA256(secret, "<game id>:<user id>:<credential epoch>")
(docs/tokens.md). Tokens need no storage: bumping a player's epoch revokes them all.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import secrets
import time
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from authsvc.errors import ConfigError, NotFound, StoreUnavailable
from authsvc.loglines import LogThrottle
from authsvc.settings import TokenSecrets, load_token_secrets

if TYPE_CHECKING:
    from authsvc.store.base import Player, Store

log = logging.getLogger("authsvc")

# What a secret's fingerprint is the HMAC of: it names the secret in the store without revealing it.
FINGERPRINT_LABEL = b"authsvc token secret fingerprint"
RELOAD_WARNING_INTERVAL = 60.0  # seconds between two lines about a secret file that cannot be taken


def fingerprint(secret: bytes) -> str:
    """What the store keeps of a token secret (docs/tokens.md, "Rotation"): HMAC-SHA256 of a fixed
    label under the secret. Whoever reads the store learns nothing that mints a token."""
    return hmac.new(secret, FINGERPRINT_LABEL, hashlib.sha256).hexdigest()


def check_known(token_secrets: tuple[bytes, ...], known: Mapping[str, int], path: str) -> None:
    """ConfigError unless some secret of the file at ``path`` is one the store was used with. A
    store that knows none yet (migrated from before fingerprints: `authsvc init` adopts the file's)
    is not judged."""
    if known and not any(fingerprint(secret) in known for secret in token_secrets):
        raise ConfigError(
            f"token secret file {path} holds none of the secrets this store was used with: every "
            f"token would be refused; restore {path} from its backup copy "
            "(docs/operations.md section 21)"
        )


class SecretFile:
    """The token secret file as a running process sees it: the secrets it had at start, re-read when
    the file changes (its inode, size, mtime or ctime), which is looked at most once per
    ``interval`` (AUTHSVC_MAX_STALENESS): one stat a second per worker, and a clock read per call.

    A file that cannot be read, or holds none of the secrets the store knows (``known``), is not
    taken: the process keeps the secrets it has, says so in the log, and looks again a second later.
    """

    def __init__(
        self,
        path: str,
        token_secrets: tuple[bytes, ...],
        known: Callable[[], Mapping[str, int]],
        interval: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.path = path
        self._secrets = TokenSecrets(token_secrets)
        self._known = known
        self._interval = interval
        self._monotonic = monotonic
        self._next = monotonic() + interval
        self._stamp: tuple[int, ...] | None = (
            None  # the first look re-reads the file: it may have changed since
        )
        self._keyed = keyed(self._secrets)
        self._warnings = LogThrottle(RELOAD_WARNING_INTERVAL, monotonic)

    def __repr__(self) -> str:
        return f"<SecretFile {self.path}: {len(self._secrets)} secret(s), masked>"

    def _stat(self) -> tuple[int, ...] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def current(self) -> TokenSecrets:
        """The secrets, current (the one to mint with) first."""
        if self._monotonic() >= self._next:
            self._look()
        return self._secrets

    def keyed(self) -> tuple[hmac.HMAC, ...]:
        """An HMAC keyed with each secret, in the order of ``current()``: what TokenVerifier
        copies."""
        if self._monotonic() >= self._next:
            self._look()
        return self._keyed

    def _look(self) -> None:
        """Once per interval: re-read the file if it changed."""
        self._next = self._monotonic() + self._interval
        stamp = self._stat()
        if stamp != self._stamp and stamp is not None:
            self._reload(stamp)

    def _reload(self, stamp: tuple[int, ...]) -> None:
        try:
            found = load_token_secrets(self.path)
            if (
                found == self._secrets
            ):  # touched or copied, not changed (the first look after start, mostly)
                self._stamp = stamp
                return
            check_known(found, self._known(), self.path)
        except (ConfigError, StoreUnavailable) as e:
            if self._warnings.allow() is not None:
                log.error("%s: kept the token secrets it had", str(e).splitlines()[0])
            return  # the stamp stays: looked at again after the interval
        self._secrets, self._stamp, self._keyed = found, stamp, keyed(found)
        log.info("token secret file %s re-read: %d secret(s)", self.path, len(found))


def keyed(token_secrets: tuple[bytes, ...]) -> tuple[hmac.HMAC, ...]:
    """An HMAC-SHA256 keyed with each secret and fed nothing: hmac's copy() of one costs less than a
    new one (the key's pads hashed again), measured in BENCHMARKS.md, "Internals"."""
    return tuple(hmac.new(secret, digestmod=hashlib.sha256) for secret in token_secrets)


def mint_token(secret: bytes, game_id: int, user_id: int, epoch: int) -> str:
    message = f"{game_id}:{user_id}:{epoch}".encode("ascii")
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def current_token(store: Store, secret: bytes, game_id: int, user_id: int) -> tuple[str, Player]:
    """The token the service accepts now for this game and player (their current epoch), and the
    player.

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

    hmac's public API: each secret's HMAC keyed once (``keyed``), then per token a copy() fed the
    message. hmac.digest, OpenSSL's one-shot HMAC, keys it again on every call: 1.4 times the
    instructions of a copy (BENCHMARKS.md, "Internals").
    """

    __slots__ = ("_keyed",)

    def __init__(self, token_secrets: tuple[bytes, ...] | SecretFile):
        """``token_secrets``: fixed, or a SecretFile (re-read when the file changes,
        docs/tokens.md)."""
        if isinstance(token_secrets, SecretFile):
            self._keyed = token_secrets.keyed
        else:
            fixed = keyed(token_secrets)
            self._keyed = lambda: fixed

    def __repr__(self) -> str:
        return f"<TokenVerifier: {len(self._keyed())} secret(s), masked>"

    def matches(self, game_id: int, user_id: int, epoch: int, token: str) -> bool:
        """True if ``token`` was minted for (game, user, epoch) with any of the secrets.

        Every secret is tried, always, so the work does not depend on which one
        matches; callers pass placeholder ids when the player or game is unknown
        so that the work does not depend on that either.
        """
        message = f"{game_id}:{user_id}:{epoch}".encode("ascii")
        given = token if token.isascii() else "?"  # compare_digest takes ASCII str only
        ok = False
        for secret_mac in self._keyed():
            mac = secret_mac.copy()
            mac.update(message)
            ok |= hmac.compare_digest(mac.hexdigest(), given)
        return ok


def new_api_key() -> str:
    """A random UUID-shaped key (122 random bits from the OS), shown once."""
    return str(uuid.uuid4())


def new_webhook_secret() -> str:
    """A webhook's signing secret as Standard Webhooks spells it: ``whsec_`` and 32 random bytes in
    base64."""
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
