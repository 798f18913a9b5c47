"""``authsvc explain``: why a request would fail, or that it succeeds, in one line.

What support staff run with what a game's developer sent them (docs/admin.md)::

    authsvc explain -                      # paste the request URL (or its query string) on stdin
    authsvc explain request.txt            # or give a file holding it
    authsvc explain --game-id 7 --user-id 1001 --token-file -   # the token on stdin

Like ``authsvc check``, it takes the request, the token and the api key from stdin
or a file only, never from the command line, where every local user can read them
(``ps``): a request, ``--token`` or ``--api-key`` there is refused (exit 2) in a line
that does not repeat it.

The reason is the service's own (the authenticator's, on the same store:
docs/logs.md, "Why a login failed"); for ``wrong_token`` it goes on to say which
token it is: this player's for another game, one of an earlier credential epoch
(revoked), one made with a secret no longer in the secret file (given with
``--retired-secret-file``), or none of these. It never prints an api key, a token
or a secret. Standard library only.
"""

from __future__ import annotations

import argparse
import dataclasses
import hmac
import re
import sys
import time

from authsvc import times
from authsvc.errors import CommandError
from authsvc.names import shown
from authsvc.settings import Settings, load_token_secrets
from authsvc.store import open_store
from authsvc.store.base import Game, Store
from authsvc.tokens import api_key_digest, mint_token
from authsvc.web import authenticate as auth
from authsvc.web.http import INVALID, parse_urlencoded

TOKEN_SHAPE = re.compile(r"[0-9a-f]{64}")
EARLIER_EPOCHS = 1000  # how many earlier credential epochs a wrong token is tried against


@dataclasses.dataclass
class Verdict:
    reason: str
    detail: str
    game_id: int | None = None
    user_id: int | None = None

    def line(self) -> str:
        return f"{self.reason}: {self.detail}"

    def json(self) -> dict:
        return dataclasses.asdict(self)


def _when(seconds: int, now: float) -> str:
    stamp = times.utc(seconds * 1000, millis=False, sep=" ", zone=" UTC")
    ago = int(now - seconds)
    return f"{stamp} ({_span(ago)} ago)" if ago >= 0 else f"{stamp} (in {_span(-ago)})"


