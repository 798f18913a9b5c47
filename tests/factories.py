"""Rows a test sets up, written as the operations write them: one ``store.write()``, the
transaction's method.

The Store has one way to write (``with store.write(audit) as tx``, store/writes.py's Tx): these
one-call helpers keep a test's setup to one line. ``audit`` defaults to None, recorded as the actor
"unattributed"; the trail is never skipped.
"""

from __future__ import annotations


def add_game(store, name: str, key_digest: str, now: int, *, audit=None):
    with store.write(audit) as tx:
        return tx.add_game(name, key_digest, now)


def set_game_enabled(store, game_id: int, enabled: bool, *, audit=None) -> bool:
    with store.write(audit) as tx:
        return tx.set_game_enabled(game_id, enabled)


def add_api_key(
    store, game_id: int, key_digest: str, now: int, old_keys_expire_at: float | None, *, audit=None
) -> bool:
    with store.write(audit) as tx:
        return tx.add_api_key(game_id, key_digest, now, old_keys_expire_at)


def add_player(store, user_id: int, username: str, *, audit=None):
    with store.write(audit) as tx:
        return tx.add_player(user_id, username)


def rename_player(store, user_id: int, username: str, *, audit=None) -> bool:
    with store.write(audit) as tx:
        return tx.rename_player(user_id, username)


def set_player_enabled(store, user_id: int, enabled: bool, *, audit=None) -> bool:
    with store.write(audit) as tx:
        return tx.set_player_enabled(user_id, enabled)


def revoke_player(store, user_id: int, *, audit=None) -> int | None:
    with store.write(audit) as tx:
        return tx.revoke_player(user_id)


def delete_player(store, user_id: int, *, audit=None) -> int | None:
    with store.write(audit) as tx:
        return tx.delete_player(user_id)


def note(store, action: str, *, audit, game_id=None, user_id=None, after: dict | None = None):
    """A record of an event that changes no row (a token minted)."""
    with store.write(audit) as tx:
        return tx.record(action, game_id=game_id, user_id=user_id, after=after)


def audit_prune(store, before_ms: int, *, audit):
    with store.write(audit) as tx:
        return tx.prune_audit(before_ms)


def import_players(store, rows, progress=None, *, audit=None) -> int:
    """Players written as ``authsvc player import`` writes them: the transaction's bulk import."""
    with store.write(audit) as tx:
        return tx.import_players(rows, progress)


def load_store(
    store, games, players, game_id_high_water: int, progress=None, *, audit=None
) -> tuple[int, int]:
    """An export's games and players loaded as ``authsvc import`` loads them: one write,
    ``Tx.load``."""
    with store.write(audit) as tx:
        return tx.load(games, players, game_id_high_water, progress)
