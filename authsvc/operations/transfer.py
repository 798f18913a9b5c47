"""``authsvc export`` / ``authsvc import``: a whole store as JSON lines, to move between engines.

The file, one JSON object a line (docs/stores.md):

    {"format": "authsvc-export", "version": 1, "game_id_high_water": N, "exported_at": T}
    {"type": "game", "id": 1, "name": "...", "enabled": true, "created_at": T,
     "keys": [{"digest": "<sha256 hex>", "created_at": T, "expires_at": T or null}]}
    {"type": "player", "user_id": 42, "username": "...", "epoch": 0, "enabled": true,
    "updated_at_ms": T or null} {"type": "deleted_player", "user_id": 43, "epoch": 2}
    {"type": "end", "games": G, "players": P, "sha256": "<hex of every line above>"}

Game ids and credential epochs are kept, so tokens (HMAC over
"<game id>:<user id>:<epoch>") and api keys (stored as digests) work after the
move, given the same token secret file. A player's ``updated_at_ms`` (unix milliseconds,
null when not known) is kept too; a file of an earlier release has none, and its players
come in with null, as the schema step that added it left them. A deleted player is its id and the
epoch it had, no name (docs/admin.md, "Erasure"): moved with the store, so the same id signed up
again on the new one still starts past it. A file of an earlier release has none; a release before
this one refuses a file that has some (an unexpected line), rather than losing them. The end line
makes a truncated or edited file fail the import, and the import writes everything or nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from typing import BinaryIO

from authsvc.errors import Conflict, Invalid
from authsvc.store.audit import Audit
from authsvc.store.base import ApiKey, DeletedPlayer, Game, NotEmpty, Player, Store

FORMAT = "authsvc-export"
VERSION = 1
MAX_ID = 2**63 - 1
_DIGEST = re.compile(r"[0-9a-f]{64}")


class TransferError(Invalid):
    """A file that cannot be exported to or imported from; one line for the admin."""


def export_store(store: Store, path: str) -> tuple[int, int]:
    """Write the store to a new file (mode 0600: it holds key digests); returns (games, players)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise TransferError(
            f"cannot create {path}: {e.strerror} (export never overwrites a file)"
        ) from None
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as out:
            return write_export(store, out)
    except BaseException:
        os.unlink(path)  # never leave half a store behind
        raise


