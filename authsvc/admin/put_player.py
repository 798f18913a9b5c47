"""A player's version for ``PUT /v1/players/{user_id}``'s ``If-Match``: the ETag and the match rule.

Signup and rename are the same idempotent call (docs/admin-api.md, "Players"). The
ETag is a digest of the player's fields, epoch and updated_at included, so a revoke
changes it too. The If-Match check, the change and its audit records share one write
transaction (authsvc/admin/operations.py's put_player), so two concurrent renames
cannot both win.
"""

from __future__ import annotations

import hashlib

from authsvc.store.base import Player


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
