"""The operations layer: one function per admin write (and the reads beside them), for every front door.

The admin command (authsvc/admin/command.py) parses arguments, calls one of these and prints
the result; the admin API will do the same over HTTP (docs/admin.md). Each
function validates its input once (authsvc/names.py's rules, the TTL cap here),
takes a ``Context`` (who acts, which request, a clock) and raises only typed
errors of authsvc/errors.py, worded for neither front door (NotFound, Conflict,
PreconditionFailed, Invalid naming its ``field``), and the store's StoreLocked /
StoreUnavailable / ConfigError; each front door maps them once. Every write is one transaction of the
store (``store.write``, authsvc/store/writes.py), its audit record inside it: what a
write reads to decide (If-Match, a mint's epoch) is what it acts on. Secrets made here
(a new api key, a token) are returned to the caller to show once, never recorded.

Minting a token changes nothing, but hands out a credential: it is recorded too,
as ``token.mint`` with the game, the player and the epoch (never the token), so
"who could log in as this player" has an answer (docs/admin.md, "The audit trail").
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import hashlib
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence

from authsvc.admin import api_tokens, batch, transfer
from authsvc.admin.players_import import import_rows
from authsvc.admin.put_player import Condition, check_if_match, check_if_none_match
from authsvc.errors import (
    ConfigError,
    Conflict,
    Invalid,
    NotFound,
)
from authsvc.names import MAX_ID, check_game_id, check_game_name, check_user_id, check_username
from authsvc.settings import (
    MAX_STALENESS_BOUND,
    Settings,
    TokenSecrets,
    admin_actor,
    default,
    host_list,
    load_token_secrets,
)
from authsvc.store import base, open_store
from authsvc.store.audit import Audit, Record
from authsvc.store.base import Game, Player, Store
from authsvc.store.events import DELIVERY_STATES, EVENT_TYPES, Delivery, Webhook
from authsvc.store.sqlite.store import SQLiteStore
from authsvc.tokens import (
    api_key_digest,
    check_known,
    fingerprint,
    mint_token,
    new_api_key,
    new_token_secret,
    new_webhook_secret,
)
from authsvc.webhooks.target import check_url

# Keys retired by rotate-key expire within ten years: now + TTL stays a 64-bit number on both engines.
MAX_OLD_KEY_TTL = 10 * 365 * 86400
MAX_REQUEST_ID = 200  # characters


@dataclasses.dataclass(frozen=True)
class Context:
    """Who acts (``cli:<login>``, ``api:<token name>``), for which request (the service's id, and the id the
    client sent, if any: kept beside it in each record), and the clock to stamp with."""

    actor: str
    request_id: str | None = None
    clock: Callable[[], float] = time.time
    client_request_id: str | None = None

    def __post_init__(self) -> None:
        if not self.actor or not self.actor.isprintable():
            raise Invalid("the actor must be a non-empty printable name")
        for rid in (self.request_id, self.client_request_id):
            if rid is not None and (not rid.isprintable() or len(rid) > MAX_REQUEST_ID):
                raise Invalid(f"a request id must be at most {MAX_REQUEST_ID} printable characters")

    def now(self) -> int:
        return int(self.clock())

    def audit(self, **detail) -> Audit:
        """The store's Audit for one write; ``detail``: non-secret facts for the record (a file's SHA-256),
        and the client's request id."""
        if self.client_request_id is not None:
            detail["client_request_id"] = self.client_request_id
        return Audit(self.actor, self.request_id, None, tuple(sorted(detail.items())), self.clock)


def command_context() -> Context:
    """The admin command's context: the person running it (settings.admin_actor), no request id."""
    return Context(actor=admin_actor())


class admin_store:
    """``with admin_store(settings) as store``: an admin (read-write) store, closed afterwards."""

    def __init__(self, settings: Settings, *, check: bool = True):
        self.store: Store = open_store(settings.store, readonly=False, settings=settings)
        self.check = check

    def __enter__(self) -> Store:
        if self.check:  # a store that is missing or not migrated: say so, in one line
            try:
                self.store.check()
            except ConfigError:
                self.store.close()
                raise
        return self.store

    def __exit__(self, *exc) -> None:
        self.store.close()


