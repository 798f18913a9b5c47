"""A player's version for ``PUT /v1/players/{user_id}``'s conditions: the ETag, and If-Match /
If-None-Match.

Signup and rename are the same idempotent call (docs/admin-api.md, "Players"). The
ETag is a digest of the player's fields, epoch and updated_at included, so a revoke
changes it too. The conditions are read here, as RFC 9110 writes them, and checked by
the operations layer in the write's own transaction (authsvc/operations/'s
put_player), so two concurrent renames cannot both win, nor two create-only signups of one id.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

from authsvc.errors import PreconditionFailed
from authsvc.store.base import Player

# RFC 9110 8.8.3: entity-tag = [ "W/" ] DQUOTE *etagc DQUOTE, etagc = %x21 / %x23-7E / obs-text; a
# list of them, separated by commas (empty elements allowed, as in every list of RFC 9110, 5.6.1).
_TAG = r'(?:W/)?"[\x21\x23-\x7e\x80-\xff]*"'
_TAGS = re.compile(rf"[ \t,]*{_TAG}(?:[ \t]*,[ \t,]*{_TAG})*[ \t,]*")
_ONE_TAG = re.compile(_TAG)


@dataclasses.dataclass(frozen=True, slots=True)
class Condition:
    """An If-Match or If-None-Match header: ``*`` (any current version), the entity tags it lists,
    or ``tags`` None: neither, a condition that cannot hold (an ETag sent without its quotes)."""

    header: str
    tags: tuple[str, ...] | None
    any: bool = False


def etag(player: Player) -> str:
    """A digest of every field of the answer. A row no write has changed since the schema step that
    added updated_at (null) keeps the ETag the release before gave it, so an If-Match kept across
    the upgrade still matches; a rename and its undoing give a new one (the answer's updated_at
    moved)."""
    text = f"{player.user_id}:{player.username}:{int(player.enabled)}:{player.epoch}"
    if player.updated_at_ms is not None:
        text += f":{player.updated_at_ms}"
    return '"' + hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:32] + '"'


def condition(header: str, value: str | None) -> Condition | None:
    """The header as sent (None: not sent), read; an unreadable one is checked (412) only after the
    body's fields, like any condition."""
    if value is None:
        return None
    if value.strip(" \t") == "*":
        return Condition(header, (), any=True)
    if not _TAGS.fullmatch(value):
        return Condition(header, None)
    return Condition(header, tuple(_ONE_TAG.findall(value)))


def _unreadable(cond: Condition) -> PreconditionFailed:
    return PreconditionFailed(
        f'{cond.header} is neither * nor a list of quoted entity tags ("...", W/"...")'
    )


def check_if_match(cond: Condition | None, user_id: int, player: Player | None) -> None:
    """RFC 9110 If-Match: ``*`` holds for any current player, a list when one tag names its version
    by the strong comparison (13.1.1: a weak tag ``W/"..."`` never does); else
    PreconditionFailed."""
    if cond is None:
        return
    if cond.tags is None:
        raise _unreadable(cond)
    if player is None or not (cond.any or etag(player) in cond.tags):
        raise PreconditionFailed(f"player {user_id} is not at the version If-Match names")


def check_if_none_match(cond: Condition | None, user_id: int, player: Player | None) -> None:
    """RFC 9110 If-None-Match: ``*`` holds when there is no player (the create-only signup), a list
    when no tag names its version by the weak comparison; else PreconditionFailed."""
    if cond is None:
        return
    if cond.tags is None:
        raise _unreadable(cond)
    if player is None:
        return
    if cond.any:
        raise PreconditionFailed(f"player {user_id} exists (If-None-Match: *)")
    if etag(player) in {tag.removeprefix("W/") for tag in cond.tags}:
        raise PreconditionFailed(f"player {user_id} is at a version If-None-Match names")
