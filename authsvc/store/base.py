"""The Store contract, in two: Reader, what the web process reads, and Store, what the admin side
writes.

Both engines implement it (SQLiteReader and PostgresReader in sqlite/reader.py and
postgres/reader.py, which the web process opens through store/readers.py; SQLiteStore
and PostgresStore in sqlite/store.py and postgres/store.py extend them with the writes) and pass
the same contract tests (tests/store/test_store_contract.py). A Reader (``credentials``,
``fresh_credentials``, ``check``, ``close``, ``list_games``; on SQLite also
``journal_mode_warning``) has no method that writes, so the web process holds no object that can.
``SQLiteStore.backup`` (``authsvc backup``) exists on SQLite only.

Writes. ``Store.write(audit)`` opens one write transaction (store/writes.py's Tx, the
only place the admin side's statements are written) and is the one way to write: every
change is a method of that transaction, and a write made while one is open on the
thread joins it. Each change writes one audit record (store/audit.py) in its
transaction: a failed write writes none. The audit, an Audit (actor, request id,
clock), has a default, so test fixtures and benchmarks that seed a store stay short,
but the trail is never skipped: a write without one is recorded with the actor
"unattributed". The operations layer (authsvc/operations/) always passes one.

Errors. Besides what a method's docstring names (Conflict, NotEmpty), every
method raises only these, from authsvc/errors.py, each with a one-line message
that never holds a password:

- ``check``: ConfigError when the store is missing, unreachable, unreadable, or
  not at this release's schema version (the start-up and admin-command gate).
- every other method: StoreUnavailable when the store is missing, unreachable
  or unreadable (SQLite "file is not a database", a PostgreSQL server that is
  down); its subclass StoreLocked when another session held the lock a write
  needs for longer than ADMIN_LOCK_WAIT seconds; its subclass StoreFull when
  the disk (SQLITE_FULL, PostgreSQL disk_full) is full. A failed write has
  written nothing. ConfigError when the role may not write (PostgreSQL).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Collection, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, NamedTuple

from authsvc.errors import Conflict

if TYPE_CHECKING:
    from authsvc.store.audit import Audit, Chain, Record
    from authsvc.store.deliveries import Due, Outcome
    from authsvc.store.events import Delivery, Webhook
    from authsvc.store.writes import Tx


class Credentials(NamedTuple):
    """Everything one authentication needs, fetched in one round trip.

    A named tuple, so an engine can hand over its result row as it is
    (``Credentials._make(row)``): SQLite's flags are 0 or 1, PostgreSQL's bools.
    """

    game_id: int
    game_enabled: bool
    key_expires_at: float | None  # unix seconds, to the millisecond; None = no expiry
    username: str | None  # None = no such player
    epoch: int  # 0 when there is no such player
    player_enabled: bool  # false when there is no such player


@dataclasses.dataclass(frozen=True, slots=True)
class ApiKey:
    digest: str
    created_at: int
    expires_at: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class Game:
    id: int
    name: str
    enabled: bool
    created_at: int
    keys: tuple[ApiKey, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Player:
    user_id: int
    username: str
    epoch: int
    enabled: bool
    # When the row last changed (added, renamed, enabled or disabled, revoked), in unix
    # milliseconds: the time of that write's audit record. None for a row no write has changed since
    # the schema step that added the column (SQLite 4, PostgreSQL 5): when it last changed is not
    # known. The web path never reads it.
    updated_at_ms: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class DeletedPlayer:
    """What is kept of a deleted player (table deleted_players): its id and the credential epoch it
    had, no name. The same id signed up again starts at ``epoch + 1``: no token of the deleted
    player, of any epoch, authenticates again (store/writes.py's continue_epochs)."""

    user_id: int
    epoch: int


@dataclasses.dataclass(frozen=True, slots=True)
class ApiToken:
    """An admin API bearer token's row (authsvc/operations/api_tokens.py): never the token, never
    its digest."""

    name: str
    scopes: tuple[str, ...]
    created_at: int
    expires_at: int | None
    revoked_at: int | None

    def live(self, now: int) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def as_json(self) -> dict:
        return {
            "name": self.name,
            "scopes": list(self.scopes),
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
        }


# How long an admin write waits for a lock another session holds (a long `player import`,
# another admin) before StoreLocked: SQLite's busy timeout, PostgreSQL's lock_timeout.
# Long, because `player revoke` is the password-change path and should go through
# (docs/admin.md); read at each write, so tests can shorten it.
ADMIN_LOCK_WAIT = 30.0


class NotEmpty(Conflict):
    """``load`` refuses a store that already holds games or players (``Conflict``, the model's own
    409, is the write that would break a uniqueness rule: a game name, a key digest, a player
    id)."""

    detail = (
        "the target store already holds games or players; import only into a new store "
        "(run 'authsvc init' on an empty database or file)"
    )


class Reader(abc.ABC):
    """One engine's read-only connection(s): all the web process holds (store/readers.py opens
    it)."""

    @abc.abstractmethod
    def credentials(self, key_digest: str, user_id: int) -> Credentials | None:
        """The game of this key and the player ``user_id`` in one query; None if no such key.

        The answer may be up to AUTHSVC_MAX_STALENESS old (SQLite's snapshot, a hot standby's
        replay; docs/stores.md, "Bounded staleness")."""

    @abc.abstractmethod
    def fresh_credentials(self, key_digest: str, user_id: int) -> Credentials | None:
        """``credentials`` read from the latest commit the reader can reach, whatever the age of the
        data ``credentials`` answers from (SQLite: a new snapshot, kept for the next reads).

        The authenticator asks for it only when a token is of the epoch a change newer than that
        data would give, to accept a token minted right after a revoke or signup
        (web/authenticate.py)."""

    @abc.abstractmethod
    def check(self) -> None:
        """Raise ConfigError unless the store exists and its schema is current."""

    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def list_games(self) -> list[Game]:
        """Every game with its keys, by id: the key expiry gauges of /metrics, and `authsvc game
        list`."""

    @abc.abstractmethod
    def token_secrets(self) -> dict[str, int]:
        """The fingerprints of the token secrets the store was used with, each with when it was
        recorded (unix ms): empty for a store no `authsvc init` of this release has seen
        (authsvc/tokens.py)."""


class Store(Reader):
    """A Reader that also writes: what the admin side opens (open_store in store/__init__.py)."""

    # The restore ledger each deletion appends to before it commits (store/ledger.py); None: none is
    # kept.
    ledger: str | None = None

    # -- admin --------------------------------------------------------------------
    def disk_full(self) -> str | None:
        """Why an admin write would fail for lack of disk space now (`authsvc check`), or None.
        PostgreSQL: None, its server's disk is not visible to a client; a write there fails with
        StoreFull."""
        return None

    @abc.abstractmethod
    def migrate(self) -> tuple[int, int]:
        """Apply pending migrations; returns (version before, version after)."""

    @abc.abstractmethod
    def write(self, audit: Audit | None = None) -> AbstractContextManager[Tx]:
        """``with store.write(audit) as tx``: one write transaction, committed at the end, rolled
        back on any exception; inside another on the same thread, that one (store/writes.py)."""

    @abc.abstractmethod
    def get_game(self, game_id: int) -> Game | None: ...

    @abc.abstractmethod
    def get_player(self, user_id: int) -> Player | None: ...

    # -- the admin API's bearer tokens (reads; the writes are Tx's) ---------------------------
    @abc.abstractmethod
    def api_tokens(self) -> list[ApiToken]:
        """Every token's row, by name."""

    @abc.abstractmethod
    def api_token_by_digest(self, token_digest: str) -> ApiToken | None:
        """The row of the token with this digest: a read, never waiting for a writer."""

    # -- webhook deliveries (store/deliveries.py): the deliverer's bookkeeping, never the writer
    # lock --------
    @abc.abstractmethod
    def bookkeeping(self, write: bool) -> AbstractContextManager[tuple[Any, Any]]:
        """``with store.bookkeeping(write) as (conn, dialect)``: a short transaction (``write``) or
        an autocommit read, taking no writer lock and writing no audit record; errors mapped as a
        write's."""

    def take_deliverer_lease(
        self, holder: str, now_ms: int, until_ms: int, dead: str | None = None
    ) -> str | None:
        """The deliverer's lease (store/deliveries.py's take_lease): None if ``holder`` holds it
        now, else who does."""
        from authsvc.store import deliveries

        with self.bookkeeping(True) as (conn, d):
            return deliveries.take_lease(conn, d, holder, now_ms, until_ms, dead)

    def deliverer_lease(self) -> tuple[str, int] | None:
        """(holder, until_ms) of the deliverer's lease, None if free: a read, so a waiting deliverer
        writes nothing."""
        from authsvc.store import deliveries

        with self.bookkeeping(False) as (conn, d):
            return deliveries.lease(conn, d)

    def release_deliverer_lease(self, holder: str) -> None:
        from authsvc.store import deliveries

        with self.bookkeeping(True) as (conn, d):
            deliveries.release_lease(conn, d, holder)

    def fan_out_events(self, now_ms: int, limit: int) -> tuple[int, bool]:
        """Deliveries of the events after each webhook's mark (store/deliveries.py's fan_out):
        (written, more)."""
        from authsvc.store import deliveries

        with self.bookkeeping(True) as (conn, d):
            return deliveries.fan_out(conn, d, now_ms, limit)

    def due_deliveries(
        self, now_ms: int, per_webhook: int, limit: int, skip: Collection[int] = ()
    ) -> list[Due]:
        """The due chains' first deliveries, at most ``per_webhook`` of each webhook but those of
        ``skip`` (store/deliveries.py's due)."""
        from authsvc.store import deliveries

        with self.bookkeeping(False) as (conn, d):
            return deliveries.due(conn, d, now_ms, per_webhook, limit, skip)

    def event_data(self, delivery_id: int) -> str | None:
        """The delivery's event data as it is now (a deletion erased its names), None if nothing is
        to be sent."""
        from authsvc.store import deliveries

        with self.bookkeeping(False) as (conn, d):
            return deliveries.event_data(conn, d, delivery_id)

    def deliveries_after(self, delivery: Due, now_ms: int, limit: int) -> list[Due]:
        from authsvc.store import deliveries

        with self.bookkeeping(False) as (conn, d):
            return deliveries.chain_after(conn, d, delivery, now_ms, limit)

    def record_deliveries(self, outcomes: Sequence[Outcome]) -> None:
        from authsvc.store import deliveries

        with self.bookkeeping(True) as (conn, d):
            deliveries.record(conn, d, outcomes)

    def delivery_backlog(self) -> list[tuple[int, int, int, int | None]]:
        """Per live webhook (id, pending, failed, oldest pending's created_at):
        store/deliveries.py's backlog."""
        from authsvc.store import deliveries

        with self.bookkeeping(False) as (conn, d):
            return deliveries.backlog(conn, d)

    def fail_orphan_deliveries(self, now_ms: int) -> int:
        from authsvc.store import deliveries

        with self.bookkeeping(True) as (conn, d):
            return deliveries.fail_orphans(conn, d, now_ms)

    def prune_deliveries(self, before_ms: int, limit: int) -> tuple[int, int, int]:
        """The retention's step (store/deliveries.py's prune): (deliveries, events, removed
        webhooks) deleted."""
        from authsvc.store import deliveries

        with self.bookkeeping(True) as (conn, d):
            return deliveries.prune(conn, d, before_ms, limit)

    # -- webhook subscriptions (reads; the writes are Tx's: store/events.py) ----------------
    @abc.abstractmethod
    def webhooks(self, webhook_id: int | None = None, *, removed: bool = False) -> list[Webhook]:
        """The live webhooks by id (``webhook_id``: that one, if live): never a secret. ``removed``:
        also the removed ones retention has not deleted yet."""

    @abc.abstractmethod
    def deliveries(
        self, webhook_id: int, *, state: str | None, limit: int, after: int
    ) -> list[Delivery]:
        """The webhook's deliveries by id after ``after``, at most ``limit``, each with its
        attempts."""

    # -- the audit trail (store/audit.py) -------------------------------------------------
    @abc.abstractmethod
    def audit_records(self, **filters) -> list[Record]:
        """Records matching store.audit.select's filters, newest first."""

    @abc.abstractmethod
    def audit_walk(self) -> Iterator[Chain | Record]:
        """The audit_chain row, then every record oldest first, from one snapshot."""

    # -- moving between stores (authsvc export / import, authsvc/operations/transfer.py) ---------
    @abc.abstractmethod
    def game_id_high_water(self) -> int:
        """The highest game id ever handed out (0 if none), so a moved store never reuses one."""

    @abc.abstractmethod
    def dump(self) -> Iterator[Game | Player | DeletedPlayer]:
        """Every game (with its keys) by id, then every player by user_id, then every deleted player
        by user_id, from one snapshot."""
