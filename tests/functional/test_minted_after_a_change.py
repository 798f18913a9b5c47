"""A token minted right after a change authenticates at once (docs/stores.md, "Bounded staleness").

The finding: with the default bound (AUTHSVC_MAX_STALENESS=1) a SQLite web worker answers from a
snapshot up to 1 s old, so the token a web tier minted right after a revoke (epoch e+1, the
password-change path of docs/admin-api.md) or a signup (a player the snapshot lacks) was refused
with 403 "Invalid credentials" for up to a second. Now a token of the epoch the next change gives
(e+1; for a player the snapshot lacks 0, or a deleted id's epoch + 1) makes the reader look again
at the latest commit before refusing; the revocation promise still holds for the tokens a change
revoked: refused from ``effective_by`` on. Both engines: a PostgreSQL primary had no such lag (no
snapshot), and keeps none.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time

import pytest
import webtest

from authsvc.api.app import AdminApp
from authsvc.operations import api_tokens
from authsvc.operations.context import Context
from authsvc.store.base import Reader
from authsvc.store.sqlite.store import SQLiteStore
from authsvc.tokens import mint_token
from authsvc.web.app import App, make_app
from tests import factories
from tests.support import (
    INVALID,
    FakeClock,
    free_port,
    get,
    profile,
    start_gunicorn,
    until_both_workers_counted,
    wait_for_port,
)

PATH = "/api/authenticate.json"
REFUSED = INVALID
NEWBIE = 777


@pytest.fixture
def bounded(world):
    """The game-facing app and the in-process admin API, both with the default bound (1 s), on one
    store; and an admin API token that may write players and mint tokens."""
    settings = dataclasses.replace(world.settings, max_staleness=1.0)
    web = webtest.TestApp(make_app(settings), lint=True)
    admin = AdminApp(settings)
    _, token = api_tokens.add_api_token(
        world.store, Context(actor="cli:test"), "web-tier", ["players:write", "tokens:mint"]
    )
    yield web, webtest.TestApp(admin, lint=True), {"Authorization": f"Bearer {token}"}
    web.app.store.close()
    admin.store.close()


def _mint(admin, headers, game_id: int, user_id: int) -> str:
    return admin.post_json(
        "/v1/tokens", {"game_id": game_id, "user_id": user_id}, headers=headers
    ).json["game_auth_token"]


def test_a_token_minted_after_a_revoke_authenticates_at_once_and_the_old_one_stops_by_effective_by(
    bounded, world
):
    web, admin, headers = bounded
    old = world.params()
    warmed_at = time.monotonic()
    assert web.get(PATH, old).json["success"] is True  # the worker holds a snapshot of epoch 0
    revoked = admin.post("/v1/players/4242/revoke", headers=headers).json
    assert revoked["epoch"] == 1
    new = dict(old, game_auth_token=_mint(admin, headers, world.game_id, world.user_id))
    answer = web.get(PATH, new).json  # at once: well within the snapshot's second
    assert answer == {"success": True, "user_id": 4242, "username": "alice"}, (
        answer,
        time.monotonic() - warmed_at,
    )
    effective_by = datetime.datetime.fromisoformat(revoked["effective_by"]).timestamp()
    while (
        time.time() <= effective_by
    ):  # the promise: from effective_by on, the old token is refused
        time.sleep(0.05)
    assert web.get(PATH, old).json == REFUSED
    assert web.get(PATH, new).json["success"] is True


def test_a_token_minted_after_a_signup_authenticates_at_once(bounded, world):
    web, admin, headers = bounded
    warmed_at = time.monotonic()
    assert web.get(PATH, world.params()).json["success"] is True  # a snapshot without player 777
    assert (
        admin.put_json(f"/v1/players/{NEWBIE}", {"username": "newbie"}, headers=headers).status_int
        == 201
    )
    params = {
        "user_id": str(NEWBIE),
        "game_auth_token": _mint(admin, headers, world.game_id, NEWBIE),
        "api_key": world.api_key,
    }
    answer = web.get(PATH, params).json  # at once: well within the snapshot's second
    assert answer == {"success": True, "user_id": NEWBIE, "username": "newbie"}, (
        answer,
        time.monotonic() - warmed_at,
    )


# -- in process, on a clock the test moves: what looks again, and what does not
# --------------------------------


class Counting:
    """A Reader that counts the reads of the latest commit the authenticator asks for."""

    def __init__(self, reader: Reader):
        self.reader, self.fresh_reads = reader, 0

    def __getattr__(self, name):
        return getattr(self.reader, name)

    def fresh_credentials(self, key_digest: str, user_id: int):
        self.fresh_reads += 1
        return self.reader.fresh_credentials(key_digest, user_id)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def counted(world, clock):
    """(WebTest app, Counting reader) with the default bound; the SQLite snapshot ages only when the
    test says."""
    settings = dataclasses.replace(world.settings, max_staleness=1.0)
    if settings.store.startswith("sqlite://"):
        reader = SQLiteStore(settings.store, readonly=True, max_staleness=1.0, clock=clock)
    else:
        from authsvc.store import open_store

        reader = open_store(settings.store, readonly=True, settings=settings)
    counting = Counting(reader)
    yield webtest.TestApp(App(settings, counting), lint=True), counting
    reader.close()


def _token(world, epoch: int, user_id: int | None = None) -> str:
    return mint_token(
        world.settings.token_secrets[0], world.game_id, user_id or world.user_id, epoch
    )


def test_a_wrong_forged_or_revoked_token_never_makes_the_reader_look_again(counted, world, clock):
    web, reader = counted
    assert web.get(PATH, world.params()).json["success"] is True
    factories.revoke_player(world.store, world.user_id)
    clock.now += 1.0
    for token in (
        "0" * 64,
        _token(world, 0),
        _token(world, 5),
        "not a token",
        mint_token(b"x", world.game_id, world.user_id, 2),
    ):
        assert web.get(PATH, world.params(game_auth_token=token)).json == REFUSED
    assert (
        web.get(
            PATH,
            {
                "user_id": "4243",
                "game_auth_token": _token(world, 1, 4243),
                "api_key": world.api_key,
            },
        ).json
        == REFUSED
    )  # a missing player: only epoch 0 looks
    assert reader.fresh_reads == 0


def test_one_mac_on_success_two_on_any_refusal(counted, world):
    """The token of the next epoch is checked only once the answer is a refusal, for every refusal
    after the store (an existing or missing player, a known or unknown key: the same work,
    tests/functional/test_equal_work.py)."""
    web, reader = counted
    authenticate = web.app.authenticator
    missing = world.params(user_id="4243")
    unknown_key = world.params(api_key="4f0c6a4e-0000-4000-8000-000000000000")
    for params, macs in (
        (world.params(), 1),
        (world.params(game_auth_token="0" * 64), 2),
        (missing, 2),
        (unknown_key, 2),
    ):
        assert (
            profile(lambda params=params: authenticate(params)).count("TokenVerifier.matches")
            == macs
        ), params
    assert reader.fresh_reads == 0


@pytest.mark.engine("sqlite")
def test_two_revokes_then_a_mint_wait_for_the_bound(counted, world, clock):
    """The lookahead is one epoch: a token of e+2 against a snapshot of e is refused until the
    snapshot is renewed (within the bound), as any change is seen, without looking again."""
    web, reader = counted
    assert web.get(PATH, world.params()).json["success"] is True
    factories.revoke_player(world.store, world.user_id)
    factories.revoke_player(world.store, world.user_id)
    newest = world.params(game_auth_token=_token(world, 2))
    assert web.get(PATH, newest).json == REFUSED
    assert reader.fresh_reads == 0
    clock.now += 1.0
    assert web.get(PATH, newest).json["success"] is True


def test_a_token_of_the_next_epoch_is_checked_against_the_latest_commit(counted, world, clock):
    """Looking again accepts a token only if the latest commit says so: one of an epoch revoked
    meanwhile (e+1, then e+2), or of a player disabled meanwhile, is refused."""
    web, reader = counted
    looks = (
        1 if world.settings.store.startswith("sqlite://") else 0
    )  # a PostgreSQL primary sees each change at once
    assert web.get(PATH, world.params()).json["success"] is True  # snapshot: epoch 0
    factories.revoke_player(world.store, world.user_id)
    factories.revoke_player(world.store, world.user_id)
    assert web.get(PATH, world.params(game_auth_token=_token(world, 1))).json == REFUSED
    assert reader.fresh_reads == looks
    factories.revoke_player(world.store, world.user_id)  # epoch 3
    factories.set_player_enabled(world.store, world.user_id, False)
    assert web.get(PATH, world.params(game_auth_token=_token(world, 3))).json == REFUSED
    assert reader.fresh_reads == 2 * looks


@pytest.mark.engine("sqlite")
def test_looking_again_renews_the_snapshot(counted, world, clock):
    """One look per change and worker thread: the new snapshot holds the new epoch, so the next
    authentications with the new token need none, and the old token is refused from then on."""
    web, reader = counted
    old = world.params()
    assert web.get(PATH, old).json["success"] is True
    factories.revoke_player(world.store, world.user_id)
    new = world.params(game_auth_token=_token(world, 1))
    for _ in range(3):
        assert web.get(PATH, new).json["success"] is True
    assert reader.fresh_reads == 1
    assert web.get(PATH, old).json == REFUSED


# -- under gunicorn, as found: 2 workers, the default bound
# ------------------------------------------------------


@pytest.mark.engine("sqlite")
def test_under_gunicorn_a_token_minted_after_a_revoke_or_signup_works_on_every_try(
    env, world, tmp_path, settings
):
    """The finding itself: both workers hold a snapshot, then revoke + mint and signup + mint
    through the admin API; 20 authentications of each new token, each on a new connection, at once:
    all succeed."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = {k: v for k, v in env.items() if k != "AUTHSVC_MAX_STALENESS"} | {
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)
    }
    admin = AdminApp(dataclasses.replace(settings, max_staleness=1.0))
    api = webtest.TestApp(admin, lint=True)
    _, token = api_tokens.add_api_token(
        world.store, Context(actor="cli:test"), "web-tier", ["players:write", "tokens:mint"]
    )
    headers = {"Authorization": f"Bearer {token}"}
    port = free_port()
    proc = start_gunicorn(env, port=port)
    try:
        wait_for_port(port)
        until_both_workers_counted(
            port, world.params(), metrics_dir, result="success"
        )  # both hold a snapshot
        assert api.post("/v1/players/4242/revoke", headers=headers).json["epoch"] == 1
        revoked = world.params(game_auth_token=_mint(api, headers, world.game_id, world.user_id))
        api.put_json(f"/v1/players/{NEWBIE}", {"username": "newbie"}, headers=headers)
        signed_up = {
            "user_id": str(NEWBIE),
            "game_auth_token": _mint(api, headers, world.game_id, NEWBIE),
            "api_key": world.api_key,
        }
        answers = [
            json.loads(get(port, params).body) for params in (revoked, signed_up) for _ in range(20)
        ]
        assert [a.get("success") for a in answers] == [True] * 40, "".join(
            "+" if a.get("success") else "-" for a in answers
        )
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
        admin.store.close()