# -- games ----------------------------------------------------------------------------------


def add_game(store: Store, ctx: Context, name: str) -> tuple[Game, str]:
    """A new game and its first api key: (game, api key). The key is shown once, stored as its digest."""
    name = check_game_name(name)
    api_key = new_api_key()
    try:
        game = store.add_game(name, api_key_digest(api_key), ctx.now(), audit=ctx.audit())
    except base.Conflict as e:
        raise Conflict(str(e)) from None
    return game, api_key


def list_games(store: Store) -> list[Game]:
    return store.list_games()


def set_game_enabled(store: Store, ctx: Context, game_id: int, enabled: bool) -> None:
    if not store.set_game_enabled(check_game_id(game_id), enabled, audit=ctx.audit()):
        raise NotFound(f"no game {game_id}")


def check_old_key_ttl(old_key_ttl: int) -> None:
    if type(old_key_ttl) is not int or not 0 <= old_key_ttl <= MAX_OLD_KEY_TTL:
        raise Invalid(f"must be from 0 to {MAX_OLD_KEY_TTL} seconds (ten years)", field="/old_key_ttl")


def rotate_game_key(store: Store, ctx: Context, game_id: int, old_key_ttl: int) -> tuple[str, int]:
    """A new api key for the game; its older keys expire ``old_key_ttl`` seconds from now, to the millisecond
    (docs/tokens.md): (key, that time rounded up to the whole second, as shown)."""
    check_game_id(game_id)
    check_old_key_ttl(old_key_ttl)
    api_key = new_api_key()
    at = round(ctx.clock(), 3)
    expires_at = at + old_key_ttl
    try:
        added = store.add_api_key(game_id, api_key_digest(api_key), int(at), expires_at, audit=ctx.audit())
    except base.Conflict as e:
        raise Conflict(str(e)) from None
    if not added:
        raise NotFound(f"no game {game_id}")
    return api_key, math.ceil(expires_at)


# -- players --------------------------------------------------------------------------------


def add_player(store: Store, ctx: Context, user_id: int, username: str) -> Player:
    check_user_id(user_id)
    username = check_username(username)
    try:
        return store.add_player(user_id, username, audit=ctx.audit())
    except base.Conflict as e:
        raise Conflict(str(e)) from None


def updated_at(player: Player) -> str | None:
    """When the player's row last changed, as the admin API and the command show it: RFC 3339 UTC with
    milliseconds (``2026-11-24T08:00:00.250Z``); None for a row unchanged since the schema step (not known)."""
    return at_ms(player.updated_at_ms)


