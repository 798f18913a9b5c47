"""Every setting declared once, by its field in Settings or GunicornSettings (``SETTINGS`` lists
them), read from the environment and one TOML file.

This is the only module that reads ``os.environ`` or the settings file: the app,
the admin command and deploy/gunicorn.conf.py all come here. Precedence:
environment variable, then the file named by ``AUTHSVC_CONFIG``, then the default.

The file (docs/configuration.md): the app's settings at the top level, or in an
``[authsvc]`` table (the same thing; not both), and gunicorn's in an optional
``[gunicorn]`` table. An unknown key or table, or a value of the wrong TOML type
or out of range, stops start-up with one line naming the key and the file: a
typo is never silently the default.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import logging
import math
import os
import pwd
import stat
import tomllib
from collections.abc import Callable, Mapping
from typing import Any

from authsvc.errors import ConfigError
from authsvc.urls import redact_url

DEFAULT_STATE_DIR = "/var/lib/authsvc"
DEFAULT_SECRET_FILE = "/etc/authsvc/token-secret"
MIN_SECRET_BYTES = 16
UTF8_BOM = b"\xef\xbb\xbf"
MAX_STALENESS_BOUND = (
    1.0  # seconds: a revoked player, disabled game or expired key stops within this
)

APP = "authsvc"  # the app's settings: the file's top level, or its [authsvc] table
GUNICORN = "gunicorn"  # the [gunicorn] table, read by deploy/gunicorn.conf.py


def _default_store(env: Mapping[str, str]) -> str:
    state_dir = env.get("STATE_DIRECTORY", "").split(":")[0] or DEFAULT_STATE_DIR
    return "sqlite://" + os.path.join(state_dir, "authsvc.db")


def _default_secret_file(env: Mapping[str, str]) -> str:
    cred_dir = env.get("CREDENTIALS_DIRECTORY")
    return os.path.join(cred_dir, "token-secret") if cred_dir else DEFAULT_SECRET_FILE


def _address_list(value: str) -> bool:
    """gunicorn's forwarded_allow_ips as authsvc takes it: IP addresses or networks, never "*"."""
    items = [item.strip() for item in value.split(",")]
    try:
        return all(item and item != "*" and ipaddress.ip_network(item) for item in items)
    except ValueError:
        return False


def host_list(value: str) -> frozenset[str]:
    """AUTHSVC_WEBHOOK_ALLOW_HOSTS as a set of ``host`` or ``host:port`` (lower case; IPv6 in
    brackets); ValueError for an item that is neither."""
    found = set()
    for item in filter(None, (i.strip().lower() for i in value.split(","))):
        host, port = (item.rsplit(":", 1) + [""])[:2] if not item.endswith("]") else (item, "")
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(item)
        bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not bare or not all(c.isascii() and (c.isalnum() or c in ".-_:") for c in bare):
            raise ValueError(item)
        if ":" in bare:
            ipaddress.IPv6Address(bare)  # a bare IPv6 address must be bracketed, as in a URL
            if not host.startswith("["):
                raise ValueError(item)
        found.add(item)
    return frozenset(found)


def _host_list(value: str) -> bool:
    try:
        host_list(value)
    except ValueError:
        return False
    return True


def _listen(value: str) -> tuple[str, int] | None:
    """``host:port`` ([v6 address] in brackets) as (host, port), None if it is not one."""
    host, _, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not host or not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return None
    return host, int(port)


