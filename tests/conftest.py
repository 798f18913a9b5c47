"""Shared fixtures: throwaway secrets and stores, a provisioned game and player, WebTest apps.

Helpers that are not fixtures (skip_or_fail, free_port, wait_for_port) live in
tests/support.py.
"""

from __future__ import annotations

import dataclasses
import secrets
import time

import pytest
import webtest

from authsvc.app import make_app
from authsvc.settings import Settings
from authsvc.store import open_store
from authsvc.tokens import api_key_digest, mint_token, new_api_key


@pytest.fixture
def secret_file(tmp_path):
    """A throwaway token secret, made fresh for each test."""
    path = tmp_path / "token-secret"
    path.write_text(secrets.token_hex(32) + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def store_url(tmp_path):
    """The store under test (sqlite here; tests/test_postgres adds PostgreSQL via parametrization)."""
    return "sqlite://" + str(tmp_path / "authsvc.db")


@pytest.fixture
def env(store_url, secret_file):
    """Environment variables that point the service and the admin command at the throwaway store."""
    return {"AUTHSVC_STORE": store_url, "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file)}


@pytest.fixture
def settings(env):
    return Settings.from_env(env)


@pytest.fixture
def admin_store(settings):
    """A migrated store opened read-write, as the admin command opens it."""
    store = open_store(settings.store, readonly=False, settings=settings)
    store.migrate()
    yield store
    store.close()


@dataclasses.dataclass
class World:
    """One game with its api key and one player, plus helpers to make valid requests."""

    settings: Settings
    store: object
    game_id: int
    api_key: str
    user_id: int
    username: str

    def token(self, game_id=None, user_id=None, epoch=None) -> str:
        player = self.store.get_player(user_id or self.user_id)
        return mint_token(
            self.settings.token_secrets[0],
            game_id or self.game_id,
            user_id or self.user_id,
            player.epoch if epoch is None else epoch,
        )

    def params(self, **overrides) -> dict:
        params = {"user_id": str(self.user_id), "game_auth_token": self.token(), "api_key": self.api_key}
        params.update(overrides)
        return {k: v for k, v in params.items() if v is not None}

    def add_game(self, name: str) -> tuple[int, str]:
        key = new_api_key()
        game = self.store.add_game(name, api_key_digest(key), int(time.time()))
        return game.id, key


@pytest.fixture
def world(settings, admin_store) -> World:
    api_key = new_api_key()
    game = admin_store.add_game("Chess", api_key_digest(api_key), int(time.time()))
    admin_store.add_player(4242, "alice")
    return World(settings, admin_store, game.id, api_key, 4242, "alice")


def make_testapp(settings: Settings, **overrides) -> webtest.TestApp:
    if overrides:
        settings = dataclasses.replace(settings, **overrides)
    return webtest.TestApp(make_app(settings), lint=True)


@pytest.fixture
def app(world) -> webtest.TestApp:
    """The WSGI app on the world's store, through WebTest with its WSGI lint on."""
    return make_testapp(world.settings)