def at_ms(ms: int | None) -> str | None:
    """Unix milliseconds as the admin API and the command show them: RFC 3339 UTC with milliseconds."""
    if ms is None:
        return None
    return datetime.datetime.fromtimestamp(ms // 1000, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def get_player(store: Store, user_id: int) -> Player:
    player = store.get_player(check_user_id(user_id))
    if player is None:
        raise NotFound(f"no player {user_id}")
    return player


def rename_player(store: Store, ctx: Context, user_id: int, username: str) -> str:
    check_user_id(user_id)
    username = check_username(username)
    if not store.rename_player(user_id, username, audit=ctx.audit()):
        raise NotFound(f"no player {user_id}")
    return username


def set_player_enabled(store: Store, ctx: Context, user_id: int, enabled: bool) -> None:
    if not store.set_player_enabled(check_user_id(user_id), enabled, audit=ctx.audit()):
        raise NotFound(f"no player {user_id}")


def revoke_player(store: Store, ctx: Context, user_id: int) -> int:
    """Bump the player's credential epoch (every token stops working); returns the new epoch."""
    epoch = store.revoke_player(check_user_id(user_id), audit=ctx.audit())
    if epoch is None:
        raise NotFound(f"no player {user_id}")
    return epoch


def delete_player(store: Store, ctx: Context, user_id: int, if_match: Condition | None = None) -> int:
    """Delete the player and erase its names (docs/admin.md, "Erasure"); returns the epoch it had.

    NotFound if there is no such player (If-Match or not: RFC 9110 ignores a precondition of a request
    that would fail without it); PreconditionFailed if If-Match names no current version. Every token of
    the player is refused from then on, and the same id signed up again starts past that epoch. One
    transaction (store/writes.py's delete_player): what else a deletion writes later joins it."""
    check_user_id(user_id)
    with store.write(ctx.audit()) as tx:
        current = tx.player(user_id)
        if current is None:
            raise NotFound(f"no player {user_id}")
        check_if_match(if_match, user_id, current)
        epoch = tx.delete_player(user_id)
    return current.epoch if epoch is None else epoch


def import_players(
    store: Store, ctx: Context, data: bytes, progress: Callable[[int], None] | None = None
) -> int:
    """Insert or rename players from a CSV or JSON-lines file's bytes, all or nothing; one audit record
    for the batch (its row count and the file's SHA-256). A bad row raises Invalid (RowError)."""
    audit = ctx.audit(file_sha256=hashlib.sha256(data).hexdigest())
    try:
        return store.upsert_players(import_rows(data), progress=progress, audit=audit)
    except base.Conflict as e:
        raise Invalid(str(e)) from None


# -- tokens ---------------------------------------------------------------------------------


def mint(store: Store, ctx: Context, secret: bytes, game_id: int, user_id: int) -> tuple[str, Player]:
    """The token the service accepts now for this enabled game and enabled player, and the player;
    recorded as token.mint. The epoch is read under the writer lock and recorded in the same
    transaction, so no revoke falls between: the token is never of an epoch revoked before the answer."""
    check_game_id(game_id)
    check_user_id(user_id)
    with store.write(ctx.audit()) as tx:
        game = tx.game(game_id)
        player = tx.player(user_id)
        if game is None or not game.enabled:
            raise NotFound(f"no enabled game {game_id}")
        if player is None or not player.enabled:
            raise NotFound(f"no enabled player {user_id}")
        tx.record("token.mint", game_id=game.id, user_id=player.user_id, after={"epoch": player.epoch})
    return mint_token(secret, game.id, player.user_id, player.epoch), player


# -- whole stores ---------------------------------------------------------------------------


def export_store(store: Store, path: str) -> tuple[int, int]:
    """Write the store to a new file (a read: no audit record); returns (games, players)."""
    try:
        return transfer.export_store(store, path)
    except transfer.TransferError as e:
        raise Invalid(str(e)) from None


def import_store(store: Store, ctx: Context, path: str) -> tuple[int, int]:
    """Load an export file into an empty store, all or nothing; one audit record (counts, the file's SHA-256)."""
    try:
        with open(path, "rb") as f:
            sha256 = hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        sha256 = None  # transfer.import_store names the problem
    try:
        return transfer.import_store(store, path, audit=ctx.audit(file_sha256=sha256))
    except transfer.TransferError as e:
        raise Invalid(str(e)) from None


def initialize(settings: Settings, ctx: Context, *, new_secret: bool = False) -> tuple[int, int, str]:
    """``authsvc init``: create or migrate the store, then settle the token secret file against the store's
    fingerprints (authsvc/tokens.py); returns (schema version before, after, what became of the secret):

    - "kept": the file holds a secret the store knows; a file that holds none is refused (ConfigError);
    - "adopted": a store from before fingerprints (none recorded): the file's secrets are recorded;
    - "created": no file and no player: a new secret (mode 0600), recorded;
    - "new": ``new_secret``, said in words: a new secret replaces the file and every recorded one, and
      every token issued before is refused. Without it, a missing file of a store with players is
      refused (Invalid): restore it from its backup copy.

    Setting a store up (the migration, the first secret, the adopted ones) writes no audit record; a new
    secret that replaces the recorded ones (``new_secret``) has one."""
    store_context = admin_store(settings, check=False)  # a bad AUTHSVC_STORE stops here, before any file is made
    path = settings.token_secret_file
    with store_context as store:
        if isinstance(store, SQLiteStore):  # the file's directory may not exist yet
            os.makedirs(os.path.dirname(os.path.abspath(store.path)), exist_ok=True)
        before, after = store.migrate()
        present = os.path.exists(path)
        with store.write(ctx.audit()) as tx:
            known = tx.token_secrets()
            if new_secret or not present:
                if not new_secret and tx.any_player():
                    raise Invalid(f"token secret file {path} is missing and the store has players: restore it "
                                  "from its backup copy (a new secret would refuse every token issued; "
                                  "'authsvc init --new-secret' makes one all the same)")
                secret = new_token_secret().encode("ascii")
                tx.record_token_secrets([fingerprint(secret)], "token_secret.new" if new_secret else None, replace=True)
                os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o700, exist_ok=True)
                write_secret_file(path, [secret])
                return before, after, "new" if new_secret else "created"
            found = load_token_secrets(path)
            if not known:
                tx.record_token_secrets([fingerprint(s) for s in found], None)
                return before, after, "adopted"
            check_known(found, known, path)
    return before, after, "kept"