def _cpu_count() -> int:
    # One worker per CPU: the SQLite store keeps a worker on the CPU (BENCHMARKS.md, section 2).
    return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting: its key in the file, its environment variable, type, default and allowed
    values."""

    name: str
    env: str
    type: type  # str, int or float
    default: Any  # a value, or a function of the environment
    table: str = APP
    rule: str = ""  # what the value must be, for the error line: "positive", "at least 1", ...
    check: Callable[[Any], bool] | None = None
    choices: tuple[str, ...] = ()  # matched case-insensitively; the value becomes the choice

    def default_for(self, env: Mapping[str, str]) -> Any:
        return self.default(env) if callable(self.default) else self.default


_TYPE_WORDS = {str: "a string", int: "an integer", float: "a number"}
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_ROW = "authsvc.setting"  # the metadata key of a dataclass field that declares a setting


def _row(
    env: str,
    *,
    from_env: Callable[[Mapping[str, str]], Any] | None = None,
    table: str = APP,
    rule: str = "",
    check: Callable[[Any], bool] | None = None,
    choices: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A field's metadata declaring it a setting; its name, type and default are the field's own
    (``from_env``: a default that depends on the environment, for a field without one)."""
    return {
        _ROW: {
            "env": env,
            "from_env": from_env,
            "table": table,
            "rule": rule,
            "check": check,
            "choices": choices,
        }
    }


def _declared(*classes: type) -> tuple[Setting, ...]:
    """SETTINGS: the fields of ``classes`` that carry a ``_row``, in their order, each once."""
    types = {"str": str, "int": int, "float": float}
    found = []
    for cls in classes:
        for f in dataclasses.fields(cls):
            if _ROW not in f.metadata:
                continue
            row = dict(f.metadata[_ROW])
            from_env = row.pop("from_env")
            default = from_env if from_env is not None else f.default
            kind = types.get(str(f.type))
            if default is dataclasses.MISSING or kind is None:
                raise TypeError(f"setting {f.name} needs a default and the type str, int or float")
            found.append(Setting(f.name, type=kind, default=default, **row))
    return tuple(found)


class TokenSecrets(tuple):
    """The token secrets, current first; its repr never shows them."""

    def __repr__(self) -> str:
        return f"<TokenSecrets: {len(self)} secret(s), masked>"

    __str__ = __repr__


