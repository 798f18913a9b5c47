"""The gunicorn entry point builds the app when asked for, not at import."""

import importlib

import pytest

from authsvc.app import App
from authsvc.errors import ConfigError


def test_application_is_built_on_access_from_the_environment(monkeypatch, env, world):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    wsgi = importlib.import_module("authsvc.wsgi")
    assert "application" not in vars(wsgi)
    app = wsgi.application
    assert isinstance(app, App) and app.settings.store == env["AUTHSVC_STORE"]


@pytest.mark.engine("sqlite")
def test_bad_configuration_fails_when_gunicorn_loads_the_app(monkeypatch, env):
    monkeypatch.setenv("AUTHSVC_STORE", env["AUTHSVC_STORE"])  # never initialised
    monkeypatch.setenv("AUTHSVC_TOKEN_SECRET_FILE", env["AUTHSVC_TOKEN_SECRET_FILE"])
    wsgi = importlib.import_module("authsvc.wsgi")
    with pytest.raises(ConfigError, match="authsvc init"):
        getattr(wsgi, "application")  # noqa: B009 - the access is the point
    with pytest.raises(AttributeError):
        getattr(wsgi, "something_else")  # noqa: B009
