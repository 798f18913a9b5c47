"""The web process reading from a hot standby: never fresher-looking than it is (docs/stores.md, "Hot standby").

A throwaway primary and a ``pg_basebackup -R`` standby from the local binaries; the
admin store writes on the primary, a read-only store reads on the standby.
"""

from __future__ import annotations

import time

import pytest

from authsvc.errors import StoreUnavailable
from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.tokens import api_key_digest
from tests.pgserver import ThrowawayPostgres, ThrowawayStandby, find_bin_dir
from tests.support import skip_or_fail


@pytest.fixture(scope="module")
def servers():
    bin_dir = find_bin_dir()
    if bin_dir is None:
        skip_or_fail("PostgreSQL binaries (initdb, pg_ctl, pg_basebackup) not found")
    primary = ThrowawayPostgres(bin_dir)
    standby = None
    try:
        primary.start()
        standby = ThrowawayStandby(primary)
        standby.start()
        yield primary, standby
    finally:
        if standby is not None:
            standby.destroy()
        primary.destroy()


def _sql(url: str, statement: str):
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(statement).fetchone()


def _wait_replayed(primary, standby) -> None:
    lsn = _sql(primary.url, "SELECT pg_current_wal_lsn()")[0]
    deadline = time.monotonic() + 30
    while _sql(standby.url, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'")[0] is not True:
        assert time.monotonic() < deadline, "the standby did not catch up in 30 s"
        time.sleep(0.05)


def test_a_standby_never_answers_from_beyond_the_bound(servers):
    primary, standby = servers
    admin = open_store(primary.url, readonly=False)
    admin.migrate()
    key = "k" * 40
    game = admin.add_game("standby-game", api_key_digest(key), int(time.time()))
    alice, bob = admin.add_player(1001, "alice"), admin.add_player(1002, "bob")
    _wait_replayed(primary, standby)
    settings = Settings(store=standby.url, token_secret_file="/nonexistent", max_staleness=1.0)
    reader = open_store(standby.url, readonly=True, settings=settings)
    digest = api_key_digest(key)
    try:
        # (a) a healthy standby answers.
        found = reader.credentials(digest, alice.user_id)
        assert found is not None and found.game_id == game.id and found.epoch == alice.epoch

        # (b) replay paused, alice revoked on the primary 1.5 s ago: no answer from the standby
        # for her (the revoke is not visible there) nor for bob (a 403 from lag would be wrong).
        _sql(standby.url, "SELECT pg_wal_replay_pause()")
        revoked_epoch = admin.revoke_player(alice.user_id)
        time.sleep(1.5)
        for user_id in (alice.user_id, bob.user_id):
            for _ in range(10):
                with pytest.raises(StoreUnavailable):
                    reader.credentials(digest, user_id)

        # (c) replay resumed: the standby answers again, with the revoke.
        _sql(standby.url, "SELECT pg_wal_replay_resume()")
        _wait_replayed(primary, standby)
        assert reader.credentials(digest, alice.user_id).epoch == revoked_epoch
        assert reader.credentials(digest, bob.user_id).epoch == bob.epoch

        # (d) an idle primary (no writes for > 2 s) does not make a caught-up standby look stale.
        time.sleep(2.5)
        for _ in range(10):
            assert reader.credentials(digest, bob.user_id).epoch == bob.epoch
    finally:
        reader.close()
        admin.close()