def _positive(v: Any) -> bool:
    return bool(v > 0)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The app's settings. Each field with a ``_row`` declares a setting (SETTINGS), read from the
    environment and the file (read_settings); the ``[gunicorn]`` table's and log_level are
    GunicornSettings' (forwarded_allow_ips is both's: which peer is nginx)."""

    store: str = dataclasses.field(metadata=_row("AUTHSVC_STORE", from_env=_default_store))
    token_secret_file: str = dataclasses.field(
        metadata=_row("AUTHSVC_TOKEN_SECRET_FILE", from_env=_default_secret_file)
    )
    token_secrets: TokenSecrets = TokenSecrets()  # read from token_secret_file, not a setting
    error_status: str = dataclasses.field(
        default="200", metadata=_row("AUTHSVC_ERROR_STATUS", choices=("200", "http"))
    )
    max_body_bytes: int = dataclasses.field(
        default=16 * 1024, metadata=_row("AUTHSVC_MAX_BODY_BYTES", rule="positive", check=_positive)
    )
    pg_connect_timeout: float = dataclasses.field(
        default=2.0, metadata=_row("AUTHSVC_PG_CONNECT_TIMEOUT", rule="positive", check=_positive)
    )
    pg_statement_timeout: float = dataclasses.field(
        default=2.0, metadata=_row("AUTHSVC_PG_STATEMENT_TIMEOUT", rule="positive", check=_positive)
    )
    # The app's own bound on the wait for PostgreSQL's reply (docs/stores.md, "Outages"): below
    # gunicorn's timeout, so a worker is never killed for waiting on the store; above the statement
    # timeout, so a slow query is cancelled by the server first and keeps its connection.
    pg_reply_timeout: float = dataclasses.field(
        default=3.0, metadata=_row("AUTHSVC_PG_REPLY_TIMEOUT", rule="positive", check=_positive)
    )
    # After a connect or a reply that timed out, a worker answers 503 without trying the store this
    # long.
    pg_retry_after: float = dataclasses.field(
        default=2.0, metadata=_row("AUTHSVC_PG_RETRY_AFTER", rule="positive", check=_positive)
    )
    # An authentication that waited in gunicorn's queue longer than this (nginx's X-Request-Start)
    # is answered 503 before any store work (authsvc/web/queueing.py, docs/operations.md "Login
    # storms"); 0: off.
    max_queue_wait: float = dataclasses.field(
        default=0.5,
        metadata=_row(
            "AUTHSVC_MAX_QUEUE_WAIT",
            rule="0 (off) or seconds, at most 60",
            check=lambda v: 0 <= v <= 60,
        ),
    )
    max_staleness: float = dataclasses.field(
        default=1.0,
        metadata=_row(
            "AUTHSVC_MAX_STALENESS",
            rule=f"from 0 to {MAX_STALENESS_BOUND:g} seconds",
            check=lambda v: 0 <= v <= MAX_STALENESS_BOUND,
        ),
    )
    # `authsvc audit prune` without --before removes records older than this many days; 0 keeps them
    # forever.
    audit_retention_days: int = dataclasses.field(
        default=0,
        metadata=_row(
            "AUTHSVC_AUDIT_RETENTION_DAYS",
            rule="0 (keep forever) or more days",
            check=lambda v: v >= 0,
        ),
    )
    # The admin API's rate limit per API token and worker process (authsvc/api/ratelimit.py);
    # admin_rate 0: off.
    admin_rate: float = dataclasses.field(
        default=50.0,
        metadata=_row(
            "AUTHSVC_ADMIN_RATE", rule="0 (off) or requests a second", check=lambda v: v >= 0
        ),
    )
    admin_burst: int = dataclasses.field(
        default=100, metadata=_row("AUTHSVC_ADMIN_BURST", rule="at least 1", check=lambda v: v >= 1)
    )
    # The webhook hosts (host or host:port) a subscription may name though plain http:// or a
    # private address (authsvc/webhooks/target.py, docs/admin-api.md "Webhooks"): a test receiver, a
    # game server on the LAN; `authsvc deliver` reaches them though they resolve to such an address
    # (authsvc/webhooks/connect.py).
    webhook_allow_hosts: str = dataclasses.field(
        default="",
        metadata=_row(
            "AUTHSVC_WEBHOOK_ALLOW_HOSTS",
            rule="host or host:port items, comma-separated ([v6 address] in brackets)",
            check=_host_list,
        ),
    )
    # Live webhooks a store may have (authsvc/operations/webhooks.py's add_webhook): each one is a
    # POST of every event.
    max_webhooks: int = dataclasses.field(
        default=50,
        metadata=_row(
            "AUTHSVC_MAX_WEBHOOKS", rule="from 1 to 10000", check=lambda v: 1 <= v <= 10_000
        ),
    )
    access_record: str = dataclasses.field(
        default="app", metadata=_row("AUTHSVC_ACCESS_RECORD", choices=("app", "edge"))
    )  # docs/logs.md
    # `authsvc deliver` (authsvc/webhooks/): its POSTs at once, and each one's bound (connecting: at
    # most 3 s of it).
    deliver_concurrency: int = dataclasses.field(
        default=16,
        metadata=_row(
            "AUTHSVC_DELIVER_CONCURRENCY", rule="from 1 to 256", check=lambda v: 1 <= v <= 256
        ),
    )
    # Where `authsvc deliver` serves its Prometheus metrics (authsvc/webhooks/metrics.py); empty:
    # nowhere.
    deliver_metrics: str = dataclasses.field(
        default="",
        metadata=_row(
            "AUTHSVC_DELIVER_METRICS",
            rule="empty (off) or host:port",
            check=lambda v: v == "" or _listen(v) is not None,
        ),
    )
    webhook_timeout: float = dataclasses.field(
        default=10.0,
        metadata=_row(
            "AUTHSVC_WEBHOOK_TIMEOUT", rule="from 1 to 60 seconds", check=lambda v: 1 <= v <= 60
        ),
    )
    # How long `authsvc deliver` keeps a delivered or failed delivery, and an event no delivery
    # needs (store/deliveries.py's prune): a failed one may be re-driven until then.
    webhook_retention: int = dataclasses.field(
        default=7 * 24 * 3600,
        metadata=_row(
            "AUTHSVC_WEBHOOK_RETENTION", rule="at least 3600 seconds", check=lambda v: v >= 3600
        ),
    )
    # The restore ledger (store/ledger.py): each deletion's id and epoch, each restore's generation,
    # kept outside the store. Empty: beside a SQLite store's file (PATH.restore-ledger); none for
    # PostgreSQL.
    restore_ledger: str = dataclasses.field(default="", metadata=_row("AUTHSVC_RESTORE_LEDGER"))
    # The peers whose X-Forwarded-For and X-Forwarded-Proto gunicorn believes (an nginx on
    # another host: docs/scaling.md); any other peer is logged by its own address.
    forwarded_allow_ips: str = dataclasses.field(
        default="127.0.0.1,::1",
        metadata=_row(
            "AUTHSVC_FORWARDED_ALLOW_IPS",
            table=GUNICORN,
            rule="IP addresses or networks, comma-separated ('*' would let any client write the "
            "log's address)",
            check=_address_list,
        ),
    )

    def __repr__(self) -> str:
        """The fields, with the store URL's password masked: a repr can reach a log or a
        traceback."""

        fields = (
            f"{f.name}={redact_url(self.store) if f.name == 'store' else getattr(self, f.name)!r}"
            for f in dataclasses.fields(self)
        )
        return f"Settings({', '.join(fields)})"

    @property
    def errors_as_http_status(self) -> bool:
        return self.error_status == "http"

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, require_secret: bool = True
    ) -> Settings:
        """Build settings; with ``require_secret`` a missing secret is a ConfigError."""
        env = os.environ if environ is None else environ
        values = read_settings(env)
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {name: value for name, value in values.items() if name in fields}
        path = kwargs["token_secret_file"]
        if require_secret or os.path.exists(path):
            # systemd's LoadCredential= copy is 0400 plus an ACL for the service user,
            # and an ACL's mask shows as the group bits: no group warning there.
            cred_dir = env.get("CREDENTIALS_DIRECTORY")
            credential = bool(cred_dir) and os.path.dirname(
                os.path.abspath(path)
            ) == os.path.abspath(cred_dir or "")
            kwargs["token_secrets"] = load_token_secrets(path, systemd_credential=credential)
        return cls(**kwargs)


@dataclasses.dataclass(frozen=True)
class GunicornSettings:
    """What deploy/gunicorn.conf.py reads: the [gunicorn] table, and the app's log level."""

    forwarded_allow_ips: str  # declared in Settings
    access_record: str  # declared in Settings
    workers: int = dataclasses.field(
        metadata=_row(
            "AUTHSVC_WORKERS",
            from_env=lambda env: _cpu_count(),
            table=GUNICORN,
            rule="at least 1",
            check=lambda v: v >= 1,
        )
    )
    worker_class: str = dataclasses.field(
        default="sync",
        metadata=_row("AUTHSVC_WORKER_CLASS", table=GUNICORN, choices=("sync", "gthread")),
    )
    threads: int = dataclasses.field(
        default=1,
        metadata=_row("AUTHSVC_THREADS", table=GUNICORN, rule="at least 1", check=lambda v: v >= 1),
    )
    # gunicorn's 0 (never time out) is refused: a hung worker would never be replaced.
    timeout: int = dataclasses.field(
        default=30,
        metadata=_row(
            "AUTHSVC_TIMEOUT", table=GUNICORN, rule="at least 1 (seconds)", check=lambda v: v >= 1
        ),
    )
    bind: str = dataclasses.field(
        default="unix:/run/authsvc.sock", metadata=_row("AUTHSVC_BIND", table=GUNICORN)
    )
    # The level of the app's "authsvc" logger, set by deploy/gunicorn.conf.py's logconfig_dict.
    log_level: str = dataclasses.field(
        default="INFO", metadata=_row("AUTHSVC_LOG_LEVEL", choices=_LOG_LEVELS)
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> GunicornSettings:
        values = read_settings(os.environ if environ is None else environ)
        return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})


