"""What a restore changes in the restored copy, on either engine (docs/operations.md, section 8).

A backup is older than the tokens and deletions made since. So the restored copy is changed, in
one write transaction, before any process reads it:

- **The credential epochs move past every epoch there can have been.** Each restore has a
  generation (kept in the store's ``restore_generation`` and in the restore ledger,
  store/ledger.py), one more than the highest the backup, the live store or the ledger knows. Every
  player's and every deleted player's epoch becomes ``generation << SHIFT`` + its low bits + 1, and
  a player new to the store starts at ``generation << SHIFT`` (store/writes.py's continue_epochs):
  no epoch of the generation before reaches that, so no token minted before the restore
  authenticates after it.
- **Players deleted after the backup stay deleted.** Each one the ledger or the live store lists
  with an epoch at or past its epoch in the copy is deleted again, with a deletion's erasure
  (store/writes.py's delete_player). A player signed up again after its deletion has a higher epoch
  and stays.
- **No webhook subscription survives**, and no event is sent again: every webhook is removed, its
  secret emptied, every pending delivery failed. Subscribe again after a restore.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

__all__ = ["POSTGRES_TABLE", "SHIFT", "SQLITE_TABLE", "Restored", "apply", "floor", "generation"]

# 2^32 epochs per generation: a player revoked four billion times between two restores would reach
# the next.
SHIFT = 32
LOW_BITS = (1 << SHIFT) - 1

SQLITE_TABLE = "CREATE TABLE restore_generation (generation INTEGER NOT NULL)"
POSTGRES_TABLE = (
    "CREATE TABLE restore_generation (generation bigint NOT NULL); "
    "REVOKE ALL ON restore_generation FROM PUBLIC;"
)


@dataclasses.dataclass(frozen=True)
class Restored:
    """What a restore did: its generation, the players it kept (each needs a new token), those it
    deleted again."""

    generation: int
    players: int
    erased: int
    webhooks: int


def generation(conn, d) -> int:
    """The store's restore generation (0: never restored)."""
    row = conn.execute(d.sql("SELECT max(generation) FROM restore_generation")).fetchone()
    return int(row[0] or 0)


def floor(conn, d) -> int:
    """The lowest epoch a player may have in this generation."""
    return generation(conn, d) << SHIFT


def apply(tx, outside_generation: int, deleted: Mapping[int, int]) -> Restored:
    """In ``tx`` (the restored copy's first write): the three changes above. ``outside_generation``:
    the highest generation known outside the copy (the ledger, the live store); ``deleted``: user id
    -> the highest epoch each had when it was deleted, from the ledger and the live store."""
    conn, d = tx.bulk_connection(), tx.d
    tx.locked()
    new = max(generation(conn, d), outside_generation) + 1
    erased = 0
    for user_id, epoch in sorted(deleted.items()):
        row = conn.execute(
            d.sql("SELECT epoch FROM players WHERE user_id = ?"), (user_id,)
        ).fetchone()
        if row is not None and row[0] <= epoch:  # the copy predates the deletion
            tx.delete_player(user_id, ledger=False)
            erased += 1
        if row is not None and row[0] > epoch:
            continue  # signed up again after that deletion: it stays
        kept = conn.execute(
            d.sql("SELECT epoch FROM deleted_players WHERE user_id = ?"), (user_id,)
        ).fetchone()
        if kept is None:
            conn.execute(
                d.sql("INSERT INTO deleted_players (user_id, epoch) VALUES (?, ?)"),
                (user_id, epoch),
            )
        elif kept[0] < epoch:
            conn.execute(
                d.sql("UPDATE deleted_players SET epoch = ? WHERE user_id = ?"), (epoch, user_id)
            )
    base = new << SHIFT
    players = conn.execute(
        d.sql(f"UPDATE players SET epoch = ? + (epoch & {LOW_BITS:d}) + 1, updated_at_ms = ?"),
        (base, tx.at_ms),
    ).rowcount
    conn.execute(
        d.sql(f"UPDATE deleted_players SET epoch = ? + (epoch & {LOW_BITS:d}) + 1"), (base,)
    )
    conn.execute(d.sql("DELETE FROM restore_generation"))
    conn.execute(d.sql("INSERT INTO restore_generation (generation) VALUES (?)"), (new,))
    conn.execute(
        d.sql(
            "UPDATE deliveries SET state = 'failed', done_at = ?, last_error = 'restored from a "
            "backup' WHERE state = 'pending'"
        ),
        (tx.at_ms,),
    )
    webhooks = conn.execute(
        d.sql("UPDATE webhooks SET secret = '', deleted_at = ? WHERE deleted_at IS NULL"),
        (tx.at_ms,),
    ).rowcount
    conn.execute(d.sql("UPDATE webhooks SET secret = ''"))
    tx.record(
        "store.restore",
        after={
            "generation": new,
            "players": players,
            "erased": erased,
            "webhooks_removed": webhooks,
        },
    )
    return Restored(new, players, erased, webhooks)
