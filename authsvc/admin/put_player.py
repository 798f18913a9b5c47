"""``PUT /v1/players/{user_id}``: create or update a player in one transaction, conditional on ``If-Match``.

Signup and rename are the same idempotent call (docs/admin-api.md, "Players"). The
ETag is a digest of the player's fields, epoch included, so a revoke changes it
too; the If-Match check, the change and its audit records share one transaction
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
    text = f"{player.user_id}:{player.username}:{int(player.enabled)}:{player.epoch}"
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


def put(store: Store, audit: Audit, user_id: int, username: str, enabled: bool,
        if_match: str | None) -> tuple[Player, bool]:
    """The player after the call, and whether it was created. Raises PreconditionFailed."""
    pg = store.pg
    with store.admin_transaction() as conn:
        state = trail.player_state(conn, pg, user_id)  # FOR UPDATE on PostgreSQL
        current = None if state is None else Player(user_id, state["username"], state["epoch"], state["enabled"])
        if not matches(if_match, current):
            raise PreconditionFailed()
        if current is None or state is None:
            conn.execute(_sql("INSERT INTO players (user_id, username, enabled) VALUES (?, ?, ?)", pg),
                         (user_id, username, enabled if pg else int(enabled)))
            trail.change(conn, pg, audit, "player.add", {}, user_id=user_id)
            return Player(user_id, username, 0, enabled), True
        before = state
        if username != current.username:
            conn.execute(_sql("UPDATE players SET username = ? WHERE user_id = ?", pg), (username, user_id))
            trail.change(conn, pg, audit, "player.rename", before, user_id=user_id)
            before = trail.player_state(conn, pg, user_id) or {}
        if enabled != current.enabled:
            conn.execute(_sql("UPDATE players SET enabled = ? WHERE user_id = ?", pg),
                         (enabled if pg else int(enabled), user_id))
            trail.change(conn, pg, audit, "player.enable" if enabled else "player.disable", before, user_id=user_id)
    return Player(user_id, username, current.epoch, enabled), False