# -- the token secret file ------------------------------------------------------------------

# How long `authsvc secret rotate` waits between adding the new secret as a non-first line and making it
# the one minted with: every running process re-reads the file within AUTHSVC_MAX_STALENESS (at most
# 1 s), so a token minted with the new secret is accepted everywhere (docs/design.md, "Freshness").
ROTATE_SETTLE = 2 * MAX_STALENESS_BOUND


def write_secret_file(path: str, token_secrets: Sequence[bytes]) -> None:
    """Replace the secret file at once (a new file renamed over it): mode 0600, its owner and group kept.
    A reader sees the old file or the new one, never a part."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        old = os.stat(path)
    except FileNotFoundError:
        old = None
    except OSError as e:
        raise Invalid(f"cannot read token secret file {path}: {e.strerror}") from None
    try:
        fd, temp = tempfile.mkstemp(prefix=".token-secret.", dir=directory)
    except OSError as e:
        raise Invalid(f"cannot write a file in {directory} (for {path}): {e.strerror}; the secret's "
                      "directory must be writable by the user the command runs as (docs/operations.md)") from None
    try:
        os.fchmod(fd, 0o600)
        if old is not None and (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
            os.fchown(fd, old.st_uid, old.st_gid)
        os.write(fd, b"".join(s + b"\n" for s in token_secrets))
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(temp, path)
    except OSError as e:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise Invalid(f"cannot write token secret file {path}: {e.strerror}") from None
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def _secret_file_lock(path: str) -> Iterator[None]:
    """One `authsvc secret` at a time on a file: a lock on its directory (the file itself is replaced)."""
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _known_secrets(store: Store, path: str) -> tuple[TokenSecrets, dict[str, int]]:
    """The file's secrets, re-read now, and the store's fingerprints; ConfigError if the file holds none of them."""
    found = load_token_secrets(path)
    known = store.token_secrets()
    check_known(found, known, path)
    return found, known


def token_secrets(store: Store, settings: Settings) -> TokenSecrets:
    """The secrets the admin command mints and checks with: a missing file, or one that holds none of the
    secrets the store knows, is an error naming the file and its backup copy, never a token no one accepts."""
    path = settings.token_secret_file
    if not settings.token_secrets:
        with store.write() as tx:  # the writer lock: whether a player exists is read once
            players = tx.any_player()
        raise ConfigError(
            f"no token secret at {path}: "
            + ("restore it from its backup copy (a new secret would refuse every token issued)" if players
               else "run 'authsvc init' to create one"))
    check_known(settings.token_secrets, store.token_secrets(), path)
    return settings.token_secrets


def rotate_token_secret(store: Store, ctx: Context, path: str, settle: float = ROTATE_SETTLE) -> int:
    """``authsvc secret rotate``: a new secret, recorded in the store, then added to the file as its last
    line (accepted, not minted with), and after ``settle`` seconds (every running process has re-read the
    file) made its first (minted with). The older ones stay, accepted, until ``retire``. Returns how many
    older secrets the file keeps."""
    with _secret_file_lock(path):
        found, _ = _known_secrets(store, path)
        secret = new_token_secret().encode("ascii")
        with store.write(ctx.audit()) as tx:
            tx.record_token_secrets([fingerprint(secret)], "token_secret.rotate")
        write_secret_file(path, [*found, secret])
        time.sleep(settle)
        write_secret_file(path, [secret, *found])
    return len(found)


def retire_token_secrets(store: Store, ctx: Context, path: str) -> int:
    """``authsvc secret retire``: keep only the file's first secret (the one minted with), in the file and
    in the store: the tokens minted with the others are refused within AUTHSVC_MAX_STALENESS. Returns how
    many were retired."""
    with _secret_file_lock(path):
        found, known = _known_secrets(store, path)
        if fingerprint(found[0]) not in known:
            raise Invalid(f"the first secret of {path} is not one the store knows: retiring the others would "
                          "leave none; run 'authsvc secret rotate' instead of editing the file")
        older = found[1:]
        if older:
            write_secret_file(path, found[:1])
        with store.write(ctx.audit()) as tx:
            tx.record_token_secrets([], "token_secret.retire", drop=[fingerprint(s) for s in older])
    return len(older)


def list_token_secrets(store: Store, path: str) -> list[dict]:
    """The file's secrets in order, as their fingerprints' first 12 characters (never a secret), and when
    the store recorded each (unix seconds; None: unknown to the store)."""
    found = load_token_secrets(path)
    known = store.token_secrets()
    rows = []
    for i, secret in enumerate(found):
        fp = fingerprint(secret)
        rows.append({"position": i + 1, "minted_with": i == 0, "fingerprint": fp[:12],
                     "recorded_at": None if fp not in known else known[fp] // 1000})
    return rows


def backup(store: Store, path: str) -> None:
    """``authsvc backup``: a SQLite store copied to a new file (a read: no audit record; the copy holds the trail)."""
    if not isinstance(store, SQLiteStore):
        raise Invalid("backup copies a SQLite store; back up PostgreSQL with pg_dump (docs/operations.md)")
    store.backup(path)


# -- the audit trail ------------------------------------------------------------------------


def audit_prune(store: Store, ctx: Context, before_ms: int) -> Record:
    """Delete the records older than ``before_ms``; the prune's own record names the new anchor."""
    if before_ms > round(ctx.clock() * 1000):
        raise Invalid("must not be in the future", field="/before")
    return store.audit_prune(before_ms, audit=ctx.audit())