SETTINGS = _declared(Settings, GunicornSettings)  # every setting, declared once: by its field


def default(name: str) -> Any:
    """The declared default of a setting that does not depend on the environment."""
    (setting,) = (s for s in SETTINGS if s.name == name)
    return setting.default_for({})


def admin_actor(environ: Mapping[str, str] | None = None) -> str:
    """Who runs the admin command, for its audit records: ``cli:<login name>``.

    ``SUDO_USER`` when set (``sudo authsvc ...`` names the person, not root), else
    the name of the process's real user id from the password database (not
    ``$USER``, which anyone sets), else the bare uid.
    """
    env = os.environ if environ is None else environ
    name = env.get("SUDO_USER", "").strip()
    if not name:
        try:
            name = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:  # a uid with no passwd entry (a container)
            name = str(os.getuid())
    return "cli:" + name


def metrics_dir(environ: Mapping[str, str] | None = None) -> str:
    """Where every gunicorn worker writes its metrics files (the metrics extra; docs/operations.md,
    "Monitoring"), for deploy/gunicorn.conf.py. Not a setting of the file.

    ``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's own variable; the unit sets it
    inside its RuntimeDirectory), else ``metrics`` in systemd's ``RUNTIME_DIRECTORY`` or
    ``STATE_DIRECTORY``, else "": a run by hand, for which gunicorn.conf.py makes one.
    """
    env = os.environ if environ is None else environ
    if env.get("PROMETHEUS_MULTIPROC_DIR"):
        return env["PROMETHEUS_MULTIPROC_DIR"]
    systemd_dir = (env.get("RUNTIME_DIRECTORY") or env.get("STATE_DIRECTORY") or "").split(":")[0]
    return os.path.join(systemd_dir, "metrics") if systemd_dir else ""


