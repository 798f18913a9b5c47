"""Settings: one frozen object from env vars and a TOML file; start-up errors are clear."""

import dataclasses
import secrets

import pytest

from authsvc.app import make_app
from authsvc.errors import ConfigError
from authsvc.settings import Settings, load_token_secrets


def test_defaults_follow_systemd_directories(secret_file):
    s = Settings.from_env({"AUTHSVC_TOKEN_SECRET_FILE": str(secret_file), "STATE_DIRECTORY": "/srv/state"})
    assert s.store == "sqlite:///srv/state/authsvc.db"
    assert s.error_status == "200" and not s.errors_as_http_status
    assert s.max_body_bytes == 16384 and s.pg_connect_timeout == 2.0
    assert s.max_staleness == 1.0  # the documented bound: a revocation is seen within a second


def test_default_store_without_systemd(secret_file):
    s = Settings.from_env({"AUTHSVC_TOKEN_SECRET_FILE": str(secret_file)})
    assert s.store == "sqlite:///var/lib/authsvc/authsvc.db"


def test_secret_from_systemd_credentials_directory(tmp_path):
    (tmp_path / "token-secret").write_text("s" * 40 + "\n")
    s = Settings.from_env({"CREDENTIALS_DIRECTORY": str(tmp_path), "AUTHSVC_STORE": "sqlite://x.db"})
    assert s.token_secret_file == str(tmp_path / "token-secret")
    assert s.token_secrets == (b"s" * 40,)


def test_environment_overrides_toml_file(tmp_path, secret_file):
    config = tmp_path / "authsvc.toml"
    config.write_text(
        f'store = "sqlite:///from/toml.db"\nerror_status = "http"\ntoken_secret_file = "{secret_file}"\n'
        "pg_statement_timeout = 0.5\n"
    )
    s = Settings.from_env({"AUTHSVC_CONFIG": str(config)})
    assert (s.store, s.error_status, s.pg_statement_timeout) == ("sqlite:///from/toml.db", "http", 0.5)
    s = Settings.from_env({"AUTHSVC_CONFIG": str(config), "AUTHSVC_STORE": "sqlite:///from/env.db"})
    assert s.store == "sqlite:///from/env.db" and s.error_status == "http"


def test_toml_file_may_use_an_authsvc_table(tmp_path, secret_file):
    config = tmp_path / "authsvc.toml"
    config.write_text(f'[authsvc]\nerror_status = "http"\ntoken_secret_file = "{secret_file}"\n')
    assert Settings.from_env({"AUTHSVC_CONFIG": str(config)}).errors_as_http_status


@pytest.mark.parametrize(
    "env, message",
    [
        ({"AUTHSVC_ERROR_STATUS": "404"}, "AUTHSVC_ERROR_STATUS"),
        ({"AUTHSVC_MAX_BODY_BYTES": "lots"}, "AUTHSVC_MAX_BODY_BYTES"),
        ({"AUTHSVC_MAX_BODY_BYTES": "0"}, "positive"),
        ({"AUTHSVC_PG_CONNECT_TIMEOUT": "-1"}, "AUTHSVC_PG_CONNECT_TIMEOUT"),
        ({"AUTHSVC_MAX_STALENESS": "1.5"}, "AUTHSVC_MAX_STALENESS must be from 0 to 1 seconds"),
        ({"AUTHSVC_MAX_STALENESS": "-0.1"}, "AUTHSVC_MAX_STALENESS"),
        ({"AUTHSVC_MAX_STALENESS": "nan"}, "AUTHSVC_MAX_STALENESS"),
        ({"AUTHSVC_CONFIG": "/nonexistent/authsvc.toml"}, "cannot read config file"),
    ],
)
def test_bad_settings_are_clear_config_errors(env, message, secret_file):
    with pytest.raises(ConfigError, match=message):
        Settings.from_env({"AUTHSVC_TOKEN_SECRET_FILE": str(secret_file), **env})


def test_unknown_or_broken_toml_is_a_config_error(tmp_path, secret_file):
    config = tmp_path / "c.toml"
    config.write_text('stor = "typo"\n')
    with pytest.raises(ConfigError, match="unknown setting"):
        Settings.from_env({"AUTHSVC_CONFIG": str(config), "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file)})
    config.write_text("store = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Settings.from_env({"AUTHSVC_CONFIG": str(config), "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file)})


def test_missing_secret_is_an_error_only_when_required(tmp_path):
    env = {"AUTHSVC_TOKEN_SECRET_FILE": str(tmp_path / "absent")}
    with pytest.raises(ConfigError, match="cannot read token secret file .*authsvc init"):
        Settings.from_env(env)
    assert Settings.from_env(env, require_secret=False).token_secrets == ()


def test_secret_file_lists_secrets_current_first_and_skips_comments(tmp_path):
    a, b = secrets.token_hex(32), secrets.token_hex(32)
    path = tmp_path / "s"
    path.write_text(f"# rotated 2026-11-01\n{a}\n\n{b}\n")
    assert load_token_secrets(str(path)) == (a.encode(), b.encode())


@pytest.mark.parametrize("content", ["", "# only a comment\n", "short\n"])
def test_empty_or_short_secret_is_refused(tmp_path, content):
    path = tmp_path / "s"
    path.write_text(content)
    with pytest.raises(ConfigError):
        load_token_secrets(str(path))


def test_secrets_never_show_in_repr_or_str(settings):
    secret = settings.token_secrets[0].decode()
    assert secret not in repr(settings) and secret not in str(settings)
    assert secret not in repr(settings.token_secrets) and "masked" in repr(settings.token_secrets)


def test_settings_are_frozen(settings):
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.error_status = "http"


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_start_up_fails_clearly_without_a_store(settings):
    with pytest.raises(ConfigError, match="does not exist .*authsvc init"):
        make_app(settings)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_start_up_fails_clearly_on_an_unmigrated_store(settings):
    path = settings.store.removeprefix("sqlite://")
    open(path, "wb").close()
    with pytest.raises(ConfigError, match="schema version 0"):
        make_app(settings)


def test_unknown_store_scheme_is_a_config_error(settings):
    with pytest.raises(ConfigError, match="sqlite:// or postgresql://"):
        make_app(dataclasses.replace(settings, store="mysql://x"))