# -- webhook subscriptions (store/events.py, authsvc/webhooks/target.py) ------------------------

MAX_DELIVERY_PAGE = 500


def _id(value: int, what: str, field: str | None = None) -> int:
    if type(value) is not int or not 1 <= value <= MAX_ID:
        raise Invalid(f"{what} must be a whole number from 1 to 2^63-1", field=field)
    return value


def check_webhook_request(url: str, events: list[str], game_id: int | None, allow_hosts: str) -> tuple[str, ...]:
    """The rules of a new subscription but the game's existence; returns its event types, sorted, once each."""
    check_url(url, host_list(allow_hosts))
    if not isinstance(events, list) or not events or not all(isinstance(e, str) for e in events):
        raise Invalid(f"must list one or more event types, from: {', '.join(EVENT_TYPES)}", field="/events")
    unknown = sorted(set(events) - set(EVENT_TYPES))
    if unknown:
        raise Invalid(f"has an unknown event type; the types are: {', '.join(EVENT_TYPES)}", field="/events")
    if game_id is not None:
        _id(game_id, "a game id", "/game_id")
    return tuple(sorted(set(events)))


def add_webhook(store: Store, ctx: Context, url: str, events: list[str], game_id: int | None,
                allow_hosts: str, max_webhooks: int = default("max_webhooks")) -> tuple[Webhook, str]:
    """A new subscription: (webhook, secret). The secret is shown once; its record holds the URL, never it.
    At most ``max_webhooks`` (AUTHSVC_MAX_WEBHOOKS) live ones, counted under the writer lock: each is a
    POST of every event it is subscribed to, kept for the retention."""
    chosen = check_webhook_request(url, events, game_id, allow_hosts)
    secret = new_webhook_secret()
    with store.write(ctx.audit()) as tx:
        if game_id is not None and tx.game(game_id) is None:
            raise Invalid(f"no game {game_id}", field="/game_id")
        if (live := tx.webhook_count()) >= max_webhooks:
            raise Conflict(f"the store has {live} webhooks, its limit (AUTHSVC_MAX_WEBHOOKS): remove one first")
        return tx.add_webhook(url, chosen, game_id, secret), secret