def read_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """Every declared setting, checked: the environment's value, else the file's, else the default.

    The whole file is checked even where the environment overrides it, so a typo
    there never waits for the day its variable is unset.
    """
    path = env.get("AUTHSVC_CONFIG") or None
    tables = _read_file(path) if path else {}
    values = {}
    for setting in SETTINGS:
        prefix, table = tables.get(setting.table, ("", {}))
        if setting.name in table:
            where = f"{path}: {prefix}{setting.name}"
            values[setting.name] = _checked(
                setting, _from_toml(setting, table[setting.name], where), where
            )
        raw = env.get(setting.env, "")
        if raw != "":
            values[setting.name] = _checked(setting, _from_text(setting, raw), setting.env)
        elif setting.name not in values:
            values[setting.name] = setting.default_for(env)
    return values


def _read_file(path: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """The file's two parts: APP and GUNICORN, each as (how an error line prefixes its keys, its
    keys)."""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    names = {part: [s.name for s in SETTINGS if s.table == part] for part in (APP, GUNICORN)}
    top = {}
    for key, value in data.items():
        if key in (APP, GUNICORN):
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{path}: {key} must be a table ([{key}]), got {_describe(value)}"
                )
        elif isinstance(value, dict) and key not in names[APP]:
            raise ConfigError(
                f"{path}: unknown table [{key}]{_did_you_mean(key, [APP, GUNICORN], '[{}]')}"
            )
        else:
            top[key] = value
    if top and APP in data:
        raise ConfigError(
            f"{path}: settings both at the top level ({', '.join(sorted(top))}) and in [{APP}]: "
            "keep them in one place"
        )
    parts = {
        APP: (f"[{APP}] ", data[APP]) if APP in data else ("", top),
        GUNICORN: (f"[{GUNICORN}] ", data.get(GUNICORN, {})),
    }
    _refuse_open_password(path, mode, parts[APP][1].get("store"))
    homes = {APP: "at the top level", GUNICORN: f"in the [{GUNICORN}] table"}
    for part, (prefix, table) in parts.items():
        for key in table:
            if key in names[part]:
                continue
            other = GUNICORN if part == APP else APP
            if key in names[other]:
                raise ConfigError(f"{path}: {prefix}{key} belongs {homes[other]}")
            raise ConfigError(
                f"{path}: unknown setting {prefix}{key}{_did_you_mean(key, names[part], '{}')}"
            )
    return parts


