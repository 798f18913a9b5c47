"""The web process reading from a hot standby: never fresher-looking than it is (docs/stores.md,
"Hot standby").

A throwaway primary and a ``pg_basebackup -R`` standby from the local binaries; the
admin store writes on the primary, a read-only store reads on the standby, and the
real ``authsvc heartbeat`` command writes the primary's time for the standby to prove
its freshness with. Waits are bounded polls or sleeps past the bound (which can only
make a stale answer older), never a race against the clock.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time

import pytest

from authsvc.errors import StoreUnavailable
from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.tokens import api_key_digest, mint_token
from authsvc.web.authenticate import Authenticator
from tests import factories
from tests.pgserver import Heartbeat, primary_with_standby, sql, wait_replayed
from tests.support import free_port, skip_or_fail, wait_for_port

BOUND = 1.0  # AUTHSVC_MAX_STALENESS of the reader
PAST_BOUND = 1.5  # how long after a change the standby must no longer answer from before it
KEY = "k" * 40


@pytest.fixture(scope="module")
def servers():
    with primary_with_standby() as servers:
        yield servers


@pytest.fixture(scope="module")
def world(servers, tmp_path_factory):
    """Players alice and bob, a game, a heartbeat writer and a reader on the standby."""
    primary, standby = servers
    admin = open_store(primary.url, readonly=False)
    admin.migrate()
    game = factories.add_game(admin, "standby-game", api_key_digest(KEY), int(time.time()))
    alice, bob = (
        factories.add_player(admin, 1001, "alice"),
        factories.add_player(admin, 1002, "bob"),
    )
    heartbeat = Heartbeat(primary.url, tmp_path_factory.mktemp("heartbeat") / "heartbeat.log")
    heartbeat.start()
    reader = _reader(standby)
    try:
        wait_replayed(primary, standby)
        _until_answers(reader, heartbeat, bob.user_id)
        yield admin, reader, heartbeat, game, alice, bob
    finally:
        heartbeat.stop()
        reader.close()
        admin.close()


def _reader(standby):
    settings = Settings(store=standby.url, token_secret_file="/nonexistent", max_staleness=BOUND)
    return open_store(standby.url, readonly=True, settings=settings)


def _until_answers(reader, heartbeat, user_id: int):
    """The standby's answer for ``user_id`` once it can prove its freshness again (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return reader.credentials(api_key_digest(KEY), user_id)
        except StoreUnavailable:
            assert time.monotonic() < deadline, (
                "the standby stayed unavailable for 30 s\n" + heartbeat.log()
            )
            time.sleep(0.1)


def _unavailable_for(reader, *user_ids: int) -> None:
    """Ten tries per player, each a 503 (StoreUnavailable): neither a success nor a 403 from lag."""
    for user_id in user_ids:
        for _ in range(10):
            with pytest.raises(StoreUnavailable):
                reader.credentials(api_key_digest(KEY), user_id)


def test_a_standby_never_answers_from_beyond_the_bound(servers, world):
    primary, standby = servers
    admin, reader, heartbeat, game, alice, bob = world
    digest = api_key_digest(KEY)
    # (a) a healthy standby answers.
    found = reader.credentials(digest, alice.user_id)
    assert found is not None and found.game_id == game.id and found.epoch == alice.epoch

    # (b) replay paused, alice revoked on the primary 1.5 s ago: no answer from the standby
    # for her (the revoke is not visible there) nor for bob (a 403 from lag would be wrong).
    sql(standby.url, "SELECT pg_wal_replay_pause()")
    revoked_epoch = factories.revoke_player(admin, alice.user_id)
    time.sleep(PAST_BOUND)
    _unavailable_for(reader, alice.user_id, bob.user_id)

    # (c) replay resumed: the standby answers again, with the revoke.
    sql(standby.url, "SELECT pg_wal_replay_resume()")
    wait_replayed(primary, standby)
    assert _until_answers(reader, heartbeat, alice.user_id).epoch == revoked_epoch
    assert reader.credentials(digest, bob.user_id).epoch == bob.epoch

    # (d) an idle primary (no writes but the heartbeat's for > 2 s) does not make a caught-up
    # standby look stale.
    time.sleep(2.5)
    for _ in range(10):
        assert reader.credentials(digest, bob.user_id).epoch == bob.epoch


def test_a_token_minted_after_a_signup_is_accepted_once_the_standby_has_replayed_it(servers, world):
    """What a web process on a standby cannot close (docs/stores.md, "Bounded staleness"): a token
    minted after a signup on the primary is refused while the standby has not replayed the signup
    (403 within the bound, 503 past it), never accepted; once replayed, at once, as the token of a
    revoke after it."""
    primary, standby = servers
    admin, reader, heartbeat, game, alice, bob = world
    secret = b"standby-test-secret"
    authenticate = Authenticator(reader, (secret,))

    def reason(epoch: int) -> str:
        params = {
            "user_id": "1003",
            "game_auth_token": mint_token(secret, game.id, 1003, epoch),
            "api_key": KEY,
        }
        try:
            return authenticate(params)[2]  # (error, body, reason, game, user)
        except StoreUnavailable:
            return "store_unavailable"

    sql(standby.url, "SELECT pg_wal_replay_pause()")
    try:
        factories.add_player(admin, 1003, "carol")
        assert reason(0) in ("unknown_player", "store_unavailable")
    finally:
        sql(standby.url, "SELECT pg_wal_replay_resume()")
    wait_replayed(primary, standby)
    _until_answers(reader, heartbeat, 1003)
    assert reason(0) == "success"
    factories.revoke_player(admin, 1003)
    wait_replayed(primary, standby)
    assert reason(1) == "success"