def list_webhooks(store: Store) -> list[Webhook]:
    return store.webhooks()


def get_webhook(store: Store, webhook_id: int) -> Webhook:
    found = store.webhooks(_id(webhook_id, "a webhook id"))
    if not found:
        raise NotFound(f"no webhook {webhook_id}")
    return found[0]


def remove_webhook(store: Store, ctx: Context, webhook_id: int) -> Webhook:
    """The subscription ends: no new deliveries, its pending ones fail ("webhook removed")."""
    with store.write(ctx.audit()) as tx:
        hook = tx.remove_webhook(_id(webhook_id, "a webhook id"))
    if hook is None:
        raise NotFound(f"no webhook {webhook_id}")
    return hook


def webhook_deliveries(store: Store, webhook_id: int, state: str | None = None, limit: int = 100,
                       after: int = 0) -> list[Delivery]:
    """A page of the webhook's deliveries, oldest first, each with its attempts; a removed webhook's too,
    until retention deletes them (and then its row)."""
    if not store.webhooks(_id(webhook_id, "a webhook id"), removed=True):
        raise NotFound(f"no webhook {webhook_id}")
    if state is not None and state not in DELIVERY_STATES:
        raise Invalid(f"must be one of: {', '.join(DELIVERY_STATES)}", field="state")
    return store.deliveries(webhook_id, state=state, limit=limit, after=after)


def retry_delivery(store: Store, ctx: Context, webhook_id: int, delivery_id: int) -> Delivery:
    """A failed delivery sent again: pending, due now, its 24 hours of attempts starting again."""
    with store.write(ctx.audit()) as tx:
        if tx.webhook(_id(webhook_id, "a webhook id")) is None:
            raise NotFound(f"no webhook {webhook_id}")
        current = tx.delivery(webhook_id, _id(delivery_id, "a delivery id"))
        if current is None:
            raise NotFound(f"no delivery {delivery_id} of webhook {webhook_id}")
        retried = tx.retry_delivery(webhook_id, delivery_id)
    if retried is None:
        raise Conflict(f"delivery {delivery_id} is {current.state}: only a failed one is sent again")
    return retried


# The states of the deliveries that ``retry_deliveries`` makes due now.
RETRY_STATES = ("pending", "failed")


def retry_deliveries(store: Store, ctx: Context, webhook_id: int, state: str | None = None) -> int:
    """After a receiver's outage: the webhook's pending deliveries (``state`` "pending"), its failed ones
    ("failed"), or both (None) due now; how many were made so."""
    if state is not None and state not in RETRY_STATES:
        raise Invalid(f"must be one of: {', '.join(RETRY_STATES)}", field="state")
    with store.write(ctx.audit()) as tx:
        hook = tx.webhook(_id(webhook_id, "a webhook id"))
        if hook is None:
            raise NotFound(f"no webhook {webhook_id}")
        return tx.retry_deliveries(hook, RETRY_STATES if state is None else (state,))


# -- the admin API's bearer tokens (authsvc/admin/api_tokens.py) ------------------------------


def check_api_token_request(name: str, scopes: list[str], expires_in: int | None) -> tuple[str, ...]:
    """The rules of ``api-token add``, checked before the store is opened; returns the scopes, sorted, once each."""
    if not isinstance(name, str) or not api_tokens.NAME.fullmatch(name):
        raise Invalid("a token name is 1 to 64 ASCII letters, digits, '.', '_' or '-'")
    unknown = sorted(set(scopes) - set(api_tokens.SCOPES))
    if unknown or not scopes:
        raise Invalid(f"must be given once or more, from: {', '.join(api_tokens.SCOPES)}", field="/scope")
    if expires_in is not None and (type(expires_in) is not int or not 1 <= expires_in <= MAX_OLD_KEY_TTL):
        raise Invalid(f"must be from 1 to {MAX_OLD_KEY_TTL} seconds (ten years)", field="/expires_in")
    return tuple(s for s in api_tokens.SCOPES if s in scopes)


