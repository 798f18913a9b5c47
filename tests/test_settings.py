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
    (tmp_path / "token-secret").chmod(0o600)
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
    path.chmod(0o600)
    assert load_token_secrets(str(path)) == (a.encode(), b.encode())


@pytest.mark.parametrize("content", ["", "# only a comment\n", "short\n"])
def test_empty_or_short_secret_is_refused(tmp_path, content):
    path = tmp_path / "s"
    path.write_text(content)
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="holds no secret|at least 16 bytes"):
        load_token_secrets(str(path))


def test_secrets_never_show_in_repr_or_str(settings):
    secret = settings.token_secrets[0].decode()
    assert secret not in repr(settings) and secret not in str(settings)
    assert secret not in repr(settings.token_secrets) and "masked" in repr(settings.token_secrets)


def test_settings_are_frozen(settings):
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.error_status = "http"


@pytest.mark.engine("sqlite")
def test_start_up_fails_clearly_without_a_store(settings):
    with pytest.raises(ConfigError, match="does not exist .*authsvc init"):
        make_app(settings)


@pytest.mark.engine("sqlite")
def test_start_up_fails_clearly_on_an_unmigrated_store(settings):
    path = settings.store.removeprefix("sqlite://")
    open(path, "wb").close()
    with pytest.raises(ConfigError, match="schema version 0"):
        make_app(settings)


def test_unknown_store_scheme_is_a_config_error(settings):
    with pytest.raises(ConfigError, match="sqlite:// or postgresql://"):
        make_app(dataclasses.replace(settings, store="mysql://x"))


def _secret(tmp_path, content: bytes, mode: int = 0o600):
    path = tmp_path / "token-secret"
    path.write_bytes(content)
    path.chmod(mode)
    return str(path)


def test_an_indented_comment_is_a_comment_not_a_secret(tmp_path):
    a = secrets.token_hex(32)
    path = _secret(tmp_path, f"  # old secret, rotated out 2026-11-01\n{a}\n".encode())
    assert load_token_secrets(path) == (a.encode(),)


def test_a_utf8_bom_is_not_part_of_the_secret(tmp_path):
    a = secrets.token_hex(32)
    assert load_token_secrets(_secret(tmp_path, b"\xef\xbb\xbf" + a.encode() + b"\r\n")) == (a.encode(),)
    assert load_token_secrets(_secret(tmp_path, b"\xef\xbb\xbf# comment\n" + a.encode() + b"\n")) == (a.encode(),)


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o606, 0o602])
def test_a_secret_file_other_users_can_read_or_write_is_refused(tmp_path, mode):
    path = _secret(tmp_path, secrets.token_hex(32).encode() + b"\n", mode)
    with pytest.raises(ConfigError) as info:
        load_token_secrets(path)
    message = str(info.value)
    assert path in message and f"chmod 600 {path}" in message and "\n" not in message


def test_a_group_readable_secret_file_is_loaded_with_a_warning(tmp_path, caplog):
    a = secrets.token_hex(32)
    path = _secret(tmp_path, a.encode() + b"\n", 0o640)
    with caplog.at_level("WARNING", logger="authsvc"):
        assert load_token_secrets(path) == (a.encode(),)
    [record] = caplog.records
    assert path in record.getMessage() and "chmod 600" in record.getMessage()
    assert a not in caplog.text


def test_a_systemd_credential_is_read_without_a_group_warning(tmp_path, caplog):
    """systemd's LoadCredential= copies the file 0400 and grants the service user read
    access by an ACL, whose mask then shows as the group bits (0440)."""
    a = secrets.token_hex(32)
    _secret(tmp_path, a.encode() + b"\n", 0o440)
    with caplog.at_level("WARNING", logger="authsvc"):
        s = Settings.from_env({"CREDENTIALS_DIRECTORY": str(tmp_path), "AUTHSVC_STORE": "sqlite://x.db"})
    assert s.token_secrets == (a.encode(),) and caplog.records == []


def test_a_private_secret_file_loads_silently(tmp_path, caplog):
    a = secrets.token_hex(32)
    with caplog.at_level("WARNING", logger="authsvc"):
        assert load_token_secrets(_secret(tmp_path, a.encode() + b"\n", 0o400)) == (a.encode(),)
    assert caplog.records == []
