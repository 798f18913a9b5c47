"""The SQLite -wal file stays bounded while the service is idle (docs/stores.md, "The -wal file").

A web worker keeps a read snapshot for up to AUTHSVC_MAX_STALENESS; while any
reader holds one, no checkpoint can pass it and the -wal file only grows. An
idle worker must let go of its snapshot by itself, and the admin command must
leave the -wal file at most WAL_LIMIT_BYTES.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import time

import pytest

from authsvc.store import open_store
from authsvc.store.sqlite.store import WAL_LIMIT_BYTES, SQLiteStore
from tests import factories
from tests.support import free_port, get, start_gunicorn, wait_for_port

REPO = pathlib.Path(__file__).resolve().parents[2]
WRITES = 1000


@pytest.mark.engine("sqlite")
def test_an_idle_reader_ends_its_snapshot_by_itself(world):
    reader = SQLiteStore(world.settings.store, readonly=True, max_staleness=0.2)
    try:
        assert reader.credentials("0" * 64, world.user_id) is None
        conn = reader._conn()
        assert conn.in_transaction  # the snapshot is kept between requests...
        deadline = time.monotonic() + 10  # ...and ended within about 2 x 0.2 s without one
        while conn.in_transaction and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not conn.in_transaction
        factories.revoke_player(
            world.store, world.user_id
        )  # the next request takes a new snapshot and sees it
        digest = next(iter(reader._conn().execute("SELECT digest FROM api_keys")))[0]
        assert reader.credentials(digest, world.user_id).epoch == 1
    finally:
        reader.close()


@pytest.mark.engine("sqlite")
def test_admin_writes_against_an_idle_service_leave_a_small_wal(env, world, tmp_path):
    """Real gunicorn with the shipped config and the default staleness: one request, then 1,000
    admin writes."""
    env = {k: v for k, v in env.items() if k != "AUTHSVC_MAX_STALENESS"}  # the default, 1 s
    port = free_port()
    env.update(AUTHSVC_WORKERS="2")
    proc = start_gunicorn(
        env,
        port=port,
        workers=None,
        config=REPO / "deploy/gunicorn.conf.py",
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
    )
    wal = world.store.path + "-wal"
    try:
        wait_for_port(port)
        for _ in range(4):  # the workers now hold snapshots, and then no request comes
            assert get(port, world.params()).status == 200
        for n in range(WRITES):  # as 1,000 admin commands would: open, write, close
            admin = open_store(world.settings.store, readonly=False, settings=world.settings)
            factories.add_game(admin, f"game {n}", f"{n:064x}", int(time.time()))
            admin.close()
        time.sleep(2.0)
        size = os.path.getsize(wal)
        assert size <= WAL_LIMIT_BYTES, (
            f"-wal file {size:,} bytes after {WRITES} writes and 2 s idle"
        )
        assert get(port, world.params()).status == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


@pytest.mark.engine("sqlite")
def test_a_removed_webhooks_secret_leaves_the_wal_and_the_main_file(admin, world):
    """docs/stores.md, "Erasure": the removal zeroes the secret in the main file (secure_delete)
    and, as a player's deletion does, empties the -wal file before it answers, whose frames still
    hold it."""
    headers = admin.headers("hooks", ["webhooks:read", "webhooks:write"])
    added = admin.app.post_json(
        "/v1/webhooks",
        {"url": "https://game.example.com/h", "events": ["player.created"]},
        headers=headers,
    )
    secret, hook_id = added.json["secret"], added.json["id"]
    kept = admin.app.post_json(
        "/v1/webhooks",
        {"url": "https://game.example.com/k", "events": ["player.created"]},
        headers=headers,
    ).json["secret"]
    path = world.store.path

    def files() -> bytes:
        return b"".join(
            pathlib.Path(path + s).read_bytes() for s in ("", "-wal") if os.path.exists(path + s)
        )

    assert secret.encode() in files()  # the search finds what is there
    assert admin.app.delete(f"/v1/webhooks/{hook_id}", headers=headers).status_int in (200, 204)
    answered = time.monotonic()
    while secret.encode() in (data := files()) and time.monotonic() - answered < 10:
        time.sleep(0.2)
    assert secret.encode() not in data, "the removed webhook's secret is still in the store's files"
    assert kept.encode() in data, "the live webhook's secret is gone too"
