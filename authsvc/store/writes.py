"""One write transaction (``Tx``): every statement the admin side writes, on either engine.

``store.write(audit)`` (store/base.py) opens one and hands it out; a write called while one is
open on the same thread joins it, so the admin API's Idempotency-Key record, the change and the
change's audit record commit together or not at all (authsvc/api/idempotency.py).

The writer lock. A transaction's first statement takes the audit chain's row (SQLite: BEGIN
IMMEDIATE takes the file's; PostgreSQL: ``FOR UPDATE``), before any other row, so writers run
one at a time and can never deadlock; what one reads it may act on (a signup that finds no
player inserts one no other writer is inserting; a mint reads an epoch no revoke moves before
it commits). Only then is the time read (the audit's clock), and never earlier than the head
record's: along the chain, time never runs backwards, and ``updated_at`` with it.

Rules are not here: a method does what it is told and says what it found (None for no such
row, Conflict for a taken name); the operations layer (authsvc/operations/) decides.

A player's records are sealed (store/audit.py): its username goes into the chain as a keyed
digest under the player's own key, the clear value beside the record. ``delete_player`` is one
method, so whatever else a deletion must write later joins its transaction.

The events outbox (store/events.py): each method that changes a player or rotates a game's keys
emits its event (``emit``) in the same transaction; a change that changes no row emits none, a
rolled-back one leaves none. The deliverer fans the events out to the subscribed webhooks later
(store/deliveries.py's fan_out): a write's cost does not grow with the webhooks.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from authsvc.errors import Conflict
from authsvc.store import audit as trail
from authsvc.store import events as ev
from authsvc.store import ledger as restore_ledger
from authsvc.store import restore
from authsvc.store.audit import Audit, Record
from authsvc.store.base import ApiKey, ApiToken, DeletedPlayer, Game, Player
from authsvc.store.common import batches, select_games, select_token_secrets
from authsvc.store.dialect import Dialect
from authsvc.store.events import Delivery, Webhook

_PLAYER = "SELECT user_id, username, epoch, enabled, updated_at_ms FROM players WHERE user_id = ?"
_TOKEN_COLUMNS = "name, scopes, created_at, expires_at, revoked_at"


def player_data(user_id: int, username: str, epoch: int) -> dict:
    """A player event's data: the epoch after the change (a token of an older one is dead)."""
    return {"user_id": user_id, "username": username, "epoch": epoch}


def api_token(row: Sequence) -> ApiToken:
    return ApiToken(row[0], tuple(row[1].split()), row[2], row[3], row[4])


class _Lock:
    """The writer lock's state, shared by a transaction and the writes that join it."""

    def __init__(self) -> None:
        self.at_ms: int | None = None
        self.head_id: int | None = None  # the chain's head when the lock was taken
        self.appended = (
            False  # a record was appended: the head, if it moved, is logged after COMMIT
        )
        # a player deleted, a webhook removed: the store clears what that freed once it commits
        self.erased = False


