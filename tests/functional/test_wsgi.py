"""The gunicorn entry point builds the app when asked for, not at import."""

import importlib

import pytest
from gunicorn.arbiter import Arbiter

from authsvc.web.app import App


def test_application_is_built_on_access_from_the_environment(monkeypatch, env, world):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    wsgi = importlib.import_module("authsvc.wsgi")
    assert "application" not in vars(wsgi)
    app = wsgi.application
    assert isinstance(app, App) and app.settings.store == env["AUTHSVC_STORE"]


@pytest.mark.engine("sqlite")
def test_bad_configuration_fails_when_gunicorn_loads_the_app(monkeypatch, env, capsys):
    """One line on stderr and gunicorn's APP_LOAD_ERROR (4), which halts its master, not a
    traceback."""
    monkeypatch.setenv("AUTHSVC_STORE", env["AUTHSVC_STORE"])  # never initialised
    monkeypatch.setenv("AUTHSVC_TOKEN_SECRET_FILE", env["AUTHSVC_TOKEN_SECRET_FILE"])
    wsgi = importlib.import_module("authsvc.wsgi")
    with pytest.raises(SystemExit) as caught:
        getattr(wsgi, "application")  # noqa: B009 - the access is the point
    assert caught.value.code == Arbiter.APP_LOAD_ERROR == 4
    err = capsys.readouterr().err
    assert err.startswith("authsvc: error: ") and err.count("\n") == 1 and "authsvc init" in err, (
        err
    )
    with pytest.raises(AttributeError):
        getattr(wsgi, "something_else")  # noqa: B009