def _refuse_open_password(path: str, mode: int, store: Any) -> None:
    """Like ssh with a private key (and load_token_secrets): a settings file whose store URL
    holds a password (in the URL or a libpq parameter) is refused when other users may read
    or write it. Its group may: the documented install is root:authsvc 0640."""
    if not isinstance(store, str) or not mode & (stat.S_IROTH | stat.S_IWOTH):
        return

    if redact_url(store) != store:
        raise ConfigError(
            f"settings file {path} holds the store's password and is open to other users "
            f"(mode {stat.S_IMODE(mode):04o}): run 'chmod 640 {path}' (group: the service user's)"
        )


def _did_you_mean(key: str, known: list[str], form: str) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {form.format(close[0])}?)" if close else ""


def _describe(value: Any) -> str:
    """A TOML value as the error line shows it: its type and, when short, itself."""
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return f'the string "{value[:40]}"' + ("..." if len(value) > 40 else "")
    return f"the {'integer' if isinstance(value, int) else type(value).__name__} {value}"


def _from_toml(setting: Setting, value: Any, where: str) -> Any:
    """The file's value if its TOML type is the setting's: no true for 1, no 1.9 for 1, no "8" for
    8."""
    ok = not isinstance(value, bool) and (
        isinstance(value, setting.type) or (setting.type is float and isinstance(value, int))
    )
    if not ok or (setting.type is float and not math.isfinite(value)):
        raise ConfigError(f"{where} must be {_TYPE_WORDS[setting.type]}, got {_describe(value)}")
    return setting.type(value)


def _from_text(setting: Setting, raw: str) -> Any:
    """An environment variable's text as the setting's type."""
    if setting.type is str:
        return raw
    try:
        value = setting.type(raw.strip())
    except ValueError:
        value = None
    if value is None or (setting.type is float and not math.isfinite(value)):
        raise ConfigError(f"{setting.env} must be {_TYPE_WORDS[setting.type]}, got {raw!r}")
    return value


def _checked(setting: Setting, value: Any, where: str) -> Any:
    if setting.choices:
        for choice in setting.choices:
            if value.lower() == choice.lower():
                return choice
        raise ConfigError(f"{where} must be one of {', '.join(setting.choices)}, got {value!r}")
    if setting.check is not None and not setting.check(value):
        raise ConfigError(f"{where} must be {setting.rule}, got {value!r}")
    return value


def load_token_secrets(path: str, *, systemd_credential: bool = False) -> TokenSecrets:
    """Read the secret file: one secret a line, current first; '#' lines are comments.

    Like ssh with a private key, a file other users may read or write is refused:
    whoever reads the secret can mint tokens for every player. A file its group
    may read or write loads with a warning (docs/operations.md installs it 0600).
    """
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            raw = f.read()
    except OSError as e:
        raise ConfigError(
            f"cannot read token secret file {path}: {e.strerror} (restore it from its backup copy: "
            "a new secret would refuse every token issued; or set AUTHSVC_TOKEN_SECRET_FILE)"
        ) from None
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        raise ConfigError(
            f"token secret file {path} is open to other users (mode {stat.S_IMODE(mode):04o}): "
            f"run 'chmod 600 {path}' (owner: the service user)"
        )
    if mode & (stat.S_IRGRP | stat.S_IWGRP) and not systemd_credential:
        logging.getLogger("authsvc").warning(
            "token secret file %s is open to its group (mode %04o): run 'chmod 600 %s' "
            "unless every member of the group may mint tokens",
            path,
            stat.S_IMODE(mode),
            path,
        )
    lines = (line.strip() for line in raw.removeprefix(UTF8_BOM).splitlines())
    secrets = [line for line in lines if line and not line.startswith(b"#")]
    if not secrets:
        raise ConfigError(f"token secret file {path} holds no secret")
    if any(len(s) < MIN_SECRET_BYTES for s in secrets):
        raise ConfigError(f"every token secret in {path} must be at least {MIN_SECRET_BYTES} bytes")
    return TokenSecrets(secrets)
