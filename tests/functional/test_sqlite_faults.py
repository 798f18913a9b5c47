"""Faults of the embedded store: an unreadable file gives 503, an unplanned error an opaque 500.

These tests corrupt or replace the SQLite file, so they pin the store to SQLite.
"""

from __future__ import annotations

import pytest
import webtest

from authsvc.tokens import api_key_digest
from authsvc.web.app import make_app
from tests.support import ERROR_KEYS, PATH, assert_contract_headers, make_testapp

pytestmark = pytest.mark.engine("sqlite")


def test_store_unreadable_is_503_json(world, tmp_path):
    app = make_testapp(world.settings)  # checked the store at start-up
    params = world.params()
    path = world.settings.store.removeprefix("sqlite://")
    world.store.close()
    junk = tmp_path / "junk"
    junk.write_bytes(b"this is not a database" * 500)
    for suffix in ("-wal", "-shm"):
        tmp_path.joinpath("authsvc.db" + suffix).unlink(missing_ok=True)
    junk.replace(path)
    r = app.get(PATH, params, status=503)
    assert r.json["success"] is False and r.json["error"] == 503
    assert set(r.json) == ERROR_KEYS
    assert_contract_headers(r)


def test_unexpected_error_is_opaque_500_and_logged_without_the_query(world, caplog):
    """Fault injection: a store that fails in a way nobody planned for."""

    class BrokenStore(type(world.store)):
        def credentials(self, key_digest, user_id):
            raise ValueError("leaked: " + key_digest)

    store = BrokenStore(world.settings.store, readonly=True)
    app = webtest.TestApp(make_app(world.settings, store=store), lint=True)
    params = world.params()
    r = app.get(PATH, params, status=500)
    assert r.json == {"success": False, "error": 500, "error_description": "Internal server error"}
    assert_contract_headers(r)
    logged = caplog.text
    assert "ValueError" in logged and "credentials" in logged
    for secret in (params["api_key"], params["game_auth_token"], api_key_digest(params["api_key"])):
        assert secret not in logged