class Tx(abc.ABC):
    """One write transaction on ``conn``; ``audit`` names who acts (each joined write may name its
    own).

    The connection stays inside the store: the admin side calls these methods, never SQL. The
    engines' own bulk writes (an import's COPY, a load, a restore's changes) run on
    ``bulk_connection``."""

    def __init__(
        self,
        conn: Any,
        dialect: Dialect,
        audit: Audit,
        lock: _Lock | None = None,
        collate: str = "",
        ledger: str | None = None,
    ):
        self._conn = conn
        self.d = dialect
        self.audit = audit
        self._lock = lock or _Lock()
        self._collate = collate
        self._ledger = ledger  # the restore ledger a deletion appends to (store/ledger.py)

    def joined(self, audit: Audit | None) -> Tx:
        """This transaction, for a write nested in it (its own audit, the same lock and time)."""
        return type(self)(
            self._conn, self.d, audit or self.audit, self._lock, self._collate, self._ledger
        )

    def bulk_connection(self) -> Any:
        """This transaction's connection, for an engine's bulk write in it (COPY, executemany, an
        engine's own statements): in this package only. What it writes is part of this transaction
        and its record."""
        return self._conn

    # -- the engines' bulk writes: each engine's Tx implements them (store/sqlite/store.py,
    # store/postgres/store.py)
    @abc.abstractmethod
    def import_players(
        self, rows: Iterable[tuple[int, str]], progress: Callable[[int], None] | None = None
    ) -> int:
        """Insert or rename players (the last row of a user id wins); returns the row count. One
        audit record for the batch; if ``rows`` raises part-way, the write rolls back and nothing is
        written."""

    @abc.abstractmethod
    def load(
        self,
        games: Iterable[Game],
        players: Iterable[Player | DeletedPlayer],
        game_id_high_water: int,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[int, int]:
        """Write games (ids kept) and players (epochs kept), then deleted players, into an empty
        store.

        Returns (games, players) written. Raises NotEmpty if the store holds any game, player or
        deleted player; Conflict if an id is both a player and a deleted one; if an iterator raises
        part-way, the write rolls back and nothing is written.
        """

    def _sql(self, text: str, args: tuple = ()) -> Any:
        return self._conn.execute(self.d.sql(text), args)

    @property
    def at_ms(self) -> int:
        """The transaction's time, read once it holds the writer lock (taken here on first use)."""
        if self._lock.at_ms is None:
            head_id, _ = self._conn.execute(self.d.WRITER_LOCK).fetchone()
            self._lock.head_id = head_id
            self._lock.at_ms = max(
                self.audit.now_ms(), trail.head_time(self._conn, self.d, head_id)
            )
        return self._lock.at_ms

    def locked(self) -> None:
        """Take the writer lock now (before a read whose answer the write will act on)."""
        _ = self.at_ms

    def head(self) -> tuple[int, str] | None:
        """(id, hash) of the chain's head as this transaction commits it, if its records moved it;
        None if it appended none, or a savepoint undid them. Read from the chain's row just before
        the COMMIT; the engines' write() logs it once the COMMIT returned (store/audit.py,
        log_head)."""
        if not self._lock.appended:
            return None
        chain = trail.read_chain(self._conn, self.d)
        return None if chain.head_id == self._lock.head_id else (chain.head_id, chain.head_hash)

    @property
    def erased(self) -> bool:
        """Whether this transaction deleted a player or removed a webhook: its store then clears,
        once it commits, the space that freed (SQLite: the -wal file; store/sqlite/store.py)."""
        return self._lock.erased

    def savepoint(self):
        """``with tx.savepoint():`` the statements inside undone if it raises; the transaction goes
        on."""
        self.locked()
        return self.d.savepoint(self._conn)

    def record(
        self,
        action: str,
        *,
        game_id: int | None = None,
        user_id: int | None = None,
        before: dict | None = None,
        after: dict | None = None,
        names: dict | None = None,
    ) -> Record:
        """One audit record of this write (an event that changes no row, too: a token minted);
        ``names``: the clear values of what ``before`` and ``after`` hold sealed
        (store/audit.py)."""
        self._lock.appended = True
        return trail.append(
            self._conn,
            self.d,
            self.audit,
            self.at_ms,
            action,
            game_id=game_id,
            user_id=user_id,
            before=before,
            after=after,
            names=names,
        )

    def prune_audit(self, before_ms: int) -> Record:
        """Delete the records before ``before_ms`` (store/audit.py's prune) and record the prune."""
        self._lock.appended = True
        return trail.prune(self._conn, self.d, self.audit, self.at_ms, before_ms)

    def _player_key(self, user_id: int) -> str:
        """The player's sealing key, made on its first sealed record."""
        row = self._sql("SELECT key FROM player_keys WHERE user_id = ?", (user_id,)).fetchone()
        if row is not None:
            return row[0]
        key = trail.new_key()
        self._sql("INSERT INTO player_keys (user_id, key) VALUES (?, ?)", (user_id, key))
        return key

    def player_keys(self, user_ids: Sequence[int]) -> dict[int, str]:
        """{user id: sealing key} of ``user_ids``, each made if it has none yet (_player_key, for
        many): what seals a batch's names in its record's digest (authsvc/api/batch.py's
        sealed_digest)."""
        self.locked()
        keys: dict[int, str] = {}
        for chunk in batches(user_ids):
            keys.update((row[0], row[1]) for row in self.d.player_keys(self._conn, chunk))
        made = [
            (user_id, trail.new_key()) for user_id in dict.fromkeys(user_ids) if user_id not in keys
        ]
        if made:
            self._conn.cursor().executemany(
                self.d.sql("INSERT INTO player_keys (user_id, key) VALUES (?, ?)"), made
            )
            keys.update(made)
        return keys

    def _player_record(self, action: str, user_id: int, before: dict) -> Record:
        """The record of a change to a player: its state before and after, the username sealed."""
        key = self._player_key(user_id)
        sealed_before, clear_before = trail.sealed(key, before)
        sealed_after, clear_after = trail.sealed(
            key, trail.player_state(self._conn, self.d, user_id)
        )
        return self.record(
            action,
            user_id=user_id,
            before=sealed_before,
            after=sealed_after,
            names={"before": clear_before, "after": clear_after},
        )

    def _game_record(
        self, action: str, game_id: int, before: dict, extra: dict | None = None
    ) -> Record:
        after = (trail.game_state(self._conn, self.d, game_id) or {}) | (extra or {})
        return self.record(action, game_id=game_id, before=before, after=after)

    # -- players ------------------------------------------------------------------------------
    def player(self, user_id: int) -> Player | None:
        self.locked()
        row = self._sql(_PLAYER, (user_id,)).fetchone()
        return None if row is None else Player(row[0], row[1], row[2], bool(row[3]), row[4])

    def add_player(self, user_id: int, username: str, enabled: bool = True) -> Player:
        """Raise Conflict if the player exists. A deleted id's epoch continues (continue_epochs)."""
        if self.player(user_id) is not None:
            raise Conflict(f"player {user_id} exists")
        self._sql(
            "INSERT INTO players (user_id, username, enabled, updated_at_ms) VALUES (?, ?, ?, ?)",
            (user_id, username, self.d.flag(enabled), self.at_ms),
        )
        self.continue_epochs([user_id])
        self._player_record("player.add", user_id, {})
        self.emit_players(
            [(user_id, "player.created")] + ([] if enabled else [(user_id, "player.disabled")])
        )
        return self.player(user_id) or Player(user_id, username, 0, enabled, self.at_ms)

    def continue_epochs(self, user_ids: Sequence[int] | None = None) -> None:
        """Of the players just written (``user_ids``; None: any), those whose id was deleted before:
        each one's credential epoch starts past the deleted player's (its row in deleted_players,
        which goes), so no token the deleted player ever had authenticates again. The one place
        every signup path calls (add_player, the batch, ``player import``); ``authsvc import``
        brings both tables as they were. After a restore, none starts below the restore's floor
        either."""
        if user_ids is None:
            found = self._sql(
                "SELECT d.user_id, d.epoch FROM deleted_players AS d "
                "JOIN players AS p ON p.user_id = d.user_id"
            ).fetchall()
        else:
            found = self.d.deleted_players(self._conn, user_ids)
        for user_id, epoch in found:
            self._sql("UPDATE players SET epoch = ? WHERE user_id = ?", (epoch + 1, user_id))
            self._sql("DELETE FROM deleted_players WHERE user_id = ?", (user_id,))
        # After a restore, a player new to the store starts at its generation's floor
        # (store/restore.py): a token minted before the restore for the same id, at a lower epoch,
        # stays dead.
        if (lowest := restore.floor(self._conn, self.d)) == 0:
            return
        if (
            user_ids is None
        ):  # every player below the floor is one just written: a restore moved the rest
            self._sql("UPDATE players SET epoch = ? WHERE epoch < ?", (lowest, lowest))
        else:
            for user_id in user_ids:
                self._sql(
                    "UPDATE players SET epoch = ? WHERE user_id = ? AND epoch < ?",
                    (lowest, user_id, lowest),
                )

    def delete_player(self, user_id: int, *, ledger: bool = True) -> int | None:
        """Delete the player and erase its names; the epoch it had, None if no such player.

        Its row goes, its id and epoch stay (deleted_players, no name); its sealing key and the
        clear values kept beside its records go, so the chain keeps only digests no one can test a
        guess against; its records written before sealing have their names replaced
        (store/audit.py's erase_clear_names), each listed with its new hash in this deletion's own
        record. Once the transaction commits, the store clears the space this freed (``erased``).
        Before it commits, the id and epoch are appended to the restore ledger (store/ledger.py; not
        when a restore itself deletes): should the commit then fail, a later restore deletes a
        player that was not, never the reverse."""
        self.locked()
        if (before := trail.player_state(self._conn, self.d, user_id)) is None:
            return None
        clear = trail.erase_clear_names(self._conn, self.d, user_id)
        names = self._sql("DELETE FROM audit_names WHERE user_id = ?", (user_id,)).rowcount
        self._sql("DELETE FROM player_keys WHERE user_id = ?", (user_id,))
        self._sql("DELETE FROM players WHERE user_id = ?", (user_id,))
        self._sql("DELETE FROM deleted_players WHERE user_id = ?", (user_id,))
        self._sql(
            "INSERT INTO deleted_players (user_id, epoch) VALUES (?, ?)", (user_id, before["epoch"])
        )
        record = self.record(
            "player.delete",
            user_id=user_id,
            before={"enabled": before["enabled"], "epoch": before["epoch"]},
            after={"names_erased": names, "records_erased": {str(i): h for i, _, h in clear}},
        )
        for record_id, changes, _ in clear:
            self.d.erase_names(self._conn, record_id, changes, record.id)
        self._sql(
            f"UPDATE events SET data = {self.d.DATA_WITHOUT_USERNAME} WHERE user_id = ?", (user_id,)
        )
        self.emit(
            "player.deleted", user_id=user_id, data={"user_id": user_id, "epoch": before["epoch"]}
        )
        self._lock.erased = True
        if (
            ledger and self._ledger
        ):  # on disk before the COMMIT: a restore of an older copy deletes it again
            restore_ledger.append_deletion(self._ledger, user_id, before["epoch"])
        return before["epoch"]

    def _change_player(
        self, user_id: int, action: str, sql: str, args: tuple, event: str
    ) -> dict | None:
        """One UPDATE of a player, its record and (if the row changed) its ``event``; the state
        after, None if no such player. ``sql`` sets updated_at_ms to its first parameter; its WHERE
        leaves out a row that would stay as it is."""
        self.locked()
        if (before := trail.player_state(self._conn, self.d, user_id)) is None:
            return None
        changed = self._sql(sql, (self.at_ms, *args)).rowcount
        self._player_record(action, user_id, before)
        after = trail.player_state(self._conn, self.d, user_id)
        if changed and after is not None:
            self.emit(
                event, user_id=user_id, data=player_data(user_id, after["username"], after["epoch"])
            )
        return after

    def rename_player(self, user_id: int, username: str) -> bool:
        sql = (
            "UPDATE players SET updated_at_ms = ?, username = ? WHERE user_id = ? AND username <> ?"
        )
        return (
            self._change_player(
                user_id, "player.rename", sql, (username, user_id, username), "player.renamed"
            )
            is not None
        )

    def set_player_enabled(self, user_id: int, enabled: bool) -> bool:
        sql = "UPDATE players SET updated_at_ms = ?, enabled = ? WHERE user_id = ? AND enabled <> ?"
        flag = self.d.flag(enabled)
        action = f"player.{'en' if enabled else 'dis'}able"
        return (
            self._change_player(user_id, action, sql, (flag, user_id, flag), action + "d")
            is not None
        )

    def revoke_player(self, user_id: int) -> int | None:
        """Bump the credential epoch; the new epoch, None if no such player."""
        after = self._change_player(
            user_id,
            "player.revoke",
            "UPDATE players SET updated_at_ms = ?, epoch = epoch + 1 WHERE user_id = ?",
            (user_id,),
            "player.revoked",
        )
        return None if after is None else after["epoch"]

    def players_now(self, user_ids: Sequence[int]) -> dict[int, tuple[str, bool]]:
        """{user id: (username, enabled)} of those of ``user_ids`` that exist."""
        self.locked()
        return {
            row[0]: (row[1], bool(row[2])) for row in self.d.current_players(self._conn, user_ids)
        }

    def write_players(
        self, rows: Sequence[tuple[int, str, bool]], action: str, after: dict
    ) -> Record:
        """Insert or overwrite many players, stamped with this write's time, and one record for them
        all; one event per change of each player (created, renamed, enabled or disabled)."""
        before = self.players_now([row[0] for row in rows])
        self.d.write_players(self._conn, rows, self.at_ms)
        self.continue_epochs([row[0] for row in rows])
        changes: list[tuple[int, str]] = []
        for user_id, username, enabled in rows:
            was = before.get(user_id)
            if was is None:
                changes.append((user_id, "player.created"))
            elif was[0] != username:
                changes.append((user_id, "player.renamed"))
            if (was is None and not enabled) or (was is not None and was[1] != enabled):
                changes.append((user_id, "player.enabled" if enabled else "player.disabled"))
        self.emit_players(changes)
        return self.record(action, after=after)

    # -- the events outbox (store/events.py) ------------------------------------------------------
    def emit(
        self, type: str, *, user_id: int | None = None, game_id: int | None = None, data: dict
    ) -> None:
        """One event of this transaction's change (store/events.py)."""
        self.emit_many([(type, user_id, game_id, data)])

    def emit_many(self, events: Sequence[tuple[str, int | None, int | None, dict]]) -> None:
        """Events (type, user_id, game_id, data), in this order: their ids, given under the writer
        lock, follow the order in which the changes commit (store/deliveries.py's fan_out relies on
        it)."""
        if not events:
            return
        at_ms = self.at_ms
        self._conn.cursor().executemany(
            self.d.sql(
                "INSERT INTO events (type, user_id, game_id, at_ms, data) VALUES (?, ?, ?, ?, ?)"
            ),
            [
                (
                    t,
                    user_id,
                    game_id,
                    at_ms,
                    json.dumps(data, separators=(",", ":"), ensure_ascii=False),
                )
                for t, user_id, game_id, data in events
            ],
        )

    def emit_players(self, changes: Iterable[tuple[int, str]]) -> None:
        """One event per (user id, type), the data read from each player's row as this transaction
        left it."""
        for chunk in batches(changes):
            now = {
                row[0]: row
                for row in self.d.current_players(self._conn, sorted({c[0] for c in chunk}))
            }
            self.emit_many(
                [
                    (t, user_id, None, player_data(user_id, now[user_id][1], now[user_id][3]))
                    for user_id, t in chunk
                    if user_id in now
                ]
            )

    # -- games and their keys -------------------------------------------------------------------
    def game(self, game_id: int) -> Game | None:
        self.locked()
        found = select_games(self._conn, self.d.sql("WHERE id = ?"), (game_id,), self._collate)
        return found[0] if found else None

    def add_game(self, name: str, key_digest: str, now: int) -> Game:
        """A game and its first key; Conflict if the name (or, by chance, the digest) is taken."""
        self.locked()
        if self._sql("SELECT 1 FROM games WHERE name = ?", (name,)).fetchone() is not None:
            raise Conflict(f"a game named {name!r} exists")
        self._check_digest(key_digest)
        game_id = self.d.insert_game(self._conn, name, now)
        self._insert_key(key_digest, game_id, now)
        self._game_record("game.add", game_id, {})
        return Game(game_id, name, True, now, (ApiKey(key_digest, now, None),))

    def _check_digest(self, key_digest: str) -> None:
        if (
            self._sql("SELECT 1 FROM api_keys WHERE digest = ?", (key_digest,)).fetchone()
            is not None
        ):
            raise Conflict("that api key digest is already in use")

    def _insert_key(
        self, key_digest: str, game_id: int, now: int, expires_at: int | None = None
    ) -> None:
        self._sql(
            "INSERT INTO api_keys (digest, game_id, created_at, expires_at) VALUES (?, ?, ?, ?)",
            (key_digest, game_id, now, expires_at),
        )

    def set_game_enabled(self, game_id: int, enabled: bool) -> bool:
        self.locked()
        if (before := trail.game_state(self._conn, self.d, game_id)) is None:
            return False
        self._sql("UPDATE games SET enabled = ? WHERE id = ?", (self.d.flag(enabled), game_id))
        self._game_record("game.enable" if enabled else "game.disable", game_id, before)
        return True

    def add_api_key(
        self, game_id: int, key_digest: str, now: int, old_keys_expire_at: float | None
    ) -> bool:
        """A new key; the game's keys with no expiry, or a later one, expire at
        ``old_keys_expire_at`` (unix seconds, kept to the millisecond in expires_at_ms; expires_at,
        which the previous release reads, is the whole second at or after it: there a key lives up
        to a second longer, never shorter)."""
        self.locked()
        if (before := trail.game_state(self._conn, self.d, game_id)) is None:
            return False
        self._check_digest(key_digest)
        seconds = None if old_keys_expire_at is None else math.ceil(old_keys_expire_at)
        if old_keys_expire_at is not None:
            ms = round(old_keys_expire_at * 1000)
            # A later expiry: the earlier of the two columns (the reader's rule) is after ``ms``.
            self._sql(
                "UPDATE api_keys SET expires_at = ?, expires_at_ms = ? WHERE game_id = ? AND "
                "(expires_at IS NULL OR (expires_at * 1000 > ? AND (expires_at_ms IS NULL OR "
                "expires_at_ms > ?)))",
                (seconds, ms, game_id, ms, ms),
            )
        self._insert_key(key_digest, game_id, now)
        self._game_record("game.rotate_key", game_id, before, {"old_keys_expire_at": seconds})
        self.emit(
            "game.key_rotated",
            game_id=game_id,
            data={"game_id": game_id, "old_keys_expire_at": seconds},
        )
        return True

    # -- webhook subscriptions (store/events.py) ---------------------------------------------------
    def add_webhook(
        self, url: str, events: Sequence[str], game_id: int | None, secret: str
    ) -> Webhook:
        """A subscription and its record (never the secret): its deliveries start with the next
        event (its fan-out mark is the last event there is; the writer lock holds off any other)."""
        self.locked()
        self._sql(
            "INSERT INTO webhooks (url, events, game_id, secret, created_at, fanned_out) "
            "VALUES (?, ?, ?, ?, ?, (SELECT coalesce(max(id), 0) FROM events))",
            (url, json.dumps(sorted(events)), game_id, secret, self.at_ms),
        )
        webhook_id = self._sql("SELECT max(id) FROM webhooks").fetchone()[
            0
        ]  # the writer lock: ours
        hook = ev.select_webhooks(self._conn, self.d, webhook_id)[0]
        self.record("webhook.add", game_id=game_id, after=self._webhook_state(hook))
        return hook

    @staticmethod
    def _webhook_state(hook: Webhook) -> dict:
        return {
            "id": hook.id,
            "url": hook.url,
            "events": list(hook.events),
            "game_id": hook.game_id,
        }

    def webhook_count(self) -> int:
        """How many webhooks are live (not removed)."""
        self.locked()
        return self._sql("SELECT count(*) FROM webhooks WHERE deleted_at IS NULL").fetchone()[0]

    def webhook(self, webhook_id: int) -> Webhook | None:
        """The live webhook ``webhook_id``, None if none (or deleted)."""
        self.locked()
        found = ev.select_webhooks(self._conn, self.d, webhook_id)
        return found[0] if found else None

    def remove_webhook(self, webhook_id: int) -> Webhook | None:
        """Mark the webhook deleted, its secret gone (nothing signs with it again; the store then
        clears it from its files as a deletion's names, ``erased``), and fail its pending
        deliveries; the webhook as it was, None if none."""
        if (hook := self.webhook(webhook_id)) is None:
            return None
        self._sql(
            "UPDATE webhooks SET deleted_at = ?, secret = '' WHERE id = ?", (self.at_ms, webhook_id)
        )
        self._sql(
            "UPDATE deliveries SET state = 'failed', done_at = ?, last_error = 'webhook removed' "
            "WHERE webhook_id = ? AND state = 'pending'",
            (self.at_ms, webhook_id),
        )
        self.record("webhook.remove", game_id=hook.game_id, before=self._webhook_state(hook))
        self._lock.erased = True
        return hook

    def delivery(self, webhook_id: int, delivery_id: int) -> Delivery | None:
        self.locked()
        found = ev.select_deliveries(
            self._conn, self.d, webhook_id, delivery_id=delivery_id, limit=1
        )
        return found[0] if found else None

    def retry_delivery(self, webhook_id: int, delivery_id: int) -> Delivery | None:
        """A failed delivery pending again, due now, its 24 hours starting again; None if no such
        delivery or it is not failed."""
        current = self.delivery(webhook_id, delivery_id)
        if current is None or current.state != "failed":
            return None
        self._sql(
            "UPDATE deliveries SET state = 'pending', next_at = ?, created_at = ?, done_at = NULL "
            "WHERE id = ?",
            (self.at_ms, self.at_ms, delivery_id),
        )
        self.record(
            "webhook.retry",
            after={
                "webhook_id": webhook_id,
                "delivery_id": delivery_id,
                "event_id": current.event_id,
            },
        )
        return self.delivery(webhook_id, delivery_id)

    def retry_deliveries(self, webhook: Webhook, states: tuple[str, ...]) -> int:
        """The live webhook's deliveries in ``states`` due now: a pending one's wait for its next
        try ends (its 24 hours run on), a failed one is pending again with another 24 hours, as
        ``retry_delivery``; how many. Each player's go in id order still (store/deliveries.py): the
        earliest is the chain's head."""
        count = 0
        if "pending" in states:
            count += self._sql(
                "UPDATE deliveries SET next_at = ? WHERE webhook_id = ? AND state = 'pending' "
                "AND next_at > ?",
                (self.at_ms, webhook.id, self.at_ms),
            ).rowcount
        if "failed" in states:
            count += self._sql(
                "UPDATE deliveries SET state = 'pending', next_at = ?, created_at = ?, done_at = "
                "NULL WHERE webhook_id = ? AND state = 'failed'",
                (self.at_ms, self.at_ms, webhook.id),
            ).rowcount
        self.record(
            "webhook.retry",
            game_id=webhook.game_id,
            after={"webhook_id": webhook.id, "states": list(states), "deliveries": count},
        )
        return count

    # -- the admin API's bearer tokens ------------------------------------------------------------
    def add_api_token(
        self,
        name: str,
        token_digest: str,
        scopes: tuple[str, ...],
        now: int,
        expires_at: int | None,
    ) -> ApiToken | None:
        """The new token's row and its record (name, scopes, expiry: never the digest); None if the
        name is taken."""
        self.locked()
        taken = self._sql(
            "SELECT 1 FROM api_tokens WHERE name = ? OR digest = ?", (name, token_digest)
        ).fetchone()
        if taken is not None:
            return None
        self._sql(
            "INSERT INTO api_tokens (name, digest, scopes, created_at, expires_at) VALUES (?, ?, "
            "?, ?, ?)",
            (name, token_digest, " ".join(scopes), now, expires_at),
        )
        self.record(
            "api_token.add", after={"name": name, "scopes": list(scopes), "expires_at": expires_at}
        )
        return ApiToken(name, scopes, now, expires_at, None)

    def revoke_api_token(self, name: str, now: int) -> ApiToken | None:
        """Mark the token revoked (once: a second revoke changes nothing and writes no record); None
        if no such name."""
        self.locked()
        row = self._sql(
            f"SELECT {_TOKEN_COLUMNS} FROM api_tokens WHERE name = ?", (name,)
        ).fetchone()
        if row is None:
            return None
        token = api_token(row)
        if token.revoked_at is not None:
            return token
        self._sql("UPDATE api_tokens SET revoked_at = ? WHERE name = ?", (now, name))
        self.record(
            "api_token.revoke",
            before={"name": name, "revoked_at": None},
            after={"name": name, "revoked_at": now},
        )
        return dataclasses.replace(token, revoked_at=now)

    # -- the token secrets' fingerprints (authsvc/tokens.py)
    # ---------------------------------------------
    def any_player(self) -> bool:
        """Whether the store has a player: a token may be out there."""
        return self._sql("SELECT 1 FROM players LIMIT 1").fetchone() is not None

    def token_secrets(self) -> dict[str, int]:
        """Each fingerprint the store knows, with when it was recorded (unix ms)."""
        self.locked()
        return select_token_secrets(self._conn)

    def record_token_secrets(
        self,
        fingerprints: Sequence[str],
        action: str | None,
        *,
        drop: Sequence[str] = (),
        replace: bool = False,
    ) -> None:
        """Add ``fingerprints`` (kept with their first time), drop ``drop`` (or, with ``replace``,
        every other), and record ``action`` with the counts: never a fingerprint (docs/admin.md,
        "The audit trail"). ``action`` None: no record, for what sets a store up (``authsvc init``'s
        first secret, or the file's secrets adopted by a store from before fingerprints), as its
        migrations have none."""
        before = self.token_secrets()
        gone = (
            [f for f in before if f not in fingerprints]
            if replace
            else [f for f in drop if f in before]
        )
        for fingerprint in gone:
            self._sql("DELETE FROM token_secret_fingerprints WHERE fingerprint = ?", (fingerprint,))
        for fingerprint in fingerprints:
            if fingerprint not in before:
                self._sql(
                    "INSERT INTO token_secret_fingerprints (fingerprint, added_at_ms) VALUES (?, "
                    "?)",
                    (fingerprint, self.at_ms),
                )
        added = sum(f not in before for f in fingerprints)
        if action is None:
            return
        self.record(
            action,
            before={"secrets": len(before)},
            after={
                "secrets": len(before) - len(gone) + added,
                "added": added,
                "dropped": len(gone),
            },
        )

    # -- Idempotency-Key records -------------------------------------------------------------------
    def kept_answer(
        self, token_name: str, key: str, kept_since: int
    ) -> tuple[str, int, str | None] | None:
        """(request hash, status, answer) kept for this token's key, None if none; forgets keys
        older than ``kept_since`` first."""
        self.locked()
        self._sql("DELETE FROM idempotency_keys WHERE created_at < ?", (kept_since,))
        row = self._sql(
            "SELECT request_hash, status, body FROM idempotency_keys WHERE token_name = ? AND key "
            "= ?",
            (token_name, key),
        ).fetchone()
        return None if row is None else (row[0], row[1], row[2])

    def keep_answer(
        self, token_name: str, key: str, request_hash: str, now: int, status: int, body: str
    ) -> None:
        """Keep the answer to this token's key (replacing a row a release before left "running")."""
        self._sql(
            "DELETE FROM idempotency_keys WHERE token_name = ? AND key = ?", (token_name, key)
        )
        self._sql(
            "INSERT INTO idempotency_keys (token_name, key, request_hash, created_at, status, "
            "body) VALUES (?, ?, ?, ?, ?, ?)",
            (token_name, key, request_hash, now, status, body),
        )