def add_api_token(
    store: Store, ctx: Context, name: str, scopes: list[str], expires_in: int | None = None
) -> tuple[api_tokens.ApiToken, str]:
    """A new admin API token: (its row, the token). The token is shown once, stored as its SHA-256 digest."""
    chosen = check_api_token_request(name, scopes, expires_in)
    token = api_tokens.new_token()
    now = ctx.now()
    with store.write(ctx.audit()) as tx:
        row = tx.add_api_token(name, api_tokens.digest(token), chosen, now,
                               None if expires_in is None else now + expires_in)
    if row is None:
        raise Conflict(f"an api token named {name!r} exists (names are never reused)")
    return row, token


def list_api_tokens(store: Store) -> list[api_tokens.ApiToken]:
    return store.api_tokens()


def revoke_api_token(store: Store, ctx: Context, name: str) -> api_tokens.ApiToken:
    """The token stops working at once: the admin API looks every request's token up in the store."""
    with store.write(ctx.audit()) as tx:
        row = tx.revoke_api_token(name, ctx.now())
    if row is None:
        raise NotFound(f"no api token {name!r}")
    return row


def api_token_for(store: Store, token: str, now: int) -> api_tokens.ApiToken | None:
    """The live token row a bearer token stands for, else None (unknown, expired or revoked: all the same 401).
    A read: it never waits for a writer (an import holding the writer lock)."""
    if not api_tokens.well_formed(token):
        return None
    row = store.api_token_by_digest(api_tokens.digest(token))
    return row if row is not None and row.live(now) else None


def put_player(
    store: Store, ctx: Context, user_id: int, username: str, enabled: bool = True,
    if_match: Condition | None = None, if_none_match: Condition | None = None,
) -> tuple[Player, bool]:
    """Create or update a player (the admin API's PUT): (player, created). If-Match and If-None-Match (as
    authsvc/admin/put_player.py reads them) make it conditional: PreconditionFailed when If-Match names
    no current version, or when the player exists and If-None-Match is ``*`` (the create-only signup)
    or names its version. The checks and the change are one transaction: of two signups of one new
    player, one creates it and the other finds it (or, create-only, gets PreconditionFailed). A PUT
    that changes nothing writes nothing: the answer is the player as it was."""
    check_user_id(user_id)
    username = check_username(username)
    enabled = bool(enabled)
    with store.write(ctx.audit()) as tx:
        current = tx.player(user_id)
        check_if_match(if_match, user_id, current)  # RFC 9110 13.2.2: If-Match first
        check_if_none_match(if_none_match, user_id, current)
        if current is None:
            return tx.add_player(user_id, username, enabled), True
        if username != current.username:
            tx.rename_player(user_id, username)
        if enabled != current.enabled:
            tx.set_player_enabled(user_id, enabled)
        return tx.player(user_id) or current, False


def batch_players(store: Store, ctx: Context, items: list[batch.Item], dry_run: bool, invalid: int,
                  body: dict) -> dict[int, str]:
    """Create or update many players (the admin API's batch): each one's status by user id. One
    transaction and one audit record (the counts, the SHA-256 of the canonical body with its names sealed:
    batch.sealed_digest); none on a dry run, nor when nothing changes."""
    with store.write(ctx.audit()) as tx:
        current = tx.players_now([item.user_id for item in items])
        status = {item.user_id: batch.status_of(current.get(item.user_id), item) for item in items}
        changed = [(i.user_id, i.username, i.enabled) for i in items if status[i.user_id] != "unchanged"]
        if not dry_run and changed:
            counts = {name: sum(1 for s in status.values() if s == name) for name in batch.STATUSES[:3]}
            digest = batch.sealed_digest(body, items, tx.player_keys([item.user_id for item in items]))
            tx.write_players(changed, "player.batch", counts | {"error": invalid, "sealed_body_sha256": digest})
    return status