def _span(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _game_name(game: Game) -> str:
    return f"game {game.id} ({shown(game.name)})"


def _matches(secrets, game_id: int, user_id: int, epoch: int, token: str) -> int | None:
    """The index of the secret that made ``token`` for (game, user, epoch), or None."""
    if not token.isascii():  # compare_digest takes ASCII str only; no token is other text
        return None
    for index, secret in enumerate(secrets):
        if hmac.compare_digest(mint_token(secret, game_id, user_id, epoch), token):
            return index
    return None


def explain(
    store: Store,
    secrets,
    params: dict,
    *,
    game_id: int | None = None,
    retired=(),
    now: float | None = None,
) -> Verdict:
    """The verdict for ``params`` (user_id, game_auth_token, api_key as the service reads them);
    ``game_id`` stands in for the api key when support staff do not have the key."""
    now = time.time() if now is None else now
    raw_user, token, api_key = (
        params.get("user_id"),
        params.get("game_auth_token"),
        params.get("api_key"),
    )
    if not raw_user or not token or (not api_key and game_id is None):
        missing = [
            n
            for n, v in (("user_id", raw_user), ("game_auth_token", token), ("api_key", api_key))
            if not v
        ]
        if game_id is not None:
            missing.remove("api_key")
        return Verdict(
            auth.MISSING_PARAMETERS, f"{', '.join(missing)} missing or empty (error 400)"
        )
    user_id = auth.parse_user_id(raw_user)
    if user_id is None:
        return Verdict(
            auth.MALFORMED, "user_id is not a canonical decimal from 1 to 2^63-1 (error 403)"
        )
    if token is INVALID or (api_key is INVALID and game_id is None):
        what = "game_auth_token" if token is INVALID else "api_key"
        return Verdict(
            auth.MALFORMED,
            f"{what} is not valid percent-encoding or UTF-8 (error 403)",
            None,
            user_id,
        )
    if not isinstance(
        token, str
    ):  # INVALID was answered above; this tells the type checker, and stays under -O
        raise TypeError("game_auth_token is not text")

    games = {g.id: g for g in store.list_games()}
    if game_id is None:
        if not isinstance(api_key, str):  # likewise
            raise TypeError("api_key is not text")
        digest = api_key_digest(api_key)
        owner = next(((g, k) for g in games.values() for k in g.keys if k.digest == digest), None)
        if owner is None:
            return Verdict(auth.UNKNOWN_KEY, "no game has this api key (error 403)", None, user_id)
        game, key = owner
        # The service's own verdict: (error, body, reason, game, user).
        _, _, reason, _, _ = auth.Authenticator(store, secrets, lambda: now)(params)
        if reason == auth.EXPIRED_KEY and key.expires_at is not None:
            newest = max(game.keys, key=lambda k: k.created_at)
            return Verdict(
                reason,
                f"this api key of {_game_name(game)} expired at {_when(key.expires_at, now)}; "
                f"the game's newest key was made at {_when(newest.created_at, now)} (error 403)",
                game.id,
                user_id,
            )
    else:
        found = games.get(game_id)
        if found is None:
            return Verdict(auth.UNKNOWN_KEY, f"no game {game_id} (error 403)", None, user_id)
        game = found
        reason = ""
    player = store.get_player(user_id)
    where = f"{_game_name(game)}, user {user_id}"
    if (
        reason == auth.EXPIRED_KEY
    ):  # no expiry stored, yet expired: cannot be, but say it as the service does
        return Verdict(reason, f"{where}: the api key has expired (error 403)", game.id, user_id)
    if not game.enabled:
        return Verdict(
            auth.GAME_DISABLED, f"{_game_name(game)} is disabled (error 403)", game.id, user_id
        )
    if player is None:
        return Verdict(
            auth.UNKNOWN_PLAYER, f"{where}: no such player (error 403)", game.id, user_id
        )
    if not player.enabled:
        return Verdict(
            auth.PLAYER_DISABLED, f"{where}: the player is disabled (error 403)", game.id, user_id
        )
    index = _matches(secrets, game.id, user_id, player.epoch, token)
    if index is not None:
        older = " (made with an older secret still in the secret file)" if index else ""
        return Verdict(
            auth.SUCCESS, f"{where}: succeeds as {shown(player.username)}{older}", game.id, user_id
        )
    return Verdict(
        auth.WRONG_TOKEN,
        f"{where}: {_which_token(secrets, retired, games, game, player, token)} (error 403)",
        game.id,
        user_id,
    )


def _which_token(secrets, retired, games: dict[int, Game], game: Game, player, token: str) -> str:
    if not TOKEN_SHAPE.fullmatch(token):
        return (
            "not a token at all: tokens are 64 lowercase hex characters, this one has "
            f"{len(token)} characters"
        )
    user_id, epoch = player.user_id, player.epoch
    for other in games.values():
        if other.id != game.id and _matches(secrets, other.id, user_id, epoch, token) is not None:
            return f"a token of this player for {_game_name(other)}, not for this game"
    for earlier in range(epoch - 1, max(-1, epoch - 1 - EARLIER_EPOCHS), -1):
        if _matches(secrets, game.id, user_id, earlier, token) is not None:
            return (
                f"a token of credential epoch {earlier}, revoked: the player is at epoch {epoch} "
                "(a revoke or password change since); the game must fetch the player's new token"
            )
    retired = [s for s in retired if s not in set(secrets)]
    for candidate in range(epoch, max(-1, epoch - 1 - EARLIER_EPOCHS), -1):
        if _matches(retired, game.id, user_id, candidate, token) is not None:
            return (
                "a token made with a token secret no longer in the secret file (epoch "
                f"{candidate}); the platform must give the player a token made with the current "
                "secret"
            )
    tried = "retired secrets given" if retired else "no retired secret file given"
    return (
        "simply wrong: not this player's token for any game, any of its last "
        f"{min(epoch, EARLIER_EPOCHS) + 1} epoch(s) or any secret in the secret file ({tried})"
    )


def parse_request(text: str) -> dict:
    """A pasted request URL, or its query string, as the service reads the query string."""
    text = text.strip()
    if "?" in text:
        text = text.split("?", 1)[1]
    return parse_urlencoded(text.split("#", 1)[0])


STDIN = "-"
_LOOKS_LIKE_A_REQUEST = ("?", "=", "&")


def _request_source(value: str) -> str:
    """The REQUEST argument: '-' or a file name, never the request itself."""
    if value != STDIN and (any(c in value for c in _LOOKS_LIKE_A_REQUEST) or "://" in value):
        raise argparse.ArgumentTypeError(
            "a request on the command line is seen by every local user (ps): paste it on stdin "
            "with 'authsvc explain -', or give a file holding it"
        )
    return value


class RefusedSecret(argparse.Action):
    """--token and --api-key (here and in `authsvc check`): refused whatever their value, which the
    message never repeats."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(
            f"{option_string} on the command line is seen by every local user (ps): "
            f"use {option_string}-file FILE, or {option_string}-file - to read it from stdin"
        )


def add_arguments(parser) -> None:
    parser.add_argument(
        "request",
        nargs="?",
        type=_request_source,
        metavar="REQUEST_FILE",
        help="a file holding the request URL or query string as sent; '-' reads it from stdin",
    )
    parser.add_argument(
        "--game-id", type=int, metavar="GAME_ID", help="the game, when the api key is not at hand"
    )
    parser.add_argument(
        "--user-id", metavar="USER_ID", help="the user id (overrides the request's)"
    )
    parser.add_argument(
        "--token-file", metavar="FILE", help="a file holding the game_auth_token; '-' reads stdin"
    )
    parser.add_argument(
        "--api-key-file", metavar="FILE", help="a file holding the api key; '-' reads stdin"
    )
    parser.add_argument("--token", "--api-key", action=RefusedSecret, help=argparse.SUPPRESS)
    parser.add_argument(
        "--retired-secret-file",
        action="append",
        default=[],
        metavar="FILE",
        help="an old token secret file (a backup): says when a token was made with a removed "
        "secret",
    )


def _read(path: str, what: str, *, first_line: bool) -> str:
    """The text of ``path`` ('-': stdin), or its first line (a token or a key, as `authsvc check`
    reads them)."""
    try:
        if path == STDIN:
            return sys.stdin.readline() if first_line else sys.stdin.read()
        with open(path, encoding="utf-8") as f:
            return f.readline() if first_line else f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise CommandError(
            f"cannot read the {what} file {path}: {getattr(e, 'strerror', None) or 'not UTF-8'}"
        ) from None


def cmd_explain(args, settings: Settings) -> tuple[int, dict, str]:
    """The `authsvc explain` subcommand: (exit status, the verdict as an object, its line).

    The status is 0 whatever the verdict: a request that would fail is an answer, not an error."""
    if not settings.token_secrets:
        raise CommandError(f"no token secret at {settings.token_secret_file}")
    sources = [s for s in (args.request, args.token_file, args.api_key_file) if s is not None]
    if sources.count(STDIN) > 1:
        raise CommandError(
            "only one of REQUEST_FILE, --token-file and --api-key-file can be '-' (stdin)"
        )
    params: dict = (
        parse_request(_read(args.request, "request", first_line=False)) if args.request else {}
    )
    if args.user_id is not None:
        params["user_id"] = args.user_id
    for name, path, what in (
        ("game_auth_token", args.token_file, "token"),
        ("api_key", args.api_key_file, "api key"),
    ):
        if path is not None:
            params[name] = _read(path, what, first_line=True).strip()
    retired: list[bytes] = []
    for path in args.retired_secret_file:
        retired.extend(load_token_secrets(path))
    # SQLite without a snapshot: the file as it is now. PostgreSQL reads the server's latest anyway,
    # and a standby keeps the settings' bound, which its start-up check holds to what the heartbeat
    # can meet.
    if settings.store.lower().startswith("sqlite:"):
        settings = dataclasses.replace(settings, max_staleness=0.0)
    store = open_store(settings.store, readonly=True, settings=settings)
    try:
        store.check()
        verdict = explain(
            store, tuple(settings.token_secrets), params, game_id=args.game_id, retired=retired
        )
    finally:
        store.close()
    return 0, verdict.json(), verdict.line()
