"""Settings: one frozen object from env vars and a TOML file; start-up errors are clear."""

import dataclasses
import secrets
from pathlib import Path

import pytest

from authsvc.errors import ConfigError
from authsvc.settings import GunicornSettings, Settings, load_token_secrets
from authsvc.web.app import make_app


def test_defaults_follow_systemd_directories(secret_file):
    s = Settings.from_env(
        {"AUTHSVC_TOKEN_SECRET_FILE": str(secret_file), "STATE_DIRECTORY": "/srv/state"}
    )
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
    s = Settings.from_env(
        {"CREDENTIALS_DIRECTORY": str(tmp_path), "AUTHSVC_STORE": "sqlite://x.db"}
    )
    assert s.token_secret_file == str(tmp_path / "token-secret")
    assert s.token_secrets == (b"s" * 40,)


def test_environment_overrides_toml_file(tmp_path, secret_file):
    config = tmp_path / "authsvc.toml"
    config.write_text(
        'store = "sqlite:///from/toml.db"\nerror_status = "http"\ntoken_secret_file = '
        f'"{secret_file}"\n'
        "pg_statement_timeout = 0.5\n"
    )
    s = Settings.from_env({"AUTHSVC_CONFIG": str(config)})
    assert (s.store, s.error_status, s.pg_statement_timeout) == (
        "sqlite:///from/toml.db",
        "http",
        0.5,
    )
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
        ({"AUTHSVC_ACCESS_RECORD": "nginx"}, "AUTHSVC_ACCESS_RECORD must be one of app, edge"),
    ],
)
def test_bad_settings_are_clear_config_errors(env, message, secret_file):
    with pytest.raises(ConfigError, match=message):
        Settings.from_env({"AUTHSVC_TOKEN_SECRET_FILE": str(secret_file), **env})


def test_access_record_is_app_unless_set_and_edge_in_the_shipped_file(tmp_path, secret_file):
    """A bare run logs (the app's auth line, gunicorn's access line); the shipped settings file puts
    the record in nginx's line (docs/logs.md, "Which line holds what")."""
    env = {"AUTHSVC_TOKEN_SECRET_FILE": str(secret_file)}
    bare = Settings.from_env(env)
    assert bare.access_record == "app" and bare.forwarded_allow_ips == "127.0.0.1,::1"
    assert Settings.from_env({**env, "AUTHSVC_ACCESS_RECORD": "EDGE"}).access_record == "edge"
    config = tmp_path / "authsvc.toml"
    shipped = (Path(__file__).resolve().parents[2] / "deploy" / "etc" / "authsvc.toml").read_text()
    config.write_text(shipped.replace("@CONF_DIR@", str(tmp_path)))
    assert 'access_record = "edge"' in shipped.splitlines()
    assert Settings.from_env({**env, "AUTHSVC_CONFIG": str(config)}).access_record == "edge"
    assert GunicornSettings.from_env({"AUTHSVC_CONFIG": str(config)}).access_record == "edge"