@pytest.mark.engine("sqlite", "postgresql")
def test_under_gunicorn_a_token_minted_after_a_deleted_id_signs_up_again_works_at_once(
    env, world, tmp_path, settings
):
    """A deleted id signed up again continues its epoch (the deleted player's + 1, not 0): its new
    token authenticates at once whether the workers' snapshots lack the player (each refused its old
    token first) or still hold the deleted row (signed up again at once). Four rounds, 20
    authentications each."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = {k: v for k, v in env.items() if k != "AUTHSVC_MAX_STALENESS"} | {
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)
    }
    admin = AdminApp(dataclasses.replace(settings, max_staleness=1.0))
    api = webtest.TestApp(admin, lint=True)
    _, token = api_tokens.add_api_token(
        world.store, Context(actor="cli:test"), "web-tier", ["players:write", "tokens:mint"]
    )
    headers = {"Authorization": f"Bearer {token}"}
    port = free_port()
    proc = start_gunicorn(env, port=port)
    try:
        wait_for_port(port)
        old = world.params()
        until_both_workers_counted(port, old, metrics_dir, result="success")  # both hold a snapshot
        for round_ in range(4):
            assert api.delete(f"/v1/players/{world.user_id}", headers=headers).status_int == 200
            if round_ % 2 == 0:  # both workers' snapshots lack the player
                until_both_workers_counted(
                    port, old, metrics_dir, result="unknown_player", answer=REFUSED
                )
            assert (
                api.put_json(
                    f"/v1/players/{world.user_id}", {"username": "alice"}, headers=headers
                ).status_int
                == 201
            )
            old = world.params(game_auth_token=_mint(api, headers, world.game_id, world.user_id))
            answers = [json.loads(get(port, old).body) for _ in range(20)]
            assert [a.get("success") for a in answers] == [True] * 20, (
                round_,
                "".join("+" if a.get("success") else "-" for a in answers),
            )
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
        admin.store.close()
