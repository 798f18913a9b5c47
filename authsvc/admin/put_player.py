"""``PUT /v1/players/{user_id}``: create or update a player in one transaction, conditional on ``If-Match``.

Signup and rename are the same idempotent call (docs/admin-api.md, "Players"). The
ETag is a digest of the player's fields, epoch and updated_at included, so a revoke
changes it too; the If-Match check, the change and its audit records share one transaction
(the row locked on PostgreSQL, the whole store on SQLite), so two concurrent
renames cannot both win. Each change writes the record the command's own
subcommand writes (player.add, player.rename, player.enable, player.disable): the
trail reads the same whichever front door made it.
"""

from __future__ import annotations

import hashlib

from authsvc.store import audit as trail
from authsvc.store.audit import Audit
from authsvc.store.base import Player, Store


class PreconditionFailed(Exception):
    """If-Match named no current version of the player (or the player does not exist)."""


def etag(player: Player) -> str:
    """A digest of every field of the answer. A row no write has changed since the schema step that
    added updated_at (null) keeps the ETag the release before gave it, so an If-Match kept across the
    upgrade still matches; a rename and its undoing give a new one (the answer's updated_at moved)."""
    text = f"{player.user_id}:{player.username}:{int(player.enabled)}:{player.epoch}"
    if player.updated_at_ms is not None:
        text += f":{player.updated_at_ms}"
    return '"' + hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:32] + '"'


def matches(if_match: str | None, player: Player | None) -> bool:
    """RFC 9110 If-Match: absent matches anything; ``*`` any current player; else one of the listed ETags."""
    if if_match is None:
        return True
    if player is None:
        return False
    tags = {tag.strip().removeprefix("W/") for tag in if_match.split(",")}
    return "*" in tags or etag(player) in tags


def _sql(text: str, pg: bool) -> str:
    return text.replace("?", "%s") if pg else text


def _current(conn, pg: bool, user_id: int) -> Player | None:
    """The player's row, locked FOR UPDATE on PostgreSQL (SQLite's write lock covers it); None if none."""
    row = conn.execute(
        _sql("SELECT username, epoch, enabled, updated_at_ms FROM players WHERE user_id = ?", pg)
        + (" FOR UPDATE" if pg else ""), (user_id,),
    ).fetchone()
    return None if row is None else Player(user_id, row[0], row[1], bool(row[2]), row[3])


def put(store: Store, audit: Audit, user_id: int, username: str, enabled: bool,
        if_match: str | None) -> tuple[Player, bool]:
    """The player after the call, and whether it was created. Raises PreconditionFailed.

    A change stamps the row's updated_at_ms with its audit record's time; a PUT that changes
    nothing writes nothing, so the answer (and its ETag) is the one before."""
    pg = store.pg
    with store.admin_transaction() as conn:
        current = _current(conn, pg, user_id)
        if not matches(if_match, current):
            raise PreconditionFailed()
        if current is None:
            conn.execute(_sql("INSERT INTO players (user_id, username, enabled, updated_at_ms) VALUES (?, ?, ?, ?)", pg),
                         (user_id, username, enabled if pg else int(enabled), audit.at_ms))
            trail.change(conn, pg, audit, "player.add", {}, user_id=user_id)
            return Player(user_id, username, 0, enabled, audit.at_ms), True
        before = {"username": current.username, "enabled": current.enabled, "epoch": current.epoch}
        updated_at_ms = current.updated_at_ms
        if username != current.username:
            conn.execute(_sql("UPDATE players SET username = ?, updated_at_ms = ? WHERE user_id = ?", pg),
                         (username, audit.at_ms, user_id))
            trail.change(conn, pg, audit, "player.rename", before, user_id=user_id)
            before = trail.player_state(conn, pg, user_id) or {}
            updated_at_ms = audit.at_ms
        if enabled != current.enabled:
            conn.execute(_sql("UPDATE players SET enabled = ?, updated_at_ms = ? WHERE user_id = ?", pg),
                         (enabled if pg else int(enabled), audit.at_ms, user_id))
            trail.change(conn, pg, audit, "player.enable" if enabled else "player.disable", before, user_id=user_id)
            updated_at_ms = audit.at_ms
    return Player(user_id, username, current.epoch, enabled, updated_at_ms), False