def test_unknown_or_broken_toml_is_a_config_error(tmp_path, secret_file):
    config = tmp_path / "c.toml"
    config.write_text('stor = "typo"\n')
    with pytest.raises(ConfigError, match="unknown setting"):
        Settings.from_env(
            {"AUTHSVC_CONFIG": str(config), "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file)}
        )
    config.write_text("store = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Settings.from_env(
            {"AUTHSVC_CONFIG": str(config), "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file)}
        )


def test_missing_secret_is_an_error_only_when_required(tmp_path):
    env = {"AUTHSVC_TOKEN_SECRET_FILE": str(tmp_path / "absent")}
    with pytest.raises(
        ConfigError, match="cannot read token secret file .*restore it from its backup copy"
    ):
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
    assert load_token_secrets(_secret(tmp_path, b"\xef\xbb\xbf" + a.encode() + b"\r\n")) == (
        a.encode(),
    )
    assert load_token_secrets(
        _secret(tmp_path, b"\xef\xbb\xbf# comment\n" + a.encode() + b"\n")
    ) == (a.encode(),)


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
        s = Settings.from_env(
            {"CREDENTIALS_DIRECTORY": str(tmp_path), "AUTHSVC_STORE": "sqlite://x.db"}
        )
    assert s.token_secrets == (a.encode(),) and caplog.records == []


def test_a_private_secret_file_loads_silently(tmp_path, caplog):
    a = secrets.token_hex(32)
    with caplog.at_level("WARNING", logger="authsvc"):
        assert load_token_secrets(_secret(tmp_path, a.encode() + b"\n", 0o400)) == (a.encode(),)
    assert caplog.records == []


# The settings file: top-level keys (or an [authsvc] table) and [gunicorn]; nothing else.


def _config(tmp_path, text: str):
    path = tmp_path / "authsvc.toml"
    path.write_text(text)
    return path


def _from_file(path, secret_file, **env) -> Settings:
    return Settings.from_env(
        {"AUTHSVC_CONFIG": str(path), "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file), **env}
    )


def test_documented_layout_top_level_keys_and_a_gunicorn_table(tmp_path, secret_file):
    path = _config(
        tmp_path,
        'store = "sqlite:///srv/a.db"\nmax_body_bytes = 8192\nlog_level = "warning"\n'
        '[gunicorn]\nworkers = 3\nworker_class = "gthread"\nthreads = 4\ntimeout = 10\n',
    )
    s = _from_file(path, secret_file)
    assert (s.store, s.max_body_bytes) == ("sqlite:///srv/a.db", 8192)


def test_an_authsvc_table_is_the_top_level_under_another_name(tmp_path, secret_file):
    path = _config(
        tmp_path,
        '[authsvc]\nstore = "sqlite:///srv/a.db"\nmax_body_bytes = 8192\n[gunicorn]\nworkers = 3\n',
    )
    assert _from_file(path, secret_file).max_body_bytes == 8192


def _refused(path, secret_file, *words: str, **env) -> str:
    with pytest.raises(ConfigError) as caught:
        _from_file(path, secret_file, **env)
    message = str(caught.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, message
    return message


def test_top_level_keys_beside_an_authsvc_table_are_refused(tmp_path, secret_file):
    """Before, the top-level error_status was silently ignored."""
    path = _config(tmp_path, 'error_status = "http"\n[authsvc]\nstore = "sqlite:///srv/a.db"\n')
    _refused(path, secret_file, str(path), "error_status", "[authsvc]")


@pytest.mark.parametrize(
    "text, words",
    [
        ("[gunicorn]\nworker = 8\n", ["[gunicorn] worker", "did you mean workers"]),
        ("[gunicorn]\ntimout = 5\n", ["[gunicorn] timout", "did you mean timeout"]),
        ('[authsvcc]\nstore = "sqlite:///srv/a.db"\n', ["[authsvcc]", "did you mean [authsvc]"]),
        ('stor = "sqlite:///srv/a.db"\n', ["stor", "did you mean store"]),
        ("[authsvc]\nmax_body_byte = 1\n", ["[authsvc] max_body_byte"]),
        ("workers = 8\n", ["workers", "[gunicorn]"]),  # a gunicorn setting at the top level
        ('[gunicorn]\nstore = "sqlite:///srv/a.db"\n', ["[gunicorn] store", "top level"]),
        ("gunicorn = 8\n", ["gunicorn", "table"]),
    ],
)
def test_unknown_keys_and_tables_are_refused_in_one_line(tmp_path, secret_file, text, words):
    path = _config(tmp_path, text)
    _refused(path, secret_file, str(path), *words)


@pytest.mark.parametrize(
    "text, words",
    [
        ("max_body_bytes = true\n", ["max_body_bytes must be an integer", "true"]),
        ("max_body_bytes = 1.9\n", ["max_body_bytes must be an integer", "1.9"]),
        ('max_body_bytes = "16384"\n', ["max_body_bytes must be an integer", '"16384"']),
        ("max_body_bytes = 0\n", ["max_body_bytes must be positive"]),
        ("max_staleness = true\n", ["max_staleness must be a number"]),
        ("max_staleness = 2\n", ["max_staleness must be from 0 to 1 seconds"]),
        ("pg_connect_timeout = inf\n", ["pg_connect_timeout must be a number"]),
        ("error_status = 200\n", ["error_status must be a string"]),
        ('error_status = "404"\n', ["error_status must be"]),
        ('log_level = "LOUD"\n', ["log_level must be one of", "INFO"]),
        ("store = 5\n", ["store must be a string"]),
        ("[gunicorn]\nworkers = 2.5\n", ["[gunicorn] workers must be an integer"]),
        ("[gunicorn]\nworkers = true\n", ["[gunicorn] workers must be an integer"]),
        ("[gunicorn]\nworkers = 0\n", ["[gunicorn] workers must be at least 1"]),
        ("[gunicorn]\nthreads = 0\n", ["[gunicorn] threads must be at least 1"]),
        ("[gunicorn]\ntimeout = 0\n", ["[gunicorn] timeout must be at least 1"]),
        (
            '[gunicorn]\nworker_class = "gevent"\n',
            ["[gunicorn] worker_class must be", "sync", "gthread"],
        ),
    ],
)
def test_wrong_types_and_values_in_the_file_are_refused_in_one_line(
    tmp_path, secret_file, text, words
):
    """Before, true became 1, 1.9 became 1, and nothing in [gunicorn] was checked by the reader."""
    path = _config(tmp_path, text)
    _refused(path, secret_file, str(path), *words)


@pytest.mark.parametrize(
    "env, message",
    [
        ({"AUTHSVC_WORKERS": "0"}, "AUTHSVC_WORKERS must be at least 1"),
        ({"AUTHSVC_THREADS": "many"}, "AUTHSVC_THREADS must be an integer"),
        ({"AUTHSVC_WORKER_CLASS": "gevent"}, "AUTHSVC_WORKER_CLASS must be"),
        ({"AUTHSVC_LOG_LEVEL": "LOUD"}, "AUTHSVC_LOG_LEVEL must be one of"),
        ({"AUTHSVC_MAX_BODY_BYTES": "1.9"}, "AUTHSVC_MAX_BODY_BYTES must be an integer"),
        ({"AUTHSVC_PG_STATEMENT_TIMEOUT": "inf"}, "AUTHSVC_PG_STATEMENT_TIMEOUT must be a number"),
        (
            {"AUTHSVC_FORWARDED_ALLOW_IPS": "*"},
            "AUTHSVC_FORWARDED_ALLOW_IPS must be IP addresses or networks",
        ),
        (
            {"AUTHSVC_FORWARDED_ALLOW_IPS": "10.0.0.1,nginx.example"},
            "AUTHSVC_FORWARDED_ALLOW_IPS must be",
        ),
        ({"AUTHSVC_FORWARDED_ALLOW_IPS": "10.0.0.1,"}, "AUTHSVC_FORWARDED_ALLOW_IPS must be"),
        (
            {"AUTHSVC_FORWARDED_ALLOW_IPS": "10.0.0.1/8"},
            "AUTHSVC_FORWARDED_ALLOW_IPS must be",
        ),  # host bits: gunicorn refuses it
    ],
)
def test_wrong_environment_values_are_refused_in_one_line(env, message, secret_file):
    with pytest.raises(ConfigError, match=message) as caught:
        Settings.from_env({"AUTHSVC_TOKEN_SECRET_FILE": str(secret_file), **env})
    assert "\n" not in str(caught.value)


def test_a_bad_file_value_is_refused_even_when_the_environment_overrides_it(tmp_path, secret_file):
    """The file is checked whole: a typo does not wait for the day its variable is unset."""
    path = _config(tmp_path, "max_body_bytes = true\n")
    _refused(path, secret_file, "max_body_bytes", AUTHSVC_MAX_BODY_BYTES="4096")


def test_each_default_is_declared_once(tmp_path, secret_file):
    """Settings' own defaults, from_env's and the store's are the same numbers (max_staleness was
    1.0 and 0.0)."""
    from authsvc.store import open_store

    read = Settings.from_env({"AUTHSVC_TOKEN_SECRET_FILE": str(secret_file)})
    built = Settings(store=read.store, token_secret_file=read.token_secret_file)
    assert dataclasses.replace(read, token_secrets=built.token_secrets) == built
    store = open_store(f"sqlite://{tmp_path}/x.db", readonly=True)
    try:
        assert store.max_staleness == read.max_staleness == 1.0
    finally:
        store.close()


def test_every_declared_setting_is_read_and_documented():
    """SETTINGS is the one list: each entry lands in Settings or GunicornSettings and has a row in
    the docs."""
    from pathlib import Path

    from authsvc.settings import SETTINGS, GunicornSettings

    declared = {s.name for s in SETTINGS}
    fields = {f.name for f in dataclasses.fields(Settings)} - {"token_secrets"}
    assert fields | {f.name for f in dataclasses.fields(GunicornSettings)} == declared
    docs = (Path(__file__).resolve().parents[2] / "docs/configuration.md").read_text()
    for s in SETTINGS:
        key = f"[gunicorn] {s.name}" if s.table == "gunicorn" else s.name
        assert f"| `{s.env}` | `{key}` |" in docs, s.name


def test_the_metrics_directory_gunicorn_conf_uses():
    """prometheus_client's own variable first, then systemd's directories, else none
    (gunicorn.conf.py makes one)."""
    from authsvc.settings import metrics_dir

    assert (
        metrics_dir({"PROMETHEUS_MULTIPROC_DIR": "/x", "RUNTIME_DIRECTORY": "/run/authsvc"}) == "/x"
    )
    assert (
        metrics_dir({"RUNTIME_DIRECTORY": "/run/authsvc", "STATE_DIRECTORY": "/var/lib/authsvc"})
        == "/run/authsvc/metrics"
    )
    assert metrics_dir({"STATE_DIRECTORY": "/var/lib/authsvc:/other"}) == "/var/lib/authsvc/metrics"
    assert metrics_dir({}) == ""


def test_the_store_password_never_shows_in_repr_or_str(secret_file):
    password = secrets.token_hex(12)
    s = Settings.from_env(
        {
            "AUTHSVC_STORE": f"postgresql://owner:{password}@db/a?sslpassword={password}x",
            "AUTHSVC_TOKEN_SECRET_FILE": str(secret_file),
        }
    )
    assert password in s.store  # the object keeps it: the store connects with it
    for text in (repr(s), str(s), f"{s}", f"{s!r}"):
        assert password not in text and "postgresql://owner:***@db/a?sslpassword=***" in text


# A settings file whose store URL holds a password is refused when other users may read or
# write it, as the token secret file is; the documented install (root:authsvc 0640) loads.


@pytest.mark.parametrize(
    "store",
    [
        "postgresql://authsvc_owner:{p}@db/authsvc",
        "postgresql://authsvc_owner@db/authsvc?sslpassword={p}",
        "postgresql://authsvc_owner@db/authsvc?pass%77ord={p}",
    ],
)
@pytest.mark.parametrize("mode", [0o644, 0o604, 0o602])
def test_a_settings_file_with_a_password_other_users_can_read_is_refused(
    tmp_path, secret_file, store, mode
):
    password = secrets.token_hex(12)
    path = _config(tmp_path, f'[authsvc]\nstore = "{store.format(p=password)}"\n')
    path.chmod(mode)
    for env in (
        {},
        {"AUTHSVC_STORE": "sqlite://x.db"},
    ):  # the file holds it even when the environment wins
        with pytest.raises(ConfigError) as info:
            _from_file(path, secret_file, **env)
        message = str(info.value)
        assert str(path) in message and f"chmod 640 {path}" in message and "\n" not in message
        assert password not in message


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o440])
def test_a_settings_file_with_a_password_only_its_owner_and_group_read_loads(
    tmp_path, secret_file, mode, caplog
):
    path = _config(tmp_path, f'store = "postgresql://owner:{secrets.token_hex(12)}@db/authsvc"\n')
    path.chmod(mode)
    with caplog.at_level("WARNING", logger="authsvc"):
        assert _from_file(path, secret_file).store.startswith("postgresql://owner:")
    assert caplog.records == []


def test_a_settings_file_without_a_password_may_be_world_readable(tmp_path, secret_file):
    path = _config(
        tmp_path, 'store = "postgresql://authsvc_web@db/authsvc?passfile=/etc/authsvc/pgpass-web"\n'
    )
    path.chmod(0o644)
    assert _from_file(path, secret_file).store.endswith("pgpass-web")


def test_forwarded_allow_ips_takes_addresses_and_networks(tmp_path):
    from authsvc.settings import GunicornSettings

    assert GunicornSettings.from_env({}).forwarded_allow_ips == "127.0.0.1,::1"
    value = "10.0.0.1, 10.0.0.0/24,2001:db8::/64"
    assert (
        GunicornSettings.from_env({"AUTHSVC_FORWARDED_ALLOW_IPS": value}).forwarded_allow_ips
        == value
    )
