"""The restore ledger: a small file outside the store that a restore reads (docs/operations.md,
section 8).

A backup cannot know what happened after it. Two facts must outlive the store so that restoring
an older copy revives nothing: each deleted player's id and last credential epoch (never a name),
written by the deletion's transaction before it commits, and each restore's generation (the
credential epochs it moved every player past: store/restore.py). Lines of text, appended and
fsynced: ``deleted USER_ID EPOCH`` and ``generation N``. A line is never rewritten; a torn last line
is ignored.
"""

from __future__ import annotations

import os

from authsvc.errors import ConfigError

__all__ = ["Ledger", "append_deletion", "append_generation", "read"]


class Ledger:
    """What a ledger file holds: the highest restore generation and, per deleted user id, the
    highest epoch."""

    def __init__(self) -> None:
        self.generation = 0
        self.deleted: dict[int, int] = {}

    def add_deleted(self, user_id: int, epoch: int) -> None:
        self.deleted[user_id] = max(epoch, self.deleted.get(user_id, epoch))


def read(path: str | None, into: Ledger | None = None) -> Ledger:
    """The ledger at ``path`` (none there: an empty one); ConfigError if it cannot be read."""
    ledger = into or Ledger()
    if not path:
        return ledger
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        return ledger
    except OSError as e:
        raise ConfigError(f"restore ledger {path} cannot be read: {e.strerror}") from None
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break  # a line cut short by a crash: its write never returned
        words = line.split()
        if len(words) == 3 and words[0] == "deleted" and words[1].isdigit() and words[2].isdigit():
            ledger.add_deleted(int(words[1]), int(words[2]))
        elif len(words) == 2 and words[0] == "generation" and words[1].isdigit():
            ledger.generation = max(ledger.generation, int(words[1]))
    return ledger


def _append(path: str, line: str) -> None:
    """Append one line and fsync it (and the directory, when the file is new): on disk before the
    caller goes on."""
    try:
        new = not os.path.exists(path)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    except OSError as e:
        raise ConfigError(
            f"restore ledger {path} cannot be written: {e.strerror} "
            f"(AUTHSVC_RESTORE_LEDGER, docs/operations.md section 8)"
        ) from None


def append_deletion(path: str, user_id: int, epoch: int) -> None:
    _append(path, f"deleted {user_id:d} {epoch:d}\n")


def append_generation(path: str, generation: int) -> None:
    _append(path, f"generation {generation:d}\n")
