"""Players: add, show, rename, enable or disable, revoke, delete, import; the admin API's PUT (its
conditions in authsvc/operations/conditions.py) and batch (docs/admin.md; docs/admin-api.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import cast

from authsvc.errors import NotFound
from authsvc.names import check_user_id, check_username
from authsvc.operations.conditions import Condition, check_if_match, check_if_none_match
from authsvc.operations.context import Context, at_ms
from authsvc.operations.player_rows import import_rows
from authsvc.store import audit as trail
from authsvc.store.base import Player, Store


def add_player(store: Store, ctx: Context, user_id: int, username: str) -> Player:
    check_user_id(user_id)
    username = check_username(username)
    with store.write(ctx.audit()) as tx:
        return tx.add_player(user_id, username)


def updated_at(player: Player) -> str | None:
    """When the player's row last changed, as the admin API and the command show it: RFC 3339 UTC
    with milliseconds (``2026-11-24T08:00:00.250Z``); None for a row unchanged since the schema step
    (not known)."""
    return at_ms(player.updated_at_ms)


def get_player(store: Store, user_id: int) -> Player:
    player = store.get_player(check_user_id(user_id))
    if player is None:
        raise NotFound(f"no player {user_id}")
    return player


def rename_player(store: Store, ctx: Context, user_id: int, username: str) -> str:
    check_user_id(user_id)
    username = check_username(username)
    with store.write(ctx.audit()) as tx:
        found = tx.rename_player(user_id, username)
    if not found:
        raise NotFound(f"no player {user_id}")
    return username


def set_player_enabled(store: Store, ctx: Context, user_id: int, enabled: bool) -> None:
    with store.write(ctx.audit()) as tx:
        found = tx.set_player_enabled(check_user_id(user_id), enabled)
    if not found:
        raise NotFound(f"no player {user_id}")


def revoke_player(store: Store, ctx: Context, user_id: int) -> int:
    """Bump the player's credential epoch (every token stops working); returns the new epoch."""
    with store.write(ctx.audit()) as tx:
        epoch = tx.revoke_player(check_user_id(user_id))
    if epoch is None:
        raise NotFound(f"no player {user_id}")
    return epoch


def delete_player(
    store: Store, ctx: Context, user_id: int, if_match: Condition | None = None
) -> int:
    """Delete the player and erase its names (docs/admin.md, "Erasure"); returns the epoch it had.

    NotFound if there is no such player (If-Match or not: RFC 9110 ignores a precondition of a
    request that would fail without it); PreconditionFailed if If-Match names no current version.
    Every token of the player is refused from then on, and the same id signed up again starts past
    that epoch. One transaction (store/writes.py's delete_player): what else a deletion writes later
    joins it."""
    check_user_id(user_id)
    with store.write(ctx.audit()) as tx:
        current = tx.player(user_id)
        if current is None:
            raise NotFound(f"no player {user_id}")
        check_if_match(if_match, user_id, current)
        epoch = tx.delete_player(user_id)
    return current.epoch if epoch is None else epoch


DELETED_PAGE = 1000  # audit records read at a time by deleted_since


def deleted_since(store: Store, since_ms: int) -> list[int]:
    """The ids of the players deleted at or after ``since_ms``, ascending, from the audit trail's
    ``player.delete`` records: what a roll back to a release without `authsvc restore` deletes again
    after putting back a backup taken then (docs/operations.md section 9). A read: no audit
    record."""
    ids: set[int] = set()
    before_id = None
    while True:  # each page ends below the last: at most records/DELETED_PAGE + 1 pages
        page = store.audit_records(
            since_ms=since_ms, action="player.delete", limit=DELETED_PAGE, before_id=before_id
        )
        ids.update(r.user_id for r in page if r.user_id is not None)
        if len(page) < DELETED_PAGE:
            return sorted(ids)
        before_id = page[-1].id


def import_players(
    store: Store, ctx: Context, data: bytes, progress: Callable[[int], None] | None = None
) -> int:
    """Insert or rename players from a CSV or JSON-lines file's bytes, all or nothing; one audit
    record for the batch (its row count and the file's SHA-256). A bad row raises Invalid
    (RowError)."""
    audit = ctx.audit(file_sha256=hashlib.sha256(data).hexdigest())
    with store.write(audit) as tx:
        return tx.import_players(import_rows(data), progress=progress)


def put_player(
    store: Store,
    ctx: Context,
    user_id: int,
    username: str,
    enabled: bool = True,
    if_match: Condition | None = None,
    if_none_match: Condition | None = None,
) -> tuple[Player, bool]:
    """Create or update a player (the admin API's PUT): (player, created). If-Match and
    If-None-Match (as authsvc/operations/conditions.py reads them) make it conditional:
    PreconditionFailed when If-Match names no current version, or when the player exists and
    If-None-Match is ``*`` (the create-only signup) or names its version. The checks and the change
    are one transaction: of two signups of one new player, one creates it and the other finds it
    (or, create-only, gets PreconditionFailed). A PUT that changes nothing writes nothing: the
    answer is the player as it was."""
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


def batch_players(
    store: Store, ctx: Context, items: list[Item], dry_run: bool, invalid: int, body: dict
) -> dict[int, str]:
    """Create or update many players (the admin API's batch): each one's status by user id. One
    transaction and one audit record (the counts, the SHA-256 of the canonical body with its names
    sealed: sealed_digest); none on a dry run, nor when nothing changes."""
    with store.write(ctx.audit()) as tx:
        current = tx.players_now([item.user_id for item in items])
        status = {item.user_id: status_of(current.get(item.user_id), item) for item in items}
        changed = [
            (i.user_id, i.username, i.enabled) for i in items if status[i.user_id] != "unchanged"
        ]
        if not dry_run and changed:
            counts = {name: sum(1 for s in status.values() if s == name) for name in STATUSES[:3]}
            digest = sealed_digest(body, items, tx.player_keys([item.user_id for item in items]))
            tx.write_players(
                changed, "player.batch", counts | {"error": invalid, "sealed_body_sha256": digest}
            )
    return status


# -- the admin API's batch (authsvc/api/batch.py reads the request) --------------------------

STATUSES = ("created", "updated", "unchanged", "error")


@dataclasses.dataclass(frozen=True, slots=True)
class Item:
    index: int
    user_id: int
    username: str
    enabled: bool


def status_of(current: tuple[str, bool] | None, item: Item) -> str:
    """What writing ``item`` over the player as it is (None: none) does."""
    if current is None:
        return "created"
    return "unchanged" if current == (item.username, item.enabled) else "updated"


def sealed_digest(body: dict, items: list[Item], keys: dict[int, str]) -> str:
    """The SHA-256 of the body's canonical JSON with each valid item's username sealed under its
    player's key, as the chain seals names (store/audit.py), and an invalid item's left out
    (ERASED): whoever reads the record but not the keys cannot test a guessed name against it, and
    no one can once the player's deletion dropped its key (docs/admin.md, "Erasure")."""
    valid = {item.index: item.user_id for item in items}
    players = []
    for index, entry in enumerate(cast(list, body["players"])):
        if isinstance(entry, dict) and "username" in entry:
            name = entry["username"]
            user_id = valid.get(index)
            sealed = (
                trail.seal(keys[user_id], "username", name) if user_id is not None else trail.ERASED
            )
            entry = entry | {"username": sealed}
        players.append(entry)
    return hashlib.sha256(trail.canonical(body | {"players": players}).encode("ascii")).hexdigest()