def write_export(store: Store, out: BinaryIO) -> tuple[int, int]:
    digest = hashlib.sha256()

    def emit(obj: dict) -> None:
        line = (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        digest.update(line)
        out.write(line)

    header = {
        "format": FORMAT,
        "version": VERSION,
        "game_id_high_water": store.game_id_high_water(),
    }
    emit(header | {"exported_at": int(time.time())})
    games = players = 0
    for item in store.dump():
        if isinstance(item, Game):
            games += 1
            keys = [
                {"digest": k.digest, "created_at": k.created_at, "expires_at": k.expires_at}
                for k in item.keys
            ]
            emit(
                {
                    "type": "game",
                    "id": item.id,
                    "name": item.name,
                    "enabled": item.enabled,
                    "created_at": item.created_at,
                    "keys": keys,
                }
            )
        elif isinstance(item, DeletedPlayer):
            emit({"type": "deleted_player", "user_id": item.user_id, "epoch": item.epoch})
        else:
            players += 1
            emit(
                {
                    "type": "player",
                    "user_id": item.user_id,
                    "username": item.username,
                    "epoch": item.epoch,
                    "enabled": item.enabled,
                    "updated_at_ms": item.updated_at_ms,
                }
            )
    end = {"type": "end", "games": games, "players": players, "sha256": digest.hexdigest()}
    out.write((json.dumps(end, separators=(",", ":")) + "\n").encode("ascii"))
    return games, players


def import_store(
    store: Store,
    path: str,
    progress: Callable[[int], None] | None = None,
    *,
    audit: Audit | None = None,
) -> tuple[int, int]:
    """Load an export into an empty store, all or nothing, with one audit record; returns (games,
    players)."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise TransferError(f"cannot read {path}: {e.strerror}") from None
    with f:
        reader = _Reader(f)
        high_water = reader.header()
        games = reader.games()
        try:
            with store.write(audit) as tx:
                return tx.load(games, reader.players(), high_water, progress)
        except NotEmpty:  # its own words: nothing to add
            raise
        except Conflict as e:  # the store's words, with the file that broke the rule
            raise TransferError(f"{path} is inconsistent: {e}; nothing was imported") from None


class _Reader:
    """Parses and checks the file line by line; any problem raises TransferError with the line
    number."""

    def __init__(self, f: BinaryIO):
        self.f = f
        self.line_no = 0
        self.digest = hashlib.sha256()
        self.pending: dict | None = None  # the first line after the games
        self.count = {"game": 0, "player": 0}

    def _next(self) -> dict | None:
        raw = self.f.readline()
        if not raw:
            return None
        self.line_no += 1
        try:
            obj = json.loads(raw)
        except (
            ValueError,
            RecursionError,
        ):  # RecursionError: nested deeper than Python's stack allows
            raise self.error("not a JSON object") from None
        if not isinstance(obj, dict):
            raise self.error("not a JSON object")
        if obj.get("type") != "end":
            self.digest.update(raw)
        return obj

    def error(self, message: str) -> TransferError:
        return TransferError(f"line {self.line_no}: {message}; nothing was imported")

    def header(self) -> int:
        try:
            obj = self._next()
        except TransferError:
            obj = None
        if obj is None or obj.get("format") != FORMAT:
            raise TransferError("not an authsvc export file (no header line); nothing was imported")
        if obj.get("version") != VERSION:
            raise self.error(
                f"export format version {obj.get('version')!r}, this release reads {VERSION}"
            )
        return self._int(obj, "game_id_high_water", 0)

    def _int(self, obj: dict, name: str, low: int) -> int:
        value = obj.get(name)
        if type(value) is not int or not low <= value <= MAX_ID:
            raise self.error(f"{name} must be a whole number from {low} to 2^63-1")
        return value

    def _int_or_null(
        self, obj: dict, name: str, low: int, absent_is_null: bool = False
    ) -> int | None:
        """Like _int, but a field present as null is None (a key that never expires), and an absent
        one too if ``absent_is_null`` (a field an earlier release did not write)."""
        if (name in obj and obj[name] is None) or (absent_is_null and name not in obj):
            return None
        return self._int(obj, name, low)

    def _bool(self, obj: dict, name: str) -> bool:
        if type(obj.get(name)) is not bool:
            raise self.error(f"{name} must be true or false")
        return obj[name]

    def _str(self, obj: dict, name: str) -> str:
        value = obj.get(name)
        if type(value) is not str or not value.strip():
            raise self.error(f"{name} must be a non-empty string")
        return value

    def games(self) -> list[Game]:
        games = []
        while (obj := self._next()) is not None and obj.get("type") == "game":
            keys = obj.get("keys")
            if not isinstance(keys, list) or not all(isinstance(k, dict) for k in keys):
                raise self.error("keys must be a list of objects")
            for k in keys:
                if type(k.get("digest")) is not str or not _DIGEST.fullmatch(k["digest"]):
                    raise self.error("a key digest must be 64 lowercase hex characters")
            api_keys = tuple(
                ApiKey(
                    k["digest"],
                    self._int(k, "created_at", 0),
                    self._int_or_null(k, "expires_at", 0),
                )
                for k in keys
            )
            games.append(
                Game(
                    self._int(obj, "id", 1),
                    self._str(obj, "name"),
                    self._bool(obj, "enabled"),
                    self._int(obj, "created_at", 0),
                    api_keys,
                )
            )
            self.count["game"] += 1
        self.pending = obj
        return games

    def players(self) -> Iterator[Player | DeletedPlayer]:
        obj, last = self.pending, 0
        while obj is not None and obj.get("type") == "player":
            player = Player(
                self._int(obj, "user_id", 1),
                self._str(obj, "username"),
                self._int(obj, "epoch", 0),
                self._bool(obj, "enabled"),
                self._int_or_null(obj, "updated_at_ms", 0, absent_is_null=True),
            )
            if player.user_id <= last:
                raise self.error("players must come in increasing user_id order, each once")
            last = player.user_id
            self.count["player"] += 1
            yield player
            obj = self._next()
        last = 0
        while obj is not None and obj.get("type") == "deleted_player":
            deleted = DeletedPlayer(self._int(obj, "user_id", 1), self._int(obj, "epoch", 0))
            if deleted.user_id <= last:
                raise self.error("deleted players must come in increasing user_id order, each once")
            last = deleted.user_id
            yield deleted
            obj = self._next()
        self._end(obj)

    def _end(self, obj: dict | None) -> None:
        if obj is None:
            raise TransferError(
                "the file ends without its end line (truncated?); nothing was imported"
            )
        if obj.get("type") != "end":
            raise self.error(f"unexpected line of type {obj.get('type')!r}")
        if obj.get("games") != self.count["game"] or obj.get("players") != self.count["player"]:
            raise self.error("the counts on the end line do not match the file (truncated?)")
        if obj.get("sha256") != self.digest.hexdigest():
            raise self.error(
                "the checksum on the end line does not match the file (edited or damaged?)"
            )
        if self.f.readline().strip():
            raise TransferError(
                f"line {self.line_no + 1}: data after the end line; nothing was imported"
            )