def test_a_standby_cut_off_from_the_primary_answers_503(servers, world):
    """The WAL receiver disconnected: received = replayed, yet a revoke on the primary is not
    seen."""
    primary, standby = servers
    admin, reader, heartbeat, game, alice, bob = world
    conninfo = sql(standby.url, "SHOW primary_conninfo")[0]
    sql(standby.url, "ALTER SYSTEM SET primary_conninfo = ''")
    try:
        sql(standby.url, "SELECT pg_reload_conf()")
        deadline = time.monotonic() + 30
        while sql(standby.url, "SELECT count(*) FROM pg_stat_wal_receiver")[0]:
            assert time.monotonic() < deadline, "the WAL receiver did not stop in 30 s"
            time.sleep(0.05)
        assert (
            sql(standby.url, "SELECT pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()")[0]
            is True
        )
        revoked_epoch = factories.revoke_player(admin, alice.user_id)
        time.sleep(PAST_BOUND)
        _unavailable_for(reader, alice.user_id, bob.user_id)
    finally:
        escaped = conninfo.replace("'", "''")
        sql(standby.url, f"ALTER SYSTEM SET primary_conninfo = '{escaped}'")
        sql(standby.url, "SELECT pg_reload_conf()")
    wait_replayed(primary, standby)
    assert _until_answers(reader, heartbeat, alice.user_id).epoch == revoked_epoch


def test_without_the_heartbeat_the_standby_answers_503_until_it_resumes(servers, world, caplog):
    primary, standby = servers
    admin, _, heartbeat, game, alice, bob = world
    reader = _reader(standby)  # its first warning is not held back by the other tests' ones
    heartbeat.stop()
    try:
        time.sleep(PAST_BOUND)
        _unavailable_for(reader, bob.user_id)
        # The warning gives the heartbeat's age, past the bound; how far past depends on the
        # machine's load.
        ages = [
            float(age)
            for age in re.findall(
                rf"heartbeat is (\d+\.\d) s old, AUTHSVC_MAX_STALENESS is {BOUND:g} s", caplog.text
            )
        ]
        assert ages and all(age > BOUND for age in ages), caplog.text
        # The heartbeat row gone (deleted by hand): 503 too, and the log says so.
        sql(primary.url, "DELETE FROM authsvc_heartbeat")
        wait_replayed(primary, standby)
        caplog.clear()
        _unavailable_for(reader, bob.user_id)
        assert "heartbeat row is missing" in caplog.text, caplog.text
    finally:
        heartbeat.start()
    assert _until_answers(reader, heartbeat, bob.user_id).epoch == bob.epoch
    reader.close()


def test_with_the_primary_stopped_the_standby_answers_503_until_it_is_back(servers, world):
    primary, standby = servers
    admin, reader, heartbeat, game, alice, bob = world
    primary.stop()
    try:
        time.sleep(PAST_BOUND)
        _unavailable_for(reader, alice.user_id, bob.user_id)
    finally:
        primary.start()
    assert _until_answers(reader, heartbeat, bob.user_id).epoch == bob.epoch
    # The writer said that it could not write, and that it writes again (no password in either
    # line).
    text = heartbeat.log()
    assert "cannot write" in text and "writing again" in text, text


@contextlib.contextmanager
def _pgbouncer(standby):
    """A pgbouncer (transaction mode, one server connection) in front of the standby; yields its
    URL."""
    binary = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None
    )
    if binary is None:
        skip_or_fail("pgbouncer is not installed (apt-get install pgbouncer)")
    directory, port = tempfile.mkdtemp(prefix="authsvc-pgbouncer-"), free_port()
    config = os.path.join(directory, "pgbouncer.ini")
    with open(os.path.join(directory, "users.txt"), "w") as f:
        f.write('"postgres" ""\n')
    with open(config, "w") as f:
        f.write(
            f"[databases]\nauthsvc = host=127.0.0.1 port={standby.port} "
            "dbname=postgres\n[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\nauth_type = trust\n"
            f"auth_file = {directory}/users.txt\npool_mode = transaction\ndefault_pool_size = 1\n"
            "ignore_startup_parameters = options\n"
        )
    if standby.user:  # pgbouncer refuses to run as root
        for path in (directory, config, os.path.join(directory, "users.txt")):
            os.chown(path, pwd.getpwnam(standby.user).pw_uid, -1)
    proc = subprocess.Popen(
        [binary, config], user=standby.user, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(port)
        yield f"postgresql://postgres@127.0.0.1:{port}/authsvc"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


def test_through_pgbouncer_the_standby_keeps_the_bound(servers, world):
    """Behind a pooler the query is sent unnamed (docs/stores.md, "pgbouncer"), with the same
    freshness column."""
    primary, standby = servers
    admin, _, heartbeat, game, alice, bob = world
    with _pgbouncer(standby) as url:
        settings = Settings(store=url, token_secret_file="/nonexistent", max_staleness=BOUND)
        readers = [
            open_store(url, readonly=True, settings=settings) for _ in range(2)
        ]  # taking turns on one
        try:
            for reader in readers * 3:
                assert _until_answers(reader, heartbeat, bob.user_id).epoch == bob.epoch
            assert readers[0]._local.pooled and readers[0]._local.standby
            sql(standby.url, "SELECT pg_wal_replay_pause()")
            try:
                time.sleep(PAST_BOUND)
                for reader in readers:
                    _unavailable_for(reader, bob.user_id)
            finally:
                sql(standby.url, "SELECT pg_wal_replay_resume()")
            for reader in readers:
                assert _until_answers(reader, heartbeat, bob.user_id).epoch == bob.epoch
        finally:
            for reader in readers:
                reader.close()
